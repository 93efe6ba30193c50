"""The drafter's side of a round: which drafted tokens and registers to feed, and what it learns afterwards.

A proposer has two calls, as transformers' candidate generators (``CandidateGenerator.get_candidates`` /
``update_candidate_strategy``): :meth:`RegisterProposer.propose` a draft for this round, and
:meth:`RegisterProposer.update` from what the round accepted. Here the draft is the registers' output of the
previous round (the registers after the newest kept token), and the policy (:mod:`mutor.generation.policy`)
decides how much of it, and how many registers, the round feeds.

Every draft the registers make is checked against the tokens decoded after it, fed or not (greedy decoding), so
the acceptance is learned without feeding anything: a plain round settles the draft it did not feed. An eos a
draft foresaw stays foreseen while the tokens decoded follow that draft, so the policy knows a round is the
answer's last but one even when it has no draft at hand.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Union

import torch

from .policy import DraftPolicy, FixedDraft


@dataclass
class Proposal:
    """What a round feeds after the newest kept token.

    Attributes:
        draft: The drafted tokens fed after it (they propose ``x_{e+2}, x_{e+3}, ...``).
        q: ``(len(draft), V)`` the distributions they were drawn from (sampling), else None.
        registers: Registers after each token in ``ends``, for offsets 2..registers+1.
        ends: Indices into ``[newest kept token] + draft`` of the tokens followed by registers.
        first: The draft is the prompt's registers' (the round after the prompt's).
    """

    draft: list[int]
    q: Optional[torch.Tensor]
    registers: int
    ends: list[int]
    first: bool = False


@dataclass
class Outcome:
    """What a round gave.

    Attributes:
        kept: Draft tokens kept.
        emitted: The tokens the round added to the output, in order.
        draft: The registers' draft after the newest kept token (empty when none followed it).
        q: Its distributions (sampling), else None.
        rows: The forward's rows (tokens and registers).
        seconds: What the forward took, by the policy's clock.
        prompt: It was the prompt's forward.
    """

    kept: int
    emitted: list[int]
    draft: list[int]
    q: Optional[torch.Tensor]
    rows: int
    seconds: float
    prompt: bool = False


class Proposer(Protocol):
    """Proposes each round's draft and learns from what was accepted (:class:`RegisterProposer`)."""

    def propose(self, room: int, eos: set[int], prompt: bool) -> Proposal:
        """This round's feed: the draft to verify (at most ``room`` tokens, up to an eos) and its registers."""
        ...

    def update(self, proposal: Proposal, outcome: Outcome) -> None:
        """Learn from a round: its cost, how much of its draft was kept, and the registers' next draft."""
        ...

    def finish(self) -> None:
        """Decoding ended: settle what the unfinished rounds showed."""
        ...


def until_end(draft: list[int], eos: set[int], room: int, sampled: bool = False) -> tuple[list[int], bool]:
    """``draft`` up to its first eos and at most ``room`` tokens, and whether it foresaw an eos. Greedy: the eos
    is cut too, since feeding it saves nothing (when the drafts before it are kept, the model's own next token
    is that eos if the draft was right). Sampled: the eos stays, since dropping a draft for its value would
    change the distribution of what is emitted in its place; only the tokens after it go, which could never
    be emitted (nor any past ``max_new_tokens``)."""
    for i, t in enumerate(draft[:max(room, 0)]):
        if t in eos:
            return draft[:i + sampled], True
    return draft[:max(room, 0)], False


class RegisterProposer:
    """The registers as drafters, for one decoding: the draft at hand, the drafts being checked, the policy.

    Args:
        policy: What decides each round's feed and learns costs and acceptance (a
            :class:`~mutor.generation.policy.DraftPolicy` or :class:`~mutor.generation.policy.FixedDraft`),
            kept across decodings by its owner.
        sampled: The drafts are sampled (verified by speculative sampling; acceptance learned from verification
            only, since a sampled draft cannot be checked against tokens sampled independently).
    """

    def __init__(self, policy: Union[DraftPolicy, FixedDraft], sampled: bool = False):
        self.policy, self.sampled = policy, sampled
        self.draft: list[int] = []
        self.q: Optional[torch.Tensor] = None
        self.first = False                                 # the draft at hand is the prompt's registers'
        self.watched: list[list] = []                      # [draft, tokens decoded as drafted, first, eos after]
        self.foreseen: Optional[list[int]] = None          # a draft's tokens before its eos, not decoded yet

    def propose(self, room: int, eos: set[int], prompt: bool = False) -> Proposal:
        """This round's feed after the newest kept token.

        Args:
            room: The most tokens this round may emit after its first (``max_new_tokens`` left, minus one).
            eos: The stop tokens (a draft stops at the first).
            prompt: This is the prompt's round (its registers draft the answer's first tokens).

        Returns:
            The proposal; no register follows a token whose keeping ends decoding.
        """
        if prompt:
            # the round after feeds at most room - 1 drafted tokens (it emits one more), so registers beyond that
            # would draft tokens no round can feed
            self.foreseen = None
            r = min(self.policy.prompt_registers(), room - 1) if room > 1 else 0
            return Proposal([], None, r, [0] if r else [])
        usable, at_eos = until_end(self.draft, eos, room, self.sampled)
        if usable and not self.sampled:                    # fed or not, the decoded tokens settle it
            self.watched.append([list(usable), 0, self.first, at_eos])
        if at_eos and not self.sampled:
            self.foreseen = list(usable)
            if not usable:                                 # a draft of the eos alone
                self.policy.observe(0, 0, self.first, ended=True)
        # with no draft at hand, an eos foreseen earlier and still on course ends the answer within this round's
        # token and the next: registers would draft only the eos
        near = not usable and self.foreseen is not None and len(self.foreseen) <= 1
        j, r, tail = self.policy.plan(len(usable), self.first, at_eos or len(usable) >= room or near)
        draft = usable[:j]
        q = self.q[:len(draft)] if self.q is not None and draft else None
        # keeping it all ends decoding: the draft foresaw the eos right after it, or it fills max_new_tokens
        m, last = 1 + len(draft), (at_eos and len(draft) == len(usable)) or len(draft) >= room
        ends = ([m - 1] if tail else list(range(m))) if r else []
        return Proposal(draft, q, r, [e for e in ends if e < m - last], self.first)

    def update(self, proposal: Proposal, outcome: Outcome) -> None:
        """Learn from a round: its cost, the acceptance of its draft, and the registers' next draft.

        Args:
            proposal: What the round fed.
            outcome: What it gave.
        """
        self.policy.record(outcome.rows, outcome.seconds, outcome.prompt, len(outcome.emitted))
        if self.sampled and proposal.draft:
            self.policy.observe(len(proposal.draft), outcome.kept, proposal.first)
        self._settle(outcome.emitted)
        self.draft, self.q, self.first = outcome.draft, outcome.q, outcome.prompt

    def _settle(self, tokens: list[int]) -> None:
        """Tokens just decoded, in order: each watched draft is settled at its first token that differs, or when
        all of it has been decoded; a foreseen eos stays foreseen while the tokens follow its draft."""
        for t in tokens:
            if self.foreseen:
                self.foreseen = self.foreseen[1:] if t == self.foreseen[0] else None
            elif self.foreseen is not None:                # the eos was due: it came, or the foresight was wrong
                self.foreseen = None
            going = []
            for w in self.watched:
                draft, seen, first, eos_after = w
                if t != draft[seen]:
                    self.policy.observe(len(draft), seen, first)
                elif seen + 1 == len(draft):
                    self.policy.observe(len(draft), len(draft), first, eos_after)
                else:
                    w[1] += 1
                    going.append(w)
            self.watched = going

    def finish(self) -> None:
        """Decoding ended before the watched drafts were settled: the tokens checked so far count."""
        for draft, seen, first, _ in self.watched:
            if seen:
                self.policy.observe(seen, seen, first)
        self.watched = []
