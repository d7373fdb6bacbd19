"""Run ``attention_vjp`` (spec 1.3) on a case and judge its gradients under GRAD-1's rule.

Axis legend: B batch, h query heads, g key/value heads, L_q queries, L_k new keys, L_past cached
keys, L_K = L_past + L_k, d_v value width.

The cotangents are fixed random data from the case's seed: d_output (B, h, L_q, d_v) and, for
GRAD-8, d_lse (B, h, L_q). The oracle is ``spec/oracle_vjp.py`` in float64; the reference error is
that of the same analytic steps in the candidate's dtype (float32's, scaled, for float64; in
float16 and bfloat16 GRAD-10's reference evaluation, rounded where kernels round); one
scale for every gradient of a call: the largest oracle gradient times the condition factor
max(1, max |S|) over the allowed logits and the sinks (GRAD-1). :func:`judge_gradients` is the
loop both gradient chapters use (``test_grad`` for ``mha_vjp``).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from mhaspec.spec import oracle, oracle_vjp

from . import governed, harness, tolerance
from .expect import save_failure

#: oracle_vjp.AttentionVJP field -> the key of a backend's result
NAMES = {"dq": "q", "dk": "k", "dv": "v", "d_sinks": "sinks", "d_bias": "bias",
         "d_past_key": "past_key", "d_past_value": "past_value"}


def cotangents(case, d_lse: bool = False,
               left_out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """d_output (B, h, L_q, d_v) and d_lse (B, h, L_q) or None: standard normal from the seed,
    0 on the query rows ``left_out`` (B, h, L_q) (:func:`rows_left_to_mask9`; None: none)."""
    rng = np.random.default_rng([case.spec.seed, 13])
    b, h, len_q, _ = case.q.shape
    d_out = rng.standard_normal((b, h, len_q, case.v.shape[3]))
    dl = rng.standard_normal((b, h, len_q)) if d_lse else None
    if left_out is not None:
        d_out[left_out] = 0.0
        if dl is not None:
            dl[left_out] = 0.0
    return d_out, dl


def rows_left_to_mask9(impl, problem: oracle.AttentionProblem) -> np.ndarray | None:
    """The query rows without an allowed key (B, h, L_q) of the case's checked ``problem`` that
    the cell leaves to MASK-9's verdict (:func:`harness.rows_left_to_mask9`: it declares a
    deviation there), else None. Their cotangents are 0: what the op computes on them (the mean of
    V, say) is the declared deviation, and the other rows' gradients are judged without their
    contribution; a NaN there still reaches every gradient through the shared keys."""
    return harness.rows_left_to_mask9(impl, "sdpa",
                                      harness.Result(None, problem.allowed.astype(float)))


def gradients_left_to_grad7(impl, problem: oracle.AttentionProblem,
                            clause: str) -> dict[str, np.ndarray]:
    """Where the gradients of the case's rows without an allowed key reach, when the cell declares
    GRAD-7 (:data:`.governed.EMPTY_ROW_GRADIENTS`) and ``clause``, the one judged, is another (so
    a replay of a GRAD-7 case judges every entry): gradient
    name -> a boolean mask broadcasting to it, their rows of dq (B, h, L_q, 1) and the dk, dv and
    past cache gradients of their batch item and key/value head (B, g, 1, 1). A backward pass
    that puts NaN there is GRAD-7's deviation, not every gradient clause's. {} otherwise."""
    empty = harness.rows_left_to_mask9(impl, "sdpa",
                                       harness.Result(None, problem.allowed.astype(float)),
                                       clause, subject=governed.EMPTY_ROW_GRADIENTS)
    if empty is None:
        return {}
    b, h, _ = empty.shape
    shared = empty.any(axis=2).reshape(b, problem.k.shape[1], -1).any(axis=2)[:, :, None, None]
    return {"q": empty[..., None], "k": shared, "v": shared, "past_key": shared,
            "past_value": shared}


def unjudged_by_grad7(impl, problem: oracle.AttentionProblem, clause: str,
                      *grads: Mapping) -> list[dict]:
    """Each of ``grads`` (name -> gradient: the backend's, the oracle's, ...) with the entries
    :func:`gradients_left_to_grad7` gives set to 0, so that a comparison leaves them out
    (:func:`harness.unjudged`: a gradient of another shape is left for the shape check)."""
    spared = gradients_left_to_grad7(impl, problem, clause)
    out = [dict(part) for part in grads]
    for name, where in spared.items():
        present = [part for part in out if name in part]  # a cache's gradients only with one
        if present:
            for part, g in zip(present, harness.unjudged([part[name] for part in present], where)):
                part[name] = g
    return out


def sinks_of(case, scale: float) -> np.ndarray:
    """A sink logit per query head (h,): standard normal from the seed times ``scale``, plus
    ``scale`` (so a large scale gives sinks that dominate every row)."""
    h = case.q.shape[1]
    return np.random.default_rng([case.spec.seed, 17]).standard_normal(h) * scale + scale


def kwargs_of(case) -> dict:
    """The case's keyword arguments of scaled dot-product attention, without ``lse`` (the
    gradient takes ``d_lse`` instead)."""
    kw = case.call_kwargs()
    kw.pop("lse", None)
    return kw


def run(impl, case, *, d_lse: bool = False, bias_grad: bool = False,
        sinks: np.ndarray | None = None, left_out=None) -> dict[str, np.ndarray]:
    """The backend's ``attention_vjp`` on ``case`` with its cotangents (0 on ``left_out``), as
    NumPy (the case is noted on the running test as :func:`harness.run` notes it: what ran, per
    clause; a sub-case the backend's ``sub_cases`` rules out is not implemented, as there)."""
    harness.note("sdpa", case.spec)
    harness.remember_call(impl, "attention_vjp", case, replay_overrides(d_lse, bias_grad, sinks))
    d_out, dl = cotangents(case, d_lse, left_out)
    kw = {n: impl.arr(x) if isinstance(x, np.ndarray) else x for n, x in kwargs_of(case).items()}
    if sinks is not None:
        kw["sinks"] = impl.arr(sinks)
    if bias_grad:
        kw["bias_grad"] = True
    grads = impl.call("attention_vjp", impl.arr(case.q), impl.arr(case.k), impl.arr(case.v),
                      impl.arr(d_out), d_lse=impl.arr(dl), spec=case.spec, **kw)
    return {n: impl.backend.to_numpy(g) for n, g in grads.items()}


def replay_overrides(d_lse: bool = False, bias_grad: bool = False, sinks=None) -> dict:
    """The overrides that replay an ``attention_vjp`` call (``replay(..., "attention_vjp", ...)``,
    a saved failure): the options that differ from their defaults."""
    out = {"d_lse": d_lse, "bias_grad": bias_grad, "sinks": sinks}
    return {n: x for n, x in out.items() if x is not None and x is not False}


def oracle_grads(case, precision: str, *, d_lse: bool = False, bias_grad: bool = False,
                 sinks=None, left_out=None, info: dict | None = None) -> dict[str, np.ndarray]:
    """The oracle's gradients (those the call has) by the backend's key names; ``info`` as
    :func:`oracle_vjp.attention_vjp` fills it."""
    d_out, dl = cotangents(case, d_lse, left_out)
    res = oracle_vjp.attention_vjp(case.q, case.k, case.v, d_out, d_lse=dl, sinks=sinks,
                                   bias_grad=bias_grad, precision=precision, info=info,
                                   **kwargs_of(case))
    return {NAMES[f]: g for f, g in res._asdict().items() if g is not None}


def condition(p: oracle.AttentionProblem, sinks=None) -> float:
    """GRAD-1's condition factor of a case's checked problem ``p``: max(1, max |S|) over the
    allowed final logits of every head (and the sinks, which are logits too)."""
    group = p.q.shape[1] // p.k.shape[1]
    x = np.einsum("bhqd,bhkd->bhqk", p.q, np.repeat(p.k, group, axis=1)) * p.scale
    logits = x if p.softcap is None else p.softcap * np.tanh(x / p.softcap)
    for term in p.additive:
        logits = logits + term
    finite = p.allowed & np.isfinite(logits)
    largest = float(np.max(np.abs(logits[finite]), initial=0.0))
    if sinks is not None:
        largest = max(largest, float(np.max(np.abs(sinks))))
    return max(1.0, largest)


def judge_gradients(impl, clause: str, got: Mapping[str, np.ndarray],
                    want: Mapping[str, np.ndarray], naive: Mapping[str, np.ndarray], scale: float,
                    reproduce: str) -> None:
    """Every gradient of ``want`` agrees with ``got``'s under the NUM-3 rule with ``scale``
    (GRAD-1's form); the key sets must be equal. Records the worst ratio for ``clause``."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    assert set(got) == set(want), (f"[{clause}] {impl.id}: gradients for {sorted(got)}, the spec "
                                   f"asks for {sorted(want)}")
    checks = harness.judge_parts([(name, got[name], want[name], naive[name], scale)
                                  for name in want], dtype=impl.dtype, clause=clause)
    for name, verdict in checks:
        if not verdict.ok:
            raise AssertionError(
                f"[{clause}] {impl.backend.name} ({impl.device}, {impl.dtype}): gradient of "
                f"'{name}' differs from the analytic float64 gradient: {verdict.describe()}\n"
                f"reproduce the case with:\n{reproduce}")


def expect_gradients(impl, case, clause: str, *, d_lse: bool = False, bias_grad: bool = False,
                     sinks=None) -> dict[str, np.ndarray]:
    """Run ``attention_vjp`` on ``case`` and judge every gradient against the oracle (GRAD-1's
    rule, with GRAD-5's path through a soft-cap's derivative), the rows :func:`rows_left_to_mask9`
    gives without a cotangent and the entries :func:`gradients_left_to_grad7` gives unjudged;
    returns the backend's gradients."""
    __tracebackhide__ = True  # a failure's traceback starts at the check
    problem = oracle.attention_problem(case.q, case.k, case.v, **kwargs_of(case))
    opts = dict(d_lse=d_lse, bias_grad=bias_grad, sinks=sinks,
                left_out=rows_left_to_mask9(impl, problem))
    got = run(impl, case, **opts)
    want, naive, scale = references(impl, case, problem, **opts)
    replayed = replay_overrides(d_lse, bias_grad, sinks)
    try:
        judge_gradients(impl, clause, *unjudged_by_grad7(impl, problem, clause, got, want, naive),
                        scale,
                        harness.reproducer(impl, "attention_vjp", case.spec, replayed))
    except AssertionError as exc:  # the failing case saved for ``mhaspec replay`` (a run's failures)
        raise AssertionError(f"{exc}{save_failure(impl, case, 'attention_vjp', clause, replayed)}"
                             ) from None
    return got


def references(impl, case, problem: oracle.AttentionProblem, **opts):
    """What a call's gradients are judged against: the oracle's (float64), the reference
    evaluation's in the cell's dtype and GRAD-1's scale (the largest oracle gradient times the
    condition factor, at least GRAD-5's path through a soft-cap's derivative); ``opts`` as
    :func:`oracle_grads` takes them."""
    info: dict = {}
    want = oracle_grads(case, "float64", info=info, **opts)
    naive = oracle_grads(case, tolerance.naive_precision(impl.dtype), **opts)
    largest = max(float(np.max(np.abs(g), initial=0.0)) for g in want.values())
    scale = max(largest * condition(problem, opts.get("sinks")), info.get("cap_path", 0.0))
    return want, naive, scale


def refused_d_lse(impl, error: Exception) -> bool:
    """GRAD-11: is ``error``, raised by a call with a non-zero ``d_lse``, a refusal of the
    cotangent (``NotImplementedError``, or ``ValueError`` naming ``d_lse``)? Any other error
    fails the clause, with its message."""
    if isinstance(error, NotImplementedError) or (isinstance(error, ValueError)
                                                  and "d_lse" in str(error)):
        return True
    raise AssertionError(f"[GRAD-11] {impl.id}: a non-zero d_lse raised {type(error).__name__}: "
                         f"{error}; a refusal is NotImplementedError or a ValueError naming "
                         f"d_lse") from error


def expect_d_lse_honoured_or_refused(impl, case) -> str:
    """GRAD-11 on ``case``: the call with a non-zero ``d_lse`` either raises a refusal
    (:func:`refused_d_lse`) or its gradients agree with the oracle's with ``d_lse`` (GRAD-1's
    rule, as :func:`expect_gradients`); gradients that agree with the oracle's *without* it fail
    with a message saying the cotangent was dropped. Returns "refused" or "honoured"."""
    problem = oracle.attention_problem(case.q, case.k, case.v, **kwargs_of(case))
    left_out = rows_left_to_mask9(impl, problem)
    try:
        got = run(impl, case, d_lse=True, left_out=left_out)
    except (NotImplementedError, ValueError) as error:
        if refused_d_lse(impl, error):
            return "refused"
    want, naive, scale = references(impl, case, problem, d_lse=True, left_out=left_out)
    reproduce = harness.reproducer(impl, "sdpa", case.spec)
    got, want, naive = unjudged_by_grad7(impl, problem, "GRAD-11", got, want, naive)
    try:
        judge_gradients(impl, "GRAD-11", got, want, naive, scale, reproduce)
    except AssertionError as wrong:
        (without,) = unjudged_by_grad7(impl, problem, "GRAD-11",
                                       oracle_grads(case, "float64", left_out=left_out))
        dropped = all(tolerance.judge(got[n], without[n], naive[n], dtype=impl.dtype,
                                      scale=scale).ok for n in without)
        if dropped:
            raise AssertionError(
                f"[GRAD-11] {impl.backend.name} ({impl.device}, {impl.dtype}): the cotangent d_lse "
                f"is silently dropped: the gradients are those of the call without it. Honour it "
                f"(GRAD-8) or raise NotImplementedError for a non-zero d_lse.\n{wrong}") from None
        raise
    return "honoured"


def dead_rows(case) -> dict[str, np.ndarray]:
    """Where GRAD-7 asks for exact zeros, as boolean masks over the rows of each gradient: "q"
    (B, h, L_q) queries with an empty allowed set; "k" and "v" (B, g, L_k) new keys no query of
    the heads sharing them may attend; "past_key" / "past_value" (B, g, L_past) past slots not
    attended (or not valid) with a cache."""
    p = oracle.attention_problem(case.q, case.k, case.v, **kwargs_of(case))
    b, h, _, len_all = p.allowed.shape
    g = p.k.shape[1]
    attended = p.allowed.reshape(b, g, h // g, -1, len_all).any(axis=(2, 3))  # (B, g, L_K)
    out = {"q": ~p.allowed.any(axis=-1)}
    len_k = case.k.shape[2]
    if p.past_lengths is None:
        out["k"] = out["v"] = ~attended
        return out
    len_past = len_all - len_k
    new, past = np.ones((b, g, len_k), bool), np.ones((b, g, len_past), bool)
    for bi, n in enumerate(p.past_lengths):
        past[bi, :, :n] = ~attended[bi, :, :n]
        new[bi] = ~attended[bi, :, n:n + len_k]
    out.update(k=new, v=new, past_key=past, past_value=past)
    return out
