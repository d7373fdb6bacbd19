"""Run an operation on a case and judge the result against the oracle (every conformance test and
tool goes through here).

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

:class:`Impl` is one parametrization of the suite: a backend on a device in a dtype.
:func:`run` runs an operation on a :class:`~mhaspec.conformance.strategies.Case` and returns NumPy
results; :meth:`Impl.call` is the one place a backend method is called (the per-call time limit,
the call count, the device check). :func:`check` judges a result against the float64 oracle under
NUM-3 and returns the verdicts; :func:`expect_oracle` raises an ``AssertionError`` naming the
clause, the error and a reproducer a user can paste.

Per-call time limit: a backend call that runs longer than the run's limit (the plugin's
``--mhaspec-call-timeout``) raises :class:`CallTimeout`, naming the limit. In the main thread (pytest
and its xdist workers run tests there) the limit is a ``SIGALRM`` timer (``setitimer``), which
interrupts Python code, ``time.sleep`` and blocking waits of the backend; elsewhere the call runs
in a daemon thread joined with the limit (the thread is abandoned, the test fails). A call stuck in
C code that never returns to the interpreter is only interrupted by the thread form.
:class:`CallTimeout` derives from ``BaseException`` so that neither a backend's ``except
Exception`` nor Hypothesis's shrinking (which would repeat the slow call) swallows it: the test
fails at once.
"""

from __future__ import annotations

import contextvars
import functools
import pathlib
import re
import signal
import threading
from typing import Any, Mapping, NamedTuple

import numpy as np
import pytest

from mhaspec.backends import AttentionOutputs, MHAParams
from mhaspec.spec import oracle

from . import conditions, failure_file, features, tolerance
from .strategies import Case, CaseSpec, build_case

OPS = ("sdpa", "mha")
#: The pytest item being run; the plugin sets it so results are recorded on the item.
current_item: contextvars.ContextVar[Any] = contextvars.ContextVar("mhaspec_current_item", default=None)


class RunSettings(NamedTuple):
    """Settings of one conformance run, kept in ``config.stash[SETTINGS_KEY]`` by the plugin.

    ``failures_dir``: where failing cases are saved (None: not saved); ``backend_refs``: backend
    name -> the reference it was loaded from (for reproducers); ``call_timeout``: seconds one
    backend call may take (None: no limit)."""

    failures_dir: pathlib.Path | None = None
    backend_refs: Mapping[str, str] = {}
    call_timeout: float | None = None


SETTINGS_KEY = pytest.StashKey[RunSettings]()


def running_clauses() -> frozenset[str]:
    """The clauses the running test names (empty outside a pytest run)."""
    item = current_item.get()
    return frozenset() if item is None else frozenset(
        c for m in item.iter_markers("clause") for c in m.args)


def run_settings() -> RunSettings:
    """The settings of the running test's session (defaults outside a pytest run)."""
    item = current_item.get()
    if item is None:
        return RunSettings()
    return item.config.stash.get(SETTINGS_KEY, RunSettings())


class CallTimeout(BaseException):
    """A backend call ran past the per-call time limit (see the module docstring)."""


def call_with_limit(fn, seconds: float | None, what: str):
    """``fn()``, raising :class:`CallTimeout` naming ``what`` and the limit after ``seconds``."""
    if not seconds:
        return fn()
    message = (f"{what} did not return within the per-call time limit of {seconds:g} s "
               f"(--mhaspec-call-timeout)")
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def alarm(signum, frame):
            raise CallTimeout(message)

        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True, name="mhaspec-call")
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise CallTimeout(message)
    if "error" in box:
        raise box["error"]
    return box["value"]


class Result(NamedTuple):
    """A backend's output and weights as float NumPy arrays (weights None when not returned);
    for the float64 oracle also NUM-3's softmax condition kappa. With ``lse=True`` or a KV cache
    (spec 1.2) also the log-sum-exp (B, h, L_q) and the present cache (B, g, L_K, d_k / d_v) with
    its lengths (B,); None where not returned."""

    out: np.ndarray
    weights: np.ndarray | None
    condition: float = 1.0
    lse: np.ndarray | None = None
    present_key: np.ndarray | None = None
    present_value: np.ndarray | None = None
    present_lengths: np.ndarray | None = None


class Impl(NamedTuple):
    """One parametrization: ``backend`` on ``device`` computing in ``dtype``."""

    backend: Any
    device: str
    dtype: str

    def __repr__(self) -> str:
        return f"Impl({self.backend.name!r}, {self.device!r}, {self.dtype!r})"

    @property
    def id(self) -> str:
        return f"{self.backend.name}-{self.device}-{self.dtype}"

    def case(self, spec: CaseSpec, op: str = "mha") -> Case:
        """The arrays of ``spec`` for ``op``, fitted to what this backend claims and to this dtype.
        Where the cell declares a SOFTCAP-1 deviation for ``op``, the cases of other clauses carry
        no soft-cap: the capping is SOFTCAP-1's verdict (its own test reports the deviation), as
        emptied rows are MASK-9's (:func:`rows_left_to_mask9`)."""
        spec = fit(spec, op_capabilities(self.backend, op), self.dtype, op)
        if spec.softcap is not None and "SOFTCAP-1" not in running_clauses() and "SOFTCAP-1" in \
                op_deviations(cell_deviations(self.backend, self.device, self.dtype), op):
            spec = spec._replace(softcap=None)
        return build_case(spec)

    def arr(self, x, dtype: str | None = None):
        """NumPy -> backend array in this dtype (booleans stay boolean, integers -- segment ids and
        lengths -- become "int64"); None stays None."""
        if x is None:
            return None
        if dtype is None:
            kind = np.asarray(x).dtype.kind
            dtype = "bool" if kind == "b" else "int64" if kind in "iu" else self.dtype
        return self.backend.asarray(np.asarray(x), dtype=dtype, device=self.device)

    def masks(self, case: Case) -> dict:
        """The case's mask keyword arguments as backend arrays."""
        kw = case.mask_kwargs()
        for name in ("mask", "bias", "legacy_mask", "key_padding_mask"):
            kw[name] = self.arr(kw[name])
        return kw

    def call_kwargs(self, case: Case) -> dict:
        """Every keyword argument of a call on ``case`` (:meth:`Case.call_kwargs`), arrays as
        backend arrays: the masks, and the spec 1.2 features the case has."""
        return {k: self.arr(v) if isinstance(v, np.ndarray) else v
                for k, v in case.call_kwargs().items()}

    def params(self, params) -> MHAParams:
        """Projection parameters (``oracle.Params`` of NumPy arrays) as backend arrays."""
        return MHAParams(*(self.arr(p) for p in params))

    def mha_inputs(self, case: Case) -> tuple:
        """(query, key, value) as backend arrays; inputs that are one NumPy array (self-attention,
        or key and value shared) are passed as one backend array (MHA-3, MHA-4)."""
        converted: dict[int, Any] = {}

        def once(x):
            if id(x) not in converted:
                converted[id(x)] = self.arr(x)
            return converted[id(x)]

        return once(case.query), once(case.key), once(case.value)

    def call(self, method: str, *args, **kwargs):
        """``backend.<method>(*args, **kwargs)`` under the run's per-call time limit, counted on
        the running test item. Every backend operation of the suite is called through here."""
        item = current_item.get()
        if item is not None:
            item.mhaspec_calls = getattr(item, "mhaspec_calls", 0) + 1
        fn = getattr(self.backend, method)
        # a backend in a process of its own times each exchange itself (a restart not counted)
        limit = None if getattr(self.backend, "times_its_calls", False) else run_settings().call_timeout
        return call_with_limit(lambda: fn(*args, **kwargs), limit,
                               f"{self.backend.name}.{method} ({self.device}, {self.dtype})")

    def sdpa(self, case: Case, **overrides) -> Result:
        """:func:`run` of scaled_dot_product_attention."""
        return run(self, "sdpa", case, **overrides)

    def mha(self, case: Case, **overrides) -> Result:
        """:func:`run` of multi_head_attention."""
        return run(self, "mha", case, **overrides)

    def result(self, out, weights=None) -> Result:
        """A backend's (output, weights) -- or its :class:`AttentionOutputs` passed as ``out`` --
        as NumPy, after checking they live on this device."""
        parts = out._asdict() if isinstance(out, AttentionOutputs) else {"output": out,
                                                                          "weights": weights}
        for x in parts.values():
            if x is not None and self.device != "cpu":
                on = self.backend.device_of(x)
                assert on == self.device, f"result computed on {on!r}, not on {self.device!r}"
        got = {k: None if x is None else self.backend.to_numpy(x) for k, x in parts.items()}
        return Result(got.pop("output"), got.pop("weights"), **got)


def run(impl: Impl, op: str, case: Case, **overrides) -> Result:
    """Run ``op`` ("sdpa": scaled_dot_product_attention on q, k, v; "mha": multi_head_attention on
    query, key, value and the parameters) of ``impl`` on ``case``; NumPy results.

    Stable interface: ``overrides`` replace the case's keyword arguments (mask, bias, legacy_mask,
    key_padding_mask, causal, scale, ... as NumPy or scalars; arrays are converted), and for
    "mha" may add ``num_kv_heads`` or replace ``params`` (an ``oracle.Params``). Raises ValueError
    for an unknown ``op``; the backend's own exceptions pass through; :class:`CallTimeout` past
    the run's per-call time limit."""
    item = current_item.get()
    if item is not None:  # the case a failure of this test saves (the plugin, on failure)
        item.mhaspec_last_call = (impl, op, case, overrides)
        conditions.note(item, op, case.spec)
    kw = {**impl.call_kwargs(case), **{k: impl.arr(v) if isinstance(v, np.ndarray) else v
                                       for k, v in overrides.items() if k != "params"}}
    if op == "sdpa":
        out = impl.call("scaled_dot_product_attention", impl.arr(case.q), impl.arr(case.k),
                        impl.arr(case.v), **kw)
    elif op == "mha":
        params = impl.params(overrides.get("params", case.params))
        out = impl.call("multi_head_attention", *impl.mha_inputs(case), params,
                        num_heads=case.spec.heads, **kw)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if isinstance(out, AttentionOutputs):
        return impl.result(out)
    return impl.result(*out)


def op_capabilities(backend, op: str | None) -> frozenset:
    """The capabilities ``backend`` claims for operation ``op`` ("sdpa" or "mha"): its optional
    ``capabilities_for(op)`` where it has one (an attention function and a module of one library
    differ), else ``capabilities``. ``op`` None: ``capabilities``."""
    scoped = getattr(backend, "capabilities_for", None)
    if op is None or scoped is None:
        return frozenset(backend.capabilities)
    return frozenset(scoped(op))


def cell_deviations(backend, device: str, dtype: str) -> Mapping[str, str]:
    """The backend's declared deviations for one cell (``deviations_on`` is optional)."""
    on = getattr(backend, "deviations_on", None)
    return on(device, dtype) if on is not None else backend.deviations


def op_deviations(deviations: Mapping[str, str], op: str | None) -> dict[str, str]:
    """clause -> reason of the declared ``deviations`` that hold for operation ``op``: keys
    ``"CLAUSE"`` hold for every operation, ``"CLAUSE@op"`` (e.g. ``"SHAPE-4@mha"``) for ``op`` only."""
    out = {}
    for key, reason in deviations.items():
        clause, _, scope = key.partition("@")
        if not scope or scope == op:
            out.setdefault(clause, reason)
    return out


def fit(spec: CaseSpec, capabilities: frozenset, dtype: str, op: str = "mha") -> CaseSpec:
    """Drop the optional features of ``spec`` a backend does not claim (they are reported "not
    implemented" by the tests that need them) and the legacy mask in float16 (an error, ERR-9).
    A causal mask dropped from a case with a window or ALiBi leaves its diagonal as
    ``alignment``."""
    if (spec.causal is not None and "causal" not in capabilities and spec.alignment is None
            and (spec.window is not None or spec.alibi is not None)):
        spec = spec._replace(alignment=spec.causal)
    spec = features.fit_features(spec, capabilities, op)
    if spec.legacy_shape is not None and ("legacy_mask" not in capabilities or dtype == "float16"):
        spec = spec._replace(legacy_shape=None)
    if spec.bias_shape is not None and "bias" not in capabilities:
        spec = spec._replace(bias_shape=None)
    if spec.scale is not None and "scale" not in capabilities:
        spec = spec._replace(scale=None)
    if spec.causal is not None and "causal" not in capabilities:
        spec = spec._replace(causal=None)
    if (spec.mask_shape is not None or spec.key_padding) and "masks" not in capabilities:
        spec = spec._replace(mask_shape=None, key_padding=False)
    if op == "mha" and "cross" not in capabilities:  # every width h*d_k, as nn.MultiheadAttention
        width = spec.heads * spec.d_k
        spec = spec._replace(d_v=spec.d_k, d_model=width, k_dim=width, v_dim=width, d_out=width)
    return spec


def oracle_result(case: Case, op: str, precision: str = "float64", **overrides) -> Result:
    """The oracle (or the naive algorithm in ``precision``) on ``case``; cached for unmodified
    cases. ``overrides`` as for :func:`run` (NumPy arrays)."""
    if not overrides and case is build_case(case.spec):
        return _cached_oracle(case.spec, op, precision)
    return _run_oracle(case, op, precision, **overrides)


#: oracle results kept: every case of a ci run, so that the next cell finds the results of the
#: same cases (the run goes cell by cell, :mod:`.scheduling`); a few kB each, shapes up to 8
ORACLE_CACHE_SIZE = 8192


@functools.lru_cache(maxsize=ORACLE_CACHE_SIZE)
def _cached_oracle(spec: CaseSpec, op: str, precision: str) -> Result:
    return _run_oracle(build_case(spec), op, precision)


def _run_oracle(case: Case, op: str, precision: str, **overrides) -> Result:
    kw = {**case.call_kwargs(), **overrides}
    info: dict = {}
    if kw.get("sinks") is not None:  # spec 1.3: attention sinks (SINK-1), sdpa only
        return _oracle_with_sinks(case, precision, kw)
    if kw.pop("lse", False) or any(kw.get(name) is not None for name in oracle.FEATURES):
        res = _oracle_result(case, op, precision, info, kw)  # spec 1.2: lse and the cache too
    elif op == "sdpa":
        res = oracle.attention(case.q, case.k, case.v, precision=precision, info=info, **kw)
    elif op == "mha":
        params = kw.pop("params", case.params)
        res = oracle.multi_head_attention(case.query, case.key, case.value, params,
                                          num_heads=case.spec.heads, precision=precision,
                                          info=info, **kw)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return Result(*res[:2], max(1.0, info.get("logit_condition", 0.0)), *res[2:])


def _oracle_with_sinks(case: Case, precision: str, kw: dict) -> Result:
    """The sdpa oracle with ``kw["sinks"]`` (``oracle_vjp.attention_with_sinks``); NUM-3's
    condition is that of the call without sinks or the largest |sink|, whichever is larger.
    The sequential float32 order is float32's (the sink oracle has one summation order)."""
    from mhaspec.spec import oracle_vjp

    kw = dict(kw)
    sinks, _ = kw.pop("sinks"), kw.pop("lse", None)
    info: dict = {}
    oracle.attention_result(case.q, case.k, case.v, precision=precision, info=info, **kw)
    res = oracle_vjp.attention_with_sinks(case.q, case.k, case.v, sinks=sinks,
                                          precision=precision.removesuffix("-sequential"), **kw)
    condition = max(1.0, info.get("logit_condition", 0.0), float(np.max(np.abs(sinks))))
    return Result(*res[:2], condition, *res[2:])


def _oracle_result(case: Case, op: str, precision: str, info: dict, kw: dict):
    """The oracle's :class:`~mhaspec.spec.oracle.AttentionResult` of ``op`` on ``case``."""
    if op == "sdpa":
        return oracle.attention_result(case.q, case.k, case.v, precision=precision, info=info,
                                       **kw)
    if op == "mha":
        params = kw.pop("params", case.params)
        return oracle.multi_head_attention_result(case.query, case.key, case.value, params,
                                                  num_heads=case.spec.heads, precision=precision,
                                                  info=info, **kw)
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


class Reference(NamedTuple):
    """What NUM-3 compares a result with: the float64 oracle and the naive algorithm's results in
    each precision :func:`tolerance.naive_precisions` gives for the dtype."""

    expected: Result
    naive: list[Result]


def reference(case: Case, op: str, dtype: str, overrides: dict | None = None) -> Reference:
    """The oracle and naive results for one check (each computed once)."""
    overrides = overrides or {}
    return Reference(oracle_result(case, op, **overrides),
                     [oracle_result(case, op, p, **overrides) for p in tolerance.naive_precisions(dtype)])


def magnitude(case: Case, op: str, expected: Result) -> float:
    """NUM-3's magnitude scale: the largest finite magnitude among the oracle's output and the
    attended values (non-finite entries, NUM-6, are judged by class, not by size)."""
    values = case.v if op == "sdpa" else case.value
    return max(_finite_max_abs(expected.out), _finite_max_abs(values))


def _finite_max_abs(x: np.ndarray) -> float:
    x = np.asarray(x)
    return float(np.max(np.abs(x[np.isfinite(x)]), initial=0.0))


def sum_length(spec: CaseSpec) -> int:
    """N of NUM-3's subnormal allowance: the longest sum of the computation."""
    return max(spec.len_k, spec.d_k, spec.heads * spec.d_v, spec.d_model, spec.k_dim, spec.v_dim)


def record_ratio(clause: str, ratio: float) -> None:
    """Keep the worst NUM-3 ratio seen for ``clause`` on the running test item."""
    item = current_item.get()
    if item is None:
        return
    worst = getattr(item, "mhaspec_ratios", {})
    worst[clause] = max(worst.get(clause, 0.0), ratio)
    item.mhaspec_ratios = worst


def reproducer(impl: Impl, op: str, spec: CaseSpec, overrides: dict | None = None) -> str:
    """Python a user can paste to replay exactly this case on this backend."""
    extra = f", overrides={overrides!r}" if overrides else ""
    ref = run_settings().backend_refs.get(impl.backend.name, impl.backend.name)
    return ("from mhaspec.conformance.strategies import CaseSpec\n"
            "from mhaspec.conformance.replay import replay\n"
            f"replay({ref!r}, {op!r}, {spec!r}, device={impl.device!r}, "
            f"dtype={impl.dtype!r}{extra})")


def save_failure(impl: Impl, case: Case, op: str, clause: str, overrides: dict,
                 item=None) -> str:
    """Save the failing case (array overrides folded in, :func:`failure_file.saveable`) for
    ``mhaspec replay`` when the run of ``item`` (default: the running test) has a failures directory, and
    check that it reads back; returns the line telling how to replay it ("" when not saved) and
    keeps it on the item (``mhaspec_replay``)."""
    item = item if item is not None else current_item.get()
    settings = item.config.stash.get(SETTINGS_KEY, RunSettings()) if item is not None else RunSettings()
    fitting = failure_file.saveable(case, overrides)
    if settings.failures_dir is None or fitting is None:
        return ""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.name if item is not None else clause)
    ref = settings.backend_refs.get(impl.backend.name, impl.backend.name)
    path = failure_file.save_case(settings.failures_dir / f"{stem}.npz", impl, fitting[0], op=op,
                                  clause=clause, backend_ref=ref, overrides=fitting[1])
    try:
        failure_file.read_case(path)
    except failure_file.FailureFileError:
        path.unlink()
        return ""
    line = f"mhaspec replay {path} --backend {ref}"
    if item is not None:
        item.mhaspec_replay = line
    return "\nor: " + line


def save_last_call(item, clause: str) -> str:
    """After ``item`` failed: save the last case it ran (:func:`run`) unless a failure was saved
    already; returns the replay line ("" when none)."""
    if getattr(item, "mhaspec_replay", None):
        return item.mhaspec_replay
    last = getattr(item, "mhaspec_last_call", None)
    if last is None:
        return ""
    impl, op, case, overrides = last
    return save_failure(impl, case, op, clause, overrides, item=item).removeprefix("\nor: ")


def record_failure(clause: str, what: str, error: float, scale: float, detail: str,
                   spec: CaseSpec) -> None:
    """Keep what a value check found on the running test (the plugin reports it and groups
    failures by likely cause): the error, the magnitude it is relative to, expected vs got."""
    item = current_item.get()
    if item is not None:
        item.mhaspec_failure = {"clause": clause, "what": what, "error": float(error),
                                "scale": float(scale), "detail": detail, "case": repr(spec)}


def allowance(case: Case, op: str, impl: Impl, ref: Reference | None = None) -> tuple[float, float]:
    """NUM-3's allowed absolute error for (output, weights) of this case in ``impl.dtype``."""
    ref = ref or reference(case, op, impl.dtype)
    expected, length = ref.expected, sum_length(case.spec)
    out = tolerance.judge(expected.out, expected.out, [n.out for n in ref.naive], dtype=impl.dtype,
                          scale=magnitude(case, op, expected), sum_length=length,
                          condition=expected.condition)
    w = tolerance.judge(expected.weights, expected.weights, [n.weights for n in ref.naive],
                        dtype=impl.dtype, scale=1.0, sum_length=length, condition=expected.condition)
    return out.allowed, w.allowed


class Check(NamedTuple):
    """One judged part of a result: ``what`` is "output", "weights", "lse", "present_key" or
    "present_value" (spec 1.2), or "present_lengths" (compared exactly)."""

    what: str
    verdict: tolerance.Verdict


def lse_scale(lse: np.ndarray) -> float:
    """LSE-1's magnitude scale: max(1, max |lse_i|) over the finite entries."""
    return max(1.0, _finite_max_abs(lse))


def lse_for_comparison(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """``got`` with every entry that is not -inf where the oracle's is -inf (an empty row, LSE-1)
    replaced by 0, so it counts as an infinite error: -inf compares equal only to -inf."""
    got = np.asarray(got, dtype=np.float64)
    if got.shape != np.shape(expected):
        return got
    return np.where((expected == -np.inf) & (got != -np.inf), 0.0, got)


def _exact(got: np.ndarray, want: np.ndarray) -> tolerance.Verdict:
    """Integer results (present_lengths, CACHE-1): equal or not."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape} where the spec requires {want.shape}")
    wrong = np.argwhere(got != want)
    where = None if wrong.size == 0 else tuple(int(i) for i in wrong[0])
    error = 0.0 if where is None else float(np.max(np.abs(got.astype(np.float64) - want)))
    return tolerance.Verdict(where is None, error, 0.0, 0.0, 0.0 if where is None else np.inf, where)


def check(impl: Impl, case: Case, got: Result, *, op: str, clause: str,
          overrides: dict | None = None, ref: Reference | None = None) -> list[Check]:
    """Judge ``got`` (from :func:`run` with the same ``overrides``) against the oracle under NUM-3:
    the output, and the weights when returned; with spec 1.2's outputs also the log-sum-exp (scale
    of LSE-1) and the present cache (scale: its largest magnitude; its lengths exactly). Returns
    one :class:`Check` per part, in that order; records the worst ratio for ``clause`` on the
    running test; raises nothing for a mismatch.

    Stable interface: ``ref`` lets a caller that already computed :func:`reference` (or the
    oracle of a modified call, e.g. grouped heads) pass it; otherwise it is computed once here.
    Non-finite oracle results (NUM-6) must be non-finite in ``got`` too; weight rows whose oracle
    row is not finite are not compared (NUM-6 leaves them free). A result of the wrong shape
    raises ``AssertionError`` naming both shapes."""
    overrides = overrides or {}
    ref = ref or reference(case, op, impl.dtype, overrides)
    expected, naive = ref.expected, ref.naive
    empty = None if clause == "MASK-9" else rows_left_to_mask9(impl, op, expected)
    rows = None if empty is None else empty.any(axis=1) if op == "mha" else empty
    outputs = _unjudged([got.out, expected.out, *(n.out for n in naive)],
                        None if rows is None else rows[..., None])
    parts = [("output", outputs[0], outputs[1], outputs[2:], magnitude(case, op, expected))]
    if got.weights is not None:
        free = ~np.all(np.isfinite(expected.weights), axis=-1)
        free = free if empty is None else free | empty
        weights = _unjudged([got.weights, expected.weights, *(n.weights for n in naive)],
                            free[..., None])
        parts.append(("weights", weights[0], weights[1], weights[2:], 1.0))
    if got.lse is not None:
        lses = _unjudged([lse_for_comparison(got.lse, expected.lse), expected.lse,
                          *(n.lse for n in naive)], empty)
        parts.append(("lse", lses[0], lses[1], lses[2:], lse_scale(expected.lse)))
    for what in ("present_key", "present_value"):
        mine, want = getattr(got, what), getattr(expected, what)
        if mine is not None or want is not None:
            if mine is None or want is None:
                raise AssertionError(f"{what} {'missing' if mine is None else 'returned'} where "
                                     f"the spec {'requires' if mine is None else 'has'} one")
            parts.append((what, mine, want, [getattr(n, what) for n in naive],
                          _finite_max_abs(want)))
    checks = []
    for what, actual, exp, nv, scale in parts:
        verdict = tolerance.judge(actual, exp, nv, dtype=impl.dtype, scale=scale,
                                  sum_length=sum_length(case.spec), condition=expected.condition)
        record_ratio(clause, verdict.ratio)
        checks.append(Check(what, verdict))
    if expected.present_lengths is not None:
        if got.present_lengths is None:
            raise AssertionError("present_lengths missing where the spec requires it (CACHE-1)")
        checks.append(Check("present_lengths", _exact(got.present_lengths, expected.present_lengths)))
    return checks


def rows_left_to_mask9(impl: Impl, op: str, expected: Result) -> np.ndarray | None:
    """The oracle's fully masked rows (no allowed key: all-zero weights, MASK-9) as a boolean
    ``(B, h, L_q)``, when the cell declares a MASK-9 deviation for ``op``; else None. Such a
    backend's behaviour on those rows is MASK-9's verdict (its own test reports the deviation),
    so the other clauses -- a window, segments or lengths can leave a row empty -- judge the
    other rows only."""
    deviations = op_deviations(cell_deviations(impl.backend, impl.device, impl.dtype), op)
    if "MASK-9" not in deviations or expected.weights is None:
        return None
    empty = ~np.any(expected.weights != 0, axis=-1)
    return empty if empty.any() else None


def _unjudged(arrays: list, where) -> list:
    """``arrays`` (a result, the oracle's and the naive ones; None stays None) set to 0 where the
    boolean ``where`` (same rank, broadcasting; None: nowhere) holds, so that the comparison leaves
    those entries out. A result of another shape is left for the shape check."""
    if where is None or not where.any() or arrays[0] is None or np.ndim(arrays[0]) != where.ndim \
            or any(w not in (1, a) for w, a in zip(where.shape, np.shape(arrays[0]))):
        return arrays
    return [None if a is None else np.where(where, 0.0, a) for a in arrays]


def expect_oracle(impl: Impl, case: Case, got: Result, *, op: str, clause: str,
                  overrides: dict | None = None, ref: Reference | None = None,
                  context: str = "") -> None:
    """Assert ``got`` agrees with the oracle under NUM-3 (:func:`check`); the message names the
    clause, the part, the error and a reproducer (and the saved case when the run saves them).
    A float64 result whose error NUM-3 would allow in float32 says so (NUM-2's concern)."""
    ref = ref or reference(case, op, impl.dtype, overrides or {})
    for what, verdict in check(impl, case, got, op=op, clause=clause, overrides=overrides, ref=ref):
        if not verdict.ok:
            scale = magnitude(case, op, ref.expected) if what == "output" else 1.0
            record_failure(clause, f"{op} {what}{context}", verdict.error, scale,
                           f"differs from the float64 oracle: {verdict.describe()}", case.spec)
            saved = save_failure(impl, case, op, clause, overrides or {})
            raise AssertionError(
                f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): {op} {what}{context} "
                f"differs from the float64 oracle: {verdict.describe()}"
                f"{float32_hint(impl.dtype, what, verdict, ref)}\n"
                f"reproduce with:\n{reproducer(impl, op, case.spec, overrides)}" + saved)


def float32_hint(dtype: str, what: str, verdict: tolerance.Verdict, ref: Reference) -> str:
    """For a float64 failure within float32's error: a note that the result has float32
    accuracy, i.e. a float64 path that rounds through float32 (NUM-2); "" otherwise."""
    if dtype != "float64" or what not in ("output", "weights", "lse") or not np.isfinite(verdict.error):
        return ""
    naive32 = max(tolerance.max_abs_error(getattr(n, _FIELD.get(what, what)),
                                          getattr(ref.expected, _FIELD.get(what, what)))[0]
                  for n in ref.naive if getattr(n, _FIELD.get(what, what)) is not None)
    if verdict.error <= tolerance.K * max(naive32, verdict.allowed):
        return (f"; the error is of float32's size (naive float32 error {naive32:.3e}): a float64 "
                f"path that rounds through float32 (NUM-2)")
    return ""


_FIELD = {"output": "out"}


def expect_close(impl: Impl, case: Case, got: np.ndarray, want: np.ndarray, *, allowed: float,
                 clause: str, what: str, op: str) -> None:
    """Assert two results of the same backend agree within ``allowed`` (a property's bound)."""
    error, where = tolerance.max_abs_error(got, want)
    if not error <= allowed:
        record_failure(clause, what, error, max(_finite_max_abs(want), 1.0), f"max abs difference "
                       f"{error:.3e} at index {where}, allowed {allowed:.3e}", case.spec)
        saved = save_failure(impl, case, op, clause, {})
        raise AssertionError(
            f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): {what}: max abs "
            f"difference {error:.3e} at index {where}, allowed {allowed:.3e} (twice NUM-3)\n"
            f"reproduce the base case with:\n{reproducer(impl, op, case.spec)}" + saved)



def rejection_problem(impl: Impl, op: str, case: Case, names: str | tuple[str, ...], what: str,
                      **overrides) -> str | None:
    """Make the invalid call ``run(impl, op, case, **overrides)`` (overrides of ``q``, ``k``, ``v``,
    ``query``, ``key`` or ``value`` replace the case's array); None when it raises ValueError
    whose message names one of ``names`` (the argument, as a word), else the problem found:
    accepted, another exception type, or a message that names no argument of ``names``."""
    names = (names,) if isinstance(names, str) else names
    inputs = {n: overrides.pop(n) for n in ("q", "k", "v", "query", "key", "value") if n in overrides}
    try:
        run(impl, op, case._replace(**inputs), **overrides)
    except ValueError as exc:
        if not any(re.search(rf"\b{re.escape(n)}\b", str(exc)) for n in names):
            return f"{what}: message does not name {' or '.join(names)}: {str(exc)!r:.300}"
        return None
    except Exception as exc:  # noqa: BLE001 - any other exception type is the finding
        return f"{what}: raised {type(exc).__name__} instead of ValueError: {exc!s:.300}"
    return f"{what}: accepted (no ValueError)"


def expect_rejections(impl: Impl, op: str, case: Case, clause: str, bad: list[tuple]) -> None:
    """Assert every ``(what, names, overrides)`` of ``bad`` is rejected (:func:`rejection_problem`)."""
    problems = [p for what, names, kw in bad
                if (p := rejection_problem(impl, op, case, names, what, **kw)) is not None]
    assert not problems, f"[{clause}] {impl.id} {op}:\n  " + "\n  ".join(problems)
