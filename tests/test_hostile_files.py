"""Files and backends from a stranger: what ``mhaspec replay``, ``verify``, ``sign`` and the Markdown
certificate must withstand. Every hostile file and backend is built here.

Each test reproduces a finding against an earlier release (replay imported the backend a file
named, loaded every array before checking sizes, cast complex arrays; verify checked only the
schema and the digest; the Markdown embedded names unescaped; ...) and checks the fix: a file is
data, a usage error is one line on stderr with exit status 2, a replayed case that still fails is
exit status 1.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

from mhaspec import certificate, certificate_markdown, certificate_signature, cli
from mhaspec.conformance import failure_file, failure_save
from mhaspec.conformance.clause_capabilities import NEEDS
from mhaspec.conformance.strategies import CaseSpec, build_case
from mhaspec.conformance.verdicts import count_verdicts, overall_verdict
from mhaspec.spec import load as load_spec
import mhaspec.spec
from mhaspec.spec.render import render_markdown


class Parametrization:
    """What ``failure_save.save_case`` reads of a parametrization: device and dtype."""

    device = "cpu"
    dtype = "float64"


SPEC_DIR = pathlib.Path(mhaspec.spec.__file__).parent
CASE = CaseSpec(mask_shape=(2, 1, 3, 3), bias_shape=(3, 3))
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
BROKEN_BACKENDS = '''
class BadConstructor:
    def __init__(self):
        raise RuntimeError("constructor\\nfails\\non three lines")


class BadVersion:
    name = "bad-version"
    framework = "numpy"
    capabilities = frozenset({"sdpa"})

    def framework_version(self):
        raise OSError("no version")

    def devices(self):
        return {"cpu": None}

    def dtypes(self, device):
        return ("float64",)

    def asarray(self, x, *, dtype, device="cpu"):
        return x

    def to_numpy(self, x):
        return x


VERSION = BadVersion()
'''


# -- helpers ---------------------------------------------------------------------------------------

def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """``mhaspec ARGS`` in this process: (exit status, stdout, stderr); an uncaught exception fails
    the test (it would be a traceback for the user)."""
    try:
        code = cli.main(list(args))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_usage_error(result: tuple[int, str, str], *words: str) -> None:
    code, out, err = result
    assert code == 2, (code, out[-2000:], err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhaspec: error: "), err
    assert "Traceback" not in out + err
    for word in words:
        assert word in lines[0], (word, lines[0])


def mhaspec(cwd: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """``mhaspec ARGS`` in a subprocess run from ``cwd``, with ``cwd`` on the import path (the worst
    case: a module next to a hostile file is importable)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(cwd), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mhaspec.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def saved_case(tmp_path, *, op="sdpa", backend_ref="numpy-batched", spec=CASE,
               name="case.npz") -> pathlib.Path:
    return failure_save.save_case(tmp_path / name, Parametrization(), build_case(spec), op=op,
                                  clause="MASK-1", backend_ref=backend_ref, overrides={})


def members(path: pathlib.Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def npy_header(shape: tuple[int, ...]) -> bytes:
    """The header of a float64 .npy file of ``shape``, without its data (nothing allocated)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False,
                                               "shape": shape})
    return buf.getvalue()


def meta_of(path: pathlib.Path) -> dict:
    return json.loads(str(np.load(io.BytesIO(members(path)["meta.npy"]))))


def rewrite(path: pathlib.Path, *, meta: dict | str | None = None, **arrays) -> pathlib.Path:
    """``path`` with its meta (a dict, or raw text) and some members replaced (bytes or arrays)."""
    content = members(path)
    if meta is not None:
        content["meta.npy"] = npy_bytes(np.array(meta if isinstance(meta, str) else json.dumps(meta)))
    for name, value in arrays.items():
        content[f"{name}.npy"] = value if isinstance(value, bytes) else npy_bytes(value)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in content.items():
            z.writestr(name, data)
    return path


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


# -- backends whose own code fails -----------------------------------------------------------------

@pytest.mark.parametrize("ref, words", [
    ("broken_import:BACKEND", ("broken_import", "ZeroDivisionError")),
    ("broken_ctor:BadConstructor", ("broken_ctor", "constructor fails on three lines")),
    ("broken_ctor:VERSION", ("framework_version()", "no version")),
    ("no_such_module_x:B", ("no_such_module_x",)),
])
def test_a_backend_whose_own_code_raises_is_a_usage_error(tmp_path, capsys, monkeypatch, ref, words):
    (tmp_path / "broken_import.py").write_text("1 / 0\n", "utf-8")
    (tmp_path / "broken_ctor.py").write_text(BROKEN_BACKENDS, "utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    case = saved_case(tmp_path)
    assert_usage_error(run_cli(capsys, "replay", str(case), "--backend", ref), *words)


def test_a_backend_whose_import_raises_does_not_start_certify(tmp_path):
    (tmp_path / "broken_import.py").write_text("raise RuntimeError('broken\\nat import')\n", "utf-8")
    proc = mhaspec(tmp_path, "certify", "broken_import:BACKEND", "--output-dir", "out")
    assert proc.returncode == 2 and "broken at import" in proc.stderr, proc.stdout + proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


# -- certify's outputs are checked before the run ---------------------------------------------------

@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_an_output_dir_that_cannot_be_written_is_a_usage_error(tmp_path, where):
    (tmp_path / "taken").write_text("a file\n", "utf-8")
    out = "taken" if where == "file" else "taken/sub"
    proc = mhaspec(tmp_path, "certify", "numpy-batched", "--profile", "ci", "--output-dir", out)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert "taken" in proc.stderr
    assert "passed" not in proc.stdout, "the suite ran before the output was checked"


def test_a_certificate_path_that_is_a_directory_is_found_before_the_run(tmp_path):
    (tmp_path / "out" / "numpy-batched.json").mkdir(parents=True)
    proc = mhaspec(tmp_path, "certify", "numpy-batched", "--profile", "ci", "--output-dir", "out")
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "numpy-batched.json" in proc.stderr and "Traceback" not in proc.stderr
    assert "passed" not in proc.stdout, "the suite ran before the output was checked"


# -- argparse ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [[], ["nosuch"], ["verify"], ["replay", "x.npz", "--max-bytes", "lots"],
                                  ["certify", "numpy-batched", "--profile", "fast"],
                                  ["replay", "x.npz", "--backend", "numpy-batched", "--", "-k", "x"],
                                  ["replay", "x.npz", "--backend", "numpy-batched",
                                   "--recorded-backend"]])
def test_argument_errors_are_one_line(capsys, args):
    assert_usage_error(run_cli(capsys, *args))


# -- verify: integrity, consistency, authenticity ---------------------------------------------------

def certificate_body(**changes) -> dict:
    """A schema-valid certificate body over the current spec: every testable clause passes."""
    spec = load_spec()
    clauses = [{"id": c.id, "title": c.title, "verdict": "pass" if c.testable else "not-run",
                "worst_ratio": 0.5 if c.testable else 0.0, "runs": int(c.testable),
                "ran_on": ["cpu/float64"] if c.testable else [], "not_run_on": [],
                "failures": []} for c in spec.clauses]
    body = {
        "schema": certificate.SCHEMA_ID, "spec": {"name": spec.name, "version": spec.version, "status": spec.status},
        "suite": {"version": "0", "git_commit": None},
        "backend": {"ref": "numpy-batched", "name": "numpy-batched", "framework": "numpy",
                    "framework_version": "2.0", "protocol_version": 1,
                    "capabilities": sorted(set().union(*NEEDS.values())), "deviations": {}},
        "environment": {"python": "3", "platform": "x", "devices": {
            "cpu": {"name": "x86_64", "dtypes": ["float64"], "precision_flags": {}}}},
        "hypothesis": {"profile": "ci", "seed": 0, "max_examples": 8, "backend_calls": 1},
        "issued": "2026-01-01T00:00:00+00:00", "clauses": clauses,
        "summary": {"verdict": overall_verdict(clauses), "counts": count_verdicts(clauses)}}
    body.update(changes)
    return body


def write_certificate(path: pathlib.Path, body: dict) -> pathlib.Path:
    path.write_text(json.dumps(certificate.seal(body), indent=1), "utf-8")
    return path


def test_verify_says_what_it_checked(tmp_path, capsys):
    path = write_certificate(tmp_path / "cert.json", certificate_body())
    code, out, err = run_cli(capsys, "verify", str(path))
    assert code == 0, err
    for line in ("integrity: the body hashes to the recorded SHA-256",
                 "consistency: the", "authenticity: NOT checked"):
        assert line in out, out


def _fail_one(body):
    next(c for c in body["clauses"] if c["verdict"] == "pass")["verdict"] = "fail"


def _drop_clauses(body):
    body["clauses"] = []
    body["summary"]["counts"] = {}


def _repeat_clause(body):
    body["clauses"].append(dict(body["clauses"][3]))
    body["summary"]["counts"] = count_verdicts(body["clauses"])


def _rename_title(body):
    body["clauses"][3]["title"] = "Anything at all"


def _pass_informative(body):
    clause = next(c for c in body["clauses"] if not load_spec().clause(c["id"]).testable)
    clause["verdict"] = "pass"
    body["summary"]["counts"] = count_verdicts(body["clauses"])


def _unknown_spec(body):
    body["spec"]["version"] = "99.0"


def _counts(body):
    body["summary"]["counts"] = {"pass": 1000}


def _not_run_on(body):
    body["clauses"][3]["not_run_on"] = ["cpu/float32"]


def _passing(body) -> dict:
    return next(c for c in body["clauses"] if c["verdict"] == "pass" and NEEDS.get(c["id"]))


def _undeclared_deviation(body):
    _passing(body)["verdict"] = "deviation"
    body["summary"]["counts"] = count_verdicts(body["clauses"])


def _pass_without_runs(body):
    _passing(body)["runs"] = 0


def _pass_without_a_cell(body):
    _passing(body)["ran_on"] = []


def _pass_unclaimed(body):
    body["backend"]["capabilities"] = ["heads"]


def _pass_claiming_nothing(body):
    """Only clauses that need no capability of their own pass (NUM-1, SHAPE-4, ...)."""
    body["backend"]["capabilities"] = []
    for c in body["clauses"]:
        if NEEDS.get(c["id"]) and c["verdict"] == "pass":
            c.update(verdict="not-implemented", ran_on=[])
    body["summary"]["counts"] = count_verdicts(body["clauses"])


def _claimed_cell_never_ran(body):
    body["environment"]["devices"]["cpu"]["dtypes"] = ["float64", "float32"]


def _ran_on_unclaimed_cell(body):
    _passing(body)["ran_on"] = ["cuda/float64"]


def _ratio_past_k(body):
    _passing(body)["worst_ratio"] = 6.3e14


def _conforms_beside_exit_status_1(body):
    body["run"] = {"pytest_args": [], "pytest_exit_status": 1, "call_timeout_s": 60.0,
                   "selection": {"keyword": None, "markers": None, "deselect": [], "dtypes": None},
                   "tests_run": 1, "tests_not_run": 0, "seconds": 1.0}


def _deviation_of_no_clause(body):
    body["backend"]["deviations"] = {"NOPE-1": "a clause that does not exist"}


def _slash_in_a_device(body):
    body["environment"]["devices"]["cpu/x"] = body["environment"]["devices"].pop("cpu")
    for c in body["clauses"]:
        c["ran_on"] = ["cpu/x/float64"] if c["ran_on"] else []


FORGERIES = {"a failing clause under conforms": (_fail_one, "summary"),
             # issue 36, mediums: each was accepted by verify
             "a pass with NUM-3 ratio 6.3e14": (_ratio_past_k, "ratio of 6.3e+14"),
             "conforms beside pytest exit status 1": (_conforms_beside_exit_status_1, "exit status 1"),
             "a deviation of a clause that does not exist": (_deviation_of_no_clause, "NOPE-1"),
             "a '/' in a device name": (_slash_in_a_device, "ambiguous"),
             "no clauses": (_drop_clauses, "missing"),
             "a clause twice": (_repeat_clause, "repeated"),
             "another title": (_rename_title, "title"),
             "an informative clause passed": (_pass_informative, "informative"),
             "spec 99.0": (_unknown_spec, "99.0"),
             "made-up counts": (_counts, "counts"),
             "an incomplete run as conforms": (_not_run_on, "incomplete"),
             # issue 22, item 7: each was accepted by verify
             "a deviation nobody declared": (_undeclared_deviation, "declares no deviation"),
             "a pass with 0 runs": (_pass_without_runs, "a pass needs a run"),
             "a pass that ran on no cell": (_pass_without_a_cell, "a pass needs a run"),
             "a pass of an unclaimed capability": (_pass_unclaimed, "does not claim"),
             "a pass with no capability claimed": (_pass_claiming_nothing, "claims no capability"),
             "a claimed cell no clause ran on": (_claimed_cell_never_ran, "cpu/float32"),
             "a run on an unclaimed cell": (_ran_on_unclaimed_cell, "cuda/float64")}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_verify_rejects_a_resealed_inconsistent_certificate(tmp_path, capsys, forgery):
    edit, word = FORGERIES[forgery]
    body = certificate_body()
    edit(body)
    path = write_certificate(tmp_path / "cert.json", body)
    assert_usage_error(run_cli(capsys, "verify", str(path)), "inconsistent", word)


def test_a_deviation_declared_for_one_operation_is_a_declared_deviation(tmp_path, capsys):
    body = certificate_body()
    clause = _passing(body)
    clause["verdict"] = "deviation"
    body["backend"]["deviations"] = {f"{clause['id']}@mha": "documented behaviour"}
    body["summary"]["counts"] = count_verdicts(body["clauses"])
    code, out, err = run_cli(capsys, "verify", str(write_certificate(tmp_path / "c.json", body)))
    assert code == 0, err


@pytest.mark.parametrize("number", ["1e999", "-1E+400", "1" + "0" * 400])
def test_verify_refuses_numbers_a_float64_cannot_hold(tmp_path, capsys, number):
    """Old: ``1e999`` was read as infinity (past the NaN/Infinity ban) and verified."""
    body = certificate_body()
    body["clauses"][0]["worst_ratio"] = 12345.5
    text = json.dumps(certificate.seal(body)).replace("12345.5", number)
    (tmp_path / "c.json").write_text(text, "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "c.json")), "too large")


def test_verify_refuses_a_lone_surrogate(tmp_path, capsys):
    """Old: a traceback (UnicodeEncodeError while hashing)."""
    body = certificate_body()
    body["backend"]["name"] = "SURROGATE"
    text = json.dumps(certificate.seal(body)).replace("SURROGATE", "\\ud800")
    (tmp_path / "c.json").write_text(text, "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "c.json")), "\\ud800",
                       "surrogate")


class CountingId(str):
    """A clause id that counts how often it is compared for equality."""

    comparisons = 0

    def __eq__(self, other):
        CountingId.comparisons += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_the_consistency_check_is_linear_in_the_number_of_clauses():
    """Old: each clause id was counted in the list of all ids, n^2 comparisons (a 2.8 MB
    certificate took 28 s, 16 MiB about 18 minutes). Counted, not timed: comparisons of ids must
    grow linearly with n repeated clause entries."""
    n = 2000
    body = certificate_body()
    one = body["clauses"][1]
    body["clauses"] += [dict(one, id=CountingId(one["id"])) for _ in range(n)]
    CountingId.comparisons = 0
    with pytest.raises(certificate.CertificateError, match="repeated"):
        certificate.check_consistency(body)
    assert CountingId.comparisons <= 10 * n, CountingId.comparisons


def test_verify_accepts_an_earlier_released_spec_version(tmp_path, capsys):
    text = (SPEC_DIR / "mhaspec-1.0.md").read_text("utf-8")
    clauses = [{"id": i, "title": t, "verdict": "pass" if testable else "not-run", "worst_ratio": 0.0,
                "runs": 1, "ran_on": ["cpu/float64"] if testable else [], "failures": []}
               for i, t, testable in certificate.clauses_of_rendering(text)]
    body = certificate_body(spec={"name": "mhaspec", "version": "1.0"}, clauses=clauses,
                            summary={"verdict": "conforms", "counts": count_verdicts(clauses)})
    code, out, err = run_cli(capsys, "verify", str(write_certificate(tmp_path / "c.json", body)))
    assert code == 0 and "spec 1.0" in out, err


def test_the_clause_headings_of_every_rendering_are_read():
    """The released versions' clause lists come from their frozen renderings: the heading parser
    reads the current spec's rendering back exactly, and every clause heading of each rendering."""
    spec = load_spec()
    assert sorted(certificate.clauses_of_rendering(render_markdown(spec))) == sorted(
        (c.id, c.title, c.testable) for c in spec.clauses)
    renderings = sorted(SPEC_DIR.glob("mhaspec-*.md"))
    assert renderings
    for path in renderings:
        text = path.read_text("utf-8")
        version = path.stem.removeprefix("mhaspec-")
        parsed = certificate.released_clauses(version)
        assert parsed and len(parsed) == text.count("\n### "), path
        if version == spec.version:
            assert sorted(parsed) == sorted(certificate.clauses_of_rendering(text)), path


def test_verify_rejects_duplicate_keys_deep_nesting_directories_and_huge_files(tmp_path, capsys):
    text = json.dumps(certificate.seal(certificate_body()))
    (tmp_path / "dup.json").write_text(text[:-1] + ', "sha256": "' + "0" * 64 + '"}', "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "dup.json")), "twice")
    (tmp_path / "nan.json").write_text(text.replace('"worst_ratio": 0.5', '"worst_ratio": NaN', 1))
    assert "NaN" in (tmp_path / "nan.json").read_text("utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "nan.json")), "NaN")
    (tmp_path / "long.json").write_text('{"schema": ' + "9" * 5000 + "}", "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "long.json")), "not JSON")
    (tmp_path / "deep.json").write_text("[" * 200000 + "]" * 200000, "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "deep.json")), "deep")
    (tmp_path / "dir.json").mkdir()
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "dir.json")), "directory")
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate(certificate.MAX_BYTES + 1)
    assert_usage_error(run_cli(capsys, "verify", str(tmp_path / "huge.json")), "--max-bytes")
    if os.path.exists("/dev/zero"):  # endless, and its size says 0
        assert_usage_error(run_cli(capsys, "verify", "/dev/zero"), "--max-bytes")
        path = write_certificate(tmp_path / "cert.json", certificate_body())
        assert_usage_error(run_cli(capsys, "verify", str(path), "--markdown", "/dev/zero"),
                           "--max-bytes")


def test_verify_checks_the_markdown_against_the_json(tmp_path, capsys):
    path = write_certificate(tmp_path / "cert.json", certificate_body())
    md = tmp_path / "cert.md"
    md.write_text(certificate_markdown.to_markdown(json.loads(path.read_text("utf-8"))), "utf-8")
    code, out, err = run_cli(capsys, "verify", str(path), "--markdown", str(md))
    assert code == 0 and "markdown: " in out, err
    md.write_text(md.read_text("utf-8").replace("**Verdict: conforms on", "**Verdict: conforms! on"))
    assert_usage_error(run_cli(capsys, "verify", str(path), "--markdown", str(md)), "rendering")


def test_verify_escapes_terminal_control_characters(tmp_path, capsys):
    body = certificate_body()
    body["backend"]["name"] = "evil\x1b[2J\x1b]0;owned\x07"
    body["backend"]["framework"] = "numpy\r\nvalid certificate for numpy-batched"
    code, out, err = run_cli(capsys, "verify", str(write_certificate(tmp_path / "c.json", body)))
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "evil\\x1b[2J" in out and "\nvalid certificate" not in out


@pytest.fixture
def signer(tmp_path):
    """An ed25519 key made for the test and an allowed_signers file that trusts it."""
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen (OpenSSH) is not installed: signatures cannot be made or checked")
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "test", "-f", str(key)],
                   check=True, capture_output=True)
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(f'ci@example.org namespaces="{certificate_signature.SIGNATURE_NAMESPACE}" '
                       + key.with_suffix(".pub").read_text("utf-8"), "utf-8")
    return key, allowed


def test_a_signed_certificate_verifies_and_a_resigned_forgery_does_not(tmp_path, capsys, signer):
    key, allowed = signer
    path = write_certificate(tmp_path / "cert.json", certificate_body())
    code, out, err = run_cli(capsys, "sign", str(path), "--key", str(key))
    assert code == 0, err
    sig = pathlib.Path(f"{path}.sig")
    assert sig.read_text("utf-8").startswith("-----BEGIN SSH SIGNATURE-----")
    trusted = ("--signature", str(sig), "--allowed-signers", str(allowed),
               "--identity", "ci@example.org")
    code, out, err = run_cli(capsys, "verify", str(path), *trusted)
    assert code == 0 and "authenticity: signed by ci@example.org" in out, out + err
    # a consistent, re-sealed certificate with another verdict: integrity holds, the signature not
    body = certificate_body()
    body["backend"]["framework_version"] = "3.0"
    write_certificate(path, body)
    assert run_cli(capsys, "verify", str(path))[0] == 0
    assert_usage_error(run_cli(capsys, "verify", str(path), *trusted), "signature")
    # another identity, or signing options without the rest
    write_certificate(path, certificate_body())
    assert_usage_error(run_cli(capsys, "verify", str(path), *trusted[:-1], "someone@else"))
    assert_usage_error(run_cli(capsys, "verify", str(path), "--signature", str(sig)), "together")


def test_sign_over_an_existing_signature_needs_force_and_says_it_replaced_it(tmp_path, capsys,
                                                                           signer):
    """Old: "signed", exit status 0, and the old signature kept (of another certificate)."""
    key, allowed = signer
    path = write_certificate(tmp_path / "cert.json", certificate_body())
    sig = pathlib.Path(f"{path}.sig")
    sig.write_text("-----BEGIN SSH SIGNATURE-----\nold\n-----END SSH SIGNATURE-----\n", "utf-8")
    assert_usage_error(run_cli(capsys, "sign", str(path), "--key", str(key)), "--force", "exists")
    assert "old" in sig.read_text("utf-8")
    code, out, err = run_cli(capsys, "sign", str(path), "--key", str(key), "--force")
    assert code == 0 and "replaced the previous one" in out, out + err
    code, out, err = run_cli(capsys, "verify", str(path), "--signature", str(sig),
                             "--allowed-signers", str(allowed), "--identity", "ci@example.org")
    assert code == 0 and "authenticity: signed by" in out, out + err
    # a planted symlink is replaced, not written through
    target = tmp_path / "elsewhere.txt"
    target.write_text("untouched", "utf-8")
    sig.unlink()
    sig.symlink_to(target)
    code, out, err = run_cli(capsys, "sign", str(path), "--key", str(key), "--force")
    assert code == 0, err
    assert target.read_text("utf-8") == "untouched" and not sig.is_symlink()


def test_sign_refuses_an_inconsistent_certificate(tmp_path, capsys, signer):
    key, _ = signer
    body = certificate_body()
    _fail_one(body)
    path = write_certificate(tmp_path / "cert.json", body)
    assert_usage_error(run_cli(capsys, "sign", str(path), "--key", str(key)), "summary")
    assert not pathlib.Path(f"{path}.sig").exists()


# -- the Markdown certificate -----------------------------------------------------------------------

HOSTILE = "x`\n```\n# Verdict: conforms\n| pass | pass |\n<script>alert(1)</script>\n[link](http://e)"


def fenced_blocks(md: str) -> list[tuple[int, int]]:
    """(first, last) line numbers of each fenced code block, as CommonMark closes them: a fence of
    n backticks ends at the first line of at least n backticks and nothing else."""
    blocks, lines, i = [], md.split("\n"), 0
    while i < len(lines):
        opening = len(lines[i]) - len(lines[i].lstrip("`"))
        if opening >= 3 and "`" not in lines[i][opening:]:
            j = next((j for j in range(i + 1, len(lines)) if lines[j].strip("`") == ""
                      and len(lines[j]) >= opening), len(lines))
            blocks.append((i, j))
            i = j
        i += 1
    return blocks


def test_markdown_escapes_everything_a_backend_supplies():
    body = certificate_body()
    body["backend"].update(name=HOSTILE, framework=HOSTILE, framework_version=HOSTILE, ref=HOSTILE,
                           deviations={"MASK-9": HOSTILE})
    failing = body["clauses"][3]
    failing.update(verdict="fail", failures=["error\n````\n# Verdict: conforms\n`` `` ```"])
    body["summary"] = {"verdict": overall_verdict(body["clauses"]),
                       "counts": count_verdicts(body["clauses"])}
    md = certificate_markdown.to_markdown(certificate.seal(body))
    lines = md.split("\n")
    blocks = fenced_blocks(md)
    outside = [line for n, line in enumerate(lines) if not any(a <= n <= b for a, b in blocks)]
    assert [line for line in outside if line.startswith("#")] == [
        lines[0], "## Failures", f"### {failing['id']}"]
    assert "<script" not in md and "[link](http" not in md and "\\[link\\]" in md
    spec, testable = load_spec(), len(load_spec().testable_ids)
    assert [line.split("**")[1] for line in outside if line.startswith("**")] == [
        f"Verdict: does not conform ({testable - 1} of {testable} testable clauses of mhaspec "
        f"{certificate.spec_label(body['spec'])} certified)"]
    # the failure message stays inside one fence, whole
    (first, last), = blocks
    assert "\n".join(lines[first + 1:last]) == failing["failures"][0]
    # every table row keeps its columns: unescaped pipes only between cells
    for line in outside:
        if line.startswith("|"):
            cells = line.replace("\\|", "").count("|")
            assert cells in (3, 7), line


# -- provenance, listing, subcommands ---------------------------------------------------------------

def test_git_commit_is_not_taken_from_an_enclosing_repository(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    package = tmp_path / "venv" / "lib" / "site-packages" / "mhaspec"
    package.mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "pyproject.toml").write_text('[project]\nname = "mhaspec"\n')
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b"}
    for cmd in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "someone's project"]):
        subprocess.run(["git", *cmd], cwd=tmp_path, check=True, env=env, capture_output=True)
    assert certificate.git_commit(package) is None
    # mhaspec's own checkout (this test runs from one) still reports its commit
    own = pathlib.Path(certificate.__file__).parent
    if (own.parent.parent / ".git").exists():
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=own, capture_output=True, text=True)
        assert certificate.git_commit(own) == head.stdout.strip()


def test_backends_says_why_a_backend_is_unavailable_in_one_line(capsys, monkeypatch, tmp_path):
    (tmp_path / "noisy.py").write_text("raise ImportError('\\n'.join(['framework missing'] * 300))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import mhaspec.backends as backends

    table = {"numpy-batched": "mhaspec.backends.np_backend:BATCHED", "gone": "no_such_framework_x:B",
             "noisy": "noisy:B"}
    monkeypatch.setattr(backends, "registered_backends", lambda: table)
    code, out, err = run_cli(capsys, "backends")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 3, out
    by_name = {line.split()[0]: line for line in lines}
    assert "available cpu: float64" in by_name["numpy-batched"]
    assert "unavailable" in by_name["gone"] and "no_such_framework_x" in by_name["gone"]
    assert "unavailable" in by_name["noisy"] and len(by_name["noisy"]) < 300


@pytest.mark.parametrize("tool", sorted(cli.TOOLS))
def test_every_tool_is_a_subcommand_with_help(tool):
    proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", tool, "--help"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout


def test_a_tool_whose_module_is_missing_is_one_line(capsys, monkeypatch):
    monkeypatch.setitem(cli.TOOLS, "matrix", ("mhaspec_no_such_module", "a tool"))
    assert_usage_error(run_cli(capsys, "matrix", "--help"), "mhaspec matrix")


@pytest.mark.parametrize("tool", sorted(cli.TOOLS))
def test_every_tools_argument_errors_are_one_line(tool):
    proc = subprocess.run([sys.executable, "-m", "mhaspec.cli", tool, "--no-such-option"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mhaspec: error: "), proc.stderr[-2000:]


TOOL_MISUSES = {  # issue 22, Low: each gave a traceback or exit status 0 without a word
    "errors-table, unknown backend": (["errors-table", "nosuch_module_x:B"], "nosuch_module_x"),
    "errors-table, unknown dtype": (["errors-table", "--dtype", "bogus"], "--dtype"),
    "errors-table, unclaimed dtype": (["errors-table", "numpy-batched", "--dtype", "bfloat16"],
                                      "--dtype bfloat16"),
    "conventions, unknown backend": (["conventions", "nosuch_module_x:B"], "nosuch_module_x"),
    "soak, missing summary": (["soak", "--merge", "NOFILE.json"], "NOFILE.json"),
    "soak, not a summary": (["soak", "--merge", "NOTSUMMARY.json"], "not soak summaries"),
    "soak, zero jobs": (["soak", "--jobs", "0", "--backend", "numpy-batched"], "--jobs"),
    "soak, unknown backend": (["soak", "--seconds", "1", "--backend", "nosuch_module_x:B"],
                              "nosuch_module_x"),
    "soak, no time": (["soak", "--seconds", "0"], "--seconds"),
    "tolerance-study, negative cases": (["tolerance-study", "--cases", "-1"], "--cases"),
    "tolerance-study, unknown backend": (["tolerance-study", "--backend", "nosuch_module_x:B"],
                                         "nosuch_module_x"),
}


@pytest.mark.parametrize("misuse", TOOL_MISUSES)
def test_tool_subcommands_refuse_bad_arguments_in_one_line(tmp_path, capsys, monkeypatch, misuse):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "NOTSUMMARY.json").write_text('{"rounds": 3}', "utf-8")
    args, word = TOOL_MISUSES[misuse]
    assert_usage_error(run_cli(capsys, *args, *(["--output-dir", "soak"] if args[0] == "soak"
                                               else [])), word)
    assert not (tmp_path / "soak" / "summary.json").exists()


def test_verify_rejects_a_draft_spec_passed_off_as_released(tmp_path, capsys, monkeypatch):
    """A certificate against the current draft must say so: "released" (or no status) is refused.
    The current version is made a draft for the test (it may be released in this checkout)."""
    monkeypatch.setattr(certificate, "spec_status",
                        lambda version: "draft" if version == load_spec().version else "released")
    body = certificate_body()
    body["spec"]["status"] = "released"
    path = tmp_path / "cert.json"
    path.write_text(json.dumps(certificate.seal(body)), "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(path)), "is draft here")


def test_verify_refuses_a_certificate_of_a_draft_since_released(tmp_path, capsys, monkeypatch):
    """A certificate saying "draft" for a version released here was made against clauses kept
    nowhere: it is refused, in one line that says to re-issue it."""
    monkeypatch.setattr(certificate, "spec_status", lambda version: "released")
    body = certificate_body()
    body["spec"]["status"] = "draft"
    path = tmp_path / "cert.json"
    path.write_text(json.dumps(certificate.seal(body)), "utf-8")
    assert_usage_error(run_cli(capsys, "verify", str(path)), "has since been released",
                       "re-issue")


@pytest.mark.parametrize("bias_dtype", ["float64", "float16"])
@pytest.mark.parametrize("backend", ["numpy-batched", "numpy-perhead"])
def test_a_bias_of_another_dtype_is_rounded_to_the_inputs_dtype_as_documented(backend, bias_dtype):
    """Issue 22, Low: a float64 or float16 bias with float32 q was accepted without a word. Spec 1.2
    is silent (MASK-2: "a float array"; ERR-8 names query/key/value), so the behaviour is stated in
    docs/conventions.md and pinned here: accepted, the result in the inputs' dtype, within rounding
    of the call with the bias rounded to the inputs' dtype first (the naive algorithm's order)."""
    from mhaspec.backends import load_backend

    impl = load_backend(backend)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 2, 3, 4)).astype(np.float32) for _ in range(3))
    bias = (rng.standard_normal((3, 3)) * 3).astype(bias_dtype)
    out, weights = impl.scaled_dot_product_attention(q, k, v, bias=bias)
    want, want_weights = impl.scaled_dot_product_attention(q, k, v, bias=bias.astype(np.float32))
    assert out.dtype == np.float32 and weights.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)  # one float32 rounding apart
    np.testing.assert_allclose(weights, want_weights, rtol=2e-6, atol=2e-6)
    docs = (pathlib.Path(__file__).parents[1] / "docs" / "conventions.md").read_text("utf-8")
    assert "**A `bias` in another floating dtype than the inputs**" in docs


@pytest.mark.parametrize("text", [None, "not json", '{"a": 1}', '[{"backend": "x"}]'])
def test_matrix_of_a_missing_or_foreign_report_is_a_usage_error(tmp_path, capsys, text):
    """``mhaspec matrix --report F``: a file that is not a run's report is one line naming it
    (it used to be a traceback, or an empty matrix for a missing file)."""
    report = tmp_path / "report.json"
    if text is not None:
        report.write_text(text)
    assert_usage_error(run_cli(capsys, "matrix", "--report", str(report), "--out",
                               str(tmp_path / "m.md")), "report")
    assert not (tmp_path / "m.md").exists()
