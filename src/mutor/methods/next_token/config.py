"""NextTokenConfig: the next-token baseline's one setting, the prompt attention it trains with.

What is unusual: the config holds nothing of the objective (there is none beside the next-token loss); it is
saved as the baseline's sidecar so that evaluation reads back the prefix attention the model was trained with.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.config import JsonConfig, check_prefix_attention

__all__ = ["NT_CONFIG", "NextTokenConfig"]

NT_CONFIG = "next_token_config.json"


@dataclass
class NextTokenConfig(JsonConfig):
    """Configuration of the next-token baseline. Validated on construction.

    Args:
        prefix_attention: ``"causal"`` or ``"bidirectional"`` (prompt tokens attend to the whole prompt).

    Raises:
        ValueError: Any other ``prefix_attention``.
    """

    prefix_attention: str = field(default="causal", metadata={"help": "'causal' or 'bidirectional' (prompt tokens "
                                                                      "attend to the whole prompt)."})

    def __post_init__(self) -> None:
        check_prefix_attention(self.prefix_attention, "NextTokenConfig.prefix_attention")
