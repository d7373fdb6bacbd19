"""Verification script for the native-op adapters (not a test module).

Runs each native-op adapter registered as a backend (entry points whose backend names a
``native_op``) over random cases against the float64 oracle (``spec/oracle.py``) and
prints the max abs error per adapter and dtype, the behaviour on fully masked rows, and whether
invalid input raises ValueError.

    python tests/native_check.py [--cases N] [--seed S] [adapter ...]

Cases: float64 and float32; boolean masks of several broadcast shapes, additive bias, key padding,
causal top_left / bottom_right with L_q != L_k, legacy masks, custom scale, cross-attention widths.
Each result is judged under NUM-3 by the suite's judge (``conformance.judge.judge_parts``: the
naive algorithm in every precision NUM-3 names, k = 16, the softmax condition and the subnormal
allowance), the output and the weights. Rows with an empty allowed set are excluded from the error
figures and the judgement and described on their own.
A case the adapter cannot express (NotImplementedError) is counted, not failed.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from spec import oracle  # noqa: E402

def load(name):
    """The registered backend ``name`` (entry point of the ``mhaspec.backends`` group)."""
    from mhaspec.backends import load_backend

    return load_backend(name)


def native_adapters() -> list[str]:
    """Every registered backend that adapts a framework's native op and whose framework imports."""
    from mhaspec.backends import loadable

    return [name for name, backend in loadable().backends.items()
            if getattr(backend, "native_op", "")]


def random_mask_shape(rng, b, h, l_q, l_k):
    return [(l_k,), (l_q, l_k), (b, 1, 1, l_k), (b, h, l_q, l_k), (h, 1, l_k), (1, l_q, 1),
            (b, 1, l_q, l_k)][rng.integers(7)]


def make_case(rng, kind: str, sq: bool):
    """A random case: kind 'sdpa' or 'mha'; sq restricts widths to torch nn.MultiheadAttention's."""
    b, h = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    l_q, l_k = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    d_k = int(rng.integers(1, 6))
    d_v = d_k if sq else int(rng.integers(1, 6))
    c = {"b": b, "h": h, "l_q": l_q, "l_k": l_k, "kw": {}}
    kw = c["kw"]
    if rng.random() < 0.5:
        m = rng.random(random_mask_shape(rng, b, h, l_q, l_k)) < 0.75
        kw["mask"] = m
    if rng.random() < 0.4:
        kw["bias"] = rng.standard_normal(random_mask_shape(rng, b, h, l_q, l_k))
    if rng.random() < 0.4:
        kw["key_padding_mask"] = rng.random((b, l_k)) < 0.8
    if rng.random() < 0.5:
        kw["causal"] = ["top_left", "bottom_right"][rng.integers(2)]
    if rng.random() < 0.2:
        kw["legacy_mask"] = (rng.random(random_mask_shape(rng, b, h, l_q, l_k)) < 0.25) * 1.0
    if rng.random() < 0.2 and not sq:
        kw["scale"] = float(rng.uniform(0.1, 2.0))
    if kind == "sdpa":
        c["q"] = rng.standard_normal((b, h, l_q, d_k))
        c["k"] = rng.standard_normal((b, h, l_k, d_k))
        c["v"] = rng.standard_normal((b, h, l_k, d_v))
    else:
        d_model = h * d_k if sq else int(rng.integers(1, 9))
        k_dim = d_model if (sq and rng.random() < 0.5) else int(rng.integers(1, 9))
        v_dim = k_dim if rng.random() < 0.5 else int(rng.integers(1, 9))
        d_out = d_model if sq else int(rng.integers(1, 9))
        c["query"] = rng.standard_normal((b, l_q, d_model))
        if rng.random() < 0.2 and k_dim == v_dim == d_model and l_q == l_k:
            c["key"] = c["value"] = c["query"]  # self-attention
        else:
            c["key"] = rng.standard_normal((b, l_k, k_dim))
            c["value"] = rng.standard_normal((b, l_k, v_dim))
        p = [rng.standard_normal(s) / math.sqrt(s[0]) for s in
             ((d_model, h * d_k), (k_dim, h * d_k), (v_dim, h * d_v), (h * d_v, d_out))]
        biases = [rng.standard_normal(n) if rng.random() < 0.6 else None
                  for n in (h * d_k, h * d_k, h * d_v, d_out)]
        c["params"] = oracle.Params(*p, *biases)
    return c


def empty_rows(c):
    kw = c["kw"]
    allowed = oracle.allowed_mask(c["b"], c["h"], c["l_q"], c["l_k"], mask=kw.get("mask"),
                                  key_padding_mask=kw.get("key_padding_mask"),
                                  causal=kw.get("causal"))
    if "bias" in kw:
        allowed &= np.broadcast_to(kw["bias"], allowed.shape) != -np.inf
    return ~allowed.any(-1)  # (B, h, L_q)


def to_backend(be, c, dtype):
    def conv(x, dt=dtype):
        if x is None:
            return None
        x = np.asarray(x)
        return be.asarray(x, dtype="bool" if x.dtype == bool else dt)

    kw = {k: (v if k in ("causal", "scale") else conv(v)) for k, v in c["kw"].items()}
    return conv, kw


def run(be, c, dtype):
    conv, kw = to_backend(be, c, dtype)
    if "q" in c:
        out, w = be.scaled_dot_product_attention(conv(c["q"]), conv(c["k"]), conv(c["v"]), **kw)
    else:
        p = be_params(be, c["params"], conv)
        out, w = be.multi_head_attention(conv(c["query"]), conv(c["key"]), conv(c["value"]), p,
                                         num_heads=c["h"], **kw)
    return be.to_numpy(out), None if w is None else be.to_numpy(w)


def be_params(be, params, conv):
    from backends._base import MHAParams

    return MHAParams(*(conv(t) for t in params))


def reference(c, precision="float64", info: dict | None = None):
    """The oracle (or the naive algorithm in ``precision``) on case ``c`` -> (output, weights);
    ``info`` receives the oracle's softmax condition (``logit_condition``, NUM-3's kappa)."""
    cast = (lambda x: x) if precision == "float64" else (
        lambda x: x if x is None or np.asarray(x).dtype == bool else np.asarray(x, np.float32))
    kw = {k: (v if k in ("causal", "scale") else cast(v)) for k, v in c["kw"].items()}
    if "q" in c:
        return oracle.attention(c["q"], c["k"], c["v"], precision=precision, info=info, **kw)
    return oracle.multi_head_attention(c["query"], c["key"], c["value"], c["params"],
                                       num_heads=c["h"], precision=precision, info=info, **kw)


def sum_length(c) -> int:
    """N of NUM-3's subnormal allowance: the longest sum of the computation."""
    if "q" in c:  # L_k, d_k, h * d_v
        return max(c["l_k"], np.shape(c["q"])[-1], c["h"] * np.shape(c["v"])[-1])
    p = c["params"]  # L_k, d_k, h * d_v, d_model, k_dim, v_dim
    return max(c["l_k"], np.shape(p.w_q)[1] // c["h"], np.shape(p.w_o)[0],
               *(np.shape(c[n])[-1] for n in ("query", "key", "value")))


def judge_num3(dt, c, out, w, ref, row_ok, empty):
    """NUM-3 through the suite's one judge (``judge_parts``): the output on the rows with an
    allowed key (``row_ok``), the weights (when returned) on the rows that are not empty, against
    the float64 oracle ``ref`` = (output, weights, condition) and the naive algorithm in every
    precision NUM-3 names for ``dt`` -> the list of failed parts."""
    from mhaspec.conformance import judge, tolerance

    ref_out, ref_w, condition = ref
    naive = [reference(c, p) for p in tolerance.naive_precisions(dt)]
    keep = lambda x, ok: np.where(ok, x, 0.0)  # noqa: E731
    vals = c.get("v", c.get("value"))
    parts = [("output", keep(out, row_ok), keep(ref_out, row_ok),
              [keep(n[0], row_ok) for n in naive],
              max(judge.finite_max_abs(ref_out), judge.finite_max_abs(vals)))]
    if w is not None:
        ok = ~empty[..., None]
        parts.append(("weights", keep(w, ok), keep(ref_w, ok), [keep(n[1], ok) for n in naive],
                      1.0))
    checks = judge.judge_parts(parts, dtype=dt, clause="NUM-3", sum_length=sum_length(c),
                               condition=condition)
    return [f"{ch.what}: {ch.verdict.describe()}" for ch in checks if not ch.verdict.ok]


def check_adapter(name, cases, seed, dtypes=("float64", "float32")):
    be = load(name)
    kind = "sdpa" if "sdpa" in be.capabilities else "mha"
    sq = name == "torch-mha"
    rng = np.random.default_rng(seed)
    stats = {dt: {"out": 0.0, "w": 0.0, "out_legacy": 0.0, "bad": 0, "declared": 0, "ran": 0,
                  "notimpl": 0} for dt in dtypes}
    empty_seen = {}
    for _ in range(cases):
        c = make_case(rng, kind, sq)
        info: dict = {}
        ref_out, ref_w = reference(c, info=info)
        condition = max(1.0, info.get("logit_condition", 0.0))
        empty = empty_rows(c)
        if kind == "sdpa":
            row_ok = ~empty[..., None]
        else:
            row_ok = ~empty.any(1)[..., None]  # an MHA output row mixes all heads
        for dt in dtypes:
            if dt == "float16" and "legacy_mask" in c["kw"]:
                continue  # an error by ERR-9
            try:
                out, w = run(be, c, dt)
            except NotImplementedError:
                stats[dt]["notimpl"] += 1
                continue
            s = stats[dt]
            s["ran"] += 1
            e_out = float(np.max(np.abs(np.where(row_ok, out - ref_out, 0.0)), initial=0.0))
            key_out = "out_legacy" if "legacy_mask" in c["kw"] else "out"
            s[key_out] = max(s[key_out], e_out)
            if w is not None:
                e_w = float(np.max(np.abs(np.where(~empty[..., None], w - ref_w, 0.0)),
                                   initial=0.0))
                s["w"] = max(s["w"], e_w)
            failed = judge_num3(dt, c, out, w, (ref_out, ref_w, condition), row_ok, empty)
            if failed and "NUM-3" in be.deviations:
                s["declared"] += 1
            elif failed:
                s["bad"] += 1
                print(f"  {name} {dt}: {'; '.join(failed)}; case "
                      f"{ {k: (v if k in ('causal', 'scale') else np.shape(v)) for k, v in c['kw'].items()} }")
            if empty.any():
                rows = out[np.broadcast_to(empty[..., None] if kind == "sdpa" else
                                           empty.any(1)[..., None], out.shape)]
                ref_rows = ref_out[np.broadcast_to(empty[..., None] if kind == "sdpa" else
                                                   empty.any(1)[..., None], out.shape)]
                key = ("bias -inf" if "bias" in c["kw"] and np.isneginf(c["kw"]["bias"]).any()
                       else "bool masks")
                desc = ("NaN" if np.isnan(rows).any() else
                        "equals oracle" if np.allclose(rows, ref_rows, atol=1e-5) else "other")
                empty_seen.setdefault((dt, key), set()).add(desc)
    return stats, empty_seen


def fully_masked_probe(name):
    """Explicit fully masked rows: via a boolean mask, via -inf bias, via causal bottom_right."""
    be = load(name)
    rng = np.random.default_rng(1)
    b, h, l_q, l_k, d = 1, 2, 3, 4, 4
    res = {}
    m = np.ones((b, 1, l_q, l_k), bool)
    m[..., 1, :] = False
    bias = np.where(m, 0.0, -np.inf)
    for dt in ("float64", "float32"):
        for label, kw in (("mask", {"mask": m}), ("bias -inf", {"bias": bias}),
                          ("causal bottom_right, L_q > L_k", {"causal": "bottom_right"}),
                          ("key_padding all False", {"key_padding_mask": np.zeros((b, l_k), bool)})):
            c = {"b": b, "h": h, "l_q": l_q, "l_k": l_k, "kw": dict(kw)}
            if label.startswith("causal"):
                c["l_q"], c["l_k"] = 5, 3
            if "sdpa" in be.capabilities:
                c["q"] = rng.standard_normal((b, h, c["l_q"], d))
                c["k"] = rng.standard_normal((b, h, c["l_k"], d))
                c["v"] = rng.standard_normal((b, h, c["l_k"], d))
            else:
                c["query"] = rng.standard_normal((b, c["l_q"], h * d))
                c["key"] = rng.standard_normal((b, c["l_k"], h * d))
                c["value"] = rng.standard_normal((b, c["l_k"], h * d))
                p = [rng.standard_normal((h * d, h * d)) for _ in range(4)]
                c["params"] = oracle.Params(*p, *[rng.standard_normal(h * d) for _ in range(4)])
            empty = empty_rows(c)
            try:
                out, w = run(be, c, dt)
            except NotImplementedError as exc:
                res[(dt, label)] = f"not implemented ({exc})"
                continue
            ref_out, _ = reference(c)
            sel = empty[..., None] if "q" in c else empty.any(1)[..., None]
            rows = out[np.broadcast_to(sel, out.shape)]
            ref_rows = ref_out[np.broadcast_to(sel, out.shape)]
            if "q" in c:
                v = c["v"]
                mean_v = np.broadcast_to(v.mean(axis=2, keepdims=True), out.shape)[
                    np.broadcast_to(sel, out.shape)]
            else:
                mean_v = None
            if np.isnan(rows).any():
                d_out = "NaN"
            elif np.allclose(rows, ref_rows, atol=1e-6, rtol=0):
                d_out = "0 (as MASK-9)" if "q" in c else "b_o, i.e. head output 0 (as MASK-9)"
            elif mean_v is not None and np.allclose(rows, mean_v, atol=1e-5):
                d_out = "mean of V"
            else:
                d_out = "other"
            d_w = "-"
            if w is not None:
                wr = w[np.broadcast_to(empty[..., None], w.shape)]
                d_w = "NaN" if np.isnan(wr).any() else ("0" if np.all(wr == 0) else "other")
            res[(dt, label)] = f"output {d_out}, weights {d_w}"
    return res


def error_probe(name):
    """A few invalid inputs; each must raise ValueError (ERR)."""
    be = load(name)
    f = lambda x, dt="float32": be.asarray(np.asarray(x), dtype=dt)  # noqa: E731
    rng = np.random.default_rng(2)
    bad = []
    if "sdpa" in be.capabilities:
        q, k, v = (f(rng.standard_normal(s)) for s in ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 4)))
        calls = {
            "rank": lambda: be.scaled_dot_product_attention(f(rng.standard_normal((2, 3, 4))), k, v),
            "d_k": lambda: be.scaled_dot_product_attention(q, f(rng.standard_normal((1, 2, 5, 3))), v),
            "int mask": lambda: be.scaled_dot_product_attention(q, k, v, mask=f(np.ones((3, 5)), "int32")),
            "mask shape": lambda: be.scaled_dot_product_attention(q, k, v, mask=f(np.ones((3, 4), bool), "bool")),
            "causal": lambda: be.scaled_dot_product_attention(q, k, v, causal="upper"),
            "scale": lambda: be.scaled_dot_product_attention(q, k, v, scale=-1.0),
            "dtypes": lambda: be.scaled_dot_product_attention(q, k, f(rng.standard_normal((1, 2, 5, 4)), "float64")),
        }
    else:
        from backends._base import MHAParams

        x = f(rng.standard_normal((1, 3, 4)))
        p = MHAParams(*(f(rng.standard_normal((4, 4))) for _ in range(4)))
        calls = {
            "heads": lambda: be.multi_head_attention(x, x, x, p, num_heads=3),
            "rank": lambda: be.multi_head_attention(f(rng.standard_normal((3, 4))), x, x, p, num_heads=2),
            "params": lambda: be.multi_head_attention(x, x, x, p._replace(w_o=f(rng.standard_normal((3, 4)))), num_heads=2),
            "kpm": lambda: be.multi_head_attention(x, x, x, p, num_heads=2, key_padding_mask=f(np.ones((1, 4), bool), "bool")),
            "int input": lambda: be.multi_head_attention(f(np.ones((1, 3, 4)), "int32"), x, x, p, num_heads=2),
        }
    for label, call in calls.items():
        try:
            call()
            bad.append(f"{label}: no error")
        except ValueError:
            pass
        except Exception as exc:  # noqa: BLE001
            bad.append(f"{label}: {type(exc).__name__}: {exc}")
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtypes", default="float64,float32")
    ap.add_argument("adapters", nargs="*", default=None,
                    help="registered adapters (default: every native-op adapter that imports)")
    args = ap.parse_args(argv)
    from mhaspec.backends import BackendLoadError

    failed = False
    for name in args.adapters or native_adapters():
        print(f"== {name}")
        try:
            stats, empty_seen = check_adapter(name, args.cases, args.seed,
                                              tuple(args.dtypes.split(",")))
        except (ImportError, BackendLoadError) as exc:
            print(f"  skipped: {exc}")
            continue
        except Exception:  # noqa: BLE001
            traceback.print_exc()
            failed = True
            continue
        claimed = load(name).dtypes("cpu")
        for dt, s in stats.items():
            print(f"  {dt}{'' if dt in claimed else ' (not claimed: not failed)'}: ran {s['ran']}, "
                  f"not implemented {s['notimpl']}, beyond NUM-3 {s['bad']} "
                  f"(+{s['declared']} under the declared NUM-3 deviation), max|out - oracle| "
                  f"{s['out']:.3g} (cases with legacy_mask: {s['out_legacy']:.3g}), "
                  f"max|weights - oracle| {s['w']:.3g}")
            failed |= s["bad"] > 0 and dt in claimed
        for (dt, key), descs in sorted(empty_seen.items()):
            print(f"  random cases with fully masked rows, {dt}, {key}: {sorted(descs)}")
        for (dt, label), desc in fully_masked_probe(name).items():
            print(f"  fully masked row, {dt}, {label}: {desc}")
        bad = error_probe(name)
        print(f"  invalid input -> ValueError: {'all' if not bad else bad}")
        failed |= bool(bad)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
