"""The counts of a drafting run: forwards, tokens, and drafts offered and kept per offset.

Pure bookkeeping, no tensors; :func:`mutor.generation.loop.decode` fills one per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DraftStats:
    """Counts of one decoding run with registers as drafters (or several, summed with :meth:`add`).

    A round is one forward; the draft of a round proposes ``x_{e+d}`` for d = 2, 3, ... after the newest kept
    token ``x_e``. A draft for offset d reaches verification only when every earlier draft of its round was kept.

    Attributes:
        forwards: Forwards of the model (the prompt's included).
        new_tokens: Tokens generated.
        offered: Per offset d, drafts for ``x_{e+d}`` that reached verification.
        accepted: Per offset d, of those, drafts kept (equal to the model's own choice, or accepted by
            speculative sampling).
        rounds: Forwards per draft length K, the newest kept token and the K-1 drafted tokens fed after it
            (K = 1: no draft fed; the prompt's forward counts as K = 1).
        register_rows: Register rows fed, over every forward.
    """

    forwards: int = 0
    new_tokens: int = 0
    offered: dict[int, int] = field(default_factory=dict)
    accepted: dict[int, int] = field(default_factory=dict)
    rounds: dict[int, int] = field(default_factory=dict)
    register_rows: int = 0

    @property
    def tokens_per_forward(self) -> float:
        """New tokens per forward (0 before any forward)."""
        return self.new_tokens / max(self.forwards, 1)

    def acceptance(self) -> dict[int, float]:
        """The acceptance per offset.

        Returns:
            ``{d: accepted / offered}`` for every offset with a draft offered (a draft is offered only when
            every earlier draft of its round was kept), by increasing d.
        """
        return {d: self.accepted.get(d, 0) / n for d, n in sorted(self.offered.items()) if n}

    def verified(self, drafted: int, kept: int) -> None:
        """One verification: of ``drafted`` draft tokens (offsets 2, 3, ...), the first ``kept`` were kept.

        Args:
            drafted: Draft tokens fed.
            kept: Of those, how many were kept, from the first (the rest was never kept).
        """
        for i in range(min(drafted, kept + 1)):
            self.offered[i + 2] = self.offered.get(i + 2, 0) + 1
            if i < kept:
                self.accepted[i + 2] = self.accepted.get(i + 2, 0) + 1

    def add(self, other: "DraftStats") -> "DraftStats":
        """Accumulate another run's counts into this one.

        Args:
            other: The counts to add.

        Returns:
            This object, with ``other``'s counts added.
        """
        self.forwards += other.forwards
        self.new_tokens += other.new_tokens
        for d, n in other.offered.items():
            self.offered[d] = self.offered.get(d, 0) + n
            self.accepted[d] = self.accepted.get(d, 0) + other.accepted.get(d, 0)
        for k, n in other.rounds.items():
            self.rounds[k] = self.rounds.get(k, 0) + n
        self.register_rows += other.register_rows
        return self

    def to_dict(self) -> dict:
        """A JSON-ready summary.

        Returns:
            ``forwards``, ``new_tokens``, ``tokens_per_forward``, ``acceptance`` and ``offered`` by ``"d=<d>"``,
            ``rounds`` by ``"K=<K>"`` and ``register_rows``.
        """
        return {"forwards": self.forwards, "new_tokens": self.new_tokens,
                "tokens_per_forward": round(self.tokens_per_forward, 4),
                "acceptance": {f"d={d}": round(a, 4) for d, a in self.acceptance().items()},
                "offered": {f"d={d}": n for d, n in sorted(self.offered.items())},
                "rounds": {f"K={k}": n for k, n in sorted(self.rounds.items())}, "register_rows": self.register_rows}
