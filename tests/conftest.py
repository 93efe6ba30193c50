"""pytest setup: this folder on ``sys.path`` for the shared helpers (``families``, ``references``, ``planted``,
``scripts``), whichever test file runs first or alone. The repository root is not: tests import the package and
these helpers only, and run the repository's scripts as their users do (``scripts.run_module``). Two fixtures:
``forward_costs``, on for every test: drafting in this process is timed by a cost model, never by the wall clock,
so that what a draft policy decides does not depend on how busy the machine is; and ``model_head``, for the
drafting tests that plant their registers' outputs (``planted``)."""

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Hypothesis's property tests without its wall-clock checks (a per-example deadline, a health check on slow
# example generation): on a busy machine they fail tests whose examples are right.
settings.register_profile("mutor", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("mutor")

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


# What a drafting forward costs in the tests, in seconds: a fixed part and a part per row (its tokens and its
# registers), the shape of a small model's forward on a CPU, where a few extra rows cost little beside the fixed
# part (benchmarks/draft_traces/forward_times holds measured ones).
FIXED_COST, ROW_COST = 1e-3, 2e-5


@pytest.fixture(autouse=True)
def forward_costs(request, monkeypatch):
    """Every drafting forward of this process advances a clock of its own by ``FIXED_COST + ROW_COST * rows``,
    and that clock is the one the draft policy reads (``mutor.generation.drafter.forward_clock``): the policy's
    choices are the same on a quiet machine and a busy one. Tests marked ``wall_clock`` keep the real clocks."""
    if request.node.get_closest_marker("wall_clock"):
        return
    import mutor.generation.drafter as drafter
    import mutor.generation.forward as forward

    now = [0.0]
    real = forward.ModelForward.forward

    def costed(self, feed):
        now[0] += FIXED_COST + ROW_COST * feed.rows
        return real(self, feed)

    monkeypatch.setattr(forward.ModelForward, "forward", costed)
    monkeypatch.setattr(drafter, "forward_clock", lambda name: lambda: now[0])


@pytest.fixture
def model_head(monkeypatch):
    """Drafting rounds through the model's own head in float32 too: planted registers replace what the model's
    forward returns (``planted.plant``), which the float32 head product (``mutor.generation.forward``) bypasses."""
    import mutor.generation.forward as forward

    monkeypatch.setattr(forward, "head_product", lambda model, head="auto": None)
