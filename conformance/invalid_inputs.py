"""The catalogue of invalid calls of chapter ERR (``BAD_INPUTS``) and how to make one.

Each entry is built from one valid call by changing one argument; the message must name that
argument (ERR-1) and, where the argument has a shape, print it. ``conformance/test_errors.py``
checks every backend against it; ``mhaspec errors-table`` renders what one backend raises.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths, d_model / k_dim /
v_dim input widths, d_out output width.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mhaspec.backends import MHAParams

from .strategies import CaseSpec

RNG = np.random.default_rng(7)
# valid SDPA call: B=2, h=2, L_q=3, L_k=4, d_k=4, d_v=5
SDPA = {"q": RNG.standard_normal((2, 2, 3, 4)), "k": RNG.standard_normal((2, 2, 4, 4)),
        "v": RNG.standard_normal((2, 2, 4, 5))}
# valid MHA call: d_model=8, k_dim=6, v_dim=7, h=2, d_k=4, d_v=3, d_out=5
MHA = {"query": RNG.standard_normal((2, 3, 8)), "key": RNG.standard_normal((2, 4, 6)),
       "value": RNG.standard_normal((2, 4, 7)),
       "w_q": RNG.standard_normal((8, 8)), "w_k": RNG.standard_normal((6, 8)),
       "w_v": RNG.standard_normal((7, 6)), "w_o": RNG.standard_normal((6, 5)),
       "b_q": RNG.standard_normal(8), "b_k": RNG.standard_normal(8), "b_v": RNG.standard_normal(6),
       "b_o": RNG.standard_normal(5)}


class Bad(NamedTuple):
    """One invalid call: replace ``changes`` in the valid call; the message must name ``arg``."""

    what: str
    arg: str
    changes: dict
    dtype_of: dict = {}  # argument -> dtype name ("other" = a float dtype other than the impl's)


def _rand(*shape):
    return RNG.standard_normal(shape)


#: the sizes of the valid calls the invalid ones are made from, as recorded with each (conditions)
VALID = {"sdpa": CaseSpec(batch=2, heads=2, len_q=3, len_k=4, d_k=4, d_v=5),
         "mha": CaseSpec(batch=2, heads=2, len_q=3, len_k=4, d_k=4, d_v=3, d_model=8, k_dim=6,
                         v_dim=7, d_out=5)}

BAD_INPUTS: dict[tuple[str, str], list[Bad]] = {
    ("ERR-2", "mha"): [Bad("zero heads", "num_heads", {"num_heads": 0}),
                       Bad("heads do not divide h*d_k", "num_heads", {"num_heads": 3})],
    ("ERR-3", "sdpa"): [Bad("rank-3 q", "q", {"q": _rand(2, 3, 4)}),
                        Bad("rank-5 v", "v", {"v": _rand(1, 2, 2, 4, 5)})],
    ("ERR-3", "mha"): [Bad("rank-4 query", "query", {"query": _rand(2, 1, 3, 8)}),
                       Bad("rank-2 key", "key", {"key": _rand(4, 6)})],
    ("ERR-4", "sdpa"): [Bad("batch of k differs", "k", {"k": _rand(3, 2, 4, 4)}),
                        Bad("heads of v differ", "v", {"v": _rand(2, 3, 4, 5)})],
    ("ERR-4", "mha"): [Bad("batch of key differs", "key", {"key": _rand(3, 4, 6)})],
    ("ERR-5", "sdpa"): [Bad("L_k of v differs from k", "v", {"v": _rand(2, 2, 6, 5)})],
    ("ERR-5", "mha"): [Bad("L_k of value differs from key", "value", {"value": _rand(2, 5, 7)})],
    ("ERR-6", "sdpa"): [Bad("d_k of k differs from q", "k", {"k": _rand(2, 2, 4, 3)})],
    ("ERR-6", "mha"): [Bad("w_q rows != d_model", "w_q", {"w_q": _rand(7, 8)}),
                       Bad("w_k columns != w_q columns", "w_k", {"w_k": _rand(6, 6)}),
                       Bad("w_o rows != h*d_v", "w_o", {"w_o": _rand(5, 5)}),
                       Bad("b_o length != d_out", "b_o", {"b_o": _rand(4)})],
    ("ERR-7", "sdpa"): [Bad("float mask", "mask", {"mask": np.ones((3, 4))}, {"mask": "float32"}),
                        Bad("mask does not broadcast", "mask", {"mask": np.ones((3, 5), bool)}),
                        Bad("bias does not broadcast", "bias", {"bias": _rand(2, 3, 3, 4)}),
                        Bad("legacy mask does not broadcast", "legacy_mask",
                            {"legacy_mask": np.zeros((3, 5))}),
                        Bad("key padding mask (B, L_q)", "key_padding_mask",
                            {"key_padding_mask": np.ones((2, 3), bool)}),
                        Bad("float key padding mask", "key_padding_mask",
                            {"key_padding_mask": np.ones((2, 4))}, {"key_padding_mask": "float32"}),
                        Bad("unknown causal alignment", "causal", {"causal": "lower"}),
                        Bad("causal=True without alignment", "causal", {"causal": True})],
    ("ERR-7", "mha"): [Bad("mask does not broadcast", "mask", {"mask": np.ones((2, 1, 4, 4), bool)}),
                       Bad("bias does not broadcast", "bias", {"bias": _rand(2, 3, 3, 4)}),
                       Bad("legacy mask does not broadcast", "legacy_mask",
                           {"legacy_mask": np.zeros((3, 5))}),
                       Bad("unknown causal alignment", "causal", {"causal": "upper_left"})],
    ("ERR-8", "sdpa"): [Bad("integer q", "q", {"q": np.ones((2, 2, 3, 4))}, {"q": "int32"}),
                        Bad("k in another float dtype", "'k'", {}, {"k": "other"})],
    ("ERR-8", "mha"): [Bad("integer value", "value", {"value": np.ones((2, 4, 7))},
                           {"value": "int64"}),
                       Bad("w_o in another float dtype", "'w_o'", {}, {"w_o": "other"})],
    ("ERR-9", "sdpa"): [Bad("legacy mask with float16", "legacy_mask",
                            {"legacy_mask": np.zeros((3, 4))})],
    ("ERR-9", "mha"): [Bad("legacy mask with float16", "legacy_mask",
                           {"legacy_mask": np.zeros((3, 4))})],
    ("ERR-10", "sdpa"): [Bad("zero scale", "scale", {"scale": 0.0}),
                         Bad("negative scale", "scale", {"scale": -0.5}),
                         Bad("NaN scale", "scale", {"scale": float("nan")})],
    ("ERR-10", "mha"): [Bad("infinite scale", "scale", {"scale": float("inf")})],
}

ARRAY_ARGS = {"q", "k", "v", "query", "key", "value", "mask", "bias", "legacy_mask",
              "key_padding_mask", *MHAParams._fields}


def invalid_call(impl, op: str, bad: Bad):
    """Build the invalid call in the impl's arrays and make it."""
    other = "float32" if impl.dtype == "float64" else "float64"
    values = {**(SDPA if op == "sdpa" else {**MHA, "num_heads": 2}), **bad.changes}
    args = {}
    for name, value in values.items():
        if name in ARRAY_ARGS:
            dtype = bad.dtype_of.get(name.strip("'"))
            dtype = other if dtype == "other" else dtype
            args[name] = impl.arr(value, dtype)
        else:
            args[name] = value
    for name in (n.strip("'") for n in bad.dtype_of):
        if name not in bad.changes:
            args[name] = impl.arr(values[name], other)
    if op == "sdpa":
        q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
        return impl.call("scaled_dot_product_attention", q, k, v, **args)
    params = MHAParams(**{f: args.pop(f) for f in MHAParams._fields})
    q, k, v = args.pop("query"), args.pop("key"), args.pop("value")
    return impl.call("multi_head_attention", q, k, v, params, **args)
