"""mhaspec: a backend-neutral specification of multi-head attention and its conformance suite.

Subpackages: ``mhaspec.spec`` (clauses and the float64 oracle), ``mhaspec.backends`` (reference
implementations and the backend protocol), ``mhaspec.conformance`` (the pytest plugin and tests).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mhaspec")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"
