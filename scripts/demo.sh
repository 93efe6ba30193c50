#!/usr/bin/env bash
# The default job on a fresh machine: install, then run `mutor train` on its default recipe
# (configs/star-graph.yaml: next-token vs MuToR on path-star graphs G(2,3), ~10-12 minutes on 2 CPU cores).
# Extra arguments go to `mutor train` (e.g. training.max_steps=400 --output-dir runs/sg).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
mutor train "$@"
