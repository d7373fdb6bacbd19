"""What of a case each clause alone judges: a declared deviation of a clause is reported under that
clause and never surfaces as a failure of another one.

:data:`GOVERNS` maps a clause to the property of a case it governs:

* a capability (e.g. SOFTCAP-1 -> "softcap"): in a cell that declares a deviation of the clause,
  a case built for a test of another clause is built as if the cell did not claim the
  capability (``harness.fit`` drops the feature; the conditions record what ran). A test that
  requires the capability (its ``requires`` markers: e.g. SEG-4 requires "segments") is about
  the feature and keeps it: the cell declares that clause too if its behaviour differs there.
* :data:`PROJECTION_BIASES` (PARAM-1): the biases of the four projections; in a cell that
  declares a deviation of PARAM-1, the cases of the other clauses' tests are built without them
  (:func:`withhold`), as a capability's feature is.
* :data:`EMPTY_ROWS` (MASK-9): rows without an allowed key cannot be taken out of a case (a mask,
  a window, segments or lengths can empty them), so the checks of other clauses leave those rows
  unjudged (``harness.rows_left_to_mask9``).
* :data:`EMPTY_ROW_GRADIENTS` (GRAD-7): the gradients such a row reaches, its own row of dq and
  the dk and dv of the keys its batch item and key/value head share with it, which the checks
  of the other gradient clauses leave unjudged (``vjp.gradients_left_to_grad7``): a backward
  pass that puts NaN there (the backward of a NaN row) is GRAD-7's deviation.
* :data:`EMPTY_ROW_MHA_GRADIENTS` (GRAD-2): the same for the multi-head gradients (``mha_vjp``):
  every input gradient of such a row's batch item and every parameter's gradient, which the
  projections mix from every row (``test_grad.gradients_left_to_grad2``).
"""

from __future__ import annotations

from typing import Iterable

#: the rows of a case without an allowed key (all-zero oracle weights)
EMPTY_ROWS = "empty rows"
#: the gradients those rows reach: their dq rows, and dk and dv of their batch item and key/value
#: head
EMPTY_ROW_GRADIENTS = "empty rows' gradients"
#: the multi-head gradients those rows reach: their batch item's input gradients and every
#: parameter's
EMPTY_ROW_MHA_GRADIENTS = "empty rows' multi-head gradients"
#: the projections' biases b_q, b_k, b_v, b_o (a case's ``use_bias``)
PROJECTION_BIASES = "projection biases"
#: what a case keeps whatever is declared (its rows cannot be taken out of it)
UNWITHHELD = (EMPTY_ROWS, EMPTY_ROW_GRADIENTS, EMPTY_ROW_MHA_GRADIENTS)

#: clause -> the capability (or :data:`EMPTY_ROWS`) it alone judges where a cell deviates from it
GOVERNS: dict[str, str] = {
    "SDPA-2": "scale",
    "PARAM-1": PROJECTION_BIASES,
    "MASK-2": "bias",
    "MASK-3": "legacy_mask",
    "MASK-9": EMPTY_ROWS,
    "GRAD-2": EMPTY_ROW_MHA_GRADIENTS,
    "GRAD-7": EMPTY_ROW_GRADIENTS,
    "GQA-1": "gqa",
    "SOFTCAP-1": "softcap",
    "WIN-1": "window",
    "CHUNK-1": "chunk",
    "ALIBI-1": "alibi",
    "SEG-1": "segments",
    "SEG-2": "segments",
    "CACHE-2": "kv_cache",
    "LSE-1": "lse",
}


def withheld(declared: Iterable[str], running: Iterable[str],
             required: Iterable[str] = ()) -> frozenset[str]:
    """The capabilities the cases of a test naming the ``running`` clauses and requiring the
    capabilities ``required`` are built without, in a cell that declares deviations of the
    ``declared`` clauses: what a declared clause the test does not name governs, unless the test
    names another clause governing it too or requires it."""
    running = set(running)
    kept = {GOVERNS[c] for c in running if c in GOVERNS} | set(required)
    return frozenset(GOVERNS[c] for c in declared
                     if c in GOVERNS and c not in running and GOVERNS[c] not in UNWITHHELD) - kept


def withhold(spec, declared: Iterable[str], running: Iterable[str],
             required: Iterable[str] = ()):
    """For a case ``spec`` (a :class:`~.strategies.CaseSpec`) of a test naming the ``running``
    clauses and requiring ``required``, in a cell declaring the ``declared`` clauses: ``(spec
    without what is withheld that is no capability of a call (:data:`PROJECTION_BIASES`), the
    withheld capabilities)`` (:func:`withheld`); the capabilities' features are dropped by fitting
    the case to the claims less those (``harness.fit``)."""
    held = withheld(declared, running, required)
    return (spec._replace(use_bias=False) if PROJECTION_BIASES in held else spec), held


def leaves_empty_rows(declared: Iterable[str], running: Iterable[str],
                      governed: str = EMPTY_ROWS) -> bool:
    """Whether the checks of a test naming the ``running`` clauses leave rows without an allowed
    key (``governed``: :data:`EMPTY_ROWS`, or :data:`EMPTY_ROW_GRADIENTS` for the gradients they
    reach) unjudged: a declared clause it does not name governs them."""
    return any(GOVERNS.get(c) == governed and c not in set(running) for c in declared)
