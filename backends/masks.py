"""Mask translation: the spec's masking arguments to the native forms attention ops take.

Axis legend: B batch, h heads, L_q / L_k query / key lengths.

The spec (chapter MASK) gives ``mask`` (boolean, True = may attend, broadcastable to
``(B, h, L_q, L_k)``), ``bias`` (float, added to the scaled logits), ``legacy_mask`` (float, 1 =
blocked, added times -1e9, MASK-3), ``key_padding_mask`` (``(B, L_k)``, True = key present) and
``causal`` (``"top_left"`` / ``"bottom_right"``, MASK-6/7). Native ops want one of:

* boolean, True = may attend (torch SDPA, jax, Keras, ONNX): :func:`allowed_mask`;
* boolean, True = blocked (``nn.MultiheadAttention``): :func:`blocked` of it;
* additive, -inf or a finite fill: :func:`additive_mask` and :func:`fill_blocked`;
* per-batch key lengths (jax ``key_value_seq_lengths``, ONNX ``nonpad_kv_seqlen``):
  :func:`key_lengths`, and back with :func:`lengths_mask`;
* a causal flag: :func:`native_causal_serves` says when it computes the spec's ``causal``; else
  :func:`causal_mask` explicitly (bottom-right with L_q != L_k under a top-left flag);
* a top-left index window (jax ``local_window_size``): :func:`native_window`, when exact;
* per-batch query and key lengths for spec 1.2's segments and lengths (jax
  ``query_seq_lengths`` / ``key_value_seq_lengths``): :func:`native_lengths`, when exact;
* segments, lengths, windows and chunks of spec 1.2 and 1.4 as one boolean: :func:`structural_mask`.

The array helpers take and return the caller's arrays (NumPy, torch, JAX including tracers,
TensorFlow; see :mod:`.array_ops`); ``like`` is an array of the computation (q) whose dtype and
device results take. Arguments are assumed validated (``mhaspec.backends.validation``).
"""

from __future__ import annotations

import math

import numpy as np

from . import positions
from .array_ops import ops_for, shape_of

LEGACY_MASK_VALUE = -1e9  # MASK-3: the source document's constant


def is_default_scale(scale: float, d_k: int) -> bool:
    """Whether ``scale`` (the default already applied) is 1/sqrt(d_k): for ops with no scale
    argument (``nn.MultiheadAttention``, Keras) or whose default is better left alone."""
    return math.isclose(scale, 1.0 / math.sqrt(d_k), rel_tol=1e-12, abs_tol=0.0)


def native_causal_serves(causal, len_q: int, len_k: int, native: str = "top_left") -> bool:
    """Whether an op's causal flag, aligned ``native`` (torch ``is_causal``, jax, Keras
    ``use_causal_mask`` and ONNX without a cache are ``"top_left"``, MASK-6; FlashAttention
    ``"bottom_right"``, MASK-7), computes the spec's ``causal``: the same alignment, or either when
    ``L_q == L_k`` (the two coincide). False for ``causal=None``."""
    return causal is not None and (causal == native or len_q == len_k)


def causal_mask(len_q: int, len_k: int, alignment: str) -> np.ndarray:
    """``(L_q, L_k)`` boolean NumPy, True = may attend: key j for query i iff ``j <= i + o`` with
    ``o = 0`` (``"top_left"``, MASK-6) or ``L_k - L_q`` (``"bottom_right"``, MASK-7)."""
    offset = 0 if alignment == "top_left" else len_k - len_q
    return np.arange(len_k)[None, :] <= np.arange(len_q)[:, None] + offset


def rank4(x):
    """A mask or bias broadcastable to ``(B, h, L_q, L_k)`` left-padded to rank 4 (None stays)."""
    if x is None:
        return None
    shape = shape_of(x)
    return x if len(shape) >= 4 else ops_for(x).reshape(x, (1,) * (4 - len(shape)) + shape)


def allowed_mask(len_q: int, len_k: int, *, like, mask=None, key_padding_mask=None,
                 causal=None):
    """The AND of the boolean conditions (MASK-1, MASK-5, MASK-6/7, MASK-8) as one rank-4 boolean,
    True = may attend, or None when nothing is masked. ``key_padding_mask (B, L_k)`` becomes
    ``(B, 1, 1, L_k)``; ``causal`` (an alignment or None) an explicit ``(1, 1, L_q, L_k)``
    constant on ``like``'s device. Pass ``causal=None`` for the part a native flag computes."""
    allowed = rank4(mask)
    if key_padding_mask is not None:
        ops = ops_for(key_padding_mask)
        kpm = ops.reshape(key_padding_mask, (shape_of(key_padding_mask)[0], 1, 1, len_k))
        allowed = kpm if allowed is None else allowed & kpm
    if causal is not None:
        tri = ops_for(like).constant(causal_mask(len_q, len_k, causal)[None, None], like)
        allowed = tri if allowed is None else allowed & tri
    return allowed


def additive_mask(*, like, bias=None, legacy_mask=None):
    """``bias + legacy_mask * -1e9`` (MASK-2, MASK-3) in ``like``'s dtype, rank 4, or None."""
    terms = [t for t in (bias, None if legacy_mask is None else legacy_mask * LEGACY_MASK_VALUE)
             if t is not None]
    if not terms:
        return None
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return rank4(ops_for(like).cast(total, like))


def fill_blocked(allowed, *, like, additive=None, fill: float = -math.inf):
    """One float mask for ops that take a single additive mask: ``additive`` (or 0) where
    ``allowed``, ``fill`` elsewhere (``-inf``, or a finite value such as ``-1e9`` or the dtype's
    lowest for ops that need one), in ``like``'s dtype. ``allowed`` None: ``additive`` or 0."""
    ops = ops_for(like)
    base = ops.zeros((), like) if additive is None else additive
    if allowed is None:
        return base
    return ops.where(allowed, base, fill)


def blocked(allowed):
    """The inverted polarity, True = may *not* attend (``nn.MultiheadAttention``'s ``attn_mask``
    and ``key_padding_mask``, Hugging Face's ``~mask``); None stays None."""
    return None if allowed is None else ops_for(allowed).logical_not(allowed)


def key_lengths(key_padding_mask) -> np.ndarray | None:
    """``(B,)`` int32 lengths when the NumPy ``key_padding_mask (B, L_k)`` is a prefix in every row
    (True for keys ``j < n_b``, False after): the per-batch length form (jax
    ``key_value_seq_lengths``, ONNX ``nonpad_kv_seqlen``). None when it is not a prefix (then only
    a boolean mask expresses it)."""
    kpm = np.asarray(key_padding_mask, bool)
    lengths = kpm.sum(axis=-1)
    prefix = np.arange(kpm.shape[-1])[None, :] < lengths[:, None]
    return lengths.astype(np.int32) if np.array_equal(kpm, prefix) else None


def lengths_mask(lengths, length: int) -> np.ndarray:
    """``(B, L)`` boolean, True for ``t < lengths[b]``: the key padding mask of per-batch lengths
    (SEG-2), the inverse of :func:`key_lengths`."""
    return np.arange(length)[None, :] < np.asarray(lengths, np.int64).reshape(-1, 1)


def native_window(window, alignment: str, len_q: int, len_k: int):
    """The spec's ``window=(left, right)`` (None = unbounded, WIN-1) as an op's top-left window on
    array indices, ``i - left <= j <= i + right`` (jax ``local_window_size``, WIN-3), when that is
    exact: the diagonal is top-left, or bottom-right with ``L_q == L_k``; an unbounded side becomes
    ``max(L_q, L_k)``. None when it is not exact (bottom-right with ``L_q != L_k``: pass
    :func:`structural_mask` instead). Without segments or lengths, or with lengths and top-left
    (positions are then indices, SEG-3)."""
    if alignment != "top_left" and len_q != len_k:
        return None
    unbounded = max(len_q, len_k)
    left, right = window
    return (unbounded if left is None else int(left), unbounded if right is None else int(right))


def native_lengths(pos: "positions.Positions | None") -> tuple | None:
    """Spec 1.2's segments and lengths (SEG-1..3), given as the validated
    :class:`~.positions.Positions`, as per-batch ``(query_lengths, key_lengths)`` (each ``(B,)``
    int32, or None where every token is valid) when that form is exact: every valid token in one
    segment shared by queries and keys, valid tokens a prefix of each row, and positions equal to
    array indices (so causal masks and windows apply to indices, top-left). None when it is not
    exact (then pass :func:`structural_mask`); ``(None, None)`` without segments or lengths."""
    if pos is None:
        return None, None
    lengths = []
    for valid, seg, place in ((pos.query_valid, pos.query_segment, pos.query_pos),
                              (pos.key_valid, pos.key_segment, pos.key_pos)):
        n = valid.sum(axis=-1)
        index = np.arange(valid.shape[-1])[None, :]
        if not (np.array_equal(valid, index < n[:, None]) and np.all((place == index) | ~valid)):
            return None
        lengths.append(None if valid.all() else n.astype(np.int32))
    for b in range(pos.query_valid.shape[0]):
        ids = np.concatenate([pos.query_segment[b][pos.query_valid[b]],
                              pos.key_segment[b][pos.key_valid[b]]])
        if np.unique(ids).size > 1:
            return None
    return tuple(lengths)


def structural_mask(batch: int, len_q: int, len_k: int, *, causal=None, window=None, chunk=None,
                    alignment=None, q_segment_ids=None, kv_segment_ids=None,
                    query_seq_lengths=None, key_value_seq_lengths=None) -> np.ndarray | None:
    """Spec 1.2's boolean conditions on positions (SEG-1, SEG-2, SEG-3, WIN-1, CHUNK-1, MASK-6/7
    within segments) as one ``(B, 1, L_q, L_k)`` NumPy boolean, True = may attend, or None when
    none is given. Integer arguments are NumPy (``to_numpy`` them first); ``alignment`` defaults to
    ``causal``'s. Move it to the device with ``ops_for(q).constant``."""
    given = (causal, window, chunk, q_segment_ids, kv_segment_ids, query_seq_lengths,
             key_value_seq_lengths)
    if all(a is None for a in given):
        return None
    alignment = alignment or causal
    pos = positions.token_positions(batch, len_q, len_k, alignment=alignment,
                                    q_segment_ids=q_segment_ids, kv_segment_ids=kv_segment_ids,
                                    query_seq_lengths=query_seq_lengths,
                                    key_value_seq_lengths=key_value_seq_lengths)
    return positions.structural_allowed(pos, causal=causal is not None, window=window,
                                        chunk=chunk)[:, None]
