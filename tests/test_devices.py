"""GPU and bfloat16 paths of every evaluator, `mutor eval` and `mutor sample`, checked on the CPU.

Device: the model reports a stand-in accelerator (``cuda:3``, see device_spy) and a forward hook
fails the test for any input that was never sent to ``model.device``; the numbers must equal a
plain CPU run. Dtype: each evaluator runs a bfloat16 model for real and must give finite metrics
close to float32's.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from device_spy import SENTINEL, DeviceRecord, SentinelMode, on_sentinel, sentinel_module_to

from mutor.data import star_graph as sg
from mutor.eval.generation import greedy_generate
from mutor.image.metrics import bits_per_token
from mutor.image.sample import sample_codes
from mutor.image.tokens import ImageLayout
from mutor.models.loading import resolve_dtype
from mutor.models.presets import tiny_causal_lm
from mutor.testing import byte_tokenizer
from mutor.utils.devices import model_device, resolve_device

TASK = sg.StarGraphShape(degree=2, path_len=4, num_nodes=20)
DIGITS = ImageLayout(codebook_size=8, num_classes=10, height=8, width=8, levels=8)
LAYOUT = ImageLayout(codebook_size=4, num_classes=3, height=3, width=3)      # small: fast sampling, no PNGs


def _graph_model(dtype=torch.float32):
    return tiny_causal_lm(TASK.vocab_size, seed=0, max_position_embeddings=64, bos_token_id=None,
                          eos_token_id=None).to(dtype).eval()


def _image_model(dtype=torch.float32, layout=LAYOUT):
    return tiny_causal_lm(layout.vocab_size, seed=0, bos_token_id=None, eos_token_id=None,
                          pad_token_id=layout.null_class).to(dtype).eval()


def _spied(model):
    record = DeviceRecord()
    return on_sentinel(model, record), record


def _image_data(n=6, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, LAYOUT.codebook_size, (n, LAYOUT.num_tokens)), rng.integers(0, LAYOUT.num_classes, n)


# ------------------------------------------------------------------ helpers
def test_device_and_dtype_resolution(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device(None) == torch.device("cuda") and resolve_device("cuda:1") == torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device(None) == torch.device("cpu") == resolve_device("auto")
    with pytest.raises(ValueError, match="not a torch device"):
        resolve_device("gpu0")
    assert resolve_dtype("auto") == "auto" and resolve_dtype("bfloat16") is torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        resolve_dtype("bf16")
    model, record = _spied(_graph_model())
    assert model_device(model) == SENTINEL


def test_cpu_description_reads_the_first_processors_model_name_and_flags(tmp_path):
    import platform

    from mutor.utils.devices import cpu_description

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t\t: fpu avx512f avx512_bf16\n\n"
                    "processor\t: 1\nmodel name\t: Another CPU\nflags\t\t: fpu\n")
    assert cpu_description(str(info)) == ("Some CPU @ 2.0GHz", frozenset({"fpu", "avx512f", "avx512_bf16"}))
    assert cpu_description(str(tmp_path / "none")) == (platform.processor() or platform.machine(), frozenset())


def test_the_spy_catches_an_input_left_on_the_cpu():
    """The check itself: an evaluator that forgets `.to(model.device)` fails it."""
    model, record = _spied(_graph_model())
    with SentinelMode(), torch.no_grad():
        ids = torch.tensor([[5, 6, 7]])
        model(input_ids=ids.to(model.device))
        assert not record.unsent
        model(input_ids=ids, attention_mask=torch.ones_like(ids).to(model.device))
    assert record.unsent == [(2, "input_ids")]
    with pytest.raises(AssertionError, match="never sent"):
        record.assert_all_sent()


# ---------------------------------------------------------------- star graphs
def test_star_graph_evaluate_sends_every_batch_to_the_model_device():
    examples = sg.make_examples(TASK, 6, seed=0)
    reference = sg.evaluate(_graph_model(), examples, batch_size=4)
    model, record = _spied(_graph_model())
    with SentinelMode():
        spied = sg.evaluate(model, examples, batch_size=4)
    record.assert_all_sent()
    assert spied == reference


def test_star_graph_evaluate_in_bfloat16():
    examples = sg.make_examples(TASK, 8, seed=1)
    ref = sg.evaluate(_graph_model(), examples)
    bf = sg.evaluate(_graph_model(torch.bfloat16), examples)
    assert all(math.isfinite(v) for v in bf.values())
    assert 0 <= bf["solve_rate"] <= 1 and bf["num_eval"] == 8
    assert bf["ntp_loss"] == pytest.approx(ref["ntp_loss"], rel=0.05)
    assert bf["a1_loss"] == pytest.approx(ref["a1_loss"], rel=0.05)


# ------------------------------------------------------------- text generation
PROMPTS = [[5, 9, 11, 3], [7, 8], [4, 4, 4, 12, 13, 2]]


@pytest.mark.parametrize("mode", ["causal", "bidirectional"])
def test_greedy_generate_sends_prompts_and_decoded_tokens_to_the_model_device(mode):
    reference = greedy_generate(_graph_model(), PROMPTS, 4, pad_id=0, eos_id=None, prefix_attention=mode)
    model, record = _spied(_graph_model())
    with SentinelMode():
        spied = greedy_generate(model, PROMPTS, 4, pad_id=0, eos_id=None, prefix_attention=mode)
    record.assert_all_sent()
    assert spied == reference and all(type(t) is int for row in spied for t in row)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("mode", ["causal", "bidirectional"])
def test_greedy_generate_in_bfloat16(mode, attn):
    """bf16 decoding gives fp32's tokens where fp32's choices are clear. The model is made to leave no near-tie
    for bf16's rounding to break, on any CPU: the blocks' outputs are scaled down and each output row is a scaled
    copy of one token's embedding, so the next token is a fixed permutation of the last one, led by a margin of
    many logits, while attention (and its mask, in bf16) still runs in every layer."""
    import copy

    ref = tiny_causal_lm(TASK.vocab_size, seed=0, attn_implementation=attn, bos_token_id=None,
                         eos_token_id=None).eval()
    with torch.no_grad():
        for name, weight in ref.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                weight.mul_(0.05)
        embed = ref.get_input_embeddings().weight
        perm = torch.randperm(embed.shape[0], generator=torch.Generator().manual_seed(0))
        ref.get_output_embeddings().weight.copy_(10.0 * torch.nn.functional.normalize(embed[perm], dim=-1))
    model = copy.deepcopy(ref).to(torch.bfloat16)
    out = greedy_generate(model, PROMPTS, 5, pad_id=0, eos_id=None, prefix_attention=mode)
    assert [len(r) for r in out] == [5, 5, 5]
    assert out == greedy_generate(ref, PROMPTS, 5, pad_id=0, eos_id=None, prefix_attention=mode)


# ----------------------------------------------------------------------- images
def test_image_evaluators_send_inputs_to_the_model_device():
    codes, labels = _image_data()
    ref_bits = bits_per_token(_image_model(), codes, labels, LAYOUT)
    ref_codes = sample_codes(_image_model(), LAYOUT, [0, 1, 2, 2], cfg_scale=2.0, top_k=3,
                             generator=torch.Generator().manual_seed(0))
    model, record = _spied(_image_model())
    with SentinelMode():
        bits = bits_per_token(model, codes, labels, LAYOUT)
        spied = sample_codes(model, LAYOUT, [0, 1, 2, 2], cfg_scale=2.0, top_k=3,
                             generator=torch.Generator().manual_seed(0))
    record.assert_all_sent()
    assert bits == ref_bits and np.array_equal(np.asarray(spied), ref_codes)


def test_image_evaluators_in_bfloat16():
    codes, labels = _image_data(12, seed=1)
    model = _image_model(torch.bfloat16)
    for scale in (1.0, 2.0):
        out = sample_codes(model, LAYOUT, [0, 1, 2], cfg_scale=scale, top_k=3,
                           generator=torch.Generator().manual_seed(0))
        assert out.shape == (3, LAYOUT.num_tokens) and out.dtype == np.int64
        assert out.min() >= 0 and out.max() < LAYOUT.codebook_size
    bits = bits_per_token(model, codes, labels, LAYOUT)
    assert math.isfinite(bits)
    assert bits == pytest.approx(bits_per_token(_image_model(), codes, labels, LAYOUT), rel=0.05)


@pytest.mark.slow
def test_digit_sample_metrics_in_bfloat16():
    from mutor.image.data import load_digits_split
    from mutor.image.metrics import sample_metrics

    train, test = load_digits_split(DIGITS.levels)
    m = sample_metrics(_image_model(torch.bfloat16, DIGITS), DIGITS, train, test, per_class=2, scales=(1.0, 2.0))
    assert set(m) >= {"fd", "precision", "recall", "fd_floor", "class_acc_cfg1", "class_acc_cfg2"}
    assert all(np.isfinite(v) for v in m.values())


# ------------------------------------------------------------- the commands
def _star_graph_run(tmp_path):
    """A model directory as `mutor train` leaves it for the star-graph task (recipe.yaml beside the weights)."""
    d = tmp_path / "sg"
    _graph_model().save_pretrained(d)
    recipe = {"method": "next_token", "seed": 0,
              "data": {"task": "star_graph", "degree": 2, "path_len": 4, "num_nodes": 20, "num_train": 16,
                       "num_test": 6}}
    (d / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    return d


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mutor_eval_run_task_loads_on_the_given_device_and_dtype(tmp_path, dtype):
    from mutor.run.cli import main

    d = _star_graph_run(tmp_path)
    main(["eval", "--task", "run", "--model", str(d), "--quiet", "--output-dir", str(tmp_path / "cpu"),
          "--device", "cpu", "--dtype", dtype])
    cpu = json.loads((tmp_path / "cpu" / "summary.json").read_text())["metrics"]
    record = DeviceRecord()
    with sentinel_module_to(record), SentinelMode():
        main(["eval", "--task", "run", "--model", str(d), "--quiet", "--output-dir", str(tmp_path / "dev"),
              "--device", str(SENTINEL), "--dtype", dtype])
    record.assert_all_sent()
    assert record.dtypes == {getattr(torch, dtype)}
    dev = json.loads((tmp_path / "dev" / "summary.json").read_text())["metrics"]
    assert dev == cpu and all(math.isfinite(v) for v in dev.values())


def test_mutor_eval_text_task_loads_on_the_given_device_and_dtype(tmp_path):
    from mutor.run.cli import main
    from mutor.run.recipe import CONFIG_DIR

    d = tmp_path / "lm"
    tiny_causal_lm(259, seed=0).save_pretrained(d)
    byte_tokenizer().save_pretrained(d)
    data = str(CONFIG_DIR / "tiny" / "data" / "gsm8k_tiny.jsonl")
    record = DeviceRecord()
    with sentinel_module_to(record), SentinelMode():
        main(["eval", "--task", "gsm8k", "--model", str(d), "--data", data, "--limit", "3", "--max-new-tokens", "3",
              "--batch-size", "2", "--quiet", "--device", str(SENTINEL), "--dtype", "bfloat16",
              "--prefix-attention", "bidirectional"])
    record.assert_all_sent()
    assert record.dtypes == {torch.bfloat16}
    summary = json.loads((d / "eval" / "gsm8k-test" / "summary.json").read_text())
    assert summary["n"] == 3 and summary["metrics"]["accuracy"] in (0.0, 100.0 / 3, 200.0 / 3, 100.0)


def test_mutor_sample_loads_on_the_given_device_and_dtype(tmp_path):
    from mutor.run.cli import main

    d = tmp_path / "img"
    _image_model().save_pretrained(d)
    (d / "task_info.json").write_text(json.dumps({"task": "digits", "image_layout": LAYOUT.to_dict()}))
    args = ["sample", "--model", str(d), "--classes", "0", "2", "--num-per-class", "2", "--top-k", "1"]
    main([*args, "--output-dir", str(tmp_path / "cpu"), "--device", "cpu", "--dtype", "bfloat16"])
    record = DeviceRecord()
    with sentinel_module_to(record), SentinelMode():
        main([*args, "--output-dir", str(tmp_path / "dev"), "--device", str(SENTINEL), "--dtype", "bfloat16"])
    record.assert_all_sent()
    assert record.dtypes == {torch.bfloat16}
    codes = np.load(tmp_path / "dev" / "codes.npy")
    assert codes.shape == (4, LAYOUT.num_tokens) and np.array_equal(codes, np.load(tmp_path / "cpu" / "codes.npy"))


def test_decoding_passes_the_kv_cache_by_the_installed_transformers_name():
    """``cache`` where transformers has it (``past_key_values`` is deprecated from 5.24, gone in 5.40), the old
    name before: greedy decoding and drafting raise no deprecation warning."""
    import inspect
    import warnings

    from mutor import MuToRConfig, MuToRModel
    from mutor.generation import generate
    from mutor.utils.devices import cache_argument

    model = _graph_model()
    expected = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert cache_argument(model) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        greedy_generate(model, PROMPTS, 3, pad_id=0, eos_id=None, prefix_attention="bidirectional")
        generate(MuToRModel(model, MuToRConfig(d_max=3)), torch.tensor([PROMPTS[0]]), 3, 3, eos_token_id=[])
