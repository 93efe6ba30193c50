"""Bad input fails fast, as one line naming the problem; runs are guarded and their results loadable.

Each test holds one guarantee a new user relies on: one-line errors instead of raw tracebacks (YAML
syntax, empty data, wrong types, truncated weights, an unreachable Hub), every block validated before
any method trains, a run directory never mixed with another run's checkpoints, a resumed run's
``train_loss`` over the whole run, a LoRA run on a random-init base that loads offline, and the small
ones (a short run's loss curve, visible curves, a ``mutor sample`` that shows progress, NaN for absent offsets).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from mutor.run.cli import main
from mutor.utils.errors import MutorUserError

DATA = Path(__file__).resolve().parents[1] / "src/mutor/configs/tiny/data"
# the star-graph recipe at smoke size: about a second of training per method on 2 CPU cores
SG = ["data.num_train=64", "data.num_test=8", "data.path_len=4", "data.num_nodes=20", "model.preset=tiny-llama",
      "training.report_to=[]", "training.eval_steps=2"]


def _one_line_error(capsys, argv, *needles, code=2):
    capsys.readouterr()
    assert main(argv) == code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in captured.err and len(err.splitlines()) == 1, err
    assert err.startswith(f"mutor {argv[0]}: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


# ------------------------------------------------------------ one-line errors
def test_yaml_syntax_error_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: mutor\ndata: {task: gsm8k\ntraining: {}\n")
    _one_line_error(capsys, ["train", str(bad)], str(bad), "line 3", "YAML syntax error")
    _one_line_error(capsys, ["train", "tiny/gsm8k", "training.report_to=[a"], "training.report_to=[a", "YAML")


@pytest.mark.parametrize("override, needle", [
    ("training.max_steps=abc", "recipe training.max_steps: expected an integer, got 'abc'"),
    ("seed=foo", "recipe seed: expected an integer, got 'foo'"),
    ("training.learning_rate=fast", "recipe training.learning_rate: expected a number"),
    ("lora.r=x", "recipe lora.r: expected an integer"),
    ("model.dtype=7", "recipe model.dtype: expected a string"),
])
def test_wrong_types_are_named(override, needle, tmp_path, capsys):
    _one_line_error(capsys, ["train", "tiny/gsm8k", override, "--output-dir", str(tmp_path / "run")], needle)
    assert not (tmp_path / "run").exists()


def test_every_block_is_validated_before_any_method_trains(tmp_path, monkeypatch):
    """multi_token.d_max=0, or a misspelt training/lora key, fails before the first method trains or
    the model is built."""
    import mutor.run.train as train

    def must_not_run(*a, **k):
        raise AssertionError("trained or built a model before validating the recipe")

    monkeypatch.setattr(train, "train_method", must_not_run)
    monkeypatch.setattr(train, "build_base_model", must_not_run)   # train.py's own name for it (mutor.run.build)
    cases = [("multi_token.d_max=0", "MultiTokenConfig.d_max"),
             ("training.max_stepz=3", "'max_stepz': did you mean 'max_steps'?"),
             ("lora.rank=8", "recipe lora: unknown key(s) ['rank']"),
             ("model.presett=tiny-llama", "'presett': did you mean 'preset'?"),
             ("training.lr_scheduler_type=nope", "recipe training:")]
    for override, needle in cases:
        with pytest.raises(MutorUserError) as err:
            train.run_recipe("tiny/gsm8k", [override, f"training.output_dir={tmp_path / 'r'}"], quiet=True)
        assert needle in str(err.value), (override, str(err.value))
    assert not (tmp_path / "r").exists()


def test_misspelt_model_preset_gets_a_hint():
    from mutor.models.presets import tiny_causal_lm

    with pytest.raises(ValueError,
                       match=r"unknown model preset 'tiny-lama' \('tiny-lama': did you mean 'tiny-llama'\?\)"):
        tiny_causal_lm(64, "tiny-lama")


def test_empty_data_file_is_named(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    _one_line_error(capsys, ["train", "tiny/gsm8k", "method=next_token", f"data.path={empty}", "--output-dir",
                             str(tmp_path / "run")], str(empty), "empty")
    assert not (tmp_path / "run").exists()             # a failed launch leaves no directory behind


def _tiny_model_dir(path: Path) -> Path:
    from mutor.models.presets import tiny_causal_lm

    torch.manual_seed(0)
    tiny_causal_lm(64, "tiny-llama").save_pretrained(path)
    return path


def test_jsonl_row_without_the_answer_names_file_row_and_field(tmp_path, capsys):
    """A row lacking the template's field is refused by file, row and field (else it would train with the
    text "None" as its answer)."""
    rows = [json.loads(x) for x in (DATA / "gsm8k_tiny.jsonl").read_text().splitlines()][:6]
    del rows[3]["answer"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    _one_line_error(capsys, ["train", "tiny/gsm8k", f"data.path={bad}", "--quiet", "--output-dir",
                             str(tmp_path / "run")], str(bad), "row 4", "'answer'")   # line 4 of the file
    assert not (tmp_path / "run").exists()


def test_eval_on_a_directory_without_a_model_says_so(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    _one_line_error(capsys, ["eval", "--task", "gsm8k", "--model", str(tmp_path), "--limit", "1", "--quiet"],
                    "holds no model", "config.json")


def test_ctrl_c_ends_as_one_line_naming_the_checkpoint_to_resume(tmp_path, capsys, monkeypatch):
    from mutor.integrations.trainer import MuToRTrainer

    step = MuToRTrainer.training_step

    def interrupted_at_step_3(self, *args, **kwargs):
        if self.state.global_step == 3:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(MuToRTrainer, "training_step", interrupted_at_step_3)
    run = tmp_path / "run"
    err = _one_line_error(capsys, ["train", "tiny/gsm8k", "method=mutor", "training.max_steps=6",
                                   "training.save_steps=2", "--quiet", "--output-dir", str(run)],
                          "interrupted while training mutor", "--resume", code=130)
    assert str(run / "checkpoint-2") in err


def test_truncated_weights_name_the_file(tmp_path, capsys):
    model = _tiny_model_dir(tmp_path / "m")
    f = model / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    _one_line_error(capsys, ["train", "star-graph", "method=next_token", f"model.name_or_path={model}", *SG,
                             "--output-dir", str(tmp_path / "run")], str(f), "truncated")
    assert not (tmp_path / "run").exists()             # a failed launch leaves no directory behind
    _one_line_error(capsys, ["eval", "--task", "gsm8k", "--model", str(model)], str(f))


def test_unreachable_hub_is_one_line_after_one_attempt(tmp_path, capsys, monkeypatch):
    """Offline, a Hub id fails after one quick question to the Hub, not after 30-50 s of retries."""
    import huggingface_hub
    import transformers

    calls = []

    def no_network(name, **kw):
        calls.append((name, kw.get("timeout")))
        raise ConnectionError("[Errno -2] Name or service not known")

    def must_not_load(*a, **k):
        raise OSError("from_pretrained retried the Hub for a long time\n" + "traceback line\n" * 70)

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub, "model_info", no_network)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", must_not_load)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", must_not_load)
    _one_line_error(capsys, ["eval", "--task", "gsm8k", "--model", "some-org/some-model"],
                    "'some-org/some-model'", "cannot reach the Hugging Face Hub", "HF_HUB_OFFLINE")
    assert len(calls) == 1 and calls[0][1] is not None and calls[0][1] <= 10
    calls.clear()
    _one_line_error(capsys, ["train", "star-graph", "model.name_or_path=some-org/some-model", "model.tokenizer=none",
                             *SG, "--output-dir", str(tmp_path / "run")], "model.name_or_path", "cannot reach")
    assert len(calls) == 1 and not (tmp_path / "run").exists()


def test_debug_keeps_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("MUTOR_DEBUG", "1")
    with pytest.raises(MutorUserError, match="seed"):
        main(["train", "tiny/gsm8k", "seed=foo", "--output-dir", str(tmp_path / "r")])


def test_eval_run_on_a_text_run_says_which_task(tmp_path, capsys):
    run = tmp_path / "gsm"
    run.mkdir()
    (run / "recipe.yaml").write_text("method: mutor\nseed: 0\nmodel: {tokenizer: byte}\n"
                                     "data: {task: gsm8k, path: x.jsonl}\n")
    _one_line_error(capsys, ["eval", "--task", "run", "--model", str(run)], "not of a synthetic task",
                    "--task gsm8k")


def test_failed_launch_leaves_no_directory(tmp_path, capsys):
    _one_line_error(capsys, ["train", "star-graph", "method=next_token", f"model.name_or_path={tmp_path / 'nope'}",
                             *SG, "--output-dir", str(tmp_path / "run")], "model.name_or_path", "does not exist")
    assert not (tmp_path / "run").exists()


# --------------------------------------------------------- output directories
def _sg(tmp_path, name, *extra, **kw):
    from mutor.run.train import run_recipe

    return run_recipe("star-graph", ["method=next_token", "training.max_steps=2", "training.save_steps=2", *SG,
                                     f"training.output_dir={tmp_path / name}", *extra], quiet=True, **kw)


def test_output_directory_is_refused_cleared_or_resumed_only_from_the_same_recipe(tmp_path):
    _sg(tmp_path, "run")
    run = tmp_path / "run"
    with pytest.raises(MutorUserError, match="not empty.*--resume.*--overwrite"):
        _sg(tmp_path, "run")
    # another run's checkpoint beside the new one would be picked up by --resume: --overwrite clears it
    stale = run / "checkpoint-600"
    shutil.copytree(run / "checkpoint-2", stale)
    _sg(tmp_path, "run", overwrite=True)
    assert not stale.exists() and (run / "checkpoint-2").is_dir()
    # --resume with a different recipe, or onto a checkpoint of a different run, is refused
    with pytest.raises(MutorUserError, match=r"different recipe \(training.learning_rate"):
        _sg(tmp_path, "run", "training.learning_rate=0.5", resume=True)
    shutil.copytree(run / "checkpoint-2", stale)
    state = json.loads((stale / "trainer_state.json").read_text())
    (stale / "trainer_state.json").write_text(json.dumps({**state, "global_step": 600, "max_steps": 600}))
    with pytest.raises(MutorUserError, match="checkpoint-600 is from a run of 600 steps"):
        _sg(tmp_path, "run", resume=True)
    # --overwrite refuses to clear a directory that is not a mutor run
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(MutorUserError, match="refusing to clear"):
        _sg(tmp_path, "mine", overwrite=True)
    assert (other / "notes.txt").is_file()


@pytest.mark.parametrize("state", ["missing", "empty", "unrelated"])
def test_resume_with_nothing_to_resume_is_refused_and_writes_nothing(tmp_path, capsys, state):
    run = tmp_path / "run"
    if state != "missing":
        run.mkdir()
    if state == "unrelated":
        (run / "notes.txt").write_text("mine")
    before = sorted(p.name for p in run.iterdir()) if run.is_dir() else None
    _one_line_error(capsys, ["train", "star-graph", "method=next_token", *SG, "--output-dir", str(run), "--resume"],
                    "nothing to resume in", str(run))
    assert (sorted(p.name for p in run.iterdir()) if run.is_dir() else None) == before


def test_resumed_run_reports_the_whole_runs_train_loss(tmp_path):
    """A run killed after its step-2 checkpoint and resumed reports the same train_loss as the uninterrupted run
    (Trainer's own value averages only the steps after the resume)."""
    args = ["training.max_steps=4", "training.save_steps=2", "training.logging_steps=1"]
    full = _sg(tmp_path, "full", *args)["runs"][0]
    _sg(tmp_path, "killed", *args)
    killed = tmp_path / "killed"
    shutil.rmtree(killed / "checkpoint-4")
    (killed / "summary.json").unlink()
    resumed = _sg(tmp_path, "killed", *args, resume=True)["runs"][0]
    assert resumed["resumed_from"].endswith("checkpoint-2") and resumed["global_step"] == 4
    assert resumed["train_loss"] == pytest.approx(full["train_loss"], rel=1e-6)
    assert resumed["train_metrics"]["train_loss"] == resumed["train_loss"]
    # a checkpoint without the stored sum: from its trainer_state.json (logged losses, every step here)
    shutil.rmtree(killed / "checkpoint-4")
    (killed / "summary.json").unlink()
    (killed / "checkpoint-2" / "mutor_train_loss.json").unlink()
    again = _sg(tmp_path, "killed", *args, resume=True)["runs"][0]
    assert again["train_loss"] == pytest.approx(full["train_loss"], rel=1e-4)


# ---------------------------------------------------------------- LoRA result
def test_lora_run_on_a_random_init_base_loads_offline(tmp_path, monkeypatch, capsys):
    """tiny/samsum-lora saves its random-init base beside the adapter and records it as the adapter's base
    (``base_model_name_or_path``), so the run loads offline."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from mutor import MuToRModel
    from mutor.run.train import run_recipe

    out = tmp_path / "lora"
    run_recipe("tiny/samsum-lora", ["method=mutor", "training.max_steps=2", "training.save_steps=1",
                                    "training.report_to=[]", "data.max_length=256",
                                    f"training.output_dir={out}"], quiet=True)
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == "base" and (out / "base" / "config.json").is_file()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for d in (out, out / "checkpoint-1"):             # the final adapter, and a checkpoint (base one level up)
        m = MuToRModel.from_pretrained(d)
        assert isinstance(m.base_model, PeftModel)
        assert m.register_embeddings.weight.shape[-1] == 64
    # the base weights are the run's initial random weights: the adapter on them gives the trained model
    m = MuToRModel.from_pretrained(out)
    ids = torch.tensor([[5, 6, 7, 8]])
    merged = AutoModelForCausalLM.from_pretrained(out / "base")
    assert not torch.equal(merged(input_ids=ids).logits, m.base_model(input_ids=ids).logits)   # LoRA is applied
    # mutor eval loads it from anywhere; AutoModelForCausalLM resolves the relative "base" from the run directory
    assert main(["eval", "--task", "samsum", "--model", str(out), "--data", str(DATA / "samsum_tiny.jsonl"),
                 "--limit", "1", "--max-new-tokens", "2", "--quiet"]) == 0
    monkeypatch.chdir(out)
    assert isinstance(AutoModelForCausalLM.from_pretrained(".").peft_config, dict)


# --------------------------------------------------------------------- smaller
def test_short_run_logs_its_loss_and_curves_stay_visible(tmp_path):
    """A run shorter than logging_steps still logs its training loss, and identical curves stay visible."""
    from mutor.eval.compare import curves_figure

    out = _sg(tmp_path, "short", "method=[next_token,mutor]", "training.logging_steps=50")
    runs = out["runs"]
    assert all(r["train_history"] and r["train_history"][-1]["step"] == 2 for r in runs)
    fig = curves_figure(runs)
    for ax in fig.axes:
        lines = ax.get_lines()
        assert len(lines) == 2
        styles = {(ln.get_marker(), ln.get_linestyle(), ln.get_markersize()) for ln in lines}
        assert len(styles) == 2                        # each method drawn differently
    empty = curves_figure([{**runs[0], "train_history": []}])
    assert "no training loss logged" in [t.get_text() for t in empty.axes[-1].texts]


def test_text_task_comparison_says_it_has_no_held_out_columns():
    from mutor.eval.compare import comparison_markdown

    runs = [{"method": m, "task": "gsm8k", "global_step": 2, "train_loss": 1.0, "wall_seconds": 1.0,
             "eval_history": [], "primary_metric": None} for m in ("next_token", "mutor")]
    md = comparison_markdown(runs)
    assert "final held-out evaluation" not in md
    assert "no held-out evaluation during training" in md and "mutor eval --task gsm8k --checkpoints" in md


def test_absent_offsets_are_nan_not_zero():
    from families import make_model, padded_batch

    from mutor import MuToRConfig, MuToRModel

    out = MuToRModel(make_model("llama"), MuToRConfig(d_max=4, loss_weight=0.3, seed=0))(
        **padded_batch(), offset_index=torch.tensor([0, 0, 2]))
    absent = out.reg_count_per_offset == 0
    assert absent.tolist() == [False, True, False, True]
    assert out.reg_loss_per_offset[absent].isnan().all() and out.reg_accuracy_per_offset[absent].isnan().all()
    assert torch.isfinite(out.reg_loss_per_offset[~absent]).all()


def test_sample_shows_progress(tmp_path, capsys):
    from mutor.image.tokens import ImageLayout

    layout = ImageLayout(codebook_size=4, num_classes=2, height=2, width=2, levels=4)
    from mutor.models.presets import tiny_causal_lm

    torch.manual_seed(0)
    tiny_causal_lm(layout.vocab_size, "tiny-llama").save_pretrained(tmp_path / "img")
    (tmp_path / "img" / "task_info.json").write_text(json.dumps({"task": "digits",
                                                                 "image_layout": layout.to_dict()}))
    capsys.readouterr()
    assert main(["sample", "--model", str(tmp_path / "img"), "--num-per-class", "1", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "sampling 2 images" in err and "4/4" in err
    assert os.path.isfile(tmp_path / "img" / "samples" / "codes.npy")


def test_unreachable_hub_dataset_is_one_line_error(monkeypatch):
    """A Hub dataset with no network and no local copy: one MutorUserError naming it, after one probe."""
    import huggingface_hub

    from mutor.data.text import load_rows
    from mutor.utils.errors import MutorUserError

    calls = []

    def no_network(*a, **kw):
        calls.append(a)
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "dataset_info", no_network)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(MutorUserError, match="dataset 'nobody/no-such-data': cannot reach the Hugging Face Hub"):
        load_rows(hub_id="nobody/no-such-data", split="test")
    assert len(calls) == 1


@pytest.mark.parametrize("task", ["gsm8k", "gsm_symbolic"])
def test_eval_task_run_on_a_text_benchmark_run_names_the_task_to_use(tmp_path, capsys, task):
    """``--task run`` on a run of a text benchmark (gsm_symbolic included) says which --task to use."""
    (tmp_path / "recipe.yaml").write_text(f"method: mutor\ndata:\n  task: {task}\n")
    _one_line_error(capsys, ["eval", "--task", "run", "--model", str(tmp_path)], f"--task {task}", "text task")
