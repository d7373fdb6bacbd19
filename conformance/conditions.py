"""Condition spaces: for a clause, the dimensions along which its condition arises and the values
each takes (the declarations; :mod:`.covering` builds the cases every profile draws from them,
:mod:`.observation` reads back what ran, :mod:`.condition_audit` reports what a cell missed).
Imports neither pytest nor Hypothesis: a certificate's Markdown lists :data:`DIMENSIONS`.

Axis legend: B batch, h heads, L_q queries, L_k keys (L_K with a cache), d_k / d_v widths.

A clause's :class:`Space` names dimensions of :data:`DIMENSIONS` (``op``, ``lengths``,
``empty_by``, ``bias``, ...). Every profile, ``ci`` included, runs every value of every dimension
and every pair of values of two dimensions (the clause's text combines each of them) in every
backend x device x dtype cell (:mod:`.covering`). What a backend cannot take (a capability it does
not claim, :data:`NEEDS`) is dropped by ``harness.fit`` and recorded as what actually ran, and
:func:`.condition_audit.uncovered` reports the combinations that needed it as not implemented.

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
* CHUNK-1 (spec 1.4): chunk sizes (1, 2, 3: dividing some lengths and not others, wider than
  every key axis) x alignment x ordering (bottom-right L_q > L_k: negative query positions) x with
  and without a causal mask x positions on the array or within packed segments (chunks start at
  each sequence's first token) x whether the first queries sit at negative positions no causal
  mask empties (a chunk index rounded toward zero, not down, shows there), every pair; with a
  cache: test_chunk's cache cases.
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

from typing import Callable, Mapping, NamedTuple

from .features import CHUNK_SIZES, WIDE

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
#: chunk sizes (CHUNK-1): those the strategies draw (one position a chunk, two and three, dividing
#: some lengths and not others, and one wider than every key axis), by name
CHUNKS = {"wide" if size == WIDE else str(size): size for size in CHUNK_SIZES}
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
    "chunk": tuple(CHUNKS),  # the chunk size (CHUNK-1, spec 1.4)
    "chunk_positions": ("array", "packed"),  # positions on the array or within segments (SEG-3)
    # whether the first queries sit at negative positions that no causal mask empties (bottom-right,
    # L_q > L_K, no causal): where the chunk's floor division rounds down, not toward zero
    "chunk_floor": ("non-negative", "negative"),
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
         ("group", "1<g<h"): "gqa", ("group", "g=1"): "gqa",
         ("chunk_positions", "packed"): "segments"}


def _empties_a_row(row: Mapping[str, str]) -> bool:
    """A causal mask or a window alone empties rows only when L_q > L_k; a -inf bias is a bias."""
    if row.get("empty_by") in ("causal_bottom_right", "window") and row.get("lengths") != "L_q>L_k":
        return False
    return not (row.get("empty_by") == "minus_inf_bias" and row.get("bias") == "none")


def _chunk_floor_possible(row: Mapping[str, str]) -> bool:
    """Negative query positions without a causal mask: bottom-right with L_q > L_k, no causal."""
    negative = (row["lengths"] == "L_q>L_k" and row["alignment"] == "bottom_right"
                and row["with_causal"] == "no")
    return (row["chunk_floor"] == "negative") == negative


def every_row(row: Mapping[str, str]) -> bool:
    """Every row is possible (a space's default)."""
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
    possible: Callable[[Mapping[str, str]], bool] = every_row
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
    # spec 1.4: chunked local attention, every pair of its dimensions
    "CHUNK-1": Space(("op", "lengths", "alignment", "chunk", "with_causal", "chunk_positions",
                      "chunk_floor"), possible=_chunk_floor_possible),
    "CHUNK-2": Space(LENGTHS),
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
# heads run the sizes of its rows only, conformance/test_gqa.py). A width of 1 with as many heads
# as a sequence has tokens is a value of its own: a projection output (B, L, h, 1) whose bias
# (h, 1) a library places by axis size lands on the tokens when L = h (Keras's EinsumDense, found
# by a held-out check); h is then the longer length (at least 2).
DIMENSIONS.update({"head_widths": ("d_k=d_v=1", "d_k=d_v=1,h=L", "wider"),
                   "projection_bias": ("none", "with")})
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


def dimensions_of(clause: str) -> tuple[str, ...]:
    """The clause's declared dimensions (every testable clause has a space, :func:`undeclared`)."""
    return SPACES[clause].dimensions


def undeclared(clause_ids) -> list[str]:
    """The clauses of ``clause_ids`` without a condition space (an error of the suite)."""
    return [c for c in clause_ids if c not in SPACES]

