"""Just enough of Docker to test the repository's Dockerfile without a daemon:
its instructions per stage, the build context that ``.dockerignore`` leaves, and
the files the ``COPY`` instructions put in a stage (laid out under a folder).

Only what the Dockerfile uses is understood: ``ARG`` defaults before the first
``FROM``, ``FROM IMAGE AS NAME``, ``WORKDIR``, ``COPY [--from=STAGE] [--chown=..]
SRC... DEST``, ``ENV K=V...``; anything else is kept as text for the tests.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy.support import ROOT


@dataclass
class Stage:
    """One ``FROM`` of the Dockerfile and its instructions, in order."""

    image: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        """The arguments of every ``keyword`` instruction of the stage."""
        return [args for name, args in self.instructions if name == keyword]

    def one(self, keyword: str) -> str:
        """The arguments of the stage's only ``keyword`` instruction."""
        found = self.all(keyword)
        assert len(found) == 1, f"{keyword}: expected one in stage {self.name}, got {found}"
        return found[0]

    def env(self) -> dict[str, str]:
        """Every ``ENV`` of the stage (``K=V`` pairs), later ones winning."""
        out: dict[str, str] = {}
        for args in self.all("ENV"):
            for pair in shlex.split(args):
                key, sep, value = pair.partition("=")
                assert sep, f"ENV {pair!r}: write ENV KEY=VALUE"
                out[key] = value
        return out

    def exec_form(self, keyword: str) -> list[str]:
        """The JSON (exec) form of the stage's only ``keyword`` instruction."""
        value = json.loads(self.one(keyword))
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), value
        return value


def instructions(text: str) -> list[tuple[str, str]]:
    """``(KEYWORD, arguments)`` of each instruction: continuation lines joined,
    comment and blank lines dropped (also inside a continuation, as Docker does)."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = pending + line
        pending = ""
        keyword, _sep, args = whole.partition(" ")
        out.append((keyword.upper(), " ".join(args.split()) if "[" not in args else args.strip()))
    assert not pending, "the Dockerfile ends inside a continuation line"
    return out


def stages(text: str) -> list[Stage]:
    """The Dockerfile's stages, ``${ARG}`` in ``FROM`` replaced by the ARG's default."""
    defaults: dict[str, str] = {}
    found: list[Stage] = []
    for keyword, args in instructions(text):
        if keyword == "FROM":
            words = args.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(image, name))
        elif not found:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            key, _sep, value = args.partition("=")
            defaults[key] = value
        else:
            found[-1].instructions.append((keyword, args))
    return found


def read_stages() -> list[Stage]:
    """The stages of the repository's Dockerfile."""
    return stages((ROOT / "Dockerfile").read_text())


def _regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"\Z")


@dataclass
class DockerIgnore:
    """``.dockerignore`` rules: the last rule matching a path or one of its parent
    folders decides; ``!`` rules take paths back in."""

    rules: list[tuple[bool, str, re.Pattern[str]]]

    @classmethod
    def read(cls, root: Path = ROOT) -> DockerIgnore:
        """The rules of ``root/.dockerignore`` (none if there is no such file)."""
        path = root / ".dockerignore"
        lines = path.read_text().splitlines() if path.exists() else []
        rules = []
        for line in (raw.strip() for raw in lines):
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
            rules.append((negated, pattern, _regex(pattern)))
        return cls(rules)

    def ignored(self, path: str) -> bool:
        """Whether the context leaves out ``path`` (relative, ``/``-separated)."""
        parts = path.split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        result = False
        for negated, _pattern, regex in self.rules:
            if any(regex.match(p) for p in prefixes):
                result = not negated
        return result

    def _may_take_back(self, folder: str) -> bool:
        return any(
            negated and (pattern.startswith(folder + "/") or "*" in pattern.split("/")[0])
            for negated, pattern, _regex in self.rules
        )

    def context(self, root: Path = ROOT) -> list[str]:
        """Every file of the build context ``root``, relative and sorted."""
        files: list[str] = []
        for here, dirs, names in os.walk(root):
            rel = Path(here).relative_to(root).as_posix()
            rel = "" if rel == "." else rel + "/"
            dirs[:] = [
                d for d in dirs
                if not (self.ignored(rel + d) and not self._may_take_back(rel + d))
            ]  # fmt: skip
            files += [rel + n for n in names if not self.ignored(rel + n)]
        return sorted(files)


def lay_out(stage: Stage, into: Path, context: list[str], root: Path = ROOT) -> Path:
    """Carry out the stage's ``WORKDIR`` and context ``COPY`` instructions under the
    folder ``into`` (its ``/``); return the stage's last working directory there.

    :raises AssertionError: a ``COPY`` source is not in the build ``context``.
    """
    workdir = "/"
    present = set(context)
    for keyword, args in stage.instructions:
        if keyword == "WORKDIR":
            workdir = os.path.join(workdir, args)
            (into / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        if keyword != "COPY":
            continue
        words = [w for w in shlex.split(args) if not w.startswith("--chown")]
        if any(w.startswith("--from=") for w in words):
            continue
        *sources, dest = words
        target = into / os.path.join(workdir, dest).lstrip("/")
        for source in sources:
            below = [f for f in present if f == source or f.startswith(source.rstrip("/") + "/")]
            assert below, f"COPY {source}: not in the build context (.dockerignore?)"
            for f in below:
                if f == source:
                    to = target / Path(f).name if len(sources) > 1 or dest.endswith("/") else target
                else:
                    to = target / Path(f).relative_to(source)
                to.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(root / f, to)
    return into / workdir.lstrip("/")
