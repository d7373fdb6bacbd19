"""Chapter PAGE, spec 1.4: paged KV caches (optional capability "paged").

Axis legend: P pages, S page size, g key/value heads, M table entries per item, T packed query
tokens, n_b the queries and L_b the keys of item b, d_k / d_v widths.

:func:`paged_case` lays a case's items out in pages as the condition row says (page size, the
pages' order, what unused slots hold); a page size is a multiple of the backend's declared
``page_size_unit`` u (``serving.page_size_unit_of``, 1 by default: PAGE-1): u, 2u dividing every
length, 3u dividing none, the lengths scaled by u; the oracle (``oracle_serving.paged_attention``) gathers the
keys from the pool by PAGE-1's rule, so a layout mistake of the case builder would show as a
failure of every backend, never as a pass.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import conditions, covering, harness, tolerance
from mhaspec.conformance.expect import record_failure
from mhaspec.conformance.judge import finite_max_abs
from mhaspec.conformance.strategies import CaseSpec, case_specs
from mhaspec.backends import serving
from mhaspec.spec import oracle_serving

pytestmark = pytest.mark.requires("paged")

SIZES = st.sampled_from(conditions.DIMENSIONS["page_size"])
ORDERS = st.sampled_from(conditions.DIMENSIONS["pages"])
UNUSED = st.sampled_from(conditions.DIMENSIONS["unused"])
SPECS = case_specs(custom_scale=True)
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


def _call(cell, case: PagedCase) -> np.ndarray:
    args = [cell.arr(x) for x in case[:6]]
    out = cell.call("paged_attention", *args, causal=case.causal, scale=case.scale)
    return np.asarray(cell.backend.to_numpy(out), dtype=np.float64)


def expect_paged(cell, spec: CaseSpec, case: PagedCase, clause: str, context: str) -> None:
    """Judge the backend's paged attention on ``case`` against the oracle under NUM-3."""
    info: dict = {}
    kw = dict(causal=case.causal, scale=case.scale)
    expected = oracle_serving.paged_attention(*case[:6], **kw, info=info)
    naive = [oracle_serving.paged_attention(*case[:6], **kw, precision=p)
             for p in tolerance.naive_precisions(cell.dtype)]
    got = _call(cell, case)
    valid = [oracle_serving.gather_pages(case.v_pages, case.block_table, case.seq_lens, b)
             for b in range(len(case.seq_lens))]
    scale = max(finite_max_abs(expected), *(finite_max_abs(v) for v in valid))
    length = max(int(case.seq_lens.max()), case.q.shape[2])
    (_, verdict), = harness.judge_parts(
        [("output", got, expected, naive, scale)], dtype=cell.dtype, clause=clause,
        sum_length=length, condition=max(1.0, info.get("logit_condition", 0.0)))
    if not verdict.ok:
        record_failure(clause, f"paged_attention output{context}", verdict.error, scale,
                       f"differs from the float64 oracle: {verdict.describe()}", spec)
        raise AssertionError(
            f"[{clause}] {cell.backend.name} ({cell.device}, {cell.dtype}): paged_attention "
            f"output{context} differs from the float64 oracle: {verdict.describe()}\n"
            f"case: {spec!r}, table {case.block_table.tolist()}, seq_lens "
            f"{case.seq_lens.tolist()}, query_start_loc {case.query_start_loc.tolist()}")


def _run(cell, spec, clause: str, *, page_size: str, pages: str, unused: str, causal: bool):
    harness.note("sdpa", spec, page_size=page_size, pages=pages, unused=unused,
                 paged_causal="yes" if causal else "no")
    case = paged_case(spec, page_size=page_size, pages=pages, unused=unused, causal=causal,
                      gqa="gqa" in cell.backend.capabilities,
                      unit=serving.page_size_unit_of(cell.backend))
    expect_paged(cell, spec, case, clause, f" (page size {case.k_pages.shape[1]}, pages "
                                           f"{pages}, unused slots {unused}, causal {causal})")


@pytest.mark.clause("PAGE-1")
@covering.cover("PAGE-1", page_size="1", causal=False)
@given(spec=SPECS, page_size=SIZES, causal=st.booleans())
def test_key_j_is_in_page_table_j_div_s_slot_j_mod_s(cell, spec, page_size, causal):
    _run(cell, spec, "PAGE-1", page_size=page_size, pages="in_order", unused="zero",
         causal=causal)


@pytest.mark.clause("PAGE-2")
@covering.cover("PAGE-2", page_size="1", pages="in_order", unused="zero", causal=True)
@given(spec=SPECS, page_size=SIZES, pages=ORDERS, unused=UNUSED, causal=st.booleans())
def test_page_order_shared_pages_and_unused_slots_do_not_matter(cell, spec, page_size, pages,
                                                                unused, causal):
    _run(cell, spec, "PAGE-2", page_size=page_size, pages=pages, unused=unused, causal=causal)


@pytest.mark.clause("PAGE-3")
@covering.cover("PAGE-3", page_size="1", unused="zero")
@given(spec=SPECS, page_size=SIZES, unused=UNUSED)
def test_writing_keys_changes_only_their_slots(cell, spec, page_size, unused):
    """Tokens written over valid and unused slots alike; the pages compared bit for bit (NaN
    equal to NaN) with the oracle's write of the same rounded arrays."""
    harness.note("sdpa", spec, page_size=page_size, unused=unused)
    case = paged_case(spec, page_size=page_size, pages="shuffled", unused=unused, causal=False,
                      gqa=False, unit=serving.page_size_unit_of(cell.backend))
    rng = np.random.default_rng([spec.seed, 35])
    slots_total = case.k_pages.shape[0] * case.k_pages.shape[1]
    n = int(rng.integers(1, min(4, slots_total) + 1))
    slots = rng.choice(slots_total, size=n, replace=False).astype(np.int64)
    g = case.k_pages.shape[2]
    k = rng.standard_normal((n, g, case.k_pages.shape[3]))
    v = rng.standard_normal((n, g, case.v_pages.shape[3]))
    arrays = [cell.arr(x) for x in (case.k_pages, case.v_pages, k, v)]
    before = [np.asarray(cell.backend.to_numpy(a), np.float64) for a in arrays]
    got = cell.call("write_pages", *arrays, cell.arr(slots))
    want = oracle_serving.write_pages(*before, slots)
    for what, mine, expected in zip(("k_pages", "v_pages"), got, want):
        mine = np.asarray(cell.backend.to_numpy(mine), np.float64)
        if mine.shape != expected.shape or not np.array_equal(mine, expected, equal_nan=True):
            wrong = np.argwhere(~((mine == expected) | (np.isnan(mine) & np.isnan(expected)))) \
                if mine.shape == expected.shape else None
            raise AssertionError(
                f"[PAGE-3] {cell.backend.name} ({cell.device}, {cell.dtype}): write_pages "
                f"{what} differs from the pages with slots {slots.tolist()} written (page size "
                f"{case.k_pages.shape[1]}): shape {mine.shape} vs {expected.shape}, first wrong "
                f"(page, slot, head, column) {None if wrong is None or not len(wrong) else wrong[0].tolist()}")
    for name, a, b in zip(("k_pages", "v_pages", "k", "v"), arrays, before):
        after = np.asarray(cell.backend.to_numpy(a), np.float64)
        assert np.array_equal(after, b, equal_nan=True), (
            f"[PAGE-3] {cell.backend.name}: write_pages modified its input {name} (INPUT-1)")


@pytest.mark.clause("PAGE-4")
@pytest.mark.requires("errors")
def test_invalid_paged_calls_are_rejected(cell):
    spec = CaseSpec(batch=2, heads=2, len_q=3, len_k=5, d_k=4, d_v=4, seed=44)
    harness.note("sdpa", spec)
    c = paged_case(spec, page_size="divides", pages="in_order", unused="zero", causal=False,
                   gqa=False)
    pages = c.k_pages.shape[0]
    beyond = c.seq_lens.copy()
    beyond[0] = c.block_table.shape[1] * c.k_pages.shape[1] + 1
    too_many = c.query_start_loc.copy()
    too_many[1:] += c.seq_lens[0] + 1 - (too_many[1] - too_many[0])
    bad = [
        ("a table entry past the pages", "block_table",
         c._replace(block_table=np.where(c.block_table == c.block_table.max(), pages,
                                         c.block_table)), {}),
        ("a negative table entry", "block_table",
         c._replace(block_table=np.where(c.block_table == 0, -1, c.block_table)), {}),
        ("v_pages of another page size", "v_pages",
         c._replace(v_pages=np.zeros((pages, c.k_pages.shape[1] + 1, *c.v_pages.shape[2:]))), {}),
        ("seq_lens beyond the table", "seq_lens", c._replace(seq_lens=beyond), {}),
        ("an item with more queries than keys", "query_start_loc",
         c._replace(query_start_loc=too_many,
                    q=np.zeros((int(too_many[-1]), *c.q.shape[1:]))), {}),
        ("float block_table", "block_table",
         c._replace(block_table=c.block_table.astype(np.float64)), {}),
        ("q of another width", "q", c._replace(q=c.q[..., :-1]), {}),
    ]
    problems = [p for what, name, case, kw in bad
                if (p := _rejection(cell, "paged_attention", name, what,
                                    [cell.arr(x) if x.dtype.kind != "f" or i < 3
                                     else cell.arr(x, "float64") for i, x in enumerate(case[:6])],
                                    {"causal": case.causal, "scale": case.scale})) is not None]
    g, d = c.k_pages.shape[2:]
    k = np.zeros((2, g, d))
    arrays = [cell.arr(x) for x in (c.k_pages, c.v_pages, k, k)]
    slots_total = pages * c.k_pages.shape[1]
    for what, slots in (("a slot past the pages", [0, slots_total]),
                        ("a repeated slot", [1, 1]), ("a negative slot", [-1, 0])):
        p = _rejection(cell, "write_pages", "slot_mapping", what,
                       [*arrays, cell.arr(np.array(slots, np.int64))], {})
        if p is not None:
            problems.append(p)
    assert not problems, f"[PAGE-4] {cell.id}:\n  " + "\n  ".join(problems)


def _rejection(cell, method: str, name: str, what: str, args: list, kw: dict) -> str | None:
    """None when ``method(*args, **kw)`` raises ValueError naming ``name``, else the problem
    (:func:`harness.call_problem`)."""
    return harness.call_problem(lambda: cell.call(method, *args, **kw), name, what)
