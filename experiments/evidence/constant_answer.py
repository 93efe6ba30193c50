"""The floor a reasoning group's exact match must clear: always giving the training split's most common answer.

A task whose answers are few (a step count, "infeasible") can put a model that learned nothing but the
answer's prior at a respectable exact match. For every reasoning-gym and gsm_symbolic group of the plan, this
rebuilds the group's splits (a pure function of its data options), takes the most common training answer, scores
it on every evaluated test item (reasoning-gym: the task's own verifier; gsm_symbolic: equal to the final value)
and prints that floor beside each run's test exact match.

    python experiments/evidence/constant_answer.py            # needs reasoning-gym (the [real] extras)
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from mutor.data.gsm_symbolic import gsm_symbolic_splits
from mutor.data.reasoning_tasks import make_splits, score
from mutor.run.recipe import load_recipe

HERE = Path(__file__).resolve().parent


def floors(plan: Path, group_names=None) -> list[dict]:
    """Per group (and pilot tag) and test split: its most common training answer and that answer's exact match."""
    from driver import load_plan  # noqa: E402  (same folder)

    out = []
    _, runs = load_plan(plan)
    seen = set()
    for run in runs:
        g = run.group
        task = g["eval"]["task"]
        if task not in ("reasoning_gym", "gsm_symbolic") or (group_names and g["name"] not in group_names):
            continue
        key = (g["name"], run.tag)
        if key in seen:
            continue
        seen.add(key)
        data = load_recipe(g["recipe"], list(g.get("overrides", [])) + run.overrides).data
        if task == "reasoning_gym":
            splits, field = make_splits({k: v for k, v in data.items() if k != "task"}), "answer"
            test_splits, correct = ["test"], lambda answer, ex: score(answer, ex)["accuracy"]
        else:
            splits, field = gsm_symbolic_splits(data["num_train"], data["num_validation"], data["num_test"],
                                                data.get("data_seed", 0), data.get("heldout_every", 5)), "value"
            test_splits, correct = ["test", "test_new_templates"], lambda answer, ex: 100.0 * (answer == ex["value"])
        answer, count = Counter(r[field] for r in splits["train"]).most_common(1)[0]
        for split in test_splits:
            test = splits[split][: g["eval"].get("limit")]
            em = sum(correct(answer, ex) for ex in test) / len(test)
            out.append({"group": g["name"], "tag": run.tag, "split": split, "answer": answer,
                        "train_share": round(100 * count / len(splits["train"]), 1), "test_em": round(em, 1),
                        "test_n": len(test)})
    return out


def main() -> None:
    import sys

    sys.path.insert(0, str(HERE))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", type=Path, default=HERE / "plan.yaml")
    ap.add_argument("--results", type=Path, default=HERE / "results.jsonl")
    ap.add_argument("--group", action="append", default=None)
    args = ap.parse_args()
    from report import load  # same folder

    rows = load(args.results)
    print("| group | most common training answer (share) | its test EM % | runs' test EM % |")
    print("|---|---|---|---|")
    for f in floors(args.plan, args.group):
        ems = [f"{r['method']} s{r['seed']} {r['splits'][f['split']]['metrics']['accuracy']:.1f}" for r in rows
               if r["group"] == f["group"] and r["tag"] == f["tag"] and f["split"] in r["splits"]]
        name = f["group"] + (f" ({f['tag']})" if f["tag"] else "") + (f", {f['split']}" if f["split"] != "test" else "")
        answer = f["answer"] if len(f["answer"]) <= 24 else f["answer"][:20] + " ..."
        print(f"| {name} | {answer!r} ({f['train_share']} %) | {f['test_em']} (n={f['test_n']}) | "
              f"{', '.join(ems) or '-'} |")


if __name__ == "__main__":
    main()
