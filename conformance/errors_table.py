"""Render the catalogue of invalid inputs (chapter ERR) and the error each produces, as Markdown.

    python -m mhaspec.conformance.errors_table [BACKEND] > docs/generated/errors.md
"""

from __future__ import annotations

import sys

from mhaspec.backends import load_backend

from . import harness
from .test_errors import BAD_INPUTS, invalid_call


def render(backend_ref: str = "numpy-batched", dtype: str = "float32") -> str:
    backend = load_backend(backend_ref)
    lines = [f"Generated with `{backend.name}` ({dtype}; float16 for ERR-9, which only applies "
             "there) by `python -m mhaspec.conformance.errors_table`.", "",
             "| clause | operation | invalid input | argument | error raised |",
             "|---|---|---|---|---|"]
    for (clause, op), entries in BAD_INPUTS.items():
        impl = harness.Impl(backend, "cpu", "float16" if clause == "ERR-9" else dtype)
        for bad in entries:
            try:
                invalid_call(impl, op, bad)
                raised = "**no error**"
            except Exception as exc:  # noqa: BLE001 - the table reports whatever happens
                raised = f"`{type(exc).__name__}`: {str(exc).replace('|', '/')}"
            lines.append(f"| [{clause}](spec/index.md#{clause}) | {op} | {bad.what} | "
                         f"`{bad.arg.strip(chr(39))}` | {raised} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render(*sys.argv[1:2]))
