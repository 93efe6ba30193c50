"""Register drafting replayed offline: a draft policy's decisions and seconds on recorded traces, no model.

Greedy drafting is deterministic given two things: the greedy answer ``y`` and, after every token, the
registers' draft of the tokens after the next one. Both come from ONE teacher-forced forward per prompt
(:func:`record`: the prompt, then the answer as one long draft, with registers after every token, which is
what drafting computes round by round). :func:`replay` then runs the decoding loop itself
(:func:`mutor.generation.loop.decode`, with the policy's proposer) on a :class:`TraceTarget`: a forward that
answers from the trace and charges each forward from a table of measured seconds by its number of rows, on an
injected clock. So a policy (``DraftPolicy`` with some settings, a fixed K) can be compared with others, and
with the best fixed K in hindsight, on the same prompts without a quiet machine and in seconds.

    python -m benchmarks.draft_replay RUN/checkpoint-125 --task reasoning_gym --split validation --limit 50 \
        --record traces.json                # once: a forward per prompt, and the row costs (--dtype as decoded)
    python -m benchmarks.draft_replay RUN/checkpoint-125 --task reasoning_gym --traces traces.json
                                            # the row costs again (on a quiet machine), into traces.json
    python -m benchmarks.draft_replay --traces traces.json [--costs 60,64,67,...]   # replay: K = 1..d_max, auto
    python -m benchmarks.draft_replay --traces traces.json --repeats 10 \
        --load draft_traces/forward_times/wr3ep0_fp32_{quiet,beside_training}.json   # under a recorded load
    python -m benchmarks.draft_replay --traces traces.json --sample 20 --draws 100 --load ...
                                            # what one 20-prompt measurement (drafting.py's) can show

The row costs depend on the machine, the dtype, the threads and the cached length, not on the registers:
measure them where the policy will run, with nothing else loading the CPU.

``benchmarks/draft_traces/`` keeps the traces recorded from the evidence runs (validation prompts, token ids
and row costs only), so that a policy can be replayed on them after their checkpoints are gone;
tests/test_draft_replay.py holds ``auto`` to at least plain decoding and near the best fixed K on each.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

import torch

from mutor.generation.loop import Feed, Rows, Selector, decode
from mutor.generation.policy import DraftPolicy, DraftSettings, FixedDraft
from mutor.generation.proposer import RegisterProposer


def record(model, prompt: list[int], max_new_tokens: int, eos: Optional[int],
           prefix_attention: Optional[str] = None) -> dict:
    """``{"prompt_len", "answer", "drafts"}``: greedy answer (through eos, at most ``max_new_tokens``) and
    ``drafts[j]``: the registers' greedy draft (offsets 2..d_max) after the prompt (j = 0) or after ``answer[j-1]``,
    which proposes ``answer[j+1], answer[j+2], ...``."""
    from mutor.generation import generate
    from mutor.generation.forward import teacher_forced_drafts

    out, _ = generate(model, torch.tensor([prompt]), max_new_tokens, 1, eos_token_id=[] if eos is None else eos,
                      prefix_attention=prefix_attention)
    answer = out[0, len(prompt):].tolist()
    mode = prefix_attention or model.mutor_config.prefix_attention
    _, regs = teacher_forced_drafts(model, prompt, answer, model.mutor_config.d_max - 1,
                                    len(prompt) if mode == "bidirectional" else 0)     # (len(answer), K-1)
    return {"prompt_len": len(prompt), "answer": answer, "drafts": regs}


def row_costs(model, prompt: list[int], max_rows: int, reps: int = 5,
              prefix_attention: Optional[str] = None) -> dict[int, float]:
    """Seconds of a decoding forward of 1..``max_rows`` rows after ``prompt`` is cached, the median of ``reps``,
    fed as drafting feeds them (the pending token and a draft, no register; the cost of a forward depends on its
    rows, not on which of them are registers); key 0: the forward of the whole prompt. Rows are timed in a
    shuffled order, so that a change of machine load does not bias one row count."""
    import random
    import time

    from mutor.generation.forward import ModelForward

    mode = prefix_attention or model.mutor_config.prefix_attention
    prompt_len = len(prompt) if mode == "bidirectional" else 0
    times: dict[int, list[float]] = {r: [] for r in range(1, max_rows + 1)}
    order = [r for r in times for _ in range(reps)]
    random.Random(0).shuffle(order)
    with torch.no_grad():
        target = ModelForward(model, 0, prompt_len)
        target.forward(Feed(prompt[:-1], [], 0, []))                                   # the prompt cached
        past = target.cache.get_seq_length()
        for r in [1, 1] + order:                                                       # two warm-up steps
            t0 = time.perf_counter()
            target.forward(Feed(prompt[-1:], prompt[:1] * (r - 1), 0, []))
            times[r].append(time.perf_counter() - t0)
            target.keep(past)                                                          # back to the prompt
        prompt_times = []
        for _ in range(3):                                                             # the prompt's own forward
            t0 = time.perf_counter()
            ModelForward(model, 0, prompt_len).forward(Feed(prompt, [], 0, []))
            prompt_times.append(time.perf_counter() - t0)
    costs = {r: sorted(t)[len(t) // 2] for r, t in times.items()}
    return {**costs, 0: sorted(prompt_times)[1]}                                    # 0: the prompt's forward


class TraceTarget:
    """A recorded trace as the model of :func:`mutor.generation.loop.decode`: each forward's rows answer from
    the trace (one-hot logits over the trace's own tokens) and cost ``cost(rows)`` seconds, charged to
    ``charged`` and told to the policy through :meth:`clock`.

    Args:
        trace: ``{"prompt_len", "answer", "drafts"}`` (:func:`record`).
        ids: The trace's token ids by index (the loop runs on indices; one more index than ids is a token no
            trace row holds).
        cost: ``cost(rows)``: seconds, or ``(charged, told)`` (a clock that does not see the load).
        prompt_seconds: The prompt's forward (its registers cost rows too, in proportion: measured, float32, one
            thread, 20 sentence-reordering prompts of 30 tokens, 3 registers cost 10.0 % more, their rows 9.85 %).
    """

    def __init__(self, trace: dict, ids: list[int], cost: Callable, prompt_seconds: float):
        index = {t: i for i, t in enumerate(ids)}
        self.vocab, self.none = len(ids) + 1, len(ids)
        self.answer = [index[t] for t in trace["answer"]]
        self.drafts = [[index[t] for t in d] for d in trace["drafts"]]
        self.prompt_len, self.cost, self.prompt_seconds = trace["prompt_len"], cost, prompt_seconds
        self.cached, self.charged, self.told = 0, 0.0, 0.0

    def clock(self) -> float:
        """The seconds the policy has been told so far."""
        return self.told

    def _rows(self, tokens: list[list[int]]) -> torch.Tensor:
        width = max((len(t) for t in tokens), default=0)
        idx = torch.tensor([t + [self.none] * (width - len(t)) for t in tokens], dtype=torch.long)
        return torch.zeros(*idx.shape, self.vocab).scatter_(-1, idx[..., None], 1.0)

    def forward(self, feed: Feed) -> Rows:
        """The trace's rows for ``feed``; its cost charged."""
        n = self.cached + len(feed.pending) - self.prompt_len           # answer tokens before the first row's
        at = lambda i, seq: seq[i] if i < len(seq) else self.none      # noqa: E731
        regular = self._rows([[at(n + i, self.answer)] for i in range(1 + len(feed.draft))])[:, 0]
        drafts = [(self.drafts[n + e] if n + e < len(self.drafts) else [])[:feed.registers] for e in feed.ends]
        registers = self._rows([d + [self.none] * (feed.registers - len(d)) for d in drafts]) if drafts else \
            torch.zeros(0, feed.registers, self.vocab)
        if self.cached == 0:                                              # the prompt's forward, by its rows
            took = told = self.prompt_seconds * feed.rows / self.prompt_len
        else:
            c = self.cost(feed.rows)
            took, told = c if isinstance(c, tuple) else (c, c)
        self.charged += took
        self.told += told
        return Rows(regular, registers)

    def keep(self, length: int) -> None:
        """The tokens now cached (the position of the next forward's first row)."""
        self.cached = length


def replay(policy, trace: dict, max_new_tokens: int, eos: set[int], cost: Callable[[int], float],
           prompt_seconds: float = 0.0) -> dict:
    """The decoding loop on a recorded trace with ``policy`` choosing; each forward after the prompt's costs
    ``cost(rows)`` seconds, which the policy is told as its measurement (its clock is the replay's); the prompt's
    costs ``prompt_seconds``, more in proportion to the registers fed after it. The prompt's forward is charged
    whatever the policy (plain decoding pays it too). Returns the seconds, forwards, rounds per K, offered /
    accepted per offset and the emitted tokens."""
    ids = sorted({t for t in trace["answer"]} | {t for d in trace["drafts"] for t in d} | set(eos))
    target = TraceTarget(trace, ids, cost, prompt_seconds)
    index = {t: i for i, t in enumerate(ids)}
    out, stats = decode(target, RegisterProposer(policy), Selector(), [target.none] * trace["prompt_len"],
                        max_new_tokens, {index[t] for t in eos}, clock=target.clock)
    return {"seconds": target.charged, "forwards": stats.forwards, "new_tokens": stats.new_tokens,
            "rounds": stats.rounds, "offered": stats.offered, "accepted": stats.accepted,
            "tokens": [ids[i] for i in out[trace["prompt_len"]:]]}


def fixed(k: int) -> FixedDraft:
    """A fixed draft length K with registers after every fed token, as ``generate(..., draft_registers=K)``."""
    return FixedDraft(k)


def load_ratios(quiet: dict, loaded: dict, min_samples: int = 20) -> dict[int, list[float]]:
    """A recorded load as cost factors: per row count with at least ``min_samples`` loaded forwards, each loaded
    forward's seconds over the quiet median of its row count (key 1 always: the pool other counts draw from).
    ``quiet`` / ``loaded``: per-forward times of the same decoding, ``{chooser: [[rows, seconds], ...]}`` as in
    ``draft_traces/forward_times/``."""
    def by_rows(log: dict) -> dict[int, list[float]]:
        out: dict[int, list[float]] = {}
        for forwards in log.values():
            for rows, sec in forwards:
                out.setdefault(int(rows), []).append(sec)
        return out

    q, l = by_rows(quiet), by_rows(loaded)
    median = {r: sorted(v)[len(v) // 2] for r, v in q.items()}
    return {r: [s / median[r] for s in v] for r, v in l.items() if r in median and (len(v) >= min_samples or r == 1)}


def _setup(traces: dict, costs: dict[int, float], prompt_seconds: Optional[float]):
    """``(eos ids, table, prompt seconds)``: the table gives a forward's seconds by its rows (above its largest
    entry, that entry's in proportion); the prompt's forward costs ``prompt_seconds``, else the table's key 0,
    else two one-row forwards."""
    costs = dict(costs)
    p_sec = costs.pop(0, costs[1] * 2) if prompt_seconds is None else prompt_seconds
    top = max(costs)
    return set(traces["eos"]), (lambda rows: costs[rows] if rows in costs else costs[top] * rows / top), p_sec


def _drawn(table: Callable[[int], float], rng, noise: float, spikes: float,
           load: Optional[dict[int, list[float]]], drift: float = 0.0, clock: str = "wall",
           cold: float = 1.0) -> Callable:
    """A forward's cost as drawn under a machine's load: the table's times exp(N(0, noise)), times a factor drawn
    from a recorded load (its row count's, else one row's), times ``exp(x)`` for a load that moves (``drift``:
    x follows x <- 0.98 x + N(0, drift) from forward to forward, so that neighbouring forwards share their load),
    and with probability ``spikes`` 2-3x that; the first forward of each row count ``cold`` times that (a
    shape's warm-up). ``clock="cpu"``: returns ``(that, what the policy is told)``, the latter without the
    load, drift and spikes (a CPU-time clock, idealised: waiting for a core is all the load does)."""
    import math

    level, seen = [0.0], set()

    def cost(rows):
        c = own = table(rows) * math.exp(rng.gauss(0.0, noise)) if noise else table(rows)
        if rows not in seen:
            seen.add(rows)
            c, own = c * cold, own * cold
        if load:
            c *= rng.choice(load.get(rows) or load[1])
        if drift:
            level[0] = 0.98 * level[0] + rng.gauss(0.0, drift)
            c *= math.exp(level[0])
        c = c * rng.uniform(2.0, 3.0) if spikes and rng.random() < spikes else c
        return (c, own) if clock == "cpu" else c
    return cost


def compare(traces: dict, costs: dict[int, float], policies: dict[str, Callable[[], object]],
            prompt_seconds: Optional[float] = None, noise: float = 0.0, spikes: float = 0.0, repeats: int = 1,
            load: Optional[dict[int, list[float]]] = None, drift: float = 0.0, clock: str = "wall",
            cold: float = 1.0) -> dict:
    """Seconds of each policy over every trace (one policy instance for all prompts, as ``mutor eval``), and
    its speed against plain decoding (K = 1) on the same table. ``noise``: each forward takes its table cost
    times exp(N(0, noise)), and with probability ``spikes`` 2-3x that (a machine's load); ``load``
    (:func:`load_ratios`): times a factor drawn from a recorded load's, its row count's or else one row's. The
    policy is told what it took. ``repeats``: that many draws (seeds 0, 1, ...), summed."""
    import random

    eos, table, p_sec = _setup(traces, costs, prompt_seconds)
    out = {}
    for name, make in {"K=1": lambda: fixed(1), **policies}.items():
        total = Counter()
        for seed in range(repeats):
            cost = _drawn(table, random.Random(seed), noise, spikes, load, drift, clock, cold)
            policy = make()
            for tr in traces["traces"]:
                r = replay(policy, tr, traces["max_new_tokens"], eos, cost, p_sec)
                total.update({"seconds": r["seconds"], "forwards": r["forwards"], "new_tokens": r["new_tokens"]})
                total.update({f"K={k}": v for k, v in r["rounds"].items()})
        out[name] = dict(total)
    for name in out:
        out[name]["speedup"] = round(out["K=1"]["seconds"] / out[name]["seconds"], 3)
    return out


def spread(traces: dict, costs: dict[int, float], policies: dict[str, Callable[[], object]], sample: int,
           draws: int, prompt_seconds: Optional[float] = None, noise: float = 0.0, spikes: float = 0.0,
           load: Optional[dict[int, list[float]]] = None, drift: float = 0.0, clock: str = "wall",
           cold: float = 1.0) -> dict:
    """What one short measurement can show: ``draws`` times, ``sample`` prompts drawn at random (draw i: seed i)
    and decoded by a fresh policy of each kind and by plain decoding, as ``drafting.py`` measures a run (20
    prompts, one policy for them all), each forward's cost drawn as in :func:`compare` (the same seed for every
    policy within a draw). Per policy: the speed-up over plain decoding, its mean, 5th, 50th and 95th
    percentiles over the draws, and the share of draws in which it was slower than plain."""
    import random

    eos, table, p_sec = _setup(traces, costs, prompt_seconds)
    ratios: dict[str, list[float]] = {name: [] for name in policies}
    for i in range(draws):
        prompts = random.Random(i).sample(traces["traces"], min(sample, len(traces["traces"])))
        secs = {}
        for name, make in {"K=1": lambda: fixed(1), **policies}.items():
            cost, policy = _drawn(table, random.Random(10_000 + i), noise, spikes, load, drift, clock, cold), make()
            secs[name] = sum(replay(policy, tr, traces["max_new_tokens"], eos, cost, p_sec)["seconds"]
                             for tr in prompts)
        for name in policies:
            ratios[name].append(secs["K=1"] / secs[name])
    pct = lambda v, q: sorted(v)[min(int(q * len(v)), len(v) - 1)]             # noqa: E731
    return {name: {"mean": round(sum(v) / len(v), 3), "p5": round(pct(v, 0.05), 3), "p50": round(pct(v, 0.5), 3),
                   "p95": round(pct(v, 0.95), 3), "slower_than_plain": round(sum(x < 1 for x in v) / len(v), 3)}
            for name, v in ratios.items()}


def _load(args):
    """(model, tokenizer, prompts, max_new_tokens, prefix mode) of ``args.checkpoint`` on its task's split."""
    from mutor.eval.harness import load_drafter, run_info, task_prompts

    mode = run_info(str(args.checkpoint)).get("prefix_attention", "causal")
    model, tok = load_drafter(str(args.checkpoint), dtype=args.dtype, device="cpu")
    prompts, bench = task_prompts(args.task, tok, args.split, args.data, args.limit, model_path=str(args.checkpoint))
    return model, tok, prompts, int(args.max_new_tokens or bench.template.max_new_tokens), mode


def _costs(model, prompts, mode) -> dict:
    d_max = model.mutor_config.d_max
    mid = sorted(prompts, key=len)[len(prompts) // 2]                # a prompt of median length
    return {"threads": torch.get_num_threads(),
            "row_seconds": row_costs(model, mid, d_max * d_max, prefix_attention=mode)}


def settings(pairs: list[str]) -> dict:
    """``NAME=VALUE`` pairs as ``DraftSettings`` keyword arguments (numbers as ints or floats, else strings)."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=VALUE, got {pair!r}")
        for kind in (int, float, str):
            try:
                out[name] = kind(value)
                break
            except ValueError:
                pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=Path, nargs="?", help="record traces (or, with --traces, costs) from this "
                                                              "MuToR checkpoint")
    ap.add_argument("--task", default=None)
    ap.add_argument("--split", default="validation")
    ap.add_argument("--limit", type=int, default=50)
    ap.add_argument("--data", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--record", type=Path, default=None, help="write the traces (and the row costs) here")
    ap.add_argument("--traces", type=Path, default=None, help="replay these traces; with a checkpoint: measure its "
                                                              "row costs again into this file")
    ap.add_argument("--costs", default=None, help="ms of a forward of 1, 2, ... rows, comma-separated "
                                                  "(default: the costs measured when recording)")
    ap.add_argument("--noise", type=float, default=0.0, help="log-normal spread of a forward's cost (e.g. 0.1)")
    ap.add_argument("--spikes", type=float, default=0.0, help="share of forwards taking 2-3x (e.g. 0.03)")
    ap.add_argument("--load", type=Path, nargs=2, metavar=("QUIET", "LOADED"), default=None,
                    help="draw each forward's cost factor from a recorded load: per-forward times of the same "
                         "decoding quiet and loaded (draft_traces/forward_times/)")
    ap.add_argument("--drift", type=float, default=0.0, help="a load that moves: each forward's cost times exp(x), "
                    "x <- 0.98 x + N(0, DRIFT) per forward, so that neighbouring forwards share their load (e.g. 0.1)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall", help="what the policy is told: the "
                    "loaded cost (a wall clock), or the cost without the load (a CPU-time clock, idealised)")
    ap.add_argument("--cold", type=float, default=1.0, help="the first forward of each row count costs this many "
                    "times more (a shape's warm-up: kernels loaded, primitives made), e.g. 3")
    ap.add_argument("--repeats", type=int, default=1, help="noise draws, summed")
    ap.add_argument("--sample", type=int, default=None, help="instead: the spread of a measurement on this many "
                                                             "prompts (e.g. 20, as drafting.py), over --draws draws")
    ap.add_argument("--draws", type=int, default=100, help="with --sample: random prompt samples and cost draws")
    ap.add_argument("--auto", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting of auto's DraftSettings (memory, revisit, optimism, smoothing, ...), e.g. "
                         "--auto optimism=0.5: replayed as 'auto*' beside the default 'auto'")
    args = ap.parse_args(argv)
    if args.checkpoint is not None and args.task is None:
        ap.error("--task is needed to record from a checkpoint: an evaluation task of mutor eval (e.g. reasoning_gym)")
    if args.checkpoint is None and args.traces is None:
        ap.error("give a checkpoint to record traces from, or --traces to replay")
    if args.checkpoint is not None:
        with torch.no_grad():
            model, tok, prompts, n_new, mode = _load(args)
            if args.traces is not None:                  # costs only, e.g. again on a quiet machine
                traces = {**json.loads(args.traces.read_text()), **_costs(model, prompts, mode)}
                args.traces.write_text(json.dumps(traces))
            else:
                traces = {"checkpoint": str(args.checkpoint), "task": args.task, "split": args.split,
                          "dtype": args.dtype, "max_new_tokens": n_new, "eos": [tok.eos_token_id],
                          "d_max": model.mutor_config.d_max,
                          "traces": [record(model, p, n_new, tok.eos_token_id, mode) for p in prompts],
                          **_costs(model, prompts, mode)}
                (args.record or Path("traces.json")).write_text(json.dumps(traces))
    else:
        traces = json.loads(args.traces.read_text())
    if args.costs:
        costs = {i + 1: float(c) / 1000 for i, c in enumerate(args.costs.split(","))}
    else:
        costs = {int(r): c for r, c in traces["row_seconds"].items()}
    k_max = traces["d_max"]
    policies: dict[str, Callable[[], object]] = {f"K={k}": (lambda k=k: fixed(k)) for k in range(2, k_max + 1)}
    policies["auto"] = lambda: DraftPolicy(k_max)
    if args.auto:
        try:
            chosen = DraftSettings(**settings(args.auto))
        except (ValueError, TypeError) as e:
            ap.error(f"--auto takes NAME=VALUE settings of DraftSettings ({e})")
        policies["auto*"] = lambda: DraftPolicy(k_max, chosen)
    load = load_ratios(*(json.loads(f.read_text()) for f in args.load)) if args.load else None
    if args.sample:
        out = spread(traces, costs, policies, args.sample, args.draws, noise=args.noise, spikes=args.spikes, load=load,
                     drift=args.drift, clock=args.clock, cold=args.cold)
    else:
        out = compare(traces, costs, policies, noise=args.noise, spikes=args.spikes, repeats=args.repeats, load=load,
                      drift=args.drift, clock=args.clock, cold=args.cold)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
