"""The behaviours a backend may declare: a deviation named by what the backend does rather than
by clause, for one behaviour that fails cases of several clauses, some tests of each (so no clause
can be declared without going stale). A backend declares one in its ``deviations`` under the key
``"behaviour:NAME"`` (NAME from :data:`CATALOGUE`) with its reason; the suite attributes it in
every test where it shows (:mod:`mhaspec.conformance.behaviour_checks`).

Rows without an allowed key are not a behaviour here: declaring MASK-9 already leaves them to
MASK-9 in every other clause (``conformance.governed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

#: the key prefix of a behaviour in a backend's ``deviations``
PREFIX = "behaviour:"


@dataclass(frozen=True)
class Behaviour:
    """``name``; ``meaning`` (one line); ``clause``: the clause whose rule it breaks (its home,
    where a stale declaration is reported); ``shows_in``: every clause whose checks consult it;
    ``bound``: the most it may differ from the rule where it shows."""

    name: str
    meaning: str
    clause: str
    shows_in: frozenset[str]
    bound: float

    @property
    def key(self) -> str:
        return PREFIX + self.name


#: A blocked key's weight is a tiny positive number, not exactly 0: an exponent clamped before
#: exp (PaddlePaddle's ``nn.MultiHeadAttention``: x - max >= -64, e^-64 = 1.6e-28), or a finite
#: fill whose exp does not underflow. Bounded by 1e-20 per weight, 10^13 below any allowance of
#: NUM-3, so every value check of the output is unaffected and still applies.
MASKED_WEIGHTS_NOT_ZERO = Behaviour(
    "masked-weights-not-zero",
    "a blocked key gets a tiny positive weight (at most 1e-20) instead of exactly 0",
    "MASK-1", frozenset({"MASK-1", "MASK-5", "MASK-6", "MASK-7", "MASK-8", "WIN-1", "CHUNK-1",
                         "SEG-4"}),
    1e-20)

CATALOGUE: dict[str, Behaviour] = {b.name: b for b in (MASKED_WEIGHTS_NOT_ZERO,)}


def declared_names(deviations: Mapping[str, str]) -> list[str]:
    """The behaviour names among the keys of ``deviations`` (known or not)."""
    return sorted(k[len(PREFIX):] for k in deviations if k.startswith(PREFIX))


def known(key: str) -> bool:
    """Whether a deviation key names a behaviour of :data:`CATALOGUE` (``"behaviour:NAME"``)."""
    return key.startswith(PREFIX) and key[len(PREFIX):] in CATALOGUE


def listing() -> str:
    """The behaviour keys a backend may declare, for messages."""
    return ", ".join(b.key for b in CATALOGUE.values())


def may_show_in(deviations: Mapping[str, str], clause: str) -> bool:
    """Whether a declared behaviour of ``deviations`` may show in the tests of ``clause``."""
    return any(clause in CATALOGUE[n].shows_in for n in declared_names(deviations)
               if n in CATALOGUE)
