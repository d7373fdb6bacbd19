"""Name a failing backend's likely bug from a few cheap differential checks.

A failing clause says *what* is wrong; the signature (:mod:`.signatures`: one known mistake, a
small fixed case and the output that mistake gives there) says *why*. :func:`diagnose` calls the
backend on each case that its claims allow, and names the first mistake whose results the backend
matches, and not the oracle's, within :func:`agrees`. A few dozen calls on tiny arrays: run only
when a backend failed.

Axis legend: B batch, h heads, g key/value heads, L_q / L_k query / key lengths, d_k / d_v
per-head widths, d_model / d_out model widths; SDPA arrays (B, h, L, d), MHA arrays (B, L, d_model).
"""

from __future__ import annotations

import re

import numpy as np

from . import harness, vjp
from .serving_signatures import SERVING_SIGNATURES, ServingSignature
from .signatures import EMPTY_ROWS, MHA, NO_KEYS, SDPA, SIGNATURES, Signature, allowed, sinks


#: the gradients a signature that needs "attention_vjp" compares, in its ``expect``'s order
GRADIENTS = ("q", "k", "v")


def agrees(got, expected, dtype: str) -> bool:
    """Whether ``got`` equals ``expected`` up to rounding in ``dtype``: NaN where it is NaN, and
    elsewhere within 1e-9 (float64) or 1e-4 (otherwise) of the largest finite magnitude."""
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    if got.shape != expected.shape or not np.array_equal(np.isnan(got), np.isnan(expected)):
        return False
    finite = ~np.isnan(expected)
    if not finite.any():
        return True
    scale = max(1.0, float(np.max(np.abs(expected[finite]))))
    tol = (1e-9 if dtype == "float64" else 1e-4) * scale
    return bool(np.all(np.abs(got[finite] - expected[finite]) <= tol))


def _matches(impl: harness.Cell, signature: Signature) -> bool | None:
    """Whether ``impl`` shows ``signature`` (None: the case cannot be run here)."""
    if harness.fit(signature.spec, harness.op_capabilities(impl.backend, signature.op),
                   impl.dtype, signature.op) != signature.spec:
        return None  # the backend does not claim what the case needs
    case = impl.case(signature.spec, signature.op)
    try:
        got, ref = _outcomes(impl, signature, case)
    except Exception:  # noqa: BLE001 - a call that raises shows nothing here
        return None
    return _shows(got, signature.expect(case), ref, impl.dtype)


def _shows(got: tuple, mistake: tuple, ref: tuple, dtype: str) -> bool | None:
    """Whether results ``got`` agree with the ``mistake``'s and not with the spec's ``ref``, part
    by part (a part the mistake leaves None is not compared; None: nothing to compare)."""
    parts = [(g, w, r) for g, w, r in zip(got, mistake, ref) if w is not None]
    if not parts or any(g is None for g, _, _ in parts):
        return None
    return (all(agrees(g, w, dtype) for g, w, _ in parts)
            and not all(agrees(g, r, dtype) for g, _, r in parts))


def _serving_matches(impl: harness.Cell, signature: ServingSignature) -> bool | None:
    """Whether ``impl`` shows a serving-step ``signature`` (None: the call cannot be made here)."""
    try:
        found = signature.run(impl)
    except Exception:  # noqa: BLE001 - a call that raises shows nothing here
        return None
    return None if found is None else _shows(*found, impl.dtype)


def _outcomes(impl: harness.Cell, signature: Signature, case) -> tuple[tuple, tuple]:
    """The backend's results on the signature's case and the oracle's, in ``expect``'s order:
    (output, weights, lse), or the gradients :data:`GRADIENTS` when it needs "attention_vjp"
    (with an lse cotangent when the case asks for the lse); with :func:`sinks` when it needs
    "sink"."""
    extra = {"sinks": sinks(case)} if "sink" in signature.needs else {}
    if "attention_vjp" in signature.needs:
        opts = dict(d_lse=case.spec.lse, **extra)
        got, ref = vjp.run(impl, case, **opts), vjp.oracle_grads(case, "float64", **opts)
        return tuple(got.get(n) for n in GRADIENTS), tuple(ref[n] for n in GRADIENTS)
    got = harness.run(impl, signature.op, case, **extra)
    ref = harness.oracle_result(case, signature.op, **extra)
    return (got.out, got.weights, got.lse), (ref.out, ref.weights, ref.lse)


def probe_cell(backend) -> harness.Cell | None:
    """The cell the probes run in: the first available device, float64 where claimed, else
    float32 (None when neither is offered)."""
    for device, why in backend.devices().items():
        if why is None:
            for dtype in ("float64", "float32"):
                if dtype in backend.dtypes(device):
                    return harness.Cell(backend, device, dtype)
    return None


def diagnose(backend) -> str | None:
    """One line naming ``backend``'s likely mistake, or None when no signature matches.

    Checked in this order: float64 offered (NUM-1, unless declared); a call on the plainest valid
    case that raises; then :data:`SIGNATURES` in order, on the cases the backend's claims allow,
    and the serving step's (:data:`SERVING_SIGNATURES`: merge_states, paged_attention, write_pages);
    no keys (SHAPE-4); a mask against its -inf bias (:func:`mask_vs_bias`); the precision. A
    clause whose deviation the cell declares is never named."""
    impl = probe_cell(backend)
    if impl is None:
        return "offers neither float64 nor float32 on any available device (NUM-1)"
    if impl.dtype != "float64" and "NUM-1" not in backend.deviations:
        return "does not offer float64, which every backend must (NUM-1)"
    for op, spec in (("sdpa", SDPA), ("mha", MHA)):
        if op in backend.capabilities:
            try:
                harness.run(impl, op, impl.case(spec, op))
            except Exception as exc:  # noqa: BLE001 - the diagnosis is the exception
                return (f"raises {type(exc).__name__} on a valid {op} case (L_q {spec.len_q}, "
                        f"L_k {spec.len_k}, d_k {spec.d_k}, d_v {spec.d_v}): "
                        f"{' '.join(str(exc).split())[:160]}")
    op = "sdpa" if "sdpa" in backend.capabilities else "mha"
    for signature in SIGNATURES.values():
        claims = harness.op_capabilities(backend, signature.op)
        declared = set(clauses_of(signature)) <= declared_in(impl, signature.op)
        if (signature.op in backend.capabilities and signature.needs - {signature.op} <= claims
                and not declared and _matches(impl, signature)):
            return signature.says
    for step in SERVING_SIGNATURES.values():
        if (step.needs <= set(backend.capabilities)
                and not set(clauses_of(step)) <= declared_in(impl, None)
                and _serving_matches(impl, step)):
            return step.says
    if op == "sdpa" and "SHAPE-4" not in declared_in(impl, "sdpa"):
        try:
            harness.run(impl, "sdpa", impl.case(NO_KEYS, "sdpa"))
        except Exception as exc:  # noqa: BLE001 - the diagnosis is the exception
            return (f"raises {type(exc).__name__} when there are no keys (L_k = 0), where the "
                    f"spec gives zeros (SHAPE-4)")
    if op == "sdpa" and "MASK-11" not in declared_in(impl, "sdpa"):
        found = mask_vs_bias(impl)
        if found:
            return found
    return precision(impl, op)


def declared_in(impl: harness.Cell, op: str | None) -> set[str]:
    """The clauses whose deviation ``impl``'s cell declares for ``op`` (None: for every operation):
    none of them is named."""
    return set(harness.op_deviations(
        harness.cell_deviations(impl.backend, impl.device, impl.dtype), op))


def mask_vs_bias(impl: harness.Cell) -> str | None:
    """MASK-11 as two calls of the backend: ``mask=M`` and ``bias=where(M, 0, -inf)`` on a case
    with fully masked rows must agree. One line saying what each form gives on those rows (None
    when they agree, or the backend does not claim both for SDPA)."""
    if {"masks", "bias"} - harness.op_capabilities(impl.backend, "sdpa"):
        return None
    case = impl.case(EMPTY_ROWS, "sdpa")
    try:
        as_mask = harness.run(impl, "sdpa", case).out
        as_bias = harness.run(impl, "sdpa", case, mask=None,
                              bias=np.where(case.mask, 0.0, -np.inf)).out
    except Exception:  # noqa: BLE001 - a call that raises shows nothing here
        return None
    if agrees(as_mask, as_bias, impl.dtype):
        return None
    empty = ~allowed(case).any(-1)
    mean = np.broadcast_to(case.v.mean(axis=2, keepdims=True), as_mask.shape)[empty]

    def rows(out) -> str:
        got = out[empty]
        for name, want in (("0", np.zeros_like(got)), ("NaN", np.full_like(got, np.nan)),
                           ("the mean of V", mean)):
            if agrees(got, want, impl.dtype):
                return name
        return "other values"

    said_mask, said_bias = rows(as_mask), rows(as_bias)
    if said_mask == said_bias:
        return "a boolean mask and its -inf bias give different outputs (MASK-11)"
    return (f"a fully masked row gives {said_mask} under a boolean mask but {said_bias} under "
            f"the same mask as a -inf bias: the two forms must agree (MASK-11)")


def clauses_of(signature: Signature | ServingSignature) -> list[str]:
    """The clause ids a signature's line ends with: ``"... (MASK-1, SDPA-4)"``."""
    return re.findall(r"[A-Z]+-\d+", signature.says.rsplit("(", 1)[-1])


#: unit roundoff of the precisions a float64 path may silently lose accuracy to
ROUNDOFF = {"float32": 2.0 ** -24, "float16 or TF32 (10-bit mantissa)": 2.0 ** -11,
            "bfloat16 (7-bit mantissa)": 2.0 ** -8}


def precision(impl: harness.Cell, op: str) -> str | None:
    """In a float64 cell: the lower precision whose unit roundoff is within a factor 8 of the
    relative error on the plain case (None when none is, or the error is float64's own)."""
    if impl.dtype != "float64":
        return None
    case = impl.case(SDPA if op == "sdpa" else MHA, op)
    got, ref = harness.run(impl, op, case).out, harness.oracle_result(case, op).out
    if got is None or not np.all(np.isfinite(got)):
        return None
    relative = float(np.max(np.abs(got - ref)) / max(1.0, float(np.max(np.abs(ref)))))
    if relative == 0.0:
        return None
    name, u = min(ROUNDOFF.items(), key=lambda nu: abs(np.log2(relative / nu[1])))
    if abs(np.log2(relative / u)) <= 3:
        return (f"float64 results with errors of {name} size ({relative:.1e} relative): a lower "
                f"precision inside the float64 path (NUM-2)")
    return None
