"""Keep a process's compiled XLA code within the kernel's limit on memory maps.

Every XLA executable compiled for the CPU holds about a dozen memory maps, and JAX keeps every
executable it has compiled. A jit-compiled backend called with thousands of distinct shapes and
mask sets in one process (a soak round at 250 examples per test) reaches ``vm.max_map_count``
(65530 by default on Linux), where XLA's next compilation dies with a segmentation fault.
:func:`tick` is called once per jit-compiled call; every ``CHECK_EVERY`` calls it counts the
process's maps and, above half the limit, drops JAX's caches (``jax.clear_caches``), which frees
the executables: later calls recompile. Results do not change. Elsewhere than Linux it does
nothing.
"""

from __future__ import annotations

import pathlib

CHECK_EVERY = 64
_MAPS = pathlib.Path("/proc/self/maps")
_LIMIT = pathlib.Path("/proc/sys/vm/max_map_count")

calls = 0
clears = 0


def map_count() -> int | None:
    """Memory maps of this process, or None where /proc does not say."""
    try:
        with _MAPS.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def map_limit() -> int | None:
    try:
        return int(_LIMIT.read_text())
    except (OSError, ValueError):
        return None


def tick(jax) -> None:
    """Count one compiled call; every ``CHECK_EVERY`` calls, clear JAX's caches when this
    process holds more than half the memory maps the kernel allows."""
    global calls, clears
    calls += 1
    if calls % CHECK_EVERY:
        return
    count, limit = map_count(), map_limit()
    if count is not None and limit is not None and count > limit // 2:
        jax.clear_caches()
        clears += 1
