"""Adapters for PyTorch's own attention ops: ``F.scaled_dot_product_attention`` and
``nn.MultiheadAttention``.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

Both adapters are :class:`~.adapters.TorchAdapter` subclasses: the entry points validate before
anything reaches torch, so the ERR clauses hold; the arguments are converted with the public helpers
(:mod:`.masks`, :mod:`.layouts`):

``torch-sdpa`` (:data:`SDPA`), ``torch.nn.functional.scaled_dot_product_attention``:
    * layout is the spec's ``(B, h, L, d)``; ``scale=`` is passed through;
    * boolean masks (``mask``, ``key_padding_mask`` as ``[:, None, None, :]``, causal) are ANDed and
      passed as a boolean ``attn_mask``, whose polarity is the spec's (True = may attend);
    * ``bias`` and ``legacy_mask * -1e9`` are added and passed as a float ``attn_mask``; with boolean
      masks as well, the float mask is ``where(allowed, bias, -inf)``;
    * causal top-left (and bottom-right when ``L_q == L_k``) with no other mask uses
      ``is_causal=True``; bottom-right with ``L_q < L_k`` alone uses
      ``torch.nn.attention.bias.causal_lower_right``; otherwise (bottom-right with ``L_q > L_k``,
      whose first rows are fully masked and for which torch warns that ``CausalBias`` may give NaN,
      or causal combined with other masks: ``is_causal`` cannot be combined with ``attn_mask``) the
      causal mask is an explicit boolean mask;
    * SDPA returns no attention weights: the adapter returns ``None`` and does not claim "weights";
    * grouped key/value heads (``gqa``, GQA-1: k and v with g heads, g dividing h) use
      ``enable_gqa=True``, which maps query head i to key/value head ``i // (h / g)`` as the spec
      does.
    * spec 1.3, "attention_vjp": autograd through the call above (the kernel torch picks, and its
      own backward; GQA's dk and dv summed by ``enable_gqa``'s backward); "bias_grad": the float
      ``attn_mask``'s own gradient (on CPU torch picks the math kernel for a mask that requires
      grad); no "lse", so no lse cotangent, and no sinks.
    Observed with torch 2.13 on CPU: a fully masked row gives 0 (safe softmax), as MASK-9 asks, and
    zero gradients (GRAD-7).

``torch-mha`` (:data:`MHA`), ``torch.nn.MultiheadAttention`` (``batch_first=True``, dropout 0, eval,
``need_weights=True``, ``average_attn_weights=False`` so weights are per head, SHAPE-2):
    * parameters: torch's ``nn.Linear`` stores ``(out, in)``, so every weight is the spec's transpose;
      with ``k_dim == v_dim == d_model`` they are packed as
      ``in_proj_weight = cat([W_q.T, W_k.T, W_v.T])``, otherwise ``kdim``/``vdim`` are set and
      ``q_proj_weight``/``k_proj_weight``/``v_proj_weight`` hold ``W_q.T``/``W_k.T``/``W_v.T``;
      ``out_proj.weight = W_o.T``; ``in_proj_bias = cat([b_q, b_k, b_v])``, ``out_proj.bias = b_o``.
      torch has one ``bias`` switch; an absent spec bias is zero (PARAM-1), so a partial set of
      biases is passed with zeros in place of the absent ones;
    * **mask polarity is inverted**: torch's boolean ``attn_mask`` and ``key_padding_mask`` mean
      True = *blocked*, the spec's True = may attend (MASK-1, MASK-5). The adapter passes
      ``key_padding_mask = ~kpm`` and ``attn_mask = ~(mask & causal)``, as ``(L_q, L_k)`` when the
      mask has no batch or head axis, else broadcast to ``(B*h, L_q, L_k)`` (batch-major, the layout
      torch reshapes its heads into). With ``bias``/``legacy_mask`` the attn_mask is the float
      ``where(allowed, bias, -inf)`` and the key padding the float ``where(kpm, 0, -inf)``;
    * causal goes through ``attn_mask`` (torch's ``is_causal`` is only a hint that needs it);
    * what cannot be expressed raises ``NotImplementedError``: ``h*d_k != d_model``,
      ``h*d_v != d_model`` or ``d_out != d_model`` (torch ties every width to ``embed_dim``, so
      cross-attention with ``d_v != d_k`` and ``d_out != d_model`` — MHA-4 — is not claimed), and a
      scale other than ``1/sqrt(d_k)`` (torch has no scale argument).
    Observed with torch 2.13 on CPU: with ``need_weights=True`` a fully masked row gives NaN output
    and NaN weights (declared against MASK-9).
"""

from __future__ import annotations

from . import calls, layouts, masks
from ._base import MHAParams
from .adapters import MaskArgs, TorchAdapter
from .optional import torch_module


class TorchSDPA(TorchAdapter):
    """``torch.nn.functional.scaled_dot_product_attention`` behind the spec's SDPA."""

    framework = "torch"
    native_op = "torch.nn.functional.scaled_dot_product_attention"
    conventions = {"causal-alignment": (
        "MASK-7", "is_causal=True is top-left; bottom-right with L_q < L_k goes through "
                  "causal_lower_right, otherwise an explicit mask")}
    capabilities = frozenset({"sdpa", "masks", "bias", "causal", "legacy_mask", "errors", "grad",
                              "gqa", "scale", "attention_vjp", "bias_grad"})
    deviations = {
        "MASK-13": "a NaN or inf key behind a boolean mask or key_padding_mask leaks into the rows "
                   "that exclude it (PyTorch issue 101967: the mask is added as -inf, and "
                   "NaN + -inf is NaN)",
        "NUM-6": "a query row whose logits are NaN gives an output row of 0, not NaN (the CPU "
                 "fused kernel and, on CUDA in float32, the memory-efficient kernel treat a NaN "
                 "row like a fully masked one; the CUDA kernels for float64, float16 and "
                 "bfloat16 give NaN, as specified)",
    }

    def deviations_on(self, device: str, dtype: str) -> dict[str, str]:
        """NUM-6 holds on CPU and on CUDA in float32 only (measured on an H200, torch 2.11)."""
        if device == "cuda" and dtype != "float32":
            return {c: r for c, r in self.deviations.items() if c != "NUM-6"}
        return dict(self.deviations)

    def attention(self, q, k, v, m: MaskArgs):
        F = torch_module().nn.functional
        len_q, len_k = self.ops.shape(q)[2], self.ops.shape(k)[2]
        additive = masks.additive_mask(like=q, bias=m.bias, legacy_mask=m.legacy_mask)
        causal = m.causal
        only_causal = m.mask is None and m.key_padding_mask is None and additive is None
        kwargs = {}
        if causal is not None and only_causal:
            if self.native_causal(causal, len_q, len_k):
                kwargs["is_causal"] = True
                causal = None
            elif len_q < len_k:
                from torch.nn.attention.bias import causal_lower_right

                kwargs["attn_mask"] = causal_lower_right(len_q, len_k)
                causal = None
        allowed = masks.allowed_mask(len_q, len_k, like=q, mask=m.mask,
                                     key_padding_mask=m.key_padding_mask, causal=causal)
        if additive is not None:
            kwargs["attn_mask"] = masks.fill_blocked(allowed, like=q, additive=additive)
        elif allowed is not None:
            kwargs["attn_mask"] = allowed
        # no torch.no_grad(): mha_vjp differentiates through the kernel (plain calls build no graph,
        # their inputs do not require grad)
        # GQA-1: query head i uses kv head i // (h/g)
        if self.ops.shape(k)[1] != self.ops.shape(q)[1]:
            kwargs["enable_gqa"] = True
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=m.scale, **kwargs)
        return out, None


class TorchMHA(TorchAdapter):
    """``torch.nn.MultiheadAttention`` behind the spec's multi-head attention."""

    framework = "torch"
    native_op = "torch.nn.MultiheadAttention"
    capabilities = frozenset({"mha", "weights", "masks", "causal", "legacy_mask", "errors", "grad"})
    deviations = {
        "MASK-9": "fully masked row -> NaN output and NaN weights (need_weights=True path "
                  "softmaxes a row of -inf)",
        "GRAD-2": "fully masked row -> NaN gradients (the forward row is NaN, MASK-9)",
        "MASK-13": "a NaN or inf key behind attn_mask or key_padding_mask leaks into the rows that "
                   "exclude it (the masks are added as -inf, and NaN + -inf is NaN; PyTorch issue "
                   "101967)",
    }
    conventions = {"mask-polarity": (
        "MASK-1", "boolean attn_mask and key_padding_mask mean blocked (True = may not attend); "
                  "the adapter passes ~mask and ~key_padding_mask")}

    def _module(self, p: MHAParams, num_heads: int, like):
        """An nn.MultiheadAttention holding the spec's parameters (PARAM-1, PARAM-2)."""
        torch = torch_module()
        d_model, hd_k = self.ops.shape(p.w_q)
        hd_v, d_out = self.ops.shape(p.w_o)
        if hd_k != d_model or hd_v != d_model or d_out != d_model:
            self.unsupported(
                f"h*d_k = {hd_k}, h*d_v = {hd_v}, d_out = {d_out} with d_model = {d_model}: "
                f"every projection width must equal embed_dim = d_model")
        mod = torch.nn.MultiheadAttention(d_model, num_heads, dropout=0.0,
                                          bias=layouts.has_bias(p), kdim=self.ops.shape(p.w_k)[0],
                                          vdim=self.ops.shape(p.w_v)[0], batch_first=True,
                                          device=like.device, dtype=like.dtype)
        mod.eval()
        p = MHAParams(*(None if t is None else t.to(dtype=like.dtype, device=like.device)
                        for t in p))
        with torch.no_grad():
            for name, value in layouts.to_torch_mha(p).items():
                mod.get_parameter(name).copy_(value)
        return mod

    def mha(self, query, key, value, p: MHAParams, num_heads: int, m: MaskArgs):
        with torch_module().no_grad():
            out, weights, _ = self._call(query, key, value, p, num_heads, m)
        return out, weights

    def mha_vjp(self, query, key, value, params: MHAParams, cotangent, *, num_heads: int,
                mask=None, bias=None, legacy_mask=None, key_padding_mask=None, causal=None,
                scale=None, num_kv_heads=None) -> dict:
        """GRAD: autograd w.r.t. fresh input leaves and the module's parameters, mapped back to the
        spec's layout (:func:`.layouts.from_torch_mha`: transposed, packed in_proj split)."""
        torch = torch_module()
        call = calls.mha_call(self, query, key, value, params, num_heads, mask, bias, legacy_mask,
                              key_padding_mask, causal, scale, num_kv_heads)
        params = call.params
        x = {n: t.detach().clone().requires_grad_(True)
             for n, t in (("query", query), ("key", key), ("value", value))}
        with torch.enable_grad():
            out, _, mod = self._call(x["query"], x["key"], x["value"], params, call.num_heads,
                                     call.masks)
            named = dict(mod.named_parameters())
            grads = torch.autograd.grad(out, [*x.values(), *named.values()],
                                        grad_outputs=cotangent, allow_unused=True)
        g = {n: t if t is not None else torch.zeros_like(v)
             for (n, v), t in zip([*x.items(), *named.items()], grads)}
        spec = layouts.from_torch_mha({n: g[n] for n in named})._asdict()
        result = {n: g[n] for n in x}
        result.update((n, t) for n, t in spec.items()
                      if n.startswith("w_") or getattr(params, n) is not None)
        return result

    def _call(self, query, key, value, p: MHAParams, num_heads: int, m: MaskArgs):
        """The module call of :meth:`mha`: (output, weights, module)."""
        d_k = self.ops.shape(p.w_q)[1] // num_heads
        if not masks.is_default_scale(m.scale, d_k):
            self.unsupported(f"scale = {m.scale!r} (it always uses 1/sqrt(d_k) = "
                             f"{1 / d_k ** 0.5!r})")
        mod = self._module(p, num_heads, query)
        b, len_q, len_k = self.ops.shape(query)[0], self.ops.shape(query)[1], self.ops.shape(key)[1]
        allowed = masks.allowed_mask(len_q, len_k, like=query, mask=m.mask, causal=m.causal)
        additive = masks.additive_mask(like=query, bias=m.bias, legacy_mask=m.legacy_mask)
        kpm = m.key_padding_mask
        kwargs = {}
        if additive is not None:  # one float mask each, -inf where blocked
            attn = masks.fill_blocked(allowed, like=query, additive=additive)
            if kpm is not None:
                kwargs["key_padding_mask"] = masks.fill_blocked(kpm, like=query).expand(b, len_k)
        else:  # torch's boolean masks: True = blocked
            invert = masks.blocked if self.translates("mask-polarity") else (lambda a: a)
            attn = invert(allowed)
            if kpm is not None:
                kwargs["key_padding_mask"] = invert(kpm)
        if attn is not None:
            if tuple(self.ops.shape(attn)[:2]) == (1, 1):
                attn = attn.expand(1, 1, len_q, len_k)[0, 0]
            else:  # (B*h, L_q, L_k), batch-major: the layout torch reshapes its heads into
                attn = attn.expand(b, num_heads, len_q, len_k).reshape(b * num_heads, len_q, len_k)
            kwargs["attn_mask"] = attn
        out, weights = mod(query, key, value, need_weights=True, average_attn_weights=False,
                           **kwargs)
        return out, weights, mod


SDPA = TorchSDPA("torch-sdpa")
MHA = TorchMHA("torch-mha")
