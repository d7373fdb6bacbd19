"""Parameter layouts: the spec's :class:`~mhaspec.backends.MHAParams` to and from the frameworks'.

Axis legend: h query heads, g key/value heads (g = h without grouping), d_model query width,
k_dim / v_dim key / value widths, d_k / d_v per-head widths, d_out output width.

The spec's math layout (PARAM-1) is ``y = x @ W + b``: ``w_q (d_model, h*d_k)``, ``w_k (k_dim,
g*d_k)``, ``w_v (v_dim, g*d_v)``, ``w_o (h*d_v, d_out)``; head i owns columns ``[i*d, (i+1)*d)``
(PARAM-2). Each conversion below has both directions, ``to_*`` (spec -> framework) and ``from_*``
(framework -> spec), and each pair is an exact round trip (transposes, reshapes, slices: no
arithmetic). They take and return the caller's arrays (NumPy, torch, JAX, TensorFlow; see
:mod:`.array_ops`), so gradients and traced values pass through.

* ``nn.Linear`` / ``eqx.nn.Linear`` and Hugging Face's query/key/value/output modules
  (weight ``(out, in)``): :func:`to_linear` / :func:`from_linear`;
* ``nn.MultiheadAttention`` (packed ``in_proj_weight`` or ``q/k/v_proj_weight``, ``out_proj``):
  :func:`to_torch_mha` / :func:`from_torch_mha`;
* Keras ``EinsumDense`` and Flax ``LinearGeneral`` / ``DenseGeneral`` (input kernels
  ``(in, heads, d)``, output kernel ``(h, d_v, d_out)``): :func:`to_einsum` / :func:`from_einsum`;
* a state dict of four Linear modules by name (:data:`HF_BERT`, :data:`EQUINOX`):
  :func:`to_state_dict` / :func:`from_state_dict`.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

from ._base import MHAParams
from .array_ops import ops_for, shape_of


class Linear(NamedTuple):
    """One ``nn.Linear``-style layer: ``weight (out, in)``, ``bias (out,)`` or None; it computes
    ``x @ weight.T + bias``."""

    weight: Any
    bias: Any = None


class Dense(NamedTuple):
    """One ``EinsumDense`` / ``LinearGeneral`` / ``DenseGeneral`` layer. Input projections:
    ``kernel (in, heads, d)``, ``bias (heads, d)``; output projection: ``kernel (h, d_v, d_out)``,
    ``bias (d_out,)``. Either bias may be None."""

    kernel: Any
    bias: Any = None


class Projections(NamedTuple):
    """The four projections of multi-head attention, each a :class:`Linear`, a :class:`Dense` or
    (in :data:`HF_BERT` and the like) a module name."""

    query: Any
    key: Any
    value: Any
    output: Any


#: Module names of the four projections, for :func:`to_state_dict` / :func:`from_state_dict`.
#: Hugging Face BERT-style ``BertAttention`` (``attention.self.query`` ...
#: ``attention.output.dense``; the output module's residual LayerNorm is not part of multi-head
#: attention).
HF_BERT = Projections("self.query", "self.key", "self.value", "output.dense")
#: Equinox ``eqx.nn.MultiheadAttention`` (each an ``eqx.nn.Linear``, weight ``(out, in)``).
EQUINOX = Projections("query_proj", "key_proj", "value_proj", "output_proj")


def has_bias(params: MHAParams) -> bool:
    """Whether any of the four biases is given."""
    return any(b is not None for b in (params.b_q, params.b_k, params.b_v, params.b_o))


def with_zero_biases(params: MHAParams) -> MHAParams:
    """``params`` with every absent bias as zeros (in ``w_q``'s dtype and device), for frameworks
    with one bias switch (``nn.MultiheadAttention(bias=)``, Keras ``use_bias``): an absent spec bias
    is zero (PARAM-1), so a partial set is passed with zeros in place of the absent ones."""
    ops = ops_for(params.w_q)
    fill = {}
    for name, w in (("b_q", params.w_q), ("b_k", params.w_k), ("b_v", params.w_v),
                    ("b_o", params.w_o)):
        if getattr(params, name) is None:
            fill[name] = ops.zeros((shape_of(w)[1],), params.w_q)
    return params._replace(**fill)


# -- nn.Linear (out, in) ----------------------------------------------------------------------

def to_linear(params: MHAParams) -> Projections:
    """Four :class:`Linear` layers, weights ``(out, in)``: ``weight = W.T``, ``bias = b``."""
    ops = ops_for(params.w_q)
    return Projections(*(Linear(ops.transpose(w, (1, 0)), b) for w, b in (
        (params.w_q, params.b_q), (params.w_k, params.b_k), (params.w_v, params.b_v),
        (params.w_o, params.b_o))))


def from_linear(projections) -> MHAParams:
    """:class:`MHAParams` from four ``(weight (out, in), bias)`` pairs (query, key, value,
    output): ``W = weight.T``."""
    layers = [Linear(*p) for p in projections]
    ops = ops_for(layers[0].weight)
    w = [ops.transpose(layer.weight, (1, 0)) for layer in layers]
    return MHAParams(*w, *(layer.bias for layer in layers))


# -- nn.MultiheadAttention ----------------------------------------------------------------------

def to_torch_mha(params: MHAParams, *, packed: bool | None = None) -> dict[str, Any]:
    """The parameters of ``nn.MultiheadAttention(E, h, kdim=k_dim, vdim=v_dim, bias=has_bias(p))``
    by their names in ``named_parameters()``.

    ``packed`` (default: ``k_dim == v_dim == d_model``, as torch decides) gives
    ``in_proj_weight = cat([W_q.T, W_k.T, W_v.T])`` ``(3E, E)``, else ``q_proj_weight = W_q.T``,
    ``k_proj_weight = W_k.T`` ``(E, k_dim)``, ``v_proj_weight = W_v.T`` ``(E, v_dim)``;
    ``out_proj.weight = W_o.T``; with any bias, ``in_proj_bias = cat([b_q, b_k, b_v])`` and
    ``out_proj.bias = b_o``, absent ones as zeros. torch ties every width to ``E = d_model``:
    other widths raise ValueError naming them."""
    d_model, hd_k = shape_of(params.w_q)
    k_dim, v_dim = shape_of(params.w_k)[0], shape_of(params.w_v)[0]
    widths = {"h*d_k": hd_k, "g*d_k": shape_of(params.w_k)[1], "h*d_v": shape_of(params.w_v)[1],
              "d_out": shape_of(params.w_o)[1], "rows of w_o": shape_of(params.w_o)[0]}
    wrong = {n: v for n, v in widths.items() if v != d_model}
    if wrong:
        raise ValueError(f"to_torch_mha: nn.MultiheadAttention needs every projection width equal "
                         f"to embed_dim = d_model = {d_model}, got {wrong}")
    if packed is None:
        packed = k_dim == v_dim == d_model
    lin = to_linear(with_zero_biases(params) if has_bias(params) else params)
    ops = ops_for(params.w_q)
    out: dict[str, Any] = {}
    if packed:
        out["in_proj_weight"] = ops.concat([lin.query.weight, lin.key.weight, lin.value.weight], 0)
    else:
        out.update(q_proj_weight=lin.query.weight, k_proj_weight=lin.key.weight,
                   v_proj_weight=lin.value.weight)
    if has_bias(params):
        out["in_proj_bias"] = ops.concat([lin.query.bias, lin.key.bias, lin.value.bias], 0)
    out["out_proj.weight"] = lin.output.weight
    if has_bias(params):
        out["out_proj.bias"] = lin.output.bias
    return out


def from_torch_mha(named: Mapping[str, Any]) -> MHAParams:
    """:class:`MHAParams` from ``nn.MultiheadAttention``'s parameters
    (``dict(m.named_parameters())``, its ``state_dict()``, or gradients under the same names):
    the packed ``in_proj_weight`` is split into three row blocks, every weight transposed; biases
    are None when the module has none."""
    if "in_proj_weight" in named and named["in_proj_weight"] is not None:
        packed = named["in_proj_weight"]
        e = shape_of(packed)[0] // 3
        weights = [packed[:e], packed[e:2 * e], packed[2 * e:]]
    else:
        weights = [named["q_proj_weight"], named["k_proj_weight"], named["v_proj_weight"]]
    e = shape_of(weights[0])[0]
    bias = named.get("in_proj_bias")
    biases = [None] * 3 if bias is None else [bias[:e], bias[e:2 * e], bias[2 * e:]]
    return from_linear([*zip(weights, biases), (named["out_proj.weight"],
                                                named.get("out_proj.bias"))])


# -- EinsumDense / LinearGeneral / DenseGeneral ---------------------------------------------------

def to_einsum(params: MHAParams, num_heads: int, num_kv_heads: int | None = None) -> Projections:
    """Four :class:`Dense` layers in the Keras ``EinsumDense`` / Flax ``LinearGeneral`` layout:
    query kernel ``W_q.reshape(d_model, h, d_k)``, key ``W_k.reshape(k_dim, g, d_k)``, value
    ``W_v.reshape(v_dim, g, d_v)``, output ``W_o.reshape(h, d_v, d_out)``; biases ``(h, d_k)``,
    ``(g, d_k)``, ``(g, d_v)``, ``(d_out,)`` (None stays None). ``num_kv_heads`` g defaults to h."""
    g = num_heads if num_kv_heads is None else num_kv_heads
    ops = ops_for(params.w_q)

    def dense(w, b, heads):
        rows, cols = shape_of(w)
        if cols % heads:
            raise ValueError(f"to_einsum: a weight with shape {(rows, cols)} does not split into "
                             f"{heads} heads")
        d = cols // heads
        return Dense(ops.reshape(w, (rows, heads, d)),
                     None if b is None else ops.reshape(b, (heads, d)))

    hd_v, d_out = shape_of(params.w_o)
    if hd_v % num_heads:
        raise ValueError(f"to_einsum: w_o with shape {(hd_v, d_out)} does not split into "
                         f"{num_heads} heads")
    return Projections(dense(params.w_q, params.b_q, num_heads), dense(params.w_k, params.b_k, g),
                       dense(params.w_v, params.b_v, g),
                       Dense(ops.reshape(params.w_o, (num_heads, hd_v // num_heads, d_out)),
                             params.b_o))


def from_einsum(projections) -> MHAParams:
    """:class:`MHAParams` from four ``(kernel, bias)`` pairs in the ``EinsumDense`` /
    ``LinearGeneral`` layout (see :func:`to_einsum`): kernels and biases flattened back."""
    layers = [Dense(*p) for p in projections]
    ops = ops_for(layers[0].kernel)
    weights, biases = [], []
    for layer in layers[:3]:
        rows, heads, d = shape_of(layer.kernel)
        weights.append(ops.reshape(layer.kernel, (rows, heads * d)))
        biases.append(None if layer.bias is None else ops.reshape(layer.bias, (heads * d,)))
    h, d_v, d_out = shape_of(layers[3].kernel)
    weights.append(ops.reshape(layers[3].kernel, (h * d_v, d_out)))
    return MHAParams(*weights, *biases, layers[3].bias)


# -- state dicts of four Linear modules (Hugging Face, Equinox) ----------------------------------

def to_state_dict(params: MHAParams, names: Projections = HF_BERT) -> dict[str, Any]:
    """``{f"{name}.weight": W.T, f"{name}.bias": b}`` for the four projections' module ``names``
    (:data:`HF_BERT`, :data:`EQUINOX` or your own); absent biases are left out (load with
    ``strict=False``, or pass :func:`with_zero_biases` of the parameters)."""
    out: dict[str, Any] = {}
    for name, layer in zip(names, to_linear(params)):
        out[f"{name}.weight"] = layer.weight
        if layer.bias is not None:
            out[f"{name}.bias"] = layer.bias
    return out


def from_state_dict(state: Mapping[str, Any], names: Projections = HF_BERT) -> MHAParams:
    """:class:`MHAParams` from a state dict holding the four projections under ``names`` (other
    entries, such as a LayerNorm, are ignored); a missing ``.bias`` is None."""
    return from_linear([(state[f"{n}.weight"], state.get(f"{n}.bias")) for n in names])
