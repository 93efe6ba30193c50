"""Your own data through every command, from the user's side.

The CLI in a subprocess on tiny random models and the shipped tiny data, nothing from the Hub: train on
prompt/completion rows, score the run with ``mutor eval --task prompt_completion`` (exact match, and a metric
of one's own through ``--scorer``, a module on ``PYTHONPATH``), compare the methods with ``mutor compare``;
train and score chat data (a ``messages`` column, the loss on assistant turns only). Each malformed input ends
as one line naming the file and row (or line, or function), exit status 2, with nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mutor.core.layout import IGNORE_INDEX
from mutor.run.cli import main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src/mutor/configs/tiny/data"
PC = DATA / "prompt_completion_tiny.jsonl"
CHAT = DATA / "chat_tiny.jsonl"
QUICK = ["training.max_steps=2", "training.save_steps=1", "training.per_device_train_batch_size=4",
         "training.report_to=[]", "data.limit=16"]
FAST_EVAL = ["--limit", "4", "--max-new-tokens", "4", "--batch-size", "4", "--quiet"]


def _mutor(*args, cwd: Path, pythonpath: Path = None) -> subprocess.CompletedProcess:
    """``python -m mutor ARGS`` as a user runs it: offline, in ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "mutor", *map(str, args)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def _ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def pc_run(tmp_path_factory) -> Path:
    """tiny/prompt-completion trained for two steps with both methods (checkpoints at steps 1 and 2)."""
    root = tmp_path_factory.mktemp("own") / "pc"
    _ok(_mutor("train", "tiny/prompt-completion", *QUICK, f"training.output_dir={root}", "--quiet", cwd=root.parent))
    return root


# ---------------------------------------------------------------- prompt/completion
def test_train_eval_compare_on_own_prompt_completion_data(pc_run):
    """What `mutor train` advises works as printed; the summaries are compare's method x task table."""
    advised = (pc_run / "comparison.md").read_text()
    assert "mutor eval --task prompt_completion --checkpoints" in advised
    _ok(_mutor("eval", "--task", "prompt_completion", "--checkpoints", pc_run / "mutor", *FAST_EVAL, cwd=pc_run))
    sel = json.loads((pc_run / "mutor" / "eval" / "prompt_completion" / "summary.json").read_text())
    assert sel["task"] == "prompt_completion" and sel["primary"] == "exact_match" and sel["method"] == "mutor"
    assert [c["checkpoint"] for c in sel["per_checkpoint"]] == ["checkpoint-1", "checkpoint-2"]
    assert sel["data"] == str(PC) and "training rows" in sel["note"]      # the recipe names no eval_path
    rows = _jsonl(pc_run / "mutor" / "eval" / "prompt_completion" / sel["selected_checkpoint"] / "test" /
                  "generations.jsonl")
    first = json.loads(PC.read_text().splitlines()[0])
    assert len(rows) == 4 and rows[0]["prompt"] == first["prompt"] + "\nAnswer:"          # the run's templates
    assert rows[0]["reference"] == " " + first["completion"] and rows[0]["exact_match"] in (0.0, 100.0)

    _ok(_mutor("eval", "--task", "prompt_completion", "--model", pc_run / "next_token", "--data", PC, *FAST_EVAL,
               cwd=pc_run))
    summ = json.loads((pc_run / "next_token" / "eval" / "prompt_completion-test" / "summary.json").read_text())
    assert summ["n"] == 4 and summ["data"] == str(PC) and "note" not in summ

    table = _ok(_mutor("compare", pc_run / "mutor" / "eval", pc_run / "next_token" / "eval", cwd=pc_run)).stdout
    assert "| method | prompt_completion exact_match |" in table, table
    assert "| mutor |" in table and "| next_token |" in table


def test_exact_match_normalises_whitespace(pc_run):
    """A generation equal to the reference up to whitespace scores 100; the budget follows the references."""
    from mutor.eval.harness import evaluate_model, load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(pc_run / "mutor"), device="cpu")
    rows = _pc_rows(3)
    refs = [" " + r["completion"] for r in rows]
    answers = {r["prompt"] + "\nAnswer:": a for r, a in zip(rows, [
        "  " + refs[0].strip().replace(" ", "\n  ") + " ",        # the reference, whitespace aside: a match
        refs[1] + " extra",                                         # a longer answer: no match
        refs[2]])}

    def decode(prompts, n_new, eos_id):            # the "model" answers each prompt from the table above
        return [tok(answers[tok.decode(p, skip_special_tokens=True)], add_special_tokens=False)["input_ids"]
                for p in prompts]

    summary = evaluate_model("prompt_completion", str(pc_run / "mutor"), data=str(PC), limit=3, batch_size=1,
                             model_and_tokenizer=(model, tok), decode=decode, progress=False)
    assert summary["metrics"]["exact_match"] == pytest.approx(200 / 3)
    longest = max(len(tok(r, add_special_tokens=False)["input_ids"]) + 1 for r in refs)
    assert summary["max_new_tokens"] == max(16, 2 * longest)


def test_own_metric_through_scorer(pc_run, tmp_path):
    """``--scorer module:function`` from PYTHONPATH: called with (prediction, reference, row); a dict is one metric
    per key, the first ranking checkpoints; bools count 100 or 0."""
    (tmp_path / "my_metrics.py").write_text(
        "def overlap(prediction, reference, row):\n"
        "    words = set(reference.split())\n"
        "    assert row['completion'] == reference.strip() and 'prompt' in row\n"
        "    return {'overlap': len(words & set(prediction.split())) / len(words), 'short': len(prediction) < 9}\n")
    out = tmp_path / "scored"
    _ok(_mutor("eval", "--task", "prompt_completion", "--checkpoints", pc_run / "mutor", "--scorer",
               "my_metrics:overlap", "--output-dir", out, *FAST_EVAL, cwd=pc_run, pythonpath=tmp_path))
    sel = json.loads((out / "summary.json").read_text())
    assert sel["primary"] == "overlap" and set(sel["metrics"]) == {"overlap", "short"}
    assert sel["scorer"] == "my_metrics:overlap" and "overlap" in sel["per_checkpoint"][0]
    rows = _jsonl(out / sel["selected_checkpoint"] / "test" / "generations.jsonl")
    assert all(r["short"] in (0.0, 100.0) and 0.0 <= r["overlap"] <= 1.0 for r in rows)


# ------------------------------------------------------------------------------ chat
def test_chat_rows_put_loss_on_assistant_turns_only():
    """Labels are -100 everywhere but on the assistant turns (content and the eos closing it), of every turn."""
    from mutor.data.registry import build_training_data
    from mutor.testing import byte_tokenizer

    tok = byte_tokenizer()
    data = build_training_data("chat", {"path": str(CHAT), "limit": 8}, tok, 0)
    rows = [json.loads(line)["messages"] for line in CHAT.read_text().splitlines()[:8]]
    for ex, messages in zip(data.train_dataset, rows):
        supervised = tok.decode([i for i, lab in zip(ex["input_ids"], ex["labels"]) if lab != IGNORE_INDEX])
        assert supervised == "".join(m["content"] + "</s>" for m in messages if m["role"] == "assistant")
        assert tok.decode(ex["input_ids"]) == tok.apply_chat_template(messages, tokenize=False)


def test_a_conversation_the_chat_template_refuses_is_named_by_row():
    from mutor.data.registry import build_training_data
    from mutor.testing import byte_tokenizer
    from mutor.utils.errors import MutorUserError

    tok = byte_tokenizer()          # a template that, like some real ones, wants user and assistant to alternate
    tok.chat_template = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                         "{{ raise_exception('roles must alternate') }}{% endif %}{{ m['content'] }}{% endfor %}")
    with pytest.raises(MutorUserError, match=r"data.path '.*chat_tiny.jsonl': row 1: .*roles must alternate"):
        build_training_data("chat", {"path": str(CHAT)}, tok, 0)          # row 1 opens with a system turn


def test_train_and_eval_chat_data(tmp_path):
    run = tmp_path / "chat"
    _ok(_mutor("train", "tiny/chat", "method=mutor", *QUICK, f"training.output_dir={run}", "--quiet", cwd=tmp_path))
    _ok(_mutor("eval", "--task", "chat", "--checkpoints", run, *FAST_EVAL, cwd=tmp_path))
    sel = json.loads((run / "eval" / "chat" / "summary.json").read_text())
    assert sel["task"] == "chat" and sel["primary"] == "exact_match" and sel["n"] == 4
    assert sel["data"] == str(DATA / "chat_tiny_eval.jsonl") and "note" not in sel     # the recipe's eval_path
    assert "optimistic" in sel["selection"]                    # picked and reported on the same held-out rows
    assert sel["split"] == "validation" and sel["selected_on_reported_rows"]
    rows = _jsonl(run / "eval" / "chat" / sel["selected_checkpoint"] / "validation" / "generations.jsonl")
    conv = json.loads((DATA / "chat_tiny_eval.jsonl").read_text().splitlines()[0])["messages"]
    last = max(i for i, m in enumerate(conv) if m["role"] == "assistant")
    assert rows[0]["reference"] == conv[last]["content"]
    assert rows[0]["prompt"].endswith("<|assistant|>\n") and conv[last - 1]["content"] in rows[0]["prompt"]


# ------------------------------------------------------------------------ bad input
def _one_line(capsys, argv) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"mutor {argv[0]}: "), err
    return err


def _write(path: Path, lines: list) -> Path:
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


def _pc_rows(n: int = 6) -> list[dict]:
    return [json.loads(line) for line in PC.read_text().splitlines()[:n]]


def _chat_rows(n: int = 6) -> list[dict]:
    return [json.loads(line) for line in CHAT.read_text().splitlines()[:n]]


def test_bad_data_is_one_line_naming_file_and_row_or_line(tmp_path, capsys):
    no_completion = _pc_rows()
    del no_completion[3]["completion"]
    no_assistant = _chat_rows()
    no_assistant[2]["messages"] = [m for m in no_assistant[2]["messages"] if m["role"] != "assistant"]
    cases = {
        "no_completion.jsonl": (no_completion, "prompt-completion", ["row 4", "'completion'"]),   # line 4
        "no_assistant.jsonl": (no_assistant, "chat", ["row 3", "no assistant turn"]),
        "not_utf8.jsonl": ([_pc_rows(1)[0], b'{"prompt": "caf\xe9", "completion": "x"}'], "prompt-completion",
                           ["line 2 is not UTF-8", "0xe9"]),
        "truncated.jsonl": ([_pc_rows(1)[0], b'{"prompt": "a", "compl'], "prompt-completion",
                            ["line 2 is not valid JSON"]),
    }
    for name, (lines, recipe, needles) in cases.items():
        bad = _write(tmp_path / name, lines)
        out = tmp_path / f"run-{name}"
        err = _one_line(capsys, ["train", f"tiny/{recipe}", "method=next_token", f"data.path={bad}",
                                 "--output-dir", out, "--quiet"])
        assert f"data.path '{bad}'" in err and all(n in err for n in needles), err
        assert not out.exists()                                     # nothing half-written
        held_out = _one_line(capsys, ["train", f"tiny/{recipe}", "method=next_token", f"data.eval_path={bad}",
                                      "--output-dir", out, "--quiet"])
        assert f"data.eval_path '{bad}'" in held_out, held_out
        assert not out.exists()


def test_bad_eval_input_is_one_line(pc_run, tmp_path, capsys):
    no_completion = _write(tmp_path / "no_completion.jsonl", [r if i != 1 else {"prompt": r["prompt"]}
                                                              for i, r in enumerate(_pc_rows())])
    out = tmp_path / "out"
    cases = [
        (["--data", "/nope.jsonl"], ["--data '/nope.jsonl' does not exist"]),
        (["--data", no_completion], [f"--data '{no_completion}'", "row 2", "'completion'"]),
        (["--data", _write(tmp_path / "t.jsonl", [b'{"prompt": "a"']), "--limit", "1"], ["line 1 is not valid JSON"]),
        (["--scorer", "no_such_module:f"], ["--scorer 'no_such_module:f'", "cannot import no_such_module"]),
        (["--scorer", f"{tmp_path / 'metric.py'}:nope"], ["--scorer", "has no function 'nope'"]),
        (["--scorer", f"{tmp_path / 'metric.py'}:raises"], ["--scorer", ":raises' failed on row 1",
                                                           "ZeroDivisionError"]),
        (["--scorer", f"{tmp_path / 'metric.py'}:words"], ["--scorer", ":words' failed on row 1", "'yes'"]),
    ]
    (tmp_path / "metric.py").write_text("def raises(prediction, reference, row):\n    return 1 / 0\n\n"
                                        "def words(prediction, reference, row):\n    return 'yes'\n")
    for extra, needles in cases:
        err = _one_line(capsys, ["eval", "--task", "prompt_completion", "--model", pc_run / "mutor", "--limit", "2",
                                 "--max-new-tokens", "2", "--output-dir", out, "--quiet", *extra])
        assert all(n in err for n in needles), (extra, err)
        assert not out.exists(), extra
    err = _one_line(capsys, ["eval", "--task", "chat", "--model", pc_run / "mutor"])
    assert "a run of data.task 'prompt_completion'" in err and "--task prompt_completion" in err, err


def test_a_template_yaml_reads_as_a_mapping_is_refused_by_name(tmp_path, capsys):
    err = _one_line(capsys, ["train", "tiny/prompt-completion", "method=next_token", "data.prompt_template={prompt}",
                             "--output-dir", tmp_path / "run"])
    assert "data.prompt_template must be a string" in err and "quote" in err, err
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_without_chat_template_is_refused(tmp_path, capsys):
    from mutor.testing import byte_tokenizer

    tok = byte_tokenizer()
    tok.chat_template = None
    tok.save_pretrained(tmp_path / "tok")
    err = _one_line(capsys, ["train", "tiny/chat", "method=next_token", f"model.tokenizer={tmp_path / 'tok'}",
                             "--output-dir", tmp_path / "run"])
    assert "chat template" in err and str(tmp_path / "tok") in err, err
    assert not (tmp_path / "run").exists()


def test_a_bad_input_from_the_command_line_exits_2_with_one_line(pc_run, tmp_path):
    proc = _mutor("eval", "--task", "prompt_completion", "--model", pc_run / "mutor", "--data", "/nope.jsonl",
                  cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == "mutor eval: --data '/nope.jsonl' does not exist", \
        proc.stderr


def test_a_scorer_returning_nan_is_refused_by_scorer_and_row(pc_run, tmp_path, capsys):
    """summary.json is strict JSON: a NaN (or infinite) metric is refused in one line, nothing written."""
    (tmp_path / "nan_metric.py").write_text("def f(prediction, reference, row):\n"
                                            "    return {'ok': 1.0, 'ratio': float('nan') if row['prompt'] == "
                                            f"{_pc_rows(2)[1]['prompt']!r} else 1.0}}\n")
    out = tmp_path / "out"
    err = _one_line(capsys, ["eval", "--task", "prompt_completion", "--model", pc_run / "mutor", "--data", PC,
                             "--scorer", f"{tmp_path / 'nan_metric.py'}:f", "--output-dir", out, *FAST_EVAL])
    assert ":f' returned nan for 'ratio' on row 2 of" in err and str(PC) in err, err
    assert not out.exists()


def test_a_rerun_of_a_selection_replaces_its_outputs(pc_run, tmp_path):
    """`--checkpoints` again with other rows: the directory then holds that run's outputs only, and files of the
    user's own stay."""
    out = tmp_path / "sel"
    other = _write(tmp_path / "other.jsonl", _pc_rows(8)[4:])
    common = ["eval", "--task", "prompt_completion", "--checkpoints", pc_run / "mutor", "--output-dir", out,
              *FAST_EVAL]
    _ok(_mutor(*common, "--val-data", PC, "--data", other, cwd=tmp_path))        # picked on validation rows
    first = json.loads((out / "summary.json").read_text())
    assert first["selection_split"] == "validation" and (out / "checkpoint-1" / "validation").is_dir()
    (out / "notes.txt").write_text("mine")
    (out / "checkpoint-1" / "mine.txt").write_text("mine")
    (out / "checkpoint-1" / "validation" / "plot.png").write_bytes(b"mine")
    _ok(_mutor(*common, "--data", other, cwd=tmp_path))                          # picked and reported on `other`
    sel = json.loads((out / "summary.json").read_text())
    written = {p.parent.relative_to(out).as_posix() for p in out.rglob("summary.json")} - {"."}
    assert written == {f"{c['checkpoint']}/{sel['selection_split']}" for c in sel["per_checkpoint"]}, written
    assert all(json.loads((out / d / "summary.json").read_text())["data"] == str(other) for d in written)
    assert not (out / "checkpoint-2" / "validation").exists()                   # the earlier split's, removed
    assert (out / "notes.txt").read_text() == (out / "checkpoint-1" / "mine.txt").read_text() == "mine"
    assert (out / "checkpoint-1" / "validation" / "plot.png").read_bytes() == b"mine"
    assert not (out / "checkpoint-1" / "validation" / "summary.json").exists()
