"""What a new user types, and what comes back: bad input ends as one line naming the problem, exit status 2, with
nothing written; the small promises of the command line (``--version``, help for every option, the README's
command table) hold.

Each test goes through the command line's ``main()`` as a user's command does. Rows are counted from 1 in every
message (a JSON Lines file's line); an empty field or turn is refused like a missing one; a model path that is not
there is named before anything else is read; held-out rows are evaluated during training unless the recipe says
otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path

import pytest

from mutor.run.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src/mutor/configs/tiny/data"
PC = DATA / "prompt_completion_tiny.jsonl"
CHAT = DATA / "chat_tiny.jsonl"


def _one_line(capsys, argv, *needles) -> str:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"mutor {argv[0]}: "), err
    for n in needles:
        assert n in err, (n, err)
    return err


def _rows(path: Path, n: int = 6) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()[:n]]


def _write(path: Path, rows: list, blank_after: int = -1) -> Path:
    lines = [json.dumps(r) for r in rows]
    if blank_after >= 0:
        lines.insert(blank_after + 1, "")
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------- empty fields and turns
@pytest.mark.parametrize("value, state", [("", "has an empty 'completion'"),
                                          ("  \n ", "has only whitespace in 'completion'")])
def test_an_empty_field_is_refused_by_file_row_and_field(tmp_path, capsys, value, state):
    rows = _rows(PC)
    rows[2]["completion"] = value
    bad = _write(tmp_path / "bad.jsonl", rows)
    out = tmp_path / "run"
    for key in ("path", "eval_path"):
        _one_line(capsys, ["train", "tiny/prompt-completion", "method=next_token", f"data.{key}={bad}",
                           "--output-dir", out, "--quiet"], f"data.{key} '{bad}'", f"row 3 {state}")
        assert not out.exists()
    model = tmp_path / "model"                    # the rows are checked before a model is loaded
    model.mkdir()
    _one_line(capsys, ["eval", "--task", "prompt_completion", "--model", model, "--data", bad, "--output-dir", out,
                       "--quiet"], f"--data '{bad}'", f"row 3 {state}")
    assert not out.exists()


def test_an_empty_chat_turn_is_refused_by_row_and_turn(tmp_path, capsys):
    rows = _rows(CHAT)
    turns = rows[1]["messages"]
    last = max(i for i, m in enumerate(turns) if m["role"] == "assistant")
    turns[last]["content"] = ""
    bad = _write(tmp_path / "bad.jsonl", rows)
    _one_line(capsys, ["train", "tiny/chat", "method=next_token", f"data.path={bad}", "--output-dir",
                       tmp_path / "run", "--quiet"], f"data.path '{bad}'",
              f"row 2: turn {last + 1} of 'messages' (assistant) has empty content")
    assert not (tmp_path / "run").exists()


def test_an_empty_system_turn_is_kept(tmp_path):
    from mutor.data.registry import build_training_data
    from mutor.testing import byte_tokenizer

    rows = _rows(CHAT, 4)
    rows[0]["messages"] = [{"role": "system", "content": ""}] + [m for m in rows[0]["messages"]
                                                                 if m["role"] != "system"]
    data = build_training_data("chat", {"path": str(_write(tmp_path / "c.jsonl", rows))}, byte_tokenizer(), 0)
    assert len(data.train_dataset) == 4


# --------------------------------------------------------------------------------- row numbers
def test_rows_are_counted_from_1_and_a_blank_line_is_named(tmp_path, capsys):
    """Row N is line N of a JSON Lines file; where a blank line makes them differ the message names the line."""
    rows = _rows(PC, 3)
    del rows[2]["completion"]
    plain = _write(tmp_path / "plain.jsonl", rows)
    _one_line(capsys, ["train", "tiny/prompt-completion", "method=next_token", f"data.path={plain}",
                       "--output-dir", tmp_path / "run", "--quiet"], "row 3 has no 'completion'")
    blank = _write(tmp_path / "blank.jsonl", rows, blank_after=0)
    _one_line(capsys, ["train", "tiny/prompt-completion", "method=next_token", f"data.path={blank}",
                       "--output-dir", tmp_path / "run", "--quiet"], "row 3 (line 4) has no 'completion'")
    chat = _rows(CHAT, 3)
    chat[0]["messages"] = "not turns"
    bad = _write(tmp_path / "chat.jsonl", chat)
    _one_line(capsys, ["train", "tiny/chat", "method=next_token", f"data.path={bad}", "--output-dir",
                       tmp_path / "run", "--quiet"], "row 1: 'messages' must be a list")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------- missing model paths
@pytest.mark.parametrize("argv, needle", [
    (["--task", "prompt_completion", "--model", "/no/such/dir"], "--model '/no/such/dir' does not exist"),
    (["--task", "prompt_completion", "--model", "/no/such/dir", "--data", str(PC)],
     "--model '/no/such/dir' does not exist"),
    (["--task", "chat", "--model", "./no-such-run", "--scorer", "nope:f"], "--model './no-such-run' does not exist"),
    (["--task", "gsm8k", "--model", "/no/such/dir"], "--model '/no/such/dir' does not exist"),
    (["--task", "run", "--model", "no-such-run"], "--model 'no-such-run' does not exist"),
    (["--task", "prompt_completion", "--model", "runs/no-such-run"], "--model 'runs/no-such-run' does not exist"),
    (["--task", "prompt_completion", "--checkpoints", "runs/no-such-run"],
     "--checkpoints 'runs/no-such-run' does not exist"),
])
def test_a_model_path_that_is_not_there_is_named_first(argv, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, ["eval", *argv, "--output-dir", tmp_path / "out"], needle)
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------- recipe keys
@pytest.mark.parametrize("bad", ["data.promt_template=x", "training.learning_rate=-1", "data.path=no-such.jsonl"])
def test_a_refused_recipe_leaves_no_directory_where_it_would_have_written(bad, tmp_path, capsys, monkeypatch):
    """The recipe's own output directory (``runs/prompt-completion`` from the working directory): neither it nor
    the ``runs/`` it would have created is left behind."""
    monkeypatch.chdir(tmp_path)
    _one_line(capsys, ["train", "tiny/prompt-completion", bad])
    assert not list(tmp_path.iterdir())


def test_a_misspelt_data_key_gets_the_closest_and_every_key(tmp_path, capsys):
    from mutor.data.registry import RUN_KEYS
    from mutor.run.arguments import DataArguments

    assert set(RUN_KEYS) == {f.name for f in dataclasses.fields(DataArguments) if f.init}
    err = _one_line(capsys, ["train", "tiny/prompt-completion", "data.promt_template=x", "--output-dir",
                             tmp_path / "run"], "['promt_template']", "did you mean 'prompt_template'?")
    known = eval(re.findall(r"\[[^\[\]]*\]", err)[-1])
    assert {"packing", "truncate_to_model", "task", "prompt_template", "completion_template", "path"} <= set(known)
    _one_line(capsys, ["train", "tiny/chat", "data.mesages_field=m", "--output-dir", tmp_path / "run"],
              "did you mean 'messages_field'?", "'truncate_to_model'")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, needle", [
    ("training.learning_rate=-1", "recipe training.learning_rate: must be > 0, got -1"),
    ("training.learning_rate=0", "recipe training.learning_rate: must be > 0, got 0"),
    ("training.per_device_train_batch_size=0", "recipe training.per_device_train_batch_size: must be >= 1, got 0"),
    ("training.gradient_accumulation_steps=0", "recipe training.gradient_accumulation_steps: must be >= 1"),
    ("training.save_steps=-5", "recipe training.save_steps: must be > 0, got -5"),
])
def test_out_of_range_training_numbers_are_refused_when_the_recipe_is_read(override, needle, tmp_path, capsys,
                                                                           monkeypatch):
    import mutor.run.train as train

    def must_not_run(*a, **k):
        raise AssertionError("built a model before refusing the recipe")

    monkeypatch.setattr(train, "build_base_model", must_not_run)
    _one_line(capsys, ["train", "tiny/prompt-completion", override, "--output-dir", tmp_path / "run"], needle)
    assert not (tmp_path / "run").exists()


def test_a_bad_training_number_in_a_file_names_its_line(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text((ROOT / "src/mutor/configs/tiny/prompt-completion.yaml").read_text()
                      .replace("learning_rate: 1.0e-3", "learning_rate: -1.0e-3")
                      .replace("data/prompt_completion_tiny.jsonl", str(PC)))
    line = next(i for i, t in enumerate(recipe.read_text().splitlines(), 1) if "learning_rate" in t)
    _one_line(capsys, ["train", recipe, "--output-dir", tmp_path / "run"],
              f"{recipe}: line {line}: recipe training.learning_rate: must be > 0, got -0.001")


# ------------------------------------------------------------------------- held-out evaluation
def test_held_out_rows_are_evaluated_during_training_unless_turned_off(tmp_path, capsys):
    """A recipe with data.eval_path and no training.eval_strategy evaluates at the checkpoints' cadence and says so;
    the end table then shows the held-out numbers. An explicit eval_strategy, `no` included, is kept."""
    from mutor.run.recipe import load_recipe

    out = tmp_path / "run"
    assert main(["train", "tiny/chat", "training.max_steps=2", "training.save_steps=1", "training.logging_steps=1",
                 "training.report_to=[]", "data.limit=8", "data.eval_limit=2", "--output-dir", out]) == 0
    printed = capsys.readouterr().out
    assert "data.eval_path is set and training.eval_strategy is not: evaluating the held-out rows every step" \
        in printed, printed
    assert "final held-out evaluation" in printed and "has no held-out evaluation" not in printed, printed
    for method in ("next_token", "mutor"):
        history = json.loads((out / method / "summary.json").read_text())["eval_history"]
        assert [h["eval_step"] for h in history] == [1, 2] and all("eval_ntp_loss" in h for h in history)
    assert "eval_strategy" not in load_recipe(str(out / "mutor" / "recipe.yaml")).training   # recorded as written

    off = load_recipe("tiny/chat", ["training.eval_strategy=no"])
    args = off.training_arguments(tmp_path / "x")
    assert str(getattr(args.eval_strategy, "value", args.eval_strategy)) == "no" and off.held_out_notice(args) is None
    own = load_recipe("tiny/chat", ["training.eval_steps=3"])
    args = own.training_arguments(tmp_path / "x")
    assert args.eval_steps == 3 and getattr(args.eval_strategy, "value", args.eval_strategy) == "steps"
    none = load_recipe("tiny/prompt-completion")              # no held-out rows: transformers' default
    assert getattr(none.training_arguments(tmp_path / "x").eval_strategy, "value", None) == "no"


# ------------------------------------------------------------------------------ the command line
def test_version(capsys):
    import mutor

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"mutor {mutor.__version__}"


def test_every_option_of_every_command_has_help():
    def undocumented(parser: argparse.ArgumentParser, name: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for command, sub in action.choices.items():
                    yield from undocumented(sub, f"mutor {command}")
            elif not action.help:
                yield f"{name} {'/'.join(action.option_strings) or action.dest}"

    assert list(undocumented(build_parser(), "mutor")) == []


def test_the_readme_command_table_names_the_own_data_tasks():
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| command | what it does |"):].split("\n\n")[0]
    eval_row = next(line for line in table.splitlines() if line.startswith("| `mutor eval"))
    assert "`prompt_completion`" in eval_row and "`chat`" in eval_row and "`run`" in eval_row
    assert "`mutor --version`" in table


def test_the_own_data_page_says_which_offsets_d_max_4_predicts():
    from mutor import MuToRConfig

    cfg = MuToRConfig(d_max=4)
    assert (cfg.min_offset, cfg.d_max) == (1, 4)
    row = next(line for line in (ROOT / "docs/own-data.md").read_text().splitlines() if "| `mutor.d_max` |" in line)
    assert "1 to 4 tokens ahead" in row and "2 to 4" not in row


# --------------------------------------------------------------------------------- JSON output
def test_summaries_can_be_written_as_strict_json(tmp_path):
    from mutor.utils.io import write_json_atomic

    with pytest.raises(ValueError, match="not written"):
        write_json_atomic(tmp_path / "s.json", {"metrics": {"f": float("nan")}}, allow_nan=False)
    assert not (tmp_path / "s.json").exists() and not list(tmp_path.iterdir())
    write_json_atomic(tmp_path / "s.json", {"metrics": {"f": 1.0}}, allow_nan=False)
    assert json.loads((tmp_path / "s.json").read_text(), parse_constant=pytest.fail) == {"metrics": {"f": 1.0}}
