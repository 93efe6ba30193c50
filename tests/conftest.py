"""pytest setup: this folder on ``sys.path`` for the shared helpers (``families``, ``references``, ``planted``,
``scripts``), whichever test file runs first or alone. The repository root is not: tests import the package and
these helpers only, and run the repository's scripts as their users do (``scripts.run_module``)."""

import sys
from pathlib import Path

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
