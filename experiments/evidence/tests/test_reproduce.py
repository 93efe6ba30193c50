"""experiments/evidence/reproduce.py: one committed evidence row trained and scored again into a scratch directory,
printed beside the committed row and judged by the reproduction rule (report.REPRODUCED: identical per-example
scores, or every reading the row enters unchanged with the fresh row in its place); nothing in the checkout
changes."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import reproduce

ROOT = Path(__file__).resolve().parents[3]


def _row(scores: list[float], loss=None, loss_se=None, **extra) -> dict:
    return {"group": "g", "run": "mutor_s0", "primary": "accuracy", **extra,
            "splits": {"test": {"n": len(scores), "per_example": scores, "answer_loss": loss,
                                "answer_loss_se": loss_se}}}


def _group(mutor: list[float], **extra) -> list[dict]:
    """Next-token at 50 % and MuToR, seeds 0-2 of 300 items: MuToR at ``mutor`` on every seed."""
    base = [1.0] * 150 + [0.0] * 150
    return [_row(list(base), run=f"next_token_s{s}", method="next_token", seed=s, tag="", **extra)
            for s in range(3)] + \
           [_row(list(mutor), run=f"mutor_s{s}", method="mutor", seed=s, tag="", **extra) for s in range(3)]


def test_identical_scores_are_identical_whatever_the_readings():
    scores = [1.0] * 150 + [0.0] * 150                                      # 50 % of 300
    (line,) = reproduce.compare(_row(scores), _row(list(scores)))
    assert (line["status"], line["same_items"], line["difference"], line["readings"]) == ("identical", 300, 0.0, 0)
    assert "tolerance" not in line and reproduce.reproduced([line])


def test_flipped_answers_reproduce_the_row_only_where_every_reading_it_enters_is_unchanged():
    rows = _group([1.0] * 180 + [0.0] * 120)                                # MuToR +10 points on every seed: a finding
    committed = rows[3]
    few = dict(committed, splits={"test": {"n": 300, "per_example": [0.0] * 5 + committed["splits"]["test"]
                                           ["per_example"][5:]}})          # -1.7 points: still better
    (line,) = reproduce.compare(committed, few, rows=rows)
    assert line["status"] == "readings unchanged" and line["same_items"] == 295 and line["readings"] == 1
    assert line["difference"] == pytest.approx(-100 * 5 / 300) and line["moved"] == pytest.approx(100 * 5 / 900)
    assert reproduce.reproduced([line])
    many = dict(committed, splits={"test": {"n": 300, "per_example": [0.0] * 90 + [1.0] * 90 + [0.0] * 120}})
    (line,) = reproduce.compare(committed, many, rows=rows)                 # 30 %: the mean gap falls to 0
    assert line["status"] == "NOT reproduced" and not reproduce.reproduced([line])
    assert line["changed"] == ["g: mutor - next_token: better than next-token (+10.0 [+8.0, +12.0]) -> not shown "
                               "(+0 [-43, +43])"]
    assert "| test | exact match (points) | 60.0 | 30.0 | -30.0 | 210/300 | - | 1; changed: g: mutor - next_token:" \
        in reproduce.table([line], committed)
    (line,) = reproduce.compare(committed, few)                             # alone it enters no reading
    assert line["status"] == "NOT reproduced" and line["readings"] == 0


def test_a_not_shown_reading_whose_mean_changes_sign_is_a_changed_reading():
    rows = _group([1.0] * 151 + [0.0] * 149)                                # +0.3 points: not shown
    committed = rows[3]
    fresh = dict(committed, splits={"test": {"n": 300, "per_example": [0.0] * 5 + [1.0] * 146 + [0.0] * 149}})
    (line,) = reproduce.compare(committed, fresh, rows=rows)
    assert line["status"] == "NOT reproduced" and "not shown (+0.3" in line["changed"][0]
    assert "-> not shown (-0.2" in line["changed"][0]                       # the mean's sign flipped


def test_answers_and_answer_loss_are_compared_too():
    scores = [1.0, 0.0, 1.0, 1.0]
    lines = reproduce.compare(_row(scores, 0.5, 0.01), _row(scores, 0.51, 0.01), ["test"],
                              {"test": ["a", "b", "c", "d"]}, {"test": ["a", "b", "x", "d"]})
    em, loss = lines
    assert em["same_answers"] == 3 and em["status"] == "identical"          # the scores agree, one text differs
    assert loss["measure"] == "answer loss (nats)" and loss["status"] == "NOT reproduced"   # no reading to judge by
    assert reproduce.compare(_row(scores, 0.5, 0.01), _row(scores, 0.5, 0.01))[1]["status"] == "identical"
    rows = [dict(r, splits={"test": {**r["splits"]["test"], "answer_loss": 0.5 + 0.1 * (r["method"] == "mutor"),
                                     "answer_loss_per_example": [0.5 + 0.1 * (r["method"] == "mutor") + 0.01 * i
                                                                 for i in range(300)]}})
            for r in _group([1.0] * 150 + [0.0] * 150)]
    committed = rows[3]
    fresh = dict(committed, splits={"test": {**committed["splits"]["test"], "answer_loss": 0.61,
                                             "answer_loss_per_example": [0.61 + 0.01 * i for i in range(300)]}})
    loss = reproduce.compare(committed, fresh, rows=rows)[1]
    assert (loss["status"], loss["same_items"], loss["readings"]) == ("readings unchanged", 0, 1)
    with pytest.raises(SystemExit, match="not in both rows"):
        reproduce.compare(_row(scores), _row(scores), ["validation"])


def test_the_recipe_note_says_whether_the_resolved_recipes_agree():
    a = {"resolved_recipe": {"seed": 0, "training": {"learning_rate": 1e-4, "max_steps": 4}}}
    assert reproduce.recipe_note(a, a) == "resolved recipe: the same as the committed row's"
    b = {"resolved_recipe": {"seed": 0, "training": {"learning_rate": 2e-4, "max_steps": 4}}}
    assert reproduce.recipe_note(a, b).endswith("DIFFERS from the committed row's in training.learning_rate")
    assert "records none" in reproduce.recipe_note({}, a)


def test_the_machine_note_names_what_differs_between_the_machines_the_two_runs_trained_on():
    import driver

    here = driver.machine()
    assert here["torch"] and here["transformers"] and here["python"] and here["cpu"]
    assert set(here["bf16_isa"]) <= {"avx512_bf16", "amx_bf16"}
    assert reproduce.machine_note({"machine": here}, {"machine": here}) == \
        "machine: the same kind as the committed row's"
    other = {**here, "cpu": "Another CPU", "bf16_isa": ["amx_bf16", "avx512_bf16"]}
    note = reproduce.machine_note({"machine": other}, {"machine": here})
    assert note.startswith("machine: DIFFERS from the committed row's in bf16_isa (")
    assert f"cpu (Another CPU -> {here['cpu']})" in note and "torch" not in note
    assert reproduce.machine_note({}, {"machine": here}) == "machine: the committed row records none"


def test_start_sh_commits_nothing_unless_asked():
    text = (ROOT / "experiments/evidence/start.sh").read_text()
    launch = text[text.index("nohup python experiments/evidence/driver.py"):]
    assert "--commit" not in launch.split('"$@"')[0]                         # only what the caller passes


@pytest.mark.slow
def test_reproduce_trains_a_committed_row_again_into_scratch_and_finds_it_identical(tmp_path):
    """A tiny random model (no Hub): the driver writes a row, with its resolved recipe; reproduce.py trains and
    scores the same run in a scratch directory, prints it beside the committed row and finds every answer the
    same (one CPU, one thread: deterministic). The committed results file is not touched."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""runs_dir: {tmp_path}/runs
results: {tmp_path}/results.jsonl
groups:
  - name: tiny
    recipe: tiny/gsm8k
    epochs: 2
    steps_per_epoch: 2
    save_every: 2
    overrides: ["training.report_to=[]", training.logging_steps=1]
    runs:
      - {{method: mutor, seed: 0}}
    eval:
      task: gsm8k
      data: src/mutor/configs/tiny/data/gsm8k_tiny.jsonl
      limit: 4
      max_new_tokens: 4
      batch_size: 4
""")
    run = lambda *a: subprocess.run([sys.executable, *map(str, a)], capture_output=True, text=True, cwd=ROOT,  # noqa: E731
                                    timeout=600)
    first = run(ROOT / "experiments/evidence/driver.py", "--plan", plan)
    assert first.returncode == 0 and "row written" in first.stdout, first.stdout + first.stderr
    committed = (tmp_path / "results.jsonl").read_text()
    row = json.loads(committed)
    assert row["resolved_recipe"]["method"] == "mutor" and row["resolved_recipe"]["training"]["max_steps"] == 4
    assert "output_dir" not in row["resolved_recipe"]["training"] and "source_dir" not in row["resolved_recipe"]
    again = run(ROOT / "experiments/evidence/reproduce.py", "tiny/mutor_s0", "--plan", plan,
                "--scratch", tmp_path / "scratch")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "| test | exact match (points) |" in again.stdout and "| 4/4 | 4/4 | none | identical |" in again.stdout
    assert "resolved recipe: the same as the committed row's" in again.stdout
    assert row["machine"]["torch"] and "machine: the same kind as the committed row's" in again.stdout
    assert again.stdout.rstrip().endswith("reproduced (identical)")
    assert (tmp_path / "results.jsonl").read_text() == committed              # the committed rows unchanged
    fresh = json.loads((tmp_path / "scratch" / "results.jsonl").read_text())
    assert fresh["splits"]["test"]["per_example"] == row["splits"]["test"]["per_example"]
    assert (tmp_path / "scratch" / "generations" / "tiny" / "mutor_s0" / "test.jsonl.gz").is_file()
    recorded = run(ROOT / "experiments/evidence/reproduce.py", "tiny/mutor_s0", "--plan", plan,
                   "--scratch", tmp_path / "scratch", "--record")            # scored again, not trained again
    assert recorded.returncode == 0 and "recorded in" in recorded.stdout, recorded.stdout + recorded.stderr
    (verdict,) = [json.loads(x) for x in (tmp_path / "reproductions.jsonl").read_text().splitlines()]
    assert verdict["reproduced"] and verdict["identical"] and verdict["lines"][0]["same_items"] == 4
    assert verdict["machine"] == "machine: the same kind as the committed row's"
    assert (tmp_path / "reproductions" / "tiny" / "mutor_s0" / "test.jsonl.gz").is_file()
    assert (tmp_path / "results.jsonl").read_text() == committed
    missing = run(ROOT / "experiments/evidence/reproduce.py", "tiny/next_token_s0", "--plan", plan)
    assert missing.returncode != 0 and "no such run" in missing.stderr


def test_a_recorded_reproduction_is_kept_beside_the_rows_and_reported(tmp_path):
    import report

    results = tmp_path / "results.jsonl"
    committed = _row([1.0, 0.0, 1.0, 1.0], code="aaa", threads=1)
    fresh = _row([1.0, 0.0, 0.0, 1.0], code="bbb", threads=2)
    answers = tmp_path / "fresh.jsonl.gz"
    with gzip.open(answers, "wt") as f:
        f.write('{"generation": "x"}\n')
    lines = reproduce.compare(committed, fresh)
    for _ in range(2):                                     # recorded twice: the later replaces the earlier
        reproduce.record(results, committed, fresh, lines, {"test": answers})
    (row,) = report.load(results.with_name("reproductions.jsonl"))
    assert not row["reproduced"] and not row["identical"] and row["code"] == "bbb" and "rule" in row
    assert report.reproduction_path(results, "g", "mutor_s0", "test").read_bytes() == answers.read_bytes()
    assert json.loads(report.reproduction_row_path(results, "g", "mutor_s0").read_text()) == fresh
    table = report.reproductions_table([row])
    assert "| g | mutor_s0 | test | exact match (points) |" in table
    assert "| 3/4 | - | NOT reproduced | aaa, bbb | 1, 2 |" in table                  # it enters no reading
    older = {k: v for k, v in row.items() if k != "committed_threads"}      # recorded before the field existed
    assert "| aaa, bbb | 1, 2 |" in report.reproductions_table([older], [committed])
    assert "| aaa, bbb | ?, 2 |" in report.reproductions_table([older])
    assert "no; trained again: test" in report.runs_table([{**committed, "method": "mutor", "tag": "", "seed": 0,
                                                            "epochs": 1, "selected_checkpoint": "checkpoint-1",
                                                            "train_cpu_seconds": 1, "peak_rss_gb": 1}], results)


def test_the_report_judges_every_recorded_reproduction_again_against_the_rows_as_they_are(tmp_path):
    """A verdict recorded by an earlier rule is not taken as it was: report.py rebuilds the fresh row (from its
    kept row.json, or, recorded without one, from the fresh answers' per-example scores) and judges it by the rule
    against the committed rows, whose readings it enters."""
    import report

    results = tmp_path / "results.jsonl"
    rows = _group([1.0] * 180 + [0.0] * 120)                                # MuToR +10 on every seed: a finding
    committed = rows[3]
    flipped = [0.0] * 5 + committed["splits"]["test"]["per_example"][5:]
    older = {"group": "g", "run": "mutor_s0", "same_precision": True, "precision": "precision: the same",
             "lines": [{"split": "test", "measure": "exact match (points)", "committed": 60.0, "fresh": 100 * 175 / 300,
                        "difference": -100 * 5 / 300, "tolerance": 5.6, "n": 300, "same_items": 295,
                        "same_answers": None, "status": "within tolerance"}]}
    path = report.reproduction_path(results, "g", "mutor_s0", "test")
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:                                         # the fresh answers, scored
        f.write("".join(json.dumps({"generation": "x", "accuracy": 100.0 * v}) + "\n" for v in flipped))
    (judged,) = report.rejudged(results, rows, [older])
    (line,) = judged["lines"]
    assert line["verdict"] == "readings unchanged" and line["judged"]["same_items"] == 295
    assert "1, unchanged (means moved by 0.6 at most) | readings unchanged |" in \
        report.reproductions_table([judged], rows, judged=True)
    assert "1 not identical with every reading unchanged" in report.reproductions_summary([judged])
    assert "295/300 to 295/300" in report.reproductions_summary([judged])
    fresh = dict(committed, splits={"test": {"n": 300, "per_example": [0.0] * 90 + [1.0] * 90 + [0.0] * 120}})
    report.reproduction_row_path(results, "g", "mutor_s0").write_text(json.dumps(fresh))  # kept: it is judged by it
    (judged,) = report.rejudged(results, rows, [older])
    assert judged["lines"][0]["verdict"] == "NOT reproduced"
    assert "1 NOT reproduced" in report.reproductions_summary([judged])
    other = dict(older, same_precision=False, precision="precision: DIFFERS")
    assert report.rejudged(results, rows, [other])[0]["lines"][0]["verdict"] == "not comparable: precision: DIFFERS"


def test_reproductions_recorded_side_by_side_keep_both_verdicts(tmp_path, monkeypatch):
    import threading
    import time

    import report

    slow = report.load

    def load(path):                                 # a wide window between reading the file and writing it back
        rows = slow(path)
        time.sleep(0.3)
        return rows

    monkeypatch.setattr(reproduce, "load", load)
    results = tmp_path / "results.jsonl"
    rows = [_row([1.0, 0.0], run=f"mutor_s{s}") for s in (0, 1)]
    threads = [threading.Thread(target=reproduce.record, args=(results, r, r, reproduce.compare(r, r), {}))
               for r in rows]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(r["run"] for r in slow(results.with_name("reproductions.jsonl"))) == ["mutor_s0", "mutor_s1"]


def test_a_run_trained_in_another_precision_is_not_read_as_reproduced(tmp_path):
    import report

    bf16 = {"model_dtype": "bfloat16", "bf16_autocast": True, "fallback": None}
    fp32 = {"model_dtype": "float32", "bf16_autocast": False, "fallback": "no fast bf16 on this CPU"}
    committed, fresh = _row([1.0, 0.0], precision=bf16), _row([1.0, 0.0], precision=fp32)
    assert reproduce.same_precision(committed, dict(committed)) and not reproduce.same_precision(committed, fresh)
    assert reproduce.precision_note(committed, fresh).startswith("precision: DIFFERS: committed bfloat16 weights")
    results = tmp_path / "results.jsonl"
    answers = tmp_path / "fresh.jsonl.gz"
    answers.write_bytes(b"")
    reproduce.record(results, committed, fresh, reproduce.compare(committed, fresh), {"test": answers})
    assert not report.reproduction_path(results, "g", "mutor_s0", "test").exists()   # not the row's answers
    (row,) = report.load(results.with_name("reproductions.jsonl"))
    assert not row["reproduced"] and not row["same_precision"]         # identical scores, another experiment
    assert "not comparable: precision: DIFFERS" in report.reproductions_table([row])
