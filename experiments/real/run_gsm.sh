#!/bin/bash
# One run of the SmolLM2 / gsm_symbolic comparison (README "Real models"): train, evaluate, held-out loss.
#   usage: experiments/real/run_gsm.sh METHOD SEED [OUT]     (METHOD: next_token, multi_token, mutor)
# 100 steps x batch 8 on 800 training examples, the recipe's bidirectional prefix, 1 thread (two runs side
# by side on a 2-core machine). Afterwards: python experiments/real/gsm_table.py OUT --losses OUT/losses.jsonl
set -eu
M=$1; S=$2; OUT=${3:-runs/gsm}; STEPS=${STEPS:-100}
D=$OUT/${M}_s$S
mkdir -p "$OUT"
export OMP_NUM_THREADS=1
if [ ! -f "$D/summary.json" ]; then
  /usr/bin/time -v -o "$OUT/time_${M}_s$S.txt" mutor train real/smollm2-135m-gsm-symbolic "method=[$M]" seed=$S threads=1 \
    training.max_steps=$STEPS data.num_train=$((STEPS * 8)) training.eval_steps=$STEPS training.save_steps=$STEPS \
    training.report_to=[] training.output_dir="$D"
fi
mutor eval --task gsm_symbolic --model "$D" --limit 100 --max-new-tokens 256 --batch-size 16
python experiments/real/heldout_loss.py "$D" --limit 100 --output "$OUT/losses.jsonl"
