"""The signatures of known mistakes of spec 1.4's serving step (MERGE, PAGE), for :mod:`.diagnosis`.

Each :class:`ServingSignature` is one mistake of the project's catalogue (``tests/broken_backends/``)
with one fixed call of ``merge_states``, ``paged_attention`` or ``write_pages`` and what the
mistake gives there: the serving oracle (:mod:`mhaspec.spec.oracle_serving`) with one argument
changed (a base-2 lse read as natural, the page table shifted by one page, lengths rounded up to
whole pages, slots shifted by one) or the merge done in the wrong order (a sink in every state).

Axis legend: B batch, h heads, L_q queries, d_v value width, n states; P pages, S page size,
g key/value heads, T packed query tokens.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from mhaspec.backends import serving
from mhaspec.spec import oracle_serving

from .paged_cases import PagedCase, paged_case, tokens_to_write
from .strategies import CaseSpec

#: the merged states: two of (B, h, L_q, d_v) = (2, 2, 3, 4), natural lse in [-2, 3)
STATES = (2, 2, 3, 4)
#: the sinks of a merge with sinks, one per head (natural logits)
SINKS = np.array([0.5, -1.0])
#: the paged case: two items of lengths no page size divides, pages shuffled, stale keys and values
#: in the unused slots, causal (the case :func:`.paged_cases.paged_case` builds from this seed)
PAGED = CaseSpec(batch=2, heads=2, len_q=3, len_k=5, d_k=4, d_v=6, logit_scale=3.0, seed=11)


class ServingSignature(NamedTuple):
    """One known mistake: ``says`` (one line ending with its clauses), the capabilities its call
    needs, and ``run(cell)``: ``(got, mistake, oracle)``, three tuples of NumPy arrays in one
    order (the backend's results, what the mistake gives, what the spec gives), or None when the
    cell cannot make the call (a convention it does not declare)."""

    says: str
    needs: frozenset
    run: Callable


def _rounded(cell, x) -> np.ndarray:
    """``x`` as the cell holds it (float64 NumPy)."""
    return np.asarray(cell.backend.to_numpy(cell.arr(x)), dtype=np.float64)


def _states(cell, empty: bool = False) -> tuple[list, list]:
    """Two states (outputs, natural lses) as the cell holds them; both empty (0, -inf) with
    ``empty``."""
    b, h, l_q, d_v = STATES
    if empty:
        return [np.zeros(STATES)] * 2, [np.full((b, h, l_q), -np.inf)] * 2
    rng = np.random.default_rng(21)
    outputs = [_rounded(cell, rng.standard_normal(STATES)) for _ in range(2)]
    lses = [_rounded(cell, rng.uniform(-2.0, 3.0, (b, h, l_q))) for _ in range(2)]
    return outputs, lses


def _merge(cell, outputs, lses, sinks=None, **conventions) -> tuple:
    """The backend's merge -> (output, lse) as float64 NumPy."""
    kw = dict(conventions, **({} if sinks is None else {"sinks": cell.arr(sinks)}))
    out, lse = cell.call("merge_states", [cell.arr(o) for o in outputs],
                         [cell.arr(x) for x in lses], **kw)
    return tuple(np.asarray(cell.backend.to_numpy(x), np.float64) for x in (out, lse))


def _empty_states_nan(cell):
    """Two empty states: the unguarded weights give a NaN output (the lse is not compared: log 0
    is -inf either way)."""
    outputs, lses = _states(cell, empty=True)
    return (_merge(cell, outputs, lses), (np.full(STATES, np.nan), None),
            oracle_serving.merge_states(outputs, lses))


def _base_2_as_natural(cell):
    if "2" not in serving.conventions_of(cell.backend)["lse_base"]:
        return None
    outputs, natural = _states(cell)
    lses = [_rounded(cell, oracle_serving.from_natural(x, lse_base="2")) for x in natural]
    return (_merge(cell, outputs, lses, lse_base="2"),
            oracle_serving.merge_states(outputs, lses, lse_base="e"),
            oracle_serving.merge_states(outputs, lses, lse_base="2"))


def _sink_in_every_state(cell):
    outputs, lses = _states(cell)
    sinks = _rounded(cell, SINKS)
    sunk = [oracle_serving.merge_states([o], [x], sinks=sinks) for o, x in zip(outputs, lses)]
    return (_merge(cell, outputs, lses, sinks),
            oracle_serving.merge_states([o for o, _ in sunk], [x for _, x in sunk]),
            oracle_serving.merge_states(outputs, lses, sinks=sinks))


def _paged_case(cell) -> PagedCase:
    """:data:`PAGED` in pages of 3u (u the backend's page-size unit), as the cell holds it."""
    case = paged_case(PAGED, page_size="does_not_divide", pages="shuffled", unused="stale",
                      causal=True, gqa=False, unit=serving.page_size_unit_of(cell.backend))
    return case._replace(q=_rounded(cell, case.q), k_pages=_rounded(cell, case.k_pages),
                         v_pages=_rounded(cell, case.v_pages))


def _paged(cell, changed: Callable[[PagedCase], dict]) -> tuple:
    """(backend, oracle with the arguments ``changed(case)`` replaced, oracle) outputs on the
    paged case."""
    case = _paged_case(cell)
    got = cell.call("paged_attention", *(cell.arr(x) for x in case[:6]), causal=case.causal,
                    scale=case.scale)

    def oracle(**kw):
        args = case._replace(**kw)
        return (oracle_serving.paged_attention(*args[:6], causal=args.causal, scale=args.scale),)

    return ((np.asarray(cell.backend.to_numpy(got), np.float64),), oracle(**changed(case)),
            oracle())


def _write_next_slot(cell):
    case = _paged_case(cell)
    k, v, slots = tokens_to_write(PAGED, case)
    k, v = _rounded(cell, k), _rounded(cell, v)
    got = cell.call("write_pages", *(cell.arr(x) for x in (case.k_pages, case.v_pages, k, v)),
                    cell.arr(slots))
    total = case.k_pages.shape[0] * case.k_pages.shape[1]
    return (tuple(np.asarray(cell.backend.to_numpy(x), np.float64) for x in got),
            oracle_serving.write_pages(case.k_pages, case.v_pages, k, v, (slots + 1) % total),
            oracle_serving.write_pages(case.k_pages, case.v_pages, k, v, slots))


SERVING_SIGNATURES = {
    "merge-nan-empty": ServingSignature(
        "two empty states merge to NaN, not to the empty state (0, -inf): the weights "
        "exp(lse_m - lse) are not guarded when every lse is -inf (MERGE-2)",
        frozenset({"merge"}), _empty_states_nan),
    "merge-base2-as-natural": ServingSignature(
        "agrees with a base-2 lse merged as a natural one: lse_base='2' is not converted before "
        "the merge (MERGE-3)", frozenset({"merge"}), _base_2_as_natural),
    "merge-sink-every-state": ServingSignature(
        "agrees with the sink merged into every state before the merge: counted once per state, "
        "where it enters once, after it (MERGE-4)", frozenset({"merge", "sink"}),
        _sink_in_every_state),
    "page-index-off-by-one": ServingSignature(
        "agrees with key j read from page block_table[b, j // S] + 1: the page index is off by "
        "one (PAGE-1)", frozenset({"paged"}),
        lambda cell: _paged(cell, lambda c: {"block_table": (c.block_table + 1) %
                                             c.k_pages.shape[0]})),
    "page-stale-slot-read": ServingSignature(
        "agrees with every slot of an item's last page attended: the slots past its length are "
        "read (PAGE-2)", frozenset({"paged"}),
        lambda cell: _paged(cell, lambda c: {"seq_lens": -(-c.seq_lens // c.k_pages.shape[1]) *
                                             c.k_pages.shape[1]})),
    "page-write-next-slot": ServingSignature(
        "agrees with token n written at slot slot_mapping[n] + 1: the write is one slot off "
        "(PAGE-3)", frozenset({"paged"}), _write_next_slot),
}
