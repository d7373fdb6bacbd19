"""The two bases of the catalogue's backends: :class:`Broken` (the NumPy backend, to which
a subclass adds one mistake) and :class:`BrokenFeature` (the oracle-backed reference)."""

from __future__ import annotations

from mhaspec.backends.algorithms import Batched
from mhaspec.backends.np_backend import NumpyBackend, NumpyOps
from oracle_backend import OracleBackend


class Broken(NumpyBackend):
    """The NumPy backend composed of ``Ops`` (NumPy's operations, or a subclass with a mistake)
    and ``Kernel`` (the batched algorithm, or a subclass with a mistake), or of ``variant``."""

    Kernel = Batched
    Ops = NumpyOps

    def __init__(self, name: str, variant=None):
        super().__init__(self.Kernel() if variant is None else variant, name=name,
                         ops=self.Ops())


class BrokenFeature(OracleBackend):
    """The reference backend (tests/oracle_backend.py) with one mistake in a spec 1.2 feature."""
