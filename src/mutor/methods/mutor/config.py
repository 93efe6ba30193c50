"""MuToRConfig: every knob of the register objective, validated on construction.

A plain dataclass whose fields all carry ``metadata={"help": ...}``, so that
``transformers.HfArgumentParser`` and YAML recipes work with no extra code. What is unusual: the layout
(:func:`mutor.core.layout.build_layout`) reads it through the fields and offset methods it needs, so the
objective's engine in :mod:`mutor.core` does not import this module; and a sidecar saved before
``register_embedding_scale`` existed reads back as it was trained (``sidecar_defaults``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

from ...core.config import JsonConfig, check_prefix_attention

__all__ = ["SIDECAR_CONFIG", "MuToRConfig"]

SIDECAR_CONFIG = "mutor_config.json"


@dataclass
class MuToRConfig(JsonConfig):
    """Configuration of the MuToR objective: which offsets registers predict, where they sit, and how much
    their loss weighs. Validated on construction.

    The loss is ``(1 - loss_weight) * L_ntp + loss_weight * L_reg``. Each sequence draws one offset d; a
    register placed after ``x_t`` predicts ``x_{t+d}``. ``loss_chunk_size`` and ``attention`` are arguments
    of :class:`~mutor.MuToRModel`, not fields here: they change how the loss is computed, not what is learned.

    Args:
        d_max: Largest prediction offset d; d is drawn uniformly per sequence from ``min_offset..d_max``.
        min_offset: Smallest offset d. 1 lets registers predict the next token too; the star-graph recipes
            use 2 so that registers never learn the next-token shortcut.
        loss_weight: The register loss's weight a, in [0, 1).
        num_registers: None: a register at every eligible position. An int n: n registers per sequence at
            eligible positions drawn at random (all of them if fewer are eligible).
        register_placement: ``"within_answer"`` (the paper's rule): a register follows ``x_t`` only when
            ``x_{t+1}`` and its target ``x_{t+d}`` are supervised, so no register sits in the prompt.
            ``"supervised_target"``: after every ``x_t`` whose target is supervised, the last d-1 prompt tokens
            included. The two coincide when every token is supervised (pretraining, images).
        register_embedding: ``"shared"``: one learnable register vector for every offset (the paper's
            default); ``"per_offset"``: one per offset choice.
        register_embedding_scale: True: the register vector lives in the token-embedding table's space and goes
            through the model's own embedding scale (Gemma's sqrt(hidden)), as the official code's ``<reg>``
            vocabulary row does, so an optimiser step moves it in the model's input space as it moves that row.
            False: the vector is added after the scaling. The same on models without an embedding scale.
        prefix_attention: ``"causal"``: ordinary causal attention; ``"bidirectional"``: prompt tokens attend to
            the whole prompt (the paper's fine-tuning setting, for every method).
        d_max_2d: 2D offsets for raster-ordered image tokens: ``(d_h, d_w)`` drawn from ``{1..d_max_2d}^2``
            without (1, 1). None: 1D offsets.
        grid_width: Tokens per raster row of the image grid; 2D mode only.
        grid_start: 2D mode: position of the first grid token (the conditioning tokens before the image, e.g. 1
            for a class token). Registers are placed after grid tokens only.
        seed: Seed of a private generator for offsets and register placement. None: torch's global RNG.

    Raises:
        ValueError: A field out of range, or a 1D knob (``d_max``, ``min_offset``) changed in 2D mode.
    """

    # a sidecar written before register_embedding_scale existed added its vector after the embedding scale
    sidecar_defaults: ClassVar[dict] = {"register_embedding_scale": False}

    d_max: int = field(
        default=4,
        metadata={"help": "Largest prediction offset d: a register after x_t predicts x_{t+d}, "
                  "d sampled uniformly per sequence from {min_offset..d_max}."},
    )
    min_offset: int = field(
        default=1,
        metadata={"help": "Smallest offset d. 1 lets registers predict the next token too; "
                  "the star-graph recipe uses 2 so that registers never learn the next-token shortcut."},
    )
    loss_weight: float = field(
        default=0.3,
        metadata={"help": "a in loss = (1-a)*L_ntp + a*L_reg; must lie in [0, 1)."},
    )
    num_registers: Optional[int] = field(
        default=None,
        metadata={"help": "None: one register after every eligible token. An int n: n registers per sequence "
                  "at eligible positions sampled at random (all of them if fewer are eligible)."},
    )
    register_placement: str = field(
        default="within_answer",
        metadata={"help": "'within_answer' (the paper's rule, section 3.3; the official code builds "
                  "[r, a1, r, a2, ...] after the prompt): a register follows x_t only when x_{t+1} is a "
                  "supervised (answer) token, and is placed when its target x_{t+d} is supervised too, so no "
                  "register sits in the prompt. 'supervised_target': a register after every x_t whose target "
                  "x_{t+d} is supervised, including the last d-1 prompt tokens (a variant: "
                  "d-1 more registers per example). The two coincide when every token is supervised "
                  "(pretraining, images)."},
    )
    register_embedding: str = field(
        default="shared",
        metadata={"help": "'shared': one learnable register vector for all offsets (the paper's default). "
                  "'per_offset': one vector per offset choice."},
    )
    register_embedding_scale: bool = field(
        default=True,
        metadata={"help": "True (the official code's parametrisation): the register vector is a row in the "
                  "token-embedding table's space, multiplied by the model's own embedding scale where it enters "
                  "the model (Gemma: sqrt(hidden)), as the official `<reg>` vocabulary row is, so AdamW moves it "
                  "in input space as it moves that row. False: the vector is added after the scaling, where the "
                  "same step moves it sqrt(hidden) times less (about 25x on Gemma 3 270M). No effect on models "
                  "without an embedding scale (Llama, Qwen, SmolLM2, ...)."},
    )
    prefix_attention: str = field(
        default="causal",
        metadata={"help": "'causal': ordinary causal attention everywhere. 'bidirectional': prompt tokens "
                  "(those before the first supervised label of each document) attend to each other both ways, "
                  "the paper's setting for every method in its fine-tuning runs."},
    )
    d_max_2d: Optional[int] = field(
        default=None,
        metadata={"help": "2D offset mode for raster-ordered image tokens: (d_h, d_w) sampled uniformly from "
                  "{1..d_max_2d}^2 without (1,1), d = (d_h-1)*grid_width + d_w - 1. None: 1D offsets."},
    )
    grid_width: Optional[int] = field(
        default=None,
        metadata={"help": "Width w of the token grid in 2D mode (tokens per raster row)."},
    )
    grid_start: int = field(
        default=0,
        metadata={"help": "2D mode: position id of the first grid token (the number of conditioning tokens "
                  "before the image, e.g. 1 for a class token). Registers are placed only after grid tokens."},
    )
    seed: Optional[int] = field(
        default=None,
        metadata={"help": "Seed of a private generator for offsets and register placement. None: use torch's "
                  "global RNG (which transformers.Trainer seeds and restores on resume)."},
    )

    def __post_init__(self) -> None:
        def need(cond: bool, name: str, msg: str) -> None:
            if not cond:
                raise ValueError(f"MuToRConfig.{name}: {msg} (got {getattr(self, name)!r})")

        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        need(is_int(self.d_max) and self.d_max >= 1, "d_max", "must be an integer >= 1")
        need(is_int(self.min_offset) and self.min_offset >= 1, "min_offset", "must be an integer >= 1")
        need(self.min_offset <= self.d_max, "min_offset", f"must be <= d_max={self.d_max}")
        need(isinstance(self.loss_weight, (int, float)) and not isinstance(self.loss_weight, bool)
             and 0.0 <= float(self.loss_weight) < 1.0, "loss_weight", "must lie in [0, 1)")
        need(self.num_registers is None or (is_int(self.num_registers) and self.num_registers >= 1),
             "num_registers", "must be None (all eligible positions) or an integer >= 1")
        need(self.register_placement in ("within_answer", "supervised_target"), "register_placement",
             "must be 'within_answer' (the paper's rule) or 'supervised_target'")
        need(self.register_embedding in ("shared", "per_offset"), "register_embedding",
             "must be 'shared' or 'per_offset'")
        need(isinstance(self.register_embedding_scale, bool), "register_embedding_scale", "must be true or false")
        check_prefix_attention(self.prefix_attention, "MuToRConfig.prefix_attention")
        need(self.seed is None or is_int(self.seed), "seed", "must be None or an integer")
        need(is_int(self.grid_start) and self.grid_start >= 0, "grid_start", "must be an integer >= 0")
        if self.d_max_2d is None:
            need(self.grid_width is None, "grid_width", "is only used in 2D mode; set d_max_2d too")
        else:
            need(is_int(self.d_max_2d) and self.d_max_2d >= 2, "d_max_2d",
                 "must be an integer >= 2 ((1,1) is excluded, so 1 leaves no offset)")
            need(is_int(self.grid_width) and self.grid_width >= 1, "grid_width",
                 "must be a positive integer in 2D mode")
            need(self.d_max_2d <= self.grid_width, "d_max_2d", f"must be <= grid_width={self.grid_width}")
            # 2D offsets are (d_h, d_w) in {1..d_max_2d}^2 without (1,1): the 1D knobs have no meaning there
            need(self.d_max == 4, "d_max", "is a 1D knob; 2D mode samples (d_h, d_w) from {1..d_max_2d}^2 "
                 "without (1,1), so leave d_max at its default (4) and set d_max_2d")
            need(self.min_offset == 1, "min_offset", "is a 1D knob; 2D mode always excludes only (1,1), "
                 "so leave min_offset at its default (1)")

    @classmethod
    def task_fields(cls, options: dict, task_settings: Optional[dict]) -> dict:
        """An image task's grid applies to 2D offsets only: a 1D run on image tokens ignores it. Before the task
        is built (``task_settings`` None) a 2D run is checked on the smallest grid its ``d_max_2d`` allows."""
        if options.get("d_max_2d") is None:
            return super().task_fields(options, {k: v for k, v in (task_settings or {}).items()
                                                 if k not in ("grid_width", "grid_start")})
        if task_settings is None:
            return {} if options.get("grid_width") is not None else {"grid_width": options["d_max_2d"]}
        return super().task_fields(options, task_settings)

    # ------------------------------------------------------------------ offsets
    @property
    def is_2d(self) -> bool:
        """Whether offsets are 2D (``d_max_2d`` is set)."""
        return self.d_max_2d is not None

    def offset_choices(self) -> list[tuple[int, ...]]:
        """The offsets sampled uniformly: ``(d,)`` in 1D, ``(d_h, d_w)`` in 2D."""
        if not self.is_2d:
            return [(d,) for d in range(self.min_offset, self.d_max + 1)]
        k = self.d_max_2d
        return [(h, w) for h in range(1, k + 1) for w in range(1, k + 1) if (h, w) != (1, 1)]

    def raster_offset(self, choice: tuple[int, ...]) -> int:
        """The sequence offset d of one choice (2D: d = (d_h-1)*w + d_w - 1)."""
        if not self.is_2d:
            return choice[0]
        dh, dw = choice
        return (dh - 1) * self.grid_width + dw - 1

    def offset_names(self) -> list[str]:
        """Labels for per-offset metrics: 'd=3' or 'dh=2,dw=1'."""
        if not self.is_2d:
            return [f"d={c[0]}" for c in self.offset_choices()]
        return [f"dh={h},dw={w}" for h, w in self.offset_choices()]

    @property
    def num_register_embeddings(self) -> int:
        """Rows of the register embedding: 1 when shared, else one per offset choice."""
        return 1 if self.register_embedding == "shared" else len(self.offset_choices())
