"""The checks that consult a declared behaviour (:mod:`mhaspec.backends.behaviours`).

Within the behaviour's stated bound a check records that it showed (:func:`show`) and goes on
checking; beyond it the check fails under its own clause, as without a declaration. A test in
which a declared behaviour showed and nothing failed has the outcome ``deviation`` naming it (each
result's ``behaviours``); a declared behaviour that shows in no test of a cell makes its home clause
a stale deviation there (:func:`mhaspec.conformance.verdicts.clause_verdicts`).

Axis legend: B batch, h heads, L_q queries, L_k keys.
"""

from __future__ import annotations

import numpy as np

from mhaspec.backends.behaviours import MASKED_WEIGHTS_NOT_ZERO, Behaviour, declared_names
from mhaspec.backends.claim_readers import cell_deviations

from .item_state import running


def declares(cell, behaviour: Behaviour) -> bool:
    """Whether ``cell`` (backend x device x dtype) declares ``behaviour``."""
    return behaviour.key in cell_deviations(cell.backend, cell.device, cell.dtype)


def show(behaviour: Behaviour) -> None:
    """Record that ``behaviour`` showed in the running test."""
    state = running()
    if state is not None:
        state.behaviours.add(behaviour.name)


def blocked_weight_allowed(cell, leaked: float) -> bool:
    """Whether the largest weight ``leaked`` (an absolute value; NaN never allowed) at a blocked
    key is allowed: 0 always; a positive one within :data:`MASKED_WEIGHTS_NOT_ZERO`'s bound where the cell declares it (recorded as
    shown)."""
    if leaked == 0.0:
        return True
    if declares(cell, MASKED_WEIGHTS_NOT_ZERO) and leaked <= MASKED_WEIGHTS_NOT_ZERO.bound:
        show(MASKED_WEIGHTS_NOT_ZERO)
        return True
    return False


def attended(cell, weights: np.ndarray) -> np.ndarray:
    """The keys a query attends, as a boolean array shaped like ``weights`` (..., L_k): its
    non-zero weights, or, where the cell declares :data:`MASKED_WEIGHTS_NOT_ZERO`, those above the
    behaviour's bound (recorded as shown when a weight lies in between)."""
    weights = np.asarray(weights, dtype=np.float64)
    if not declares(cell, MASKED_WEIGHTS_NOT_ZERO):
        return weights != 0
    tiny = (weights != 0) & (np.abs(weights) <= MASKED_WEIGHTS_NOT_ZERO.bound)
    if tiny.any():
        show(MASKED_WEIGHTS_NOT_ZERO)
    return (weights != 0) & ~tiny


def expect_blocked_weights_zero(cell, weights: np.ndarray, clause: str, where: str) -> None:
    """Assert the ``weights`` of blocked keys are 0 (:func:`blocked_weight_allowed`); the message
    names the clause, the cell, the largest weight and ``where`` they lie."""
    leaked = float(np.abs(np.asarray(weights, dtype=np.float64)).max(initial=0.0))
    assert blocked_weight_allowed(cell, leaked), (
        f"[{clause}] {cell.id}: weight {leaked:.3e} {where}; masked positions must get exactly 0"
        + (f" (the declared behaviour {MASKED_WEIGHTS_NOT_ZERO.name} allows at most "
           f"{MASKED_WEIGHTS_NOT_ZERO.bound:.0e})" if declares(cell, MASKED_WEIGHTS_NOT_ZERO)
           else ""))


def report_fields(cell, state) -> dict:
    """What a test's result records of the behaviours ``cell`` declares (empty when it declares
    none): ``behaviours_declared`` and ``behaviours``, those that showed in the test (``state``,
    its :class:`~.item_state.ItemState`)."""
    declared = declared_names(cell_deviations(cell.backend, cell.device, cell.dtype))
    if not declared:
        return {}
    return {"behaviours_declared": declared, "behaviours": sorted(state.behaviours)}
