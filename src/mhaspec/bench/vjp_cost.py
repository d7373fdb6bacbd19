"""The backward pass of attention (spec 1.3, ``attention_vjp``): numpy-chunked's blockwise backward
against numpy-batched's dense one, side by side.

Axis legend: B batch, h heads, L sequence length (self-attention, L_q = L_k = L), d per-head width.

Two measurements, each in a fresh process (``python -m mhaspec.bench._worker vjp-...``):

* memory: the peak one ``attention_vjp`` call (its forward pass and backward pass) adds, for
  numpy-chunked at L = :data:`LONG_L` (tracemalloc's peak, and the peak RSS over the state after
  building the inputs); numpy-batched would hold several (B, h, L, L) float32 arrays there;
* speed: numpy-chunked and numpy-batched at L = :data:`PAIR_L`, timed in alternating blocks in one
  process, as the forward pair of ``mhaspec bench`` is.

``mhaspec bench`` runs both (not with ``--quick``) and reports them with :func:`section`;
``python -m mhaspec.bench.vjp_cost [--quick]`` runs them alone and prints the section.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from mhaspec import usage
from mhaspec.backends import load_backend

from .measure import alternate, blas_threads, current_rss_bytes, peak_rss_bytes, run_worker

LONG_L = 16384
PAIR_L = 4096
HEADS, D_HEAD = 8, 64  # the bench's d_model = 512 in h = 8 heads


def vjp_call(name: str, batch: int, length: int, heads: int = HEADS, d: int = D_HEAD):
    """A zero-argument ``attention_vjp`` of backend ``name`` on float32 self-attention-sized
    q, k, v (B, h, L, d), seeded, with a random output cotangent."""
    be = load_backend(name)
    rng = np.random.default_rng(0)
    q, k, v, d_out = (be.asarray(rng.standard_normal((batch, heads, length, d)), dtype="float32")
                      for _ in range(4))
    return lambda: be.attention_vjp(q, k, v, d_out)


def cmd_memory(name: str, batch: int, length: int) -> dict:
    """One call in this fresh process: tracemalloc's peak and the peak RSS it adds."""
    import tracemalloc

    fn = vjp_call(name, batch, length)
    base_rss = current_rss_bytes()
    tracemalloc.start()
    t = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - t
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    peak = peak_rss_bytes()
    return {"name": name, "B": batch, "L": length, "h": HEADS, "d": D_HEAD,
            "tracemalloc_peak_bytes": traced, "added_rss_bytes": max(0, peak - base_rss),
            "time_s": elapsed}


def cmd_pair(names: list[str], batch: int, length: int, rounds: int) -> dict:
    """``names`` at one size, timed in alternating blocks in one process."""
    calls = {n: vjp_call(n, batch, length) for n in names}
    return {"B": batch, "L": length, "threads": blas_threads(), **alternate(calls, rounds)}


def measure(run_worker, *, quick: bool = False) -> dict:
    """Both measurements through ``run_worker`` (``mhaspec bench``'s subprocess runner)."""
    long_l, pair_l = (4096, 1024) if quick else (LONG_L, PAIR_L)
    return {"memory": run_worker(["vjp-memory", "numpy-chunked", "1", str(long_l)], 1800),
            "pair": run_worker(["vjp-pair", "numpy-batched,numpy-chunked", "1", str(pair_l),
                                "2" if quick else "3"], 1800)}


def section(result: dict | None) -> list[str]:
    """The Markdown section of :func:`measure`'s result ([] when not measured)."""
    if not result:
        return []
    mem, pair = result.get("memory", {}), result.get("pair", {})
    lines = ["## Backward pass: numpy-chunked against numpy-batched (spec 1.3, `attention_vjp`)",
             "", f"float32, B = 1, h = {HEADS}, d = {D_HEAD}, forward + backward of one call.", ""]
    if "error" in mem:
        lines += [f"Memory: not measured ({mem['error']}).", ""]
    else:
        dense = mem["B"] * HEADS * mem["L"] ** 2 * 4 / 2 ** 20
        lines += [f"Peak memory of one numpy-chunked call at L = {mem['L']}: "
                  f"**{mem['tracemalloc_peak_bytes'] / 2 ** 20:.0f} MiB** traced "
                  f"({mem['added_rss_bytes'] / 2 ** 20:.0f} MiB RSS added, {mem['time_s']:.1f} s); "
                  f"one (B, h, L, L) float32 array alone is {dense:.0f} MiB.", ""]
    if "error" in pair or "median_s" not in pair:
        lines += [f"Speed: not measured ({pair.get('error', 'no result')}).", ""]
    else:
        t = pair["median_s"]
        lines += [f"At L = {pair['L']}: numpy-batched {t['numpy-batched'] * 1e3:.0f} ms, "
                  f"numpy-chunked {t['numpy-chunked'] * 1e3:.0f} ms per call: chunked runs at "
                  f"**{t['numpy-batched'] / t['numpy-chunked']:.2f}×** batched's speed "
                  f"(batched time / chunked time; medians of alternating blocks, "
                  f"{pair['threads']} BLAS threads).", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec.bench.vjp_cost", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="L = 4096 for memory and 1024 for speed (default: 16384 and 4096)")
    args = parser.parse_args(argv)
    result = measure(run_worker, quick=args.quick)
    print(json.dumps(result))
    print("\n".join(section(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
