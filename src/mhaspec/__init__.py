"""mhaspec: a backend-neutral specification of multi-head attention and its conformance suite.

Package ``mhaspec``, folder ``src/mhaspec/``: the outer layer, every command and report (``cli``,
``certify``, ``certificate``, ``replay``, ``runner``, ``matrix``, ``soak``, ``bench``, ...).
Subpackages, innermost first (``[tool.setuptools] package-dir`` maps each to its folder; an inner
layer never imports an outer one): ``mhaspec.spec`` in ``spec/`` (clauses and the float64 oracle),
``mhaspec.backends`` in ``backends/`` (reference implementations and the backend protocol),
``mhaspec.conformance`` in ``conformance/`` (the pytest plugin and tests).

``__version__`` is the version of the code that runs: pyproject.toml reads it from here, so the
installed metadata can only disagree with it when an editable install predates a version change
(:func:`installed_version`; ``mhaspec certify`` refuses to run then).
"""

#: The suite's version (pyproject.toml's ``[tool.setuptools.dynamic]`` reads it from here).
__version__ = "1.4.0"


def installed_version() -> str | None:
    """The version the installed package metadata records (None when mhaspec is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mhaspec")
    except PackageNotFoundError:
        return None
