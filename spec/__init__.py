"""The mhaspec specification: clause table, rendered text and the float64 oracle.

Package ``mhaspec.spec``, folder ``spec/`` (``[tool.setuptools] package-dir``). The innermost layer:
it imports no other part of mhaspec.

``load()`` reads ``clauses.toml`` (the single normative source) into a :class:`Spec`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources


@dataclass(frozen=True)
class Clause:
    """One citable requirement: ``"mhaspec <version>, clause <id>"``."""

    id: str
    chapter: str
    title: str
    text: str
    testable: bool
    since: str | None = None    # ``since = "1.3"``: the version that added the clause
    changed: str | None = None  # ``changed = "1.3"``: the version that last changed its text

    @property
    def marker(self) -> str:
        """"New in 1.3." / "Changed in 1.3." (empty for a clause of the first version)."""
        return (f"New in {self.since}." if self.since else
                f"Changed in {self.changed}." if self.changed else "")


@dataclass(frozen=True)
class Erratum:
    """An informative note on a released version (errata policy, rule 8): what its text gets wrong
    or leaves out, published without touching the frozen text. ``applies_to`` holds clause or
    chapter ids; ``evidence`` the tests that show the fact (``path::test``)."""

    id: str
    version: str
    applies_to: tuple[str, ...]
    title: str
    text: str
    evidence: tuple[str, ...]

    @property
    def anchor(self) -> str:
        return f"erratum-{self.version.replace('.', '-')}-{self.id}"


@dataclass(frozen=True)
class Chapter:
    id: str
    title: str
    intro: str


#: ``[spec] status``: a draft may still change; a released version is frozen (errata policy).
STATUSES = ("draft", "released")


@dataclass(frozen=True)
class Spec:
    name: str
    version: str
    title: str
    chapters: tuple[Chapter, ...]
    clauses: tuple[Clause, ...]
    status: str  # one of STATUSES
    errata: tuple[Erratum, ...] = ()

    @property
    def is_draft(self) -> bool:
        return self.status == "draft"

    def clause(self, clause_id: str) -> Clause:
        for c in self.clauses:
            if c.id == clause_id:
                return c
        raise KeyError(f"no clause {clause_id!r} in {self.name} {self.version}")

    def errata_of(self, clause_or_chapter: str) -> tuple[Erratum, ...]:
        return tuple(e for e in self.errata if clause_or_chapter in e.applies_to)

    @property
    def testable_ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.clauses if c.testable)


def parse(text: str) -> Spec:
    """Parse the TOML clause table; rejects duplicate ids, clauses of unknown chapters and a
    ``[spec] status`` other than "draft" or "released"."""
    data = tomllib.loads(text)
    chapters = tuple(Chapter(c["id"], c["title"], c.get("intro", "").strip()) for c in data["chapter"])
    chapter_ids = {c.id for c in chapters}
    clauses = tuple(
        Clause(c["id"], c["chapter"], c["title"], c["text"].strip(), bool(c["testable"]),
               c.get("since"), c.get("changed"))
        for c in data["clause"])
    seen: set[str] = set()
    for c in clauses:
        if c.id in seen:
            raise ValueError(f"duplicate clause id {c.id!r}")
        if c.chapter not in chapter_ids or not c.id.startswith(c.chapter + "-"):
            raise ValueError(f"clause {c.id!r} does not belong to a declared chapter ({c.chapter!r})")
        seen.add(c.id)
    errata = tuple(
        Erratum(e["id"], e["version"], tuple(e["applies_to"]), e["title"], e["text"].strip(),
                tuple(e.get("evidence", ()))) for e in data.get("erratum", ()))
    for e in errata:
        unknown = set(e.applies_to) - seen - chapter_ids
        if unknown or not e.applies_to:
            raise ValueError(f"erratum {e.id!r} applies to unknown clauses or chapters {sorted(unknown)}")
    if len({(e.version, e.id) for e in errata}) != len(errata):
        raise ValueError("duplicate erratum id")
    meta = data["spec"]
    status = meta.get("status")
    if status not in STATUSES:
        raise ValueError(f"[spec] status must be one of {STATUSES}, got {status!r}")
    return Spec(meta["name"], meta["version"], meta["title"], chapters, clauses, status, errata)


def generated_marker(version: str) -> str:
    """The first line of a page generated against spec ``version`` (``docs/generated/*.md``):
    ``<!-- mhaspec:generated spec=1.2 -->``."""
    return f"<!-- mhaspec:generated spec={version} -->"


@lru_cache(maxsize=1)
def load() -> Spec:
    """The specification shipped with this package."""
    return parse(resources.files(__name__).joinpath("clauses.toml").read_text(encoding="utf-8"))


SPEC_VERSION = load().version
