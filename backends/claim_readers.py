"""Reading a backend's claims for one operation and one cell, where the suite and the commands
(certify, the sealed path) both need them: the operations (:data:`OPS`), the capabilities claimed
for one (:func:`op_capabilities`), the deviations declared for one cell (:func:`cell_deviations`)
and those of them that hold for one operation (:func:`op_deviations`).
"""

from __future__ import annotations

from typing import Mapping

#: the two operations a backend implements: scaled dot-product attention and multi-head attention
OPS = ("sdpa", "mha")


def op_capabilities(backend, op: str | None) -> frozenset:
    """The capabilities ``backend`` claims for operation ``op`` ("sdpa" or "mha"): its optional
    ``capabilities_for(op)`` where it has one (an attention function and a module of one library
    differ), else ``capabilities``. ``op`` None: ``capabilities``."""
    scoped = getattr(backend, "capabilities_for", None)
    if op is None or scoped is None:
        return frozenset(backend.capabilities)
    return frozenset(scoped(op))


def cell_deviations(backend, device: str, dtype: str) -> Mapping[str, str]:
    """The backend's declared deviations for one cell (``deviations_on`` is optional)."""
    on = getattr(backend, "deviations_on", None)
    return on(device, dtype) if on is not None else backend.deviations


def op_deviations(deviations: Mapping[str, str], op: str | None) -> dict[str, str]:
    """clause -> reason of the declared ``deviations`` that hold for operation ``op``: keys
    ``"CLAUSE"`` hold for every operation, ``"CLAUSE@op"`` (e.g. ``"SHAPE-4@mha"``) for ``op`` only."""
    out = {}
    for key, reason in deviations.items():
        clause, _, scope = key.partition("@")
        if not scope or scope == op:
            out.setdefault(clause, reason)
    return out
