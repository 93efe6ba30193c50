"""Path-star graphs as text for a pretrained model's own tokenizer (``star_graph`` with ``render: text``).

The graphs, splits and metrics are those of :mod:`mutor.data.star_graph_problems`; only the rendering differs. The
prompt is Bachmann & Nagarajan's line format, the completion the path, then eos::

    prompt      "12,40|7,31|40,3|31,9|...|9,22/12,22="
    completion  "12,7,31,9,22" + eos

so node labels are numbers the tokenizer already knows (SmolLM2 writes each digit as a token; a node is
then one or two tokens and a comma) instead of new symbols. The loss, and MuToR's registers, are on the
completion only (paper 3.3). Evaluation decodes greedily (left-padded batches, stopping at eos or the
longest possible path), parses the numbers and scores ``solve_rate`` (the exact path), ``first_hop`` (the
node after the source: the one decision the Clever-Hans shortcut cannot make) and ``valid_path``, plus the
teacher-forced ``ntp_loss`` on the completion.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import torch

from ..core.layout import IGNORE_INDEX
from .star_graph_problems import Example, path_scores


def render(ex: Example) -> tuple[str, str]:
    """(prompt, completion) text of one graph."""
    edges = "|".join(f"{u},{v}" for u, v in ex.edges)
    return f"{edges}/{ex.source},{ex.goal}=", ",".join(str(n) for n in ex.path)


def parse_path(text: str) -> tuple[int, ...]:
    """The node numbers of a generated path: the comma-separated numbers before anything else."""
    m = re.match(r"\s*(\d+(?:\s*,\s*\d+)*)", text)
    return tuple(int(x) for x in re.findall(r"\d+", m.group(1))) if m else ()


class TextStarGraphDataset(torch.utils.data.Dataset):
    """Tokenized prompt + completion + eos; labels on the completion and eos only."""

    def __init__(self, examples: Sequence[Example], tokenizer):
        from .text import tokenize_pair

        self.examples, self.tokenizer = list(examples), tokenizer
        self.features = [tokenize_pair(tokenizer, *render(ex)) for ex in self.examples]

    def __len__(self) -> int:
        return len(self.features)

    def __getitem__(self, i: int) -> dict:
        return self.features[i]

    def evaluator_for(self, examples: Sequence[Example], batch_size: int = 64):
        """An evaluator ``(model, step, records=None) -> metrics`` on ``examples`` (same rendering and tokenizer)."""
        return lambda model, step, records=None: evaluate(model, self.tokenizer, examples, batch_size=batch_size,
                                                          records=records)


@torch.no_grad()
def evaluate(model, tokenizer, examples: Sequence[Example], batch_size: int = 64,
             max_new_tokens: Optional[int] = None, records: Optional[list] = None) -> dict:
    """Greedy decoding and the teacher-forced answer loss on ``examples`` (see the module docstring);
    ``records`` gets one dict per example (prompt, generation, the path parsed from it, 0/1 per metric)."""
    from ..utils.devices import model_device
    from .collator import PaddingCollator, left_pad

    dev = model_device(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if max_new_tokens is None:       # the longest completion of these examples, and eos
        max_new_tokens = max(len(tokenizer(render(ex)[1], add_special_tokens=False)["input_ids"])
                             for ex in examples) + 1
    was_training = model.training
    model.eval()
    exact = hop = valid = n_tok = 0
    loss_sum = 0.0
    data = TextStarGraphDataset(examples, tokenizer)
    try:
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            prompts = [tokenizer(render(ex)[0], add_special_tokens=True)["input_ids"] for ex in chunk]
            ids, mask = left_pad(prompts, pad)
            ids, mask = ids.to(dev), mask.to(dev)                                        # (B, P)
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                                 do_sample=False, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id)
            texts = tokenizer.batch_decode(out[:, ids.shape[1]:], skip_special_tokens=True)
            for ex, text in zip(chunk, texts):
                path = parse_path(text)
                scores = path_scores(ex, path)
                exact, hop = exact + scores["solve_rate"], hop + scores["first_hop"]
                valid += scores["valid_path"]
                if records is not None:
                    records.append({"prompt": render(ex)[0], "generation": text, "reference": list(ex.path),
                                    "prediction": list(path), **scores})
            batch = PaddingCollator(pad_token_id=pad)([data[j] for j in range(i, i + len(chunk))])
            batch = {k: v.to(dev) for k, v in batch.items()}                             # each (B, T)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
            targets = batch["labels"][:, 1:]                                             # (B, T-1)
            ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), targets,
                                                   reduction="none", ignore_index=IGNORE_INDEX)
            keep = targets != IGNORE_INDEX
            loss_sum += float(ce[keep].sum())
            n_tok += int(keep.sum())
    finally:
        model.train(was_training)
    n = len(examples)
    return {"solve_rate": exact / n, "first_hop": hop / n, "valid_path": valid / n,
            "ntp_loss": loss_sum / max(n_tok, 1), "num_eval": n}
