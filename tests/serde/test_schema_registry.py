"""The Apicurio Registry launcher (:mod:`htmqc.schema_registry`): ready when its
Confluent-compatible API answers, nothing left running or on disk after
``close()``, a missing distribution named with its fix."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from htmqc.errors import RuntimeFailure
from htmqc.schema_registry import HOME_ENV, SchemaRegistry, start_registry

pytestmark = [pytest.mark.slow]


def test_the_session_registry_speaks_the_confluent_api(schema_registry: SchemaRegistry) -> None:
    assert schema_registry.url.endswith("/apis/ccompat/v7") and schema_registry.running()
    with urllib.request.urlopen(f"{schema_registry.url}/config", timeout=10) as answer:
        assert "compatibilityLevel" in json.loads(answer.read())


def test_close_leaves_nothing_running(schema_registry: SchemaRegistry) -> None:
    """A second registry on its own port (the session's keeps running): after
    ``close()`` its JVM is gone and its working directory deleted; closing twice is fine."""
    with start_registry() as registry:
        assert registry.port != schema_registry.port and registry.running()
        pid, work = registry.process.pid, registry.work_dir
    assert registry.process.returncode is not None and not Path(f"/proc/{pid}").exists()
    assert not work.exists()
    registry.close()


def test_a_missing_distribution_says_make_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    with pytest.raises(RuntimeFailure) as caught:
        start_registry()
    line = caught.value.line()
    assert line.startswith(f"Apicurio Registry is not in {tmp_path}; run `make setup`")
