"""Reference computations the equivalence tests compare MuToR against, written from the paper's text.

Each register's reference is a plain forward of its document's x_<=t with the register vector appended at
position t+d-1; regular tokens are compared with a plain forward of the same batch. Shared by the
equivalence tests of every family, the real-model checks, 2D rotary and training tests.
"""

from __future__ import annotations

import copy

import torch

from mutor import MuToRModel

TOL = dict(atol=1e-5, rtol=1e-5)


def run_mutor(model: MuToRModel, batch: dict, offset_index=None):
    with torch.no_grad():
        return model(**batch, offset_index=offset_index, return_logits=True)


def kept_rows(out):
    """(b, l) of every logits row of a MuToR output, in order."""
    lay = out.layout
    keep = torch.cat([lay.ntp_labels, lay.reg_labels], 1) != -100
    return keep.nonzero().tolist()


def doc_start(batch: dict, b: int, t: int) -> int:
    pos = batch.get("position_ids")
    return 0 if pos is None else t - int(pos[b, t])


def plain_forward(base, batch: dict):
    # use_cache=False as in training: transformers only splits packed documents when no cache is built
    with torch.no_grad():
        return base(**batch, use_cache=False)


def register_refs(model: MuToRModel, batch: dict, out, mask_fn=None, keep=None):
    """Yield (mutor_logits, reference_logits) for every register in `out` (with `keep`: only the registers
    whose index r in their row satisfies keep(b, r, n_registers_in_row); for large real models)."""
    base, cfg = model.base_model, model.mutor_config
    T = batch["input_ids"].shape[1]
    choices = cfg.offset_choices()
    emb = base.get_input_embeddings()
    for row, (b, l) in enumerate(kept_rows(out)):
        if l < T:
            continue
        r = l - T
        if keep is not None and not keep(b, r, int((out.layout.reg_labels[b] != -100).sum())):
            continue
        t = int(out.layout.reg_source[b, r])
        k = int(out.layout.offset_index[b])
        d = cfg.raster_offset(choices[k])
        s = doc_start(batch, b, t)
        if "labels" in batch and cfg.register_placement == "within_answer":
            # the paper (3.3): registers only within the answer - x_{t+1} and the target x_{t+d} are answer tokens
            lab = batch["labels"][b]
            assert lab[t + 1] != -100 and lab[t + d] != -100, f"register after t={t} (d={d}) is outside the answer"
        ids = batch["input_ids"][b, s:t + 1]
        pos = torch.arange(t + 1 - s) if "position_ids" not in batch else batch["position_ids"][b, s:t + 1]
        reg_pos = int(pos[-1]) + d - 1
        vec = register_input(emb, model.register_embeddings.weight[0 if cfg.register_embedding == "shared" else k],
                             cfg.register_embedding_scale)
        with torch.no_grad():
            x = torch.cat([emb(ids[None]), vec[None, None]], 1)                 # (1, n+1, C)
            p = torch.cat([pos, torch.tensor([reg_pos])])[None]                  # (1, n+1)
            mask = torch.ones(1, x.shape[1], dtype=torch.long) if mask_fn is None else mask_fn(p[0], x.dtype)
            ref = base(inputs_embeds=x, attention_mask=mask, position_ids=p).logits[0, -1]
        yield out.logits[row], ref, (b, t, d)


def register_input(emb, vec: torch.Tensor, as_vocabulary_row: bool = True) -> torch.Tensor:
    """(C,) the register's input vector. The official code's register is a ``<reg>`` vocabulary row, so its input
    is that row looked up through the model's own embedding (Gemma multiplies every row by sqrt(hidden)): a copy
    of the embedding whose row 0 is ``vec``, looked up at 0. ``as_vocabulary_row=False``: ``vec`` as it is."""
    if not as_vocabulary_row:
        return vec
    table = copy.deepcopy(emb)
    with torch.no_grad():
        table.weight[0] = vec.to(table.weight.dtype)
        return table(torch.zeros(1, 1, dtype=torch.long, device=vec.device))[0, 0]


def random_checkpoint_run(path, data_block: str, tokenizer, steps=(1, 2)) -> None:
    """A stand-in run for checkpoint selection: a recipe.yaml with ``data_block`` and one tiny random model
    (with ``tokenizer``) per ``checkpoint-<step>``, each from its own seed."""
    from mutor.models.presets import tiny_causal_lm

    (path / "recipe.yaml").write_text(f"method: mutor\nseed: 0\ndata: {data_block}\n")
    for step in steps:
        tiny_causal_lm(len(tokenizer), seed=step).save_pretrained(path / f"checkpoint-{step}")
        tokenizer.save_pretrained(path / f"checkpoint-{step}")


def drafting_round(model, head: str, prompt: list[int], draft: list[int]) -> torch.Tensor:
    """The logits of a drafting prompt's forward (3 registers after it) and of a round after it that feeds ``draft``
    with 3 registers after every fed token, through ``head`` (``mutor.generation.forward.head_product``)."""
    from mutor.generation.forward import Feed, ModelForward

    target = ModelForward(model, registers=3, head=head)
    with torch.no_grad():
        first = target.forward(Feed(prompt, [], 3, [0]))
        target.keep(len(prompt))
        then = target.forward(Feed(prompt[-1:], draft, 3, list(range(len(draft) + 1))))
    return torch.cat([first.regular, first.registers.flatten(0, 1), then.regular, then.registers.flatten(0, 1)])
