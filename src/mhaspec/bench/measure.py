"""What every measurement of ``mhaspec bench`` shares: running a worker command in a fresh
interpreter (:func:`run_worker`), timing a call (:func:`timeit`, :func:`alternate`), the memory of
this process and the BLAS thread count."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np


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


def blas_threads() -> int:
    """Threads NumPy's BLAS uses (threadpoolctl when installed, else the CPU count)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return os.cpu_count() or 1
    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return max(counts) if counts else (os.cpu_count() or 1)


def timeit(fn, *, warmup: int, min_reps: int, max_reps: int, min_time: float) -> dict:
    """Median wall time of ``fn()`` after ``warmup`` calls (compilation happens there)."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    first = time.perf_counter() - t0
    times = []
    while len(times) < max_reps and (len(times) < min_reps or sum(times) < min_time):
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    return {"median_s": float(np.median(times)), "min_s": float(np.min(times)), "reps": len(times),
            "warmup_s": first}


def alternate(calls: dict, rounds: int) -> dict:
    """Time each zero-argument call of ``calls`` (name -> call) in alternating blocks, ``rounds``
    blocks each, so that a burst of load from other work hits them alike: ``{"median_s": {name:
    median of the block medians}, "block_medians_s": {name: [...]}}``."""
    times = {n: [] for n in calls}
    for _ in range(rounds):
        for n, call in calls.items():
            r = timeit(call, warmup=2, min_reps=5, max_reps=15, min_time=0.3)
            times[n].append(r["median_s"])
    return {"median_s": {n: float(np.median(v)) for n, v in times.items()}, "block_medians_s": times}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
