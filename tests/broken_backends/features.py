"""Spec 1.2 features: the oracle-backed reference backend with one mistake each (soft-cap,
window, chunks, ALiBi, segments, cache, lse)."""

from __future__ import annotations

import numpy as np

from mhaspec.spec import oracle

from .base import BrokenFeature


class SoftcapAfterTheMask(BrokenFeature):
    """Caps the logits after masking (masked -inf becomes -c: masked keys get weight e^-c / sum)
    in scaled dot-product attention with boolean masks only (the other features: as specified)."""

    def _attention(self, q, k, v, *, softcap=None, mask=None, key_padding_mask=None, causal=None,
                   bias=None, legacy_mask=None, scale=None, **features):
        plain = softcap is None or any(x is not None for x in features.values()) or (
            mask is None and key_padding_mask is None and causal is None) or k.shape[1] != q.shape[1]
        if plain:
            return super()._attention(q, k, v, softcap=softcap, mask=mask, bias=bias,
                                      legacy_mask=legacy_mask, key_padding_mask=key_padding_mask,
                                      causal=causal, scale=scale, **features)
        b, h, l_q, d_k = q.shape
        s = (1.0 / np.sqrt(d_k) if scale is None else scale) * np.matmul(q, np.swapaxes(k, -1, -2))
        for term in (bias, None if legacy_mask is None else legacy_mask * -1e9):
            s = s if term is None else s + term
        allowed = oracle.allowed_mask(b, h, l_q, k.shape[2], mask=mask,
                                      key_padding_mask=key_padding_mask, causal=causal)
        s = softcap * np.tanh(np.where(allowed, s, -np.inf) / softcap)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        weights = (e / e.sum(axis=-1, keepdims=True)).astype(q.dtype)
        lse = (np.log(np.exp(s).sum(axis=-1))).astype(q.dtype)
        return oracle.AttentionResult(np.matmul(weights, v), weights, lse, None, None, None)


class WindowOffByOne(BrokenFeature):
    """Lets one key too many in on the left of the window (j >= i - left - 1)."""

    def _attention(self, q, k, v, *, window=None, **kw):
        return super()._attention(q, k, v, window=_wider_left(window), **kw)

    def _mha(self, query, key, value, params, *, window=None, **kw):
        return super()._mha(query, key, value, params, window=_wider_left(window), **kw)


def _wider_left(window):
    """(left + 1, right) for a valid window with a bounded left side (others are left for the
    oracle to reject, WIN-2)."""
    if (isinstance(window, tuple) and len(window) == 2 and type(window[0]) is int
            and window[0] >= 0):
        return (window[0] + 1, window[1])
    return window


class ChunkAsWindow(BrokenFeature):
    """Reads ``chunk=C`` as the sliding window (C - 1, 0): each query sees the C keys up to it
    instead of the keys of its own chunk (CHUNK-3: a chunk is not a window)."""

    def _attention(self, q, k, v, *, chunk=None, window=None, **kw):
        return super()._attention(q, k, v, **_chunk_as_window(chunk, window), **kw)

    def _mha(self, query, key, value, params, *, chunk=None, window=None, **kw):
        return super()._mha(query, key, value, params, **_chunk_as_window(chunk, window), **kw)


def _valid_chunk(chunk) -> bool:
    return type(chunk) is int and chunk >= 1


def _chunk_as_window(chunk, window) -> dict:
    """{window: (C - 1, 0)} for a valid chunk and no window (others left for the oracle)."""
    if _valid_chunk(chunk) and window is None:
        return {"window": (chunk - 1, 0), "chunk": None}
    return {"window": window, "chunk": chunk}


def index_chunks(len_q: int, len_k: int, chunk: int, diagonal, *, truncate: bool = False):
    """(L_q, L_k) bool: chunks on array indices, query i at i (+ L_k - L_q bottom-right); with
    ``truncate`` the chunk index rounds toward zero (C's integer division) instead of down."""
    i = np.arange(len_q)[:, None] + (len_k - len_q if diagonal == "bottom_right" else 0)
    j = np.arange(len_k)[None, :]
    if truncate:
        return np.trunc(i / chunk) == np.trunc(j / chunk)
    return i // chunk == j // chunk


class _ChunkOnIndices(BrokenFeature):
    """Applies ``chunk`` as a boolean mask on array indices (see :func:`index_chunks`) in calls
    :meth:`applies` to; the other calls are the reference's."""

    truncate = False

    def applies(self, kw) -> bool:
        raise NotImplementedError

    def _folded(self, len_q, len_k, kw):
        chunk = kw.get("chunk")
        if not (_valid_chunk(chunk) and kw.get("past_key") is None and self.applies(kw)):
            return kw
        diagonal = kw.get("causal") or kw.get("alignment")
        if diagonal not in ("top_left", "bottom_right"):
            return kw
        allowed = index_chunks(len_q, len_k, chunk, diagonal, truncate=self.truncate)
        mask = kw.get("mask")
        mask = allowed if mask is None else np.asarray(mask, bool) & allowed
        return {**kw, "chunk": None, "mask": mask,
                "alignment": kw.get("alignment") or kw.get("causal")}

    def _attention(self, q, k, v, **kw):
        return super()._attention(q, k, v, **self._folded(q.shape[2], k.shape[2], kw))

    def _mha(self, query, key, value, params, **kw):
        return super()._mha(query, key, value, params,
                            **self._folded(query.shape[1], key.shape[1], kw))


class ChunksFromThePaddedStart(_ChunkOnIndices):
    """Counts chunks on array indices when segments or lengths are given, not from each
    sequence's first token (Hugging Face's ``_legacy_chunked_overlay``, CHUNK-3)."""

    def applies(self, kw) -> bool:
        return any(kw.get(n) is not None for n in ("q_segment_ids", "kv_segment_ids",
                                                    "query_seq_lengths", "key_value_seq_lengths"))


class ChunkIndexTruncated(_ChunkOnIndices):
    """Takes a query's chunk as its position divided by C rounded toward zero (C's integer
    division): with bottom-right and L_q > L_k, queries at positions -C + 1 .. -1 join chunk 0."""

    truncate = True

    def applies(self, kw) -> bool:
        return not any(kw.get(n) is not None for n in ("q_segment_ids", "kv_segment_ids",
                                                        "query_seq_lengths",
                                                        "key_value_seq_lengths"))


class AlibiSignFlipped(BrokenFeature):
    """Adds +m |i - j| instead of -m |i - j| (the slopes' sign flipped)."""

    def _attention(self, q, k, v, *, alibi_slopes=None, **kw):
        return super()._attention(q, k, v, alibi_slopes=_negated(alibi_slopes), **kw)

    def _mha(self, query, key, value, params, *, alibi_slopes=None, **kw):
        return super()._mha(query, key, value, params, alibi_slopes=_negated(alibi_slopes), **kw)


def _negated(slopes):
    """-slopes for real slopes (others are left for the oracle to reject, ALIBI-3)."""
    return slopes if slopes is None or np.asarray(slopes).dtype.kind not in "fiu" else -np.asarray(slopes)


def _first_item_ids(kv_segment_ids):
    """Every batch item given batch item 0's key segment ids (ids compared across items)."""
    if kv_segment_ids is None or np.ndim(kv_segment_ids) != 2:
        return kv_segment_ids
    return np.broadcast_to(kv_segment_ids[:1], np.shape(kv_segment_ids)).copy()


class SegmentsAcrossBatch(BrokenFeature):
    """Compares each query's segment id with batch item 0's key ids (a flattened comparison)."""

    def _attention(self, q, k, v, *, kv_segment_ids=None, **kw):
        return super()._attention(q, k, v, kv_segment_ids=_first_item_ids(kv_segment_ids), **kw)

    def _mha(self, query, key, value, params, *, kv_segment_ids=None, **kw):
        return super()._mha(query, key, value, params,
                            kv_segment_ids=_first_item_ids(kv_segment_ids), **kw)


class CacheOffsetZero(BrokenFeature):
    """With a cache, places query i at position i instead of past_length + i (causal, window and
    ALiBi top-left on the present cache); the present cache itself is right."""

    def _attention(self, q, k, v, *, past_key=None, past_value=None, past_lengths=None,
                   key_padding_mask=None, causal=None, alignment=None, **kw):
        if past_key is None:
            return super()._attention(q, k, v, past_value=past_value, past_lengths=past_lengths,
                                      key_padding_mask=key_padding_mask, causal=causal,
                                      alignment=alignment, **kw)
        right = super()._attention(q, k, v, past_key=past_key, past_value=past_value,
                                   past_lengths=past_lengths, key_padding_mask=key_padding_mask,
                                   causal=causal, alignment=alignment, **kw)
        b, l_keys = q.shape[0], right.present_key.shape[2]
        valid = np.arange(l_keys)[None, :] < right.present_lengths[:, None]
        if key_padding_mask is not None:
            valid = valid & key_padding_mask
        top_left = "top_left" if causal is not None or alignment is not None or \
            kw.get("window") is not None or kw.get("alibi_slopes") is not None else None
        wrong = super()._attention(q, right.present_key, right.present_value,
                                   key_padding_mask=valid,
                                   causal=None if causal is None else "top_left",
                                   alignment=top_left, **kw)
        return wrong._replace(present_key=right.present_key, present_value=right.present_value,
                              present_lengths=right.present_lengths)


class LseOfTheUnmaskedRow(BrokenFeature):
    """Returns the log-sum-exp over every key of the row, ignoring masks, segments, causal and
    window (the output is right)."""

    def _attention(self, q, k, v, **kw):
        right = super()._attention(q, k, v, **kw)
        if kw.get("past_key") is not None:
            return right
        loose = {n: x for n, x in kw.items() if n in ("scale", "softcap", "bias", "legacy_mask")}
        return right._replace(lse=super()._attention(q, k, v, **loose).lse)
