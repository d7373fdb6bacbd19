"""The backend's own process under ``mhaspec certify``: it holds the backend and array conversion
only (started by :mod:`mhaspec.backend_process`, entry :func:`main`).

It loads the backend, reads its claims once (:func:`read_claims`, plain JSON; their types are
checked by the judging process) and then answers requests over :mod:`mhaspec.wire` until the pipe
closes. Request ``{"op": "call", "method", "args", "kwargs", "define", "free"}``: the arrays of
``define`` (``[id, array index, dtype, device]``) become backend arrays by ``asarray`` and join the
table of arrays the judging process holds handles to, the method runs, and every backend array of
its result is kept in the table and sent back as ``to_numpy`` of it with ``device_of`` of it.
Request ``{"op": "fetch", "ids", "define", "free"}``: ``to_numpy`` and ``device_of`` of arrays of
the table, or the error of each. Any exception of the backend's code (``BaseException``: also ``SystemExit`` and pytest's
outcome exceptions) is sent back as its type names, message and traceback; the judging process decides what it
means. Values: see :func:`decode` and :func:`encode`.
"""

from __future__ import annotations

import os
import platform
import sys
import traceback
from collections.abc import Mapping

import numpy as np

from mhaspec import __version__, codec, usage, wire
from mhaspec.backends.claim_readers import OPS



def plain(x):
    """``x`` as JSON the judging process validates: sets, tuples and lists as lists, mappings with
    string keys as objects, scalars as they are; anything else as ``{"!": type name}``."""
    if x is None or isinstance(x, (str, bool, int, float)):
        return x
    if isinstance(x, (set, frozenset, tuple, list)):
        return [plain(v) for v in x]
    if isinstance(x, Mapping) and all(isinstance(k, str) for k in x):
        return {k: plain(v) for k, v in x.items()}
    return {"!": type(x).__name__}


def host_facts() -> dict[str, str]:
    """The interpreter serving the backend: its Python and mhaspec versions (the judge refuses an
    mhaspec other than its own: the two speak one wire protocol)."""
    return {"python": platform.python_version(), "mhaspec": __version__}


def read_claims(backend) -> dict:
    """Every claim of ``backend``, each member read once (``deviations_on`` and ``dtypes`` per
    available device, ``capabilities_for`` per operation where it has one). A member that raises
    is a ``ValueError`` naming it."""
    def member(what, fn, *args):
        try:
            return plain(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - the backend's own code
            raise ValueError(f"{what} raised {type(exc).__name__}: {exc}") from None

    claims = {n: member(n, getattr, backend, n) for n in ("name", "framework", "capabilities")}
    claims["protocol_version"] = member("protocol_version", getattr, backend, "protocol_version", 1)
    claims["deviations"] = member("deviations", getattr, backend, "deviations", {})
    for name in ("validated_clauses", "library_validates"):  # an adapter's (mhaspec.backends.adapters)
        claims[name] = member(name, getattr, backend, name, ())
    claims["sub_cases"] = member("sub_cases", getattr, backend, "sub_cases", {})
    # spec 1.4, MERGE-3: the lse conventions merge_states accepts (None: LSE-1's alone)
    claims["merge_conventions"] = member("merge_conventions", getattr, backend, "merge_conventions",
                                         None)
    # spec 1.4, PAGE-1: the page sizes paged_attention takes are the multiples of this unit
    claims["page_size_unit"] = member("page_size_unit", getattr, backend, "page_size_unit", 1)
    # whether it says which capabilities its adapter served by folding (adapters.NativeAdapter)
    claims["reports_folds"] = member("folded_by_adapter", lambda: callable(
        getattr(backend, "folded_by_adapter", None)))
    claims["framework_version"] = member("framework_version()",
                                         lambda: str(backend.framework_version()))
    scoped = getattr(backend, "capabilities_for", None)
    claims["capabilities_for"] = None if scoped is None else {
        op: member(f"capabilities_for({op!r})", scoped, op) for op in OPS}
    devices = claims["devices"] = member("devices()", backend.devices)
    available = [d for d, why in devices.items() if why is None] if isinstance(devices, dict) else []
    claims["dtypes"] = {d: member(f"dtypes({d!r})", backend.dtypes, d) for d in available}
    on = getattr(backend, "deviations_on", None)
    claims["deviations_on"] = {}
    for d, dtypes in claims["dtypes"].items():
        if isinstance(dtypes, list):
            claims["deviations_on"][d] = {
                t: member(f"deviations_on({d!r}, {t!r})", on, d, t) if on is not None
                else claims["deviations"] for t in dtypes if isinstance(t, str)}
    flags = getattr(backend, "precision_flags", None)
    claims["precision_flags"] = {d: member(f"precision_flags({d!r})", flags, d) if flags else {}
                                 for d in available}
    claims["device_names"] = {d: member(f"the name of device {d!r}", device_name, backend, d)
                              for d in available}
    return claims


def device_name(backend, device: str) -> str:
    """A readable name of ``device``, read here, in the backend's process, so that the judging
    process never imports a framework: the CPU model for ``cpu``, the GPU's name where torch says
    (a torch backend's ``cuda`` / ``cuda:N``), else the device string itself. Informative only:
    the device is self-reported (docs/certificates.md)."""
    if device == "cpu":
        return platform.processor() or platform.machine() or device
    if backend.framework == "torch" and device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name(torch.device(device).index or 0)
        except Exception:  # noqa: BLE001 - a name is informative only
            pass
    return device


class Host:
    """The backend and the table of its arrays the judging process holds handles to."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.table: dict[int, object] = {}
        self.next_id = -1  # results count down; the judging process's own handles count up

    def handle(self, header: dict, arrays: list) -> tuple[dict, list]:
        for i in header.get("free", []):
            self.table.pop(i, None)
        failed: dict[int, BaseException] = {}
        for i, index, dtype, device in header.get("define", []):
            try:
                self.table[i] = self.backend.asarray(arrays[index], dtype=dtype, device=device)
            except BaseException as exc:  # noqa: BLE001 - a fetch answers for each array
                if header["op"] != "fetch":
                    raise
                failed[i] = exc
        out: list = []
        if header["op"] == "fetch":
            return {"fetched": [self.fetch(i, failed, out) for i in header["ids"]]}, out
        fn = getattr(self.backend, header["method"])
        args = [self.decode(v, arrays) for v in header["args"]]
        kwargs = {k: self.decode(v, arrays) for k, v in header["kwargs"].items()}
        return {"ok": self.encode(fn(*args, **kwargs), out)}, out

    def fetch(self, i: int, failed: dict, out: list) -> dict:
        """:meth:`export` of array ``i``, or the error of its ``asarray`` or ``to_numpy``."""
        try:
            if i in failed:
                raise failed[i]
            return self.export(self.table[i], out, i)
        except BaseException as exc:  # noqa: BLE001 - handed to the judging process
            return error(exc)

    def decode(self, v, arrays: list):
        """A request's value (:mod:`mhaspec.codec`): ``{"h": id}`` an array of the table, ``{"a":
        i}`` the i-th NumPy array of the message."""
        return codec.decode(v, lambda obj: self.table[obj["h"]] if "h" in obj else arrays[obj["a"]])

    def encode(self, v, out: list):
        """A result as JSON (:mod:`mhaspec.codec`): every object that is no scalar or container
        is a backend array (:meth:`export`)."""
        return codec.encode(v, lambda x: self.keep(x, out))

    def keep(self, x, out: list) -> dict:
        """The backend array ``x`` kept in the table under a new id and exported."""
        i, self.next_id = self.next_id, self.next_id - 1
        self.table[i] = x
        return self.export(x, out, i)

    def export(self, x, out: list, i: int) -> dict:
        """``{"h": id, "a": index, "device": device_of}`` of the backend array ``x``, its
        ``to_numpy`` appended to ``out``."""
        array = np.asarray(self.backend.to_numpy(x))
        if not wire.DTYPE.fullmatch(array.dtype.str):
            raise TypeError(f"to_numpy returned an array of dtype {array.dtype} (booleans and "
                            f"numbers only)")
        out.append(array)
        return {"h": i, "a": len(out) - 1, "device": str(self.backend.device_of(x))}


def error(exc: BaseException) -> dict:
    """An exception as JSON: its type's name, the names along its MRO, its message, and its
    traceback in this process (the last 8,000 characters: where in the backend it was raised)."""
    trace = "".join(traceback.format_exception(exc))
    return {"error": {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                      "message": str(exc)[:4000], "traceback": trace[-8000:]}}


def serve(ref: str, fd_in: int, fd_out: int) -> int:
    """Load ``ref``, send its claims (or why it could not), answer requests until EOF."""
    try:
        backend = usage.checked_backend(ref)
        claims = read_claims(backend)
    except usage.UsageError as exc:  # one line naming the backend (and the install line)
        wire.send(fd_out, {"load_error": str(exc)[:4000]})
        return 0
    except BaseException as exc:  # noqa: BLE001 - the backend's import and constructor
        wire.send(fd_out, {"load_error": f"backend {ref!r} failed to load: "
                                         f"{type(exc).__name__}: {exc}"[:4000]})
        return 0
    wire.send(fd_out, {"claims": claims, "host": host_facts()})
    host = Host(backend)
    while True:
        try:
            header, arrays = wire.receive(fd_in)
        except wire.WireClosed:
            return 0
        try:
            reply, out = host.handle(header, arrays)
        except BaseException as exc:  # noqa: BLE001 - handed to the judging process
            reply, out = error(exc), []
        wire.send(fd_out, reply, out)


def main() -> None:
    """The process's entry (:data:`mhaspec.backend_process.HOST_ENTRY`): the first message on
    stdin names the backend, the answer pipe and the folder a local module lies in; stdin then
    moves to a descriptor of its own and reads ``/dev/null``."""
    fd_in = os.dup(0)
    start, _ = wire.receive(fd_in)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if start.get("path"):
        sys.path.append(start["path"])
    sys.exit(serve(start["ref"], fd_in, int(start["answers"])))
