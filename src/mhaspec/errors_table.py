"""Render the catalogue of invalid inputs (chapter ERR) and the error each produces, as Markdown.

    mhaspec errors-table [BACKEND] > docs/generated/errors.md
"""

from __future__ import annotations

import sys

from mhaspec import generated, usage
from mhaspec.backends import ALL_DTYPES
from mhaspec.conformance import harness
from mhaspec.conformance.invalid_inputs import BAD_INPUTS, invalid_call
from mhaspec.spec import SPEC_VERSION


def render(backend_ref: str = "numpy-batched", dtype: str = "float32") -> str:
    backend = usage.checked_backend(backend_ref)
    if dtype not in backend.dtypes("cpu"):
        raise usage.UsageError(f"--dtype {dtype}: {usage.printable(backend.name)} does not claim "
                               f"it on cpu (it claims {', '.join(backend.dtypes('cpu'))})")
    lines = [generated.marker(SPEC_VERSION),
             f"Generated with `{backend.name}` ({dtype}; float16 for ERR-9, which only applies "
             f"there) by `mhaspec errors-table`, against mhaspec {SPEC_VERSION}.", "",
             "| clause | operation | invalid input | argument | error raised |",
             "|---|---|---|---|---|"]
    for (clause, op), entries in BAD_INPUTS.items():
        impl = harness.Cell(backend, "cpu", "float16" if clause == "ERR-9" else dtype)
        for bad in entries:
            try:
                invalid_call(impl, op, bad)
                raised = "**no error**"
            except Exception as exc:  # noqa: BLE001 - the table reports whatever happens
                raised = f"`{type(exc).__name__}`: {str(exc).replace('|', '/')}"
            lines.append(f"| [{clause}](spec/index.md#{clause}) | {op} | {bad.what} | "
                         f"`{bad.arg.strip(chr(39))}` | {raised} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = usage.ArgumentParser(prog="mhaspec errors-table", description=__doc__.split("\n\n")[0])
    parser.add_argument("backend", nargs="?", default="numpy-batched",
                        help="registered backend name or module:attr (default numpy-batched)")
    parser.add_argument("--dtype", default="float32", choices=ALL_DTYPES,
                        help="dtype of the calls (default float32)")
    args = parser.parse_args(argv)
    sys.stdout.write(render(args.backend, args.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
