"""The oracle of spec 1.4's serving step: merging partial attention states (MERGE).

Axis legend: B batch, h heads, L_q queries, d_v value width, n states merged, T = B * L_q query
tokens (the ``"tokens"`` lse layout).

Written from MERGE-1..4's equations, row by row in float64 (or a lower ``precision``, as
:func:`mhaspec.spec.oracle.rounding` defines it, for NUM-3's naive run); it shares no code with
any backend. It does not validate its input: the suite feeds it valid states.
"""

from __future__ import annotations

import math

import numpy as np

from .oracle import attention_result, rounding

#: MERGE-3: the conventions and their values (the first of each is LSE-1's)
LSE_BASES = ("e", "2")
EMPTY_LSES = ("-inf", "+inf")
LSE_LAYOUTS = ("batch", "tokens")


def to_natural(lse, *, batch: int, lse_base: str = "e", empty_lse: str = "-inf",
               lse_layout: str = "batch") -> np.ndarray:
    """A log-sum-exp in the conventions of MERGE-3 -> LSE-1's: (B, h, L_q), natural logarithm,
    -inf on an empty row. ``batch``: B (to unpack the ``"tokens"`` layout (h, T))."""
    lse = np.array(lse, dtype=np.float64)
    if lse_layout == "tokens":
        h, t = lse.shape
        lse = lse.reshape(h, batch, t // batch).transpose(1, 0, 2)
    if empty_lse == "+inf":
        lse = np.where(lse == np.inf, -np.inf, lse)
    if lse_base == "2":
        lse = lse * math.log(2.0)
    return lse


def from_natural(lse, *, lse_base: str = "e", empty_lse: str = "-inf",
                 lse_layout: str = "batch") -> np.ndarray:
    """LSE-1's log-sum-exp (B, h, L_q) -> the conventions of MERGE-3 (inverse of
    :func:`to_natural`)."""
    lse = np.array(lse, dtype=np.float64)
    if lse_base == "2":
        lse = lse / math.log(2.0)
    if empty_lse == "+inf":
        lse = np.where(lse == -np.inf, np.inf, lse)
    if lse_layout == "tokens":
        b, h, l_q = lse.shape
        lse = lse.transpose(1, 0, 2).reshape(h, b * l_q)
    return lse


def merge_states(outputs, lses, *, sinks=None, lse_base: str = "e", empty_lse: str = "-inf",
                 lse_layout: str = "batch", precision: str = "float64"):
    """MERGE-1..4: n partial states -> the state over their union, ``(output, lse)``.

    outputs: n arrays (B, h, L_q, d_v); lses: n arrays in the call's conventions (MERGE-3);
    sinks: (h,) natural logits added once after the merge (MERGE-4), or None. The lse returned
    is in the call's conventions. Per row: lse = log sum_m exp(lse_m), O = sum_m exp(lse_m - lse)
    O_m; a row empty in every state is (0, -inf). ``precision``: the working precision of every
    step (NUM-3's naive run); the conversions of MERGE-3 are exact scalings done in float64.
    """
    dtype, rnd = rounding(precision)
    b = np.shape(outputs[0])[0]
    outs = [rnd(np.asarray(o, dtype=dtype)) for o in outputs]
    nat = [rnd(to_natural(x, batch=b, lse_base=lse_base, empty_lse=empty_lse,
                          lse_layout=lse_layout).astype(dtype)) for x in lses]
    if sinks is not None:  # the sink: one more term of the denominator, carrying no value
        h = outs[0].shape[1]
        nat.append(rnd(np.broadcast_to(np.asarray(sinks, dtype=dtype).reshape(1, h, 1),
                                       nat[0].shape).astype(dtype)))
        outs.append(np.zeros_like(outs[0]))
    out = np.zeros_like(outs[0])
    lse = np.full(nat[0].shape, -np.inf, dtype=dtype)
    for row in np.ndindex(*lse.shape):
        terms = [x[row] for x in nat]
        finite = [t for t in terms if t != -np.inf]
        if not finite:
            continue  # an empty union: (0, -inf)
        top = max(finite)
        total = dtype(0)
        for t in finite:
            total = rnd(np.asarray(total + rnd(np.exp(np.asarray(t - top, dtype=dtype)))))[()]
        lse[row] = rnd(np.asarray(top + rnd(np.log(np.asarray(total, dtype=dtype)))))[()]
        acc = np.zeros(out.shape[-1], dtype=dtype)
        for t, o in zip(terms, outs):
            if t == -np.inf:
                continue
            w = rnd(np.exp(np.asarray(t - lse[row], dtype=dtype)))
            acc = rnd(acc + rnd(w * o[row]))
        out[row] = acc
    merged = from_natural(lse, lse_base=lse_base, empty_lse=empty_lse, lse_layout=lse_layout)
    return out, merged


# -- PAGE: the paged KV cache -------------------------------------------------------------------------
# Axis legend: P pages, S page size (slots per page), g key/value heads, M table entries per item,
# T packed query tokens, n_b the queries and L_b the keys of item b.

def gather_pages(pages, block_table, seq_lens, b: int) -> np.ndarray:
    """PAGE-1: item ``b``'s keys (or values) (g, L_b, d): key j is
    ``pages[block_table[b, j // S], j % S]`` for j < ``seq_lens[b]``. pages (P, S, g, d)."""
    pages = np.asarray(pages)
    size = pages.shape[1]
    rows = [pages[int(block_table[b][j // size]), j % size] for j in range(int(seq_lens[b]))]
    if not rows:
        return np.zeros((pages.shape[2], 0, pages.shape[3]), dtype=pages.dtype)
    return np.stack(rows, axis=1)


def paged_attention(q, k_pages, v_pages, block_table, seq_lens, query_start_loc, *,
                    causal: bool = False, scale=None, precision: str = "float64",
                    info: dict | None = None) -> np.ndarray:
    """PAGE-1: q (T, h, d_k) packed, item b's queries the rows ``query_start_loc[b]`` to
    ``query_start_loc[b + 1]``; k_pages (P, S, g, d_k), v_pages (P, S, g, d_v); block_table
    (B, M); seq_lens (B,) -> output (T, h, d_v): each item's queries attend its gathered keys
    (:func:`gather_pages`) as CACHE's call does, the queries the last n_b tokens (bottom-right).
    ``info``: receives the largest ``logit_condition`` of the items (NUM-3's condition)."""
    q = np.asarray(q)
    out = np.zeros((q.shape[0], q.shape[1], np.shape(v_pages)[3]))
    for b in range(len(seq_lens)):
        start, stop = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if stop == start:
            continue
        k = gather_pages(k_pages, block_table, seq_lens, b)[None]
        v = gather_pages(v_pages, block_table, seq_lens, b)[None]
        qb = q[start:stop].transpose(1, 0, 2)[None]
        item: dict = {}
        res = attention_result(qb, k, v, causal="bottom_right" if causal else None, scale=scale,
                               precision=precision, info=item)
        if info is not None:
            info["logit_condition"] = max(info.get("logit_condition", 0.0),
                                          item.get("logit_condition", 0.0))
        out[start:stop] = res.output[0].transpose(1, 0, 2)
    return out


def write_pages(k_pages, v_pages, k, v, slot_mapping) -> tuple[np.ndarray, np.ndarray]:
    """PAGE-3: new pages with token n's key and value (k, v: (N, g, d)) in slot
    ``slot_mapping[n]`` (page ``slot // S``, position ``slot % S``); every other slot as it was."""
    k_new, v_new = np.array(k_pages, copy=True), np.array(v_pages, copy=True)
    size = k_new.shape[1]
    for n, slot in enumerate(np.asarray(slot_mapping)):
        k_new[int(slot) // size, int(slot) % size] = k[n]
        v_new[int(slot) // size, int(slot) % size] = v[n]
    return k_new, v_new
