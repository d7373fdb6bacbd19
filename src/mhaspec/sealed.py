"""The backend as the judging process of ``mhaspec certify`` holds it: a stand-in that follows the
backend protocol and forwards every operation to the backend's own process.

:func:`open_sealed` starts :class:`~mhaspec.backend_process.BackendProcess` for a reference, takes
the claims it sends once, checks and freezes them (:mod:`mhaspec.claims`) and returns a
:class:`SealedBackend`. Its claims are those frozen values, whatever the backend does later; its
"backend arrays" are :class:`RemoteArray` handles: ``asarray`` keeps the NumPy array (sent with the
first call that uses it), an operation sends its arguments and gets back ``to_numpy`` and
``device_of`` of every array it returns, in one exchange timed as a whole (``asarray`` and
``to_numpy`` included). The backend's exceptions come back as an exception of the builtin type
they derive from (a ``ValueError`` stays a ``ValueError``) and the backend's type name, or as
:class:`BackendRaised`; pytest's outcome exceptions raised by a backend (``xfail``, ``skip``) are
plain failures here. A hang or a death of the process fails that call and the next call starts a
new process (:mod:`mhaspec.backend_process`).
"""

from __future__ import annotations

import builtins
import itertools
import re
import weakref

import numpy as np

from mhaspec import __version__
from mhaspec import claims as claims_module
from mhaspec import codec
from mhaspec.backend_process import BackendDied, BackendProcess
from mhaspec.usage import printable

OPERATIONS = ("split_heads", "combine_heads", "scaled_dot_product_attention",
              "multi_head_attention", "mha_vjp", "attention_vjp", "merge_states",
              "paged_attention", "write_pages")


class SealedError(Exception):
    """The backend could not be started or its claims are wrong (one line)."""


class BackendRaised(Exception):
    """An exception of the backend that is no builtin ``Exception`` (its type name leads the
    message)."""


class RemoteArray:
    """A backend array held by the backend's process (``id`` in its table), or a NumPy array not
    yet sent (``source``). ``numpy`` / ``device``: ``to_numpy`` and ``device_of`` as last read
    (None once the array was passed to an operation, which may change it)."""

    __slots__ = ("id", "generation", "source", "dtype", "device_name", "numpy", "device",
                 "__weakref__")

    def __init__(self, id_, *, generation=None, source=None, dtype=None, device_name=None,
                 numpy=None, device=None) -> None:
        self.id, self.generation, self.source = id_, generation, source
        self.dtype, self.device_name = dtype, device_name
        self.numpy, self.device = numpy, device

    def __repr__(self) -> str:
        return f"<array {self.id} of the backend's process>"


def _exception_type(names: list[str]) -> type:
    """The class a backend exception is raised as: named as the backend's, deriving from the first
    builtin ``Exception`` class along its MRO names (else :class:`BackendRaised`)."""
    base = next((b for n in names[:32] if isinstance(b := getattr(builtins, str(n), None), type)
                 and issubclass(b, Exception)), BackendRaised)
    name = re.sub(r"\W", "_", str(names[0]))[:60] if names else "BackendError"
    return base if base.__name__ == name else _subclass(name, base)


_subclasses: dict = {}


def _subclass(name: str, base: type) -> type:
    key = (name, base)
    if key not in _subclasses:
        _subclasses[key] = type(name, (base,), {"__module__": "backend"})
    return _subclasses[key]


class SealedBackend:
    """The backend protocol (:class:`mhaspec.backends.Backend`) over a :class:`BackendProcess`,
    with claims frozen at start (:class:`mhaspec.claims.Claims`). It times every exchange itself
    (``call_timeout``; the start of a new process has its own limit), so the suite's own per-call
    timer leaves it alone (``times_its_calls``)."""

    times_its_calls = True

    def __init__(self, process: BackendProcess, claims: claims_module.Claims,
                 call_timeout: float | None) -> None:
        self.process, self.claims, self.call_timeout = process, claims, call_timeout
        self.name, self.framework = claims.name, claims.framework
        self.protocol_version = claims.protocol_version
        self.capabilities = claims.capabilities
        self.deviations = claims.deviations
        self.validated_clauses, self.library_validates = claims.validated_clauses, claims.library_validates
        self.sub_cases = claims.sub_cases
        self.merge_conventions = claims.merge_conventions  # spec 1.4, MERGE-3
        self.page_size_unit = claims.page_size_unit  # spec 1.4, PAGE-1
        self.capabilities_for = None if claims.capabilities_for is None else self._scoped
        if claims.reports_folds:  # an adapter's: asked after every test (conformance.plugin)
            self.folded_by_adapter = self._folded_by_adapter
        self._ids = itertools.count(1)
        self._released: list[tuple[int, int]] = []  # (generation, id) no longer held here
        self._unread: weakref.WeakSet = weakref.WeakSet()  # arrays whose numpy is not known

    # -- claims: the frozen values ------------------------------------------------------------
    def framework_version(self) -> str:
        return self.claims.framework_version

    def devices(self) -> dict:
        return dict(self.claims.devices)

    def dtypes(self, device: str) -> tuple:
        return self.claims.dtypes.get(device, ())

    def deviations_on(self, device: str, dtype: str):
        return self.claims.deviations_on.get(device, {}).get(dtype, self.deviations)

    def precision_flags(self, device: str) -> dict:
        return dict(self.claims.precision_flags.get(device, {}))

    def device_name(self, device: str) -> str:
        """The readable name the backend's process gave ``device`` (the judging process imports
        no framework to find it)."""
        return self.claims.device_names.get(device, device)

    def _scoped(self, op: str) -> frozenset:
        return self.claims.capabilities_for[op]

    # -- arrays ---------------------------------------------------------------------------------
    def asarray(self, x, *, dtype: str, device: str = "cpu") -> RemoteArray:
        handle = RemoteArray(next(self._ids), source=np.asarray(x), dtype=dtype, device_name=device)
        self._unread.add(handle)
        return handle

    def to_numpy(self, x: RemoteArray) -> np.ndarray:
        if x.numpy is None:
            self._fetch(x)
        return x.numpy

    def device_of(self, x: RemoteArray) -> str:
        if x.device is None:
            self._fetch(x)
        return x.device

    # -- operations -----------------------------------------------------------------------------
    def split_heads(self, *args, **kwargs):
        return self._call("split_heads", args, kwargs)

    def combine_heads(self, *args, **kwargs):
        return self._call("combine_heads", args, kwargs)

    def scaled_dot_product_attention(self, *args, **kwargs):
        return self._call("scaled_dot_product_attention", args, kwargs)

    def multi_head_attention(self, *args, **kwargs):
        return self._call("multi_head_attention", args, kwargs)

    def mha_vjp(self, *args, **kwargs):
        return self._call("mha_vjp", args, kwargs)

    def attention_vjp(self, *args, **kwargs):  # spec 1.3
        return self._call("attention_vjp", args, kwargs)

    def merge_states(self, *args, **kwargs):  # spec 1.4
        return self._call("merge_states", args, kwargs)

    def paged_attention(self, *args, **kwargs):  # spec 1.4
        return self._call("paged_attention", args, kwargs)

    def write_pages(self, *args, **kwargs):  # spec 1.4
        return self._call("write_pages", args, kwargs)

    def _folded_by_adapter(self):
        return self._call("folded_by_adapter", (), {})

    def close(self) -> None:
        self.process.stop()

    def __repr__(self) -> str:
        return f"<mhaspec backend {self.name} (own process)>"

    # -- the exchange ---------------------------------------------------------------------------
    def _call(self, method: str, args: tuple, kwargs: dict):
        self.process.ensure()
        out: dict = {"define": [], "arrays": [], "touched": [], "new": []}
        header = {"op": "call", "method": method,
                  "args": [self._encode(a, out) for a in args],
                  "kwargs": {k: self._encode(v, out) for k, v in kwargs.items()}}
        try:
            reply, arrays = self._exchange(header, out, method)
        finally:
            for handle in out["touched"]:  # the operation may have changed them
                handle.numpy = handle.device = None
                self._unread.add(handle)
        return self._decode(reply["ok"], arrays)

    def _fetch(self, x: RemoteArray) -> None:
        """``to_numpy`` and ``device_of`` of ``x``, and in the same exchange of every other array
        not read since it was made or passed to an operation (the suite reads them next: one
        exchange instead of one each). Only ``x``'s failure is an error."""
        self.process.ensure()
        out: dict = {"define": [], "arrays": [], "touched": [], "new": []}
        handles = [x, *(h for h in self._unread if h is not x
                        and (h.generation == self.process.generation or h.source is not None))]
        ids = [self._encode(h, out)["h"] for h in handles]
        reply, arrays = self._exchange({"op": "fetch", "ids": ids}, out, "to_numpy")
        fetched = reply.get("fetched")
        if not isinstance(fetched, list) or len(fetched) != len(handles):
            raise BackendDied(f"{self.name}.to_numpy: malformed answer from the backend's process")
        for handle, got in zip(handles, fetched):
            if isinstance(got, dict) and "error" in got:
                if handle is x:
                    self._raise(got["error"], "to_numpy")
                if handle in out["new"]:
                    handle.generation = None
                continue
            self._decode(got, arrays, into=handle)
            self._unread.discard(handle)

    def _raise(self, err, what: str):
        """Raise the backend's exception ``err`` (:func:`mhaspec.backend_host.error`)."""
        names = err.get("mro") if isinstance(err, dict) else None
        message = str(err.get("message", "")) if isinstance(err, dict) else ""
        if not isinstance(names, list) or not names:
            raise BackendDied(f"{self.name}.{what}: malformed answer from the backend's process")
        kind = _exception_type(names)
        prefix = f"{names[0]}: " if kind is BackendRaised else ""
        raised = kind(prefix + message)
        trace = err.get("traceback")
        if isinstance(trace, str) and trace:  # shown by pytest below the failure, never judged
            raised.add_note("raised in the backend's process:\n" + "\n".join(
                printable(line, limit=400) for line in trace[-8000:].split("\n")))
        raise raised

    def _exchange(self, header: dict, out: dict, what: str):
        generation = self.process.generation
        gone, self._released = self._released, []  # a finalizer may append at any time
        released = [i for g, i in gone if g == generation]
        reply, arrays = self.process.request(
            {**header, "define": out["define"], "free": released}, out["arrays"],
            limit=self.call_timeout, what=f"{self.name}.{what}")
        if "error" in reply:
            for handle in out["new"]:  # not in the process's table: sent again when used again
                handle.generation = None
            self._raise(reply["error"], what)
        if not isinstance(reply, dict) or ("ok" not in reply and "fetched" not in reply):
            raise BackendDied(f"{self.name}.{what}: malformed answer from the backend's process")
        return reply, arrays

    def _encode(self, v, out: dict):
        """A request value (:mod:`mhaspec.codec`); handles not yet in the current process are
        defined from their NumPy source."""
        return codec.encode(v, lambda x: self._encode_leaf(x, out))

    def _encode_leaf(self, v, out: dict) -> dict:
        if isinstance(v, RemoteArray):
            if v.generation != self.process.generation:
                if v.source is None:
                    raise BackendDied(f"{self.name}: an array of a backend process that was "
                                      f"stopped was passed on")
                out["define"].append([v.id, len(out["arrays"]), v.dtype, v.device_name])
                out["arrays"].append(v.source)
                out["new"].append(v)
                v.generation = self.process.generation
                weakref.finalize(v, self._released.append, (v.generation, v.id))
            out["touched"].append(v)
            return {"h": v.id}
        if isinstance(v, np.ndarray):
            out["arrays"].append(v)
            return {"a": len(out["arrays"]) - 1}
        if isinstance(v, np.generic):
            return v.item()
        raise TypeError(f"cannot send a {type(v).__name__} to the backend's process")

    def _decode(self, v, arrays: list, into: RemoteArray | None = None):
        """A result value (:mod:`mhaspec.codec`; ``into``: the handle a fetched array is read
        into); anything malformed is :class:`BackendDied`."""
        def leaf(obj: dict) -> RemoteArray:
            handle = into or RemoteArray(int(obj["h"]), generation=self.process.generation)
            handle.numpy, handle.device = arrays[obj["a"]], str(obj["device"])
            if into is None:
                weakref.finalize(handle, self._released.append, (handle.generation, handle.id))
            return handle

        try:
            return codec.decode(v, leaf)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            raise BackendDied(f"{self.name}: malformed answer from the backend's process") from None


def sealed_with_claims(ref: str, claims: dict, *, call_timeout: float | None,
                       sandbox: bool = False, python: str | None = None) -> SealedBackend:
    """The backend ``ref`` with ``claims`` already read and frozen elsewhere (as the first message
    of its process sent them to :func:`open_sealed`): checked and frozen again here, and its
    process started at its first call, not now. :class:`SealedError` when the claims are wrong."""
    return SealedBackend(BackendProcess(ref, sandbox=sandbox, python=python),
                         frozen_claims(ref, claims), call_timeout)


def frozen_claims(ref: str, claims) -> claims_module.Claims:
    """``claims`` as sent by the backend's process, checked and frozen; :class:`SealedError` (one
    line) when they have the wrong type."""
    try:
        return claims_module.checked(claims)
    except (claims_module.ClaimError, AttributeError, TypeError) as exc:
        raise SealedError(f"backend {ref!r}: {exc}") from None


def host_problem(first: dict) -> str | None:
    """Why the judge cannot talk to the process that sent ``first`` (its first message), or None:
    an mhaspec other than the judge's serves the backend (another interpreter, ``--backend-python``,
    with another version installed: the two must speak one wire protocol)."""
    host = first.get("host")
    theirs = host.get("mhaspec") if isinstance(host, dict) else None
    if theirs != __version__:
        return (f"the backend's interpreter has mhaspec {printable(str(theirs))}, the judge "
                f"{__version__}: install the same version in both")
    return None


def open_sealed(ref: str, *, call_timeout: float | None, sandbox: bool = False,
                python: str | None = None) -> SealedBackend:
    """Start the backend ``ref`` in its own process (``sandbox``: in
    :data:`mhaspec.backend_process.SANDBOX`; ``python``: under that interpreter, which must have
    the judge's mhaspec) and freeze its claims; :class:`SealedError` (one line) when it cannot
    load, its claims cannot be read or have the wrong type."""
    process = BackendProcess(ref, sandbox=sandbox, python=python)
    try:
        first = process.start()
    except BaseException as exc:
        process.stop()
        raise SealedError(f"backend {ref!r} could not start: {exc}") from None
    if "claims" not in first:
        process.stop()
        raise SealedError(str(first.get("load_error", f"backend {ref!r} failed to load: {first}")))
    try:
        problem = host_problem(first)
        if problem:
            raise SealedError(problem)
        return SealedBackend(process, frozen_claims(ref, first["claims"]), call_timeout)
    except SealedError:
        process.stop()
        raise
