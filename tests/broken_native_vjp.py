"""torch SDPA adapters whose backward pass is not the kernel's, loaded by the suite with
``--backend broken_native_vjp:<NAME>``: each forward pass is torch's own and exact, so only the
spec 1.3 gradient clauses can reject them.

Axis legend: B batch, h query heads, g key/value heads, L_q / L_k lengths, d_k / d_v widths.

* ``VALUES_DETACHED``: ``v`` detached before the kernel, so autograd gives dv = 0 (GRAD-3);
* ``FIRST_HEAD_OF_GROUP``: grouped k and v repeated to h heads by hand, every query head but the
  first of each group reading a detached copy, so dk and dv are the first head's gradient, not
  the sum over the group (GRAD-4; g = h is exact).

:data:`EXPECTED`: attribute -> (backend name, the clause that must fail, clauses that must pass).
"""

from __future__ import annotations

from mhaspec.backends.torch_kernels import MATH, TorchSDPAKernel


class ValuesDetached(TorchSDPAKernel):
    def attention(self, q, k, v, masks):
        return super().attention(q, k, v.detach(), masks)


class FirstHeadOfGroup(TorchSDPAKernel):
    def attention(self, q, k, v, masks):
        import torch

        group = q.shape[1] // k.shape[1]

        def repeat(x):  # (B, g, L_k, d) -> (B, h, L_k, d): head i reads kv head i // group
            heads = [x[:, j:j + 1] if i == 0 else x[:, j:j + 1].detach()
                     for j in range(x.shape[1]) for i in range(group)]
            return torch.cat(heads, dim=1)

        return super().attention(q, repeat(k), repeat(v), masks)


def _variant(cls, name: str):
    return cls(name, kernel="MATH", device=None, same_widths=False,
               capabilities=MATH.capabilities, deviations=dict(MATH.deviations))


VALUES_DETACHED = _variant(ValuesDetached, "torch-sdpa-math-values-detached")
FIRST_HEAD_OF_GROUP = _variant(FirstHeadOfGroup, "torch-sdpa-math-first-head-of-group")

EXPECTED = {
    "VALUES_DETACHED": ("torch-sdpa-math-values-detached", "GRAD-3", set()),
    "FIRST_HEAD_OF_GROUP": ("torch-sdpa-math-first-head-of-group", "GRAD-4", {"GRAD-3"}),
}
