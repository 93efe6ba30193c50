#!/bin/bash
# One run of the SmolLM2 / gsm_symbolic comparison with separate clipping and bf16: train, evaluate,
# held-out loss. Same budget as run_gsm.sh (100 steps x batch 8 on 800 examples, bidirectional prefix,
# LoRA r=32, 1 thread so two runs go side by side), plus a precision and a clipping choice:
#   usage: experiments/real/run_gsm_fair.sh METHOD SEED PRECISION [CLIP] [OUT]
#     PRECISION: bf16     bf16 base weights (LoRA adapters and mutor's own parameters keep fp32 weights)
#                fp32     float32 throughout
#                autocast float32 weights, bf16 autocast (TrainingArguments bf16=true)
#                bf16ac   bf16 base weights and bf16 autocast (the adapters' products in bf16 too)
#     CLIP:      separate (default: the model's gradient and mutor's own are clipped each on its own) | joint
# Every step is logged (grad_norm, reg_grad_norm, losses): the clipped fraction and the loss curves come
# from summary.json's train_history. Evaluation is in float32 for every run, as before (run_gsm.sh).
# PHASE=train | eval | all (default) runs only that part; THREADS (default 1) sets the training threads.
# A MuToR run of this size peaks near 16 GB resident (bf16 weights: peft keeps a float32 copy of every
# adapted layer's input for the adapters): beside another training run it can exceed a 24 GB machine,
# so train such runs one at a time and let evaluations (a few GB) run beside them.
set -eu
M=$1; S=$2; P=$3; C=${4:-separate}; OUT=${5:-runs/gsm-fair}; STEPS=${STEPS:-100}; PHASE=${PHASE:-all}
T=${THREADS:-1}
D=$OUT/${M}_s${S}_${P}_${C}
mkdir -p "$OUT"
export OMP_NUM_THREADS=$T
case $P in
  bf16) PREC="model.dtype=bfloat16" ;;
  fp32) PREC="model.dtype=float32" ;;
  autocast) PREC="model.dtype=float32 training.bf16=true" ;;
  bf16ac) PREC="model.dtype=bfloat16 training.bf16=true" ;;
  *) echo "unknown precision $P" >&2; exit 2 ;;
esac
CLIPARG=""
if [ "$M" != next_token ]; then CLIPARG="grad_clip=$C"; fi
if [ "$PHASE" != eval ] && [ ! -f "$D/summary.json" ]; then
  RESUME=""; [ -d "$D" ] && RESUME="--resume"
  /usr/bin/time -v -o "$OUT/time_${M}_s${S}_${P}_${C}.txt" mutor train real/smollm2-135m-gsm-symbolic "method=[$M]" \
    seed=$S threads=$T $PREC $CLIPARG training.max_steps=$STEPS data.num_train=$((STEPS * 8)) \
    training.eval_steps=$STEPS training.save_steps=$((STEPS / 4)) training.logging_steps=1 training.report_to=[] \
    training.output_dir="$D" $RESUME
fi
[ "$PHASE" = train ] && exit 0
export OMP_NUM_THREADS=1
[ -f "$D/eval_done" ] || { mutor eval --task gsm_symbolic --model "$D" --limit 100 --max-new-tokens 256 --batch-size 16 \
  && touch "$D/eval_done"; }
[ -f "$D/loss_done" ] || { python experiments/real/heldout_loss.py "$D" --limit 100 --output "$OUT/losses.jsonl" \
  && touch "$D/loss_done"; }
