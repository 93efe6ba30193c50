"""Run the repository's scripts (``benchmarks/``, ``experiments/``) the way their users do, as ``python -m``
from the repository root in a child process: tests import only the package and the helpers in this folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_module(module: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    """``python -m <module> <argv>`` from the repository root, output captured; with ``check``, a failure fails the
    test showing the ends of its stdout and stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    proc = subprocess.run([sys.executable, "-m", module, *map(str, argv)], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if check:
        assert proc.returncode == 0, \
            f"{module} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc
