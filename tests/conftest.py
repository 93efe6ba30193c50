"""pytest setup: the repository root (for ``benchmarks``) and this folder (for the shared helpers
``families`` and ``references``) on ``sys.path``, whichever test file runs first or alone."""

import sys
from pathlib import Path

for _p in (Path(__file__).resolve().parents[1], Path(__file__).resolve().parent):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
