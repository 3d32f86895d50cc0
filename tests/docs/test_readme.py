"""Every ```python block of the README runs as written. Blocks fenced ```py need a
running broker and run until stopped (the Spark pipeline); tests/spark runs the same
pipeline against a real one."""

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[2] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize("source", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_readme_block_runs(source: str) -> None:
    exec(compile(source, str(README), "exec"), {})
