"""What ran: the rows of a clause's condition space (:mod:`.conditions`) that the cases a test ran
hold, read back from the cases themselves (:func:`observe`), not from what was asked for. The
harness notes every case it runs on the test item (:func:`note`) and the plugin writes :func:`ran`
into each result; the sub-cases of a call a backend does not support are kept there too
(:func:`judge_sub_cases`).

Axis legend: B batch, h heads, L_q queries, L_k keys (L_K with a cache), d_k / d_v widths.
"""

from __future__ import annotations

import functools
import itertools
from typing import Mapping

import numpy as np
import pytest
from hypothesis import currently_in_test_context, reject

from mhaspec.backends.sub_cases import Sizes, judge
from mhaspec.spec import oracle

from . import extremes, features
from .conditions import (CHUNKS, EMPTY_BY, RECORDED, SPACES, WINDOWS, bias_broadcast_of,
                         dimensions_of)
from .strategies import CaseSpec, build_case


def order_of(len_q: int, len_k: int) -> str:
    """The value of ``lengths`` for these lengths."""
    if len_q == 1 and len_k > 1:
        return "decode"
    return "L_q<L_k" if len_q < len_k else "L_q=L_k" if len_q == len_k else "L_q>L_k"



def _emptied(case, **kw) -> bool:
    """Whether the sdpa oracle on ``case`` with only the keyword arguments ``kw`` has a row of
    all-zero weights (an empty allowed set)."""
    try:
        res = oracle.attention_result(case.q, case.k, case.v, **kw)
    except ValueError:
        return False
    return bool((~np.any(res.weights != 0, axis=-1)).any())


@functools.lru_cache(maxsize=8192)
def _ways_emptied(spec: CaseSpec) -> tuple[str, ...]:
    """The ways of :data:`EMPTY_BY` that alone leave a row of ``spec`` without allowed keys
    (cases with a cache: not classified, empty)."""
    if spec.past_len is not None or min(spec.batch, spec.len_q, spec.len_k) == 0:
        return ()
    case = build_case(spec)
    f, full = case.features, (spec.batch, spec.heads, spec.len_q, spec.len_k)
    ways = {
        "mask": case.mask is not None
        and bool((~np.broadcast_to(case.mask, full).any(axis=-1)).any()),
        "causal_bottom_right": spec.causal == "bottom_right" and spec.len_q > spec.len_k,
        "key_padding": case.key_padding_mask is not None
        and bool((~case.key_padding_mask.any(axis=-1)).any()),
        "window": spec.window is not None and _emptied(
            case, window=spec.window, alignment=spec.alignment or spec.causal or "bottom_right"),
        "segments": spec.segments is not None and _emptied(
            case, q_segment_ids=f.q_segment_ids, kv_segment_ids=f.kv_segment_ids),
        "seq_lengths": spec.seq_lengths is not None and _emptied(
            case, query_seq_lengths=f.query_seq_lengths,
            key_value_seq_lengths=f.key_value_seq_lengths),
        "minus_inf_bias": case.bias is not None and bool(
            np.all(np.broadcast_to(case.bias, full) == -np.inf, axis=-1).any()),
    }
    return tuple(w for w in EMPTY_BY if ways[w])


def _sizes(spec: CaseSpec) -> dict[str, str]:
    """The size dimensions of ``spec``: zero sizes, heads, width, key/value groups."""
    zero = "+".join(n for n in ("batch", "len_q", "len_k") if getattr(spec, n) == 0) or "none"
    g, h = features.kv_heads(spec), spec.heads
    return {"zero": zero, "heads": "1" if h == 1 else ">1", "width": "1" if spec.d_k == 1 else ">1",
            "group": "g=h" if g == h else "g=1" if g == 1 else "1<g<h",
            "head_widths": _head_widths(spec),
            "projection_bias": "with" if spec.use_bias else "none"}


def _head_widths(spec: CaseSpec) -> str:
    """PARAM-1's width value: "wider", or d_k = d_v = 1 with or without as many heads (at least 2)
    as one of the lengths."""
    if not spec.d_k == spec.d_v == 1:
        return "wider"
    return "d_k=d_v=1,h=L" if spec.heads >= 2 and spec.heads in (spec.len_q, spec.len_k) \
        else "d_k=d_v=1"


def _features(spec: CaseSpec) -> dict[str, str]:
    """The feature dimensions of ``spec`` (soft-cap, window, segments, extremes, ...)."""
    cap = spec.softcap
    window = {v: k for k, v in WINDOWS.items()}.get(spec.window, "other")
    chunk = {v: k for k, v in CHUNKS.items()}.get(spec.chunk, "other")
    kind, args = extremes.parse(spec.extreme) if spec.extreme else ("none", [""])
    return {"cap": "none" if cap is None else "tiny" if cap <= 1e-2 else "huge" if cap >= 1e4
            else "moderate",
            "window": "none" if spec.window is None else window,
            "chunk": "none" if spec.chunk is None else chunk,
            "chunk_floor": "negative" if _negative_positions(spec) else "non-negative",
            "chunk_positions": "packed" if spec.segments == "packed" else "array"
            if spec.segments is None and spec.seq_lengths is None and spec.past_len is None
            else "other",
            "segments": spec.segments or "none", "seq_lengths": spec.seq_lengths or "none",
            "nonfinite": args[0] if kind == "masked-key" else "none",
            "shared": "self" if spec.self_attention else args[0] if kind == "shared" else "none"}


def _negative_positions(spec: CaseSpec) -> bool:
    """Whether the first queries sit at negative positions no causal mask empties: no causal,
    bottom-right (named, or a cache's), L_q > L_K (CHUNK-1's floor division shows there)."""
    diagonal = spec.alignment or ("bottom_right" if spec.past_len is not None else None)
    return (spec.causal is None and diagonal == "bottom_right"
            and spec.len_q > features.key_length(spec))


def _multi(spec: CaseSpec, dimensions: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    """The dimensions a case can hold several values of at once: the ways its rows empty, the
    degenerate sizes it has, the masking its rows see (each value gives a row of its own)."""
    out = {}
    if {"empty_by", "empty_rows", "masked_by"} & set(dimensions):
        ways = _ways_emptied(spec)
        out["empty_by"] = ways or ("none",)
        out["empty_rows"] = ("some",) if ways else ("none",)
        out["masked_by"] = ("empty_row",) if ways else ("mask",) if (
            spec.mask_shape is not None or spec.key_padding) else ("none",)
    if "degenerate" in dimensions:
        sizes = {"L_k = 1": spec.len_k == 1, "L_q = 1": spec.len_q == 1, "h = 1": spec.heads == 1,
                 "h = d_model": spec.heads > 1 and spec.d_k == 1}
        out["degenerate"] = tuple(n for n, holds in sizes.items() if holds) or ("none",)
    return {d: v for d, v in out.items() if d in dimensions}


def observe(spec: CaseSpec, op: str, dimensions: tuple[str, ...],
            recorded: Mapping[str, str] = {}) -> list[dict[str, str]]:
    """The rows over ``dimensions`` that the case ``spec`` (as run: fitted to the backend) holds
    (one per value of a dimension it holds several of, :func:`_multi`); ``recorded``: values of
    :data:`RECORDED` dimensions the test noted with it ("none" when not)."""
    base = {"op": op, "lengths": order_of(spec.len_q, features.key_length(spec)),
            "bias": "none" if spec.bias_shape is None else "finite",
            "bias_broadcast": "absent" if spec.bias_shape is None
            else bias_broadcast_of(spec.bias_shape, (spec.batch, spec.heads, spec.len_q,
                                                     features.key_length(spec))),
            "alignment": spec.alignment or spec.causal
            or ("bottom_right" if spec.past_len is not None else "none"),
            "causal": spec.causal or "none",
            "with_causal": "yes" if spec.causal is not None else "no",
            "slopes": "none" if spec.alibi is None else "(B, h)" if spec.alibi == "per_batch"
            else "(h,)",
            "past": "none" if spec.past_len is None
            else "per_item_lengths" if spec.past_valid else "all_valid",
            **_sizes(spec), **_features(spec), **{d: "none" for d in RECORDED}, **recorded}
    multi = _multi(spec, dimensions)
    rows = [dict(zip(multi, values)) for values in itertools.product(*multi.values())]
    return [{d: {**base, **extra}[d] for d in dimensions} for extra in rows]


def judge_sub_cases(state, backend, op: str, kwargs: Mapping,
                    spec: CaseSpec | None = None) -> list[str]:
    """The sub-cases a call of ``op`` with the keyword arguments ``kwargs`` on the case ``spec``
    (its sizes; None: shape rules not judged) uses that ``backend`` does not support (its optional
    ``sub_cases``), kept in the test's record ``state`` (:class:`~.item_state.ItemState`, None
    outside a run) with the path (library or generic) of the supported ones; [] when the backend
    supports the call."""
    rules = getattr(backend, "sub_cases", None) or {}
    given = [name for name, v in kwargs.items() if v is not None and v is not False]
    sizes = None if spec is None else Sizes(spec.heads, spec.kv_heads or spec.heads, spec.len_q,
                                            spec.len_k, spec.d_k, spec.d_v)
    missing, paths = judge(rules, given, op, sizes)
    if state is not None:
        state.sub_cases_left_out.update(f"{m} ({op})" for m in missing)
        state.sub_case_paths.update(f"{c}={p}" for c, p in paths.items())
    return missing


def refuse_unsupported(state, backend, op: str, kwargs: Mapping, spec: CaseSpec) -> None:
    """Before a call of ``op`` with ``kwargs`` on the case ``spec``, in a test (``state`` not
    None): a sub-case ``backend`` states it lacks (:func:`judge_sub_cases`) is not implemented and
    the backend is not called (:func:`not_implemented_call`). Outside a test (a replay) the call
    is made."""
    missing = judge_sub_cases(state, backend, op, kwargs, spec)
    if missing and state is not None:
        not_implemented_call(missing)


def not_implemented_call(missing: list[str]) -> None:
    """Leave a call of unsupported sub-cases out: Hypothesis draws another case (the test's
    record says it was not implemented), a test that is no Hypothesis test is skipped as not
    implemented."""
    if currently_in_test_context():
        reject()
    pytest.skip(f"not implemented: {'; '.join(missing)}")


def sub_cases_left_out(state) -> list[str]:
    """The unsupported sub-cases the calls of the test ``state`` records used (sorted; [] when
    none)."""
    return sorted(state.sub_cases_left_out)


def note(state, op: str, spec: CaseSpec, **recorded: str) -> None:
    """Keep in the test's record ``state`` (:class:`~.item_state.ItemState`) that it ran ``op`` on
    the (fitted) case ``spec``, with the values of :data:`RECORDED` dimensions the case does not
    show (e.g. the invalid ``argument``)."""
    state.cases.add((op, spec, tuple(sorted(recorded.items()))))



def ran(state, clauses) -> dict[str, list[dict[str, str]]]:
    """clause -> the distinct rows over :func:`dimensions_of` the cases the test ``state``
    records ran hold."""
    cases = state.cases
    out = {}
    for clause in clauses if cases else ():
        if clause not in SPACES:
            continue
        dims = dimensions_of(clause)
        rows = {tuple(r.items()) for op, spec, rec in cases
                for r in observe(spec, op, dims, dict(rec))}
        paths = state.sub_case_paths
        out[clause] = [dict(r) for r in sorted(rows)] + [{"path": p} for p in sorted(paths)]
    return out
