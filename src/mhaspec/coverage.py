"""How much of the specification a certificate covers: "N of M testable clauses" and levels.

A testable clause is **certified** when its verdict is ``pass`` or ``deviation`` (a declared
deviation the suite confirmed; a pass an adapter's shared argument validation made, not the
library, is counted and said apart: ``by_adapter``; so is a pass of a feature the adapter folded
into the masks instead of the library's own mechanism: ``by_fold``, ``folded``);
``not-implemented`` (a capability not claimed), ``not-run``, ``fail`` and ``stale-deviation``
are not. The chapters of a spec version are **core** or
**optional** (an optional chapter says so in its title: "Gradients (optional)", "Soft-capping
(optional: softcap)"). As with the Array API standard's extensions, each is a named
conformance **level**: ``core`` (every core chapter) and each optional chapter by its id
(``GQA``, ``WIN``, ...); a level is attained when every testable clause in it is certified. A
clause of a core chapter that is itself optional ("MHA-6: Grouped-query and multi-query attention (optional)") counts in the
total and its chapter, not in ``core``.
"""

from __future__ import annotations

from typing import NamedTuple

from mhaspec.certificate import released_clauses, spec_label
from mhaspec.conformance.verdicts import ADAPTER, ADAPTER_FOLD
from mhaspec.spec import load

#: Clause verdicts that certify a clause.
CERTIFIED = ("pass", "deviation")


class Tally(NamedTuple):
    """Testable clauses of one chapter or level: how many are certified, and of how many."""

    certified: int
    testable: int

    @property
    def complete(self) -> bool:
        return self.testable > 0 and self.certified == self.testable

    def __str__(self) -> str:
        return f"{self.certified}/{self.testable}"


class Coverage(NamedTuple):
    """What a certificate covers: totals, the core level and each chapter (core ones first)."""

    certified: int
    deviations: int
    testable: int
    core: Tally
    chapters: dict[str, Tally]
    optional: tuple[str, ...]  # ids of the optional chapters, in spec order
    by_adapter: int = 0  # passes an adapter's shared argument validation made (``satisfied_by``)
    by_fold: int = 0  # passes of a feature the adapter's fold served (``satisfied_by``)
    folded: tuple[str, ...] = ()  # the chapters with such a pass

    @property
    def levels(self) -> list[str]:
        """The conformance levels attained: ``core`` and the complete optional chapters."""
        return (["core"] if self.core.complete else []) + [
            ch for ch in self.optional if self.chapters[ch].complete]


def is_optional(title: str) -> bool:
    """A chapter is optional when its title says so: ``Gradients (optional)``."""
    return "(optional" in title


def chapter_of(clause_id: str) -> str:
    """``MASK-9`` -> ``MASK`` (a clause id is its chapter id, a dash and a number)."""
    return clause_id.rsplit("-", 1)[0]


def of(cert: dict) -> Coverage:
    """The coverage of a certificate (its clauses, against the testable clauses of its version).

    Chapters come in the order of the certificate's clauses; which are optional is read from the
    current spec's chapter titles (chapter ids are stable across versions)."""
    known = released_clauses(cert["spec"]["version"]) or ()
    testable = {cid for cid, _, t in known if t}
    optional_clauses = {cid for cid, title, _ in known if is_optional(title)}
    optional_ids = {ch.id for ch in load().chapters if is_optional(ch.title)}
    counts: dict[str, list[int]] = {}
    core = [0, 0]
    certified = deviations = by_adapter = by_fold = 0
    folded: dict[str, None] = {}
    for clause in cert["clauses"]:
        if clause["id"] not in testable:
            continue
        tally = counts.setdefault(chapter_of(clause["id"]), [0, 0])
        in_core = (chapter_of(clause["id"]) not in optional_ids
                   and clause["id"] not in optional_clauses)
        ok = clause["verdict"] in CERTIFIED
        tally[0] += ok
        tally[1] += 1
        core[0] += ok and in_core
        core[1] += in_core
        if ok:
            certified += 1
            deviations += clause["verdict"] == "deviation"
            by_adapter += clause.get("satisfied_by") == ADAPTER
            if clause.get("satisfied_by") == ADAPTER_FOLD:
                by_fold += 1
                folded[chapter_of(clause["id"])] = None
    return Coverage(certified, deviations, len(testable), Tally(*core),
                    {ch: Tally(*t) for ch, t in counts.items()},
                    tuple(ch for ch in counts if ch in optional_ids), by_adapter, by_fold,
                    tuple(folded))


def summary(cov: Coverage) -> str:
    """One line: ``42 of 73 testable clauses (3 by a declared deviation); core 30 of 50;
    optional chapters: GQA, WIN, GRAD 1/2`` (:func:`chapter_label`; one with nothing certified is
    left out)."""
    dev = ", ".join(([f"{cov.deviations} by a declared deviation"] if cov.deviations else [])
                    + ([f"{cov.by_adapter} by the adapter's argument validation"]
                       if cov.by_adapter else [])
                    + ([f"{cov.by_fold} by the adapter's fold"] if cov.by_fold else []))
    dev = f" ({dev})" if dev else ""
    optional = [chapter_label(cov, ch) for ch in cov.optional if cov.chapters[ch].certified]
    return (f"{cov.certified} of {cov.testable} testable clauses{dev}; core {cov.core.certified} "
            f"of {cov.core.testable}; optional chapters: {', '.join(optional) or 'none'}")


def chapter_label(cov: Coverage, ch: str) -> str:
    """An optional chapter as a summary names it: ``WIN`` attained whole, ``GRAD 1/2`` in part,
    ``WIN (adapter fold)`` when a pass in it was the adapter's fold, not the library's."""
    label = ch if cov.chapters[ch].complete else f"{ch} {cov.chapters[ch]}"
    return f"{label} (adapter fold)" if ch in cov.folded else label


def headline(cert: dict) -> str:
    """The verdict with what it covers, plain text (every part schema-checked, so safe in
    Markdown): ``conforms on 42 of 73 testable clauses of mhaspec 1.2``, or ``does not conform
    (40 of 73 testable clauses of mhaspec 1.2 certified)``."""
    cov = of(cert)
    verdict = cert["summary"]["verdict"]
    of_spec = (f"{cov.certified} of {cov.testable} testable clauses of mhaspec "
               f"{spec_label(cert['spec'])}")
    return f"{verdict} on {of_spec}" if verdict == "conforms" else f"{verdict} ({of_spec} certified)"
