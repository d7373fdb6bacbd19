"""Input validation (chapter ERR of the spec) through mhaspec's public validation API: a ValueError
that names the argument and shows its shape, identical to the in-repo backends' messages."""

from __future__ import annotations

from mhaspec.backends import MHAParams
from mhaspec.backends.validation import arg, check_heads
from mhaspec.backends.validation import check_mha as _check_mha
from mhaspec.backends.validation import check_sdpa as _check_sdpa

FLOATS = ("float64", "float32", "float16")  # NumPy has no bfloat16


def _masks(**masks) -> dict:
    return {name: arg(name, x) for name, x in masks.items()}


def check_split_heads(x, num_heads) -> None:
    check_heads("split_heads", arg("x", x), num_heads)


def check_combine_heads(x) -> None:
    check_heads("combine_heads", arg("x", x))


def check_sdpa(q, k, v, *, mask, bias, legacy_mask, key_padding_mask, causal, scale) -> None:
    _check_sdpa(arg("q", q), arg("k", k), arg("v", v), causal=causal, scale=scale,
                **_masks(mask=mask, bias=bias, legacy_mask=legacy_mask,
                         key_padding_mask=key_padding_mask))


def check_mha(query, key, value, p: MHAParams, *, num_heads, mask, bias, legacy_mask,
              key_padding_mask, causal, scale) -> None:
    params = {name: arg(name, x) for name, x in p._asdict().items()}
    _check_mha(arg("query", query), arg("key", key), arg("value", value), params,
               num_heads=num_heads, causal=causal, scale=scale,
               **_masks(mask=mask, bias=bias, legacy_mask=legacy_mask,
                        key_padding_mask=key_padding_mask))
