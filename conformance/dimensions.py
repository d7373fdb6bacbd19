"""The dimensions of the condition spaces and the values each takes, in their order: what a
certificate's "Conditions that ran" table lists (:mod:`mhaspec.certificate_markdown`), readable
without the suite (no pytest, no Hypothesis).

:mod:`.conditions` declares the spaces over these dimensions (its own ``DIMENSIONS`` must equal
this one: tests/test_certificate_markdown.py checks it); when conditions.py is split into one
module per job, it imports this one instead.
"""

from __future__ import annotations

#: dimension -> its values, in the order a table lists them
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "op": ("sdpa", "mha"),
    # L_q vs L_k: decoding (L_q = 1 < L_k), L_q < L_k (L_q > 1), prefill (L_q = L_k), L_q > L_k
    "lengths": ("decode", "L_q<L_k", "L_q=L_k", "L_q>L_k"),
    # the ways a query row's allowed set becomes empty (MASK-9)
    "empty_by": ("mask", "causal_bottom_right", "key_padding", "window", "segments",
                 "seq_lengths", "minus_inf_bias"),
    "bias": ("none", "finite"),
    "alignment": ("top_left", "bottom_right"),
    "past": ("all_valid", "per_item_lengths"),
    "causal": ("top_left", "bottom_right"),
    "zero": ("batch", "len_q", "len_k", "batch+len_k"),  # the sizes that are 0 (SHAPE-4)
    "degenerate": ("L_k = 1", "L_q = 1", "h = 1", "h = d_model"),  # SHAPE-5's degenerate sizes
    "heads": ("1", ">1"),
    "width": ("1", ">1"),  # d_k
    "group": ("g=h", "1<g<h", "g=1"),  # key/value heads g of h query heads
    "empty_rows": ("none", "some"),
    "masked_by": ("none", "mask", "empty_row"),
    "cap": ("tiny", "moderate", "huge"),  # soft caps by size
    "window": ("(1, 0)", "(0, 2)", "(3, 1)", "(None, 0)", "(2, None)", "(None, 1)"),  # window sides (left, right)
    "segments": ("one", "per_token", "packed", "scattered"),
    "seq_lengths": ("query", "key_value", "both"),
    "nonfinite": ("-inf", "inf", "nan"),
    "shared": ("self", "key=value", "query=key"),
    "step": ("1", "2", "3"),  # tokens per call when decoding through a cache (CACHE-3)
    "argument": (),  # the invalid argument (ERR): each clause's own values
    # spec 1.4: width 1 with biases (PARAM-1, MHA), merges (MERGE), paged caches (PAGE)
    "bias_broadcast": ("none", "batch", "heads", "queries", "batch+heads", "batch+heads+queries"),
    "slopes": ("(h,)", "(B, h)"),
    "with_causal": ("no", "yes"),
    "head_widths": ("d_k=d_v=1", "wider"),
    "projection_bias": ("none", "with"),
    "states": ("1", "2", "4"),
    "empty_state": ("none", "first", "last", "all"),
    "lse_base": ("e", "2"),
    "empty_lse": ("-inf", "+inf"),
    "lse_layout": ("batch", "tokens"),
    "sink": ("none", "sink"),
    "page_size": ("1", "divides", "does_not_divide"),
    "pages": ("in_order", "shuffled", "shared"),
    "unused": ("zero", "stale", "nonfinite"),
    "paged_causal": ("no", "yes"),
}
