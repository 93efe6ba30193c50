"""The round loop of drafting with registers, apart from the model: feed, verify, emit, draft again.

Each round asks the proposer (:mod:`mutor.generation.proposer`) what to feed, hands that to a *target* (the
model's forward and its cache, :mod:`mutor.generation.forward`; or a recorded trace and a table of costs, in
``mutor.generation.replay``), verifies the draft against the target's own next-token rows, emits the kept
tokens and the target's own token after them, and gives the proposer the registers' next draft. Nothing here
knows what the target is: the replay of recorded traces runs this very loop with an injected forward and clock.

Verification is lossless. Greedy: a draft token is kept while it equals the model's own choice at its place
(argmax of the logits after the logits processors, as ``generate`` picks), then the model's choice at the first
mismatch, or after the last draft token, is appended. Sampled: speculative sampling (Leviathan et al. 2023; Chen
et al. 2023): a draft token drawn from ``q`` is kept with probability ``min(1, p/q)``, ``p`` the model's
distribution after the processors and warpers; at the first rejection a token is drawn from the residual
``max(0, p - q)``, and after a draft kept whole from ``p``. Each emitted token then follows the model's own
sampling distribution exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

import torch

from .proposer import Outcome, Proposer
from .stats import DraftStats


@dataclass
class Feed:
    """One forward's input: the tokens not yet in the cache, a draft after them, and registers.

    Attributes:
        pending: Kept tokens not yet in the cache: the prompt in the first round, then the newest kept token.
        draft: Drafted tokens after them.
        registers: Registers after each token in ``ends`` (offsets 2..registers+1).
        ends: Indices into ``pending[-1:] + draft`` of the tokens followed by registers.
    """

    pending: list[int]
    draft: list[int]
    registers: int
    ends: list[int]

    @property
    def rows(self) -> int:
        """Rows of the forward: its tokens and its registers."""
        return len(self.pending) + len(self.draft) + len(self.ends) * self.registers


@dataclass
class Rows:
    """What a forward gives back.

    Attributes:
        regular: ``(1 + len(draft), V)`` logits after the newest kept token and after each draft token.
        registers: ``(len(ends), registers, V)`` the register rows' logits (offsets 2.. after each end).
    """

    regular: torch.Tensor
    registers: torch.Tensor


class Target(Protocol):
    """The model side of a round (:class:`~mutor.generation.forward.ModelForward`, or a recorded trace)."""

    def forward(self, feed: Feed) -> Rows:
        """Run one forward over ``feed`` (its tokens join the cache) and return its logits."""
        ...

    def keep(self, length: int) -> None:
        """Keep the cache's first ``length`` entries (the kept tokens), dropping registers and rejected drafts."""
        ...


Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Selector:
    """How logits become tokens: greedy or sampled, after the logits processors, as ``generate`` picks.

    Args:
        sample: Sample (speculative sampling) instead of greedy decoding.
        processor: ``processor(input_ids (1, L), scores (1, V)) -> (1, V)``, applied to each row with the tokens
            before it (transformers' ``LogitsProcessorList``, warpers included when sampling); None: none.
        generator: Random numbers for sampling (None: torch's global generator, as ``generate``).
    """

    def __init__(self, sample: bool = False, processor: Optional[Processor] = None,
                 generator: Optional[torch.Generator] = None):
        self.sample, self.processor, self.generator = sample, processor, generator

    def scores(self, context: list[int], logits: torch.Tensor) -> torch.Tensor:
        """``(V,)`` float32 scores of one row after ``context`` (the processors applied)."""
        row = logits.float()
        if self.processor is None:
            return row
        ids = torch.tensor([context], dtype=torch.long, device=logits.device)
        return self.processor(ids, row[None])[0]

    def verify(self, context: list[int], draft: list[int], q: Optional[torch.Tensor],
               logits: torch.Tensor) -> tuple[int, int, list[torch.Tensor]]:
        """The draft checked against the model's rows.

        Args:
            context: The tokens before the first row's prediction (the output so far).
            draft: The drafted tokens fed; ``logits[i]`` is the model's row after ``draft[:i]``.
            q: ``(len(draft), V)`` the draft distributions (sampling).
            logits: ``(len(draft) + 1, V)`` the model's rows.

        Returns:
            ``(kept, next token, scores)``: draft tokens kept, the model's own token after them, and the processed
            scores of each emitted position (kept + 1 of them).
        """
        if not self.sample and self.processor is None:       # one argmax for every row
            greedy = logits.argmax(-1).tolist()
            kept = next((i for i, g in enumerate(draft) if g != greedy[i]), len(draft))
            return kept, greedy[kept], list(logits[:kept + 1].float())
        scores = []
        for i in range(len(draft) + 1):
            s = self.scores(context + draft[:i], logits[i])                              # (V,)
            scores.append(s)
            if not self.sample:
                choice = int(s.argmax())
                if i == len(draft) or choice != draft[i]:
                    return i, choice, scores
                continue
            p = torch.softmax(s, -1)
            if i == len(draft):
                return i, int(torch.multinomial(p, 1, generator=self.generator)), scores
            g = draft[i]
            u = torch.rand((), generator=self.generator, device=p.device)
            if not u * q[i, g] < p[g]:                            # u < p/q, without dividing by a tiny q
                residual = (p - q[i].to(p)).clamp(min=0)
                return i, int(torch.multinomial(residual / residual.sum(), 1, generator=self.generator)), scores
        raise AssertionError("unreachable")

    def draft(self, context: list[int], logits: torch.Tensor) -> tuple[list[int], Optional[torch.Tensor]]:
        """The registers' draft from their rows ``(r, V)``: each row's choice after the processors (given
        ``context``, the tokens known), and when sampling the distributions it was drawn from ``(r, V)``."""
        if not self.sample and self.processor is None:
            return logits.argmax(-1).tolist(), None
        scores = torch.stack([self.scores(context, row) for row in logits])              # (r, V)
        if not self.sample:
            return scores.argmax(-1).tolist(), None
        q = torch.softmax(scores, -1)
        return torch.multinomial(q, 1, generator=self.generator)[:, 0].tolist(), q


def decode(target: Target, proposer: Proposer, selector: Selector, prompt: list[int], max_new_tokens: int,
           eos: set[int], stop: Optional[Callable[[list[int], torch.Tensor], bool]] = None,
           clock: Callable[[], float] = time.perf_counter,
           on_token: Optional[Callable[[int, torch.Tensor], None]] = None) -> tuple[list[int], DraftStats]:
    """Decode one prompt with drafts, round by round.

    Args:
        target: The forward and its cache.
        proposer: What to feed each round, and what it learns.
        selector: Greedy or sampled, after the logits processors.
        prompt: The prompt's tokens.
        max_new_tokens: The most tokens to generate (>= 1).
        eos: Tokens a draft stops at (decoding is expected to stop there).
        stop: ``stop(tokens so far, scores of the newest)``: decoding stops after this token (default: when it is
            in ``eos``); it is asked after each emitted token, as ``generate`` asks its stopping criteria.
        clock: Seconds, to time each forward by (with its verification, which waits for the results).
        on_token: Called with each emitted token and its processed scores (a streamer, ``output_scores``).

    Returns:
        ``(tokens, stats)``: the prompt followed by the generated tokens, and the run's counts.
    """
    stop = stop or (lambda out, scores: out[-1] in eos)
    out, stats, pending, done = list(prompt), DraftStats(), list(prompt), False
    try:
        while not done:
            prompt_round = stats.forwards == 0
            room = max_new_tokens - stats.new_tokens - 1             # tokens this round may emit after its first
            proposal = proposer.propose(room, eos, prompt_round)
            feed = Feed(pending, proposal.draft, proposal.registers, proposal.ends)
            t0 = clock()
            rows = target.forward(feed)
            kept, nxt, scores = selector.verify(out, proposal.draft, proposal.q, rows.regular)
            seconds = clock() - t0
            stats.forwards += 1
            stats.rounds[1 + len(proposal.draft)] = stats.rounds.get(1 + len(proposal.draft), 0) + 1
            stats.register_rows += len(feed.ends) * feed.registers
            stats.verified(len(proposal.draft), kept)
            emitted = []
            for t, s in zip(proposal.draft[:kept] + [nxt], scores):
                out.append(t)
                emitted.append(t)
                stats.new_tokens += 1
                if on_token is not None:
                    on_token(t, s)
                if stats.new_tokens >= max_new_tokens or stop(out, s):
                    done = True
                    break
            draft, q = [], None
            if not done and kept in proposal.ends:                   # the registers after the newest kept token
                draft, q = selector.draft(out, rows.registers[proposal.ends.index(kept)])
            proposer.update(proposal, Outcome(kept, emitted, draft, q, feed.rows, seconds, prompt_round))
            if not done:
                target.keep(len(out) - 1)                            # every kept token but the newest
                pending = [nxt]
    finally:
        proposer.finish()
    return out, stats
