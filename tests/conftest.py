"""pytest setup: this folder on ``sys.path`` for the shared helpers (``families``, ``references``, ``planted``,
``scripts``), whichever test file runs first or alone. The repository root is not: tests import the package and
these helpers only, and run the repository's scripts as their users do (``scripts.run_module``). One fixture:
``model_head``, for the drafting tests that plant their registers' outputs (``planted``)."""

import sys
from pathlib import Path

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def model_head(monkeypatch):
    """Drafting rounds through the model's own head in float32 too: planted registers replace what the model's
    forward returns (``planted.plant``), which the float32 head product (``mutor.generation.forward``) bypasses."""
    import mutor.generation.forward as forward

    monkeypatch.setattr(forward, "head_product", lambda model, head="auto": None)
