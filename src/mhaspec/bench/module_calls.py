"""How many modules one check crosses: the calls between the project's modules in one MASK-1 test.

    python -m mhaspec.bench.module_calls [--backend numpy-batched] [--test NAME] [--all]

Runs one test of the suite in this process (ci profile, float64, the CPU, the ``sdpa`` operation;
default ``test_boolean_mask_true_means_may_attend``, MASK-1) with ``sys.setprofile`` on during the
test's call only, and counts the distinct calls (caller function, callee function) whose modules
differ, both modules the project's own (``mhaspec``, its ``spec``, ``backends`` and
``conformance``). Prints the count, the modules and the calls per pair of modules (``--all``:
every call). A measure of coupling, not of speed.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys

import pytest

import mhaspec
from mhaspec import backends, conformance, spec

#: the project's folders (their files are the project's modules)
FOLDERS = tuple(str(pathlib.Path(m.__file__).parent) + "/" for m in (mhaspec, spec, backends,
                                                                       conformance))
ROOT = str(pathlib.Path(FOLDERS[0]).parent.parent) + "/"


def _short(path: str) -> str:
    return path.removeprefix(ROOT)


class Profiler:
    """A pytest plugin that records the calls between project modules during each test call."""

    def __init__(self):
        self.calls: collections.Counter = collections.Counter()

    def _profile(self, frame, event, arg):
        if event != "call" or frame.f_back is None:
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename
        if callee != caller and callee.startswith(FOLDERS) and caller.startswith(FOLDERS):
            self.calls[(_short(caller), frame.f_back.f_code.co_name, _short(callee),
                        frame.f_code.co_name)] += 1

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        sys.setprofile(self._profile)
        try:
            return (yield)
        finally:
            sys.setprofile(None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mhaspec.bench.module_calls",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="numpy-batched")
    parser.add_argument("--test", default="test_boolean_mask_true_means_may_attend")
    parser.add_argument("--all", action="store_true", help="print every call")
    args = parser.parse_args(argv)
    profiler = Profiler()
    status = pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs",
                          "mhaspec.conformance", "--mhaspec-backend", args.backend,
                          "--mhaspec-profile", "ci", "--mhaspec-dtypes", "float64",
                          "-k", f"{args.test} and sdpa and cpu"], plugins=[profiler])
    if status != 0 or not profiler.calls:
        print(f"module_calls: the test did not run and pass (pytest exit status {status})",
              file=sys.stderr)
        return 1
    modules = {m for a, _, c, _ in profiler.calls for m in (a, c)}
    print(f"{args.test} on {args.backend}: {len(profiler.calls)} distinct calls between "
          f"{len(modules)} modules")
    pairs = collections.Counter((a, c) for a, _, c, _ in profiler.calls)
    for (a, c), n in sorted(pairs.items(), key=lambda x: (-x[1], x[0])):
        print(f"  {n:3d}  {a} -> {c}")
        if args.all:
            for caller, f, callee, g in sorted(profiler.calls):
                if (caller, callee) == (a, c):
                    print(f"         {f} -> {g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
