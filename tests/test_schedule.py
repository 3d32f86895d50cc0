"""The run's file order (tests/conftest.py): the longest files first, so that
pytest-xdist's file-at-a-time distribution does not end on one of them."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LONGEST_FIRST, pytest_collection_modifyitems, schedule_rank

TESTS = Path(__file__).parent


def test_every_listed_file_exists_once() -> None:
    assert [name for name in LONGEST_FIRST if not (TESTS / name).is_file()] == []
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)


def test_listed_files_rank_in_their_order_before_all_others() -> None:
    ranks = [schedule_rank(TESTS / name) for name in LONGEST_FIRST]
    assert ranks == sorted(ranks) == list(range(len(LONGEST_FIRST)))
    assert schedule_rank(TESTS / "test_schedule.py") == len(LONGEST_FIRST)


class _Item:
    """What the hook reads of a test item."""

    def __init__(self, name: str) -> None:
        self.path = TESTS / name
        self.fixturenames = ("broker",)
        self.markers: list[object] = []

    def get_closest_marker(self, name: str) -> None:
        return None

    def add_marker(self, marker: object) -> None:
        self.markers.append(marker)


class _Config:
    def getoption(self, name: str) -> bool:
        return True


def test_the_hook_puts_the_listed_files_first_and_keeps_each_files_order() -> None:
    names = ["a/test_x.py", LONGEST_FIRST[1], "b/test_y.py", LONGEST_FIRST[0], LONGEST_FIRST[1]]
    items = [_Item(name) for name in names]
    first_of_second = items[1]
    pytest_collection_modifyitems(_Config(), items)  # type: ignore[arg-type]
    assert [i.path.relative_to(TESTS).as_posix() for i in items] == [
        LONGEST_FIRST[0], LONGEST_FIRST[1], LONGEST_FIRST[1], "a/test_x.py", "b/test_y.py"
    ]
    assert items[1] is first_of_second
