"""``mhaspec bench``: time and memory of every in-repo backend, plus PyTorch references.

Axis legend: B batch, L sequence length (self-attention, L_q = L_k = L), h heads, d_model width.

Every measurement runs in a fresh subprocess (:mod:`mhaspec.bench._worker`), so frameworks do not
share thread pools or allocators: one process per framework for the timings, one per configuration
for peak memory. Writes ``bench.md``, ``bench.json`` and ``bench.png`` to ``--out`` (default
``results/bench``) and, with ``--docs DIR`` (default ``docs/generated``), copies the Markdown and
the plot there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mhaspec import generated, usage
from mhaspec.spec import SPEC_VERSION

from . import vjp_cost
from ._worker import blas_threads, mha_flops

EXAMPLE = (32, 50, 512, 8)  # the source document's size: B, L, d_model, h
D_MODEL, HEADS = 512, 8
SWEEP_L = (128, 256, 512, 1024, 2048, 4096)
QUICK_L = (256, 1024)
LONG_L = 16384  # the chunked backend's memory point (B=1)
CHUNKED_PAIR_L = 4096  # where numpy-chunked is timed against numpy-batched in alternating blocks
CHUNKED_SPEED_TARGET = 0.8  # numpy-chunked at least this fast as numpy-batched there
CHUNKED_MEMORY_TARGET_MIB = 256  # and adding less than this at L = LONG_L
TOKENS = 4096  # sweep batch: B = max(1, TOKENS // L)

#: PyTorch's own modules, timed beside the torch backends as references (not mhaspec backends)
TORCH_REFERENCES = ["torch-native-mha", "torch-native-sdpa"]
BACKWARD = ["torch-batched", "torch-native-mha", "torch-native-sdpa"]
MEMORY = ["numpy-perhead", "numpy-batched", "numpy-chunked", "torch-batched", "torch-native-mha",
          "torch-native-sdpa", "jax-jit", "tf-function"]
#: Always timed at every size: the subjects of the optimisation work and the references.
NEVER_SKIP = ["numpy-batched", "numpy-chunked", "torch-native-mha", "torch-native-sdpa"]
PERHEAD_PAIRS = {"numpy-batched": "numpy-perhead", "torch-batched": "torch-perhead",
                 "jax-batched": "jax-perhead", "tf-batched": "tf-perhead"}


def run_worker(args: list[str], timeout: float) -> dict:
    """Run a worker command in a fresh interpreter and return its JSON result (or an error)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    try:
        proc = subprocess.run([sys.executable, "-m", "mhaspec.bench._worker", *args],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"exit {proc.returncode}: {tail[0][:200]}"}


def available(framework: str) -> bool:
    import importlib.util

    return framework == "numpy" or importlib.util.find_spec(framework) is not None


def sizes_for(lengths) -> list[tuple[int, int, int, int]]:
    return [EXAMPLE] + [(max(1, TOKENS // n), n, D_MODEL, HEADS) for n in lengths]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- formatting ----------------------------------------------------------------------------------
def fmt_ms(s) -> str:
    return "—" if s is None else (f"{s * 1e3:.1f}" if s * 1e3 >= 10 else f"{s * 1e3:.2f}")


def fmt_mib(b) -> str:
    return "—" if b is None else f"{b / 2 ** 20:.0f}" if b >= 2 ** 20 else f"{b / 2 ** 20:.2f}"


def fmt_x(x) -> str:
    return "—" if x is None else f"{x:.2f}×"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def variants() -> dict[str, list[str]]:
    """framework -> the names the bench times: the registered backends (entry points) that import,
    except the native-op adapters, found in a worker; plus PyTorch's references for torch."""
    found = run_worker(["variants"], 600)
    if "error" in found:
        raise SystemExit(f"mhaspec bench: cannot list the registered backends: {found['error']}")
    if "torch" in found:
        found["torch"] = found["torch"] + TORCH_REFERENCES
    return found


def order(names) -> list[str]:
    """Names grouped by framework, then alphabetically."""
    return sorted(set(names), key=lambda n: (n.split("-")[0], n))


def report(data: dict) -> str:
    roof = data["roof"]
    roof_best = max(v for v in roof.values() if v) if any(roof.values()) else None
    timings = data["timings"]
    fwd = {(r["name"], r["L"]): r for r in timings if not r["backward"]}
    bwd = {(r["name"], r["L"]): r for r in timings if r["backward"]}
    mem = {(m["name"], m["L"]): m for m in data["memory"] if "error" not in m}
    names = order(r["name"] for r in timings)
    b0, l0, d0, h0 = EXAMPLE
    out = [
        generated.marker(SPEC_VERSION),
        "# Benchmark: multi-head attention on CPU",
        "",
        f"Generated by `mhaspec bench{' ' + ' '.join(data['argv']) if data['argv'] else ''}` "
        f"on {data['machine']['date']}. Machine: {data['machine']['cpu']}, "
        f"{data['machine']['cores']} cores; NumPy {data['machine']['numpy']} "
        f"(BLAS threads {data['machine']['blas_threads']}), "
        + ", ".join(f"{k} {v}" for k, v in data["machine"]["frameworks"].items()) + ". "
        f"Load average (1, 5, 15 min) at start {_load(data['machine'].get('load_start'))}, at end "
        f"{_load(data['machine'].get('load_end'))}: on a shared machine, other work inflates "
        "the times.",
        "",
        "Self-attention (`query is key is value`), float32, no mask, h = 8, d_model = 512, "
        "d_k = d_v = 64. Forward time is the median of repeated calls after warm-up (compiled "
        "variants are timed after compilation); `fwd+bwd` adds `out.sum().backward()`. "
        "GFLOP/s counts the three input projections, QKᵀ, PV and the output projection "
        "(2 FLOPs per multiply-add); *roof* is this machine's float32 2048³ matmul throughput "
        "measured in the same run: "
        + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in roof.items() if v)
        + " (the better of a measurement at the start and one at the end). "
        "Peak memory is the resident memory one forward call adds in a fresh process "
        "(inputs and imports excluded; for NumPy variants tracemalloc's peak is shown in brackets; for "
        "compiled variants that first call includes compilation). "
        "`torch-native-mha` is `nn.MultiheadAttention` in eval mode under `inference_mode` "
        "(its fused fast path); `torch-native-sdpa` is a fused-QKV `F.linear` + "
        "`F.scaled_dot_product_attention` + output `F.linear`. Neither returns attention "
        "weights; the protocol backends return them, except `numpy-chunked`.",
        "",
    ]
    hl = data.get("headline") or {}
    if "median_s" in hl:
        t = hl["median_s"]
        out += [
            f"## Headline: NumPy batched vs per-head vs PyTorch fused MHA (B={b0}, L={l0})",
            "",
            f"Timed in one process in alternating blocks, torch threads = NumPy BLAS threads "
            f"= {hl['threads']['torch']}.",
            "",
            md_table(["variant", "forward ms", "vs numpy-perhead", "vs torch-native-mha"],
                     [[n, fmt_ms(t[n]), fmt_x(t["numpy-perhead"] / t[n]),
                       fmt_x(t["torch-native-mha"] / t[n])] for n in t]),
            "",
            "The last column is speed relative to torch (above 1× is faster than torch).",
            "",
        ]
    flops0 = mha_flops(b0, l0, d0, h0)
    rows = []
    for n in names:
        r = fwd.get((n, l0), {})
        t = r.get("median_s")
        pair = PERHEAD_PAIRS.get(n)
        speed = fwd.get((pair, l0), {}).get("median_s") / t if pair and t and \
            fwd.get((pair, l0), {}).get("median_s") else None
        m = mem.get((n, l0))
        rows.append([n, fmt_ms(t) if t else r.get("skipped", "—"),
                     f"{flops0 / t / 1e9:.0f}" if t else "—",
                     f"{100 * flops0 / t / 1e9 / roof_best:.0f}%" if t and roof_best else "—",
                     fmt_ms(bwd.get((n, l0), {}).get("median_s")),
                     fmt_x(speed), _fmt_mem(m)])
    out += [f"## The source document's size: B={b0}, L={l0}, d_model={d0}, h={h0} "
            f"({flops0 / 1e9:.2f} GFLOP per forward)", "",
            md_table(["backend", "forward ms", "GFLOP/s", "of roof", "fwd+bwd ms",
                      "batched / per-head speed-up", "peak MiB"], rows), ""]
    sweep = [s for s in data["sizes"] if tuple(s) != EXAMPLE]
    if sweep:
        hdr = ["backend"] + [f"L={s[1]} (B={s[0]})" for s in sweep]
        rows_t, rows_g, rows_m = [], [], []
        for n in names:
            rt, rg, rm = [n], [n], [n]
            for s in sweep:
                r = fwd.get((n, s[1]), {})
                t = r.get("median_s")
                rt.append((fmt_ms(t) + ("*" if r.get("retimed") else "")) if t else
                          ("skipped" if "skipped" in r else "—"))
                rg.append(f"{r['flops'] / t / 1e9:.0f}" if t else "—")
                rm.append(_fmt_mem(mem.get((n, s[1]))))
            rows_t.append(rt)
            rows_g.append(rg)
            rows_m.append(rm)
        rows_b = []
        for n in names:
            if not any((n, s[1]) in bwd for s in sweep):
                continue
            rows_b.append([n] + [fmt_ms(bwd[(n, s[1])]["median_s"]) if "median_s" in
                                 bwd.get((n, s[1]), {}) else "skipped" if (n, s[1]) in bwd else "—"
                                 for s in sweep])
        skipped = sorted({f"{r['name']}{' (fwd+bwd)' if r['backward'] else ''}: {r['skipped']}"
                          for r in timings if "skipped" in r})
        out += ["## Sweep over L (B = max(1, 4096 / L))", "", "### Forward time, ms", "",
                md_table(hdr, rows_t), "",
                "\\* timed a second time (better median kept) because it took over 1.3× longer "
                "than the next, larger size: a burst of load from other work.", ""]
        if skipped:
            out += ["Skipped (a variant stops once its predicted time per call passes the "
                    f"budget of {data['slow_s']} s; {', '.join(NEVER_SKIP)} always run; "
                    "`--slow` sets the budget):", ""] + [f"- {s}" for s in skipped] + [""]
        out += ["### Forward GFLOP/s", "", md_table(hdr, rows_g), "",
                "### Forward + backward time, ms", "", md_table(hdr, rows_b), "",
                "### Peak memory of one forward call, MiB", "", md_table(hdr, rows_m), ""]
    out += chunked_section(data)
    out += vjp_cost.section(data.get("vjp"))
    long = data.get("long")
    if long:
        b, n = 1, long["L"]
        naive = b * HEADS * n * n * 4
        m = long.get("chunked", {})
        mf = long.get("chunked_features") or {"error": "not measured"}
        out += [f"## Memory at L={n} (B=1, h=8, d_model=512, float32, self-attention)", "",
                md_table(["backend", "peak MiB added", "forward s", "note"],
                         [["numpy-chunked", _fmt_mem(m) if "error" not in m else m["error"],
                           f"{m['time_s']:.1f}" if "time_s" in m else "—",
                           "online softmax over key blocks; weights not formed"],
                          ["numpy-chunked, spec 1.2 call",
                           _fmt_mem(mf) if "error" not in mf else mf["error"],
                           f"{mf['time_s']:.1f}" if "time_s" in mf else "—",
                           "causal, window (L/4, 0), softcap, ALiBi, two segments, lse: masks "
                           "and ALiBi built per block"],
                          ["numpy-batched", f"≥ {naive / 2 ** 20:.0f} (estimate)", "not run",
                           "the (B, h, L, L) float32 logits/weights array alone: "
                           f"{b}·{HEADS}·{n}²·4 bytes"]]), ""]
    out += ["![time and memory vs L](generated/bench.png)", ""]  # as included in docs/benchmarks.md
    return "\n".join(out)


def chunked_ratios(data: dict) -> dict:
    """numpy-chunked against numpy-batched in this run: ``{"pair": (L, batched time / chunked
    time) timed in alternating blocks or None, "sweep": {L: the same from the sweep},
    "long_peak_mib": peak MiB one L=16384 chunked call adds or None}``."""
    fwd = {(r["name"], r["L"]): r.get("median_s") for r in data["timings"] if not r["backward"]}
    sweep = {s[1]: fwd[("numpy-batched", s[1])] / fwd[("numpy-chunked", s[1])] for s in data["sizes"]
             if fwd.get(("numpy-batched", s[1])) and fwd.get(("numpy-chunked", s[1]))}
    pair = data.get("chunked_pair") or {}
    times = pair.get("median_s", {})
    both = "numpy-batched" in times and "numpy-chunked" in times
    peak = ((data.get("long") or {}).get("chunked") or {}).get("added_rss_bytes")
    return {"pair": (pair["L"], times["numpy-batched"] / times["numpy-chunked"]) if both else None,
            "sweep": sweep, "long_peak_mib": None if peak is None else peak / 2 ** 20}


def chunked_section(data: dict) -> list[str]:
    """The online-softmax backend's two targets, from this run: speed relative to numpy-batched
    (at least 0.8x at L = 4096) and the memory one L = 16384 call adds (under 256 MiB)."""
    r = chunked_ratios(data)
    lines = ["## numpy-chunked against numpy-batched (same run)", ""]
    if r["pair"]:
        length, ratio = r["pair"]
        verdict = "meets" if ratio >= CHUNKED_SPEED_TARGET else "misses"
        lines += [f"At L = {length} (B = {max(1, TOKENS // length)}), timed in alternating blocks in "
                  f"one process: numpy-chunked runs at **{ratio:.2f}×** numpy-batched's speed "
                  f"(batched time / chunked time; {verdict} the target of at least "
                  f"{CHUNKED_SPEED_TARGET}×).", ""]
    if r["sweep"]:
        lines += ["The same ratio from the sweep above (each size timed once, one variant after "
                  "the other):", "",
                  md_table(["L", *(str(n) for n in r["sweep"])],
                           [["chunked / batched speed", *(fmt_x(x) for x in r["sweep"].values())]]),
                  ""]
    if r["long_peak_mib"] is not None:
        verdict = "under" if r["long_peak_mib"] < CHUNKED_MEMORY_TARGET_MIB else "over"
        lines += [f"Peak memory one numpy-chunked call adds at L = {LONG_L}: "
                  f"**{r['long_peak_mib']:.0f} MiB** ({verdict} the target of "
                  f"{CHUNKED_MEMORY_TARGET_MIB} MiB; numpy-batched's (B, h, L, L) float32 weights "
                  "alone would take 8 GiB).", ""]
    return lines if len(lines) > 2 else []


def _load(x) -> str:
    return "?" if not x else "/".join(f"{v:.1f}" for v in x)


def _fmt_mem(m) -> str:
    if not m:
        return "—"
    s = fmt_mib(m["added_rss_bytes"])
    if m.get("tracemalloc_peak_bytes") is not None:
        s += f" [{fmt_mib(m['tracemalloc_peak_bytes'])}]"
    return s


COLORS = {"numpy": "tab:blue", "torch": "tab:red", "jax": "tab:green", "tf": "tab:orange"}
MARKERS = {"perhead": "x", "batched": "o", "chunked": "s", "jit": "^", "function": "^",
           "mha": "D", "sdpa": "v"}


def _style(name: str) -> dict:
    """One colour per framework, one marker per variant; PyTorch's own references dashed."""
    fw, variant = name.split("-", 1)[0], name.rsplit("-", 1)[1]
    return {"color": COLORS.get(fw, "black"), "marker": MARKERS.get(variant, "o"),
            "linestyle": "--" if "native" in name else ":" if variant == "perhead" else "-",
            "label": name}


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = sorted({tuple(s) for s in data["sizes"] if tuple(s) != EXAMPLE}, key=lambda s: s[1])
    if not sweep:
        return
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5))
    fwd = {(r["name"], r["L"]): r for r in data["timings"] if not r["backward"]}
    for n in order(r["name"] for r in data["timings"]):
        pts = [(s[1], fwd[(n, s[1])]["median_s"]) for s in sweep
               if "median_s" in fwd.get((n, s[1]), {})]
        if pts:
            ax_t.plot(*zip(*pts), **_style(n))
    mem = {(m["name"], m["L"]): m for m in data["memory"] if "error" not in m}
    for n in order(m["name"] for m in data["memory"]):
        pts = [(s[1], mem[(n, s[1])]["added_rss_bytes"] / 2 ** 20) for s in sweep
               if (n, s[1]) in mem and mem[(n, s[1])]["added_rss_bytes"] > 0]
        if n == "numpy-chunked" and data.get("long") and "added_rss_bytes" in data["long"]["chunked"]:
            pts.append((data["long"]["L"], data["long"]["chunked"]["added_rss_bytes"] / 2 ** 20))
        if pts:
            ax_m.plot(*zip(*pts), **_style(n))
    ref = [(s[1], s[0] * HEADS * float(s[1]) ** 2 * 4 / 2 ** 20) for s in sweep]
    if data.get("long"):
        ref.append((data["long"]["L"], HEADS * float(data["long"]["L"]) ** 2 * 4 / 2 ** 20))
    ax_m.plot(*zip(*ref), color="grey", linestyle=(0, (1, 3)),
              label="one (B, h, L, L) float32 array")
    for ax, title, ylabel in ((ax_t, "forward time (B = max(1, 4096/L))", "seconds"),
                              (ax_m, "peak memory added by one forward call", "MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("L")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- the run -------------------------------------------------------------------------------------
def measure_roof(data: dict, frameworks) -> None:
    """float32 2048^3 matmul GFLOP/s of NumPy and torch; called at the start and the end of a run,
    the better figure is kept (on a shared machine the worse one is the noise)."""
    for fw in ("numpy", "torch"):
        if fw in frameworks:
            r = run_worker(["roof", fw], 300)
            data.setdefault("roof_runs", {}).setdefault(fw, []).append(r.get("gflops"))
            runs = [g for g in data["roof_runs"][fw] if g]
            data["roof"][fw] = max(runs) if runs else None
            log(f"roof {fw}: {r}")


def machine_info() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    frameworks = {}
    for dist in ("torch", "jax", "tensorflow-cpu", "tensorflow"):
        try:
            frameworks[dist.removesuffix("-cpu")] = version(dist)
        except PackageNotFoundError:
            pass
    return {"cpu": cpu, "cores": os.cpu_count(), "numpy": np.__version__,
            "blas_threads": blas_threads(), "frameworks": frameworks,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load_start": os.getloadavg()}


def parse(argv) -> argparse.Namespace:
    ap = usage.ArgumentParser(prog="mhaspec bench", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"sweep only L in {QUICK_L}, fewer repetitions, NumPy memory only, "
                         f"no L={LONG_L} point")
    ap.add_argument("--lengths", type=int, nargs="+", help=f"sweep lengths (default {SWEEP_L})")
    ap.add_argument("--frameworks", nargs="+", default=None, metavar="NAME",
                    help="only the backends of these frameworks (numpy, torch, jax, tensorflow, "
                         "...; default: every framework of a registered backend)")
    ap.add_argument("--slow", type=float, default=None,
                    help="skip a variant once its predicted time per call passes this (s)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--no-long", action="store_true", help=f"skip the L={LONG_L} chunked point")
    ap.add_argument("--out", default="results/bench", help="output folder")
    ap.add_argument("--docs", default="docs/generated",
                    help="folder to copy bench.md and bench.png to ('' for none)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    lengths = tuple(a.lengths or (QUICK_L if a.quick else SWEEP_L))
    sizes = sizes_for(lengths)
    slow = a.slow if a.slow is not None else (0.5 if a.quick else 2.0)
    found = variants()
    frameworks = [f for f in (a.frameworks or sorted(found)) if f in found and available(f)]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    data = {"argv": argv, "machine": machine_info(), "sizes": sizes, "slow_s": slow, "variants": found,
            "roof": {}, "timings": [], "memory": [], "headline": None, "long": None,
            "chunked_pair": None}
    log(f"sizes {sizes}; frameworks {frameworks}")
    measure_roof(data, frameworks)
    if "torch" in frameworks:
        b, n, d, h = EXAMPLE
        data["headline"] = run_worker(["headline", str(b), str(n), str(d), str(h),
                                       "3" if a.quick else "5"], 600)
        log(f"headline: {data['headline'].get('median_s', data['headline'])}")
    for fw in frameworks:
        spec = {"sizes": sizes, "variants": found[fw], "slow_s": slow,
                "backward": BACKWARD, "never_skip": NEVER_SKIP, "max_reps": 10 if a.quick else 30,
                "min_time": 0.2 if a.quick else 0.5, "always_L": EXAMPLE[1]}
        r = run_worker(["time", json.dumps(spec)], 1800)
        if "error" in r:
            log(f"{fw}: {r['error']}")
            continue
        data["timings"] += r["results"]
        log(f"{fw} timed ({len(r['results'])} rows, {time.time() - t_start:.0f} s so far)")
    if "numpy" in frameworks:
        length = CHUNKED_PAIR_L if not a.quick else max(lengths)
        data["chunked_pair"] = run_worker(["pair", "numpy-batched,numpy-chunked",
                                           str(max(1, TOKENS // length)), str(length), str(D_MODEL),
                                           str(HEADS), "3" if a.quick else "5"], 1200)
        log(f"numpy-chunked vs numpy-batched at L={length}: {data['chunked_pair']}")
    if not a.no_memory:
        timed = {(r["name"], r["L"]) for r in data["timings"] if "median_s" in r}
        names = [n for n in MEMORY if any(n in found[f] for f in frameworks)]
        if a.quick:
            names = [n for n in names if n.startswith("numpy-")]
        for b, n, d, h in sizes:
            for name in names:
                if (name, n) not in timed:
                    continue
                r = run_worker(["memory", name, str(b), str(n), str(d), str(h)], 600)
                data["memory"].append({"name": name, "B": b, "L": n, **r})
        log(f"memory measured ({time.time() - t_start:.0f} s so far)")
    if not (a.quick or a.no_long):
        args = ["memory", "numpy-chunked", "1", str(LONG_L), str(D_MODEL), str(HEADS)]
        r = run_worker(args, 900)
        data["long"] = {"L": LONG_L, "chunked": r,
                        "chunked_features": run_worker([*args, "features"], 900)}
        log(f"L={LONG_L} numpy-chunked: {r}; with spec 1.2 features: "
            f"{data['long']['chunked_features']}")
    if "numpy" in frameworks and not a.no_long:
        data["vjp"] = vjp_cost.measure(run_worker, quick=a.quick)
        log(f"attention_vjp, numpy-chunked vs numpy-batched: {data['vjp']}")
    measure_roof(data, frameworks)
    data["machine"]["load_end"] = os.getloadavg()
    data["elapsed_s"] = time.time() - t_start
    (out_dir / "bench.json").write_text(json.dumps(data, indent=1))
    (out_dir / "bench.md").write_text(report(data))
    plot(data, out_dir / "bench.png")
    log(f"wrote {out_dir}/bench.md, bench.json, bench.png in {data['elapsed_s']:.0f} s")
    if a.docs:
        docs = Path(a.docs)
        docs.mkdir(parents=True, exist_ok=True)
        for f in ("bench.md", "bench.png"):
            if (out_dir / f).exists():
                shutil.copyfile(out_dir / f, docs / f)
        log(f"copied to {docs}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
