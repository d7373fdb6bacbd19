"""``mhaspec replay FILE.npz``: rerun a saved failing case on a backend the user names.

A failure file may come from anyone, so it is data only: its recorded backend is never imported
unless it is a registered ``mhaspec.backends`` entry-point name and the user asks for it
(``--recorded-backend``); a recorded ``module:attr`` is refused. The file is checked (metadata,
member sizes, ``.npy`` headers, shapes, dtypes) before any array is read; see
:mod:`mhaspec.conformance.failure_file`.
"""

from __future__ import annotations

from mhaspec.backends import registered_backends
from mhaspec.conformance import failure_file, harness
from mhaspec.conformance.replay import Unjudgeable, describe, judge_vjp, judgeable_reference
from mhaspec.usage import UsageError, checked_backend, one_line, printable


def backend_ref(meta: dict, *, backend: str | None, recorded_backend: bool) -> str:
    """The backend to replay on: ``backend`` when the user named one; the file's recorded name
    when ``recorded_backend`` is set and that name is registered; otherwise a :class:`UsageError`."""
    recorded = meta["backend"]
    if backend is not None:
        if recorded_backend:
            raise UsageError("give either --backend or --recorded-backend, not both")
        return backend
    if not recorded_backend:
        raise UsageError(f"name the backend to replay on with --backend (the file records "
                         f"'{printable(recorded)}'; --recorded-backend uses it if it is a registered "
                         f"backend name)")
    if recorded not in registered_backends():
        raise UsageError(f"the file records backend '{printable(recorded)}', which is not a registered "
                         f"backend name (a module:attr from a file is never imported): name the "
                         f"backend with --backend")
    return recorded


def replay_file(path, *, backend: str | None = None, recorded_backend: bool = False,
                max_bytes: int) -> int:
    """Replay the case saved at ``path``: 0 if the backend now conforms on it, 1 if it still
    fails; a :class:`UsageError` for a file or backend that cannot be used."""
    try:
        meta, case = failure_file.read_case(path, max_bytes=max_bytes)
    except failure_file.FailureFileError as exc:
        raise UsageError(printable(one_line(exc), limit=400)) from None
    ref = backend_ref(meta, backend=backend, recorded_backend=recorded_backend)
    impl = checked_backend(ref)
    device, dtype = meta["device"], meta["dtype"]
    why = impl.devices().get(device, "not one of its devices")
    if why is not None:
        raise UsageError(f"the case was recorded on device '{printable(device)}', unavailable to "
                         f"{printable(impl.name)}: {printable(why)}")
    if dtype not in impl.dtypes(device):
        raise UsageError(f"the case was recorded in {dtype}, which {printable(impl.name)} does not "
                         f"claim on {printable(device)}")
    run = harness.Cell(impl, device, dtype)
    if meta["op"] == "attention_vjp":
        return _replay_vjp(path, meta, run, case)
    try:
        ref = judgeable_reference(run, case, meta["op"], meta["overrides"])
    except Unjudgeable as exc:
        raise UsageError(f"{printable(path)}: the recorded case is not replayed: "
                         f"{printable(exc, limit=400)}") from None
    print(f"replaying {printable(meta['clause'])} ({meta['op']}) from {printable(path)} on "
          f"{printable(impl.name)} ({device}, {dtype})")
    try:
        got = harness.run(run, meta["op"], case, **meta["overrides"])
    except Exception as exc:  # noqa: BLE001 - the backend's error is the replayed failure
        print(f"{printable(impl.name)} {meta['op']} raised {type(exc).__name__}: "
              f"{printable(exc, limit=2000)}: DOES NOT CONFORM")
        return 1
    try:
        checks = harness.check(run, case, got, op=meta["op"], clause=meta["clause"],
                               overrides=meta["overrides"], ref=ref)
    except AssertionError as exc:  # a result of the wrong shape
        print(f"{printable(impl.name)} {meta['op']}: {printable(exc, limit=2000)}: DOES NOT CONFORM")
        return 1
    for line in describe(printable(impl.name), meta["op"], checks):
        print(line)
    return 0 if all(c.verdict.ok for c in checks) else 1


def _replay_vjp(path, meta: dict, run, case) -> int:
    """Replay a saved gradient case (op "attention_vjp") on the cell ``run``: 0 if every gradient
    conforms, 1 if not (or the backend raised)."""
    print(f"replaying {printable(meta['clause'])} (attention_vjp) from {printable(path)} on "
          f"{printable(run.backend.name)} ({run.device}, {run.dtype})")
    try:
        lines = judge_vjp(run, case, meta["overrides"], clause=meta["clause"])
    except Unjudgeable as exc:
        raise UsageError(f"{printable(path)}: the recorded case is not replayed: "
                         f"{printable(exc, limit=400)}") from None
    except Exception as exc:  # noqa: BLE001 - the backend's error is the replayed failure
        print(f"{printable(run.backend.name)} attention_vjp raised {type(exc).__name__}: "
              f"{printable(exc, limit=2000)}: DOES NOT CONFORM")
        return 1
    for line in lines:
        print(printable(line, limit=2000))
    return 0 if all(line.endswith(": conforms") for line in lines) else 1
