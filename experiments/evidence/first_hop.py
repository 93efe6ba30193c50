"""Do a star-graph MuToR run's registers predict the first hop, the one step that needs planning?

Bachmann & Nagarajan's "Clever Hans" plateau: teacher forcing teaches a model to follow the edge out of the
previous node, which solves every hop but the first; the first is then a guess among the arms (1/degree). The
paper's claim (section 4.3) is that registers, trained to predict d >= 2 tokens ahead and never the next one,
cannot take that shortcut for the first hop and so learn to plan. This measures the registers directly, on
the run's held-out graphs (a text run: the final evaluation's ``generations.jsonl``; a token-id run such as the
default job: rebuilt from its recipe), teacher-forced in one forward per graph with registers for every offset
after every token (what drafting computes):

* ``ntp``: the next-token head gets the first hop right (every token of it, each given the ones before);
* ``d=k``: the register k tokens back gets every token of the first hop right (it sees the source, and no
  token of the hop: a plan), on the graphs where that register exists (training places registers only after
  the answer's tokens and the token before it, so with a one-token source there is none 4 tokens back);
* on the graphs whose arms start with different tokens (where that token alone names the arm):
  ``*_first_token`` the same for the hop's first token, and ``d=k_an_arm`` how often the register names the
  first token of some arm at all (1.0: it chooses among the arms; 1/degree correct: it guesses).

With ``--curve`` (a token-id run whose checkpoints were kept), the same on every ``checkpoint-N`` of the run as
well, in step order, and on each the share of the objective that the first hop carries: the teacher-forced
cross-entropy of the next-token head at the hop and of the one register that predicts it (the ``d = 2`` register
after the prompt's last token), each weighted as the objective weighs it (``(1-a)`` over the answer's tokens,
``a`` over the registers training places, offsets drawn uniformly per sequence), over the whole objective.

    python experiments/evidence/first_hop.py /work/runs/evidence/sg-smollm2-g2-5/mutor_s0 [--limit 500] \
        [--append experiments/evidence/first_hop.jsonl] [--curve]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch


def teacher_forced(model, prompt: list[int], answer: list[int]) -> tuple[list[int], dict[int, list]]:
    """``(ntp, reg)``: ``ntp[j]`` the next-token head's prediction of ``answer[j]`` and ``reg[d][i]`` the prediction
    of ``answer[i]`` by the register ``d`` tokens back (None where that is before the answer), from one forward
    (:func:`mutor.generation.forward.teacher_forced_drafts`)."""
    from mutor.generation.forward import teacher_forced_drafts

    # drafts[j][d-2]: answer[j+d-1]
    ntp, drafts = teacher_forced_drafts(model, prompt, answer, model.mutor_config.d_max - 1)
    offsets = range(2, model.mutor_config.d_max + 1)
    return ntp, {d: [drafts[i - d + 1][d - 2] if i - d + 1 >= 0 else None for i in range(len(answer))] for d in offsets}


def predictions(model, tok, record: dict) -> tuple[list[int], range, list[int], dict[int, list]]:
    """One graph rendered as text (a record of the final evaluation), teacher-forced: ``(answer, hop, ntp, reg)``,
    the reference path's tokens, the first hop's indices in them and :func:`teacher_forced`'s predictions."""
    prompt = tok(record["prompt"], add_special_tokens=True)["input_ids"]
    answer = tok(",".join(map(str, record["reference"])), add_special_tokens=False)["input_ids"]
    commas = [i for i, t in enumerate(answer) if tok.decode([t]) == ","]
    return (answer, range(commas[0] + 1, commas[1]), *teacher_forced(model, prompt, answer))


def _graphs(run: Path, limit: int, model):
    """Per held-out graph: ``(answer, hop, ntp, reg, arms)``, ``arms`` the first tokens of the source's
    out-neighbours. Text runs (``render: text``) read the final evaluation's records; token-id runs (the default
    job: one token per node) rebuild the run's held-out graphs from its recipe."""
    from mutor.data.star_graph import NUM_SPECIAL, StarGraphShape, split_examples
    from mutor.utils.io import yaml_load

    recipe = yaml_load((run / "recipe.yaml").read_text(), "recipe")
    data = recipe["data"]
    if data.get("render", "ids") == "text":
        from transformers import AutoTokenizer

        gens = run / "eval" / "run" / "final" / "test" / "generations.jsonl"
        if not gens.exists():
            raise SystemExit(f"{gens} not found: evaluate the run first (mutor eval --task run --model {run})")
        tok = AutoTokenizer.from_pretrained(str(run))
        for r in [json.loads(line) for line in gens.read_text().splitlines()][:limit]:
            edges = [tuple(map(int, e.split(","))) for e in r["prompt"].split("/")[0].split("|")]
            arms = [tok(str(v), add_special_tokens=False)["input_ids"][0] for u, v in edges if u == r["reference"][0]]
            yield (*predictions(model, tok, r), arms)
        return
    shape = StarGraphShape.from_options(data)
    _, test = split_examples(shape, int(data.get("num_train", 20_000)), int(data.get("num_test", 500)),
                             int(data.get("data_seed", recipe["seed"])))
    for ex in test[:limit]:
        answer = ex.answer_ids()
        arms = [NUM_SPECIAL + v for u, v in ex.edges if u == ex.source]
        yield (answer, range(1, 2), *teacher_forced(model, ex.prompt_ids(), answer), arms)


def hop_share(model, graphs: list[tuple[list[int], list[int]]]) -> dict:
    """On token-id graphs ``(prompt, answer)`` (the hop is ``answer[1]``), teacher-forced: the mean cross-entropy of
    the next-token head at the hop (``hop_ntp_ce``) and on the answer (``ntp_ce``), of the register that predicts
    the hop (``hop_reg_ce``: ``d = 2`` after the prompt's last token) and of every register training places
    (``reg_ce``, offsets ``min_offset..d_max`` drawn uniformly per sequence, a register only where its target is in
    the answer), and the share of the objective ``(1-a)·L_ntp + a·L_reg`` the hop carries (``hop_share``: its
    next-token term and its register's, each weighted as the objective weighs it)."""
    from mutor.generation.forward import ModelForward
    from mutor.generation.loop import Feed

    cfg = model.mutor_config
    if cfg.min_offset < 2:                     # a d = 1 register would be fed a token that is not in the drafts' rows
        raise SystemExit("hop_share measures runs with min_offset >= 2 (the star-graph recipes' setting)")
    offsets = range(cfg.min_offset, cfg.d_max + 1)
    a, n = cfg.loss_weight, len(graphs[0][1])
    ntp = torch.zeros(n)
    # reg[d][j]: the register d after answer[j-1] (j = 0: after the prompt's last token), predicting answer[j+d-1]
    reg = {d: torch.zeros(n) for d in offsets}
    with torch.no_grad():
        for prompt, answer in graphs:
            rows = ModelForward(model, cfg.d_max - 1, 0).forward(
                Feed(list(prompt), list(answer[:-1]), cfg.d_max - 1, list(range(n))))
            target = torch.tensor(answer)
            ntp += torch.nn.functional.cross_entropy(rows.regular.float(), target, reduction="none")
            for d in offsets:
                for j in range(n - d + 1):
                    reg[d][j] += float(torch.nn.functional.cross_entropy(rows.registers[j, d - 2].float(),
                                                                         target[j + d - 1]))
    ntp, reg = ntp / len(graphs), {d: r / len(graphs) for d, r in reg.items()}
    p = 1 / len(offsets)
    placed = sum(p * (n - d + 1) for d in offsets)                      # registers a sequence gets, on average
    reg_sum = sum(p * float(r[:n - d + 1].sum()) for d, r in reg.items())
    l_ntp, l_reg = float(ntp.mean()), reg_sum / placed
    objective = (1 - a) * l_ntp + a * l_reg
    hop = (1 - a) * float(ntp[1]) / n + a * p * float(reg[2][0]) / placed
    return {"ntp_ce": round(l_ntp, 4), "hop_ntp_ce": round(float(ntp[1]), 4), "reg_ce": round(l_reg, 4),
            "hop_reg_ce": round(float(reg[2][0]), 4), "objective": round(objective, 4),
            "hop_share": round(hop / objective, 4) if objective > 0 else None}


def _token_id_graphs(run: Path, limit: int) -> list[tuple[list[int], list[int]]]:
    """A token-id run's held-out graphs, rebuilt from its recipe: ``(prompt, answer)`` ids."""
    from mutor.data.star_graph import StarGraphShape, split_examples
    from mutor.utils.io import yaml_load

    recipe = yaml_load((run / "recipe.yaml").read_text(), "recipe")
    data = recipe["data"]
    if data.get("render", "ids") != "ids":
        raise SystemExit(f"{run}: --curve measures token-id runs (data.render: ids)")
    _, test = split_examples(StarGraphShape.from_options(data), int(data.get("num_train", 20_000)),
                             int(data.get("num_test", 500)), int(data.get("data_seed", recipe["seed"])))
    return [(ex.prompt_ids(), ex.answer_ids()) for ex in test[:limit]]


def curve(run: Path, limit: int) -> list[dict]:
    """:func:`first_hop_rates` and :func:`hop_share` on every kept ``checkpoint-N`` of ``run`` and on its final
    model, in step order."""
    from mutor.methods.mutor import MuToRModel

    graphs = _token_id_graphs(run, limit)
    cks = sorted((int(c.name.split("-")[1]), c) for c in run.glob("checkpoint-*") if c.name.split("-")[1].isdigit())
    final = json.loads((run / "summary.json").read_text())["global_step"]
    points = []
    for step, path in [*cks, *([] if final in dict(cks) else [(final, run)])]:
        model = MuToRModel.from_pretrained(str(path), dtype=torch.float32).eval()
        rates = first_hop_rates(run, limit, model)
        points.append({"step": step, **{k: v for k, v in rates.items() if k != "checkpoint"},
                       **hop_share(model, graphs)})
    return points


def first_hop_rates(run: Path, limit: int, model=None) -> dict:
    """The rates above on ``run``'s held-out graphs, of its final model (or of ``model``, one of its
    checkpoints)."""
    from mutor.methods.mutor import MuToRModel

    if not (run / "mutor_config.json").exists():
        raise SystemExit(f"{run} has no registers (no mutor_config.json): a MuToR run is needed")
    model = model if model is not None else MuToRModel.from_pretrained(str(run), dtype=torch.float32).eval()
    offsets = list(range(2, model.mutor_config.d_max + 1))
    hits, seen = Counter(), Counter()                  # per measure: right, and graphs where it exists
    graphs = 0
    for answer, hop, ntp, reg, arms in _graphs(run, limit, model):
        graphs += 1
        split = len(set(arms)) == len(arms)            # the arms' first tokens differ
        i = hop[0]
        for name, pred in [("ntp", ntp), *((f"d={d}", reg[d]) for d in offsets)]:
            if pred[i] is None:                        # no register d tokens before the hop (it would sit in the
                continue                               # prompt, where training places none)
            seen[name] += 1
            hits[name] += all(pred[j] == answer[j] for j in hop)
            if split:
                seen[f"{name}_first_token"] += 1
                hits[f"{name}_first_token"] += pred[i] == answer[i]
                if name != "ntp":
                    seen[f"{name}_an_arm"] += 1
                    hits[f"{name}_an_arm"] += pred[i] in arms
    rates = {k: round(hits[k] / seen[k], 3) for k in seen}
    return {"checkpoint": str(run), "graphs": graphs, "graphs_arms_split_by_first_token": seen["ntp_first_token"],
            **rates, "graphs_per_measure": dict(seen)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a finished, evaluated star-graph MuToR run directory")
    ap.add_argument("--limit", type=int, default=500, help="held-out graphs (the first N of the evaluation)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--append", type=Path, default=None, help="also append the row to this JSONL file")
    ap.add_argument("--output", type=Path, default=None, help="also write the row to this JSON file")
    ap.add_argument("--curve", action="store_true",
                    help="also every kept checkpoint, with the hop's share of the objective (token-id runs)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    found = first_hop_rates(args.run, args.limit)
    if args.curve:
        found["curve"] = curve(args.run, args.limit)
    row = json.dumps(found)
    print(row)
    if args.output is not None:
        args.output.write_text(row + "\n")
    if args.append is not None:
        with args.append.open("a") as f:
            f.write(row + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
