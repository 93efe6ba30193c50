"""Activation (gradient) checkpointing of a wrapper's base model, under every name callers use for it.

A method's wrapper is not a ``PreTrainedModel``, yet Trainer, TRL and peft switch checkpointing on and off
through it and ask whether it is on. What is unusual: transformers renamed the switch
(``gradient_checkpointing_enable`` became ``activation_checkpointing_enable``) and deprecated the old names on
its models, while TRL and peft still call them; :class:`ActivationCheckpointing` answers both spellings on the
wrapper, passes them to the base model by whichever name the installed transformers has, and so no deprecation
warning is raised.
"""

from __future__ import annotations

from torch import nn

__all__ = ["ActivationCheckpointing", "is_recomputing"]


def is_recomputing(model: nn.Module) -> bool:
    """Whether any module of ``model`` recomputes its activations in backward (``gradient_checkpointing`` on)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


class ActivationCheckpointing:
    """Mixin for an ``nn.Module`` that holds its model as ``base_model``: the checkpointing switches, passed on."""

    base_model: nn.Module

    def activation_checkpointing_enable(self, activation_checkpointing_kwargs=None, **kwargs) -> None:
        """Recompute the base model's activations in backward (Trainer's ``gradient_checkpointing``)."""
        base = self.base_model
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable(activation_checkpointing_kwargs=activation_checkpointing_kwargs,
                                                 **kwargs)
        else:                                          # transformers before the rename
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=activation_checkpointing_kwargs, **kwargs)

    def activation_checkpointing_disable(self) -> None:
        """Stop recomputing the base model's activations."""
        base = self.base_model
        if hasattr(base, "activation_checkpointing_disable"):
            base.activation_checkpointing_disable()
        else:
            base.gradient_checkpointing_disable()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None, **kwargs) -> None:
        """TRL's and peft's name for :meth:`activation_checkpointing_enable` (no deprecation warning)."""
        self.activation_checkpointing_enable(gradient_checkpointing_kwargs, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        """TRL's and peft's name for :meth:`activation_checkpointing_disable`."""
        self.activation_checkpointing_disable()

    @property
    def is_activation_checkpointing(self) -> bool:
        """Whether the base model recomputes activations (what Trainer and TRL ask; no deprecated alias)."""
        return is_recomputing(self.base_model)

    is_gradient_checkpointing = is_activation_checkpointing   # TRL's name for it, answered without a warning
