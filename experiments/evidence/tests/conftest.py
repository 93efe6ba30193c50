"""pytest setup for the evidence harness's own tests: the harness folder on ``sys.path``, so that they import
the scripts they test (``driver``, ``report``, ``drafting``, ...) as the scripts import each other."""

import sys
from pathlib import Path

_HARNESS = str(Path(__file__).resolve().parents[1])
if _HARNESS not in sys.path:
    sys.path.insert(0, _HARNESS)
