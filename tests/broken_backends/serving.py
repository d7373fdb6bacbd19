"""Spec 1.4: merges of partial states (MERGE) and paged caches (PAGE) with one mistake each."""

from __future__ import annotations

import numpy as np

from mhaspec.spec import oracle_serving
from oracle_backend import OracleBackend


# -- spec 1.4: merges of partial states with one mistake each (MERGE) -----------------------------

def _unguarded_merge(outputs, natural: list):
    """lse = log sum exp(lse_m), O = sum exp(lse_m - lse) O_m with nothing guarding a row that is
    empty in every state (-inf - -inf = NaN)."""
    with np.errstate(all="ignore"):
        lse = np.log(sum(np.exp(x) for x in natural))
        out = sum(np.exp(x - lse)[..., None] * o for x, o in zip(natural, outputs))
    return out, lse


class MergeNanForEmptyStates(OracleBackend):
    """The weights exp(lse_m - lse) unguarded: two empty states give NaN, not an empty state
    (vLLM PR 28181 / 39148, FlashInfer issue 4051)."""

    def _merge(self, outputs, lses, sinks, conventions):
        b = outputs[0].shape[0]
        natural = [oracle_serving.to_natural(x, batch=b, **conventions) for x in lses]
        if sinks is not None:
            natural.append(np.broadcast_to(np.asarray(sinks, np.float64)[None, :, None],
                                           natural[0].shape))
            outputs = [*outputs, np.zeros_like(outputs[0])]
        out, lse = _unguarded_merge(outputs, natural)
        return out, oracle_serving.from_natural(lse, **conventions)


class MergeBase2AsNatural(OracleBackend):
    """A base-2 lse merged as a natural one (FlashInfer issue 2113, sglang 35045)."""

    def _merge(self, outputs, lses, sinks, conventions):
        return super()._merge(outputs, lses, sinks, {**conventions, "lse_base": "e"})


class MergeSinkInEveryState(OracleBackend):
    """The sink joins every state's denominator before the merge: counted n times (MERGE-4)."""

    def _merge(self, outputs, lses, sinks, conventions):
        if sinks is None:
            return super()._merge(outputs, lses, sinks, conventions)
        sunk = [super(MergeSinkInEveryState, self)._merge([o], [x], sinks, conventions)
                for o, x in zip(outputs, lses)]
        return super()._merge([o for o, _ in sunk], [x for _, x in sunk], None, conventions)


# -- spec 1.4: paged caches with one mistake each (PAGE) -------------------------------------------

class PageIndexOffByOne(OracleBackend):
    """Reads key j from page ``block_table[b, j // S] + 1``: the neighbouring page."""

    def _paged(self, q, k_pages, v_pages, block_table, *rest):
        return super()._paged(q, k_pages, v_pages, (block_table + 1) % k_pages.shape[0], *rest)


class StaleSlotRead(OracleBackend):
    """Attends every slot of an item's pages, the slots past its length included."""

    def _paged(self, q, k_pages, v_pages, block_table, seq_lens, *rest):
        size = k_pages.shape[1]
        return super()._paged(q, k_pages, v_pages, block_table, -(-seq_lens // size) * size,
                              *rest)


class WriteToTheNextSlot(OracleBackend):
    """Writes token n at slot ``slot_mapping[n] + 1``."""

    def _write(self, k_pages, v_pages, k, v, slots):
        return super()._write(k_pages, v_pages, k, v, (slots + 1) % (k_pages.shape[0] *
                                                                     k_pages.shape[1]))
