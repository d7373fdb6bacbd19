"""Writing a failing conformance case to a failure file for ``mhaspec replay`` (:func:`save_case`),
the call's array overrides folded into the case first (:func:`saveable`). The format, and the
reader that treats a file as untrusted, are :mod:`.failure_file`'s.

Axis legend: B batch, h heads, L_q / L_k lengths, d_k / d_v per-head widths.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

import numpy as np

from mhaspec.spec import SPEC_VERSION

from .failure_file import ARRAY_FIELDS, FORMAT, INPUTS
from .strategies import Case


#: mask keyword -> the CaseSpec field giving its shape (a mask override saved as the case's mask)
_MASK_SHAPES = {"mask": "mask_shape", "bias": "bias_shape", "legacy_mask": "legacy_shape"}


def saveable(case: Case, overrides: dict) -> tuple[Case, dict] | None:
    """``case`` with the array overrides of a call folded in (mask, bias, legacy_mask,
    key_padding_mask, params) and the remaining JSON-scalar overrides: what a failure file
    (this module) can hold; None when an override fits neither."""
    spec, scalars = case.spec, {}
    for key, value in overrides.items():
        if key in _MASK_SHAPES:
            spec = spec._replace(**{_MASK_SHAPES[key]: None if value is None else np.shape(value)})
            case = case._replace(**{key: value})
        elif key == "key_padding_mask":
            spec = spec._replace(key_padding=value is not None)
            case = case._replace(key_padding_mask=value)
        elif key == "params":
            case = case._replace(params=value)
        elif key == "sinks" and isinstance(value, np.ndarray):  # saved as the member "sinks"
            scalars[key] = value
        elif value is None or isinstance(value, (bool, int, float, str)):
            scalars[key] = value
        else:
            return None
    return case._replace(spec=spec), scalars


def save_case(path, impl, case: Case, *, op: str, clause: str, backend_ref: str,
              overrides: dict) -> pathlib.Path:
    """Write ``case`` to ``path`` (.npz) and return the path.

    ``impl`` needs ``device`` and ``dtype`` (the parametrization that failed); ``backend_ref`` is
    recorded for people (replay never imports it); ``overrides`` are recorded when their values are
    JSON scalars (``causal``, ``scale``, ``num_kv_heads``, a mask cleared with None), not otherwise.
    Inputs that are one array in ``case`` (self-attention, shared key and value) are stored once.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    aliases: dict[str, str] = {}
    for field in ARRAY_FIELDS:
        x = getattr(case, field)
        if x is None:
            continue
        earlier = INPUTS[:INPUTS.index(field)] if field in INPUTS else ()
        same = next((f for f in earlier if getattr(case, f) is x and f in arrays), None)
        if same is not None:
            aliases[field] = same
        else:
            arrays[field] = np.asarray(x)
    arrays.update({f"param_{n}": np.asarray(p) for n, p in case.params._asdict().items()
                   if p is not None})
    arrays.update({n: np.asarray(x) for n, x in case.features._asdict().items() if x is not None})
    if isinstance(overrides.get("sinks"), np.ndarray):
        arrays["sinks"] = overrides["sinks"]
    meta = {"format": FORMAT, "spec_version": SPEC_VERSION, "op": op, "clause": clause,
            "backend": backend_ref, "device": impl.device, "dtype": impl.dtype,
            "spec": case.spec._asdict(), "aliases": aliases,
            "overrides": {k: v for k, v in overrides.items()
                          if v is None or isinstance(v, (bool, int, float, str))}}
    # written to a new file and renamed over ``path``: a symlink planted at ``path`` is replaced,
    # never written through
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, meta=np.array(json.dumps(meta)), **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path
