"""experiments/evidence/reproduce.py: one committed evidence row trained and scored again into a scratch directory,
printed beside the committed row, with the tolerance that counts as reproduced (identical per-example scores, or a
score within the committed one's 95 % per-example interval); nothing in the checkout changes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import reproduce
from scipy.stats import t

ROOT = Path(__file__).resolve().parents[3]


def _row(scores: list[float], loss=None, loss_se=None, **extra) -> dict:
    return {"group": "g", "run": "mutor_s0", "primary": "accuracy", **extra,
            "splits": {"test": {"n": len(scores), "per_example": scores, "answer_loss": loss,
                                "answer_loss_se": loss_se}}}


def test_identical_scores_are_identical_and_the_tolerance_is_the_committed_scores_95_percent_interval():
    scores = [1.0] * 150 + [0.0] * 150                                      # 50 % of 300
    (line,) = reproduce.compare(_row(scores), _row(list(scores)))
    sd = 100 * math.sqrt(0.25 * 300 / 299)                                  # the points' s.d.
    assert line["tolerance"] == pytest.approx(t.ppf(0.975, 299) * sd / math.sqrt(300))   # 5.69 points
    assert (line["status"], line["same_items"], line["difference"]) == ("identical", 300, 0.0)
    assert reproduce.reproduced([line])


def test_a_few_answers_flipped_are_within_tolerance_and_many_are_not():
    scores = [1.0] * 150 + [0.0] * 150
    few = [0.0] * 5 + scores[5:]                                            # -1.7 points
    (line,) = reproduce.compare(_row(scores), _row(few))
    assert line["status"] == "within tolerance" and line["same_items"] == 295
    assert line["difference"] == pytest.approx(-100 * 5 / 300)
    many = [0.0] * 30 + scores[30:]                                         # -10 points, beyond 5.69
    (line,) = reproduce.compare(_row(scores), _row(many))
    assert line["status"] == "NOT reproduced" and not reproduce.reproduced([line])
    assert "| test | exact match (points) | 50.0 | 40.0 | -10.0 | 5.7 | 270/300 | - | NOT reproduced |" in \
        reproduce.table([line])


def test_answers_and_answer_loss_are_compared_too():
    scores = [1.0, 0.0, 1.0, 1.0]
    lines = reproduce.compare(_row(scores, 0.5, 0.01), _row(scores, 0.51, 0.01), ["test"],
                              {"test": ["a", "b", "c", "d"]}, {"test": ["a", "b", "x", "d"]})
    em, loss = lines
    assert em["same_answers"] == 3 and em["status"] == "identical"          # the scores agree, one text differs
    assert loss["measure"] == "answer loss (nats)" and loss["tolerance"] == pytest.approx(t.ppf(0.975, 3) * 0.01)
    assert loss["status"] == "within tolerance"
    far = reproduce.compare(_row(scores, 0.5, 0.01), _row(scores, 0.6, 0.01))[1]
    assert far["status"] == "NOT reproduced"
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
    assert "| test | exact match (points) |" in again.stdout and "| 4/4 | 4/4 | identical |" in again.stdout
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
    import gzip

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
    assert row["reproduced"] and not row["identical"] and row["code"] == "bbb"
    assert report.reproduction_path(results, "g", "mutor_s0", "test").read_bytes() == answers.read_bytes()
    table = report.reproductions_table([row])
    assert "| g | mutor_s0 | test | exact match (points) |" in table
    assert "| 3/4 | within tolerance | aaa, bbb | 1, 2 |" in table
    older = {k: v for k, v in row.items() if k != "committed_threads"}      # recorded before the field existed
    assert "| aaa, bbb | 1, 2 |" in report.reproductions_table([older], [committed])
    assert "| aaa, bbb | ?, 2 |" in report.reproductions_table([older])
    assert "no; trained again: test" in report.runs_table([{**committed, "method": "mutor", "tag": "", "seed": 0,
                                                            "epochs": 1, "selected_checkpoint": "checkpoint-1",
                                                            "train_cpu_seconds": 1, "peak_rss_gb": 1}], results)


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
