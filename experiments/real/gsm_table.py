"""The SmolLM2 / gsm_symbolic comparison: one table and one figure from the runs' own files.

Reads, for every run directory ``RUNS/<method>_s<seed>``: ``summary.json`` (training), the two
``mutor eval`` summaries (``eval/gsm_symbolic-test``, ``eval/gsm_symbolic-test_new_templates``),
``/usr/bin/time -v`` output (``TIME_DIR/time_<method>_s<seed>.txt``: CPU seconds and peak RSS of
the training process) and the held-out answer losses (``heldout_loss.py`` JSON lines). Writes one
JSON line per run and split, prints the Markdown table (accuracy with its binomial standard error,
answer loss with its standard error over examples), and draws both per method and split.

    python experiments/real/gsm_table.py RUNS --time-dir DIR --losses LOSSES.jsonl \\
        --output experiments/real/smollm2_gsm_symbolic_bidir.jsonl --plot experiments/real/smollm2_gsm_symbolic.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path

SPLITS = ("test", "test_new_templates")
ORDER = ("next_token", "multi_token", "mutor")


def _time_file(path: Path) -> dict:
    if not path.is_file():
        return {}
    text = path.read_text()
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", text))
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    return {"train_cpu_seconds": round(cpu, 1),
            "train_peak_rss_gb": round(int(rss.group(1)) / 2**20, 2) if rss else None}


def _last_ntp(summary: dict, steps: int) -> float:
    """Mean logged next-token training loss over the last ``steps`` steps (the objective itself differs by method)."""
    hist = [h for h in summary["train_history"] if "ntp_loss" in h and h["step"] > summary["global_step"] - steps]
    return round(sum(h["ntp_loss"] for h in hist) / len(hist), 4) if hist else None


def collect(runs: Path, time_dir: Path, losses: dict) -> list[dict]:
    rows = []
    for d in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file()):
        s = json.loads((d / "summary.json").read_text())
        method, seed, steps = s["method"], s["seed"], s["global_step"]
        timing = _time_file(time_dir / f"time_{method}_s{seed}.txt")
        for split in SPLITS:
            ev = d / "eval" / f"gsm_symbolic-{split}" / "summary.json"
            if not ev.is_file():
                continue
            e = json.loads(ev.read_text())
            n, acc = e["n"], e["metrics"]["accuracy"]           # accuracy in percent
            p = acc / 100
            loss = losses.get((str(d), split), {})
            rows.append({"method": method, "seed": seed, "split": split, "n": n, "accuracy": acc,
                         "accuracy_se": round(100 * math.sqrt(max(p * (1 - p), 1e-12) / n), 2),
                         "answer_loss": loss.get("answer_loss"), "answer_loss_se": loss.get("se"),
                         "train_steps": steps, "batch": 8, "train_examples": s["data"]["num_examples"],
                         "prefix_attention": e.get("prefix_attention"), "max_new_tokens": e.get("max_new_tokens"),
                         "train_objective": round(s["train_loss"], 4), "train_ntp_loss_last25": _last_ntp(s, 25),
                         "train_wall_seconds": round(s["wall_seconds"], 1),
                         "seconds_per_step": round(s["wall_seconds"] / steps, 1), **timing,
                         "cpu_seconds_per_step": round(timing["train_cpu_seconds"] / steps, 1) if timing else None,
                         "run": str(d)})
    return rows


def base_rows(eval_dir: Path, losses_file: Path) -> list[dict]:
    """The pretrained model before fine-tuning (``mutor eval --output-dir``; causal prompt, its natural mode),
    with its answer loss under each prefix attention."""
    rows = []
    lines = [json.loads(x) for x in losses_file.read_text().splitlines()] if losses_file.is_file() else []
    for split in SPLITS:
        ev = next((f for f in (eval_dir / split / "summary.json", eval_dir / f"gsm_symbolic-{split}" / "summary.json")
                   if f.is_file()), None)
        for prefix in ("causal", "bidirectional"):
            loss = next((r for r in lines if r["split"] == split and r["prefix_attention"] == prefix), None)
            e = json.loads(ev.read_text()) if ev is not None and prefix == "causal" else None
            if loss is None and e is None:
                continue
            p = e["metrics"]["accuracy"] / 100 if e else None
            rows.append({"method": f"base ({prefix} prompt)", "seed": "-", "split": split,
                         "n": e["n"] if e else None, "accuracy": e["metrics"]["accuracy"] if e else None,
                         "accuracy_se": round(100 * math.sqrt(max(p * (1 - p), 1e-12) / e["n"]), 2) if e else None,
                         "answer_loss": loss["answer_loss"] if loss else None,
                         "answer_loss_se": loss["se"] if loss else None,
                         "train_ntp_loss_last25": "-", "train_steps": 0, "run": "base"})
    return rows


def table(rows: list[dict]) -> str:
    key = lambda r: (ORDER.index(r["method"]) if r["method"] in ORDER else -1, str(r["seed"]))   # noqa: E731
    runs = sorted({(r["method"], r["seed"]) for r in rows}, key=lambda ms: key({"method": ms[0], "seed": ms[1]}))
    out = ["| method | seed | test acc % | new-templates acc % | test answer loss | new-templates answer loss | "
           "train ntp loss (last 25 steps) | CPU s / step | peak RSS GB |", "|---|---|---|---|---|---|---|---|---|"]
    for m, sd in runs:
        by = {r["split"]: r for r in rows if r["method"] == m and r["seed"] == sd}
        t, nt = by.get("test", {}), by.get("test_new_templates", {})
        acc = lambda r: ("-" if not r or r.get("accuracy") is None  # noqa: E731
                         else f"{r['accuracy']:.0f} ± {r['accuracy_se']:.1f}" if r["accuracy"]
                         else f"0 (< {300 / r['n']:.0f} at 95%)")
        los = lambda r: f"{r['answer_loss']:.4f} ± {r['answer_loss_se']:.4f}" if r.get("answer_loss") else "-"  # noqa: E731
        any_r = t or nt
        out.append(f"| {m} | {sd} | {acc(t)} | {acc(nt)} | {los(t)} | {los(nt)} | {any_r['train_ntp_loss_last25']} | "
                   f"{any_r.get('cpu_seconds_per_step') or '-'} | {any_r.get('train_peak_rss_gb') or '-'} |")
    return "\n".join(out)


def paired(rows: list[dict], losses: dict) -> str:
    """Each method minus next_token of the same seed (same initialisation and data order), per held-out
    example (the example's mean answer-token loss), with the standard error of the paired differences."""
    out = ["| method - next_token | seed | split | mean loss difference | s.e. (paired) | examples lower |",
           "|---|---|---|---|---|---|"]
    runs = {(r["method"], r["seed"]): r["run"] for r in rows}
    for (m, sd), run in sorted(runs.items()):
        ref = runs.get(("next_token", sd))
        if m == "next_token" or ref is None:
            continue
        for split in SPLITS:
            a, b = losses.get((run, split), {}), losses.get((ref, split), {})
            if "per_example" not in a or "per_example" not in b:
                continue
            d = [x - y for x, y in zip(a["per_example"], b["per_example"])]
            mean = sum(d) / len(d)
            se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
            out.append(f"| {m} | {sd} | {split} | {mean:+.4f} | {se:.4f} | {sum(x < 0 for x in d)}/{len(d)} |")
    return "\n".join(out)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = sorted({r["method"] for r in rows}, key=lambda m: ORDER.index(m) if m in ORDER else -1)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for ax, (metric, se, label) in zip(axes, [("accuracy", "accuracy_se", "exact match, % (± 1 binomial s.e.)"),
                                              ("answer_loss", "answer_loss_se", "held-out answer loss (± 1 s.e.)")]):
        for j, split in enumerate(SPLITS):
            for i, m in enumerate(methods):
                pts = [r for r in rows if r["method"] == m and r["split"] == split and r.get(metric) is not None]
                for k, r in enumerate(pts):
                    ax.errorbar(i + (j - 0.5) * 0.3 + 0.05 * k, r[metric], yerr=r[se], fmt="os"[j], color=f"C{j}",
                                mfc="none", capsize=3, label=split if (i == 0 and k == 0) else None)
        ax.set_xticks(range(len(methods)), [m.replace(" (", "\n(").replace(" prompt)", ")") for m in methods],
                      fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("SmolLM2-135M-Instruct, LoRA r=32, gsm_symbolic: one point per seed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--time-dir", type=Path, default=None)
    ap.add_argument("--losses", default=None)
    ap.add_argument("--output", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--base-eval", type=Path, default=None, help="mutor eval --output-dir of the untrained model")
    ap.add_argument("--base-losses", type=Path, default=None, help="heldout_loss.py lines of the untrained model")
    args = ap.parse_args()
    losses = {}
    if args.losses and Path(args.losses).is_file():
        for line in Path(args.losses).read_text().splitlines():
            r = json.loads(line)
            losses[(str(Path(r["model"])), r["split"])] = r
    rows = collect(args.runs, args.time_dir or args.runs, losses)
    if args.base_eval or args.base_losses:
        rows = base_rows(args.base_eval or Path("-"), args.base_losses or Path("-")) + rows
    if args.output:
        Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in rows))
    if args.plot:
        plot(rows, args.plot)
    print(table(rows))
    print()
    print(paired(rows, losses))


if __name__ == "__main__":
    main()
