"""The SmolLM2 / gsm_symbolic comparison with separate clipping and bf16: tables and figures.

Reads every run directory ``RUNS/<method>_s<seed>_<precision>_<clip>`` written by ``run_gsm_fair.sh``
(``summary.json`` with every step logged, the two ``mutor eval`` summaries, ``/usr/bin/time -v`` output,
``heldout_loss.py`` lines in ``RUNS/losses.jsonl``) and prints:

1. the comparison table (exact match, held-out answer loss, training ntp loss over the last 25 steps,
   the share of steps whose update clipping scaled, CPU seconds per step, peak memory), with the
   float32, joint-clipping rows (``smollm2_gsm_symbolic_bidir.jsonl``) as "before";
2. paired per-example answer-loss differences: each run minus next-token of the same seed (bf16), and
   MuToR separate minus MuToR joint (the clipping effect alone), and bf16 minus fp32 next-token (precision);
3. the register's share of the joint gradient norm every 10 steps (``reg / sqrt(model^2 + reg^2)``);
4. the loss curves of next-token in fp32 and bf16 (same seed, same batches) against the seed-to-seed spread.

    python experiments/real/gsm_fair_table.py runs/gsm-fair --output experiments/real/smollm2_gsm_fair.jsonl \\
        --plot experiments/real/smollm2_gsm_fair.png
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gsm_table import SPLITS, _last_ntp, _time_file  # noqa: E402

BEFORE = Path(__file__).parent / "smollm2_gsm_symbolic_bidir.jsonl"


def _label(d: Path) -> dict:
    """``mutor_s0_bf16_separate`` -> method, seed, precision, clip."""
    parts = d.name.split("_")
    clip, prec, seed = parts[-1], parts[-2], int(parts[-3][1:])
    return {"method": "_".join(parts[:-3]), "seed": seed, "precision": prec, "clip": clip}


def _timing(runs: Path, name: str) -> dict:
    """CPU seconds and peak memory of a run's training processes: a run killed and resumed has one
    ``/usr/bin/time`` file per process (``time_<run>*.txt``): CPU seconds add up, the peak is the largest."""
    parts = [_time_file(f) for f in sorted(runs.glob(f"time_{name}*.txt"))]
    parts = [p for p in parts if p]
    if not parts:
        return {}
    return {"train_cpu_seconds": round(sum(p["train_cpu_seconds"] for p in parts), 1),
            "train_peak_rss_gb": max(p["train_peak_rss_gb"] or 0 for p in parts), "train_processes": len(parts)}


def _per_step(summary: dict, key: str) -> dict:
    return {h["step"]: h[key] for h in summary["train_history"] if key in h}


def collect(runs: Path, losses: dict) -> list[dict]:
    rows = []
    for d in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file() and p.name.count("_") >= 3):
        lab = _label(d)
        if lab["method"] not in ("next_token", "mutor", "multi_token"):
            continue
        s = json.loads((d / "summary.json").read_text())
        steps = s["global_step"]
        timing = _timing(runs, d.name)
        norms = _per_step(s, "grad_norm")
        clipped = sum(v > 1.0 for v in norms.values()) / max(len(norms), 1)     # every step is logged
        reg_norms = _per_step(s, "reg_grad_norm")
        reg_clipped = (sum(v > 1.0 for v in reg_norms.values()) / len(reg_norms)) if reg_norms else None
        for split in SPLITS:
            ev = d / "eval" / f"gsm_symbolic-{split}" / "summary.json"
            if not ev.is_file():
                continue
            e = json.loads(ev.read_text())
            n, acc = e["n"], e["metrics"]["accuracy"]
            p = acc / 100
            loss = losses.get((str(d), split), {})
            rows.append({**lab, "split": split, "n": n, "accuracy": acc,
                         "accuracy_se": round(100 * math.sqrt(max(p * (1 - p), 1e-12) / n), 2),
                         "answer_loss": loss.get("answer_loss"), "answer_loss_se": loss.get("se"),
                         "train_steps": steps, "train_ntp_loss_last25": _last_ntp(s, 25),
                         "clipped_fraction": round(clipped, 2),
                         "reg_clipped_fraction": None if reg_clipped is None else round(reg_clipped, 2),
                         "train_wall_seconds": round(s["wall_seconds"], 1), **timing,
                         "cpu_seconds_per_step": round(timing["train_cpu_seconds"] / steps, 1) if timing else None,
                         "run": str(d)})
    return rows


def before_rows() -> list[dict]:
    rows = []
    for line in BEFORE.read_text().splitlines():
        r = json.loads(line)
        if r["method"] in ("next_token", "multi_token", "mutor"):
            rows.append({**r, "precision": "fp32", "clip": "joint (before)"})
    return rows


def table(rows: list[dict]) -> str:
    order = {"next_token": 0, "multi_token": 1, "mutor": 2}
    keys = sorted({(r["method"], r["seed"], r["precision"], r["clip"]) for r in rows},
                  key=lambda k: ("before" not in k[3], order.get(k[0], 9), k[2], k[3], str(k[1])))
    out = ["| method | seed | precision | clipping | test acc % | new-templates acc % | test answer loss | "
           "new-templates answer loss | train ntp loss (last 25) | steps with grad_norm / reg_grad_norm > 1 | "
           "CPU s / step | "
           "peak RSS GB |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in keys:
        by = {r["split"]: r for r in rows if (r["method"], r["seed"], r["precision"], r["clip"]) == k}
        t, nt = by.get("test", {}), by.get("test_new_templates", {})
        def acc(r):
            if not r or r.get("accuracy") is None:
                return "-"
            if not r["accuracy"]:
                return f"0 (< {300 / r['n']:.0f} at 95%)"
            return f"{r['accuracy']:.0f} ± {r['accuracy_se']:.1f}"

        def los(r):
            return f"{r['answer_loss']:.4f} ± {r['answer_loss_se']:.4f}" if r.get("answer_loss") else "-"

        a = t or nt
        clip = "-" if "clipped_fraction" not in a else f"{a['clipped_fraction']:.2f}" + (
            f" / {a['reg_clipped_fraction']:.2f}" if a.get("reg_clipped_fraction") is not None else "")
        out.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {acc(t)} | {acc(nt)} | {los(t)} | {los(nt)} | "
                   f"{a.get('train_ntp_loss_last25', '-')} | {clip} | {a.get('cpu_seconds_per_step') or '-'} | "
                   f"{a.get('train_peak_rss_gb') or '-'} |")
    return "\n".join(out)


def _diff(a: dict, b: dict) -> tuple[float, float, int, int]:
    d = [x - y for x, y in zip(a["per_example"], b["per_example"])]
    mean = sum(d) / len(d)
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
    return mean, se, sum(x < 0 for x in d), len(d)


def paired(rows: list[dict], losses: dict) -> str:
    """Paired per-example differences of the mean answer-token loss (a difference is claimed beyond 2 s.e.)."""
    runs = {(r["method"], r["seed"], r["precision"], r["clip"]): r["run"] for r in rows if "run" in r}
    pairs = []
    for k, run in sorted(runs.items()):
        m, sd, pr, cl = k
        if m != "next_token" and pr == "bf16":
            ref = runs.get(("next_token", sd, "bf16", "separate"))
            if ref:
                pairs.append((f"{m} ({cl}) - next_token", sd, run, ref))
    for sd in sorted({k[1] for k in runs}):
        sep, joint = runs.get(("mutor", sd, "bf16", "separate")), runs.get(("mutor", sd, "bf16", "joint"))
        if sep and joint:
            pairs.append(("mutor separate - mutor joint", sd, sep, joint))
        for prec in ("bf16", "bf16ac"):
            bf, fp = runs.get(("next_token", sd, prec, "separate")), runs.get(("next_token", sd, "fp32", "separate"))
            if bf and fp:
                pairs.append((f"next_token {prec} - fp32", sd, bf, fp))
    nt0, nt1 = runs.get(("next_token", 0, "bf16", "separate")), runs.get(("next_token", 1, "bf16", "separate"))
    if nt0 and nt1:
        pairs.append(("next_token seed 1 - seed 0 (bf16)", "1-0", nt1, nt0))
    out = ["| comparison | seed | split | mean loss difference | s.e. (paired) | examples lower | beyond 2 s.e. |",
           "|---|---|---|---|---|---|---|"]
    for name, sd, a, b in pairs:
        for split in SPLITS:
            la, lb = losses.get((a, split), {}), losses.get((b, split), {})
            if "per_example" in la and "per_example" in lb:
                mean, se, lower, n = _diff(la, lb)
                out.append(f"| {name} | {sd} | {split} | {mean:+.4f} | {se:.4f} | {lower}/{n} | "
                           f"{'yes' if abs(mean) > 2 * se else 'no'} |")
    return "\n".join(out)


def norm_shares(runs: Path) -> str:
    """The register's share of the joint gradient norm, every 10 steps, for every MuToR / Multi-Token run."""
    out = ["| run | " + " | ".join(f"step {s}" for s in range(10, 101, 10)) + " |",
           "|---|" + "---:|" * 10]
    for d in sorted(p for p in runs.iterdir() if (p / "summary.json").is_file()):
        s = json.loads((d / "summary.json").read_text())
        g, r = _per_step(s, "grad_norm"), _per_step(s, "reg_grad_norm")
        if not r:
            continue
        joint = "joint" in d.name
        cells = []
        for step in range(10, 101, 10):
            if step not in g or step not in r:
                cells.append("-")
                continue
            model = math.sqrt(max(g[step] ** 2 - r[step] ** 2, 0.0)) if joint else g[step]
            cells.append(f"{r[step] / math.hypot(model, r[step]):.2f} ({r[step]:.2f}/{model:.2f})")
        out.append(f"| {d.name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def curves(runs: Path, path: str) -> str:
    """Training loss per step of next-token fp32 and bf16 (seed 0: the same batches) and bf16 seed 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {}
    for name in ("next_token_s0_fp32_separate", "next_token_s0_bf16_separate", "next_token_s1_bf16_separate",
                 "next_token_s0_autocast_separate", "next_token_s0_bf16ac_separate"):
        f = runs / name / "summary.json"
        if f.is_file():
            series[name] = _per_step(json.loads(f.read_text()), "loss")
    fig, ax = plt.subplots(1, 2, figsize=(12, 4))
    for name, c in series.items():
        steps = sorted(c)
        ax[0].plot(steps, [c[s] for s in steps], label=name.replace("_separate", ""), lw=1)
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("training loss (next-token)")
    ax[0].legend(fontsize=8)
    ax[0].grid(alpha=0.3)
    lines = []
    fp = series.get("next_token_s0_fp32_separate")
    for prec in ("bf16", "autocast", "bf16ac"):
        other = series.get(f"next_token_s0_{prec}_separate")
        if not (fp and other):
            continue
        common = sorted(set(fp) & set(other))
        d = [other[s] - fp[s] for s in common]
        ax[1].plot(common, d, lw=1, label=f"{prec} - fp32, seed 0 (same batches)")
        rel = [abs(x) / fp[s] for x, s in zip(d, common)]
        lines.append(f"{prec} - fp32 (seed 0, same batches, {len(common)} steps): mean {sum(d) / len(d):+.4f}, "
                     f"mean |diff| {sum(abs(x) for x in d) / len(d):.4f} ({100 * sum(rel) / len(rel):.2f} % of the "
                     f"loss), largest |diff| {max(abs(x) for x in d):.4f}")
        last = [s for s in common if s > max(common) - 25]
        lines.append(f"  last 25 steps: fp32 {sum(fp[s] for s in last) / len(last):.4f}, "
                     f"{prec} {sum(other[s] for s in last) / len(last):.4f}")
    ax[1].axhline(0, color="k", lw=0.5)
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("loss difference")
    ax[1].legend(fontsize=8)
    ax[1].grid(alpha=0.3)
    fig.suptitle("SmolLM2-135M LoRA r=32, gsm_symbolic: next-token training loss, fp32 vs bf16 "
                 "(weights; weights + autocast)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--output", default=None, help="one JSON line per run and split")
    ap.add_argument("--plot", default=None, help="loss curves fp32 vs bf16 (PNG)")
    args = ap.parse_args()
    losses = {}
    lf = args.runs / "losses.jsonl"
    if lf.is_file():
        for line in lf.read_text().splitlines():
            r = json.loads(line)
            losses[(str(Path(r["model"])), r["split"])] = r
    rows = collect(args.runs, losses)
    if args.output:
        Path(args.output).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(table(before_rows() + rows))
    print()
    print(paired(rows, losses))
    print()
    print(norm_shares(args.runs))
    if args.plot:
        print()
        print(curves(args.runs, args.plot))


if __name__ == "__main__":
    main()
