"""Hypothesis strategies for conformance cases, derived from the spec's shapes and masks.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

A strategy draws a :class:`CaseSpec`: plain numbers and names only (shapes, which masks, a seed).
:func:`build_case` turns it into float64 NumPy arrays deterministically, so a failing example is
reproduced from its printed ``CaseSpec`` alone and Hypothesis shrinks shapes and options, not
thousands of floats. Sizes come from short fixed menus so compiled variants (``jax.jit``,
``tf.function``) meet few distinct shapes.
"""

from __future__ import annotations


import functools
import itertools
from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st

from mhaspec.backends.validation import Dims
from mhaspec.spec import oracle

from . import extremes, features
from .features import FeatureArrays
from .item_state import shape_menu

LENGTHS = (1, 2, 5, 8)
WIDTHS = (1, 4, 8)
HEADS = (1, 2, 3)
BATCHES = (1, 2)
LOGIT_SCALES = (1.0, 0.1, 10.0, 100.0)
CUSTOM_SCALES = (0.05, 0.5, 2.0)
MASK_DENSITIES = (0.7, 0.3, 0.95)


class Shapes(NamedTuple("Shapes", [*((f, int) for f in Dims._fields),
                                   *((f, int) for f in ("d_model", "k_dim", "v_dim", "d_out"))])):
    """The sizes of a case: the backends' :class:`~mhaspec.backends.validation.Dims` (B, h, L_q,
    L_k, d_k, d_v) followed by the widths d_model, k_dim, v_dim, d_out."""

    __slots__ = ()

    @property
    def self_attention(self) -> bool:
        return self.len_q == self.len_k and self.d_model == self.k_dim == self.v_dim


#: A short fixed list of shapes for the ``ci`` profile: compiled variants (and JAX's per-shape
#: eager kernels) then compile each shape once for the whole run. Chosen by what callers run and
#: what tells conventions apart: decoding (one query, several keys: L_q = 1 < L_k, where top-left
#: and bottom-right causal masks differ most), prefill (L_q = L_k), L_q < L_k and L_q > L_k
#: (alignments differ; bottom-right empties rows), sizes 1 (L_q = L_k = 1, L_k = 1, h = 1, d = 1),
#: d_v != d_k, cross-attention widths, batch 1 and 2. Sizes 0 (SHAPE-4) have their own tests
#: (conformance/test_shapes.py), which set them on these shapes.
CI_SHAPES = (
    Shapes(1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
    Shapes(2, 2, 5, 5, 4, 4, 8, 8, 8, 8),
    Shapes(2, 3, 2, 8, 4, 8, 8, 4, 1, 4),
    Shapes(1, 2, 8, 5, 8, 4, 4, 8, 8, 8),
    Shapes(2, 2, 5, 8, 8, 4, 8, 4, 8, 1),
    Shapes(2, 1, 5, 1, 4, 1, 4, 1, 4, 4),
    Shapes(1, 3, 8, 8, 8, 8, 8, 8, 8, 8),
    Shapes(2, 2, 1, 5, 4, 8, 8, 8, 4, 8),
)


class CaseSpec(NamedTuple):
    """Everything that defines one case; arrays come from :func:`build_case`."""

    batch: int = 2
    heads: int = 2
    len_q: int = 3
    len_k: int = 3
    d_k: int = 4
    d_v: int = 4
    d_model: int = 8
    k_dim: int = 8
    v_dim: int = 8
    d_out: int = 8
    self_attention: bool = False
    use_bias: bool = True
    mask_shape: tuple[int, ...] | None = None
    mask_density: float = 0.7
    fully_masked_rows: bool = False
    bias_shape: tuple[int, ...] | None = None
    legacy_shape: tuple[int, ...] | None = None
    key_padding: bool = False
    causal: str | None = None
    scale: float | None = None
    logit_scale: float = 1.0
    seed: int = 0
    extreme: str | None = None  # see mhaspec.conformance.extremes
    # spec 1.2 features (mhaspec.conformance.features; neutral by default)
    kv_heads: int | None = None  # g key/value heads of k, v (SDPA, GQA-1) and of the cache
    softcap: float | None = None
    window: tuple | None = None  # (left, right), a side None = unbounded
    alignment: str | None = None  # the diagonal of window, chunk and ALiBi without causal
    alibi: str | None = None  # one of features.ALIBI_KINDS
    segments: str | None = None  # one of features.SEGMENT_KINDS
    seq_lengths: str | None = None  # one of features.LENGTH_KINDS
    past_len: int | None = None  # L_past of a KV cache (None: no cache; 0: an empty one)
    past_valid: bool = False  # past_lengths drawn in [0, L_past] (else every cached key valid)
    lse: bool = False  # ask for the log-sum-exp
    chunk: int | None = None  # the chunk size C of chunked local attention (CHUNK, spec 1.4)


class Case(NamedTuple):
    """Float64 inputs of one case (unused fields are None).

    SDPA: q (B, h, L_q, d_k), k (B, g, L_k, d_k), v (B, g, L_k, d_v) (g = h unless grouped).
    MHA: query (B, L_q, d_model), key (B, L_k, k_dim), value (B, L_k, v_dim), params.
    Masks broadcast to (B, h, L_q, L_K); key_padding_mask is (B, L_K) (L_K = L_past + L_k with a
    cache, else L_k). ``features``: the arrays of the spec 1.2 features (:class:`FeatureArrays`).
    """

    spec: CaseSpec
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    params: oracle.Params
    mask: np.ndarray | None
    bias: np.ndarray | None
    legacy_mask: np.ndarray | None
    key_padding_mask: np.ndarray | None
    features: FeatureArrays = FeatureArrays()

    def mask_kwargs(self) -> dict:
        """The masking keyword arguments shared by both operations."""
        return {"mask": self.mask, "bias": self.bias, "legacy_mask": self.legacy_mask,
                "key_padding_mask": self.key_padding_mask, "causal": self.spec.causal,
                "scale": self.spec.scale}

    def call_kwargs(self) -> dict:
        """Every keyword argument of a call on this case: the masks and the spec 1.2 features
        the case has (only those: a case without features passes none)."""
        return {**self.mask_kwargs(), **features.feature_kwargs(self.spec, self.features)}


@functools.lru_cache(maxsize=4096)  # every case of a ci run: the oracle's cache is keyed on them
def build_case(spec: CaseSpec) -> Case:
    """Deterministic float64 arrays for ``spec`` (the same spec always gives the same arrays).

    Cached: callers must not modify the arrays in place (derive new cases with ``_replace``)."""
    rng = np.random.default_rng(spec.seed)
    b, h, lq, lk = spec.batch, spec.heads, spec.len_q, spec.len_k
    # q.k products have standard deviation logit_scale (times sqrt(d_k) * scale ~ 1)
    amp = float(np.sqrt(spec.logit_scale))
    q = rng.standard_normal((b, h, lq, spec.d_k)) * amp
    k = rng.standard_normal((b, h, lk, spec.d_k)) * amp
    v = rng.standard_normal((b, h, lk, spec.d_v))
    query = rng.standard_normal((b, lq, spec.d_model))
    if spec.self_attention:
        key = value = query
    else:
        key = rng.standard_normal((b, lk, spec.k_dim))
        value = rng.standard_normal((b, lk, spec.v_dim))
    params = _params(rng, spec, amp)
    mask = None
    if spec.mask_shape is not None:
        mask = rng.random(spec.mask_shape) < spec.mask_density
        if spec.fully_masked_rows:
            rows = rng.random(spec.mask_shape[-2]) < 0.5
            rows[rng.integers(spec.mask_shape[-2])] = True
            mask[..., rows, :] = False
        else:
            mask[..., 0] = True  # key 0 stays allowed: no row is fully masked by accident
    bias = None if spec.bias_shape is None else rng.standard_normal(spec.bias_shape) * amp
    legacy = None
    if spec.legacy_shape is not None:
        legacy = (rng.random(spec.legacy_shape) < 0.4).astype(np.float64)
        legacy[..., rng.integers(spec.legacy_shape[-1])] = 0.0  # every row keeps a key (MASK-3)
    kpm = None
    if spec.key_padding:
        kpm = rng.random((b, features.key_length(spec))) < 0.75
        if spec.fully_masked_rows:  # one batch item with every key padded: all its rows empty
            kpm[rng.integers(b)] = False
        else:
            kpm[:, 0] = True
    g = features.kv_heads(spec)
    if g != h:  # grouped key/value heads (GQA-1): the first g heads
        k, v = k[:, :g], v[:, :g]
    case = Case(spec, q, k, v, query, key, value, params, mask, bias, legacy, kpm,
                features.feature_arrays(spec))
    if spec.extreme is not None:
        case = extremes.apply(case, spec.extreme)
    for array in (*case[1:7], *case.params, mask, bias, legacy, kpm, *case.features):
        if array is not None:
            array.flags.writeable = False  # shared through the cache
    return case


def _params(rng: np.random.Generator, spec: CaseSpec, amp: float) -> oracle.Params:
    """Parameters scaled so projected q.k logits have spread ~ logit_scale."""
    h = spec.heads
    d_in_k = spec.d_model if spec.self_attention else spec.k_dim
    d_in_v = spec.d_model if spec.self_attention else spec.v_dim

    def w(rows, cols, gain=1.0):
        return rng.standard_normal((rows, cols)) * gain / np.sqrt(rows)

    def b(n):
        return rng.standard_normal(n) * 0.1 if spec.use_bias else None

    return oracle.Params(
        w_q=w(spec.d_model, h * spec.d_k, amp), w_k=w(d_in_k, h * spec.d_k, amp),
        w_v=w(d_in_v, h * spec.d_v), w_o=w(h * spec.d_v, spec.d_out),
        b_q=b(h * spec.d_k), b_k=b(h * spec.d_k), b_v=b(h * spec.d_v), b_o=b(spec.d_out))


@functools.lru_cache(maxsize=None)
def free_shapes(max_len: int, self_attention: bool, sizes=None) -> tuple[Shapes, ...]:
    """Every size a free draw (no shape menu) can give, smallest first, those ``sizes`` (a
    predicate on :class:`Shapes`, None: all) accepts: B, h, L_q, d_k from the menus and, for
    self-attention, L_k = L_q, d_v = d_k and every width h * d_k; otherwise L_k, d_v, d_model,
    k_dim, v_dim, d_out each from theirs."""
    lengths = tuple(n for n in LENGTHS if n <= max_len)
    if self_attention:
        every = (Shapes(b, h, lq, lq, d_k, d_k, *(h * d_k,) * 4)
                 for b, h, lq, d_k in itertools.product(BATCHES, HEADS, lengths, WIDTHS))
    else:
        every = (Shapes(*dims) for dims in itertools.product(
            BATCHES, HEADS, lengths, lengths, *(WIDTHS,) * 6))
    return tuple(shape for shape in every if sizes is None or sizes(shape))


@functools.lru_cache(maxsize=None)
def _free_shape_strategy(max_len: int, self_attention: bool, sizes) -> st.SearchStrategy[Shapes]:
    """One draw from :func:`free_shapes`: a tenth of the cost of ten draws of one size each (about
    0.1 ms a draw), the same uniform distribution, shrinking toward the first entry (every size
    1). Cached, since ``st.sampled_from`` hashes its whole list on every call."""
    return st.sampled_from(free_shapes(max_len, self_attention, sizes))


# -- strategies ------------------------------------------------------------------------------------

def _check_flags(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"argument {name!r} must be a bool, got {value!r}")


@st.composite
def broadcast_shapes(draw, full: tuple[int, int, int, int], *, min_rank: int = 2):
    """A shape that broadcasts to ``full`` = (B, h, L_q, L_k): rank 2..4, each axis kept or 1."""
    rank = draw(st.integers(min_rank, 4))
    tail = full[4 - rank:]
    return tuple(n if draw(st.booleans()) else 1 for n in tail[:-2]) + tuple(
        n if draw(st.booleans()) or n == 1 else 1 for n in tail[-2:-1]) + (tail[-1],)


#: what :func:`case_specs` can be asked to put in every case (``require``)
REQUIRABLE = ("masks", "bias", "legacy", "key_padding")


@st.composite
def case_specs(draw, *, masks: bool = False, bias: bool = False, legacy: bool = False,
               key_padding: bool = False, causal: bool = False, fully_masked: bool = False,
               custom_scale: bool = False, cross: bool = True, logit_scales=LOGIT_SCALES,
               max_len: int = 8, require: tuple[str, ...] = (), sizes=None) -> CaseSpec:
    """Draw a :class:`CaseSpec`.

    Each flag allows (not forces) one feature; each name of ``require`` (of :data:`REQUIRABLE`)
    forces its allowed feature, and ``fully_masked`` forces fully masked rows (with ``masks``).
    ``legacy`` cases carry no other masks: the legacy form is only comparable when every row keeps
    a key (MASK-3, MASK-4). ``cross=False`` draws self-attention shapes only. ``sizes``, a
    predicate on :class:`Shapes`, narrows the sizes drawn from (the shape menu or every size) before
    the draw: a constraint constructed, never a draw filtered away.
    """
    _check_flags(masks=masks, bias=bias, legacy=legacy, key_padding=key_padding, causal=causal,
                 fully_masked=fully_masked, custom_scale=custom_scale, cross=cross)
    if fully_masked and not masks:
        raise ValueError("argument 'fully_masked' needs masks=True")
    allowed = {"masks": masks, "bias": bias, "legacy": legacy, "key_padding": key_padding}
    wrong = [name for name in require if not allowed.get(name)]
    if wrong:
        raise ValueError(f"argument 'require' names {wrong}, which are not allowed here "
                         f"(requirable: {list(REQUIRABLE)}, each with its flag True)")
    shapes = shape_menu()
    if shapes is not None:
        menu = [m for m in shapes if (cross or m.self_attention) and (sizes is None or sizes(m))]
        if not menu:
            raise ValueError("argument 'sizes' accepts no shape of the run's menu")
        b, h, lq, lk, d_k, d_v, d_model, k_dim, v_dim, d_out = draw(st.sampled_from(menu))
        self_attention = Shapes(b, h, lq, lk, d_k, d_v, d_model, k_dim, v_dim, d_out).self_attention
        self_attention = self_attention and (not cross or draw(st.booleans()))
    else:
        can_self = bool(free_shapes(max_len, True, sizes))
        can_cross = cross and bool(free_shapes(max_len, False, sizes))
        if not (can_self or can_cross):
            raise ValueError("argument 'sizes' accepts no shape")
        self_attention = can_self and (not can_cross or draw(st.booleans()))
        b, h, lq, lk, d_k, d_v, d_model, k_dim, v_dim, d_out = draw(
            _free_shape_strategy(max_len, self_attention, sizes))
    full = (b, h, lq, lk)
    use_legacy = legacy and ("legacy" in require or draw(st.booleans()))
    spec = CaseSpec(
        batch=b, heads=h, len_q=lq, len_k=lk, d_k=d_k, d_v=d_v, d_model=d_model, k_dim=k_dim,
        v_dim=v_dim, d_out=d_out, self_attention=self_attention, use_bias=draw(st.booleans()),
        logit_scale=draw(st.sampled_from(logit_scales)), seed=draw(st.integers(0, 2**16)))
    if masks and not use_legacy and (fully_masked or "masks" in require or draw(st.booleans())):
        shape = draw(broadcast_shapes(full))
        if fully_masked and len(shape) >= 2 and shape[-2] == 1:
            shape = shape[:-2] + (lq, lk)
        spec = spec._replace(mask_shape=shape, mask_density=draw(st.sampled_from(MASK_DENSITIES)),
                             fully_masked_rows=fully_masked)
    if bias and ("bias" in require or draw(st.booleans())):
        spec = spec._replace(bias_shape=draw(broadcast_shapes(full)))
    if use_legacy:
        spec = spec._replace(legacy_shape=draw(broadcast_shapes(full)))
    if key_padding and not use_legacy and ("key_padding" in require or draw(st.booleans())):
        spec = spec._replace(key_padding=True)
    if causal and not use_legacy and draw(st.booleans()):
        spec = with_causal(spec, draw(st.sampled_from(oracle.CAUSAL_ALIGNMENTS)))
    if custom_scale and draw(st.booleans()):
        spec = spec._replace(scale=draw(st.sampled_from(CUSTOM_SCALES)))
    return spec


def with_causal(spec: CaseSpec, alignment: str) -> CaseSpec:
    """``spec`` with a causal mask of ``alignment``, its lengths as drawn: bottom-right with
    L_q > L_k empties the first L_q - L_k rows (MASK-7), which MASK-9 then governs."""
    return spec._replace(causal=alignment)


#: The features :func:`feature_specs` can draw, by the capability that governs each.
FEATURE_CAPABILITIES = {"gqa": "gqa", "softcap": "softcap", "window": "window", "alibi": "alibi",
                        "segments": "segments", "seq_lengths": "segments", "cache": "kv_cache",
                        "lse": "lse", "chunk": "chunk"}


@st.composite
def feature_specs(draw, *, allow=(), require=(), masks: bool = False, bias: bool = False,
                  key_padding: bool = False, causal: bool = False, fully_masked: bool = False,
                  custom_scale: bool = False, cross: bool = True,
                  logit_scales=LOGIT_SCALES, sizes=None) -> CaseSpec:
    """Draw a :class:`CaseSpec` with spec 1.2 features (names of :data:`FEATURE_CAPABILITIES`):
    each of ``require`` always, each of ``allow`` sometimes; ``require`` may also name what
    :func:`case_specs` can require (:data:`REQUIRABLE`); the other flags as for :func:`case_specs`. The values come from the menus of :mod:`~mhaspec.conformance.features`,
    edge cases included (windows of 0 and wider than L_k, one segment and a segment per token, an
    empty cache and one longer than the new keys, slopes of 0, tiny and huge soft caps). A cache
    excludes segments and sequence lengths (CACHE-2) and makes the diagonal bottom-right; masks
    then cover the present cache's L_K keys."""
    unknown = sorted((set(allow) - set(FEATURE_CAPABILITIES))
                     | (set(require) - set(FEATURE_CAPABILITIES) - set(REQUIRABLE)))
    if unknown:
        raise ValueError(f"unknown features {unknown} (known: {sorted(FEATURE_CAPABILITIES)}; "
                         f"require also: {list(REQUIRABLE)})")
    want = {f for f in FEATURE_CAPABILITIES if f in require or (f in allow and draw(st.booleans()))}
    if "cache" in want and not {"segments", "seq_lengths"}.isdisjoint(want):
        if "cache" in require:
            want -= {"segments", "seq_lengths"}
        else:
            want.discard("cache")
    spec = draw(case_specs(masks=masks, bias=bias, key_padding=key_padding, causal=causal,
                           fully_masked=fully_masked, custom_scale=custom_scale, cross=cross,
                           logit_scales=logit_scales, sizes=sizes,
                           require=tuple(r for r in require if r in REQUIRABLE)))
    f = features
    changes: dict = {}
    if "gqa" in want:
        changes["kv_heads"] = draw(st.sampled_from(
            [g for g in range(1, spec.heads + 1) if spec.heads % g == 0]))
    if "softcap" in want:
        changes["softcap"] = draw(st.sampled_from(f.SOFTCAPS))
    if "window" in want:
        changes["window"] = (draw(st.sampled_from(f.WINDOW_SIDES)),
                             draw(st.sampled_from(f.WINDOW_SIDES)))
    if "alibi" in want:
        changes["alibi"] = draw(st.sampled_from(f.ALIBI_KINDS))
    if "segments" in want:
        changes["segments"] = draw(st.sampled_from(f.SEGMENT_KINDS))
    if "seq_lengths" in want:
        changes["seq_lengths"] = draw(st.sampled_from(f.LENGTH_KINDS))
    if "lse" in want:
        changes["lse"] = True
    if "chunk" in want:
        changes["chunk"] = draw(st.sampled_from(f.CHUNK_SIZES))
    if "cache" in want:
        past = draw(st.sampled_from(f.PAST_LENGTHS))
        changes.update(past_len=past, past_valid=draw(st.booleans()),
                       **{name: _over_keys(getattr(spec, name), spec.len_k + past)
                          for name in ("mask_shape", "bias_shape", "legacy_shape")})
        if spec.causal == "top_left":
            changes["causal"] = "bottom_right"
    spec = spec._replace(**changes)
    if features.needs_diagonal(spec):
        if spec.causal is None and spec.past_len is None:
            spec = spec._replace(alignment=draw(st.sampled_from(oracle.CAUSAL_ALIGNMENTS)))
        elif draw(st.booleans()):  # the same diagonal named twice is allowed
            spec = spec._replace(alignment=spec.causal or "bottom_right")
    return spec


def _over_keys(shape, l_keys: int):
    """A mask shape over L_k as one over the present cache's L_K keys (a broadcast axis stays)."""
    if shape is None or shape[-1] == 1:
        return shape
    return tuple(shape[:-1]) + (l_keys,)


#: The source document's example: (32, 50, 512) inputs, 8 heads, self-attention (MHA-5).
REFERENCE_EXAMPLE = CaseSpec(batch=32, heads=8, len_q=50, len_k=50, d_k=64, d_v=64, d_model=512,
                             k_dim=512, v_dim=512, d_out=512, self_attention=True, use_bias=True,
                             seed=2017)
