"""The saved-failure format: one failing conformance case in a ``.npz`` file, for ``mhaspec replay``.
Written by :mod:`.failure_save`; read, as an untrusted file, by :func:`read_case`.

Axis legend: B batch, h heads, L_q / L_k lengths, d_k / d_v per-head widths, d_model query width,
k_dim / v_dim key / value widths, d_out output width.

A failure file is a NumPy ``.npz`` (a zip of ``.npy`` members, written uncompressed) holding:

* ``meta``: a 0-d unicode array with JSON: ``format`` (``mhaspec-replay/1``), ``spec_version``,
  ``op`` ("sdpa", "mha" or, since spec 1.4, "attention_vjp": the gradients of scaled dot-product
  attention, with the cotangents drawn from the case's seed as the suite draws them), ``clause``, ``backend`` (the reference the run used; *informative only*:
  a reader never imports it), ``device``, ``dtype``, ``spec`` (the :class:`CaseSpec` fields),
  ``overrides`` (JSON-valued keyword overrides) and, optionally, ``aliases`` (input -> the input it is
  the same array as, e.g. ``{"key": "query"}`` for self-attention);
* the case's float64 arrays: SDPA ``q`` (B, h, L_q, d_k), ``k`` (B, h, L_k, d_k), ``v`` (B, h, L_k, d_v);
  MHA ``query`` (B, L_q, d_model), ``key`` (B, L_k, k_dim), ``value`` (B, L_k, v_dim) and
  ``param_w_q`` ... ``param_b_o``; optional ``mask`` and ``key_padding_mask`` (boolean), ``bias`` and
  ``legacy_mask`` (float); spec 1.2's feature arrays ``alibi_slopes``, ``past_key``,
  ``past_value`` (float) and ``q_segment_ids``, ``kv_segment_ids``, ``query_seq_lengths``,
  ``key_value_seq_lengths``, ``past_lengths`` (integer: int32 or int64, these fields only);
  spec 1.3's ``sinks`` (h,) (float; "sdpa" and "attention_vjp" only, read back as the override
  ``sinks``). "attention_vjp" cases may set the overrides ``d_lse`` (an lse cotangent too) and
  ``bias_grad`` (the bias's gradient too) to true.

:func:`read_case` treats the file as untrusted: it reads the zip end record, the zip directory and
each ``.npy`` header (a few hundred bytes) first, and refuses the file -- before any array is
decompressed or allocated -- when it has more members than a case can, a member is unknown or
compressed more than :data:`MAX_COMPRESSION_RATIO` to 1, the metadata is malformed (unknown or
missing fields, duplicate keys, wrong types, an unknown op, dtype or spec version), an array is not
of its field's kind (complex, structured and object arrays are refused, never cast; integer arrays
only for the integer fields of the features, float arrays never there), the
shapes disagree with the recorded sizes, a header disagrees with the member's size, or the declared
sizes -- or the results a check would compute (:func:`work_bytes`) -- exceed ``max_bytes``. Every
refusal is a :class:`FailureFileError` with a one-line message.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import zipfile
from typing import Any

import numpy as np

from mhaspec.backends import ALL_DTYPES
from mhaspec.spec import SPEC_VERSION, oracle

from . import extremes, features
from .features import INTEGER_ARRAYS, FeatureArrays, key_length
from .strategies import Case, CaseSpec

FORMAT = "mhaspec-replay/1"
#: the operations a failure file replays
REPLAYED_OPS = ("sdpa", "mha", "attention_vjp")
#: the operations that take sinks (the member ``sinks``) and those of scaled dot-product attention
SINK_OPS = ("sdpa", "attention_vjp")
#: Default cap on the declared (uncompressed) size of all members together, in bytes.
DEFAULT_MAX_BYTES = 256 * 2**20
#: Largest metadata member, in bytes (the JSON of one case is about 1 KB).
MAX_META_BYTES = 64 * 2**10
#: Largest ratio of declared to compressed size accepted for a deflated member (zip bombs).
MAX_COMPRESSION_RATIO = 100
INPUTS = ("q", "k", "v", "query", "key", "value")
MASKS = ("mask", "bias", "legacy_mask", "key_padding_mask")
PARAMS = tuple(f"param_{n}" for n in oracle.Params._fields)
FEATURE_FIELDS = FeatureArrays._fields
ARRAY_FIELDS = INPUTS + MASKS
BOOLEAN_FIELDS = ("mask", "key_padding_mask")
#: Fields whose arrays hold integers (segment ids, lengths): int32 or int64, nothing else.
INTEGER_FIELDS = INTEGER_ARRAYS
META_FIELDS = frozenset({"format", "spec_version", "op", "clause", "backend", "device", "dtype",
                         "spec", "overrides"})
OPTIONAL_META_FIELDS = frozenset({"aliases"})
#: A device name as backends give them (``cpu``, ``cuda``, ``cuda:1``).
DEVICE_NAME = r"[A-Za-z][A-Za-z0-9_.:-]{0,63}"
#: Most members a failure file may have (meta, six inputs, four masks, eight parameters, eight
#: feature arrays, the sinks).
MAX_MEMBERS = 28


class FailureFileError(ValueError):
    """A failure file that cannot be used: unreadable, malformed, too large or of another spec."""


def read_case(path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[dict, Case]:
    """Read a failure file: returns ``(meta, case)`` or raises :class:`FailureFileError`.

    Sizes are checked from the zip directory and the ``.npy`` headers before anything is
    decompressed: the declared sizes of all members together must stay within ``max_bytes``."""
    path = pathlib.Path(path)
    if path.suffix != ".npz":
        raise FailureFileError(f"{path}: a failure file is a .npz archive, not "
                               f"{path.suffix or 'a file without suffix'}")
    try:
        size = os.stat(path).st_size
        if not path.is_file():
            raise FailureFileError(f"{path} is not a file")
        if size == 0:
            raise FailureFileError(f"cannot read replay file {path}: it is empty")
        if size > max_bytes:
            raise FailureFileError(f"{path} is {size} bytes, over the limit of {max_bytes} "
                                   f"(raise it with --max-bytes)")
        _check_end_record(path, size)
        with zipfile.ZipFile(path) as archive:
            headers = _check_directory(path, archive, max_bytes)
            meta = _read_meta(path, archive)
            spec = _case_spec(path, meta["spec"])
            _check_headers(path, archive, headers, spec, meta, max_bytes)
            arrays = {name: _read_array(archive, name) for name in headers if name != "meta"}
        if "sinks" in arrays:
            meta["overrides"]["sinks"] = arrays.pop("sinks")
    except FailureFileError:
        raise
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, RuntimeError, NotImplementedError) as exc:
        raise FailureFileError(f"cannot read replay file {path}: {_one_line(exc)}") from None
    return meta, _case(spec, arrays, meta.get("aliases", {}))


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _check_end_record(path, size: int) -> None:
    """Read the zip's end record (the file's last bytes) and refuse, before the directory is
    parsed, more than :data:`MAX_MEMBERS` members or a directory over 64 KiB."""
    with open(path, "rb") as f:
        f.seek(max(0, size - (22 + 65535)))
        tail = f.read()
    at = len(tail)
    while (at := tail.rfind(b"PK\x05\x06", 0, at)) >= 0:
        if at + 22 + int.from_bytes(tail[at + 20:at + 22], "little") == len(tail):
            break
    if at < 0:
        raise FailureFileError(f"cannot read replay file {path}: not a zip archive (no end record)")
    entries = int.from_bytes(tail[at + 10:at + 12], "little")
    directory = int.from_bytes(tail[at + 12:at + 16], "little")
    if entries > MAX_MEMBERS or directory > 65536:
        raise FailureFileError(f"{path}: its zip directory declares {entries} members in "
                               f"{directory} bytes (at most {MAX_MEMBERS} members): refused")


def _check_directory(path, archive: zipfile.ZipFile, max_bytes: int) -> dict[str, zipfile.ZipInfo]:
    """Member name (without ``.npy``) -> its zip entry, after the directory-level checks."""
    known = {"meta", *ARRAY_FIELDS, *PARAMS, *FEATURE_FIELDS, "sinks"}
    members: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in archive.infolist():
        name = info.filename[:-4] if info.filename.endswith(".npy") else None
        if name not in known or name in members:
            raise FailureFileError(f"{path}: unexpected member {info.filename!r} "
                                   f"(known: meta and {', '.join(ARRAY_FIELDS + PARAMS)})")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise FailureFileError(f"{path}: member {info.filename!r} uses an unsupported "
                                   f"compression method ({info.compress_type})")
        if (info.compress_type == zipfile.ZIP_DEFLATED
                and info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1024)):
            raise FailureFileError(f"{path}: member {info.filename!r} declares {info.file_size} bytes "
                                   f"from {info.compress_size} compressed (ratio over "
                                   f"{MAX_COMPRESSION_RATIO}): refused")
        total += info.file_size
        if total > max_bytes:
            raise FailureFileError(f"{path}: its members declare more than {max_bytes} bytes "
                                   f"uncompressed (raise the limit with --max-bytes)")
        members[name] = info
    if "meta" not in members:
        raise FailureFileError(f"{path} is not an mhaspec replay file (no meta member)")
    if members["meta"].file_size > MAX_META_BYTES:
        raise FailureFileError(f"{path}: metadata of {members['meta'].file_size} bytes "
                               f"(limit {MAX_META_BYTES})")
    return members


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple, bool, np.dtype, int]:
    """(shape, fortran_order, dtype, header length) of one ``.npy`` member, reading only its header."""
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise FailureFileError(f"member {info.filename!r}: .npy format version {version} "
                                   "is not supported")
        return shape, fortran, dtype, f.tell()


def _check_headers(path, archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo],
                   spec: CaseSpec, meta: dict, max_bytes: int) -> None:
    """Each array member: of its field's kind, of the shape ``spec`` gives, its declared size
    equal to what its header says; the arrays the operation needs present."""
    kv_heads = meta["overrides"].get("num_kv_heads")
    if kv_heads is not None and (meta["op"] != "mha" or spec.heads % kv_heads):
        raise FailureFileError(f"{path}: num_kv_heads = {kv_heads} needs op 'mha' and must divide "
                               f"heads = {spec.heads}")
    invalid = invalid_by_spec(spec, meta["dtype"])
    if invalid:
        raise FailureFileError(f"{path}: the recorded case is invalid input by the spec ({invalid}): "
                               f"a backend must refuse it, there is nothing to replay")
    expected = expected_shapes(spec, kv_heads=kv_heads)
    aliases = meta.get("aliases", {})
    needed = ("q", "k", "v") if meta["op"] in SINK_OPS else (
        "query", "key", "value", "param_w_q", "param_w_k", "param_w_v", "param_w_o")
    needed += tuple(f for f, on in (("mask", spec.mask_shape is not None),
                                    ("bias", spec.bias_shape is not None),
                                    ("legacy_mask", spec.legacy_shape is not None),
                                    ("key_padding_mask", spec.key_padding)) if on)
    needed += tuple(f for f in FEATURE_FIELDS if expected[f] is not None)
    missing = [f for f in needed if f not in members and f not in aliases]
    if missing:
        raise FailureFileError(f"{path}: op {meta['op']!r} with these options needs arrays "
                               f"{', '.join(missing)}, which the file lacks")
    if "sinks" in members and meta["op"] not in SINK_OPS:
        raise FailureFileError(f"{path}: array 'sinks' present but op {meta['op']!r} takes none")
    for field in MASKS + FEATURE_FIELDS:
        if field in members and field not in needed:
            raise FailureFileError(f"{path}: array {field!r} present but the recorded case has none")
    for field, same in aliases.items():
        if field in members or same not in members or expected[field] != expected[same]:
            raise FailureFileError(f"{path}: alias {field!r} -> {same!r} does not fit the case")
    for name, info in members.items():
        if name == "meta":
            continue
        shape, _, dtype, header = _npy_header(archive, info)
        if name in BOOLEAN_FIELDS:
            if dtype.kind != "b":
                raise FailureFileError(f"{path}: array {name!r} must be boolean, is {dtype}")
        elif name in INTEGER_FIELDS:
            if dtype.kind != "i" or dtype.itemsize not in (4, 8):
                raise FailureFileError(f"{path}: array {name!r} must be int32 or int64, is {dtype} "
                                       f"(refused, not cast)")
        elif dtype.kind != "f" or dtype.itemsize > 8:
            raise FailureFileError(f"{path}: array {name!r} must be float16/32/64, is {dtype} "
                                   f"(refused, not cast)")
        if shape != expected[name]:
            raise FailureFileError(f"{path}: array {name!r} has shape {shape}, the recorded case "
                                   f"gives {expected[name]}")
        if header + math.prod(shape) * dtype.itemsize != info.file_size:
            raise FailureFileError(f"{path}: member {info.filename!r} declares {info.file_size} "
                                   f"bytes, its header {header + math.prod(shape) * dtype.itemsize}")
    work = work_bytes(spec)
    if work > max_bytes:
        raise FailureFileError(f"{path}: the case's results and intermediates (weights "
                               f"(B, h, L_q, L_k) = {(spec.batch, spec.heads, spec.len_q, spec.len_k)}) "
                               f"would take {work} bytes, over the limit of {max_bytes} (raise it "
                               f"with --max-bytes)")


def invalid_by_spec(spec: CaseSpec, dtype: str) -> str | None:
    """Why the case ``spec`` in ``dtype`` is input the spec's ERR chapter calls invalid (a mask,
    bias or legacy mask that does not broadcast to (B, h, L_q, L_K), ERR-7; a legacy mask with
    float16 inputs, ERR-9), or None."""
    full = (spec.batch, spec.heads, spec.len_q, key_length(spec))
    for field in ("mask_shape", "bias_shape", "legacy_shape"):
        shape = getattr(spec, field)
        try:
            if shape is not None and np.broadcast_shapes(tuple(shape), full) != full:
                raise ValueError
        except ValueError:
            return f"ERR-7: {field} {tuple(shape)} does not broadcast to (B, h, L_q, L_k) = {full}"
    if spec.legacy_shape is not None and dtype == "float16":
        return "ERR-9: a legacy mask with float16 inputs"
    return None


def work_bytes(spec: CaseSpec) -> int:
    """Bytes of the float64 arrays one check of ``spec`` computes that the file does not hold: the
    weights (B, h, L_q, L_k), the per-head output (B, h, L_q, d_v), the projections (B, L_q, h*d_k),
    (B, L_k, h*d_k), (B, L_k, h*d_v) and the output (B, L_q, d_out)."""
    b, h, lq, lk = spec.batch, spec.heads, spec.len_q, key_length(spec)
    return 8 * (b * h * lq * lk + b * h * lq * spec.d_v + b * lq * h * spec.d_k
                + b * lk * h * (spec.d_k + spec.d_v) + b * lq * spec.d_out)


def expected_shapes(spec: CaseSpec, *, kv_heads: int | None = None) -> dict[str, tuple[int, ...] | None]:
    """Field -> the shape its array has in the case ``spec`` describes (computed, nothing allocated);
    with ``kv_heads`` = g (grouped-query attention, MHA-6) the key and value projections have g
    heads."""
    b, h, lq, lk = spec.batch, spec.heads, spec.len_q, spec.len_k
    g = kv_heads or h
    g_sdpa = features.kv_heads(spec)  # grouped k, v of scaled dot-product attention (GQA-1)
    d_in_k = spec.d_model if spec.self_attention else spec.k_dim
    d_in_v = spec.d_model if spec.self_attention else spec.v_dim
    past = spec.past_len
    return {
        "q": (b, h, lq, spec.d_k), "k": (b, g_sdpa, lk, spec.d_k), "v": (b, g_sdpa, lk, spec.d_v),
        "query": (b, lq, spec.d_model), "key": (b, lk, spec.k_dim), "value": (b, lk, spec.v_dim),
        "mask": spec.mask_shape, "bias": spec.bias_shape, "legacy_mask": spec.legacy_shape,
        "key_padding_mask": (b, key_length(spec)) if spec.key_padding else None,
        "alibi_slopes": None if spec.alibi is None else (b, h) if spec.alibi == "per_batch" else (h,),
        "q_segment_ids": None if spec.segments is None else (b, lq),
        "kv_segment_ids": None if spec.segments is None else (b, lk),
        "query_seq_lengths": (b,) if spec.seq_lengths in ("query", "both") else None,
        "key_value_seq_lengths": (b,) if spec.seq_lengths in ("key_value", "both") else None,
        "past_key": None if past is None else (b, g_sdpa, past, spec.d_k),
        "past_value": None if past is None else (b, g_sdpa, past, spec.d_v),
        "past_lengths": (b,) if past is not None and spec.past_valid else None,
        "param_w_q": (spec.d_model, h * spec.d_k), "param_w_k": (d_in_k, g * spec.d_k),
        "param_w_v": (d_in_v, g * spec.d_v), "param_w_o": (h * spec.d_v, spec.d_out),
        "param_b_q": (h * spec.d_k,), "param_b_k": (g * spec.d_k,), "param_b_v": (g * spec.d_v,),
        "param_b_o": (spec.d_out,), "sinks": (h,)}


def _read_meta(path, archive: zipfile.ZipFile) -> dict:
    """The ``meta`` member, checked field by field."""
    shape, _, dtype, _ = _npy_header(archive, archive.getinfo("meta.npy"))
    if shape != () or dtype.kind != "U":
        raise FailureFileError(f"{path}: meta must be a 0-d unicode array, is {dtype} {shape}")
    try:
        meta = json.loads(str(_read_array(archive, "meta")), object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise FailureFileError(f"{path}: metadata is not JSON: {_one_line(exc)}") from None
    if not isinstance(meta, dict):
        raise FailureFileError(f"{path}: metadata must be a JSON object")
    if meta.get("format") != FORMAT:
        raise FailureFileError(f"{path} is not an mhaspec replay file (format {meta.get('format')!r})")
    unknown = sorted(set(meta) - META_FIELDS - OPTIONAL_META_FIELDS)
    missing = sorted(META_FIELDS - set(meta))
    if unknown or missing:
        raise FailureFileError(f"{path}: metadata fields unknown {unknown}, missing {missing}")
    if meta["spec_version"] != SPEC_VERSION:
        raise FailureFileError(f"{path} was written for spec {meta['spec_version']!r}, this is spec "
                               f"{SPEC_VERSION}: replay it with the matching mhaspec release")
    for field in ("op", "clause", "backend", "device", "dtype"):
        if not isinstance(meta[field], str):
            raise FailureFileError(f"{path}: metadata {field!r} must be a string")
    if not re.fullmatch(r"[A-Z]+-[0-9]+", meta["clause"]):
        raise FailureFileError(f"{path}: metadata 'clause' must be a clause id such as MASK-1, "
                               f"got {meta['clause']!r:.60}")
    if not re.fullmatch(DEVICE_NAME, meta["device"]):
        raise FailureFileError(f"{path}: metadata 'device' must be a device name ({DEVICE_NAME}), "
                               f"got {meta['device']!r:.60}")
    if len(meta["backend"]) > 500:
        raise FailureFileError(f"{path}: metadata 'backend' is longer than 500 characters")
    if meta["op"] not in REPLAYED_OPS:
        raise FailureFileError(f"{path}: unknown op {meta['op']!r} (known: {', '.join(REPLAYED_OPS)})")
    if meta["dtype"] not in ALL_DTYPES:
        raise FailureFileError(f"{path}: unknown dtype {meta['dtype']!r} "
                               f"(known: {', '.join(ALL_DTYPES)})")
    if not isinstance(meta["spec"], dict):
        raise FailureFileError(f"{path}: metadata 'spec' must be an object")
    overrides = meta["overrides"]
    if not isinstance(overrides, dict):
        raise FailureFileError(f"{path}: metadata 'overrides' must be an object")
    bad = [f"{k}={v!r:.40}" for k, v in overrides.items()
           if k not in OVERRIDE_CHECKS or not OVERRIDE_CHECKS[k](v)]
    if bad:
        raise FailureFileError(f"{path}: metadata 'overrides' has invalid entries {', '.join(bad)} "
                               f"(it may set causal to an alignment or null, scale to a positive "
                               f"finite number (ERR-10) or null, num_kv_heads to a count, softcap, "
                               f"window and alignment as in 'spec', masks and feature arrays to "
                               f"null, d_lse and bias_grad to a boolean)")
    if meta["op"] != "attention_vjp" and {"d_lse", "bias_grad"} & set(meta["overrides"]):
        raise FailureFileError(f"{path}: overrides d_lse and bias_grad are attention_vjp's, not "
                               f"{meta['op']!r}'s")
    aliases = meta.get("aliases", {})
    if not isinstance(aliases, dict) or any(
            k not in INPUTS or v not in INPUTS or INPUTS.index(v) >= INPUTS.index(k)
            or v in aliases for k, v in aliases.items()):
        raise FailureFileError(f"{path}: metadata 'aliases' must map an input to an earlier one")
    return meta


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise FailureFileError(f"metadata has the key {key!r} twice")
        out[key] = value
    return out


def _is_int(x, low: int = 1) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and low <= x < 2**31


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_positive(x) -> bool:
    return _is_number(x) and x > 0


def _is_extreme(x) -> bool:
    """An extreme of :mod:`.extremes`' grammar (``subnormal:float32:query``, ...)."""
    try:
        return isinstance(x, str) and len(x) <= 100 and extremes.parse(x) is not None
    except ValueError:
        return False


def _is_shape(x) -> bool:
    return x is None or (isinstance(x, list) and 1 <= len(x) <= 4 and all(_is_int(n) for n in x))


#: CaseSpec field -> the check its recorded JSON value must pass
SPEC_FIELD_CHECKS = {
    **{f: _is_int for f in ("batch", "heads", "len_q", "len_k", "d_k", "d_v", "d_model", "k_dim",
                            "v_dim", "d_out")},
    **{f: (lambda x: isinstance(x, bool)) for f in ("self_attention", "use_bias",
                                                     "fully_masked_rows", "key_padding")},
    **{f: _is_shape for f in ("mask_shape", "bias_shape", "legacy_shape")},
    "mask_density": lambda x: _is_number(x) and 0 <= x <= 1, "logit_scale": _is_positive,
    "scale": lambda x: x is None or _is_positive(x),  # ERR-10: a positive finite number
    "causal": lambda x: x is None or x in oracle.CAUSAL_ALIGNMENTS,
    "seed": lambda x: _is_int(x, low=0),
    "extreme": lambda x: x is None or _is_extreme(x),
    # spec 1.2 features (mhaspec.conformance.features)
    "kv_heads": lambda x: x is None or _is_int(x),
    "softcap": lambda x: x is None or (_is_number(x) and x > 0),
    "window": lambda x: x is None or (isinstance(x, list) and len(x) == 2 and all(
        s is None or _is_int(s, low=0) for s in x)),
    "alignment": lambda x: x is None or x in oracle.CAUSAL_ALIGNMENTS,
    "alibi": lambda x: x is None or x in features.ALIBI_KINDS,
    "segments": lambda x: x is None or x in features.SEGMENT_KINDS,
    "seq_lengths": lambda x: x is None or x in features.LENGTH_KINDS,
    "past_len": lambda x: x is None or _is_int(x, low=0),
    "past_valid": lambda x: isinstance(x, bool),
    "lse": lambda x: isinstance(x, bool),
    "chunk": lambda x: x is None or _is_int(x, low=1),
}


#: keyword override a saved case may carry -> the check its value must pass
OVERRIDE_CHECKS = {"causal": SPEC_FIELD_CHECKS["causal"], "scale": SPEC_FIELD_CHECKS["scale"],
                   "num_kv_heads": _is_int, **{f: (lambda x: x is None) for f in MASKS},
                   **{f: (lambda x: x is None) for f in FEATURE_FIELDS},
                   **{f: SPEC_FIELD_CHECKS[f] for f in ("softcap", "window", "chunk",
                                                        "alignment")},
                   **{f: (lambda x: isinstance(x, bool)) for f in ("d_lse", "bias_grad")}}


def _case_spec(path, recorded: dict) -> CaseSpec:
    unknown = sorted(set(recorded) - set(CaseSpec._fields))
    if unknown:
        raise FailureFileError(f"{path}: metadata 'spec' has unknown fields {unknown}")
    bad = sorted(k for k, v in recorded.items() if not SPEC_FIELD_CHECKS[k](v))
    if bad:
        raise FailureFileError(f"{path}: metadata 'spec' has invalid values for {bad}: "
                               + ", ".join(f"{k}={recorded[k]!r:.40}" for k in bad))
    return CaseSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items()})


def _read_array(archive: zipfile.ZipFile, name: str) -> np.ndarray:
    with archive.open(f"{name}.npy") as f:
        return np.lib.format.read_array(f, allow_pickle=False)


def _case(spec: CaseSpec, arrays: dict[str, np.ndarray], aliases: dict[str, str]) -> Case:
    for field, same in aliases.items():
        arrays[field] = arrays[same]
    params = oracle.Params(**{n: arrays.get(f"param_{n}") for n in oracle.Params._fields})
    return Case(spec, params=params, **{f: arrays.get(f) for f in ARRAY_FIELDS},
                features=FeatureArrays(**{f: arrays.get(f) for f in FEATURE_FIELDS}))
