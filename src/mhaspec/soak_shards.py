"""Soak shards: one soak split over processes or machines, each shard seeded from one base seed.

Shard ``i`` of ``n`` (``mhaspec soak --shard i/n --seed BASE``, 1 <= i <= n) seeds its generator of
per-round Hypothesis seeds with :func:`shard_seed`: the first 8 bytes (big-endian) of
SHA-256(``"mhaspec-soak-shard:BASE:i:n"``). Shards of one base seed therefore draw different round
seeds, and the same shard of the same base seed draws the same ones again. A shard's summary records
``base_seed``, ``shard`` (``[i, n]``) and ``suite`` (:func:`suite_identity`); :func:`check_mergeable`
refuses to merge two summaries that ran the same shard or the same round seed on a common
backend x dtype cell, or that ran different suites.

:func:`run_shards` runs ``n`` shards, each ``python -m mhaspec.soak --shard i/n`` in a subprocess,
one after another here or as tasks of a Dask cluster (``dask.distributed``, the optional extra
``mhaspec[dask]``): Dask only schedules the subprocesses, every shard is the ordinary soak.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import sys

from mhaspec import __version__, certificate, suite_files, usage


def parse_shard(text: str) -> tuple[int, int]:
    """``"2/4"`` -> ``(2, 4)``; a :class:`usage.UsageError` naming ``--shard`` otherwise."""
    i, sep, n = text.partition("/")
    if sep and i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n):
        return int(i), int(n)
    raise usage.UsageError(f"--shard: expected I/N with 1 <= I <= N (e.g. 2/4), got {text!r}")


def shard_seed(base_seed: int, index: int, count: int) -> int:
    """The seed of shard ``index`` of ``count`` (1-based) of a soak with ``base_seed``: the first 8
    bytes of SHA-256(``"mhaspec-soak-shard:{base_seed}:{index}:{count}"``), big-endian."""
    text = f"mhaspec-soak-shard:{base_seed}:{index}:{count}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big")


def suite_identity() -> dict:
    """The suite that runs: its version, git commit (None outside a checkout) and the SHA-256 of
    its installed files (:mod:`mhaspec.suite_files`), as a certificate names it."""
    return {"version": __version__, "git_commit": certificate.git_commit(),
            "files_sha256": suite_files.digest()}


def shards_of(summary: dict) -> set[tuple]:
    """(base seed, i, n) of every shard a summary holds (a merged one lists its shards)."""
    held = summary.get("shards") or ([{"base_seed": summary["base_seed"], "shard": summary["shard"]}]
                                     if summary.get("shard") else [])
    return {(s["base_seed"], *s["shard"]) for s in held}


def _seeds(summary: dict) -> set[int]:
    return {r["seed"] for r in summary["rounds"] if "seed" in r}


def suite_text(suite: dict | None) -> str:
    """``"mhaspec 1.4.0, commit 0123456789ab, files SHA-256 d3ab5121c1d5"`` (a summary's
    ``suite``, :func:`suite_identity`): which code a soak ran, in one phrase."""
    if not suite:
        return "no suite recorded"
    commit = f"commit {suite['git_commit'][:12]}, " if suite.get("git_commit") else ""
    return f"mhaspec {suite.get('version')}, {commit}files SHA-256 {str(suite.get('files_sha256'))[:12]}"


def check_mergeable(summaries: list[dict], names: list[str]) -> None:
    """Refuse (:class:`usage.UsageError`, one line naming the two files) soaks of different suites
    (version, git commit or files digest), and two soaks that share a backend x dtype cell and ran
    the same shard of a base seed or the same round seed there (their examples would count twice)."""
    first_suite = summaries[0].get("suite")
    for name, s in zip(names[1:], summaries[1:]):
        if s.get("suite") != first_suite:
            raise usage.UsageError(
                f"--merge: {names[0]} and {name} are soaks of different suites "
                f"({suite_text(first_suite)} vs {suite_text(s.get('suite'))})")
    for a in range(len(summaries)):
        for b in range(a + 1, len(summaries)):
            sa, sb = summaries[a], summaries[b]
            if not set(sa["by_backend_dtype"]) & set(sb["by_backend_dtype"]):
                continue
            shards = sorted(shards_of(sa) & shards_of(sb))
            seeds = sorted(_seeds(sa) & _seeds(sb))
            if shards:
                base, i, n = shards[0]
                raise usage.UsageError(f"--merge: {names[a]} and {names[b]} both hold shard "
                                       f"{i}/{n} of base seed {base}")
            if seeds:
                raise usage.UsageError(f"--merge: {names[a]} and {names[b]} both ran round seed "
                                       f"{seeds[0]} on the same backend x dtype")


def run_shard(index: int, count: int, base_seed: int, soak_args: list[str],
              output_dir: str) -> dict:
    """Run shard ``index``/``count`` as ``python -m mhaspec.soak`` in a subprocess (on whichever
    machine calls this) and return its summary, with ``returncode`` added."""
    out = pathlib.Path(output_dir) / f"shard-{index}-of-{count}"
    cmd = [sys.executable, "-m", "mhaspec.soak", "--shard", f"{index}/{count}",
           "--seed", str(base_seed), "--output-dir", str(out), *soak_args]
    out.mkdir(parents=True, exist_ok=True)
    with (out / "shard.log").open("w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        summary = json.loads((out / "summary.json").read_text("utf-8"))
    except (OSError, ValueError):
        raise RuntimeError(f"soak shard {index}/{count} wrote no summary (exit {proc.returncode}); "
                           f"see {out / 'shard.log'}") from None
    return {**summary, "returncode": proc.returncode}


@contextlib.contextmanager
def _client(address: str, workers: int):
    """A Dask client of the cluster at ``address``, or of a LocalCluster of ``workers`` worker
    processes (one thread each) started and closed here."""
    try:
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise usage.UsageError("--dask: dask.distributed is not installed "
                               "(pip install 'mhaspec[dask]')") from None
    if address != "LocalCluster":
        with Client(address) as client:
            yield client
        return
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def run_shards(count: int, base_seed: int, soak_args: list[str], output_dir: pathlib.Path,
               dask: str | None = None) -> list[dict]:
    """The summaries of shards 1..``count``, run one after another here (``dask`` None) or as
    ``count`` tasks on the Dask cluster at ``dask`` (an address, or ``"LocalCluster"``: one worker
    process per shard on this machine, at most one per core). Each task runs :func:`run_shard`."""
    jobs = [(i, count, base_seed, soak_args, str(output_dir.resolve())) for i in
            range(1, count + 1)]
    if dask is None:
        return [run_shard(*job) for job in jobs]
    with _client(dask, min(count, os.cpu_count() or 1)) as client:
        futures = [client.submit(run_shard, *job, pure=False, key=f"soak-shard-{job[0]}-of-{count}")
                   for job in jobs]
        return client.gather(futures)
