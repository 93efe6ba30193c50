"""MultiTokenConfig: the Multi-Token baseline's settings (Gloeckle et al., 2024), validated on construction.

A plain dataclass whose fields all carry ``metadata={"help": ...}`` (recipes and ``HfArgumentParser``). What is
unusual: ``loss_weight`` is the same ``a`` as MuToR's, so the two methods' losses compare term by term.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.config import JsonConfig, check_prefix_attention

__all__ = ["MT_CONFIG", "MultiTokenConfig"]

MT_CONFIG = "multi_token_config.json"


@dataclass
class MultiTokenConfig(JsonConfig):
    """Configuration of the Multi-Token baseline (Gloeckle et al., 2024). Validated on construction.

    Args:
        d_max: Largest offset: ``d_max - 1`` extra heads predict ``x_{t+2}..x_{t+d_max}`` beside the model's own
            next-token head (>= 2; the paper's tuned setting is 2).
        loss_weight: The heads' loss weight a in ``(1-a) * L_ntp + a * L_heads``, in [0, 1) (the paper's tuned
            setting is 0.1).
        prefix_attention: ``"causal"`` or ``"bidirectional"`` (prompt tokens attend to the whole prompt).

    Raises:
        ValueError: A field out of range.
    """

    d_max: int = field(default=2, metadata={"help": "Largest offset: heads for x_{t+2}..x_{t+d_max} next to the "
                                                    "next-token head (the paper's tuned setting is 2)."})
    loss_weight: float = field(default=0.1, metadata={"help": "a in (1-a)*L_ntp + a*L_heads, in [0, 1) (the "
                                                              "paper's tuned setting is 0.1)."})
    prefix_attention: str = field(default="causal", metadata={"help": "'causal' or 'bidirectional' (prompt tokens "
                                                                      "attend to the whole prompt)."})

    def __post_init__(self) -> None:
        if not (isinstance(self.d_max, int) and not isinstance(self.d_max, bool) and self.d_max >= 2):
            raise ValueError(f"MultiTokenConfig.d_max: must be an integer >= 2 (got {self.d_max!r})")
        if isinstance(self.loss_weight, bool) or not (0.0 <= float(self.loss_weight) < 1.0):
            raise ValueError(f"MultiTokenConfig.loss_weight: must lie in [0, 1) (got {self.loss_weight!r})")
        check_prefix_attention(self.prefix_attention, "MultiTokenConfig.prefix_attention")
