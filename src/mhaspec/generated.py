"""Generated pages (``docs/generated/*.md``): the spec version each was generated against.

Every generator (``mhaspec matrix``, ``soak``, ``bench``, ``errors-table``) puts
:func:`marker` on the first line of what it writes. The docs build includes a generated page
through :func:`include`: a page of the current spec version is shown under a line that names its
version; any other page (an older version, or one naming none) is shown collapsed under a warning
that names both versions and the command that regenerates it, so a stale table is never taken
for a current one.
"""

from __future__ import annotations

import re

from mhaspec.spec import generated_marker as marker  # noqa: F401 - the generators' marker

#: The command that regenerates each generated page (by file name).
REGENERATE = {
    "matrix.md": "nox -s matrix",
    "soak.md": "nox -s soak, then copy results/soak/summary.md to docs/generated/soak.md",
    # the records of spec 1.1's and 1.2's soaks, kept beside the current one
    "soak-1.1.md": "nox -s soak",
    "soak-1.2.md": "nox -s soak",
    "bench.md": "nox -s bench",
    "errors.md": "mhaspec errors-table > docs/generated/errors.md",
    "condition-coverage.md": ("python -m pytest --pyargs mhaspec.conformance --backend numpy-batched "
                              "--mhaspec-profile ci --mhaspec-report ci.json, then python -m "
                              "mhaspec.conformance.condition_audit ci.json > "
                              "docs/generated/condition-coverage.md"),
}
MARKER = re.compile(r"<!--\s*mhaspec:generated\s+spec=(?P<version>[0-9]+\.[0-9]+)\s*-->")


def version_of(text: str) -> str | None:
    """The spec version a generated page names in its marker, or None."""
    m = MARKER.search(text)
    return m["version"] if m else None


def include(text: str, current: str, regenerate: str) -> str:
    """``text`` (a generated page) as Markdown to include in a page of spec ``current``;
    ``regenerate`` is the command that writes it anew."""
    version = version_of(text)
    if version == current:
        return f"*Generated against mhaspec {current}.*\n\n{text}"
    said = f"was generated against mhaspec {version}" if version else "names no spec version"
    body = "\n".join(f"    {line}" if line.strip() else "" for line in text.split("\n"))
    return (f'??? warning "Not current: this table {said}; the current version is '
            f'{current}"\n    Kept as the record of that run; regenerate it with `{regenerate}`. '
            f"Open to show it.\n\n{body}\n")
