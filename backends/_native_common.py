"""Helpers shared by the adapters for the frameworks' own attention ops.

Axis legend: B batch, L_q / L_k lengths, h heads, d_model query width, k_dim / v_dim key / value
widths, d_k / d_v per-head widths, d_out output width.

The adapters (:mod:`.torch_native`, :mod:`.jax_native`, :mod:`.keras_native`) subclass a framework
backend of this package for its conversions (``asarray``, ``to_numpy``, devices, dtypes) and its
validated entry points (``scaled_dot_product_attention`` / ``multi_head_attention`` validate with
:mod:`._validate`, then call ``_sdpa`` / ``_mha``), and override ``_sdpa`` / ``_mha`` to call the
native op. These helpers hold the parts of that conversion that do not depend on the framework.
"""

from __future__ import annotations

import copy
import math

from ._generic import Algorithm

LEGACY_MASK_VALUE = -1e9  # MASK-3: the source document's constant


class NativeMixin:
    """Members common to every native adapter; mix in before the framework backend."""

    #: The native op the adapter calls, for messages and the certificate.
    native_op: str = ""
    #: Conventions in which the native op differs from the spec and which the adapter translates:
    #: key -> (clause, one line). ``untranslated(key)`` gives the adapter without that translation,
    #: so a run can confirm that the native convention really differs (conformance.conventions).
    conventions: dict[str, tuple[str, str]] = {}

    def __init__(self, name: str):
        # the framework backend mixed in after this class; its algorithm serves only what the
        # adapter does not hand to the native op: the projections of _mha_over_sdpa (MHA-2)
        super().__init__(Algorithm.BATCHED, name=name)
        self.translated = frozenset(self.conventions)

    def untranslated(self, key: str):
        """A copy of this adapter that passes the spec's arguments to the native op as they are,
        without translating convention ``key``."""
        if key not in self.conventions:
            raise ValueError(f"{self.name}: no convention {key!r}; known: {sorted(self.conventions)}")
        other = copy.copy(self)
        other.name = f"{self.name}[untranslated {key}]"
        other.translated = self.translated - {key}
        if hasattr(other, "_jitted"):
            other._jitted = None  # a compiled function of the translating adapter
        return other

    def _native_causal(self, causal, len_q: int, len_k: int) -> bool:
        """Whether the op's own causal flag serves ``causal`` (it is top-left, MASK-6); without the
        causal-alignment translation the flag is used for bottom-right too."""
        if causal is not None and "causal-alignment" not in self.translated:
            return True
        return causal is not None and native_causal_is_top_left(causal, len_q, len_k)

    def split_heads(self, x, num_heads: int):
        raise NotImplementedError(f"{self.name}: {self.native_op} has no split_heads")

    def combine_heads(self, x):
        raise NotImplementedError(f"{self.name}: {self.native_op} has no combine_heads")

    def _unsupported(self, what: str):
        raise NotImplementedError(f"{self.name}: {self.native_op} cannot express {what}")

    def _rank4(self, m):
        """Left-pad a mask/bias broadcastable to (B, h, L_q, L_k) to rank 4."""
        if m is None:
            return None
        shape = self._shape(m)
        return self._reshape(m, (1,) * (4 - len(shape)) + shape) if len(shape) < 4 else m

    def _allowed_rank4(self, len_q, len_k, like, mask, key_padding_mask, causal):
        """AND of the boolean masks (MASK-1, 5, 6, 7, 8) as rank 4, or None."""
        return self._rank4(self._combine_masks(len_q, len_k, like, mask, key_padding_mask, causal))

    def _additive_sum(self, masks, dtype_like):
        """bias + legacy_mask * -1e9 (MASK-2, MASK-3) of :class:`MaskArgs` ``masks`` in
        ``dtype_like``'s dtype, rank 4, or None."""
        terms = self._additive(masks.bias, masks.legacy_mask)
        if not terms:
            return None
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return self._rank4(self._cast_like(total, dtype_like))

    def _cast_like(self, x, like):
        raise NotImplementedError


def is_default_scale(scale: float, d_k: int) -> bool:
    """Whether ``scale`` (already defaulted by the validated entry point) is 1/sqrt(d_k)."""
    return math.isclose(scale, 1.0 / math.sqrt(d_k), rel_tol=1e-12, abs_tol=0.0)


def native_causal_is_top_left(causal, len_q: int, len_k: int) -> bool:
    """The frameworks' causal flags are top-left (MASK-6); bottom-right equals it iff L_q == L_k."""
    return causal == "top_left" or (causal == "bottom_right" and len_q == len_k)
