"""Replay one conformance case on one backend and print how far it is from the oracle."""

from __future__ import annotations

from mhaspec.backends import load_backend

from . import harness, tolerance
from .strategies import CaseSpec, build_case


def replay(backend: str, op: str, spec: CaseSpec, *, device: str = "cpu", dtype: str = "float32",
           overrides: dict | None = None) -> list[tolerance.Verdict]:
    """Run ``op`` ("sdpa" or "mha") of ``backend`` (name or ``module:attr``) on ``spec``; print and
    return the NUM-3 verdicts for output and weights."""
    impl = harness.Impl(load_backend(backend), device, dtype)
    return _judge(impl, build_case(spec), op, overrides or {})


def _judge(impl: harness.Impl, case, op: str, overrides: dict) -> list[tolerance.Verdict]:
    dtype = impl.dtype
    got = impl.sdpa(case, **overrides) if op == "sdpa" else impl.mha(case, **overrides)
    expected = harness.oracle_result(case, op, **overrides)
    naive = harness.naive_results(case, op, dtype, **overrides)
    length = harness.sum_length(case.spec)
    verdicts = [tolerance.judge(got.out, expected.out, [n.out for n in naive], dtype=dtype,
                                scale=harness._scale(case, op, expected), sum_length=length,
                                condition=expected.condition)]
    if got.weights is not None:
        verdicts.append(tolerance.judge(got.weights, expected.weights,
                                        [n.weights for n in naive], dtype=dtype, scale=1.0,
                                        sum_length=length, condition=expected.condition))
    for what, v in zip(("output", "weights"), verdicts):
        print(f"{impl.id} {op} {what}: {'conforms' if v.ok else 'DOES NOT CONFORM'}: {v.describe()}")
    return verdicts


REPLAY_FORMAT = "mhaspec-replay/1"
ARRAY_FIELDS = ("q", "k", "v", "query", "key", "value", "mask", "bias", "legacy_mask",
                "key_padding_mask")


class ReplayError(ValueError):
    """A replay file that cannot be used (unreadable, other spec version, unknown backend)."""


def save_case(path, impl: harness.Impl, case, *, op: str, clause: str, backend_ref: str,
              overrides: dict):
    """Write ``case`` (its float64 arrays and how to rerun it) to ``path`` (.npz); returns the path."""
    import json
    import pathlib

    import numpy as np

    from mhaspec.spec import SPEC_VERSION

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f: getattr(case, f) for f in ARRAY_FIELDS if getattr(case, f) is not None}
    arrays.update({f"param_{n}": p for n, p in case.params._asdict().items() if p is not None})
    meta = {"format": REPLAY_FORMAT, "spec_version": SPEC_VERSION, "op": op, "clause": clause,
            "backend": backend_ref, "device": impl.device, "dtype": impl.dtype,
            "spec": case.spec._asdict(), "overrides": {k: v for k, v in overrides.items()
                                                       if not hasattr(v, "shape")}}
    np.savez(path, meta=np.array(json.dumps(meta)), **arrays)
    return path


def load_case(path):
    """Read a replay file: returns (meta, Case) or raises :class:`ReplayError`."""
    import json
    import zipfile

    import numpy as np

    from mhaspec.spec import SPEC_VERSION, oracle

    from .strategies import Case

    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {k: data[k] for k in data.files if k != "meta"}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
        raise ReplayError(f"cannot read replay file {path}: {exc}") from None
    if meta.get("format") != REPLAY_FORMAT:
        raise ReplayError(f"{path} is not an mhaspec replay file (format {meta.get('format')!r})")
    if meta.get("spec_version") != SPEC_VERSION:
        raise ReplayError(f"{path} was written for spec {meta.get('spec_version')}, this is spec "
                          f"{SPEC_VERSION}: replay it with the matching mhaspec release")
    spec_fields = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["spec"].items()}
    params = oracle.Params(**{n: arrays.get(f"param_{n}") for n in oracle.Params._fields})
    case = Case(CaseSpec(**spec_fields), params=params,
                **{f: arrays.get(f) for f in ARRAY_FIELDS})
    return meta, case


def replay_file(path, *, backend: str | None = None) -> bool:
    """Replay a saved failing case on ``backend`` (default: the recorded one); True if it conforms."""
    from mhaspec.backends import BackendLoadError, load_backend

    meta, case = load_case(path)
    ref = backend or meta["backend"]
    try:
        impl = harness.Impl(load_backend(ref), meta["device"], meta["dtype"])
    except BackendLoadError as exc:
        raise ReplayError(str(exc)) from None
    print(f"replaying {meta['clause']} ({meta['op']}) from {path} on {impl.id}")
    return all(v.ok for v in _judge(impl, case, meta["op"], meta["overrides"]))
