#!/usr/bin/env bash
# Create .venv (if missing) and install mutor with its test extras from scratch.
# Sourced by .ci/run and scripts/demo.sh so that both install the same way.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet torch==2.13.0          # the CPU build on disk; must come first
python -m pip install --quiet -e ".[test]"
