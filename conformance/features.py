"""The spec 1.2 features of a conformance case: menus of values and the arrays they need.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k keys attended, d_k / d_v per-head widths.

A :class:`~mhaspec.conformance.strategies.CaseSpec` names its features with plain values
(``softcap``, ``window``, ``chunk``, ``alignment``, ``alibi``, ``segments``, ``seq_lengths``,
``past_len``, ``past_valid``, ``lse``, ``kv_heads``); :func:`feature_arrays` draws the arrays
they need from the case's seed (a stream of its own, so a case without features has exactly the
arrays of spec 1.1) and :func:`feature_kwargs` gives the keyword arguments of a call, holding only
non-default values: a backend that does not claim a feature never sees its argument.

Each capability governs its arguments as ``mhaspec.backends.FEATURE_ARGUMENTS`` says.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: Soft caps from tiny (every logit squeezed into (-c, c)) to huge (no visible capping).
SOFTCAPS = (1e-3, 0.5, 5.0, 50.0, 1e6)
#: A window side wider than any key axis the strategies draw (L_K <= 8 + 11).
WIDE = 32
#: Window sides: 0 (the diagonal only), 1, 3, wider than L_k, unbounded.
WINDOW_SIDES = (0, 1, 3, WIDE, None)
#: Chunk sizes (CHUNK-1): one position a chunk, two, three (dividing no drawn length but 3, 6, 9)
#: and wider than any key axis (one chunk, or none shared with a negative query position).
CHUNK_SIZES = (1, 2, 3, WIDE)
#: ALiBi slopes: the geometric sequence 2^(-8 (i + 1) / h), random per head, all zero, random per (B, h).
ALIBI_KINDS = ("geometric", "random", "zero", "per_batch")
#: Segment ids: one segment, a segment per token, contiguous packing, arbitrary scattered ids.
SEGMENT_KINDS = ("one", "per_token", "packed", "scattered")
#: Which sequence lengths a case passes (SEG-2).
LENGTH_KINDS = ("query", "key_value", "both")
#: Cache lengths: an empty cache, a short one, one longer than any L_k drawn.
PAST_LENGTHS = (0, 3, 11)

#: Every CaseSpec field of a feature, with its neutral value.
NEUTRAL = {"kv_heads": None, "softcap": None, "window": None, "alignment": None, "alibi": None,
           "segments": None, "seq_lengths": None, "past_len": None, "past_valid": False,
           "lse": False, "chunk": None}


class FeatureArrays(NamedTuple):
    """The arrays of a case's features (None where the case has none).

    alibi_slopes (h,) or (B, h); q_segment_ids (B, L_q), kv_segment_ids (B, L_k) int64;
    query_seq_lengths, key_value_seq_lengths (B,) int64; past_key (B, g, L_past, d_k),
    past_value (B, g, L_past, d_v); past_lengths (B,) int64 (None: every cached key valid)."""

    alibi_slopes: np.ndarray | None = None
    q_segment_ids: np.ndarray | None = None
    kv_segment_ids: np.ndarray | None = None
    query_seq_lengths: np.ndarray | None = None
    key_value_seq_lengths: np.ndarray | None = None
    past_key: np.ndarray | None = None
    past_value: np.ndarray | None = None
    past_lengths: np.ndarray | None = None


#: Feature arrays holding integers (passed to ``asarray`` with dtype "int64").
INTEGER_ARRAYS = ("q_segment_ids", "kv_segment_ids", "query_seq_lengths", "key_value_seq_lengths",
                  "past_lengths")


def key_length(spec) -> int:
    """L_K: the keys a call attends (the present cache's length with a cache)."""
    return spec.len_k + (spec.past_len or 0)


def kv_heads(spec) -> int:
    """g: the key/value heads of the case's k, v and cache."""
    return spec.kv_heads or spec.heads


def geometric_slopes(h: int) -> np.ndarray:
    """The geometric slopes 2^(-8 (i + 1) / h), i = 0 .. h-1: the ALiBi paper's ``get_slopes`` only
    for h a power of two (otherwise the paper interleaves two sequences; erratum 1.2-E6)."""
    return 2.0 ** (-8.0 * (np.arange(h) + 1) / h)


def _segment_ids(kind: str, rng: np.random.Generator, b: int, l_q: int, l_k: int,
                 self_attention: bool) -> tuple[np.ndarray, np.ndarray]:
    if kind == "one":
        return np.zeros((b, l_q), np.int64), np.zeros((b, l_k), np.int64)
    if kind == "per_token":
        return (np.broadcast_to(np.arange(l_q), (b, l_q)).copy(),
                np.broadcast_to(np.arange(l_k), (b, l_k)).copy())
    if kind == "packed":  # contiguous sequences, shared by queries and keys in self-attention
        n = int(rng.integers(1, 4))

        def contiguous(length):
            cuts = np.sort(rng.integers(0, length + 1, size=(b, n - 1)), axis=1)
            return (np.arange(length)[None, None, :] >= cuts[:, :, None]).sum(axis=1)

        q_ids = contiguous(l_q)
        return q_ids, q_ids.copy() if self_attention and l_q == l_k else contiguous(l_k)
    if kind == "scattered":  # arbitrary, unsorted, non-contiguous ids
        labels = np.array([7, -3, 100])
        return labels[rng.integers(0, 3, (b, l_q))], labels[rng.integers(0, 3, (b, l_k))]
    raise ValueError(f"unknown segment kind {kind!r} (known: {', '.join(SEGMENT_KINDS)})")


def _slopes(kind: str, rng: np.random.Generator, b: int, h: int) -> np.ndarray:
    if kind == "geometric":
        return geometric_slopes(h)
    if kind == "random":
        return rng.random(h)
    if kind == "zero":
        return np.zeros(h)
    if kind == "per_batch":
        return rng.random((b, h))
    raise ValueError(f"unknown ALiBi kind {kind!r} (known: {', '.join(ALIBI_KINDS)})")


def feature_arrays(spec) -> FeatureArrays:
    """The arrays of ``spec``'s features, drawn from its seed (deterministic)."""
    rng = np.random.default_rng([spec.seed, 12])
    b, h, lq, lk = spec.batch, spec.heads, spec.len_q, spec.len_k
    arrays = {}
    if spec.alibi is not None:
        arrays["alibi_slopes"] = _slopes(spec.alibi, rng, b, h)
    if spec.segments is not None:
        arrays["q_segment_ids"], arrays["kv_segment_ids"] = _segment_ids(
            spec.segments, rng, b, lq, lk, spec.self_attention)
    if spec.seq_lengths in ("query", "both"):
        arrays["query_seq_lengths"] = rng.integers(0, lq + 1, b)
    if spec.seq_lengths in ("key_value", "both"):
        arrays["key_value_seq_lengths"] = rng.integers(0, lk + 1, b)
    if spec.past_len is not None:
        g, past = kv_heads(spec), spec.past_len
        amp = float(np.sqrt(spec.logit_scale))
        arrays["past_key"] = rng.standard_normal((b, g, past, spec.d_k)) * amp
        arrays["past_value"] = rng.standard_normal((b, g, past, spec.d_v))
        if spec.past_valid:
            arrays["past_lengths"] = rng.integers(0, past + 1, b)
    for name in INTEGER_ARRAYS:
        if name in arrays:
            arrays[name] = np.asarray(arrays[name], np.int64)
    return FeatureArrays(**arrays)


def feature_kwargs(spec, arrays: FeatureArrays) -> dict:
    """The spec 1.2 keyword arguments of a call on ``spec``: only those with a non-default value."""
    kw = {"softcap": spec.softcap, "window": spec.window, "chunk": spec.chunk,
          "alignment": spec.alignment, **arrays._asdict()}
    if spec.lse:
        kw["lse"] = True
    return {k: v for k, v in kw.items() if v is not None}


def fit_features(spec, capabilities: frozenset, op: str):
    """``spec`` without the features a backend does not claim (and without grouped k, v heads
    for multi-head attention, whose grouping is ``num_kv_heads``, MHA-6)."""
    drop = {}
    if spec.kv_heads is not None and ("gqa" not in capabilities or op == "mha"):
        drop["kv_heads"] = None
    for field, capability in (("softcap", "softcap"), ("window", "window"), ("alibi", "alibi"),
                              ("segments", "segments"), ("seq_lengths", "segments"),
                              ("lse", "lse"), ("chunk", "chunk")):
        if getattr(spec, field) not in (None, False) and capability not in capabilities:
            drop[field] = NEUTRAL[field]
    if spec.past_len is not None and "kv_cache" not in capabilities:
        drop.update(past_len=None, past_valid=False)
        drop.update({f: _without_past(getattr(spec, f), spec.len_k)
                     for f in ("mask_shape", "bias_shape", "legacy_shape")})
        if spec.causal is None and spec.alignment is None:
            drop["alignment"] = "bottom_right"  # the cache's diagonal (CACHE-2), now named (WIN-2)
    spec = spec._replace(**drop)
    if not needs_diagonal(spec):
        spec = spec._replace(alignment=None)
    return spec


def needs_diagonal(spec) -> bool:
    """Whether ``spec`` has a feature that needs a diagonal: a window, chunks or ALiBi (WIN-2)."""
    return spec.window is not None or spec.chunk is not None or spec.alibi is not None


def _without_past(shape, l_k: int):
    """A mask shape over L_K = L_past + L_k as one over L_k (a broadcast axis stays)."""
    if shape is None or shape[-1] == 1:
        return shape
    return tuple(shape[:-1]) + (l_k,)
