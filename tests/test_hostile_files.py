"""Files and backends from a stranger: what ``mhaspec replay``, ``verify``, ``sign`` and the Markdown
certificate must withstand. This file: hostile failure files given to ``replay``. Hostile
certificates (``verify``, ``sign``) are in ``test_hostile_certificates.py``, the Markdown
certificate in ``test_hostile_markdown.py``, hostile backends and arguments of the other
subcommands in ``test_hostile_cli.py``; their shared helpers in ``hostile_files.py``.

Each test reproduces a finding against an earlier release (replay imported the backend a file
named, loaded every array before checking sizes, cast complex arrays; verify checked only the
schema and the digest; the Markdown embedded names unescaped; ...) and checks the fix: a file is
data, a usage error is one line on stderr with exit status 2, a replayed case that still fails is
exit status 1.
"""

from __future__ import annotations

import io
import json
import pathlib
import re
import tracemalloc
import zipfile

import numpy as np
import pytest

from mhaspec.conformance import failure_file
from mhaspec.conformance.strategies import CaseSpec, build_case
from mhaspec.spec import load as load_spec

from hostile_files import (CASE, assert_usage_error, members, mhaspec, npy_bytes, rewrite, run_cli,
                           saved_case)

EVIL_MODULE = '''
import pathlib
pathlib.Path(__file__).with_name("EVIL-RAN").write_text("imported")
BACKEND = None
'''
WRONG_BACKEND = '''
from mhaspec.backends.np_backend import BATCHED


class OffByOne:
    """numpy-batched with 1 added to every attention output."""

    name = "off-by-one"

    def __getattr__(self, member):
        return getattr(BATCHED, member)

    def scaled_dot_product_attention(self, q, k, v, **kw):
        out, weights = BATCHED.scaled_dot_product_attention(q, k, v, **kw)
        return out + 1, weights


class WrongShape(OffByOne):
    name = "wrong-shape"

    def scaled_dot_product_attention(self, q, k, v, **kw):
        out, weights = BATCHED.scaled_dot_product_attention(q, k, v, **kw)
        return out[..., :1, :], weights


class Raises(OffByOne):
    name = "raises"

    def scaled_dot_product_attention(self, q, k, v, **kw):
        raise RuntimeError("boom")


BACKEND = OffByOne()
RAISES = Raises()
WRONG_SHAPE = WrongShape()
'''


# -- helpers ---------------------------------------------------------------------------------------

def npy_header(shape: tuple[int, ...]) -> bytes:
    """The header of a float64 .npy file of ``shape``, without its data (nothing allocated)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def meta_of(path: pathlib.Path) -> dict:
    return json.loads(str(np.load(io.BytesIO(members(path)["meta.npy"]))))


# -- replay never runs code a file names -----------------------------------------------------------

@pytest.mark.parametrize("ref", ["evil:BACKEND", "this:x"])
def test_replay_never_imports_the_backend_a_file_names(tmp_path, ref):
    (tmp_path / "evil.py").write_text(EVIL_MODULE, "utf-8")
    case = saved_case(tmp_path, backend_ref=ref)
    for args in ([], ["--recorded-backend"]):
        proc = mhaspec(tmp_path, "replay", str(case), *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert "Beautiful is better than ugly" not in proc.stdout + proc.stderr
        assert not (tmp_path / "EVIL-RAN").exists(), "replay imported the module the file names"
    assert "never imported" in proc.stderr


def test_replay_on_the_recorded_registered_name_needs_the_flag(tmp_path, capsys):
    case = saved_case(tmp_path, backend_ref="numpy-batched")
    assert_usage_error(run_cli(capsys, "replay", str(case)), "--backend", "--recorded-backend")
    code, out, err = run_cli(capsys, "replay", str(case), "--recorded-backend")
    assert code == 0, out + err
    assert "on numpy-batched" in out and "DOES NOT CONFORM" not in out


def test_replay_on_the_named_backend_exits_1_while_the_case_still_fails(tmp_path, capsys,
                                                                        monkeypatch):
    (tmp_path / "wrong_backend.py").write_text(WRONG_BACKEND, "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    case = saved_case(tmp_path)
    code, out, err = run_cli(capsys, "replay", str(case), "--backend", "wrong_backend:BACKEND")
    assert code == 1 and "off-by-one sdpa output: DOES NOT CONFORM" in out, out + err
    # the two values at the largest error, not the verdict alone: 1 added to the oracle's
    got, want = map(float, re.search(r"output: got (\S+) where the oracle gives (\S+) at index \(",
                                     out).groups())
    assert abs(got - want - 1.0) < 1e-9, out
    code, out, err = run_cli(capsys, "replay", str(case), "--backend", "wrong_backend:RAISES")
    assert code == 1 and "raised RuntimeError: boom" in out, out + err
    code, out, err = run_cli(capsys, "replay", str(case), "--backend", "wrong_backend:WRONG_SHAPE")
    assert code == 1 and "wrong-shape sdpa" in out and "DOES NOT CONFORM" in out, out + err
    code, out, err = run_cli(capsys, "replay", str(case), "--backend", "numpy-perhead")
    assert code == 0 and "numpy-perhead sdpa output: conforms" in out, out + err


def test_a_saved_case_reads_back_identical_with_shared_inputs_shared(tmp_path):
    spec = CaseSpec(self_attention=True, mask_shape=(1, 3), key_padding=True, causal="top_left")
    original = build_case(spec)
    meta, case = failure_file.read_case(saved_case(tmp_path, op="mha", spec=spec))
    assert meta["aliases"] == {"key": "query", "value": "query"}
    assert case.key is case.query and case.value is case.query  # MHA-3: one array, not three
    pairs = [(f, getattr(case, f), getattr(original, f)) for f in failure_file.ARRAY_FIELDS]
    pairs += [(f, getattr(case.params, f), getattr(original.params, f)) for f in case.params._fields]
    for field, got, want in pairs:
        assert (got is None) == (want is None), field
        if want is not None:
            np.testing.assert_array_equal(got, want, err_msg=field)


# -- replay checks sizes before it reads ----------------------------------------------------------

def write_bomb(path: pathlib.Path, name: str, header: bytes, zeros: int) -> None:
    """Append member ``name``: ``header`` then ``zeros`` zero bytes, deflated."""
    info = zipfile.ZipInfo(name)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "a") as z, z.open(info, "w", force_zip64=True) as f:
        f.write(header)
        chunk = bytes(2**24)
        for _ in range(zeros // len(chunk)):
            f.write(chunk)


def test_a_zip_bomb_is_refused_before_anything_is_decompressed(tmp_path, capsys):
    # spec shapes as large as the bomb's member, so only the size checks can refuse it
    spec = CaseSpec(batch=1, heads=1, len_q=2**15, len_k=3, d_k=2**11, d_v=4)
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w") as z:
        meta = {"format": failure_file.FORMAT, "spec_version": load_spec().version, "op": "sdpa",
                "clause": "SDPA-1", "backend": "numpy-batched", "device": "cpu",
                "dtype": "float64", "spec": spec._asdict(), "overrides": {}}
        z.writestr("meta.npy", npy_bytes(np.array(json.dumps(meta))))
    write_bomb(path, "q.npy", npy_header((1, 1, 2**15, 2**11)), 2**29)  # 512 MiB of zeros
    assert path.stat().st_size < 2**20 * 1.5, path.stat().st_size
    tracemalloc.start()
    try:
        with pytest.raises(failure_file.FailureFileError, match="ratio|more than"):
            failure_file.read_case(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"refusing the bomb allocated {peak} bytes"
    # even under a cap large enough for its size, the compression ratio alone refuses it
    with pytest.raises(failure_file.FailureFileError, match="ratio"):
        failure_file.read_case(path, max_bytes=2**31)
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"),
                       "bomb.npz")


@pytest.mark.parametrize("declared", ["member", "header"])
def test_a_small_file_with_fake_sizes_is_refused_without_allocating(tmp_path, capsys, declared):
    """13 KB on disk; its q declares (1, 1, 2^17, 2^13) float64 = 8 GiB in the .npy header
    ("header"), or in the zip directory as well ("member")."""
    spec = CaseSpec(batch=1, heads=1, len_q=2**17, len_k=3, d_k=2**13, d_v=4)
    path = saved_case(tmp_path, name="fake.npz", spec=CaseSpec())  # q is the first array read
    content = members(path)
    meta = meta_of(path) | {"spec": spec._asdict(), "aliases": {}}
    content["meta.npy"] = npy_bytes(np.array(json.dumps(meta)))
    with zipfile.ZipFile(path, "w") as z:
        for name, data in content.items():
            if name == "q.npy":
                data = npy_header((1, 1, 2**17, 2**13)) + bytes(4096)
            z.writestr(name, data)
    if declared == "member":  # patch the directory's sizes of q.npy to claim 8 GiB
        raw = bytearray(path.read_bytes())
        offset = raw.rfind(b"PK\x01\x02", 0, raw.find(b"q.npy", raw.find(b"PK\x01\x02")))
        raw[offset + 24:offset + 28] = (2**32 - 2).to_bytes(4, "little")  # uncompressed size
        path.write_bytes(bytes(raw))
    assert path.stat().st_size < 16 * 2**10
    tracemalloc.start()
    try:
        with pytest.raises(failure_file.FailureFileError,
                           match="its header" if declared == "header" else "declare more than"):
            failure_file.read_case(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"refusing the file allocated {peak} bytes"
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"),
                       "fake.npz")


def test_max_bytes_raises_the_cap(tmp_path, capsys):
    path = saved_case(tmp_path)
    size = sum(i.file_size for i in zipfile.ZipFile(path).infolist())
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched",
                               "--max-bytes", str(size // 2)), "--max-bytes")
    assert run_cli(capsys, "replay", str(path), "--backend", "numpy-batched",
                   "--max-bytes", str(size * 2))[0] == 0


def test_small_arrays_whose_results_would_be_huge_are_refused(tmp_path):
    """q (1, 1, 2^16, 1) and v (1, 1, 1, 2^16) take 512 KiB each; the (B, h, L_q, d_v) output of
    SDPA would take 32 GiB."""
    spec = CaseSpec(batch=1, heads=1, len_q=2**16, len_k=1, d_k=1, d_v=2**16)
    path = saved_case(tmp_path, spec=spec)
    tracemalloc.start()
    try:
        with pytest.raises(failure_file.FailureFileError, match="intermediates"):
            failure_file.read_case(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, f"refusing the case allocated {peak} bytes"


def test_a_zip_directory_of_many_members_is_refused_from_its_end_record(tmp_path, capsys):
    path = tmp_path / "many.npz"
    with zipfile.ZipFile(path, "w") as z:
        for i in range(failure_file.MAX_MEMBERS + 1):
            z.writestr(f"m{i}.npy", b"")
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"),
                       "members")


# -- replay: every malformed file is one line, exit status 2 -----------------------------------------

def test_an_empty_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "empty.npz").write_bytes(b"")
    assert_usage_error(run_cli(capsys, "replay", str(tmp_path / "empty.npz"), "--backend",
                               "numpy-batched"), "empty")


def test_a_npy_file_is_a_usage_error(tmp_path, capsys):
    np.save(tmp_path / "case.npy", np.zeros(3))
    assert_usage_error(run_cli(capsys, "replay", str(tmp_path / "case.npy"), "--backend",
                               "numpy-batched"), ".npz")


def test_a_directory_or_a_missing_file_is_a_usage_error(tmp_path, capsys):
    (tmp_path / "dir.npz").mkdir()
    for name in ("dir.npz", "no.npz"):
        assert_usage_error(run_cli(capsys, "replay", str(tmp_path / name), "--backend",
                                   "numpy-batched"), name)


BAD_META = {  # what -> (the change to a valid file's meta, a word the refusal must contain)
    "not JSON": ("{'op': 'sdpa'", "not JSON"),
    "a list": ("[1, 2]", "JSON object"),
    "an unknown field": ({"extra": 1}, "unknown ['extra']"),
    "a missing field": ({"op": None}, "missing ['op']"),
    "an unknown op": ({"op": "mlp"}, "unknown op 'mlp'"),
    "an unknown dtype": ({"dtype": "float8"}, "unknown dtype 'float8'"),
    "another spec version": ({"spec_version": "0.1"}, "spec '0.1'"),
    "an unknown spec field": ({"spec": {"batch": 2, "exec": "print(1)"}}, "unknown fields ['exec']"),
    "a negative size": ({"spec": {"batch": -2}}, "invalid values for ['batch']"),
    "a string size": ({"spec": {"batch": "2"}}, "invalid values for ['batch']"),
    "a boolean size": ({"spec": {"batch": True}}, "invalid values for ['batch']"),
    "an unknown override": ({"overrides": {"num_heads": 3}}, "'overrides'"),
    "an unknown causal alignment": ({"overrides": {"causal": "everywhere"}}, "'overrides'"),
    "num_kv_heads for sdpa": ({"overrides": {"num_kv_heads": 1}}, "needs op 'mha'"),
    "num_kv_heads of zero": ({"overrides": {"num_kv_heads": 0}}, "'overrides'"),
    "an array override": ({"overrides": {"mask": [True]}}, "'overrides'"),
    "an alias over a stored input": ({"aliases": {"key": "query"}}, "alias 'key'"),
    "a bad alias": ({"aliases": {"query": "value"}}, "'aliases'"),
    # issue 22, item 8: every field against its grammar; input the spec calls invalid is refused
    "an unknown extreme": ({"spec": {"extreme": "bogus"}}, "['extreme']"),
    "an extreme of an unknown array": ({"spec": {"extreme": "nonfinite:nan:w_z"}}, "['extreme']"),
    "an extreme with an extra part": ({"spec": {"extreme": "masked-key:nan:q"}}, "['extreme']"),
    "a scale of 0 (ERR-10)": ({"overrides": {"scale": 0}}, "scale=0"),
    "an infinite scale": ({"overrides": {"scale": 1e309}}, "scale=inf"),
    "a negative scale in the spec": ({"spec": {"scale": -1.0}}, "['scale']"),
    "a negative logit scale": ({"spec": {"logit_scale": -4.0}}, "['logit_scale']"),
    "a mask density over 1": ({"spec": {"mask_density": 2.0}}, "['mask_density']"),
    "a clause that is no clause id": ({"clause": "MASK-1; rm -rf"}, "'clause'"),
    "a device that is no device name": ({"device": "cpu\u001b[2J"}, "'device'"),
    "a mask that does not broadcast (ERR-7)": ({"spec": {"mask_shape": [5, 1, 3, 3]}}, "ERR-7"),
    "a legacy mask in float16 (ERR-9)": ({"dtype": "float16", "spec": {"legacy_shape": [3, 3]}},
                                         "ERR-9"),
}


@pytest.mark.parametrize("what", BAD_META)
def test_malformed_metadata_is_a_usage_error(tmp_path, capsys, what):
    path = saved_case(tmp_path)
    change, word = BAD_META[what]
    if isinstance(change, str):
        meta = change
    else:
        meta = meta_of(path)
        for key, value in change.items():
            if value is None:
                del meta[key]
            elif key == "spec":
                meta["spec"] = {**meta["spec"], **value}
            else:
                meta[key] = value
    rewrite(path, meta=meta)
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"),
                       str(path), word)


def test_logits_that_overflow_the_naive_algorithm_are_not_judged(tmp_path, capsys, monkeypatch):
    """Old: q and k of magnitude 1e154 (logits near 1e308) overflow the float32 naive algorithm,
    NUM-3 allowed an infinite error and a backend off by one "conformed" (exit status 0)."""
    (tmp_path / "wrong_backend.py").write_text(WRONG_BACKEND, "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    case = build_case(CASE)
    path = rewrite(saved_case(tmp_path), q=case.q * 1e154, k=case.k * 1e154)
    for backend in ("wrong_backend:BACKEND", "numpy-batched"):
        assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", backend),
                           "no finite allowance", "not replayed")
    # the same file with ordinary magnitudes is judged
    path = rewrite(path, q=case.q * 10, k=case.k * 10)
    assert run_cli(capsys, "replay", str(path), "--backend", "wrong_backend:BACKEND")[0] == 1


def test_a_failure_file_is_never_written_through_a_planted_symlink(tmp_path):
    """Old: save_case wrote through a symlink planted in NAME-failures/ (a file outside the
    output directory was overwritten with a zip)."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me", "utf-8")
    failures = tmp_path / "failures"
    failures.mkdir()
    (failures / "case.npz").symlink_to(outside)
    path = saved_case(failures)
    assert outside.read_text("utf-8") == "keep me"
    assert not path.is_symlink() and zipfile.is_zipfile(path)
    assert sorted(p.name for p in failures.iterdir()) == ["case.npz"]  # no temporary file left
    failure_file.read_case(path)


def _sentence(text: str, opening: str) -> str:
    start = text.index(opening)
    return text[start:text.index("\n\n", start)]


def test_the_docs_list_the_members_and_overrides_a_failure_file_may_hold():
    """Old: docs/certificates.md said 19 members and the overrides of spec 1.1; the reader accepts
    27 members and spec 1.2's features."""
    text = (pathlib.Path(__file__).parents[1] / "docs" / "certificates.md").read_text("utf-8")
    assert f"more members than a case can\n  ({failure_file.MAX_MEMBERS})" in text
    members = re.findall(r"`(\w+)`", _sentence(text, "The members a failure file may hold"))
    known = ["meta", *failure_file.ARRAY_FIELDS, *failure_file.PARAMS, *failure_file.FEATURE_FIELDS,
             "sinks"]
    assert members == known and len(known) == failure_file.MAX_MEMBERS
    overrides = _sentence(text, "The overrides a failure file may record")
    valued, _, cleared = overrides.partition("set to null only")
    cleared_only = {k for k, check in failure_file.OVERRIDE_CHECKS.items() if not check(1.0)
                    and not check("top_left") and not check([1, 1]) and not check(2)
                    and not check(True)}
    assert set(re.findall(r"`(\w+)`", cleared)) == cleared_only
    assert set(re.findall(r"`(\w+)`", valued)) - {"spec"} == (
        set(failure_file.OVERRIDE_CHECKS) - cleared_only)


def test_an_alias_to_an_input_the_file_lacks_is_a_usage_error(tmp_path, capsys):
    path = saved_case(tmp_path)
    content = {n: d for n, d in members(path).items() if n not in ("query.npy", "key.npy")}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in content.items():
            z.writestr(name, data)
    rewrite(path, meta=meta_of(path) | {"aliases": {"key": "query"}})
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"), "alias")


def test_duplicate_metadata_keys_are_a_usage_error(tmp_path, capsys):
    path = saved_case(tmp_path)
    text = json.dumps(meta_of(path))
    rewrite(path, meta=text[:-1] + ', "op": "mha"}')
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"), "twice")


@pytest.mark.parametrize("array, reason", [
    (np.zeros((2, 2, 3, 4), dtype=np.complex128), "must be float16/32/64"),
    (np.zeros((2, 2, 3, 4), dtype=np.int64), "must be float16/32/64"),
    (np.zeros((2, 2, 3, 4), dtype=">f4").view([("a", ">f4")]), "must be float16/32/64"),
    (np.zeros((2, 2, 3, 4), dtype=np.longdouble), "must be float16/32/64"),
    (np.zeros((2, 2, 3, 5)), "has shape (2, 2, 3, 5)"),
    (np.zeros((2, 2, 3)), "has shape (2, 2, 3)"),
], ids=["complex", "integer", "structured", "long-double", "wrong-shape", "wrong-rank"])
def test_arrays_of_the_wrong_kind_or_shape_are_refused_not_cast(tmp_path, capsys, array, reason):
    path = rewrite(saved_case(tmp_path), q=array)
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"),
                       f"array 'q' {reason}")


def test_big_endian_and_float32_arrays_are_read_as_they_are(tmp_path):
    case = build_case(CASE)
    path = rewrite(saved_case(tmp_path), q=case.q.astype(">f8"), k=case.k.astype(np.float32))
    _, read = failure_file.read_case(path)
    assert read.q.dtype == np.dtype(">f8") and read.k.dtype == np.float32
    np.testing.assert_array_equal(read.q, case.q)


def test_a_float_mask_and_an_unknown_member_are_refused(tmp_path, capsys):
    path = rewrite(saved_case(tmp_path), mask=np.ones((2, 1, 3, 3)))
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"), "boolean")
    path = rewrite(saved_case(tmp_path), evil=np.ones(3))
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"), "evil.npy")


def test_a_missing_array_is_refused(tmp_path, capsys):
    path = saved_case(tmp_path)
    content = {n: d for n, d in members(path).items() if n != "k.npy"}
    with zipfile.ZipFile(path, "w") as z:
        for name, data in content.items():
            z.writestr(name, data)
    assert_usage_error(run_cli(capsys, "replay", str(path), "--backend", "numpy-batched"), "k")
