"""Validation of the spec 1.2 keyword arguments of both attention operations (chapters GQA to
LSE, SINK-4, CHUNK-2): soft-cap, window, chunk, alignment, ALiBi slopes, segment ids and sequence
lengths, a KV cache, sinks and lse, checked and normalised into :class:`Features`
(:func:`check_features`). The shapes of q, k, v and the masks are :mod:`.arg_checks`'s.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths, g key/value heads,
L_past cached keys, L_K = L_past + L_k (L_k without a cache).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from . import positions
from ._base import FEATURE_ARGUMENTS
from .arg_checks import CAUSAL_VALUES, FLOAT_DTYPES, Arg, Dims, as_int, as_real, check_rank, fail
from .positions import Positions


# ---------------------------------------------------------------- spec 1.2 features
#
# Extra axis legend: g key/value heads, L_past cached keys, L_K = L_past + L_k (L_k without a
# cache). Clauses: spec/clauses.toml, chapters GQA to LSE.

#: The spec 1.2 keyword arguments of both attention operations and their defaults.
FEATURE_DEFAULTS = {"softcap": None, "window": None, "chunk": None, "alignment": None,
                    "alibi_slopes": None, "q_segment_ids": None, "kv_segment_ids": None,
                    "query_seq_lengths": None, "key_value_seq_lengths": None, "past_key": None,
                    "past_value": None, "past_lengths": None, "sinks": None, "lse": False}


class Features(NamedTuple):
    """The spec 1.2 arguments of one call, validated and normalised (:func:`check_features`).

    softcap: the cap c as a float, or None; window: (left, right) with None for an unbounded side,
    or None; chunk: the chunk size C of chunked local attention (CHUNK-1), or None; diagonal: the
    alignment of causal, window, chunk and ALiBi ("top_left" / "bottom_right"; always
    "bottom_right" with a cache), or None when nothing needs one; slopes: float64 (B, h) ALiBi slopes
    or None; positions: the :class:`~.positions.Positions` of segments, lengths or a cache (None
    when there are none: then query i sits at i (+ L_k - L_q bottom-right) and key j at j);
    past_key (B, g, L_past, d_k) and past_value (B, g, L_past, d_v): the backend's arrays, or None;
    past_lengths: int64 NumPy (B,) valid cache entries (L_past each when not given), or None;
    sinks: float64 NumPy (h,) sink logits (SINK-1, spec 1.3), or None; inside ``attention_vjp``
    the backend's own array (the primal being differentiated, ``autodiff_vjp``);
    lse: whether the per-row log-sum-exp is asked for.
    """

    softcap: float | None = None
    window: tuple[int | None, int | None] | None = None
    chunk: int | None = None
    diagonal: str | None = None
    slopes: np.ndarray | None = None
    positions: Positions | None = None
    past_key: Any = None
    past_value: Any = None
    past_lengths: np.ndarray | None = None
    sinks: Any = None
    lse: bool = False

    @property
    def cached(self) -> bool:
        """Whether the call has a KV cache (CACHE-1)."""
        return self.past_key is not None

    @property
    def len_past(self) -> int:
        """L_past: the cache's length (0 without a cache)."""
        return 0 if self.past_lengths is None else int(self._past_shape[2])

    @property
    def _past_shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.past_key.shape)

    @property
    def structural(self) -> bool:
        """Whether keys are removed by position (segments, lengths, a cache, a window or chunks):
        causal then applies to positions too (SEG-3, CACHE-2, WIN-1, CHUNK-1)."""
        return self.positions is not None or self.window is not None or self.chunk is not None

    @property
    def needs_positions(self) -> bool:
        """Whether the call compares token positions without segments, lengths or a cache (a
        window, chunks or ALiBi): query i then sits at i (+ L_k - L_q bottom-right), key j at j."""
        return self.window is not None or self.chunk is not None or self.slopes is not None

    @property
    def outputs(self) -> bool:
        """Whether the call returns ``AttentionOutputs`` (lse or a cache) instead of a pair."""
        return self.lse or self.cached

    @property
    def capabilities(self) -> frozenset[str]:
        """The optional capabilities the call's features use (their names in ``sub_cases.USES``);
        a cache's positions are the cache's (segments and lengths do not combine with one)."""
        used = {"softcap": self.softcap is not None, "window": self.window is not None,
                "chunk": self.chunk is not None, "alibi": self.slopes is not None,
                "segments": self.positions is not None and not self.cached,
                "kv_cache": self.cached, "sink": self.sinks is not None, "lse": self.lse}
        return frozenset(c for c, u in used.items() if u)

    @property
    def in_use(self) -> bool:
        """Whether any feature is in use (False: the call is a spec 1.1 call)."""
        return any(x is not None for x in self[:-1]) or self.lse


class KVGeometry(NamedTuple):
    """What a KV cache must match (CACHE-4): the new keys' batch B, key/value heads g, widths d_k,
    d_v, and how to describe them in messages (``"k (2, 1, 3, 4)"``, or the projected keys)."""

    batch: int
    kv_heads: int
    d_k: int
    d_v: int
    key_name: str
    value_name: str


def check_features(op: str, dims: Dims, features: Mapping[str, Any], *, dtype: str, kv: KVGeometry,
                   causal, backend, describe: Callable[[str, Any], Arg | None]) -> Features:
    """Validate the spec 1.2 keyword arguments of a call of ``op`` (either attention operation).

    ``dims``: the call's sizes (h = query heads, L_k = new keys); ``features`` maps argument names
    of :data:`FEATURE_DEFAULTS` to values (missing ones take the default; an unknown name is a
    TypeError); ``dtype``: the inputs' float dtype name (the cache must share it); ``kv``: what the
    cache must match; ``causal``: the call's causal argument; ``backend``: its ``name``,
    ``capabilities`` and ``to_numpy`` are used; ``describe(name, x)``: ``x`` as an :class:`Arg`
    (ValueError naming ``name`` when it is not one of the backend's arrays).

    An argument with a non-default value whose capability the backend does not claim raises
    NotImplementedError (``lse=True``: ValueError naming ``lse``, LSE-1). Invalid values raise
    ValueError naming the argument with the shapes (SOFTCAP-2, WIN-2, ALIBI-3, SEG-5, CACHE-4).
    """
    unknown = sorted(set(features) - set(FEATURE_DEFAULTS))
    if unknown:
        raise TypeError(f"{op}() got unexpected keyword arguments {unknown}")
    f = {**FEATURE_DEFAULTS, **features}
    _check_claims(op, f, backend)
    lse = f["lse"]
    if not isinstance(lse, (bool, np.bool_)):
        fail(op, f"argument 'lse' must be True or False, got {lse!r}")
    softcap = _check_softcap(op, f["softcap"])
    window = _check_window(op, f["window"])
    chunk = _check_chunk(op, f["chunk"])
    slopes = _check_slopes(op, dims, describe("alibi_slopes", f["alibi_slopes"]),
                           f["alibi_slopes"], backend)
    past_key, past_value, past_lengths = _check_cache(op, f, dtype, kv, backend, describe)
    if causal not in CAUSAL_VALUES:
        fail(op, f"argument 'causal' must be None, 'top_left' or 'bottom_right', got {causal!r}")
    on_positions = window is not None or chunk is not None or slopes is not None
    diagonal = _diagonal(op, causal, f["alignment"], cached=past_key is not None,
                         needs_diagonal=on_positions)
    segments = _check_segments(op, dims, f, backend, describe)
    if past_key is not None:
        given = [n for n in ("q_segment_ids", "kv_segment_ids", "query_seq_lengths",
                             "key_value_seq_lengths") if f[n] is not None]
        if given:
            fail(op, f"argument 'past_key' with shape {past_key.shape} does not combine with "
                     f"{', '.join(given)} (CACHE-4): past_lengths gives the valid cache per batch "
                     f"item")
        pos = positions.cache_positions(past_lengths, int(past_key.shape[2]), dims.len_q,
                                        dims.len_k)
    elif segments is not None:
        pos = positions.token_positions(dims.batch, dims.len_q, dims.len_k, alignment=diagonal,
                                        **segments)
    else:
        pos = None
    if not on_positions and pos is None:
        diagonal = None  # only causal's own, which MASK-6/7 applies
    sinks = _check_sinks(op, dims, describe("sinks", f["sinks"]), f["sinks"], backend)
    return Features(softcap, window, chunk, diagonal, slopes, pos, f["past_key"], f["past_value"],
                    past_lengths, sinks, bool(lse))


def _check_sinks(op: str, dims: Dims, a: Arg | None, x, backend) -> np.ndarray | None:
    """SINK-4: sinks (h,), real and finite, for scaled dot-product attention -> float64 (h,)."""
    if a is None:
        return None
    if op != "scaled_dot_product_attention":
        fail(op, "argument 'sinks' applies to scaled_dot_product_attention only (SINK-1)")
    if a.shape != (dims.heads,) or not (a.dtype in FLOAT_DTYPES or _is_int(a)):
        fail(op, f"argument 'sinks' must be a real array of shape (h,) = ({dims.heads},), got "
                 f"shape {a.shape} and dtype {a.dtype}")
    sinks = np.asarray(backend.to_numpy(x), dtype=np.float64)
    if not np.all(np.isfinite(sinks)):
        fail(op, f"argument 'sinks' must be finite, got {sinks.tolist()}")
    return sinks


def _check_claims(op: str, f: dict, backend) -> None:
    """NotImplementedError for a feature argument the backend does not claim (ValueError for lse,
    LSE-1). ``alignment`` belongs to window, chunk and alibi: any of their claims admits it."""
    claimed = backend.capabilities
    if f["lse"] is not False and "lse" not in claimed:
        fail(op, f"argument 'lse': {backend.name} does not compute the log-sum-exp (capability "
                 f"'lse' not claimed)")
    for capability, names in FEATURE_ARGUMENTS.items():
        if capability in claimed or capability == "lse":
            continue
        given = [n for n in names if f[n] is not None
                 and not (n == "alignment" and {"window", "chunk", "alibi"} & claimed)]
        if given:
            raise NotImplementedError(f"{backend.name}: {op} with {', '.join(given)} (capability "
                                      f"'{capability}') is not supported")


def _check_softcap(op: str, softcap) -> float | None:
    """SOFTCAP-2: None or a positive finite real number, as a float."""
    if softcap is None:
        return None
    value = as_real(softcap)
    if value is None or not math.isfinite(value) or value <= 0:
        fail(op, f"argument 'softcap' must be a positive finite number (None: no capping), got "
                 f"{softcap!r}")
    return value


def _check_window(op: str, window) -> tuple[int | None, int | None] | None:
    """WIN-2: None or a pair (left, right), each None or a non-negative integer."""
    if window is None:
        return None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        fail(op, f"argument 'window' must be a pair (left, right), got {window!r}")
    sides = tuple(None if s is None else as_int(s) for s in window)
    if any((s is None and w is not None) or (s is not None and s < 0)
           for s, w in zip(sides, window)):
        fail(op, f"argument 'window': each side must be None (unbounded) or a non-negative "
                 f"integer, got {window!r}")
    return sides


def _check_chunk(op: str, chunk) -> int | None:
    """CHUNK-2: None or a positive integer (not a bool), as an int."""
    if chunk is None:
        return None
    size = as_int(chunk)
    if size is None or size < 1:
        fail(op, f"argument 'chunk' must be a positive integer (None: no chunks), got {chunk!r}")
    return size


def _diagonal(op: str, causal, alignment, *, cached: bool, needs_diagonal: bool) -> str | None:
    """WIN-2, CACHE-4: the alignment of causal, window and ALiBi."""
    if alignment is not None and alignment not in CAUSAL_VALUES[1:]:
        fail(op, f"argument 'alignment' must be None, 'top_left' or 'bottom_right', got "
                 f"{alignment!r}")
    if causal is not None and alignment is not None and causal != alignment:
        fail(op, f"argument 'alignment' = {alignment!r} differs from causal = {causal!r}: the "
                 f"diagonal is one (WIN-2)")
    diagonal = causal if causal is not None else alignment
    if cached:
        if diagonal == "top_left":
            name = "causal" if causal is not None else "alignment"
            fail(op, f"argument '{name}' = 'top_left' is an error with a KV cache: query i sits at "
                     f"past_length + i (CACHE-2); use 'bottom_right' or None")
        return "bottom_right"
    if needs_diagonal and diagonal is None:
        fail(op, "argument 'alignment' is required: window, chunk and alibi_slopes need a "
                 "diagonal; pass causal or alignment ('top_left' or 'bottom_right'), there is no "
                 "default (WIN-2, CHUNK-2)")
    return diagonal


def _is_int(a: Arg) -> bool:
    return a.dtype.startswith(("int", "uint"))


def _check_slopes(op: str, dims: Dims, a: Arg | None, x, backend) -> np.ndarray | None:
    """ALIBI-3: slopes (h,) or (B, h), real and finite -> float64 (B, h)."""
    if a is None:
        return None
    h, b = dims.heads, dims.batch
    if a.shape not in ((h,), (b, h)) or not (a.dtype in FLOAT_DTYPES or _is_int(a)):
        fail(op, f"argument 'alibi_slopes' must be a real array of shape (h,) = ({h},) or (B, h) "
                 f"= ({b}, {h}), got shape {a.shape} and dtype {a.dtype}")
    slopes = np.asarray(backend.to_numpy(x), dtype=np.float64)
    if not np.all(np.isfinite(slopes)):
        fail(op, f"argument 'alibi_slopes' with shape {a.shape} must be finite, got "
                 f"{slopes.tolist()}")
    return np.ascontiguousarray(np.broadcast_to(slopes, (b, h)))


def _int_values(op: str, name: str, x, shape: tuple[int, ...], backend, describe,
                layout: str) -> np.ndarray:
    """An integer array argument of exactly ``shape`` as int64 NumPy (SEG-5, CACHE-4)."""
    a = describe(name, x)
    if not _is_int(a):
        fail(op, f"argument '{name}' must be an integer array, got dtype {a.dtype} with shape "
                 f"{a.shape}")
    if a.shape != shape:
        fail(op, f"argument '{name}' must have shape {layout} = {shape}, got {a.shape}")
    return np.asarray(backend.to_numpy(x)).astype(np.int64)


def _lengths(op: str, name: str, x, b: int, upper: int, backend, describe,
             what: str) -> np.ndarray | None:
    """Per-batch lengths (B,) in [0, upper] (SEG-2, CACHE-1) as int64, or None."""
    if x is None:
        return None
    values = _int_values(op, name, x, (b,), backend, describe, "(B,)")
    if np.any(values < 0) or np.any(values > upper):
        fail(op, f"argument '{name}' must lie in [0, {what}] = [0, {upper}], got "
                 f"{values.tolist()}")
    return values


def _check_segments(op: str, dims: Dims, f: dict, backend, describe) -> dict | None:
    """SEG-5: ids both or neither, integer (B, L_q) / (B, L_k); lengths integer (B,) in [0, L].
    Returns the keyword arguments of :func:`positions.token_positions`, or None when none given."""
    q_ids, kv_ids = f["q_segment_ids"], f["kv_segment_ids"]
    if (q_ids is None) != (kv_ids is None):
        missing, given = ("q_segment_ids", "kv_segment_ids") if q_ids is None else \
            ("kv_segment_ids", "q_segment_ids")
        fail(op, f"argument '{missing}' is missing: q_segment_ids and kv_segment_ids go together "
                 f"('{given}' given with shape {describe(given, f[given]).shape})")
    out = {}
    if q_ids is not None:
        b = dims.batch
        out["q_segment_ids"] = _int_values(op, "q_segment_ids", q_ids, (b, dims.len_q), backend,
                                           describe, "(B, L_q)")
        out["kv_segment_ids"] = _int_values(op, "kv_segment_ids", kv_ids, (b, dims.len_k),
                                            backend, describe, "(B, L_k)")
    for name, upper, what in (("query_seq_lengths", dims.len_q, "L_q"),
                              ("key_value_seq_lengths", dims.len_k, "L_k")):
        values = _lengths(op, name, f[name], dims.batch, upper, backend, describe, what)
        if values is not None:
            out[name] = values
    return out or None


def _check_cache(op: str, f: dict, dtype: str, kv: KVGeometry, backend, describe):
    """CACHE-4 -> (past_key Arg, past_value Arg, past_lengths int64 (B,)) or (None, None, None)."""
    pk, pv = describe("past_key", f["past_key"]), describe("past_value", f["past_value"])
    if pk is None and pv is None:
        if f["past_lengths"] is not None:
            fail(op, "argument 'past_lengths' is given without past_key and past_value (CACHE-4)")
        return None, None, None
    if pk is None or pv is None:
        missing, given = ("past_key", pv) if pk is None else ("past_value", pk)
        fail(op, f"argument '{missing}' is missing: past_key and past_value go together "
                 f"('{given.name}' given with shape {given.shape})")
    for a, new, d, layout in ((pk, kv.key_name, kv.d_k, "(B, g, L_past, d_k)"),
                              (pv, kv.value_name, kv.d_v, "(B, g, L_past, d_v)")):
        check_rank(op, a, 4, layout)
        if a.dtype != dtype:
            fail(op, f"argument '{a.name}' must have the inputs' dtype {dtype}, got dtype "
                     f"{a.dtype} with shape {a.shape}")
        want = (kv.batch, kv.kv_heads, d)
        got = (a.shape[0], a.shape[1], a.shape[3])
        if got != want:
            fail(op, f"argument '{a.name}' with shape {a.shape} does not match {new}: its batch, "
                     f"head and width axes (0, 1, 3) must be (B, g, d) = {want}")
    if pk.shape[2] != pv.shape[2]:
        fail(op, f"argument 'past_value' with shape {pv.shape} must have past_key's length L_past "
                 f"(axis 2), got past_key {pk.shape}")
    l_past = pk.shape[2]
    lengths = _lengths(op, "past_lengths", f["past_lengths"], kv.batch, l_past, backend,
                       describe, "L_past")
    return pk, pv, np.full(kv.batch, l_past, np.int64) if lengths is None else lengths
