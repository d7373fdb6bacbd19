"""Running a cell: one backend on one device in one dtype (:class:`Cell`), and one operation on a case.

Axis legend: B batch, L_q / L_k lengths, h heads, d_k / d_v per-head widths.

:class:`Cell` is one parametrization of the suite: a backend on a device in a dtype.
:func:`run` runs an operation on a :class:`~mhaspec.conformance.strategies.Case` and returns NumPy
results (:class:`Result`); :meth:`Cell.call` is the one place a backend method is called (the
per-call time limit, the call count, the device check). :func:`fit` drops what a backend does not
claim from a case.

Per-call time limit: a backend call that runs longer than the run's limit (the plugin's
``--mhaspec-call-timeout``) raises :class:`~mhaspec.backends.call_limit.CallTimeout`, naming the
limit (:mod:`mhaspec.backends.call_limit`); the claim readers are
:mod:`mhaspec.backends.claim_readers`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mhaspec.backends import AttentionOutputs, MHAParams
from mhaspec.backends.call_limit import call_with_limit
from mhaspec.backends.claim_readers import OPS, cell_deviations, op_capabilities, op_deviations

from . import features, governed, observation
from .item_state import run_settings, running, running_clauses, running_requirements
from .strategies import Case, CaseSpec, build_case

#: the test argument the plugin gives a :class:`Cell` as; tests written with ``impl``, its former
#: name, are given the same object under that name (deprecated: write ``cell``)
ARGUMENT, FORMER_ARGUMENT = "cell", "impl"


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


class Cell(NamedTuple):
    """One parametrization: ``backend`` on ``device`` computing in ``dtype``."""

    backend: Any
    device: str
    dtype: str

    def __repr__(self) -> str:
        return f"Cell({self.backend.name!r}, {self.device!r}, {self.dtype!r})"

    @property
    def id(self) -> str:
        return f"{self.backend.name}-{self.device}-{self.dtype}"

    def case(self, spec: CaseSpec, op: str = "mha") -> Case:
        """The arrays of ``spec`` for ``op``, fitted to what this backend claims and to this dtype,
        without the features whose clause the cell declares a deviation of, in the cases of the
        other clauses (:mod:`.governed`: e.g. no soft-cap where SOFTCAP-1 is declared, no projection
        biases where PARAM-1 is; its own test reports the deviation, as emptied rows are MASK-9's,
        :func:`.judge.rows_left_to_mask9`)."""
        declared = op_deviations(cell_deviations(self.backend, self.device, self.dtype), op)
        spec, held = governed.withhold(spec, declared, running_clauses(), running_requirements())
        return build_case(fit(spec, op_capabilities(self.backend, op) - held, self.dtype, op))

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

    def call(self, method: str, *args, spec: CaseSpec | None = None, **kwargs):
        """``backend.<method>(*args, **kwargs)`` under the run's per-call time limit, counted on
        the running test. Every backend operation of the suite is called through here. With
        ``spec``, the case a call of an operation runs (:data:`OPERATION_OF` its method): unless
        the backend's ``sub_cases`` rule out a sub-case it uses, when in a test it is not
        implemented and the backend is not called (:func:`.observation.refuse_unsupported`; a
        ``d_lse`` cotangent uses the lse's sub-cases). :func:`run`, the backward passes and the
        direct calls of INPUT-1, DET-1 and MASK-3 all pass it."""
        state = running()
        if spec is not None:
            uses = {**kwargs, "lse": bool(kwargs.get("lse")) or kwargs.get("d_lse") is not None}
            observation.refuse_unsupported(state, self.backend, OPERATION_OF[method], uses, spec)
        if state is not None:
            state.calls += 1
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


#: the operation ("sdpa", "mha") whose sub-case rules a call of a backend method follows
OPERATION_OF = {"scaled_dot_product_attention": "sdpa", "attention_vjp": "sdpa",
                "multi_head_attention": "mha", "mha_vjp": "mha"}


def of_item(item) -> Cell | None:
    """The :class:`Cell` a conformance test item runs in; None for other items."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    found = params.get(ARGUMENT, params.get(FORMER_ARGUMENT))
    return found if isinstance(found, Cell) else None


def remember_call(impl: Cell, op: str, case: Case, overrides: dict) -> None:
    """Keep ``op`` (an operation of :mod:`.failure_file`) on ``case`` with ``overrides`` as the
    running test's last call: the case a failure of the test saves (the plugin, on failure)."""
    state = running()
    if state is not None:
        state.last_call = (impl, op, case, overrides)


def run(impl: Cell, op: str, case: Case, **overrides) -> Result:
    """Run ``op`` ("sdpa": scaled_dot_product_attention on q, k, v; "mha": multi_head_attention on
    query, key, value and the parameters) of ``impl`` on ``case``; NumPy results.

    Stable interface: ``overrides`` replace the case's keyword arguments (mask, bias, legacy_mask,
    key_padding_mask, causal, scale, ... as NumPy or scalars; arrays are converted), and for
    "mha" may add ``num_kv_heads`` or replace ``params`` (an ``oracle.Params``). Raises ValueError
    for an unknown ``op``; the backend's own exceptions pass through; :class:`CallTimeout` past
    the run's per-call time limit."""
    state = running()
    remember_call(impl, op, case, overrides)
    if state is not None:
        observation.note(state, op, case.spec)
    kw = {**impl.call_kwargs(case), **{k: impl.arr(v) if isinstance(v, np.ndarray) else v
                                       for k, v in overrides.items() if k != "params"}}
    if op == "sdpa":
        out = impl.call("scaled_dot_product_attention", impl.arr(case.q), impl.arr(case.k),
                        impl.arr(case.v), spec=case.spec, **kw)
    elif op == "mha":
        params = impl.params(overrides.get("params", case.params))
        out = impl.call("multi_head_attention", *impl.mha_inputs(case), params,
                        num_heads=case.spec.heads, spec=case.spec, **kw)
    else:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if isinstance(out, AttentionOutputs):
        return impl.result(out)
    return impl.result(*out)


def note(op: str, spec: CaseSpec, **recorded: str) -> None:
    """Keep, in the running test's record, that it ran ``op`` on the case ``spec`` by a direct call
    (not through :func:`run`: split_heads, an invalid call, ...); ``recorded``: the condition
    values the case does not show (:data:`.conditions.RECORDED`, e.g. the invalid ``argument``)."""
    state = running()
    if state is not None:
        observation.note(state, op, spec, **recorded)


def fit(spec: CaseSpec, capabilities: frozenset, dtype: str, op: str = "mha") -> CaseSpec:
    """Drop the optional features of ``spec`` a backend does not claim (they are reported "not
    implemented" by the tests that need them) and the legacy mask in float16 (an error, ERR-9).
    A causal mask dropped from a case with a window or ALiBi leaves its diagonal as
    ``alignment``."""
    if (spec.causal is not None and "causal" not in capabilities and spec.alignment is None
            and features.needs_diagonal(spec)):
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
