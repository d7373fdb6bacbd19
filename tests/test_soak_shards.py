"""Soak shards (``mhaspec soak --shard/--shards/--dask``): seeds derived from a base seed, merges
that refuse duplicates and foreign suites, and a Dask LocalCluster run equal to the serial one.

Axis legend: none (the soak's results are counts per backend x dtype)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from mhaspec import soak, soak_shards, usage

SUITE = {"version": "1.3.0", "git_commit": "a" * 40, "files_sha256": "b" * 64}


def shard_summary(base_seed, i, n, *, backend="numpy-batched", dtype="float64", suite=SUITE):
    """A summary as one shard's soak writes it (counts made up; one round whose seed the shard's
    generator drew first)."""
    import random
    seed = random.Random(soak_shards.shard_seed(base_seed, i, n)).randrange(2 ** 32)
    return {"command": ["mhaspec", "soak"], "backends": [backend], "profile": "certify",
            "shapes": "menu", "target_examples": 10, "examples_per_test": 2, "elapsed_s": 1.0,
            "rounds": [{"round": 1, "backend": backend, "seed": seed}], "failures": [],
            "by_backend_dtype": {f"{backend}/{dtype}": {"backend": backend, "dtype": dtype,
                                                         "examples": 5, "calls": 6, "tests": 1,
                                                         "failures": 0}},
            "base_seed": base_seed, "shard": [i, n], "suite": suite}


def merge_files(tmp_path, *summaries):
    paths = []
    for k, s in enumerate(summaries):
        paths.append(tmp_path / f"s{k}.json")
        paths[-1].write_text(json.dumps(s))
    code = soak.main(["--merge", *map(str, paths), "--output-dir", str(tmp_path / "merged")])
    return code, json.loads((tmp_path / "merged" / "summary.json").read_text()), paths


def test_shard_seeds_are_distinct_and_reproducible():
    seeds = [soak_shards.shard_seed(7, i, 8) for i in range(1, 9)]
    assert len(set(seeds)) == 8
    assert seeds == [soak_shards.shard_seed(7, i, 8) for i in range(1, 9)]
    assert soak_shards.shard_seed(7, 1, 8) not in {soak_shards.shard_seed(8, 1, 8),
                                                   soak_shards.shard_seed(7, 1, 4)}
    assert all(0 <= s < 2 ** 64 for s in seeds)
    assert soak_shards.parse_shard("2/4") == (2, 4)
    for bad in ("0/4", "5/4", "2", "a/b", "-1/2"):
        with pytest.raises(usage.UsageError, match="^--shard: expected I/N"):
            soak_shards.parse_shard(bad)


def test_merge_adds_shards_and_records_them(tmp_path):
    code, merged, _ = merge_files(tmp_path, shard_summary(7, 1, 2), shard_summary(7, 2, 2))
    assert code == 0
    assert merged["by_backend_dtype"]["numpy-batched/float64"]["examples"] == 10
    assert merged["shards"] == [{"base_seed": 7, "shard": [1, 2]}, {"base_seed": 7, "shard": [2, 2]}]
    assert merged["suite"] == SUITE and "shard" not in merged
    # the same shard on other cells (a CI matrix: backend x dtype x shard) is no duplicate
    code, merged, _ = merge_files(tmp_path, shard_summary(7, 1, 2),
                                  shard_summary(7, 1, 2, dtype="float32"),
                                  shard_summary(7, 1, 2, backend="numpy-perhead"))
    assert code == 0 and len(merged["by_backend_dtype"]) == 3


def test_merge_refuses_a_duplicate_shard_or_seed_naming_the_files(tmp_path):
    with pytest.raises(usage.UsageError) as exc:
        merge_files(tmp_path, shard_summary(7, 1, 2), shard_summary(7, 2, 2),
                    shard_summary(7, 1, 2))
    message = str(exc.value)
    assert message == (f"--merge: {tmp_path / 's0.json'} and {tmp_path / 's2.json'} both hold "
                       f"shard 1/2 of base seed 7"), message
    # a round seed run twice on one cell (two unsharded soaks with the same --seed)
    one, two = shard_summary(7, 1, 2), shard_summary(9, 1, 2)
    del one["shard"], two["shard"]
    two["rounds"] = one["rounds"]
    with pytest.raises(usage.UsageError, match=r"s0\.json and .*s1\.json both ran round seed"):
        merge_files(tmp_path, one, two)


@pytest.mark.parametrize("field", ["version", "git_commit", "files_sha256", None])
def test_merge_refuses_shards_of_different_suites(tmp_path, field):
    other = {**SUITE, field: "x"} if field else None
    with pytest.raises(usage.UsageError) as exc:
        merge_files(tmp_path, shard_summary(7, 1, 2), shard_summary(7, 2, 2, suite=other))
    message = str(exc.value)
    assert message.startswith(f"--merge: {tmp_path / 's0.json'} and {tmp_path / 's1.json'} are "
                              f"soaks of different suites (mhaspec 1.3.0, "), message
    assert "\n" not in message
    if field == "files_sha256":  # same version and commit: the message shows what differs
        assert message.endswith("files SHA-256 bbbbbbbbbbbb vs mhaspec 1.3.0, commit aaaaaaaaaaaa, "
                                "files SHA-256 x)"), message


def run_shards(tmp_path, name, *extra):
    out = tmp_path / name
    proc = subprocess.run(
        [sys.executable, "-m", "mhaspec.soak", "--backend", "numpy-batched", "--dtypes", "float64",
         "--examples", "1", "--per-test", "1", "--seconds", "600", "--seed", "11", "--shards", "2",
         "--output-dir", str(out), *extra, "--", "-k", "test_heads"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads((out / "summary.json").read_text())


def test_shards_on_a_dask_local_cluster_equal_the_same_shards_run_one_after_another(tmp_path):
    pytest.importorskip("dask.distributed", reason="dask.distributed is not installed "
                                                   "(pip install 'mhaspec[dask]')")
    serial = run_shards(tmp_path, "serial")
    on_dask = run_shards(tmp_path, "dask", "--dask", "LocalCluster")
    assert serial["by_backend_dtype"] and serial["by_backend_dtype"] == on_dask["by_backend_dtype"]
    assert serial["rounds"] == on_dask["rounds"] and serial["failures"] == on_dask["failures"] == []
    seeds = [r["seed"] for r in serial["rounds"]]
    assert len(set(seeds)) == len(seeds) == 2  # one round per shard, each with its own seed
    assert serial["shards"] == [{"base_seed": 11, "shard": [i, 2]} for i in (1, 2)]
    assert serial["suite"] == soak_shards.suite_identity() == on_dask["suite"]
    assert serial["one_after_another"] and not on_dask["one_after_another"]
    assert on_dask["dask"] == "LocalCluster"
    # each shard's own summary says which shard of which base seed it is
    shard = json.loads((tmp_path / "dask" / "shards" / "shard-2-of-2" / "summary.json").read_text())
    assert (shard["base_seed"], shard["shard"]) == (11, [2, 2])
