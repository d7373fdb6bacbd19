"""One check crosses few modules: the distinct calls between project modules in one MASK-1 test
(``python -m mhaspec.bench.module_calls``), at most 80."""

from __future__ import annotations

import re
import subprocess
import sys

#: the most distinct calls between the project's modules one MASK-1 check may make
MOST = 80


def test_one_mask_1_check_makes_at_most_80_calls_between_modules():
    proc = subprocess.run([sys.executable, "-m", "mhaspec.bench.module_calls"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    calls, modules = map(int, re.search(r"(\d+) distinct calls between (\d+) modules",
                                        proc.stdout).groups())
    assert 0 < calls <= MOST, proc.stdout
    # the path crosses the backend's front door and its computation, the judge and the oracle
    for module in ("backends/_generic.py", "backends/computation.py", "conformance/judge.py",
                   "spec/oracle.py"):
        assert module in proc.stdout, module
