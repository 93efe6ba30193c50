#!/usr/bin/env bash
# The default job on a fresh machine: install, then run the next-token vs MuToR comparison.
# Extra arguments go to `mutor demo` (e.g. --steps 400 --output-dir runs/demo).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
mutor demo "$@"
