"""The evidence harness (experiments/evidence): the shipped plan resolves, the driver runs what is missing
and skips what is done, resumes a killed run, and the report pairs runs by seed and reads them by the claim rule
(mutor.eval.claims: three seeds or more and a 95 % interval that excludes 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import driver
import pytest
import report
import torch
import tradeoff

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_plan_resolves_to_valid_recipes():
    from mutor.run.recipe import load_recipe

    _, runs = driver.load_plan(driver.HERE / "plan.yaml")
    assert runs and len({r.key for r in runs}) == len(runs)
    for r in runs:
        g = r.group
        recipe = load_recipe(g["recipe"], [*g.get("overrides", []), *r.overrides, f"training.max_steps={r.steps}",
                                           f"training.save_steps={g['save_every']}", f"method=[{r.method}]"])
        assert recipe.training["max_steps"] == r.steps
    methods = {(r.method, r.seed) for r in runs if not r.tag}
    assert {("next_token", s) for s in (0, 1, 2)} <= methods and {("mutor", s) for s in (0, 1, 2)} <= methods


def test_plan_refuses_a_run_declared_twice(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("runs_dir: r\nresults: r.jsonl\ngroups:\n"
                 "  - {name: g, recipe: tiny/gsm8k, epochs: 1, steps_per_epoch: 2,"
                 " eval: {task: gsm8k}, runs: [{method: mutor, seed: 0}, {method: mutor, seed: 0}]}\n")
    with pytest.raises(SystemExit, match="declared twice"):
        driver.load_plan(p)


# The reasoning-gym recipe's MuToR loss weight before the loss-weight sweep's pick moved it to 0.1: the weight every
# row of that recipe that records no resolved recipe, and no weight override, trained with.
REASONING_GYM_WEIGHT_AS_TRAINED = 0.3


def test_every_committed_row_resolves_to_the_loss_weight_it_trained_with():
    """What the driver and reproduce.py would train for each committed row (the plan's entry, with its as_trained
    values) has the loss weight the row trained with: the one its resolved recipe records, else its override, else
    the recipe's weight when it trained."""
    from mutor.run.recipe import load_recipe

    _, runs = driver.load_plan(driver.HERE / "plan.yaml")
    by_key = {r.key: r for r in runs}
    rows = report.load(driver.HERE / "results.jsonl")
    checked = 0
    for row in rows:
        run = by_key[(row["group"], row["run"])]
        now = load_recipe(run.group["recipe"], [*run.group.get("overrides", []), *run.overrides]).mutor["loss_weight"]
        trained = ((row.get("resolved_recipe") or {}).get("mutor") or {}).get("loss_weight")
        if trained is None:
            trained = next((float(o.split("=", 1)[1]) for o in row["overrides"] if o.startswith("mutor.loss_weight=")),
                           None)
        if trained is None and row["recipe"] == "real/smollm2-135m-reasoning-gym":
            trained = REASONING_GYM_WEIGHT_AS_TRAINED
        if trained is not None:
            assert now == trained, row["group"] + "/" + row["run"]
            checked += 1
        if row["method"] == "mutor":
            assert tradeoff.weight(row) == now, row["group"] + "/" + row["run"]
    assert checked >= 100


@pytest.mark.parametrize("entry, message", [
    ("{recipe: tiny/gsm8k, overrides: [mutor.loss_weight=0.3], groups: [nope]}", "does not declare"),
    ("{recipe: tiny/prompt-completion, overrides: [mutor.loss_weight=0.3], groups: [g]}", "which trains on"),
    ("{recipe: tiny/gsm8k, groups: [g]}", "no 'overrides'"),
])
def test_plan_refuses_an_as_trained_entry_that_does_not_fit_its_groups(tmp_path, entry, message):
    p = tmp_path / "plan.yaml"
    p.write_text(f"runs_dir: r\nresults: r.jsonl\nas_trained:\n  - {entry}\ngroups:\n"
                 "  - {name: g, recipe: tiny/gsm8k, epochs: 1, steps_per_epoch: 2, eval: {task: gsm8k},"
                 " runs: [{method: mutor, seed: 0}]}\n")
    with pytest.raises(SystemExit, match=message):
        driver.load_plan(p)


def test_as_trained_values_come_before_each_named_groups_own_overrides(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text("runs_dir: r\nresults: r.jsonl\n"
                 "as_trained: [{recipe: tiny/gsm8k, overrides: [mutor.loss_weight=0.3], groups: [old]}]\ngroups:\n"
                 "  - &g {name: old, recipe: tiny/gsm8k, epochs: 1, steps_per_epoch: 2, eval: {task: gsm8k},"
                 " overrides: &o [seed=1], runs: [{method: mutor, seed: 0}]}\n"
                 "  - {<<: *g, name: new}\n"
                 "  - {<<: *g, name: mine, overrides: [mutor.loss_weight=0.2]}\n")
    plan, runs = driver.load_plan(p)
    assert [r.group["overrides"] for r in runs] == [["mutor.loss_weight=0.3", "seed=1"], ["seed=1"],
                                                     ["mutor.loss_weight=0.2"]]


def test_driver_trains_no_further_run_of_a_group_stopped_by_its_rule(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_text(f"runs_dir: {tmp_path}/runs\nresults: {tmp_path}/r.jsonl\ngroups:\n  - {{name: g, recipe: tiny/gsm8k, "
                 "epochs: 1, steps_per_epoch: 2, eval: {task: gsm8k}, stopped: 'pilot above its band', "
                 "runs: [{method: mutor, seed: 0}]}\n")
    listed = _driver(p, "--list")
    assert listed.returncode == 0 and "mutor_s0" in listed.stdout and listed.stdout.split()[-1] == "stopped"
    out = _driver(p)
    assert out.returncode == 0 and "training" not in out.stdout and not (tmp_path / "runs").exists()
    assert report._uninformative(p) == {"g": "pilot above its band"}


def test_claim_takes_over_a_lock_whose_process_is_gone(tmp_path):
    lock = tmp_path / "run.lock"
    lock.write_text("999999999")
    assert driver.claim(lock)
    assert lock.read_text() == str(__import__("os").getpid())
    assert not driver.claim(lock)                      # held by a live process (this one)


def _plan(tmp_path: Path, steps_per_epoch: int) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(f"""runs_dir: {tmp_path}/runs
results: {tmp_path}/results.jsonl
drafting: {{limit: 2}}
groups:
  - name: tiny
    recipe: tiny/gsm8k
    epochs: 2
    steps_per_epoch: {steps_per_epoch}
    save_every: 1
    overrides: ["training.report_to=[]", training.logging_steps=1]
    runs:
      - {{method: next_token, seed: 0}}
      - {{method: mutor, seed: 0}}
    eval:
      task: gsm8k
      data: src/mutor/configs/tiny/data/gsm8k_tiny.jsonl
      limit: 4
      max_new_tokens: 4
      batch_size: 4
""")
    return p


def _driver(plan: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments/evidence/driver.py"), "--plan", str(plan),
                           "--slots", "2", *extra], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_driver_runs_what_is_missing_then_skips_it_and_resumes_a_partial_run(tmp_path):
    plan = _plan(tmp_path, 2)
    # a killed run: a checkpoint at step 1 and no summary; the driver must resume it, not start over
    first = _driver(plan, "--only", "mutor_s0")
    assert first.returncode == 0, first.stdout + first.stderr
    mutor_dir = tmp_path / "runs" / "tiny" / "mutor_s0"
    assert sorted(p.name for p in mutor_dir.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]  # epoch ends
    rows = report.load(tmp_path / "results.jsonl")
    assert [r["run"] for r in rows] == ["mutor_s0"]
    assert rows[0]["train_cost_complete"] is True          # trained from step 0 under this driver
    # the scored generations, gzipped beside the results file: what error_kinds.py reads once the runs are gone
    import gzip

    import error_kinds

    kept = tmp_path / "generations" / "tiny" / "mutor_s0" / "test.jsonl.gz"
    scored = mutor_dir / "eval" / "gsm8k" / rows[0]["selected_checkpoint"] / "test" / "generations.jsonl"
    assert gzip.decompress(kept.read_bytes()) == scored.read_bytes() and len(scored.read_text().splitlines()) == 4
    assert error_kinds.generations(rows[0], tmp_path / "gone", tmp_path / "results.jsonl") == \
        [json.loads(x) for x in scored.read_text().splitlines()]
    kept.unlink()                                          # a row that landed without them: kept again from disk
    back = _driver(plan, "--keep-generations")
    assert "mutor_s0: generations kept: 1 split(s)" in back.stdout and "training" not in back.stdout
    assert gzip.decompress(kept.read_bytes()) == scored.read_bytes()
    drafts = report.load(tmp_path / "drafting.jsonl")      # registers as drafters, MuToR runs only
    assert [(r["run"], r["prompts"], sorted(r["drafting"])) for r in drafts] == [
        ("mutor_s0", 2, ["K=1", "K=2", "K=3", "K=4", "K=auto"])]
    assert all(k["identical_to_greedy"] for k in drafts[0]["drafting"].values())
    assert "| tiny | mutor_s0 | 2 |" in report.drafting_table(drafts)
    (tmp_path / "drafting.jsonl").unlink()                 # a finished run owing only its drafting row gets it
    owed = _driver(plan, "--only", "mutor_s0")
    assert "mutor_s0: drafting row written" in owed.stdout and "training" not in owed.stdout
    assert "mutor_s0: row written" not in owed.stdout and len(report.load(tmp_path / "results.jsonl")) == 1
    redo = _driver(plan, "--redraft")                      # drafting code changed: measured again, a new row
    assert "mutor_s0: drafting row written (code" in redo.stdout and "training" not in redo.stdout
    assert "next_token_s0" not in redo.stdout and len(report.load(tmp_path / "drafting.jsonl")) == 2

    out = _driver(plan)                                    # next_token_s0 missing, mutor_s0 done
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mutor_s0" not in out.stdout and "next_token_s0: row written" in out.stdout
    rows = report.load(tmp_path / "results.jsonl")
    assert sorted(r["run"] for r in rows) == ["mutor_s0", "next_token_s0"]
    assert len((tmp_path / "runs" / "tiny" / "mutor_s0.train.jsonl").read_text().splitlines()) == 1
    r = next(r for r in rows if r["run"] == "mutor_s0")
    assert r["steps"] == 4 and r["splits"]["test"]["n"] == 4 and len(r["splits"]["test"]["per_example"]) == 4
    comps = report.comparisons(rows)
    assert [c["comparison"] for c in comps] == ["mutor - next_token"] and not comps[0]["holds"]

    # resume: drop the finished summary and the row, as if the process had been killed after step 2
    (mutor_dir / "summary.json").unlink()
    import shutil

    shutil.rmtree(mutor_dir / "checkpoint-4")
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows if x["run"] != "mutor_s0"))
    again = _driver(plan)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "mutor_s0: resuming for 4 steps" in again.stdout
    procs = [json.loads(x) for x in (tmp_path / "runs" / "tiny" / "mutor_s0.train.jsonl").read_text().splitlines()]
    assert [p["resumed"] for p in procs] == [False, True]
    assert report.load(tmp_path / "results.jsonl")[-1]["train_processes"] == 2


def test_redraft_retrain_trains_a_finished_run_again_checks_it_reproduced_the_row_and_each_redraft_measures_anew(
        tmp_path):
    """A new machine has the rows but not the checkpoints: ``--redraft`` skips such a run, ``--redraft --retrain``
    trains it again from its plan entry (no second results row), finds the same final training loss as the row's
    (same seed, data order and the row's thread count), and writes a drafting row that says so, with how busy the
    machine was. A later ``--redraft`` (a quieter machine) measures again rather than reusing that measurement,
    and its row too says that the weights were trained again."""
    import shutil

    plan = _plan(tmp_path, 2)
    first = _driver(plan, "--only", "mutor_s0")
    assert first.returncode == 0, first.stdout + first.stderr
    shutil.rmtree(tmp_path / "runs" / "tiny" / "mutor_s0")                  # the checkpoints are gone
    skipped = _driver(plan, "--redraft")
    assert "is not on disk: not measured again" in skipped.stdout and "training" not in skipped.stdout
    assert _driver(plan, "--retrain").returncode == 2                        # only with --redraft
    again = _driver(plan, "--redraft", "--retrain", "--threads", "2")       # trained with the row's thread count
    assert again.returncode == 0, again.stdout + again.stderr
    row = report.load(tmp_path / "results.jsonl")[0]
    expected = f"mutor_s0: trained again: final next-token loss {row['train_ntp_loss_last']} against the row's"
    assert expected in again.stdout
    assert "NOT reproduced" not in again.stdout and "next_token_s0" not in again.stdout
    assert len(report.load(tmp_path / "results.jsonl")) == 1                 # no second results row
    drafts = report.load(tmp_path / "drafting.jsonl")
    assert len(drafts) == 2 and "retrained" not in drafts[0]
    assert drafts[1]["retrained"] == {"train_ntp_loss_last": row["train_ntp_loss_last"],
                                      "row_train_ntp_loss_last": row["train_ntp_loss_last"], "reproduced": True}
    assert drafts[1]["machine"]["cpus"] >= 1 and drafts[1]["machine"]["others_cpu_cores"] >= 0
    assert "| tiny | mutor_s0 (trained again) | 2 |" in report.drafting_table(drafts[1:])
    later = _driver(plan, "--redraft")
    assert later.returncode == 0 and "mutor_s0: drafting\n" in later.stdout, later.stdout + later.stderr
    drafts = report.load(tmp_path / "drafting.jsonl")
    assert len(drafts) == 3 and drafts[2]["finished_at"] >= drafts[1]["finished_at"]
    assert drafts[2]["retrained"] == drafts[1]["retrained"]                 # the same weights, trained again


def test_driver_scores_a_star_graph_group_on_the_final_model_per_example(tmp_path):
    """``eval: {task: run}``: the final model on the run's held-out graphs, one 0/1 solve per graph (so runs pair
    example by example), the training's evaluations as the curve, the MuToR run's registers as drafters on
    its first held-out graphs and their first-hop predictions (first_hop.py); with ``sources: [path_star]`` (where
    reasoning-gym is installed) the final model on reasoning-gym's graphs too, as a second split."""
    import importlib.util

    rg = importlib.util.find_spec("reasoning_gym") is not None
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""runs_dir: {tmp_path}/runs
results: {tmp_path}/results.jsonl
drafting: {{limit: 2}}
first_hop: {{limit: 4}}
groups:
  - name: sg
    recipe: star-graph
    epochs: 1
    steps_per_epoch: 2
    overrides: ["training.report_to=[]", training.eval_steps=1, training.logging_steps=1, data.num_train=32,
                data.num_test=8, data.path_len=4, data.num_nodes=20, model.preset=tiny-llama, data.render=text,
                model.tokenizer=byte]
    runs:
      - {{method: next_token, seed: 0}}
      - {{method: mutor, seed: 0}}
    eval: {{task: run{", sources: [path_star]" if rg else ""}}}
""")
    res = _driver(plan)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = report.load(tmp_path / "results.jsonl")
    assert sorted(r["run"] for r in rows) == ["mutor_s0", "next_token_s0"]
    for r in rows:
        test = r["splits"]["test"]
        assert r["primary"] == "solve_rate" and r["selected_checkpoint"] == "final" and test["n"] == 8
        assert len(test["per_example"]) == 8 and set(test["per_example"]) <= {0, 1}
        assert sum(test["per_example"]) / 8 == test["metrics"]["solve_rate"]
        assert [h["eval_step"] for h in r["per_checkpoint"]][-2:] == [1, 2]       # the curve
        if rg:
            other = r["splits"]["path_star"]
            assert other["n"] == 8 and len(other["per_example"]) == 8 and set(other["per_example"]) <= {0, 1}
    assert [(c["comparison"], c["split"]) for c in report.comparisons(rows)] == \
        [("mutor - next_token", s) for s in (["path_star", "test"] if rg else ["test"])]
    assert "test solve_rate %" in report.runs_table(rows)
    assert {c["measure"] for c in report.comparisons(rows)} == {"solve rate (points)"}   # named by its primary metric
    assert report.curves(rows, str(tmp_path / "curves.png")) and (tmp_path / "curves.png").stat().st_size > 0
    assert not report.curves([{**r, "per_checkpoint": []} for r in rows], str(tmp_path / "none.png"))
    (draft,) = report.load(tmp_path / "drafting.jsonl")
    # 4 nodes as text, eos
    assert (draft["run"], draft["task"], draft["prompts"], draft["max_new_tokens"]) == ("mutor_s0", "run", 2, 12)
    assert all(k["identical_to_greedy"] for k in draft["drafting"].values())
    kept = {p.relative_to(tmp_path / "generations").as_posix() for p in (tmp_path / "generations").rglob("*.gz")}
    splits = ["test"] + (["path_star"] if rg else [])
    assert kept == {f"sg/{r}/{s}.jsonl.gz" for r in ("mutor_s0", "next_token_s0") for s in splits}
    (hop,) = report.load(tmp_path / "first_hop.jsonl")     # the registers on the first hop, MuToR runs only
    assert (hop["run"], hop["graphs"]) == ("mutor_s0", 4) and {"ntp", "d=2", "d=3"} <= set(hop)
    assert "| sg | mutor_s0 | 4 |" in report.first_hop_table([hop])


def _row(method: str, seed: int, scores: list[float], losses: list[float]) -> dict:
    return {"group": "g", "run": f"{method}_s{seed}", "method": method, "seed": seed, "tag": "", "epochs": 1,
            "splits": {"test": {"per_example": scores, "answer_loss_per_example": losses}}}


def test_report_pairs_by_seed_and_claims_only_an_interval_that_excludes_0_over_three_seeds():
    rows = []
    for seed in range(3):
        nt = [float(i % 2) for i in range(40)]
        rows += [_row("next_token", seed, nt, [1.0 + 0.01 * i for i in range(40)]),
                 _row("mutor", seed, [1.0] * 40, [0.9 + 0.01 * i + 0.001 * seed for i in range(40)])]
    comps = {c["measure"]: c for c in report.comparisons(rows)}
    em, loss = comps["exact match (points)"], comps["answer loss (nats)"]
    assert em["mean"] == pytest.approx(50.0) and em["seeds"] == 3 and em["holds"]
    # the three seeds agree exactly: the per-example interval (wider) is the one shown, 50 ± t(117) * 50/sqrt(120)
    from scipy.stats import t

    half = t.ppf(0.975, 117) * 50 * (40 / 39) ** 0.5 / 120 ** 0.5
    assert em["interval"].source == "examples" and em["interval"].half == pytest.approx(half)
    assert loss["mean"] == pytest.approx(-0.099) and loss["holds"] and loss["interval"].source == "seeds"
    assert "better than next-token" in report.verdict([loss])
    two = report.comparisons([r for r in rows if r["seed"] < 2])
    assert not any(c["holds"] for c in two)             # two seeds never support a claim
    assert all(report.reading(c) == "exploratory (2 seeds)" for c in two)


def test_report_paired_table_names_each_rows_group():
    """Many groups compare the same methods on the same split: each row of the paired table says its group."""
    rows = [_row("next_token", 0, [1.0] * 4, [0.0] * 4), _row("mutor", 0, [0.0] * 4, [0.0] * 4)]
    rows += [{**r, "group": "other"} for r in rows]
    table = report.comparison_table([c for c in report.comparisons(rows) if c["measure"] == "exact match (points)"])
    assert table.splitlines()[0].startswith("| group | comparison |")
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| g", "| other"]


def test_report_at_a_glance_gives_both_sides_mean_the_difference_and_its_reading_on_the_primary_score():
    rows = []
    for seed in range(3):
        rows += [_row("next_token", seed, [float(i % 2) for i in range(40)], [1.0] * 40),
                 _row("mutor", seed, [1.0] * 40, [0.5] * 40)]
    comps = report.comparisons(rows)
    (line,) = report.summary_table(comps).splitlines()[2:]            # exact match only, not the answer loss
    assert line == ("| g | test | mutor - next_token | 3 | 50.0 | 100.0 | +50.0 [+40.8, +59.2] "
                    "| better than next-token |")
    assert "uninformative (floor)" in report.summary_table(comps, {"g": "at the floor"})
    one = report.comparisons(rows[:2])                                 # seed 0 alone: exploratory, whatever the gap
    assert report.summary_table(one).splitlines()[2].endswith("| exploratory (1 seed) |")


def test_a_diagnostic_group_is_compared_with_its_reference_groups_runs_of_the_same_seed():
    """A group the plan gives a ``reference`` (rg-word-reversal-half-lr) is paired with that group's runs of the
    listed methods, seed by seed; every other group still only with its own next-token runs."""
    rows = []
    for seed in range(3):
        rows += [_row("next_token", seed, [1.0] * 40, [0.0] * 40), _row("mutor", seed, [0.0] * 40, [0.0] * 40),
                 {**_row("next_token", seed, [float(i % 2) for i in range(40)], [0.0] * 40), "group": "diag",
                  "run": f"next_token_s{seed}_half-lr", "tag": "half-lr"}]
    refs = {"diag": {"group": "g", "methods": ["next_token", "mutor"]}}
    em = {c["comparison"]: c for c in report.comparisons(rows, refs) if c["measure"] == "exact match (points)"}
    assert set(em) == {"mutor - next_token", "next_token (half-lr) - next_token [g]",
                       "next_token (half-lr) - mutor [g]"}
    assert em["next_token (half-lr) - next_token [g]"]["mean"] == pytest.approx(-50.0)
    assert em["next_token (half-lr) - mutor [g]"]["mean"] == pytest.approx(50.0)
    assert "worse than next_token [g]" in report.verdict([em["next_token (half-lr) - next_token [g]"]])
    assert not [c for c in report.comparisons(rows) if c["group"] == "diag"]      # without the plan: no baseline
    shipped = report.references(driver.HERE / "plan.yaml")
    assert shipped["rg-word-reversal-half-lr"] == {"group": "rg-word-reversal", "methods": ["next_token", "mutor"]}


def test_a_group_also_against_a_tag_compares_its_other_methods_with_that_tagged_run_of_the_same_seed():
    """The compute check (gsm-smollm2-lora): MuToR seed 0 against next-token of twice the epochs, besides the
    usual pairs; the tagged run itself is still compared with untagged next-token, and not the other way round."""
    long_nt = {**_row("next_token", 0, [1.0] * 40, [0.5] * 40), "run": "next_token_s0_2x-epochs", "tag": "2x-epochs"}
    rows = [_row("next_token", 0, [0.0] * 40, [1.0] * 40), _row("mutor", 0, [float(i % 2) for i in range(40)],
                                                                    [0.8] * 40), long_nt,
            _row("next_token", 1, [0.0] * 40, [1.0] * 40), _row("mutor", 1, [0.0] * 40, [1.0] * 40)]
    em = {(c["comparison"], c["seeds"]): c for c in report.comparisons(rows, also={"g": ["2x-epochs"]})
          if c["measure"] == "exact match (points)"}
    assert set(em) == {("mutor - next_token", 2), ("next_token (2x-epochs) - next_token", 1),
                       ("mutor - next_token (2x-epochs)", 1)}
    assert em[("mutor - next_token (2x-epochs)", 1)]["mean"] == pytest.approx(-50.0)
    assert report.reading(em[("mutor - next_token (2x-epochs)", 1)]) == "exploratory (1 seed)"
    assert {c["comparison"] for c in report.comparisons(rows)} == {"mutor - next_token",
                                                                   "next_token (2x-epochs) - next_token"}
    assert report.also_against(driver.HERE / "plan.yaml") == {"gsm-smollm2-lora": ["2x-epochs"]}


def test_a_tagged_run_is_also_compared_with_next_token_of_the_same_tag_and_seed():
    """MuToR for 6 epochs (seed 0) against next-token for 6 epochs, the same budget, besides untagged next-token;
    a tagged run with no next-token of its tag (a0.1) keeps only its usual pairs."""
    tag = lambda r, t: {**r, "run": f"{r['run']}_{t}", "tag": t}
    rows = [_row("next_token", 0, [0.0] * 40, [1.0] * 40), _row("mutor", 0, [0.0] * 40, [1.0] * 40),
            tag(_row("next_token", 0, [1.0] * 40, [0.5] * 40), "2x-epochs"),
            tag(_row("mutor", 0, [float(i % 2) for i in range(40)], [0.6] * 40), "2x-epochs"),
            tag(_row("mutor", 0, [1.0] * 40, [0.6] * 40), "a0.1")]
    em = {c["comparison"]: c for c in report.comparisons(rows, also={"g": ["2x-epochs"]})
          if c["measure"] == "exact match (points)"}
    assert set(em) == {"mutor - next_token", "next_token (2x-epochs) - next_token", "mutor - next_token (2x-epochs)",
                       "mutor (2x-epochs) - next_token", "mutor (2x-epochs) - next_token (2x-epochs)",
                       "mutor (a0.1) - next_token"}
    assert em["mutor (2x-epochs) - next_token (2x-epochs)"]["mean"] == pytest.approx(-50.0)
    assert em["mutor (2x-epochs) - next_token"]["mean"] == pytest.approx(50.0)


def test_verdict_marks_a_group_the_plan_calls_uninformative_with_its_reason():
    rows = [_row(m, s, [float(i % 2) for i in range(40)], [1.0] * 40)
            for s in range(3) for m in ("next_token", "mutor")]
    comps = report.comparisons(rows)
    group = comps[0]["group"]
    assert "uninformative" not in report.verdict(comps)
    marked = report.verdict(comps, {group: "a constant answer scores as well"}).splitlines()
    assert marked and all(line.endswith("; **uninformative**: a constant answer scores as well") for line in marked)
    assert "uninformative" not in report.verdict(comps, {"another-group": "x"})
    shipped = report._uninformative(driver.HERE / "plan.yaml")
    assert set(shipped) == {"rg-maze", "rg-shortest-path",                                # the others: stopped
                            "rg-word-reversal-full", "rg-gemma3-word-reversal-pilot",
                            "rg-gemma3-word-reversal"}


def test_runs_table_marks_a_training_cost_with_unrecorded_segments():
    row = {**_row("mutor", 0, [1.0, 0.0], [0.5, 0.6]), "selected_checkpoint": "checkpoint-4",
           "train_ntp_loss_last": 0.1, "train_cpu_seconds": 1800, "peak_rss_gb": 1.0}
    assert "| 0.50 |" in report.runs_table([{**row, "train_cost_complete": True}])
    assert "| >= 0.50 |" in report.runs_table([{**row, "train_cost_complete": False}])


def test_report_replaces_only_the_marked_block():
    text = f"a\n{report.BEGIN}\nold\n{report.END}\nb\n"
    assert report.replace_between(text, "new") == f"a\n{report.BEGIN}\nnew\n{report.END}\nb\n"


def _report_rows(tmp_path):
    full = {"recipe": "r", "selection": "s", "selected_checkpoint": "checkpoint-4", "train_ntp_loss_last": 0.1,
            "train_cpu_seconds": 60, "peak_rss_gb": 1.0}
    rows = [{**_row(m, sd, [float((i + sd) % 2) for i in range(8)], [0.5] * 8), **full}
            for sd in range(3) for m in ("next_token", "mutor")]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--results", str(tmp_path / "results.jsonl"), "--plan", str(tmp_path / "none.yaml")]


def test_report_writes_the_at_a_glance_table_apart_where_the_readme_marks_a_place_for_it(tmp_path):
    args = _report_rows(tmp_path)
    main_block = f"{report.BEGIN}\n{report.END}\n"
    for apart in (True, False):
        readme = tmp_path / "README.md"
        readme.write_text(("x\n" + "\n".join(report.GLANCE) + "\n" if apart else "") + main_block)
        report.main([*args, "--readme", str(readme)])
        text = readme.read_text()
        block = text[text.index(report.BEGIN):]
        assert text.count("At a glance") == 1 and ("At a glance" in block) is not apart
        assert "| g | test | mutor - next_token | 3 |" in text and "**g** (r; s)" in block


def test_report_writes_the_glance_to_the_readme_and_the_rows_to_a_second_file(tmp_path):
    args = _report_rows(tmp_path)
    readme, details = tmp_path / "README.md", tmp_path / "evidence.md"
    readme.write_text("top\n" + "\n".join(report.GLANCE) + "\nbottom\n")
    details.write_text(f"# rows\n{report.BEGIN}\n{report.END}\n")
    report.main([*args, "--readme", str(readme), str(details)])
    top, rows = readme.read_text(), details.read_text()
    assert "At a glance" in top and "**g** (r; s)" not in top and top.endswith("bottom\n")
    assert "**g** (r; s)" in rows and "At a glance" not in rows and "Readings" in rows


def test_report_refuses_files_none_of_which_has_the_rows_block(tmp_path):
    args = _report_rows(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("\n".join(report.GLANCE) + "\n")
    with pytest.raises(SystemExit, match="evidence:begin"):
        report.main([*args, "--readme", str(readme)])
    assert readme.read_text() == "\n".join(report.GLANCE) + "\n"          # nothing half-written


def test_an_evaluation_counts_as_done_only_with_every_test_split(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"split": "test"}))
    assert driver._evaluated(tmp_path, "gsm8k")                      # one test split
    assert not driver._evaluated(tmp_path, "gsm_symbolic")           # test_new_templates still missing
    (tmp_path / "summary.json").write_text(json.dumps({"split": "test", "other_splits": {"test_new_templates": {}}}))
    assert driver._evaluated(tmp_path, "gsm_symbolic")
    assert not driver._evaluated(tmp_path / "nothing", "gsm8k")


def test_drafting_measures_every_draft_length_against_greedy_on_a_trained_mutor_checkpoint(tmp_path):
    """experiments/evidence/drafting.py: greedy, the drafting path's plain decoding (K = 1) and register drafting
    (K = 2..d_max, auto) on the same prompts, interleaved, at batch size 1; drafting is lossless, so in float32
    every K gives greedy's tokens."""
    import drafting

    from mutor.run.train import run_recipe

    out = tmp_path / "run"
    run_recipe("tiny/gsm8k", ["method=mutor", "seed=0", "mutor.d_max=3", "training.max_steps=2",
                              "training.save_steps=2", f"training.output_dir={out}"])
    data = str(ROOT / "src/mutor/configs/tiny/data/gsm8k_tiny.jsonl")
    res = drafting.measure(out / "checkpoint-2", "gsm8k", limit=3, max_new_tokens=6, data=data)
    assert res["prompts"] == 3 and res["d_max"] == 3 and set(res["drafting"]) == {"K=1", "K=2", "K=3", "K=auto"}
    assert res["greedy"]["new_tokens"] > 0
    for k, r in res["drafting"].items():
        assert r["identical_to_greedy"] and r["new_tokens"] == res["greedy"]["new_tokens"], k
        assert r["prompts_differing_from_greedy"] == 0, k
        assert r["forwards"] <= r["new_tokens"] and r["tokens_per_s"] > 0
        assert len(r["per_prompt_seconds"]) == 3 and r["speedup_ci95"][0] <= r["speedup_ci95"][1]
    assert res["timing"] == "interleaved per prompt, Williams orders"
    assert set(res["drafting"]["K=auto"]["chooser_state"]) >= {"ms_by_rows", "acceptance_estimate", "best"}


def test_only_patterns_match_run_names_or_group_slash_name_in_plan_order():
    plan, runs = driver.load_plan(ROOT / "experiments/evidence/plan.yaml")
    names = lambda rs: [f"{r.group['name']}/{r.name}" for r in rs]  # noqa: E731
    picked = driver.select(runs, None, ["gsm-smollm2-lora/next_token_s0", "gsm-smollm2-lora/mutor_s0", "rg-maze/*"])
    assert names(picked)[:2] == ["gsm-smollm2-lora/next_token_s0", "gsm-smollm2-lora/mutor_s0"]
    assert len(picked) == 2 + 9 and all(n.startswith("rg-maze/") for n in names(picked)[2:])
    assert names(driver.select(runs, ["rg-maze"], ["mutor_s1"])) == ["rg-maze/mutor_s1"]
    assert driver.select(runs, ["rg-maze"], None) == [r for r in runs if r.group["name"] == "rg-maze"]


def test_drafting_measures_a_star_graph_run_rendered_as_text_on_its_held_out_graphs(tmp_path):
    """``--task run``: the run's own held-out graphs (the first ones ``mutor eval --task run`` scores) as prompts,
    the evaluation's budget (the longest path + eos), lossless in float32."""
    import drafting

    from mutor.data.star_graph import StarGraphShape, make_examples
    from mutor.data.star_graph_text import render
    from mutor.run.cli import main
    from mutor.testing import byte_tokenizer

    out = tmp_path / "run"
    assert main(["train", "star_graph/g2-5-cpu", "method=mutor", "model.preset=tiny-llama", "model.tokenizer=byte",
                 "data.render=text", "data.num_train=32", "data.num_test=8", "data.num_nodes=20", "data.path_len=4",
                 "training.max_steps=1", "training.eval_strategy=no", "training.report_to=[]",
                 "--output-dir", str(out), "--quiet"]) == 0
    res = drafting.measure(out, "run", limit=3, ks=[2, "auto"])
    tok = byte_tokenizer()
    test = make_examples(StarGraphShape(degree=2, path_len=4, num_nodes=20), 8, seed=1)      # seed 0's held-out graphs
    longest = max(len(tok(render(ex)[1], add_special_tokens=False)["input_ids"]) for ex in test)
    assert res["prompts"] == 3 and res["max_new_tokens"] == longest + 1
    assert all(r["identical_to_greedy"] for r in res["drafting"].values())
    with pytest.raises(SystemExit, match="held-out graphs"):
        drafting.measure(out, "run", limit=3, split="validation")


def test_constant_answer_floor_is_the_most_common_training_answers_test_exact_match(tmp_path, monkeypatch):
    import constant_answer

    p = tmp_path / "plan.yaml"
    p.write_text("runs_dir: r\nresults: r.jsonl\ngroups:\n  - {name: g, recipe: real/smollm2-135m-reasoning-gym, "
                 "epochs: 1, steps_per_epoch: 2, overrides: [data.dataset=maze], eval: {task: reasoning_gym, limit: 4},"
                 " runs: [{method: next_token, seed: 0}, {method: mutor, seed: 0}]}\n"
                 "  - {name: other, recipe: tiny/gsm8k, epochs: 1, steps_per_epoch: 2, eval: {task: gsm8k},"
                 " runs: [{method: mutor, seed: 0}]}\n")
    seen = []

    def splits(options):
        seen.append(options["dataset"])
        row = lambda a: {"answer": a}                                        # noqa: E731
        return {"train": [row("5"), row("6"), row("5")], "validation": [],
                "test": [row("5"), row("7"), row("5"), row("5"), row("5")]}  # the 5th is beyond the eval limit

    monkeypatch.setattr(constant_answer, "make_splits", splits)
    monkeypatch.setattr(constant_answer, "score", lambda gen, ex: {"accuracy": 100.0 * (gen == ex["answer"])})
    [floor] = constant_answer.floors(p)                                      # one per group, gsm8k skipped
    assert seen == ["maze"]
    assert floor == {"group": "g", "tag": "", "split": "test", "answer": "5", "train_share": 66.7, "test_em": 75.0,
                     "test_n": 4}


def test_constant_answer_floor_of_a_gsm_symbolic_group_covers_both_test_splits(tmp_path, monkeypatch):
    import constant_answer

    p = tmp_path / "plan.yaml"
    p.write_text("runs_dir: r\nresults: r.jsonl\ngroups:\n  - {name: m, recipe: real/smollm2-135m-gsm-symbolic, "
                 "epochs: 1, steps_per_epoch: 2, overrides: [data.num_train=3], eval: {task: gsm_symbolic},"
                 " runs: [{method: next_token, seed: 0}]}\n")
    v = lambda x: {"value": x}                                               # noqa: E731
    splits = {"train": [v("2"), v("2"), v("9")], "validation": [], "test": [v("2"), v("3")],
              "test_new_templates": [v("4"), v("5")]}
    monkeypatch.setattr(constant_answer, "gsm_symbolic_splits", lambda n, *a: splits if n == 3 else None)
    floors = {f["split"]: f["test_em"] for f in constant_answer.floors(p)}
    assert floors == {"test": 50.0, "test_new_templates": 0.0}


def test_first_hop_probe_equals_plain_and_single_register_reference_forwards(tmp_path):
    """experiments/evidence/first_hop.py reads, teacher-forced, the next-token head's prediction of each answer
    token and the prediction of the register d tokens back; each equals a reference written from the paper's
    rule: the plain model on prompt + path, and ONE register after x_t (position t+d-1, seeing x_<=t and itself,
    which is a causal forward with the register last; the mask explicit, since transformers reads a jump in
    position ids without one as the start of a packed sequence)."""
    import first_hop
    from transformers import AutoTokenizer

    from mutor.eval.harness import evaluate_run_task
    from mutor.methods.mutor import MuToRModel
    from mutor.run.cli import main

    out = tmp_path / "run"
    assert main(["train", "star_graph/g2-5-cpu", "method=mutor", "model.preset=tiny-llama", "model.tokenizer=byte",
                 "data.render=text", "data.num_train=32", "data.num_test=3", "data.num_nodes=20", "data.path_len=4",
                 "mutor.d_max=3", "training.max_steps=2", "training.eval_steps=2", "training.save_steps=2",
                 "training.logging_steps=1", "training.report_to=[]", "--output-dir", str(out), "--quiet"]) == 0
    evaluate_run_task(str(out), output_dir=str(out / "eval/run/final/test"), device="cpu")   # where the driver puts it
    model = MuToRModel.from_pretrained(str(out), dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    record = json.loads((out / "eval/run/final/test/generations.jsonl").read_text().splitlines()[0])
    answer, hop, ntp, reg = first_hop.predictions(model, tok, record)
    prompt = tok(record["prompt"], add_special_tokens=True)["input_ids"]
    assert tok.decode(answer) == ",".join(map(str, record["reference"]))
    assert tok.decode(answer[hop.start:hop.stop]) == str(record["reference"][1])
    base, emb, vec = model.base_model, model.base_model.get_input_embeddings(), model.register_embeddings.weight[0]
    seq = torch.tensor([prompt + answer])
    with torch.no_grad():
        plain = base(seq).logits[0].argmax(-1).tolist()                              # (T,)
        assert ntp == plain[len(prompt) - 1: len(prompt) - 1 + len(answer)]
        for d in (2, 3):
            for i in range(d - 1, len(answer)):
                t = len(prompt) + i - d                                            # the register follows x_t
                x = torch.cat([emb(seq[:, : t + 1]), vec[None, None]], 1)          # (1, t+2, C)
                pos = torch.tensor([list(range(t + 1)) + [t + d - 1]])
                causal = torch.full((t + 2, t + 2), torch.finfo(x.dtype).min).triu(1)[None, None]   # additive,
                ref = base(inputs_embeds=x, position_ids=pos, attention_mask=causal).logits[0, -1].argmax().item()
                assert reg[d][i] == ref, (d, i)
    rates = first_hop.first_hop_rates(out, limit=3)
    assert rates["graphs"] == 3 and all(0.0 <= v <= 1.0 for k, v in rates.items() if k.startswith(("ntp", "d=")))


def test_first_hop_probe_rebuilds_a_token_id_runs_held_out_graphs(tmp_path):
    """A token-id star-graph run (the default job's rendering, no tokenizer): first_hop.py rebuilds the run's
    held-out graphs from its recipe; the first hop is the answer's second token, one of the source's arms."""
    import first_hop

    from mutor.data.star_graph import NUM_SPECIAL
    from mutor.methods.mutor import MuToRModel
    from mutor.run.cli import main

    out = tmp_path / "run"
    assert main(["train", "star-graph", "method=mutor", "data.num_train=32", "data.num_test=4", "data.path_len=4",
                 "data.num_nodes=20", "training.max_steps=2", "training.eval_steps=2", "training.save_steps=2",
                 "training.logging_steps=1", "training.report_to=[]", "--output-dir", str(out), "--quiet"]) == 0
    run = next(p.parent for p in out.rglob("mutor_config.json") if (p.parent / "recipe.yaml").exists())
    model = MuToRModel.from_pretrained(str(run), dtype=torch.float32).eval()
    graphs = list(first_hop._graphs(run, 10, model))
    assert len(graphs) == 4
    for answer, hop, ntp, reg, arms in graphs:
        assert hop == range(1, 2) and answer[1] in arms and len(arms) == 2 and min(arms) >= NUM_SPECIAL
        assert len(ntp) == len(answer) and reg[2][0] is None and reg[2][1] is not None
    rates = first_hop.first_hop_rates(run, limit=4)
    assert rates["graphs"] == 4 and rates["graphs_per_measure"]["d=2"] == 4


def test_first_hop_curve_covers_every_checkpoint_and_weighs_the_hop_as_the_objective_does(tmp_path):
    """``first_hop.py --curve``: one point per kept checkpoint and the final model, in step order. The hop's share
    of the objective, on a model whose every output is uniform (each cross-entropy ln V): path length 4, offsets
    {2, 3} drawn uniformly, so a sequence gets 3 registers (d = 2) or 2 (d = 3), 2.5 on average, and the hop
    carries (1-a)/4 of the next-token term and a·(1/2)/2.5 of the register term."""
    import math

    import first_hop

    from mutor.methods.mutor import MuToRModel
    from mutor.run.cli import main

    out = tmp_path / "run"
    assert main(["train", "star-graph", "method=mutor", "data.num_train=32", "data.num_test=4", "data.path_len=4",
                 "data.num_nodes=20", "training.max_steps=2", "training.eval_steps=2", "training.save_steps=1",
                 "training.logging_steps=1", "training.report_to=[]", "--output-dir", str(out), "--quiet"]) == 0
    run = next(p.parent for p in out.rglob("mutor_config.json") if (p.parent / "recipe.yaml").exists())
    points = first_hop.curve(run, limit=4)
    assert [p["step"] for p in points] == [1, 2] and all(p["graphs"] == 4 for p in points)
    model = MuToRModel.from_pretrained(str(run), dtype=torch.float32).eval()
    head = model.base_model.get_output_embeddings()
    torch.nn.init.zeros_(head.weight)
    if head.bias is not None:
        torch.nn.init.zeros_(head.bias)
    a = model.mutor_config.loss_weight
    got = first_hop.hop_share(model, first_hop._token_id_graphs(run, 4))
    ln_v = math.log(head.weight.shape[0])
    assert got["ntp_ce"] == got["hop_reg_ce"] == got["reg_ce"] == pytest.approx(ln_v, abs=1e-4)
    assert got["hop_share"] == pytest.approx((1 - a) / 4 + a * 0.5 / 2.5, abs=1e-4)


def test_grad_share_parts_add_up_to_the_training_gradient_and_read_one_without_registers(tmp_path):
    """experiments/evidence/grad_share.py splits a MuToR forward's gradient into its (1-a)·L_ntp and a·L_reg parts:
    on the model's weights (not the register embedding) they add up to the gradient of the loss training
    minimises, with the same offsets. Its Adam-step ratio follows the docstring's formula: computed by hand on
    two batches of a one-weight model, and exactly 1 (MuToR takes next-token's step) where the register part
    is zero."""
    import grad_share

    from mutor.methods.mutor import MuToRModel
    from mutor.run.cli import main

    out = tmp_path / "run"
    assert main(["train", "star_graph/g2-5-cpu", "method=mutor", "model.preset=tiny-llama", "data.num_train=16",
                 "data.num_test=2", "data.num_nodes=20", "data.path_len=4", "mutor.d_max=3", "training.max_steps=1",
                 "training.eval_steps=1", "training.save_steps=1", "training.logging_steps=1",
                 "training.report_to=[]", "--output-dir", str(out), "--quiet"]) == 0
    model = MuToRModel.from_pretrained(str(out), dtype=torch.float32).train()
    batch = grad_share.training_batches(out, 1, 4)[0]
    parts = grad_share.gradient_parts(model, [batch], seed=3)
    torch.manual_seed(3)
    model.zero_grad()
    model(**batch).loss.backward()
    params, own = model.parameter_groups()
    assert own and all(p.grad is not None for p in own)        # the register embedding: excluded from the probe
    for p, g_ntp, g_reg in zip(params, parts["sums"]["ntp"], parts["sums"]["reg"]):
        torch.testing.assert_close(g_ntp + g_reg, p.grad, rtol=1e-4, atol=1e-6)
    row = grad_share.probe(out, "", batches=2, micro_batch=4)
    assert row["batches"] == 2 and row["loss_weight"] == model.mutor_config.loss_weight and row["ntp_grad_norm"] > 0
    assert (row["group"], row["run"]) == (tmp_path.name, "run")
    assert f"| {tmp_path.name} | run | final |" in report.grad_share_table([row])

    a = 0.25                                                   # by hand: one weight, two batches
    gn, gr = torch.tensor([[1.0, -2.0], [3.0, 0.5]]), torch.tensor([[2.0, 1.0], [-1.0, 4.0]])   # (batch, weight)
    sums = {"ntp": [gn.sum(0)], "reg": [gr.sum(0)], "v_mix": [(gn + gr).pow(2).sum(0)],
            "v_ntp": [(gn / (1 - a)).pow(2).sum(0)]}
    got = grad_share.shares({"sums": sums, "batch_cosines": [0.0, 0.0], "batches": 2, "loss_weight": a})
    u_ntp = gn.mean(0) / (gn + gr).pow(2).mean(0).sqrt()
    u_ref = (gn / (1 - a)).mean(0) / (gn / (1 - a)).pow(2).mean(0).sqrt()
    u_all = (gn + gr).mean(0) / (gn + gr).pow(2).mean(0).sqrt()
    assert got["ntp_step_ratio"] == pytest.approx(float(u_ntp.norm() / u_ref.norm()), abs=1e-4)
    assert got["step_along_ntp"] == pytest.approx(float(u_all @ u_ref / u_ref.norm() ** 2), abs=1e-4)
    cosine = gn.mean(0) @ gr.mean(0) / gn.mean(0).norm() / gr.mean(0).norm()
    assert got["cosine"] == pytest.approx(float(cosine), abs=1e-4)
    no_reg = {**sums, "reg": [torch.zeros(2)], "v_mix": [gn.pow(2).sum(0)]}
    got = grad_share.shares({"sums": no_reg, "batch_cosines": [], "batches": 2, "loss_weight": a})
    assert got["ntp_step_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert got["step_along_ntp"] == pytest.approx(1.0, abs=1e-4)


def test_error_kinds_tells_order_from_copy_from_length_errors_in_both_list_formats(tmp_path):
    """experiments/evidence/error_kinds.py: a wrong list answer is a wrong order (same items), a changed item (as
    many items), a dropped or an added item; word reversal's comma-separated words and number sorting's list
    literal alike; a run's test generations at its selected checkpoint are tallied by kind and by length."""
    import error_kinds

    ref = "if, simple, the"
    assert [error_kinds.kind(p, ref) for p in ("if, simple, the", "simple, if, the", "if, Simple, the", "if, the",
                                                "if, simple, simple, the", "")] == \
        ["right", "order", "item changed", "item dropped", "item added", "no list"]
    ref = "['-95.79', '56.0', '99.0']"
    assert [error_kinds.kind(p, ref) for p in ("['-95.79', '56.0', '99.0']", "['56.0', '-95.79', '99.0']",
                                                "['-95.79', '56', '99.0']", "['-95.79', '56.0'", "[1, 2, 3, 4]")] == \
        ["right", "order", "item changed", "no list", "item added"]
    rows = [{"group": "g", "run": "mutor_s0", "method": "mutor", "tag": "", "task": "reasoning_gym",
             "selected_checkpoint": "checkpoint-1"}]
    gens = [{"extracted": "b, a", "reference": "a, b"}, {"extracted": "a, b, c", "reference": "c, b, a"},
            {"extracted": "a, b", "reference": "a, b"}]
    d = tmp_path / "g/mutor_s0/eval/reasoning_gym/checkpoint-1/test"
    d.mkdir(parents=True)
    (d / "generations.jsonl").write_text("\n".join(map(json.dumps, gens)))
    t = error_kinds.tally(rows, tmp_path, results=tmp_path / "results.jsonl")["mutor"]   # no kept copy: the run dir
    assert t["kinds"] == {"right": 1, "order": 2} and dict(t["by_items"]) == {2: [1, 2], 3: [0, 1]}
    assert "| mutor | 1 | 3 | 1 | 2 | 0 | 0 | 0 | 0 | 50, 0 |" in error_kinds.table({"mutor": t})
    results = tmp_path / "results.jsonl"                   # --seeds: only the seeds whose generations are kept
    results.write_text("\n".join(json.dumps({**rows[0], "run": f"mutor_s{s}", "seed": s, "selected_checkpoint":
                                                "checkpoint-1"}) for s in (0, 1)))
    with pytest.raises(SystemExit, match="mutor_s1: neither"):
        error_kinds.main(["g", "--results", str(results), "--runs-dir", str(tmp_path)])
    assert error_kinds.main(["g", "--results", str(results), "--runs-dir", str(tmp_path), "--seeds", "0"]) == 0
    with pytest.raises(SystemExit, match="with seeds \\[5\\]"):
        error_kinds.main(["g", "--results", str(results), "--runs-dir", str(tmp_path), "--seeds", "5"])


def test_error_kinds_with_words_tells_a_reordered_sentence_from_changed_dropped_and_added_words():
    """With ``words`` the items are an answer's words as written: sentence reordering's answers."""
    import error_kinds

    ref = "Smith, turning to a second scientist."
    got = [error_kinds.kind(p, ref, words=True) for p in (ref, "turning Smith, to a second scientist.",
                                                           "Smith, turned to a second scientist.",
                                                           "Smith, turning to a scientist.",
                                                           "Smith, turning to a second new scientist.")]
    assert got == ["right", "order", "item changed", "item dropped", "item added"]
