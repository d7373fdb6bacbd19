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

import numpy as np
import pytest
from hypothesis import given, strategies as st

from mhaspec.conformance import conditions, covering, harness, tolerance
from mhaspec.conformance.expect import record_failure
from mhaspec.conformance.judge import finite_max_abs
from mhaspec.conformance.paged_cases import PagedCase, paged_case, tokens_to_write
from mhaspec.conformance.strategies import CaseSpec, case_specs
from mhaspec.backends import serving
from mhaspec.spec import oracle_serving

pytestmark = pytest.mark.requires("paged")

SIZES = st.sampled_from(conditions.DIMENSIONS["page_size"])
ORDERS = st.sampled_from(conditions.DIMENSIONS["pages"])
UNUSED = st.sampled_from(conditions.DIMENSIONS["unused"])
SPECS = case_specs(custom_scale=True)


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
    k, v, slots = tokens_to_write(spec, case)
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
