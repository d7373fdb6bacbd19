"""When a pytest run asks for mhaspec: the rule that keeps the plugin inert everywhere else.

Installing mhaspec registers its pytest plugin (the ``pytest11`` entry point) in every pytest run
of that environment. The plugin acts only in a run that asks for mhaspec, by any of:

* a test argument that names the suite: ``mhaspec.conformance`` or one of its modules (with
  ``--pyargs``), or a path inside the suite's folder (a file, a node id, the folder itself), or
  no test argument at all when pytest starts inside that folder;
* an ``--mhaspec-...`` option (on the command line, in ``PYTEST_ADDOPTS`` or in ``addopts``);
* ``-p mhaspec`` or ``-p mhaspec.conformance.plugin``;
* a program running pytest in-process that registers the plugin's provider object (the runner).

Anything else (another project's tests, a conftest with its own ``--backend``, its own Hypothesis
profile) is left as if mhaspec were not installed.
"""

from __future__ import annotations

import pathlib
from typing import Iterable

#: the suite's import name (a ``--pyargs`` argument)
SUITE = "mhaspec.conformance"
#: the names ``-p`` may load the plugin under (the entry point's and the module's)
PLUGIN_NAMES = frozenset({"mhaspec", "mhaspec.conformance.plugin"})
#: how every option of the suite starts
OPTION_PREFIX = "--mhaspec-"


def names_suite(argument: str, *, invocation_dir: pathlib.Path, suite_dir: pathlib.Path) -> bool:
    """Whether one test argument (a module name, a path, a node id ``path::test``) names the
    suite or something in it."""
    target = argument.split("::", 1)[0]
    if target == SUITE or target.startswith(SUITE + "."):
        return True
    try:
        path = (invocation_dir / target).resolve()
    except (OSError, ValueError):  # not a path this system can resolve
        return False
    suite = suite_dir.resolve()
    return path == suite or suite in path.parents


def asks_for_mhaspec(args: Iterable[str], *, test_args: Iterable[str], plugins: Iterable[str],
                     invocation_dir: pathlib.Path, suite_dir: pathlib.Path,
                     provided: bool = False) -> bool:
    """Whether a pytest run asks for mhaspec (module docstring). ``args``: every argument of the
    run (command line, ``PYTEST_ADDOPTS``, ``addopts``); ``test_args``: its positional (test)
    arguments; ``plugins``: its ``-p`` values; ``provided``: an in-process runner registered
    the plugin's provider."""
    if provided or any(str(a).startswith(OPTION_PREFIX) for a in args):
        return True
    if PLUGIN_NAMES & {p.strip() for p in plugins}:
        return True
    tests = [str(t) for t in test_args]
    if not tests:
        return names_suite(".", invocation_dir=invocation_dir, suite_dir=suite_dir)
    return any(names_suite(t, invocation_dir=invocation_dir, suite_dir=suite_dir) for t in tests)
