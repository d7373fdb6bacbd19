"""mhaspec: a backend-neutral specification of multi-head attention and its conformance suite.

Package ``mhaspec``, folder ``src/mhaspec/``: the outer layer, every command and report (``cli``,
``certify``, ``certificate``, ``replay``, ``runner``, ``matrix``, ``soak``, ``bench``, ...).
Subpackages, innermost first (``[tool.setuptools] package-dir`` maps each to its folder; an inner
layer never imports an outer one): ``mhaspec.spec`` in ``spec/`` (clauses and the float64 oracle),
``mhaspec.backends`` in ``backends/`` (reference implementations and the backend protocol),
``mhaspec.conformance`` in ``conformance/`` (the pytest plugin and tests).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("mhaspec")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0+unknown"
