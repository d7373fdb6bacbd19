"""Chapter MERGE, spec 1.4: merging partial attention states (optional capability "merge").

Axis legend: B batch, h heads, L_q / L_k lengths, d_v value width, n states, T = B * L_q tokens.

A case's keys are split into n contiguous blocks; each block's state (output, lse) is the float64
oracle's attention over it (:func:`states_of`), rounded to the cell's dtype when it becomes a
backend array, and the states chosen empty have every key of their block padded out (MERGE-2).
``merge_states`` of the backend is judged against the oracle's attention over the union under
NUM-3, with the oracle's merge of the same rounded states (``oracle_serving.merge_states`` in the
dtype) as the naive run. MERGE-5 merges two states of the backend's own attention.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import example, given, strategies as st

from mhaspec.backends import serving
from mhaspec.conformance import conditions, covering, harness, observation, tolerance, vjp
from mhaspec.conformance.expect import record_failure
from mhaspec.conformance.item_state import running
from mhaspec.conformance.judge import finite_max_abs
from mhaspec.conformance.strategies import CaseSpec, case_specs
from mhaspec.spec import oracle, oracle_serving, oracle_vjp

pytestmark = pytest.mark.requires("merge")

STATES = st.sampled_from([1, 2, 4])
EMPTY = st.sampled_from(conditions.DIMENSIONS["empty_state"])
BASES = st.sampled_from(oracle_serving.LSE_BASES)
EMPTY_LSES = st.sampled_from(oracle_serving.EMPTY_LSES)
LAYOUTS = st.sampled_from(oracle_serving.LSE_LAYOUTS)
#: the cases: every masking a block of keys can carry (no causal mask: MERGE-5 has it)
SPECS = case_specs(masks=True, bias=True, key_padding=True, custom_scale=True)


class Split(NamedTuple):
    """The keys of a case split into states: each state's output (B, h, L_q, d_v) and natural
    lse (B, h, L_q), and the keyword arguments of attention over their union."""

    outputs: list
    lses: list
    union: dict


def _blocks(len_k: int, n: int) -> list[slice]:
    """n contiguous key blocks covering [0, L_k) (some empty when L_k < n)."""
    edges = np.linspace(0, len_k, n + 1).round().astype(int)
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def _sliced(kw: dict, cols: slice, len_k: int) -> dict:
    """The masking arguments of attention over the keys ``cols``."""
    out = dict(kw)
    for name in ("mask", "bias", "legacy_mask", "key_padding_mask"):
        x = kw.get(name)
        if x is not None and np.shape(x)[-1] == len_k:
            out[name] = x[..., cols]
    return out


def states_of(case, n: int, empty: str) -> Split:
    """``case``'s keys in ``n`` blocks, their oracle states; ``empty`` ("none", "first", "last",
    "all") names the blocks whose keys are all padded out (in the union too)."""
    b, h, l_q, _ = case.q.shape
    l_k = case.k.shape[2]
    kw = {k: v for k, v in case.mask_kwargs().items() if k != "causal"}
    padding = np.ones((b, l_k), bool) if kw["key_padding_mask"] is None else \
        kw["key_padding_mask"].copy()
    blocks = _blocks(l_k, n)
    chosen = {"none": [], "first": [0], "last": [n - 1], "all": list(range(n))}[empty]
    for i in chosen:
        padding[:, blocks[i]] = False
    kw["key_padding_mask"] = padding
    outputs, lses = [], []
    for cols in blocks:
        if cols.stop == cols.start:  # no key at all: the empty state (0, -inf)
            outputs.append(np.zeros((b, h, l_q, case.v.shape[3])))
            lses.append(np.full((b, h, l_q), -np.inf))
            continue
        res = oracle.attention_result(case.q, case.k[:, :, cols], case.v[:, :, cols],
                                      **_sliced(kw, cols, l_k))
        outputs.append(res.output)
        lses.append(res.lse)
    return Split(outputs, lses, kw)


def _declared(cell, conventions: dict, sink: bool = False) -> None:
    """Leave a call with a convention the backend does not declare (MERGE-3), or with sinks where
    it does not claim "sink", out as not implemented."""
    declared = serving.conventions_of(cell.backend)
    missing = [f"{k}={v!r}" for k, v in conventions.items() if v not in declared[k]]
    if sink and "sink" not in harness.op_capabilities(cell.backend, "sdpa"):
        missing.append("sinks (capability 'sink' not claimed)")
    if missing:
        state = running()
        if state is not None:
            state.sub_cases_left_out.update(f"merge {m}" for m in missing)
        observation.not_implemented_call(missing)


def _merge(cell, outputs, lses, conventions: dict, sinks=None):
    """The backend's merge of NumPy states (rounded to the cell's dtype) -> NumPy (out, lse)."""
    arrays = [cell.arr(o) for o in outputs], [cell.arr(x) for x in lses]
    kw = dict(conventions, **({} if sinks is None else {"sinks": cell.arr(sinks)}))
    out, lse = cell.call("merge_states", *arrays, **kw)
    return cell.backend.to_numpy(out), cell.backend.to_numpy(lse)


def _rounded(cell, x: np.ndarray) -> np.ndarray:
    """``x`` as the backend holds it in the cell's dtype (float64 NumPy)."""
    return np.asarray(cell.backend.to_numpy(cell.arr(x)), dtype=np.float64)


def _signed(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``got`` with 0 where the oracle is +-inf and ``got`` is not the same infinity, so a wrong
    sign (or a NaN) counts as an infinite error (an empty row's lse, MERGE-3)."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        return got
    return np.where(~np.isfinite(want) & (got != want), 0.0, got)


def expect_merge(cell, case, got: tuple, expected, naive: list, *, clause: str, context: str,
                 conventions: dict, condition: float) -> None:
    """Judge a merged ``got`` (out, lse in ``conventions``) against the oracle's ``expected``
    attention over the union (output, natural lse) under NUM-3; ``naive``: (out, lse) pairs of the
    naive run in the cell's dtype, lse in ``conventions``; ``condition``: NUM-3's kappa, the
    softmax condition of the attention the states come from (each state's lse carries its rounding,
    about u |S|, which every merge weight exp(lse_m - lse) inherits)."""
    want_lse = oracle_serving.from_natural(expected.lse, **conventions)
    scale = max(finite_max_abs(expected.output), finite_max_abs(case.v))
    parts = [("output", got[0], expected.output, [n[0] for n in naive], scale),
             ("lse", _signed(got[1], want_lse), want_lse, [n[1] for n in naive],
              harness.lse_scale(want_lse))]
    length = max(case.k.shape[2], case.q.shape[3], len(naive[0]))
    for what, verdict in harness.judge_parts(parts, dtype=cell.dtype, clause=clause,
                                             sum_length=length, condition=condition):
        if not verdict.ok:
            record_failure(clause, f"merge_states {what}{context}", verdict.error, 1.0,
                           f"differs from the float64 oracle: {verdict.describe()}", case.spec)
            raise AssertionError(
                f"[{clause}] {cell.backend.name} ({cell.device}, {cell.dtype}): merge_states "
                f"{what}{context} differs from the float64 oracle's attention over the union: "
                f"{verdict.describe()}\ncase: {case.spec!r}")


def own_conventions(cell, **given: str | None) -> dict:
    """The conventions of a merge call: those ``given``, and for each left None the first value
    the backend declares (LSE-1's where it declares it: MERGE-1, 2 and 5 hold in any base)."""
    declared = serving.conventions_of(cell.backend)
    return {name: given.get(name) or values[0] for name, values in declared.items()}


def check_merge(cell, spec: CaseSpec, clause: str, *, states: int, empty: str,
                lse_base: str | None = None, empty_lse: str | None = None,
                lse_layout: str | None = None, sink: bool = False, regroup: int = 0) -> None:
    """Split ``spec``'s keys into ``states`` states (``empty`` of them emptied), merge them by the
    backend in the conventions given (None: its own, :func:`own_conventions`; with a sink:
    MERGE-4) and judge the result. ``regroup`` m > 0: merge the first m states first and that
    merge with the others (MERGE-2)."""
    conventions = own_conventions(cell, lse_base=lse_base, empty_lse=empty_lse,
                                  lse_layout=lse_layout)
    lse_base, empty_lse, lse_layout = (conventions[k] for k in ("lse_base", "empty_lse",
                                                                "lse_layout"))
    _declared(cell, conventions, sink)
    case = cell.case(spec, "sdpa")
    harness.note("sdpa", case.spec, states=str(states), empty_state=empty, lse_base=lse_base,
                 empty_lse=empty_lse, lse_layout=lse_layout, sink="sink" if sink else "none")
    split = states_of(case, states, empty)
    sinks = vjp.sinks_of(case, 1.0) if sink else None
    lses = [oracle_serving.from_natural(x, **conventions) for x in split.lses]
    if regroup:
        first = _merge(cell, split.outputs[:regroup], lses[:regroup], conventions)
        got = _merge(cell, [first[0], *split.outputs[regroup:]], [first[1], *lses[regroup:]],
                     conventions, sinks)
    else:
        got = _merge(cell, split.outputs, lses, conventions, sinks)
    rounded = [_rounded(cell, o) for o in split.outputs], [_rounded(cell, x) for x in lses]
    naive = [oracle_serving.merge_states(*rounded, sinks=None if sinks is None else
                                         _rounded(cell, sinks), precision=p, **conventions)
             for p in tolerance.naive_precisions(cell.dtype)]
    info: dict = {}
    expected = oracle.attention_result(case.q, case.k, case.v, **split.union, info=info)
    condition = max(1.0, info.get("logit_condition", 0.0))
    if sinks is not None:
        expected = oracle_vjp.attention_with_sinks(case.q, case.k, case.v, sinks=sinks,
                                                   **split.union)
        condition = max(condition, float(np.max(np.abs(sinks))))
    how = f" of {states} state(s), empty: {empty}, {conventions}{', a sink' if sink else ''}" + (
        f", the first {regroup} merged first" if regroup else "")
    expect_merge(cell, case, got, expected, naive, clause=clause, context=how,
                 conventions=conventions, condition=condition)


@pytest.mark.clause("MERGE-1")
@covering.cover("MERGE-1", states=2, empty="none", sink=False)
@given(spec=SPECS, states=STATES, empty=EMPTY, sink=st.booleans())
def test_merging_states_equals_attention_over_their_union(cell, spec, states, empty, sink):
    check_merge(cell, spec, "MERGE-1", states=states, empty=empty, sink=sink)


@pytest.mark.clause("MERGE-2")
@covering.cover("MERGE-2", states=2, empty="none", empty_lse="-inf", cut=0.5)
@given(spec=SPECS, states=st.sampled_from([2, 4]), empty=EMPTY, empty_lse=EMPTY_LSES,
       cut=st.floats(0.0, 1.0))
# always run: logits of about 1,100 (kappa 1128) give each state's lse a float64 rounding of about
# u |S|, which the merge weights inherit: 8.9e-15 from the spec's own float64 merge, a false alarm
# of the soak when the merge was judged with kappa = 1
@example(spec=CaseSpec(batch=2, heads=2, len_q=5, len_k=5, d_k=4, d_v=4, use_bias=False,
                       mask_shape=(5, 5), mask_density=0.7, bias_shape=(5, 5), scale=2.0,
                       logit_scale=100.0, seed=63907), states=4, empty="none", empty_lse="-inf",
         cut=0.0)
def test_empty_states_are_the_identity_and_merging_is_associative(cell, spec, states, empty,
                                                                  empty_lse, cut):
    """The first m states merged, then merged with the rest (m from 1 to n - 1); empty states
    first, last or all (two empty states merge into an empty one, not NaN)."""
    m = min(states - 1, 1 + int(cut * (states - 1)))
    check_merge(cell, spec, "MERGE-2", states=states, empty=empty, empty_lse=empty_lse,
                regroup=m)


@pytest.mark.clause("MERGE-3")
@covering.cover("MERGE-3", lse_base="e", empty_lse="-inf", lse_layout="batch", empty="none")
@given(spec=SPECS, lse_base=BASES, empty_lse=EMPTY_LSES, lse_layout=LAYOUTS, empty=EMPTY)
def test_the_declared_conventions_of_the_lse(cell, spec, lse_base, empty_lse, lse_layout, empty):
    check_merge(cell, spec, "MERGE-3", states=2, empty=empty, lse_base=lse_base,
                empty_lse=empty_lse, lse_layout=lse_layout)


@pytest.mark.clause("MERGE-4")
@covering.cover("MERGE-4", states=2, empty="none", lse_base="e")
@given(spec=SPECS, states=STATES, empty=EMPTY, lse_base=BASES)
def test_a_sink_enters_once_after_the_merge(cell, spec, states, empty, lse_base):
    check_merge(cell, spec, "MERGE-4", states=states, empty=empty, lse_base=lse_base, sink=True)


@pytest.mark.clause("MERGE-5")
@pytest.mark.requires("sdpa", "lse", "causal")
@covering.cover("MERGE-5")
@given(spec=case_specs(custom_scale=True, sizes=lambda z: z.len_k > z.len_q))
def test_chunked_prefill_merged_equals_the_cache_call(cell, spec):
    """The first L_k - L_q keys are the cache (attended without a mask), the last L_q the new
    tokens (causal, bottom-right); both states from the backend's own attention, merged."""
    case = cell.case(spec, "sdpa")
    past = case.k.shape[2] - case.q.shape[2]
    prefix = harness.run(cell, "sdpa", case._replace(k=case.k[:, :, :past], v=case.v[:, :, :past]),
                         lse=True)
    new = harness.run(cell, "sdpa", case._replace(k=case.k[:, :, past:], v=case.v[:, :, past:]),
                      lse=True, causal="bottom_right")
    for part in (prefix, new):
        assert part.lse is not None, f"[MERGE-5] {cell.id}: no lse returned with lse=True"
    conventions = own_conventions(cell)  # the backend's own lse, converted as MERGE-3 says
    lses = [oracle_serving.from_natural(part.lse, **conventions) for part in (prefix, new)]
    got = _merge(cell, [np.array(prefix.out), np.array(new.out)],  # own copies of the results
                 lses, conventions)
    kw = {"scale": case.spec.scale, "past_key": case.k[:, :, :past],
          "past_value": case.v[:, :, :past], "causal": "bottom_right"}
    info: dict = {}
    expected = oracle.attention_result(case.q, case.k[:, :, past:], case.v[:, :, past:], **kw,
                                       info=info)
    # NUM-3's naive run of the same computation: both states and their merge in the dtype (a merge
    # rounds exp(lse_m - lse), an error that grows with |lse| and one pass over the union lacks)
    naive = []
    for p in tolerance.naive_precisions(cell.dtype):
        parts = [oracle.attention_result(case.q, case.k[:, :, :past], case.v[:, :, :past],
                                         scale=case.spec.scale, precision=p),
                 oracle.attention_result(case.q, case.k[:, :, past:], case.v[:, :, past:],
                                         scale=case.spec.scale, causal="bottom_right",
                                         precision=p)]
        naive.append(oracle_serving.merge_states(
            [s.output for s in parts], [oracle_serving.from_natural(s.lse, **conventions)
                                        for s in parts], precision=p, **conventions))
    expect_merge(cell, case, got, expected, naive, clause="MERGE-5",
                 context=f" of a cached prefix of {past} key(s) and {case.q.shape[2]} new "
                         f"token(s), {conventions}", conventions=conventions,
                 condition=max(1.0, info.get("logit_condition", 0.0)))


@pytest.mark.clause("MERGE-6")
@pytest.mark.requires("errors")
def test_invalid_merges_are_rejected(cell):
    for spec in covering.row_specs("MERGE-6", CaseSpec(seed=34)):
        case = cell.case(spec, "sdpa")
        harness.note("sdpa", case.spec)
        split = states_of(case, 2, "none")
        o, x = split.outputs, split.lses
        b, h, l_q, d_v = o[0].shape
        bad = [
            ("outputs not a sequence", "outputs", (o[0], x), {}),
            ("no states", "outputs", ([], []), {}),
            ("one lse for two outputs", "lses", (o, x[:1]), {}),
            ("rank-3 outputs", "outputs", ([a[0] for a in o], x), {}),
            ("outputs of different shapes", "outputs", ([o[0], o[1][..., :0]], x), {}),
            ("lse of the wrong shape", "lses", (o, [x[0], x[1][:, :, :0]]), {}),
            ("a (B, h, L_q) lse with lse_layout='tokens'", "lses", (o, x),
             {"lse_layout": "tokens"}),
            ("sinks of shape (h + 1,)", "sinks", (o, x), {"sinks": np.zeros(h + 1)}),
            ("lse_base='10'", "lse_base", (o, x), {"lse_base": "10"}),
            ("empty_lse='nan'", "empty_lse", (o, x), {"empty_lse": "nan"}),
            ("lse_layout='T, h'", "lse_layout", (o, x), {"lse_layout": "T, h"}),
        ]
        problems = [p for what, name, args, kw in bad
                    if (p := _rejection(cell, what, name, args, kw)) is not None]
        problems += [p for p in [_rejection(cell, "an lse of another dtype", "lses", (o, x), {},
                                            lse_dtype="float64" if cell.dtype != "float64"
                                            else "float32"),
                                 _rejection(cell, "integer outputs", "outputs",
                                            ([np.zeros(a.shape) for a in o],
                                             [np.zeros(a.shape) for a in x]), {},
                                            out_dtype="int64", lse_dtype="int64")]
                     if p is not None]
        assert not problems, f"[MERGE-6] {cell.id}:\n  " + "\n  ".join(problems)


def _rejection(cell, what: str, name: str, args: tuple, kw: dict, *, out_dtype=None,
               lse_dtype=None) -> str | None:
    """None when ``merge_states(*args, **kw)`` raises ValueError naming ``name``, else the problem
    (the harness's rejection rule, :func:`harness.call_problem`, for a merge)."""
    outputs, lses = args

    def convert(x, dtype):
        return cell.arr(np.asarray(x), dtype) if isinstance(x, np.ndarray) else x

    outs = convert(outputs, out_dtype) if isinstance(outputs, np.ndarray) else \
        [convert(a, out_dtype) for a in outputs]
    ls = [convert(a, lse_dtype) for a in lses]
    extra = {k: convert(v, None) for k, v in kw.items()}
    return harness.call_problem(lambda: cell.call("merge_states", outs, ls, **extra), name, what)
