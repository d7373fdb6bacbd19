"""Condition spaces: for a clause, the dimensions along which its condition arises and the values
each takes; the cases every profile draws from them; and what a run recorded as having run.

Axis legend: B batch, h heads, L_q queries, L_k keys (L_K with a cache), d_k / d_v widths.

A clause's :class:`Space` names dimensions of :data:`DIMENSIONS` (``op``, ``lengths``,
``empty_by``, ``bias``, ...). Every profile, ``ci`` included, runs every value of every dimension
and every pair of values of two dimensions (the clause's text combines each of them) in every
backend x device x dtype cell: ``op`` is the test's parameter, and :func:`cover` adds the rows of
a pairwise covering array over the other dimensions (:func:`covering_rows`) as explicit examples,
which Hypothesis runs in every phase setting (in the derandomized ``ci`` profile they count
toward the test's examples, :func:`with_budget`, so ci stays as cheap); :func:`specs` then draws
rows of the space with the rest (seed, scale of the logits, projection biases, sizes off the ci
menu) varied. A test that is no Hypothesis test (a rejection) runs :func:`row_specs`.

The cases are built so the condition holds as named (:func:`row_spec`): a row emptied by key
padding has a batch item whose keys are all padded, and so on. Nothing rewrites them into other
cases: what a backend cannot take (a capability it does not claim) is dropped by
``harness.fit`` and recorded as what actually ran, and :func:`uncovered` reports the combinations
that needed it as not implemented. What ran is read back from the cases themselves
(:func:`observe`), not from what was asked for: the harness notes every case it runs on the test
item (:func:`note`) and the plugin writes :func:`ran` into each result.

Why the spaces are what they are (every testable clause declares one; tests/test_conditions.py
fails on a clause without): every clause that computes attention runs every ordering of L_q and
L_k -- decoding (L_q = 1 < L_k, the commonest call; alignments differ most there), L_q < L_k,
prefill (L_q = L_k), L_q > L_k (bottom-right empties rows) -- in each operation its tests run.
Beyond that, each clause adds the dimensions where its bugs live:

* MASK-6 / MASK-7: the ordering alone; MASK-8: + causal alignment x bias; MASK-11 and LSE-1: +
  rows left empty or not; MASK-13: + the non-finite value behind the mask.
* MASK-9: a row's allowed set empties by a boolean mask, bottom-right causal (L_q > L_k), key
  padding (a batch item padded throughout), a window (L_q > L_k), segment ids, sequence lengths,
  or a -inf bias; each with and without a finite bias (libraries that merge the masks into the
  bias with a finite fill give the mean of V only when a bias is present), in each operation and
  ordering of the lengths that lets it empty a row. Top-left causal never empties a row (key 0
  stays allowed); L_k = 0 empties every row and is SHAPE-4's: B, L_q, L_k and B with L_k set to 0.
* SHAPE-5: each degenerate size (L_k = 1, L_q = 1, h = 1, h = d_model); HEAD-1/2: h and d_k of 1
  and more; MHA-3: one array for all three inputs, key = value (any ordering), query = key.
* GQA-1: g = h, 1 < g < h (h = 4, g = 2: consecutive heads share, not i % g) and g = 1 (MQA).
* SOFTCAP-1: the masking under the cap (none, a mask, an emptied row) x the cap's size (tiny:
  masks decide alone; beyond float16's range).
* WIN-1: window sides ((1, 0), (0, 2), (3, 1), (None, 0), (2, None), (None, 1)) x alignment x
  ordering x with and without a causal mask on the same diagonal; ALIBI-1: alignment x ordering x
  slopes (h,) or (B, h) x with and without causal, 3-way (spec 1.4); ALIBI-2: alignment x ordering; SEG-1 / SEG-2: each kind of segment ids / sequence lengths.
* CACHE-1 / CACHE-2: a full and a partly valid cache in every ordering of L_q and L_K; CACHE-3:
  one, two and three tokens per call.
* ERR-2..10: each invalid argument of the catalogue (test_errors.BAD_INPUTS) in each operation;
  the rejection clauses of spec 1.2 (GQA-2, SOFTCAP-2, WIN-2, ALIBI-3, SEG-5, CACHE-4) reject on
  the sizes of every ordering.
* NUM-2: decoding and L_q < L_k with long dot products (its float32 test draws 32 keys).
* PARAM-1 and MHA-1..4: + per-head widths d_k = d_v = 1 or wider x
  projection biases or none (a bias added on the wrong axes shows only at width 1 with biases).
"""

from __future__ import annotations

import functools
import itertools
from typing import Callable, Mapping, NamedTuple

import numpy as np
import pytest
from hypothesis import currently_in_test_context, example, reject, settings, strategies as st

from mhaspec.backends.sub_cases import judge
from mhaspec.spec import oracle

from . import extremes, features
from .item_state import shape_menu
from .strategies import CI_SHAPES, CaseSpec, Shapes, build_case
from .strategies import LENGTHS as SIZES  # the length menu; LENGTHS below is a space's dimensions

#: L_q vs L_k: decoding (L_q = 1 < L_k), L_q < L_k (L_q > 1), prefill (L_q = L_k), L_q > L_k
LENGTH_ORDERS = ("decode", "L_q<L_k", "L_q=L_k", "L_q>L_k")
#: the ways a query row's allowed set becomes empty (MASK-9)
EMPTY_BY = ("mask", "causal_bottom_right", "key_padding", "window", "segments", "seq_lengths",
            "minus_inf_bias")
#: SHAPE-5's degenerate sizes: name -> the sizes it sets
DEGENERATE = {
    "L_k = 1": dict(len_k=1),
    "L_q = 1": dict(len_q=1),
    "h = 1": dict(heads=1),
    "h = d_model": dict(heads=4, d_k=1, d_v=1, d_model=4, k_dim=4, v_dim=4, d_out=4),
}
#: soft caps by size: squeezing every logit, moderate, beyond float16's range (65504)
CAPS = {"tiny": 1e-3, "moderate": 5.0, "huge": 1e6}
#: window sides (left, right) that reach the bugs: one side each, both, an unbounded side
WINDOWS = {"(1, 0)": (1, 0), "(0, 2)": (0, 2), "(3, 1)": (3, 1), "(None, 0)": (None, 0),
           # spec 1.4: the other unbounded side, and an unbounded left with a bounded right > 0
           "(2, None)": (2, None), "(None, 1)": (None, 1)}
#: ALiBi slopes by shape (ALIBI-1): one per head, one per (batch item, head) -> the case's kind
SLOPES = {"(h,)": "geometric", "(B, h)": "per_batch"}

#: the axes of (B, h, L_q, L_k) a bias broadcasts over (size 1 or absent), by name: "none" is the
#: full shape; the last drops the leading axes (a bias of shape (1, L_k))
BIAS_BROADCASTS = ("none", "batch", "heads", "queries", "batch+heads", "batch+heads+queries")


def bias_shape_of(broadcast: str, full: tuple[int, int, int, int]) -> tuple[int, ...]:
    """The bias shape of :data:`BIAS_BROADCASTS` value ``broadcast`` for ``full`` (B, h, L_q, L_k)."""
    axes = set(broadcast.split("+")) - {"none"}
    shape = tuple(1 if name in axes else n
                  for name, n in zip(("batch", "heads", "queries"), full[:3])) + (full[3],)
    return shape[2:] if broadcast == "batch+heads+queries" else shape


def bias_broadcast_of(bias_shape, full: tuple[int, int, int, int]) -> str:
    """The :data:`BIAS_BROADCASTS` value of ``bias_shape`` on ``full`` ("other" when none fits;
    an axis of size 1 in ``full`` counts as not broadcast)."""
    padded = (1,) * (4 - len(bias_shape)) + tuple(bias_shape)
    axes = [name for name, n, f in zip(("batch", "heads", "queries"), padded, full) if n == 1 != f]
    name = "+".join(axes) or "none"
    return name if name in BIAS_BROADCASTS else "other"


#: dimension -> its values (a space may narrow them, :attr:`Space.values`)
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "op": ("sdpa", "mha"),
    "lengths": LENGTH_ORDERS,
    "empty_by": EMPTY_BY,
    "bias": ("none", "finite"),
    "alignment": ("top_left", "bottom_right"),
    "past": ("all_valid", "per_item_lengths"),
    "causal": ("top_left", "bottom_right"),
    "zero": ("batch", "len_q", "len_k", "batch+len_k"),  # the sizes that are 0 (SHAPE-4)
    "degenerate": tuple(DEGENERATE),
    "heads": ("1", ">1"),
    "width": ("1", ">1"),  # d_k
    "group": ("g=h", "1<g<h", "g=1"),  # key/value heads g of h query heads
    "empty_rows": ("none", "some"),
    "masked_by": ("none", "mask", "empty_row"),
    "cap": tuple(CAPS),
    "window": tuple(WINDOWS),
    "segments": ("one", "per_token", "packed", "scattered"),
    "seq_lengths": ("query", "key_value", "both"),
    "nonfinite": ("-inf", "inf", "nan"),
    "shared": ("self", "key=value", "query=key"),
    "step": ("1", "2", "3"),  # tokens per call when decoding through a cache (CACHE-3)
    "argument": (),  # the invalid argument (ERR): each clause's own values
    "bias_broadcast": BIAS_BROADCASTS,  # the axes a bias broadcasts over (GRAD-9, spec 1.4)
    "slopes": tuple(SLOPES),  # the shape of the ALiBi slopes (ALIBI-1, spec 1.4)
    "with_causal": ("no", "yes"),  # a causal mask on the feature's own diagonal (spec 1.4)
}
#: dimensions a case does not show: the test records them with the case (harness.note)
RECORDED = ("step", "argument")

#: (dimension, value) -> the capability a case with it needs (others: the clause's own)
NEEDS = {("op", "sdpa"): "sdpa", ("op", "mha"): "mha", ("op", "heads"): "heads",
         ("op", "vjp"): "grad", ("op", "attention_vjp"): "attention_vjp",
         ("empty_by", "mask"): "masks", ("empty_by", "key_padding"): "masks",
         ("empty_by", "causal_bottom_right"): "causal", ("empty_by", "window"): "window",
         ("empty_by", "segments"): "segments", ("empty_by", "seq_lengths"): "segments",
         ("empty_by", "minus_inf_bias"): "bias", ("bias", "finite"): "bias",
         ("masked_by", "mask"): "masks", ("masked_by", "empty_row"): "masks",
         ("group", "1<g<h"): "gqa", ("group", "g=1"): "gqa"}


def _empties_a_row(row: Mapping[str, str]) -> bool:
    """A causal mask or a window alone empties rows only when L_q > L_k; a -inf bias is a bias."""
    if row.get("empty_by") in ("causal_bottom_right", "window") and row.get("lengths") != "L_q>L_k":
        return False
    return not (row.get("empty_by") == "minus_inf_bias" and row.get("bias") == "none")


def _always(row: Mapping[str, str]) -> bool:
    return True


def _same(shape):
    return shape


class Space(NamedTuple):
    """A clause's condition space: its dimensions (``op`` first when the test is parametrized by
    operation), the fixed fields its cases carry (e.g. the causal alignment of MASK-6; a
    function of the shape where they depend on it), which full rows are possible, the
    operations its tests run, values narrowed for this clause, what a case's shape must be made
    to fit the test (e.g. batch > 1), and the test arguments a value sets (dimension ->
    value -> keyword arguments of the test's example)."""

    dimensions: tuple[str, ...]
    fixed: Mapping[str, object] | Callable = {}
    possible: Callable[[Mapping[str, str]], bool] = _always
    ops: tuple[str, ...] = ("sdpa", "mha")
    values: Mapping[str, tuple[str, ...]] = {}
    shape: Callable = _same
    arguments: Mapping[str, Callable[[str], dict]] = {}
    strength: int = 2  # the covering rows hold every combination of this many values (2 or 3)


def values_of(space: Space, dimension: str) -> tuple[str, ...]:
    """The values ``dimension`` takes in ``space``."""
    if dimension == "op":
        return space.ops
    return space.values.get(dimension, DIMENSIONS[dimension])


def _full(shape) -> tuple[int, int, int, int]:
    return (shape.batch, shape.heads, shape.len_q, shape.len_k)


def _orders(*orders: str) -> Callable[[Mapping[str, str]], bool]:
    """Rows whose ``lengths`` is one of ``orders``."""
    return lambda row: row.get("lengths", orders[0]) in orders


def _shape4_possible(row: Mapping[str, str]) -> bool:
    """L_q = 0 leaves L_q < L_k; L_k = 0 leaves L_q > L_k; B = 0 keeps any ordering."""
    want = {"len_q": "L_q<L_k", "len_k": "L_q>L_k", "batch+len_k": "L_q>L_k"}.get(row["zero"])
    return want is None or row["lengths"] == want


def _mha3_possible(row: Mapping[str, str]) -> bool:
    """One array for all three inputs or for query and key: L_q = L_k."""
    return row["shared"] == "key=value" or row["lengths"] == "L_q=L_k"


#: ERR clause -> op -> the arguments its invalid calls name (test_errors.BAD_INPUTS; a test
#: checks the two agree)
ERROR_ARGUMENTS: dict[str, dict[str, tuple[str, ...]]] = {
    "ERR-2": {"mha": ("num_heads",)},
    "ERR-3": {"sdpa": ("q", "v"), "mha": ("query", "key")},
    "ERR-4": {"sdpa": ("k", "v"), "mha": ("key",)},
    "ERR-5": {"sdpa": ("v",), "mha": ("value",)},
    "ERR-6": {"sdpa": ("k",), "mha": ("w_q", "w_k", "w_o", "b_o")},
    "ERR-7": {"sdpa": ("mask", "bias", "legacy_mask", "key_padding_mask", "causal"),
              "mha": ("mask", "bias", "legacy_mask", "causal")},
    "ERR-8": {"sdpa": ("q", "k"), "mha": ("value", "w_o")},
    "ERR-9": {"sdpa": ("legacy_mask",), "mha": ("legacy_mask",)},
    "ERR-10": {"sdpa": ("scale",), "mha": ("scale",)},
}


def _error_space(clause: str) -> Space:
    """An ERR clause: each invalid argument of its catalogue, in each operation it names."""
    by_op = ERROR_ARGUMENTS[clause]
    values = tuple(dict.fromkeys(a for args in by_op.values() for a in args))
    return Space(("op", "argument"), ops=tuple(by_op), values={"argument": values},
                 possible=lambda r: r["argument"] in by_op.get(r.get("op"), values))


def _mask(shape) -> dict:
    return {"mask_shape": _full(shape)}


OPS_SDPA, OPS_MHA = ("sdpa",), ("mha",)
LENGTHS = ("op", "lengths")

SPACES: dict[str, Space] = {
    "SHAPE-1": Space(LENGTHS, ops=OPS_MHA),
    "SHAPE-2": Space(LENGTHS),
    "SHAPE-3": Space(LENGTHS, ops=OPS_SDPA),
    "SHAPE-4": Space(("op", "zero", "lengths"), possible=_shape4_possible,
                     arguments={"zero": lambda v: {"empty": v}}),
    "SHAPE-5": Space(("op", "degenerate"), arguments={"degenerate": lambda v: {"which": v}}),
    "PARAM-1": Space(LENGTHS, ops=OPS_MHA),
    "PARAM-2": Space(LENGTHS, ops=OPS_MHA, shape=lambda s: s._replace(heads=max(2, s.heads))),
    "HEAD-1": Space(("heads", "width"), ops=()),
    "HEAD-2": Space(("heads", "width"), ops=()),
    "SDPA-1": Space(LENGTHS, ops=OPS_SDPA),
    "SDPA-2": Space(LENGTHS, {"scale": 0.5}, ops=OPS_SDPA),
    "SDPA-3": Space(LENGTHS, ops=OPS_SDPA,
                    shape=lambda s: s if s.d_v != s.d_k else s._replace(d_v=2 * s.d_k)),
    "SDPA-4": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True}, ops=OPS_SDPA),
    "SDPA-5": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True}, ops=OPS_SDPA),
    "SDPA-6": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True}, ops=OPS_SDPA),
    "SDPA-7": Space(LENGTHS, {"key_padding": True}, ops=OPS_SDPA,
                    shape=lambda s: s._replace(batch=max(2, s.batch))),
    "MASK-1": Space(LENGTHS, _mask),
    "MASK-2": Space(LENGTHS, lambda s: {"bias_shape": _full(s)}),
    "MASK-3": Space(LENGTHS, lambda s: {"legacy_shape": _full(s)}),
    "MASK-5": Space(LENGTHS, {"key_padding": True}),
    "MASK-6": Space(LENGTHS, {"causal": "top_left"}),
    "MASK-7": Space(LENGTHS, {"causal": "bottom_right"}),
    "MASK-8": Space(("op", "lengths", "causal", "bias"), {"key_padding": True}),
    "MASK-9": Space(("op", "empty_by", "bias", "lengths"), {}, _empties_a_row),
    "MASK-10": Space(LENGTHS, {"key_padding": True, "causal": "top_left"}),
    "MASK-11": Space(("op", "lengths", "empty_rows"), _mask),
    "MASK-12": Space(LENGTHS, {"key_padding": True}),
    "MASK-13": Space(("op", "lengths", "nonfinite"), {"key_padding": True},
                     arguments={"nonfinite": lambda v: {"value": v}}),
    "MHA-1": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True}, ops=OPS_MHA),
    "MHA-2": Space(LENGTHS, _mask, _orders("decode", "L_q<L_k", "L_q>L_k"), ops=OPS_MHA,
                   shape=lambda s: s._replace(heads=max(2, s.heads))),
    "MHA-3": Space(("op", "lengths", "shared"), {}, _mha3_possible, ops=OPS_MHA,
                   arguments={"shared": lambda v: {} if v == "self" else {"which": v}}),
    "MHA-4": Space(LENGTHS, ops=OPS_MHA, shape=lambda s: s if len({s.d_model, s.k_dim, s.v_dim}) > 1
                   else s._replace(k_dim=max(1, s.d_model // 2))),
    "MHA-5": Space(("op",), ops=OPS_MHA),  # the source document's one example (32, 50, 512)
    "MHA-6": Space(LENGTHS, ops=OPS_MHA),
    "ERR-1": Space(("op",)),
    **{clause: _error_space(clause) for clause in ERROR_ARGUMENTS},
    "NUM-1": Space(LENGTHS),
    # long dot products (float32) and d_k = 8 (float64): queries against more keys
    "NUM-2": Space(("lengths",), {}, _orders("decode", "L_q<L_k"), ops=(),
                   shape=lambda s: s._replace(d_k=8)),
    "NUM-3": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True, "causal": "top_left"}),
    "NUM-4": Space(LENGTHS, _mask),
    "NUM-5": Space(LENGTHS, {"key_padding": True}),
    "NUM-6": Space(LENGTHS),
    "GRAD-1": Space(LENGTHS, ops=OPS_MHA),
    "GRAD-2": Space(LENGTHS, lambda s: {**_mask(s), "fully_masked_rows": True}, ops=OPS_MHA),
    "INPUT-1": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True},
                     ops=("heads", "sdpa", "mha", "vjp", "attention_vjp")),
    "GQA-1": Space(("op", "lengths", "group"), {"key_padding": True}, ops=OPS_SDPA),
    "GQA-2": Space(LENGTHS, ops=OPS_SDPA),
    "SOFTCAP-1": Space(("op", "lengths", "masked_by", "cap")),
    "SOFTCAP-2": Space(LENGTHS),
    # spec 1.4: + with and without a causal mask on the window's diagonal, and both unbounded sides
    "WIN-1": Space(("op", "lengths", "alignment", "window", "with_causal")),
    "WIN-2": Space(LENGTHS),
    # spec 1.4: + the slopes' shape (B > 1: item 0's slopes are not every item's) and with and
    # without a causal mask (future keys penalised by |i - j| only without one); small: 3-way
    "ALIBI-1": Space(("op", "lengths", "alignment", "slopes", "with_causal"), strength=3,
                     shape=lambda s: s._replace(batch=max(2, s.batch))),
    "ALIBI-2": Space(("op", "lengths", "alignment"), lambda s: {"alibi": "geometric",
                                                               "bias_shape": _full(s)}),
    "ALIBI-3": Space(LENGTHS),
    "SEG-1": Space(("op", "lengths", "segments")),
    "SEG-2": Space(("op", "lengths", "seq_lengths")),
    "SEG-3": Space(LENGTHS, {"segments": "packed", "causal": "bottom_right"}),
    "SEG-4": Space(LENGTHS, {"segments": "packed"}, ops=OPS_SDPA),
    "SEG-5": Space(LENGTHS),
    "CACHE-1": Space(("op", "lengths", "past"), {"past_len": 3}),
    "CACHE-2": Space(("op", "lengths", "past"), {"past_len": 3, "causal": "bottom_right"}),
    "CACHE-3": Space(("op", "step"), {"causal": "bottom_right", "self_attention": True},
                     arguments={"step": lambda v: {"step": int(v)}}),
    "CACHE-4": Space(LENGTHS),
    "LSE-1": Space(("op", "lengths", "empty_rows"), lambda s: {**_mask(s), "lse": True}),
    "LSE-2": Space(LENGTHS, {"lse": True, "key_padding": True}, ops=OPS_SDPA,
                   arguments={}),
}

# -- spec 1.3 (training and sinks) ----------------------------------------------------------------
# attention_vjp and sinks are scaled dot-product attention's (no ``op`` parameter: sdpa only). Each
# clause's space is that of the 1.2 clause whose feature it differentiates: GRAD-3 the masked call
# (SDPA-4's), GRAD-4 the group sizes (GQA-1's), GRAD-5 what a soft-cap meets (SOFTCAP-1's), GRAD-6
# the window's sides in each alignment (WIN-1's), GRAD-8 rows emptied or not under an lse
# cotangent (LSE-1's), GRAD-9 a bias of each broadcast shape (spec 1.4: over batch, heads and
# queries, each and together, on B, h, L_q > 1, so d_bias must be a sum over those axes); SINK-1 and SINK-3 each ordering of the
# lengths x each group size (spec 1.4: a sink is the query head's, so grouped heads meet
# distinct non-zero sinks: the covering rows run sink scale 1), SINK-4 each invalid ``sinks``.
SPACES.update({
    "GRAD-3": Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True}, ops=OPS_SDPA),
    "GRAD-4": Space(("op", "lengths", "group"), {"key_padding": True}, ops=OPS_SDPA),
    "GRAD-5": Space(("op", "lengths", "masked_by", "cap"), ops=OPS_SDPA),
    "GRAD-6": Space(("op", "lengths", "alignment", "window"), ops=OPS_SDPA),
    "GRAD-8": Space(("op", "lengths", "empty_rows"), lambda s: {**_mask(s), "lse": True},
                    ops=OPS_SDPA),
    "GRAD-9": Space(("op", "lengths", "bias_broadcast"), ops=OPS_SDPA,
                    possible=lambda r: "queries" not in r["bias_broadcast"]
                    or r["lengths"] != "decode",  # one query: nothing to broadcast over
                    shape=lambda s: s._replace(batch=max(2, s.batch), heads=max(2, s.heads))),
    "SINK-1": Space(("op", "lengths", "group"), {"lse": True}, ops=OPS_SDPA),
    "SINK-3": Space(("op", "lengths", "group"), ops=OPS_SDPA),
    "SINK-4": Space(LENGTHS, ops=OPS_SDPA),
})
# the condition spaces of GRAD-7 and SINK-2
# GRAD-7: the exact zeros arise where a query row or a key loses every partner, in each of the
# ways MASK-9 names (the zeros of dk/dv follow from the same emptied rows and columns), with and
# without a finite bias, in each ordering of the lengths that lets it happen. SINK-2: a sink makes
# those same rows non-empty in the denominator (lse = the sink), so its space is MASK-9's too.
# Both tests run scaled dot-product attention only (the operation has no ``op`` parameter).
SPACES.update({
    "GRAD-7": Space(("empty_by", "bias", "lengths"), {}, _empties_a_row),
    "SINK-2": Space(("empty_by", "lengths"), {}, _empties_a_row),
})
# -- end of spec 1.3's spaces ----------------------------------------------------------------
# -- per-head widths of 1 with projection biases (PARAM-1 and the MHA chapter) ---------------------
# A projection's bias is added along the head and width axes of its (h, d) output; with d_k = d_v
# = 1 a library that drops or transposes the width axis adds it wrongly while every wider case
# passes, and with no biases nothing shows. So the cases of PARAM-1 and MHA-1..4 cover both
# widths, both with and without biases, and the pair (MHA-5 is one fixed example; MHA-6's grouped
# heads run the sizes of its rows only, conformance/test_gqa.py).
DIMENSIONS.update({"head_widths": ("d_k=d_v=1", "wider"), "projection_bias": ("none", "with")})
for _clause in ("PARAM-1", "MHA-1", "MHA-2", "MHA-3", "MHA-4"):
    SPACES[_clause] = SPACES[_clause]._replace(
        dimensions=SPACES[_clause].dimensions + ("head_widths", "projection_bias"))
# -- end of the width and bias dimensions ------------------------------------------------------

# -- spec 1.4 (the serving step): MERGE --------------------------------------------------------------
# A merge's conditions are not in the attention case but in how its keys are split into states:
# how many states (one, two, several), which of them are empty (the first, the last, every one:
# MERGE-2's "either side and both"), the declared conventions of MERGE-3 and a sink (MERGE-4).
# The test records them with the case (RECORDED). States are over scaled dot-product attention.
DIMENSIONS.update({
    "states": ("1", "2", "4"),
    "empty_state": ("none", "first", "last", "all"),
    "lse_base": ("e", "2"),
    "empty_lse": ("-inf", "+inf"),
    "lse_layout": ("batch", "tokens"),
    "sink": ("none", "sink"),
})
RECORDED = (*RECORDED, "states", "empty_state", "lse_base", "empty_lse", "lse_layout", "sink")

#: the test arguments of the merge dimensions (MERGE-1..4)
MERGE_ARGUMENTS: dict[str, Callable[[str], dict]] = {
    "states": lambda v: {"states": int(v)},
    "empty_state": lambda v: {"empty": v},
    "lse_base": lambda v: {"lse_base": v},
    "empty_lse": lambda v: {"empty_lse": v},
    "lse_layout": lambda v: {"lse_layout": v},
    "sink": lambda v: {"sink": v == "sink"},
}


def _merge_space(*dimensions: str, **narrowed: tuple[str, ...]) -> Space:
    return Space(("op", "lengths", *dimensions), {"key_padding": True}, ops=OPS_SDPA,
                 values=narrowed, arguments={d: MERGE_ARGUMENTS[d] for d in dimensions})


SPACES.update({
    "MERGE-1": _merge_space("states", "empty_state", "sink"),
    "MERGE-2": _merge_space("states", "empty_state", "empty_lse", states=("2", "4")),
    "MERGE-3": _merge_space("lse_base", "empty_lse", "lse_layout", "empty_state"),
    "MERGE-4": _merge_space("states", "empty_state", "lse_base"),
    # the cached prefix is the first L_k - L_q keys: at least one (decoding, L_q < L_k)
    "MERGE-5": Space(LENGTHS, ops=OPS_SDPA, values={"lengths": ("decode", "L_q<L_k")},
                     shape=lambda s: s._replace(len_k=max(s.len_k, s.len_q + 1))),
    "MERGE-6": Space(LENGTHS, ops=OPS_SDPA),
})
# PAGE: the page size (the backend's page_size_unit u, 1 by default; 2u dividing every item's
# length; 3u dividing none), the pages' order in the table (in order, shuffled, a first page shared
# by every item), what the slots no item's length reaches hold (zeros, stale keys, NaN and inf),
# causal or not.
DIMENSIONS.update({
    "page_size": ("1", "divides", "does_not_divide"),
    "pages": ("in_order", "shuffled", "shared"),
    "unused": ("zero", "stale", "nonfinite"),
    "paged_causal": ("no", "yes"),
})
RECORDED = (*RECORDED, "page_size", "pages", "unused", "paged_causal")
PAGE_ARGUMENTS: dict[str, Callable[[str], dict]] = {
    "page_size": lambda v: {"page_size": v},
    "pages": lambda v: {"pages": v},
    "unused": lambda v: {"unused": v},
    "paged_causal": lambda v: {"causal": v == "yes"},
}


def _page_space(*dimensions: str) -> Space:
    return Space(("op", *dimensions), ops=OPS_SDPA,
                 arguments={d: PAGE_ARGUMENTS[d] for d in dimensions})


SPACES.update({
    "PAGE-1": _page_space("page_size", "paged_causal"),
    "PAGE-2": _page_space("pages", "unused", "page_size"),
    "PAGE-3": _page_space("page_size", "unused"),
    "PAGE-4": Space(("op",), ops=OPS_SDPA),
})
# -- end of spec 1.4's spaces ----------------------------------------------------------------

# -- spec 1.4: GRAD-10 the lengths (its dtypes are the cells), GRAD-11 rows emptied or not under an
# lse cotangent (GRAD-8's)
SPACES.update({
    "GRAD-10": Space(LENGTHS, ops=OPS_SDPA),
    "GRAD-11": Space(("op", "lengths", "empty_rows"), lambda s: {**_mask(s), "lse": True},
                     ops=OPS_SDPA),
})
# spec 1.4: DET-1 (determinism) in each operation it names, each ordering of the lengths
SPACES["DET-1"] = Space(LENGTHS, lambda s: {**_mask(s), "key_padding": True},
                        ops=("sdpa", "mha", "attention_vjp", "vjp"))


def fixed_fields(space: Space, shape) -> dict:
    """The fixed CaseSpec fields of ``space``'s cases on ``shape``."""
    return dict(space.fixed(shape) if callable(space.fixed) else space.fixed)


def _rows(space: Space, dims: tuple[str, ...]) -> list[dict[str, str]]:
    """Every possible full row over ``dims`` (product of values, filtered)."""
    rows = [dict(zip(dims, values))
            for values in itertools.product(*(values_of(space, d) for d in dims))]
    return [r for r in rows if space.possible(r)]


def pairs(row: Mapping[str, str], strength: int = 2) -> set[tuple]:
    """The single values and the pairs of values one row covers, as sorted item tuples (with
    ``strength`` 3 also its triples)."""
    items = sorted(row.items())
    return {c for n in range(1, strength + 1) for c in itertools.combinations(items, n)}


@functools.lru_cache(maxsize=None)
def covering_rows(clause: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """A pairwise covering array over the clause's dimensions other than ``op`` (3-way where its
    space says ``strength=3``): rows (as item tuples) that together hold every value and every
    possible pair (triple) of values. Greedy and
    deterministic: each next row is the possible row covering most pairs still missing (first in
    product order on ties)."""
    space = SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    candidates = _rows(space, dims)
    ways = functools.partial(pairs, strength=space.strength)
    missing = set().union(*(ways(r) for r in candidates))
    chosen = []
    while missing:
        best = max(candidates, key=lambda r: len(ways(r) & missing))
        chosen.append(tuple(best.items()))
        missing -= ways(best)
    return tuple(chosen)


# -- building the case of a row --------------------------------------------------------------------

def order_of(len_q: int, len_k: int) -> str:
    """The value of ``lengths`` for these lengths."""
    if len_q == 1 and len_k > 1:
        return "decode"
    return "L_q<L_k" if len_q < len_k else "L_q=L_k" if len_q == len_k else "L_q>L_k"


def _past(space: Space) -> int:
    """L_past of the space's cases (0: no cache)."""
    return 0 if callable(space.fixed) else space.fixed.get("past_len") or 0


def _shape_for(order: str, draw=None, past: int = 0):
    """Sizes for ``order`` of L_q vs L_K = ``past`` + L_k: the first ci shape of that order
    (drawn from them and, off the menu, from the free sizes when ``draw`` is given)."""
    menu = [s for s in CI_SHAPES if order_of(s.len_q, s.len_k + past) == order and
            s.len_k + past > 1]
    if draw is None:
        return menu[0]
    if shape_menu() is not None:
        return draw(st.sampled_from(menu))
    lq, lk = draw(st.sampled_from([(a, b) for a in SIZES for b in SIZES
                                   if b + past > 1 and order_of(a, b + past) == order]))
    return draw(st.sampled_from(menu))._replace(len_q=lq, len_k=lk)


def _fields(row: Mapping[str, str], shape) -> dict:
    """The CaseSpec fields that make ``row`` hold on ``shape`` (before a seed is chosen)."""
    b, h, lq, lk = shape.batch, shape.heads, shape.len_q, shape.len_k
    full = (b, h, lq, lk)
    kw: dict = {}
    if row.get("bias") == "finite" or row.get("empty_by") == "minus_inf_bias":
        kw["bias_shape"] = full
    if "alignment" in row:
        kw["alignment"] = row["alignment"]
    if "causal" in row:  # with a boolean mask and key padding (MASK-8's combination)
        kw.update(causal=row["causal"], mask_shape=full)
    if "past" in row:
        kw["past_valid"] = row["past"] == "per_item_lengths"
    way = row.get("empty_by")
    if way == "mask":
        kw.update(mask_shape=full, fully_masked_rows=True)
    elif way == "causal_bottom_right":
        kw["causal"] = "bottom_right"
    elif way == "key_padding":
        kw.update(key_padding=True, fully_masked_rows=True)
    elif way == "window":
        kw.update(window=(0, 0), alignment="top_left")
    elif way == "segments":
        kw["segments"] = "per_token" if lq > lk else "scattered"
    elif way == "seq_lengths":
        kw["seq_lengths"] = "both"
    elif way == "minus_inf_bias":
        kw["extreme"] = extremes.BLOCKED_BIAS_ROWS
    kw.update(_feature_fields(row, shape))
    return kw


def _feature_fields(row: Mapping[str, str], shape) -> dict:
    """The fields of the dimensions beyond masking (sizes, groups, soft-cap, window, ...)."""
    full = _full(shape)
    kw: dict = {}
    zero = row.get("zero")
    if zero is not None:
        kw.update({name: 0 for name in zero.split("+")})
    if "degenerate" in row:
        kw.update(DEGENERATE[row["degenerate"]])
    if "heads" in row:
        kw["heads"] = 1 if row["heads"] == "1" else max(2, shape.heads)
    if "width" in row:
        kw["d_k"] = 1 if row["width"] == "1" else max(2, shape.d_k)
    if "head_widths" in row:
        one = row["head_widths"] == "d_k=d_v=1"
        kw.update(d_k=1 if one else max(2, shape.d_k), d_v=1 if one else max(2, shape.d_v))
    if "projection_bias" in row:
        kw["use_bias"] = row["projection_bias"] == "with"
    group = row.get("group")
    if group == "1<g<h":
        kw.update(heads=4, kv_heads=2)
    elif group is not None:
        heads = max(2, shape.heads)
        kw.update(heads=heads, kv_heads=heads if group == "g=h" else 1)
    if row.get("empty_rows") == "some":
        kw.update(mask_shape=full, fully_masked_rows=True)
    masked = row.get("masked_by")
    if masked == "mask":
        kw["mask_shape"] = full
    elif masked == "empty_row":
        kw.update(mask_shape=full, fully_masked_rows=True)
    if "cap" in row:
        kw["softcap"] = CAPS[row["cap"]]
    if "bias_broadcast" in row:
        kw["bias_shape"] = bias_shape_of(row["bias_broadcast"], full)
    if "window" in row:
        kw.update(window=WINDOWS[row["window"]], alignment=row.get("alignment", "bottom_right"))
    if "slopes" in row:
        kw.update(alibi=SLOPES[row["slopes"]], alignment=row.get("alignment", "bottom_right"))
    if row.get("with_causal") == "yes":
        kw["causal"] = row.get("alignment", "bottom_right")
    if "segments" in row:
        kw["segments"] = row["segments"]
    if "seq_lengths" in row:
        kw["seq_lengths"] = row["seq_lengths"]
    if "nonfinite" in row:
        kw["extreme"] = extremes.masked_key(row["nonfinite"])
    shared = row.get("shared")
    if shared == "self":
        kw["self_attention"] = True
    elif shared is not None:
        kw["extreme"] = extremes.shared(shared)
    if "group" in row or "heads" in row:  # mask shapes over the heads drawn here
        kw.update({f: (*v[:1], kw.get("heads", shape.heads), *v[2:]) for f, v in
                   kw.items() if f in ("mask_shape", "bias_shape") and v is not None})
    return kw


#: seeds tried, from the drawn one on, for a case whose condition depends on random arrays
SEED_TRIES = 64


def row_spec(clause: str, row: Mapping[str, str], *, shape=None, seed: int = 0,
             **rest) -> CaseSpec:
    """The case of ``row`` of ``clause``'s space: the clause's fixed fields, the fields the row's
    values need, ``shape`` (default: the ci shape of its ``lengths``), ``rest`` (other CaseSpec
    fields), and the first seed from ``seed`` on for which :func:`observe` finds the row (cases
    whose condition depends on random arrays, e.g. segment ids that leave a query alone).
    Raises ValueError when none of :data:`SEED_TRIES` seeds does (a declaration no case meets)."""
    space = SPACES[clause]
    shape = space.shape(shape or _shape_for(row.get("lengths", "L_q=L_k"), past=_past(space)))
    base = CaseSpec(**{**shape._asdict(), "self_attention": False, **fixed_fields(space, shape),
                       **rest, **_fields(row, shape)})
    if base.self_attention:  # one array for query, key and value: its widths
        width = base.heads * base.d_k
        base = base._replace(d_v=base.d_k, d_model=width, k_dim=width, v_dim=width)
    want = {k: v for k, v in row.items() if k != "op" and k not in RECORDED}
    for s in range(seed, seed + SEED_TRIES):
        spec = base._replace(seed=s)
        if any(_matches(seen, want) for seen in observe(spec, "sdpa", space.dimensions)):
            return spec
    raise ValueError(f"{clause}: no case of row {want} on {shape} within {SEED_TRIES} seeds")


def _matches(seen: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(seen.get(k) == v for k, v in want.items())


def cover(clause: str, only: Callable[[Mapping[str, str]], bool] = _always, **arguments):
    """Decorator: the rows of :func:`covering_rows` (those ``only`` keeps: a clause two tests
    share) as explicit examples ``spec=...`` of a ``@given`` test (put it above ``@given``);
    ``arguments``: the test's other arguments, as each example passes them (a row's value of a
    dimension the test takes as an argument overrides them, :attr:`Space.arguments`)."""
    space = SPACES[clause]

    def decorate(test):
        rows = [dict(row) for row in covering_rows(clause) if only(dict(row))]
        for i, row in enumerate(rows):
            extra = dict(arguments)
            for d, to_args in space.arguments.items():
                extra.update(to_args(row[d]))
            test = example(spec=row_spec(clause, row, seed=1000 * i), **extra)(test)
        return with_budget(test, len(rows))
    return decorate


#: the fewest cases Hypothesis draws beside a test's covering rows in a derandomized profile
MIN_DRAWN = 2


def with_budget(test, rows: int):
    """``test`` with its covering ``rows`` counted toward the examples of a derandomized profile
    (``ci``, ``triage``: the covering rows choose cases there): Hypothesis draws the profile's
    ``max_examples`` minus the rows, at least :data:`MIN_DRAWN`. Random profiles (``certify``,
    ``dev``) draw their full number beside the rows. The profile is the one loaded when the test
    module is imported (the plugin loads it before collection)."""
    profile = settings.default
    if not profile.derandomize or not rows:
        return test
    return settings(profile, max_examples=max(MIN_DRAWN, profile.max_examples - rows))(test)


def row_specs(clause: str, spec: CaseSpec, keep: tuple[str, ...] = ()) -> list[CaseSpec]:
    """``spec`` on the sizes of each covering row of ``clause`` but those named in ``keep`` (a
    test that is no Hypothesis test, e.g. a rejection, runs each in every operation it runs)."""
    rows = [row_spec(clause, dict(row)) for row in covering_rows(clause)]
    return [spec._replace(**{f: getattr(r, f) for f in Shapes._fields if f not in keep},
                          self_attention=False) for r in rows]


@st.composite
def specs(draw, clause: str) -> CaseSpec:
    """A case of a possible row of ``clause``'s space, drawn with the rest varied: the seed, the
    scale of the logits, projection biases, and (off the ci menu) the sizes."""
    space = SPACES[clause]
    dims = tuple(d for d in space.dimensions if d != "op")
    row = draw(st.sampled_from(_rows(space, dims)))
    shape = _shape_for(row.get("lengths", "L_q=L_k"), draw, _past(space))
    try:
        return row_spec(clause, row, shape=shape, seed=draw(st.integers(0, 2**16)),
                        use_bias=draw(st.booleans()),
                        logit_scale=draw(st.sampled_from((1.0, 10.0))))
    except ValueError:  # no seed makes these sizes hold the row: another draw (the explicit
        reject()  # rows of cover() hold every row)


# -- what ran -------------------------------------------------------------------------------------

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
            "head_widths": "d_k=d_v=1" if spec.d_k == spec.d_v == 1 else "wider",
            "projection_bias": "with" if spec.use_bias else "none"}


def _features(spec: CaseSpec) -> dict[str, str]:
    """The feature dimensions of ``spec`` (soft-cap, window, segments, extremes, ...)."""
    cap = spec.softcap
    window = {v: k for k, v in WINDOWS.items()}.get(spec.window, "other")
    kind, args = extremes.parse(spec.extreme) if spec.extreme else ("none", [""])
    return {"cap": "none" if cap is None else "tiny" if cap <= 1e-2 else "huge" if cap >= 1e4
            else "moderate",
            "window": "none" if spec.window is None else window,
            "segments": spec.segments or "none", "seq_lengths": spec.seq_lengths or "none",
            "nonfinite": args[0] if kind == "masked-key" else "none",
            "shared": "self" if spec.self_attention else args[0] if kind == "shared" else "none"}


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


def judge_sub_cases(state, backend, op: str, kwargs: Mapping) -> list[str]:
    """The sub-cases a call of ``op`` with the keyword arguments ``kwargs`` uses that ``backend``
    does not support (its optional ``sub_cases``), kept in the test's record ``state``
    (:class:`~.item_state.ItemState`, None outside a run) with the path (library or generic) of
    the supported ones; [] when the backend supports the call."""
    rules = getattr(backend, "sub_cases", None) or {}
    given = [name for name, v in kwargs.items() if v is not None and v is not False]
    missing, paths = judge(rules, given)
    if state is not None:
        state.sub_cases_left_out.update(f"{m} ({op})" for m in missing)
        state.sub_case_paths.update(f"{c}={p}" for c, p in paths.items())
    return missing


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


def dimensions_of(clause: str) -> tuple[str, ...]:
    """The clause's declared dimensions (every testable clause has a space, :func:`undeclared`)."""
    return SPACES[clause].dimensions


def undeclared(clause_ids) -> list[str]:
    """The clauses of ``clause_ids`` without a condition space (an error of the suite)."""
    return [c for c in clause_ids if c not in SPACES]


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


def required(clause: str, capabilities) -> set[tuple]:
    """The single values and pairs a cell must run for ``clause``: those of possible rows whose
    values need only ``capabilities`` (the operations among them)."""
    space = SPACES[clause]
    rows = [r for r in _rows(space, space.dimensions)
            if all(NEEDS.get(item, None) in (None, *capabilities) for item in r.items())]
    return set().union(set(), *(pairs(r) for r in rows))


def uncovered(clause: str, rows_ran, capabilities) -> list[str]:
    """What of :func:`required` the rows that ran (dicts over the clause's dimensions) miss, each
    as ``"dim=value"`` or ``"dim=value & dim=value"``; [] when covered."""
    seen = set().union(set(), *(pairs(r) for r in rows_ran))
    return sorted(" & ".join(f"{d}={v}" for d, v in p)
                  for p in required(clause, capabilities) - seen)


def not_implemented(clause: str, capabilities) -> list[str]:
    """The values of ``clause``'s space a backend with ``capabilities`` cannot run (reported as
    not implemented sub-cases): ``"dim=value (needs capability)"``."""
    space = SPACES[clause]
    return [f"{d}={v} (needs {NEEDS[(d, v)]})" for d in space.dimensions
            for v in values_of(space, d) if NEEDS.get((d, v), None) not in (None, *capabilities)]


def unclaimed(clauses, capabilities, state=None) -> dict[str, list[str]]:
    """clause -> :func:`not_implemented` for the ``clauses`` with a declared space, and the
    sub-cases of capabilities the calls of the test ``state`` records used that the backend does
    not support (only clauses with some)."""
    left_out = [] if state is None else [f"sub-case {s}" for s in sub_cases_left_out(state)]
    out = {c: not_implemented(c, capabilities) + left_out for c in clauses if c in SPACES}
    return {c: values for c, values in out.items() if values}


#: outcomes of results whose test ran its cases (a declared deviation ran them too)
RAN_OUTCOMES = ("pass", "fail", "deviation", "stale-deviation")


def run_gaps(results, capabilities: Mapping[str, frozenset]) -> dict[tuple, list[str]]:
    """(backend, device, dtype, clause) -> :func:`uncovered` for every cell of a run's
    ``results`` that ran a test of a clause with a declared space; ``capabilities``: backend
    name -> what it claims. Cells with nothing missing are left out ({}: every space covered)."""
    seen: dict[tuple, list] = {}
    for r in results:
        if r["outcome"] not in RAN_OUTCOMES:
            continue
        for clause in r["clauses"]:
            if clause in SPACES:
                key = (r["backend"], r["device"], r["dtype"], clause)
                seen.setdefault(key, []).extend(r.get("conditions", {}).get(clause, []))
    gaps = {key: uncovered(key[3], rows, capabilities[key[0]]) for key, rows in seen.items()}
    return {key: missing for key, missing in gaps.items() if missing}


def audit_table(results, clause_ids, capabilities: Mapping[str, frozenset]) -> str:
    """Markdown: per clause, its dimensions, the values each took in the run's ``results`` (in
    every cell: a value some cell missed is marked ``(not every cell)``), the number of covering
    rows, and what a cell missed (:func:`run_gaps`; a clause without a space: "undeclared")."""
    by_clause: dict[str, dict[tuple, list]] = {}
    for r in results:
        if r["outcome"] in RAN_OUTCOMES:
            for clause in r["clauses"]:
                cell = (r["backend"], r["device"], r["dtype"])
                by_clause.setdefault(clause, {}).setdefault(cell, []).extend(
                    r.get("conditions", {}).get(clause, []))
    gaps = run_gaps(results, capabilities)
    lines = ["| clause | dimensions | values run (every cell) | covering rows | missed |",
             "|---|---|---|---|---|"]
    for clause in clause_ids:
        if clause not in SPACES:
            lines.append(f"| {clause} | - | - | - | undeclared |")
            continue
        cells = by_clause.get(clause, {})
        shown = []
        for d in dimensions_of(clause):
            per_cell = [{row.get(d) for row in rows} for rows in cells.values()] or [set()]
            every, some = set.intersection(*per_cell), set.union(*per_cell)
            values = [v for v in dict.fromkeys((*values_of(SPACES[clause], d), "none"))
                      if v in some]
            shown.append(f"{d}: " + ", ".join(v if v in every else f"{v} (not every cell)"
                                               for v in values) if values else f"{d}: -")
        missed = sorted({m for key, ms in gaps.items() if key[3] == clause for m in ms})
        lines.append(f"| {clause} | {', '.join(dimensions_of(clause))} | "
                     f"{'; '.join(shown) if any(cells.values()) else _silent(cells)} | "
                     f"{len(covering_rows(clause))} | {', '.join(missed) or '-'} |")
    return "\n".join(lines) + "\n"


def _silent(cells) -> str:
    return "ran, no case recorded" if cells else "did not run"


def main(argv=None) -> int:
    """``python -m mhaspec.conformance.conditions REPORT.json``: the audit table (markdown) of
    a run's ``--mhaspec-report`` results, for registered backends."""
    import json
    import sys

    from mhaspec.backends import load_backend
    from mhaspec.spec import generated_marker, load as load_spec

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m mhaspec.conformance.conditions REPORT.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as f:
        results = json.load(f)
    claims = {name: frozenset(load_backend(name).capabilities)
              for name in {r["backend"] for r in results}}
    spec = load_spec()
    print(generated_marker(spec.version))
    print(audit_table(results, spec.testable_ids, claims), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
