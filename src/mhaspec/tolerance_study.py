"""Plot measured errors against the NUM-3 reference, per dtype (``docs/generated/tolerance.png``).

    mhaspec tolerance-study [--cases N] [--backend NAME ...] [--device D] [--out PNG]

For random cases (masks, causal, bias, logit spreads 0.1-100) every backend's scaled dot-product
attention output is compared with the float64 oracle; each point is one case: x = the naive
algorithm's error (e_ref of NUM-3), y = the backend's error. The line y = K x is the rule's bound
(the floor is not drawn); points above it fail unless the floor covers them.
"""

from __future__ import annotations


import numpy as np
from hypothesis import HealthCheck, given, settings

from mhaspec import usage
from mhaspec.backends import load_backend, registered_backends

from mhaspec.conformance import harness, tolerance
from mhaspec.conformance.strategies import case_specs


def measure(backends: list[str], cases: int, device: str = "cpu") -> dict:
    specs = []

    @settings(max_examples=cases, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(spec=case_specs(masks=True, bias=True, causal=True, key_padding=True))
    def collect(spec):
        specs.append(spec)

    collect()
    points: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for name in backends:
        backend = load_backend(name)
        unavailable = backend.devices().get(device, f"no device {device!r}")
        if unavailable is not None:
            raise SystemExit(f"{name}: {device} unavailable: {unavailable}")
        for dtype in backend.dtypes(device):
            impl = harness.Cell(backend, device, dtype)
            for spec in specs:
                case = impl.case(spec, "sdpa")
                got = harness.run(impl, "sdpa", case)
                (_, v), *_ = harness.check(impl, case, got, op="sdpa", clause="NUM-3")
                points.setdefault((name, dtype), []).append((v.ref_error, v.error))
    return points


def plot(points: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = ["float64", "float32", "float16", "bfloat16"]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4), constrained_layout=True)
    for ax, dtype in zip(axes, dtypes):
        lo, hi, exact = np.inf, 0.0, 0
        for (name, dt), pts in sorted(points.items()):
            if dt != dtype:
                continue
            x, y = (np.array(a) for a in zip(*pts))
            keep = (x > 0) & (y > 0)  # exact results (e = 0) cannot be drawn on log axes
            exact += int((~keep).sum())
            ax.scatter(x[keep], y[keep], s=8, label=name, alpha=0.7)
            if keep.any():
                lo, hi = min(lo, x[keep].min()), max(hi, x[keep].max())
        if hi > 0:
            grid = np.geomspace(max(lo, 1e-20), hi, 50)
            ax.plot(grid, tolerance.K * grid, "k--", lw=1, label=f"K x e_ref (K={tolerance.K:g})")
            ax.plot(grid, grid, "k:", lw=1, label="e = e_ref")
        if hi == 0:  # no backend measured in this dtype (or every result exact)
            ax.set(title=f"{dtype}: nothing to draw ({exact} exact results)")
            continue
        ax.set(xscale="log", yscale="log", title=f"{dtype} ({exact} exact results not drawn)",
               xlabel="naive error e_ref",
               ylabel="backend error e")
        ax.legend(fontsize=7)
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = usage.ArgumentParser(prog="mhaspec tolerance-study", description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=usage.at_least(1), default=40,
                    help="random cases per backend and dtype (default 40)")
    ap.add_argument("--backend", action="append", default=None,
                    help="backend to measure (repeatable; default: every registered *-batched backend)")
    ap.add_argument("--device", default="cpu", help="device to run the backends on (cpu, cuda)")
    ap.add_argument("--out", default="docs/generated/tolerance.png",
                    help="image of the ratios to write (default docs/generated/tolerance.png)")
    args = ap.parse_args(argv)
    default = [n for n in sorted(registered_backends()) if n.endswith("-batched")]
    for ref in args.backend or ():
        usage.checked_backend(ref)  # a backend that cannot load is one line before anything runs
    points = measure(args.backend or default, args.cases, args.device)
    plot(points, args.out)
    for (name, dtype), pts in sorted(points.items()):
        ratios = [e / r if r > 0 else 0.0 for r, e in pts]
        print(f"{name:14} {dtype:9} cases {len(pts):4}  max e/e_ref {max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
