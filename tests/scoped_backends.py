"""Backends whose operations differ (an attention function and a module of one library): they
scope capabilities (``capabilities_for(op)``) and deviations (``"CLAUSE@op"`` keys) to one
operation. Loaded by the tests with ``--backend scoped_backends:<NAME>``."""

from __future__ import annotations

from mhaspec.backends.np_backend import NumpyBackend


class BiasOnAttentionOnly(NumpyBackend):
    """Its attention function takes a bias, its module does not (and refuses one)."""

    def __init__(self):
        super().__init__("batched")
        self.name = "scoped-bias-sdpa-only"

    def capabilities_for(self, op):
        return self.capabilities - {"bias"} if op == "mha" else self.capabilities

    def multi_head_attention(self, *args, bias=None, **kw):
        if bias is not None:
            raise ValueError("multi_head_attention: this module takes no bias")
        return super().multi_head_attention(*args, **kw)


class EmptySizesFailInModule(NumpyBackend):
    """Its attention function handles sizes of 0, its module raises on them: SHAPE-4 is declared
    for the module only."""

    deviations = {"SHAPE-4@mha": "the module raises ZeroDivisionError when a size is 0"}

    def __init__(self):
        super().__init__("batched")
        self.name = "scoped-empty-mha-deviates"

    def multi_head_attention(self, query, key, value, params, **kw):
        if 0 in (*query.shape, *key.shape):
            raise ZeroDivisionError("division by zero")
        return super().multi_head_attention(query, key, value, params, **kw)


class ClaimsMoreForOneOperation(NumpyBackend):
    """Claims ``grad`` for its module only, without claiming it in ``capabilities``: refused."""

    def __init__(self):
        super().__init__("batched")
        self.name = "scoped-overclaiming"

    def capabilities_for(self, op):
        return self.capabilities | {"grad"} if op == "mha" else self.capabilities


BIAS_ON_ATTENTION_ONLY = BiasOnAttentionOnly()
CLAIMS_MORE_FOR_ONE_OPERATION = ClaimsMoreForOneOperation()
EMPTY_SIZES_FAIL_IN_MODULE = EmptySizesFailInModule()
