"""Drafting replayed offline: a draft policy's rounds and seconds on recorded traces, without the model.

Greedy drafting is deterministic given two things: the greedy answer ``y`` and, after every token, the
registers' draft of the tokens after the next one. Both come from ONE teacher-forced forward per prompt
(:func:`record`: the prompt, then the answer as one long draft, with registers after every token, which is
what drafting computes round by round). :func:`replay` then runs the decoding loop itself
(:func:`mutor.generation.loop.decode`, with the policy's proposer) on a :class:`TraceTarget`: a forward that
answers from the trace and charges each forward from a table of measured seconds by its number of rows
(:func:`row_costs`), on an injected clock. So draft policies (a :class:`~mutor.generation.policy.DraftPolicy`
with some :class:`~mutor.generation.policy.DraftSettings`, a fixed K) are compared on the same prompts, with the
best fixed K in hindsight, in seconds and without a quiet machine (:func:`compare`, :func:`spread`), e.g.::

    traces = {"eos": [eos], "max_new_tokens": 64, "d_max": 4,
              "traces": [record(model, prompt, 64, eos) for prompt in prompts]}
    costs = row_costs(model, prompts[0], 16)                    # on the machine the policy will run on
    compare(traces, costs, {"auto": lambda: DraftPolicy(4), "K=2": lambda: FixedDraft(2)})

The row costs depend on the machine, the dtype, the threads and the cached length, not on the registers:
measure them where the policy will run, with nothing else loading the CPU. ``python -m benchmarks.draft_replay``
records and replays from the command line.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from typing import Callable, Optional

import torch

from .drafter import generate
from .forward import ModelForward, teacher_forced_drafts
from .loop import Feed, Rows, Selector, decode
from .policy import FixedDraft
from .proposer import RegisterProposer

# The loads a policy is held to (benchmarks/replay_all.py, tests/test_draft_replay.py), as :func:`compare` keyword
# arguments: the trace's own costs; each forward told a factor drawn from a recorded load (``load``, from
# :func:`load_ratios`, added by the caller) and charged that row count's mean factor; a slow random walk (told and
# charged alike: a load that moves is one a policy can follow). Each over many prompt orders (``shuffle``): a
# policy learns as it decodes, so one order is one path of its choices, and the same 50 prompts in another order
# moved a quiet replay by 2-3 % (standard deviation over 12 orders), more than the differences it is read for.
LOADS = {"quiet": {"repeats": 12, "shuffle": True}, "recorded": {"repeats": 12, "charge": "mean", "shuffle": True},
         "moving": {"drift": 0.1, "repeats": 240, "shuffle": True}}


def trace_costs(traces: dict) -> dict[int, float]:
    """A trace set's own row costs (``row_seconds``, recorded with it), keyed by rows."""
    return {int(r): c for r, c in traces["row_seconds"].items()}


def record(model, prompt: list[int], max_new_tokens: int, eos: Optional[int],
           prefix_attention: Optional[str] = None) -> dict:
    """``{"prompt_len", "answer", "drafts"}``: greedy answer (through eos, at most ``max_new_tokens``) and
    ``drafts[j]``: the registers' greedy draft (offsets 2..d_max) after the prompt (j = 0) or after ``answer[j-1]``,
    which proposes ``answer[j+1], answer[j+2], ...``."""
    out, _ = generate(model, torch.tensor([prompt]), max_new_tokens, 1, eos_token_id=[] if eos is None else eos,
                      prefix_attention=prefix_attention)
    answer = out[0, len(prompt):].tolist()
    mode = prefix_attention or model.mutor_config.prefix_attention
    _, regs = teacher_forced_drafts(model, prompt, answer, model.mutor_config.d_max - 1,
                                    len(prompt) if mode == "bidirectional" else 0)     # (len(answer), K-1)
    return {"prompt_len": len(prompt), "answer": answer, "drafts": regs}


def row_costs(model, prompt: list[int], max_rows: int, reps: int = 5,
              prefix_attention: Optional[str] = None, head: str = "auto") -> dict[int, float]:
    """Seconds of a decoding forward of 1..``max_rows`` rows after ``prompt`` is cached, the median of ``reps``,
    fed as drafting feeds them (the pending token and a draft, no register; the cost of a forward depends on its
    rows, not on which of them are registers); key 0: the forward of the whole prompt. Rows are timed in a
    shuffled order, so that a change of machine load does not bias one row count. ``head``: which product gives the
    logits (:func:`~mutor.generation.forward.head_product`)."""
    mode = prefix_attention or model.mutor_config.prefix_attention
    prompt_len = len(prompt) if mode == "bidirectional" else 0
    times: dict[int, list[float]] = {r: [] for r in range(1, max_rows + 1)}
    order = [r for r in times for _ in range(reps)]
    random.Random(0).shuffle(order)
    with torch.no_grad():
        target = ModelForward(model, 0, prompt_len, head)
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
            ModelForward(model, 0, prompt_len, head).forward(Feed(prompt, [], 0, []))
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


def load_ratios(quiet: dict, loaded: dict, min_samples: int = 20) -> dict[int, list[float]]:
    """A recorded load as cost factors: per row count with at least ``min_samples`` loaded forwards, each loaded
    forward's seconds over the quiet median of its row count (key 1 always: the pool other counts draw from).
    ``quiet`` / ``loaded``: per-forward times of the same decoding, ``{chooser: [[rows, seconds], ...]}`` as in
    ``benchmarks/draft_traces/forward_times/`` in the repository."""
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
           cold: float = 1.0, charge: str = "drawn") -> Callable:
    """A forward's cost as drawn under a machine's load: the table's times exp(N(0, noise)), times a factor drawn
    from a recorded load (its row count's, else one row's), times ``exp(x)`` for a load that moves (``drift``:
    x follows x <- 0.98 x + N(0, drift) from forward to forward, so that neighbouring forwards share their load),
    and with probability ``spikes`` 2-3x that; the first forward of each row count ``cold`` times that (a
    shape's warm-up). ``clock="cpu"``: returns ``(that, what the policy is told)``, the latter without the
    load, drift and spikes (a CPU-time clock, idealised: waiting for a core is all the load does).
    ``charge="mean"``: a recorded load's factor is charged at its row count's mean while the policy is told the
    drawn one (the policy still measures a noisy machine, but the seconds charged no longer depend on which
    factors the draws happened to give its forwards: two policies are compared on their choices, not on luck)."""
    if charge not in ("drawn", "mean"):
        raise ValueError(f"charge must be 'drawn' or 'mean', not {charge!r}")
    level, seen = [0.0], set()
    total = {r: sum(pool) for r, pool in (load or {}).items()}         # each pool's factors summed, once

    def cost(rows):
        c = own = table(rows) * math.exp(rng.gauss(0.0, noise)) if noise else table(rows)
        if rows not in seen:
            seen.add(rows)
            c, own = c * cold, own * cold
        told = c
        if load:
            pooled = rows if load.get(rows) else 1
            told = c * rng.choice(load[pooled])
            c = c * total[pooled] / len(load[pooled]) if charge == "mean" else told
        if drift:
            level[0] = 0.98 * level[0] + rng.gauss(0.0, drift)
            c, told = c * math.exp(level[0]), told * math.exp(level[0])
        if spikes and rng.random() < spikes:
            f = rng.uniform(2.0, 3.0)
            c, told = c * f, told * f
        return (c, own) if clock == "cpu" else (c, told)          # told is c unless charged the mean
    return cost


def compare(traces: dict, costs: dict[int, float], policies: dict[str, Callable[[], object]],
            prompt_seconds: Optional[float] = None, noise: float = 0.0, spikes: float = 0.0, repeats: int = 1,
            load: Optional[dict[int, list[float]]] = None, drift: float = 0.0, clock: str = "wall",
            cold: float = 1.0, charge: str = "drawn", shuffle: bool = False) -> dict:
    """Seconds of each policy over every trace (one policy instance for all prompts, as ``mutor eval``), and
    its speed against plain decoding (K = 1) on the same table. ``noise``: each forward takes its table cost
    times exp(N(0, noise)), and with probability ``spikes`` 2-3x that (a machine's load); ``load``
    (:func:`load_ratios`): times a factor drawn from a recorded load's, its row count's or else one row's. The
    policy is told what it took; ``charge="mean"``: charged the load's mean factor instead (see ``_drawn``).
    ``repeats``: that many draws (seeds 0, 1, ...), summed; ``shuffle``: each draw after the first decodes the
    prompts in another order (shuffled by its seed; the same for every policy)."""
    eos, table, p_sec = _setup(traces, costs, prompt_seconds)
    out = {}
    for name, make in {"K=1": lambda: FixedDraft(1), **policies}.items():
        total = Counter()
        for seed in range(repeats):
            cost = _drawn(table, random.Random(seed), noise, spikes, load, drift, clock, cold, charge)
            policy = make()
            order = list(traces["traces"])
            if shuffle and seed:
                random.Random(seed).shuffle(order)
            for tr in order:
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
           cold: float = 1.0, charge: str = "drawn") -> dict:
    """What one short measurement can show: ``draws`` times, ``sample`` prompts drawn at random (draw i: seed i)
    and decoded by a fresh policy of each kind and by plain decoding, as ``experiments/evidence/drafting.py``
    measures a run (20 prompts, one policy for them all), each forward's cost drawn as in :func:`compare` (the
    same seed for every policy within a draw). Per policy: the speed-up over plain decoding, its mean, 5th, 50th
    and 95th percentiles over the draws, and the share of draws in which it was slower than plain."""
    eos, table, p_sec = _setup(traces, costs, prompt_seconds)
    ratios: dict[str, list[float]] = {name: [] for name in policies}
    for i in range(draws):
        prompts = random.Random(i).sample(traces["traces"], min(sample, len(traces["traces"])))
        secs = {}
        for name, make in {"K=1": lambda: FixedDraft(1), **policies}.items():
            cost, policy = _drawn(table, random.Random(10_000 + i), noise, spikes, load, drift, clock, cold,
                                  charge), make()
            secs[name] = sum(replay(policy, tr, traces["max_new_tokens"], eos, cost, p_sec)["seconds"]
                             for tr in prompts)
        for name in policies:
            ratios[name].append(secs["K=1"] / secs[name])
    pct = lambda v, q: sorted(v)[min(int(q * len(v)), len(v) - 1)]             # noqa: E731
    return {name: {"mean": round(sum(v) / len(v), 3), "p5": round(pct(v, 0.05), 3), "p50": round(pct(v, 0.5), 3),
                   "p95": round(pct(v, 0.95), 3), "slower_than_plain": round(sum(x < 1 for x in v) / len(v), 3)}
            for name, v in ratios.items()}
