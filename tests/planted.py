"""Registers with planted outputs, for drafting tests: the base model's forward is wrapped so that every
register row's logits are what the test says, whatever the (random, tiny) model computes. Regular rows are
untouched, so greedy decoding is the model's own and a drafted token is right exactly where the test plants it.

A register row is recognised by its input embedding: the registers' vectors are all set to one marker value
(``fill``), which no token embedding of a random model equals. Drafting in float32 computes a round's logits itself
(``mutor.generation.forward.head_product``), past the wrapped forward: a test that plants takes the ``model_head``
fixture (``conftest.py``), which keeps rounds on the model's own head.
"""

from __future__ import annotations

from typing import Callable, Union

import torch

from mutor import MuToRModel


def plant(model: MuToRModel, logits_of: Callable[[int, int], Union[int, torch.Tensor]], fill: float = 0.5) -> None:
    """Make each register row output ``logits_of(p, k)``: ``p`` the index of the token it predicts (its
    position id + 1), ``k`` its order among the forward's register rows; an int is a one-hot draft of that
    token (logit 1e4, the rest -1e4), a tensor the row's logits."""
    base = model.base_model
    with torch.no_grad():
        model.register_embeddings.weight.fill_(fill)
    marker, forward = model.register_embeddings.weight.detach()[0], base.forward

    def planted(*args, inputs_embeds=None, position_ids=None, **kw):
        out = forward(*args, inputs_embeds=inputs_embeds, position_ids=position_ids, **kw)
        if inputs_embeds is None:
            return out
        is_reg = (inputs_embeds[0] == marker).all(-1)                                  # (q,)
        keep = kw.get("logits_to_keep")                                                # (1, q) rows with logits
        rows = keep[0].nonzero().flatten().tolist() if torch.is_tensor(keep) else list(range(is_reg.numel()))
        logits = out.logits if out.logits.dim() == 2 else out.logits[0]               # (len(rows), V)
        for k, row in enumerate(is_reg.nonzero().flatten().tolist()):
            p = int(position_ids[0, row]) + 1 if position_ids is not None else -1
            got = logits_of(p, k)
            if isinstance(got, int):
                logits[rows.index(row)] = -1e4
                logits[rows.index(row), got] = 1e4
            else:
                logits[rows.index(row)] = got
        return out

    base.forward = planted
