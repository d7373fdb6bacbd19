"""The cases of spec 1.4's PAGE chapter: a case's items laid out in pages (:func:`paged_case`),
for the chapter's tests and the diagnosis of paged mistakes.

Axis legend: P pages, S page size, g key/value heads, M table entries per item, T packed query
tokens, n_b the queries and L_b the keys of item b, d_k / d_v widths.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .strategies import CaseSpec

#: page size of each ``page_size`` value in units of the backend's ``page_size_unit`` u: u, one
#: dividing every length (2u), one dividing none (3u)
PAGE_SIZE = {"1": 1, "divides": 2, "does_not_divide": 3}


class PagedCase(NamedTuple):
    """A paged call's arrays (NumPy): q (T, h, d_k), k_pages (P, S, g, d_k), v_pages (P, S, g,
    d_v), block_table (B, M), seq_lens (B,), query_start_loc (B + 1,), causal, scale."""

    q: np.ndarray
    k_pages: np.ndarray
    v_pages: np.ndarray
    block_table: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray
    causal: bool
    scale: float | None


def _length(rng, page_size: str, unit: int, shared: bool) -> int:
    """An item's key count for condition ``page_size`` with page-size unit ``unit`` u (page size
    2u: a multiple of it; 3u: no multiple; u: any count up to 8u)."""
    size = PAGE_SIZE[page_size] * unit
    if page_size == "divides":
        n = size * int(rng.integers(1, 5))
    elif page_size == "does_not_divide":
        n = size * int(rng.integers(0, 3)) + int(rng.integers(1, size))
    else:
        n = int(rng.integers(1, 8 * unit + 1))
    if shared and page_size == "does_not_divide":
        return max(n, size + 1)
    return max(n, size) if shared else n


def paged_case(spec: CaseSpec, *, page_size: str, pages: str, unused: str, causal: bool,
               gqa: bool, unit: int = 1) -> PagedCase:
    """``spec``'s sizes and seed laid out in pages: ``pages`` "in_order", "shuffled" (page ids in
    a random order) or "shared" (every item's first page is one page, holding a common prefix);
    ``unused`` slots (past an item's length, spare pages, table entries past its pages) hold
    zeros, "stale" keys of large magnitude, or NaN and inf ("nonfinite"); page sizes in units of
    ``unit``."""
    rng = np.random.default_rng([spec.seed, 34])
    size, shared = PAGE_SIZE[page_size] * unit, pages == "shared"
    b, h, d_k, d_v = max(1, spec.batch), spec.heads, spec.d_k, spec.d_v
    g = h if not gqa or h == 1 else (h // 2 if h % 2 == 0 else 1)
    lengths = np.array([_length(rng, page_size, unit, shared) for _ in range(b)])
    queries = np.array([int(rng.integers(1, min(n, max(1, spec.len_q)) + 1)) for n in lengths])
    counts = -(-lengths // size)  # pages per item
    entries = int(counts.max()) + 1  # one table entry past every item's pages
    keys = [rng.standard_normal((g, n, d_k)) * spec.logit_scale for n in lengths]
    values = [rng.standard_normal((g, n, d_v)) for n in lengths]
    if shared:  # the common prefix: item 0's first page of keys and values in every item
        for i in range(1, b):
            keys[i][:, :size], values[i][:, :size] = keys[0][:, :size], values[0][:, :size]
    ids, table = 0, np.zeros((b, entries), np.int64)
    for i in range(b):
        for p in range(int(counts[i])):
            if shared and p == 0 and i > 0:
                table[i, 0] = table[0, 0]
            else:
                table[i, p], ids = ids, ids + 1
    total = ids + 2  # two spare pages no item reaches
    if pages == "shuffled":
        order = rng.permutation(total)
        table = np.where(table >= 0, order[table], table)
        spare = order[total - 1]
    else:
        spare = total - 1
    for i in range(b):
        table[i, counts[i]:] = spare
    k_pages = _filled(rng, (total, size, g, d_k), unused, 50.0 * spec.logit_scale)
    v_pages = _filled(rng, (total, size, g, d_v), unused, 50.0)
    for i in range(b):
        for j in range(int(lengths[i])):
            k_pages[table[i, j // size], j % size] = keys[i][:, j]
            v_pages[table[i, j // size], j % size] = values[i][:, j]
    starts = np.concatenate([[0], np.cumsum(queries)]).astype(np.int64)
    q = rng.standard_normal((int(starts[-1]), h, d_k))
    return PagedCase(q, k_pages, v_pages, table, lengths.astype(np.int64), starts, causal,
                     spec.scale)


def _filled(rng, shape, unused: str, stale: float) -> np.ndarray:
    """A pool whose every slot holds what ``unused`` says (the valid slots are written after)."""
    if unused == "zero":
        return np.zeros(shape)
    if unused == "stale":
        return rng.standard_normal(shape) * stale
    pool = np.full(shape, np.nan)
    pool.reshape(-1)[::2] = np.inf
    return pool


def tokens_to_write(spec: CaseSpec, case: PagedCase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PAGE-3's new tokens for ``case``'s pool: k (N, g, d_k), v (N, g, d_v) and N distinct slots
    (N = 1..4), over valid and unused slots alike."""
    rng = np.random.default_rng([spec.seed, 35])
    slots_total = case.k_pages.shape[0] * case.k_pages.shape[1]
    n = int(rng.integers(1, min(4, slots_total) + 1))
    slots = rng.choice(slots_total, size=n, replace=False).astype(np.int64)
    g = case.k_pages.shape[2]
    k = rng.standard_normal((n, g, case.k_pages.shape[3]))
    v = rng.standard_normal((n, g, case.v_pages.shape[3]))
    return k, v, slots
