"""The mutation harness itself: exact application, equivalence, reports, shadowing.

Fast: no mutation run. The last test applies one catalogue bug and runs one
cheap layer against it, so it fails if that layer (or the shadow tree that
puts the mutated copy first) is broken.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from model_checks.mutation import catalogue_run, config, equivalent, kill, report
from model_checks.mutation.catalogue import CATALOGUE, Bug
from model_checks.mutation.catalogue_run import apply_bug, run_catalogue, select
from model_checks.mutation.execute import Outcome
from model_checks.mutation.mutants import Mutant, generate
from model_checks.mutation.shadow import Shadow

ROOT = config.ROOT
SRC = ROOT / "src"
PARTITION = "src/htmqc/core/partition.py"


def _bug(**changes: object) -> Bug:
    base = next(b for b in CATALOGUE if b.name == "commit-hands-out-next")
    return replace(base, **changes)  # type: ignore[arg-type]


# -- exact application ----------------------------------------------------------------


def test_every_catalogue_bug_changes_exactly_one_line() -> None:
    for bug in CATALOGUE:
        before = (ROOT / bug.file).read_text().splitlines()
        after = apply_bug((ROOT / bug.file).read_text(), bug).splitlines()
        changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
        assert len(changed) == 1, bug.name
        assert changed[0][0].strip() == bug.old and changed[0][1].strip() == bug.new, bug.name
        indent = len(changed[0][0]) - len(changed[0][0].lstrip())
        assert changed[0][1][:indent].strip() == "", f"{bug.name}: indentation lost"


def test_catalogue_names_are_unique_and_at_least_twenty() -> None:
    names = [b.name for b in CATALOGUE]
    assert len(names) == len(set(names)) >= 20


def test_each_bug_expects_layers_that_exist_each_once() -> None:
    layers = {c.name for c in config.LAYERS}
    for bug in CATALOGUE:
        assert len(bug.expected) == len(set(bug.expected)), bug.name
        assert set(bug.expected) <= layers, (bug.name, set(bug.expected) - layers)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"old": "self._requested = self._next"}, "is on 0 lines"),
        ({"function": "PartitionTracker.nowhere"}, "no function PartitionTracker.nowhere"),
        ({"new": "return self._next +"}, "does not compile"),
    ],
)
def test_a_bad_bug_is_one_line_error(changes: dict[str, str], message: str) -> None:
    text = (ROOT / PARTITION).read_text()
    bug = _bug(**changes)
    with pytest.raises(UsageError) as caught:
        apply_bug(text, bug)
    assert message in caught.value.line()
    assert "\n" not in caught.value.line()


def test_an_old_text_on_two_lines_is_refused() -> None:
    bug = _bug(function="<module>", old="self._unsent = True", new="self._unsent = False")
    with pytest.raises(UsageError, match="is on 3 lines"):
        apply_bug((ROOT / PARTITION).read_text(), bug)


def test_unknown_names_are_refused() -> None:
    with pytest.raises(UsageError, match="no catalogue entry nope"):
        select(["nope"], None)
    with pytest.raises(UsageError, match="no layer nope"):
        select(None, ["nope"])


# -- mutant identity --------------------------------------------------------------------

MODULE = '''
def f(a: int | None, b: int) -> int:
    if a is None:
        return b + 1
    return a + b
'''


def test_mutant_keys_survive_edits_that_move_lines(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text(MODULE)
    first = generate([mod], tmp_path / "s1.sqlite", root=tmp_path).mutants
    mod.write_text('"""Docs."""\n\nX = 1\n' + MODULE)
    second = generate([mod], tmp_path / "s2.sqlite", root=tmp_path).mutants
    keys = {m.key for m in first}
    assert keys and keys <= {m.key for m in second}
    assert {m.line for m in first}.isdisjoint({m.line for m in second if m.key in keys})
    assert all(m.key.startswith("m.py::f::") for m in first)
    # --resume finds a moved mutant's earlier result: the diff without its hunk header
    moved = {m.key: m for m in second}
    for m in first:
        assert m.diff != moved[m.key].diff
        assert kill.diff_body(m.diff) == kill.diff_body(moved[m.key].diff)


def test_annotations_are_not_mutated(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text("from __future__ import annotations\n" + MODULE)
    generated = generate([mod], tmp_path / "s.sqlite", root=tmp_path)
    assert generated.left_out.get("annotations", 0) > 0
    assert not any("int | None" in m.old for m in generated.mutants)


def test_contracts_are_not_mutated(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text(
        "import icontract\n\n"
        "def tracker_invariant(x: int) -> bool:\n    return x > 0\n\n"
        "@icontract.ensure(lambda result: result > 0)\n"
        "def g(x: int) -> int:\n    return x + 1\n"
    )
    generated = generate([mod], tmp_path / "s.sqlite", root=tmp_path)
    assert generated.left_out.get("contracts", 0) >= 2
    assert {m.function for m in generated.mutants} == {"g"}


def test_a_check_runs_when_it_executes_any_line_of_the_mutated_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check = config.KILL_CHECKS[1]
    base = kill.Baseline({}, {kill.argv_key(check): {PARTITION: frozenset({246, 300})}})
    # Lines 245, 246 and 300 hold bytecode here; 400-401 none (a signature's `*,`).
    monkeypatch.setattr(kill, "bytecode_lines", lambda path: frozenset({245, 246, 300}))

    def mutant(line: int, node: tuple[int, int]) -> Mutant:
        return Mutant("i", PARTITION, line, line, node, "f", "AddNot", "if (", "if not (",
                      "", "k", True, "")

    assert base.covers(check, mutant(245, (245, 250)))  # `if (` has no bytecode itself
    assert not base.covers(check, mutant(245, (245, 245)))
    assert base.covers(check, mutant(300, (300, 300)))
    assert base.covers(config.KILL_CHECKS[0], mutant(245, (245, 245)))  # not measured
    # No bytecode on the node's lines: coverage cannot tell, so the check runs.
    assert base.covers(check, mutant(400, (400, 401)))


def test_a_parameter_lists_lines_hold_no_bytecode_but_its_def_line_does() -> None:
    """What :func:`kill.bytecode_lines` reads: ``*,`` in ``ConsumerCore.failed``'s
    signature has no bytecode (its mutants run every check), the ``def`` line has."""
    path = config.ROOT / "src/htmqc/core/consumer.py"
    source = path.read_text().splitlines()
    star = next(n for n, text in enumerate(source, 1) if text.strip() == "*," and
                any("def failed(" in t for t in source[n - 12:n]))  # fmt: skip
    lines = kill.bytecode_lines(path)
    assert star not in lines
    assert any(n in lines for n in range(star - 10, star) if "def failed(" in source[n - 1])


def test_a_pytest_check_runs_only_the_test_files_that_reach_the_mutated_node() -> None:
    unit = next(c for c in config.KILL_CHECKS if c.name == "unit")
    key = kill.argv_key(unit)
    by_line = {246: frozenset({"tests/core/test_a.py"}), 248: frozenset({"tests/core/test_b.py"}),
               300: frozenset({"tests/core/test_a.py", ""})}
    base = kill.Baseline({}, {}, {key: {PARTITION: by_line}})

    def mutant(line: int, node: tuple[int, int]) -> Mutant:
        return Mutant("i", PARTITION, line, line, node, "f", "AddNot", "x", "not x",
                      "", "k", True, "")

    narrowed = base.narrowed(unit, mutant(246, (246, 248)))
    ignored = tuple(a for a in unit.argv if a.endswith(("test_stateful.py", "gate.py")))
    assert narrowed.argv == (*config.PYTEST, *(a for p in ignored for a in ("--ignore", p)),
                             str(ROOT / "tests/core/test_a.py"),
                             str(ROOT / "tests/core/test_b.py"))
    assert narrowed.name == unit.name and kill.argv_key(narrowed) != key
    assert base.narrowed(unit, mutant(300, (300, 300))) == unit  # also ran at import: all
    assert base.narrowed(unit, mutant(400, (400, 400))) == unit  # not measured here: all
    vectors = next(c for c in config.KILL_CHECKS if c.name == "vectors")
    assert base.narrowed(vectors, mutant(246, (246, 246))) == vectors  # not pytest


def test_focused_tests_are_named_after_the_module_but_never_crosshairs_own() -> None:
    def files(module: str) -> list[str]:
        command = config.focused_tests(ROOT / "src/htmqc/core" / module)
        assert command is not None
        return [Path(a).name for a in command.argv if a.endswith(".py")]

    assert files("gate.py") == ["test_gate.py"]  # not test_crosshair_gate.py
    assert "test_partition.py" in files("partition.py")
    assert config.focused_tests(ROOT / "src/htmqc/core/no_such_module.py") is None


@pytest.mark.slow  # runs pytest (under coverage) in a child
def test_the_baseline_charges_lines_to_test_files(tmp_path: Path) -> None:
    """The contexts plugin under coverage: lines of one test file apart from another's
    and from import time."""
    (tmp_path / "mod.py").write_text(
        "def f():\n    return 1\n\ndef g():\n    return 2\n\ndef h():\n    return 2\n")
    (tmp_path / "test_f.py").write_text("import mod\n\ndef test_f():\n    assert mod.f() == 1\n")
    (tmp_path / "test_g.py").write_text(
        "import mod, pytest\n\n@pytest.fixture(scope='session')\ndef shared():\n"
        "    return mod.h()\n\ndef test_g(shared):\n    assert mod.g() == 2 == shared\n")
    data = tmp_path / "cov"
    subprocess.run(
        [sys.executable, "-m", "coverage", "run", f"--data-file={data}",
         f"--include={tmp_path}/mod.py", "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "-p", "model_checks.mutation.contexts", "--rootdir", str(tmp_path),
         str(tmp_path / "test_f.py"), str(tmp_path / "test_g.py")],
        cwd=tmp_path, check=True, capture_output=True,
        env={**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"},
    )
    shadow = Shadow.__new__(Shadow)
    shadow.src = tmp_path
    got = kill._by_test_file(data, shadow)[str(Path("src") / "mod.py")]
    assert got[2] == frozenset({"test_f.py"}) and got[5] == frozenset({"test_g.py"})
    assert got[1] == frozenset({""})  # the def: at import
    assert got[8] == frozenset({""})  # in a session fixture: serves every file


# -- equivalence ------------------------------------------------------------------------


def test_the_equivalence_file_is_honoured(tmp_path: Path) -> None:
    listed = tmp_path / "eq.toml"
    listed.write_text('[[equivalent]]\nkey = "k1"\nreason = "same either way"\n')
    reasons = equivalent.load(listed)
    assert reasons == {"k1": "same either way"}
    passed = [Outcome("unit", "pass", 1.0)]
    assert kill.decide(passed, True, reasons.get("k1")) == ("equivalent", None)
    assert kill.decide(passed, True, reasons.get("k2")) == ("survived", None)
    failed = [Outcome("unit", "pass", 1.0), Outcome("proofs", "fail", 1.0)]
    assert kill.decide(failed, True, None) == ("killed", "proofs")
    assert kill.decide([Outcome("unit", "timeout", 9.0)], True, None) == ("timeout", "unit")
    assert kill.decide([], False, None) == ("killed", "syntax")


def test_survivors_and_wrong_claims_fail_the_run() -> None:
    def result(key: str, status: kill.Status) -> kill.Result:
        return kill.Result(key, key, "f.py", 1, "f", "op", "", status, None, 0.0, [], "c")

    listed = {"eq": "same", "claimed": "same"}
    rows = [result("eq", "equivalent"), result("ok", "killed"), result("s", "survived"),
            result("claimed", "killed")]
    lines = kill.problems(rows, listed)
    assert [line.split()[0] for line in lines] == ["SURVIVED", "LISTED"]
    assert kill.problems(rows[:2], listed) == []


def test_a_listing_for_a_mutant_no_longer_generated_fails_the_run() -> None:
    listed = {"a.py::f::x => y": "same", "a.py::g::x => y": "same", "b.py::f::x => y": "same"}
    lines = kill.stale_listings(listed, ["a.py::f::x => y"], ["a.py"])
    assert lines == ["LISTED AS EQUIVALENT BUT NO SUCH MUTANT: a.py::g::x => y; "
                     "remove it from equivalent.toml"]  # b.py is not in scope: not judged
    assert kill.stale_listings(listed, listed, ["a.py", "b.py"]) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[equivalent]]\nkey = "k"\n', "needs a one-line reason"),
        ('[[equivalent]]\nreason = "r"\n', "has no key"),
        ('[[equivalent]]\nkey = "k"\nreason = "r"\n[[equivalent]]\nkey = "k"\nreason = "r"\n',
         "listed twice"),
        ("[[equivalent]\n", "not valid TOML"),
    ],
)
def test_a_bad_equivalence_file_is_one_line_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "eq.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        equivalent.load(path)


def test_the_committed_equivalence_file_loads() -> None:
    assert all(r.strip() for r in equivalent.load().values())


# -- reports and README sections --------------------------------------------------------


def _mutation_report() -> dict[str, object]:
    rows = [
        {"file": PARTITION, "function": "PartitionTracker.fetched", "status": "killed",
         "killed_by": "focused"},
        {"file": PARTITION, "function": "PartitionTracker.fetched", "status": "survived",
         "killed_by": None},
        {"file": "src/htmqc/core/retry.py", "function": "RetryPolicy.delay",
         "status": "equivalent", "killed_by": None},
    ]
    return {"tool": "Cosmic Ray 8.7.0", "workers": 2, "wall_seconds": 600.0, "sources": "s1",
            "left_out": {"annotations": 3}, "skipped_checks": ["vectors"],
            "summary": report.summary(rows), "mutants": rows}


def test_summary_counts_equivalents_out_of_the_score() -> None:
    s = _mutation_report()["summary"]
    assert isinstance(s, dict)
    assert (s["mutants"], s["killed"], s["survived"], s["equivalent"]) == (3, 1, 1, 1)
    assert s["score"] == 0.5


def test_a_partial_catalogue_shows_what_is_not_measured_yet() -> None:
    entries = [
        {"name": "a", "expected": [], "layers": {"vectors": "fail", "tests-core": "pass"},
         "caught_by": ["vectors"]},
        {"name": "b", "expected": [], "layers": {"vectors": "pass"}, "caught_by": []},
        {"name": "c", "expected": [], "layers": {"vectors": "pass", "tests-core": "pass"},
         "caught_by": []},
    ]
    text = report.render_catalogue({"layers": ["vectors", "tests-core"], "layer_seconds": 7200.0,
                                    "measured": ["2026-12-07"], "missing": 1, "notes": [],
                                    "entries": entries})
    assert "| `a` | ✓ | · |" in text and "| `b` | · | ? |" in text
    assert "Partial: 1 of 6 verdicts not measured yet; 2 of 3 bugs have every layer's." in text
    assert "Caught by no layer: c (not caught yet, layers still to measure: b)." in text
    assert "2.0 h of layer runs, measured 2026-12-07" in text


def test_readme_sections_round_trip(tmp_path: Path) -> None:
    data = _mutation_report()
    catalogue = {"layers": ["vectors", "tests-core"], "layer_seconds": 60.0, "sources": "s2",
                 "measured": ["2026-12-07"],
                 "notes": [], "entries": [{"name": "b", "expected": ["tests-core"],
                 "layers": {"vectors": "skipped", "tests-core": "fail"},
                 "caught_by": ["tests-core"]}]}
    paths = {"mutation": tmp_path / "r.json", "mutation-catalogue": tmp_path / "c.json"}
    report.write_json(paths["mutation"], data)
    report.write_json(paths["mutation-catalogue"], catalogue)
    sections = {name: (paths[name], report.SECTIONS[name][1], "make it") for name in paths}
    readme = tmp_path / "README.md"
    readme.write_text("# Spec\n\nprose\n")
    sources = {"mutation": "s1", "mutation-catalogue": "s2"}
    assert len(report.stale_sections(sources, readme, sections)) == 2  # blocks missing
    for name in paths:
        readme.write_text(report.with_block(readme.read_text(), name,
                                            sections[name][1](report.read_json(paths[name], "x"))))
    assert readme.read_text().startswith("# Spec\n\nprose\n")
    assert report.stale_sections(sources, readme, sections) == []
    body = report.block_body(readme.read_text(), "mutation")
    assert body is not None and "`partition.py` `PartitionTracker.fetched`: 1" in body
    assert report.with_block(readme.read_text(), "mutation", body) == readme.read_text()
    updated = report.with_block(readme.read_text(), "mutation", "new body")
    assert report.block_body(updated, "mutation") == "new body"
    assert updated.count("BEGIN GENERATED: mutation -->") == 1
    assert report.stale_sections({**sources, "mutation": "other"}, readme, sections)
    readme.write_text(readme.read_text().replace("| 50.0% |", "| 99.0% |", 1))
    assert any("differs" in p for p in report.stale_sections(sources, readme, sections))


def test_the_catalogue_is_measured_in_parts_through_its_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run appends each verdict; ``resume`` measures only what the ledger lacks;
    the report covers the whole catalogue, ``partial`` until nothing is missing; a
    changed bug (its key) is measured again; ``broken`` is never stored."""
    calls: list[tuple[str, str]] = []

    def fake(command: config.Command, shadow: Shadow, mutated: Path, timeout: float) -> Outcome:
        unmutated = mutated.read_text() == (SRC / mutated.relative_to(shadow.src)).read_text()
        calls.append((command.name, "unmutated" if unmutated else mutated.name))
        verdict = "pass" if unmutated or command.name == "proofs" else "fail"
        return Outcome(command.name, verdict, 2.0)  # type: ignore[arg-type]

    monkeypatch.setattr(catalogue_run, "run_command", fake)
    ledger = tmp_path / "c.jsonl"
    two = [b.name for b in CATALOGUE[:2]]
    bugs, layers = select(two, ["proofs", "vectors"])
    data = run_catalogue(bugs, layers, 60, workers=1, ledger=ledger)
    rows = catalogue_run.load_verdicts(ledger)
    assert {(b, c) for b, c, _ in rows} == {(b, c) for b in two for c in ("proofs", "vectors")}
    assert data["partial"] and data["layers"] == [c.name for c in config.LAYERS]
    first = data["entries"][0]
    assert first["layers"] == {"proofs": "pass", "vectors": "fail", "tests-sinks": "not run"}
    assert first["caught_by"] == ["vectors"] and data["layer_seconds"] == 8.0
    assert data["missing"] == sum(
        catalogue_run._applies(c, b) for b in CATALOGUE for c in config.LAYERS) - 4

    calls.clear()  # the same selection again: nothing left to measure
    again = run_catalogue(bugs, layers, 60, workers=1, ledger=ledger, resume=True)
    assert calls == [] and again["entries"] == data["entries"]
    cached = run_catalogue(CATALOGUE, config.LAYERS, 60, workers=1, ledger=ledger,
                           cached_only=True)
    assert calls == [] and cached["entries"] == data["entries"]
    calls.clear()  # without resume, measured again (and appended)
    run_catalogue(bugs[:1], layers[:1], 60, workers=1, ledger=ledger)
    assert len(calls) == 2 and len(ledger.read_text().splitlines()) == 5

    calls.clear()  # another bug and layer: only those are measured; the rest is read
    bugs3, layers3 = select([two[0], CATALOGUE[2].name], ["proofs", "spec-tests"])
    third = run_catalogue(bugs3, layers3, 60, workers=1, ledger=ledger, resume=True)
    assert sorted(calls) == sorted([("proofs", "unmutated"), ("spec-tests", "unmutated"),
                                    ("proofs", Path(CATALOGUE[2].file).name),
                                    ("spec-tests", Path(CATALOGUE[0].file).name),
                                    ("spec-tests", Path(CATALOGUE[2].file).name)])
    assert third["entries"][1]["layers"] == {"proofs": "pass", "vectors": "fail",
                                             "tests-sinks": "not run"}
    assert third["missing"] == data["missing"] - 3

    changed = replace(CATALOGUE[0], new=CATALOGUE[0].new + "  # changed")
    monkeypatch.setattr(catalogue_run, "CATALOGUE", (changed, *CATALOGUE[1:]))
    calls.clear()  # a changed bug has another key: measured again
    run_catalogue([changed], layers[:1], 60, workers=1, ledger=ledger, resume=True)
    assert len(calls) == 2

    def broken(command: config.Command, shadow: Shadow, mutated: Path, timeout: float
               ) -> Outcome:
        return Outcome(command.name, "fail", 1.0)

    monkeypatch.setattr(catalogue_run, "run_command", broken)
    before = ledger.read_text()
    out = run_catalogue([CATALOGUE[3]], layers[:1], 60, workers=1, ledger=ledger, resume=True)
    assert ledger.read_text() == before  # a broken layer says nothing about the bug
    assert out["entries"][3]["layers"]["proofs"] == "broken"
    assert "Layer proofs fails on the unmutated tree: not counted." in out["notes"]


# -- shadow tree and one real layer -----------------------------------------------------


def test_pending_modules_are_skipped_only_while_absent(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "plain.py").write_text("X = 1\n")
    (tmp_path / "guarded.py").write_text('if __name__ == "__main__":\n    pass\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not config.has_entry_point("plain")
    assert config.has_entry_point("guarded") and config.has_entry_point("pkg")
    assert not config.has_entry_point("no_such_module_here")
    monkeypatch.setattr(config, "PENDING", frozenset({"plain", "guarded"}))
    assert config.Command("a", (), "plain").pending()
    assert not config.Command("b", (), "guarded").pending()
    assert not config.Command("c", (), "no_such_module_here").pending()  # not tolerated


@pytest.mark.slow  # runs pytest (under coverage) in a child
def test_checks_import_the_mutated_copy_even_under_pytest(tmp_path: Path) -> None:
    shadow = Shadow(tmp_path / "w")
    rel = "src/htmqc/core/lifecycle.py"
    original = (ROOT / rel).read_text()
    probe = tmp_path / "probe_test.py"
    probe.write_text("import htmqc.core.lifecycle as m\n\n"
                     "def test_mutated() -> None:\n    assert m.MARK == 1\n")
    with shadow.mutated(rel, original + "\nMARK = 1\n"):
        proc = subprocess.run(
            [sys.executable, *config.PYTEST, "--rootdir", str(ROOT), "-c",
             str(ROOT / "pyproject.toml"), str(probe)],
            cwd=shadow.work, env=shadow.env(), capture_output=True, text=True,
        )
        assert proc.returncode == 0, proc.stdout[-800:]
    assert shadow.path_of(rel).read_text() == original
    assert (ROOT / rel).read_text() == original


@pytest.mark.slow  # runs pytest (under coverage) in a child
def test_one_bug_is_caught_by_one_cheap_layer() -> None:
    bugs, layers = select(["commit-hands-out-next"], ["spec-tests"])
    data = run_catalogue(bugs, layers, timeout=300, workers=1)
    assert not any("fails on the unmutated tree" in n for n in data["notes"])
    (entry,) = (e for e in data["entries"] if e["name"] == "commit-hands-out-next")
    assert entry["caught_by"] == ["spec-tests"]
