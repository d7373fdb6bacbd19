"""Run a case on a backend and judge it against the oracle (used by every conformance test).

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

:class:`Impl` is one parametrization of the suite: a backend on a device in a dtype. Its
``sdpa`` / ``mha`` methods convert a :class:`~mhaspec.conformance.strategies.Case` to the backend's
arrays, call it, check the results live on the requested device, and return NumPy results.
:func:`expect_oracle` compares them with the float64 oracle under NUM-3 and raises an
``AssertionError`` naming the clause, the error and a reproducer a user can paste.
"""

from __future__ import annotations

import contextvars
import pathlib
import re
import functools
from typing import Any, NamedTuple

import numpy as np

from mhaspec.backends import MHAParams
from mhaspec.spec import oracle

from . import tolerance
from .strategies import Case, CaseSpec, build_case

#: The pytest item being run; the plugin sets it so results can be recorded on the item.
current_item: contextvars.ContextVar[Any] = contextvars.ContextVar("mhaspec_current_item", default=None)
#: backend name -> the reference it was loaded from (for reproducers); set by the plugin.
BACKEND_REFS: dict[str, str] = {}
#: where failing cases are saved as .npz (``--mhaspec-failures``); None: not saved.
failures_dir: pathlib.Path | None = None


class Result(NamedTuple):
    """A backend's output and weights as float NumPy arrays (weights None when not returned);
    for the float64 oracle also NUM-3's softmax condition kappa."""

    out: np.ndarray
    weights: np.ndarray | None
    condition: float = 1.0


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
        """The arrays of ``spec`` for ``op``, fitted to what this backend claims and to this dtype."""
        return build_case(fit(spec, frozenset(self.backend.capabilities), self.dtype, op))

    def arr(self, x, dtype: str | None = None):
        """NumPy -> backend array in this dtype (booleans stay boolean); None stays None."""
        if x is None:
            return None
        if dtype is None:
            dtype = "bool" if np.asarray(x).dtype == bool else self.dtype
        return self.backend.asarray(np.asarray(x), dtype=dtype, device=self.device)

    def masks(self, case: Case) -> dict:
        kw = case.mask_kwargs()
        for name in ("mask", "bias", "legacy_mask", "key_padding_mask"):
            kw[name] = self.arr(kw[name])
        return kw

    def _result(self, out, weights) -> Result:
        item = current_item.get()
        if item is not None:
            item.mhaspec_calls = getattr(item, "mhaspec_calls", 0) + 1
        for x in (out, weights):
            if x is not None and self.device != "cpu":
                on = self.backend.device_of(x)
                assert on == self.device, f"result computed on {on!r}, not on {self.device!r}"
        return Result(self.backend.to_numpy(out),
                      None if weights is None else self.backend.to_numpy(weights))

    def sdpa(self, case: Case, **overrides) -> Result:
        """Run scaled_dot_product_attention on ``case`` (keyword overrides replace mask kwargs)."""
        kw = {**self.masks(case), **overrides}
        return self._result(*self.backend.scaled_dot_product_attention(
            self.arr(case.q), self.arr(case.k), self.arr(case.v), **kw))

    def mha(self, case: Case, **overrides) -> Result:
        """Run multi_head_attention on ``case``; inputs that are one NumPy array (self-attention,
        or key and value shared) are passed as one backend array."""
        converted: dict[int, Any] = {}  # inputs that are one array stay one array (MHA-3, MHA-4)

        def once(x):
            if id(x) not in converted:
                converted[id(x)] = self.arr(x)
            return converted[id(x)]

        query, key, value = once(case.query), once(case.key), once(case.value)
        params = MHAParams(*(self.arr(p) for p in case.params))
        kw = {**self.masks(case), **overrides}
        return self._result(*self.backend.multi_head_attention(
            query, key, value, params, num_heads=case.spec.heads, **kw))


def fit(spec: CaseSpec, capabilities: frozenset, dtype: str, op: str = "mha") -> CaseSpec:
    """Drop the optional features of ``spec`` a backend does not claim (they are reported "not
    implemented" by the tests that need them) and the legacy mask in float16 (an error, ERR-9)."""
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
    """The oracle (or the naive algorithm in ``precision``) on ``case``; cached for unmodified cases."""
    if not overrides and case is build_case(case.spec):
        return _cached_oracle(case.spec, op, precision)
    return _run_oracle(case, op, precision, **overrides)


@functools.lru_cache(maxsize=256)
def _cached_oracle(spec: CaseSpec, op: str, precision: str) -> Result:
    return _run_oracle(build_case(spec), op, precision)


def _run_oracle(case: Case, op: str, precision: str, **overrides) -> Result:
    kw = {**case.mask_kwargs(), **overrides}
    info: dict = {}
    if op == "sdpa":
        out, weights = oracle.attention(case.q, case.k, case.v, precision=precision, info=info, **kw)
    else:
        out, weights = oracle.multi_head_attention(case.query, case.key, case.value, case.params,
                                                   num_heads=case.spec.heads, precision=precision,
                                                   info=info, **kw)
    return Result(out, weights, max(1.0, info.get("logit_condition", 0.0)))


def naive_results(case: Case, op: str, dtype: str, **overrides) -> list[Result]:
    """The naive algorithm in each precision NUM-3 uses as the reference for ``dtype``."""
    return [oracle_result(case, op, p, **overrides) for p in tolerance.naive_precisions(dtype)]


def _scale(case: Case, op: str, expected: Result) -> float:
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
    ref = BACKEND_REFS.get(impl.backend.name, impl.backend.name)
    return ("from mhaspec.conformance.strategies import CaseSpec\n"
            "from mhaspec.conformance.replay import replay\n"
            f"replay({ref!r}, {op!r}, {spec!r}, device={impl.device!r}, "
            f"dtype={impl.dtype!r}{extra})")


def save_failure(impl: Impl, case: Case, op: str, clause: str, overrides: dict) -> str:
    """Save the failing case's arrays for ``mhaspec replay`` when a failures directory is set."""
    if failures_dir is None:
        return ""
    from .replay import save_case

    item = current_item.get()
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.name if item is not None else clause)
    path = save_case(failures_dir / f"{stem}.npz", impl, case, op=op, clause=clause,
                     backend_ref=BACKEND_REFS.get(impl.backend.name, impl.backend.name),
                     overrides=overrides)
    ref = BACKEND_REFS.get(impl.backend.name, impl.backend.name)
    return f"\nor: mhaspec replay {path} --backend {ref}"


def allowance(case: Case, op: str, impl: Impl, expected: Result | None = None) -> tuple[float, float]:
    """NUM-3's allowed absolute error for (output, weights) of this case in ``impl.dtype``."""
    expected = expected or oracle_result(case, op)
    naive = naive_results(case, op, impl.dtype)
    length = sum_length(case.spec)
    out = tolerance.judge(expected.out, expected.out, [n.out for n in naive], dtype=impl.dtype,
                          scale=_scale(case, op, expected), sum_length=length,
                          condition=expected.condition)
    w = tolerance.judge(expected.weights, expected.weights, [n.weights for n in naive],
                        dtype=impl.dtype, scale=1.0, sum_length=length, condition=expected.condition)
    return out.allowed, w.allowed


def expect_oracle(impl: Impl, case: Case, got: Result, *, op: str, clause: str,
                  overrides: dict | None = None) -> None:
    """Assert ``got`` agrees with the oracle under NUM-3 (output, and weights when returned).

    Non-finite oracle results (NUM-6) must be non-finite in ``got`` too; weight rows whose oracle
    row is not finite are not compared (NUM-6 leaves them free)."""
    overrides = overrides or {}
    expected = oracle_result(case, op, **overrides)
    naive = naive_results(case, op, impl.dtype, **overrides)
    checks = [("output", got.out, expected.out, [n.out for n in naive], _scale(case, op, expected))]
    if got.weights is not None:
        weights = [got.weights, expected.weights, *(n.weights for n in naive)]
        free = ~np.all(np.isfinite(expected.weights), axis=-1, keepdims=True)
        if free.any() and got.weights.shape == expected.weights.shape:
            weights = [np.where(free, 0.0, w) for w in weights]
        checks.append(("weights", weights[0], weights[1], weights[2:], 1.0))
    for what, actual, exp, nv, scale in checks:
        verdict = tolerance.judge(actual, exp, nv, dtype=impl.dtype, scale=scale,
                                  sum_length=sum_length(case.spec), condition=expected.condition)
        record_ratio(clause, verdict.ratio)
        if not verdict.ok:
            saved = save_failure(impl, case, op, clause, overrides)
            raise AssertionError(
                f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): {op} {what} "
                f"differs from the float64 oracle: {verdict.describe()}\n"
                f"reproduce with:\n{reproducer(impl, op, case.spec, overrides)}" + saved)


def expect_close(impl: Impl, case: Case, got: np.ndarray, want: np.ndarray, *, allowed: float,
                 clause: str, what: str, op: str) -> None:
    """Assert two results of the same backend agree within ``allowed`` (a property's bound)."""
    error, where = tolerance.max_abs_error(got, want)
    if not error <= allowed:
        raise AssertionError(
            f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): {what}: max abs "
            f"difference {error:.3e} at index {where}, allowed {allowed:.3e} (twice NUM-3)\n"
            f"reproduce the base case with:\n{reproducer(impl, op, case.spec)}")

