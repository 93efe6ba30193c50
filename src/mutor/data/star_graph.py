"""The path-star graph task (Bachmann & Nagarajan 2024; the MuToR paper's section 4.3), as a ``mutor train`` task.

A source node has ``degree`` arms of ``path_len - 1`` nodes each; the prompt lists the edges in
random order, then the source and the goal (the last node of one arm); the answer is the path
from source to goal, as in the reference code (gregorbachmann/Next-Token-Failures)::

    12,40|7,31|40,3|31,9|...|9,22/12,22=12,7,31,9,22

Each node is one token (the commas are rendered for reading only; the token stream is
``u v | u v | ... / s g = s a1 ... g``); the loss is on the whole answer. Under teacher forcing
every answer token after ``a1`` can be read off the edge list by following the previous node's
unique out-edge (the "Clever Hans" shortcut), so next-token training gets almost no signal for
the one hard decision, ``a1``, and typically plateaus at 1/degree solve rate. MuToR's registers
with ``d >= 2`` (``min_offset: 2``, the paper's recipe) ask for tokens the shortcut cannot give.

The test graphs are drawn first, from their own seed, and no training graph shares a problem
(edge set, source, goal) with them. Everything is generated in process; nothing is downloaded. The graphs
themselves (shape, drawing, splits, scores) are :mod:`mutor.data.star_graph_problems`, shared with the text
rendering (:mod:`mutor.data.star_graph_text`); this module renders one token per node and holds the task.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from ..core.layout import IGNORE_INDEX
from .collator import PaddingCollator, left_pad
from .registry import TrainingData, check_options, register_task
from .star_graph_problems import (
    ANSWER_SEP,
    EDGE_SEP,
    NUM_SPECIAL,
    PAD,
    QUERY_SEP,
    Example,
    StarGraphShape,
    is_valid_path,
    make_examples,
    path_scores,
    sample_example,
    split_examples,
)

__all__ = ["ANSWER_SEP", "EDGE_SEP", "NUM_SPECIAL", "PAD", "QUERY_SEP", "Example", "StarGraphDataset",
           "StarGraphShape", "build_star_graph", "evaluate", "is_valid_path", "make_examples", "path_scores",
           "sample_example", "split_examples"]


class StarGraphDataset(torch.utils.data.Dataset):
    """Features for causal-LM training: the loss is on the answer tokens only."""

    def __init__(self, examples: Sequence[Example]):
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict:
        ex = self.examples[i]
        prompt, answer = ex.prompt_ids(), ex.answer_ids()
        return {"input_ids": prompt + answer, "labels": [IGNORE_INDEX] * len(prompt) + answer}

    def evaluator_for(self, examples: Sequence[Example], batch_size: int = 256):
        """An evaluator ``(model, step, records=None) -> metrics`` on ``examples`` (what ``--source`` swaps in)."""
        return lambda model, step, records=None: evaluate(model, examples, batch_size=batch_size, records=records)


def evaluate(base, examples: Sequence[Example], batch_size: int = 256, records: Optional[list] = None) -> dict:
    """Greedy decoding of the answer (batched, left-padded prompts) and held-out NTP loss.

    ``solve_rate``: the whole decoded path equals the answer (exact match). ``first_hop``: the decoded
    ``a1`` (the token after the source, the only one that needs planning) is right.
    ``valid_path``: the decoded path starts at the source and follows listed edges (right arm
    or not; a model that ends every path with the goal can only be valid on the right arm).
    ``ntp_loss``: mean teacher-forced cross-entropy on answer tokens; ``a1_loss``: the same at
    ``a1`` only (ln(degree) for a model that knows the source's neighbours but not the way).
    Batches are built on the CPU and sent to the model's device; the loss is taken in float32.
    ``records``: a list that gets one dict per example (the path decoded, the answer, and 0/1 per metric).
    """
    from ..utils.devices import model_device

    dev = model_device(base)
    was_training = base.training
    base.eval()
    exact = hop = valid = 0
    loss_sum = a1_sum = 0.0
    n_tok = 0
    try:
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            L = len(chunk[0].path)
            ids, mask = left_pad([ex.prompt_ids() for ex in chunk], PAD)
            ids, mask = ids.to(dev), mask.to(dev)                                        # (B, P)
            out = base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=L, min_new_tokens=L,
                                do_sample=False, pad_token_id=PAD, eos_token_id=None)    # (B, P+L)
            gen = (out[:, ids.shape[1]:] - NUM_SPECIAL).cpu().tolist()
            for ex, g in zip(chunk, gen):
                scores = path_scores(ex, tuple(g))
                exact, hop = exact + scores["solve_rate"], hop + scores["first_hop"]
                valid += scores["valid_path"]
                if records is not None:
                    records.append({"source": ex.source, "goal": ex.goal, "reference": list(ex.path),
                                    "prediction": list(g), **scores})

            ds = StarGraphDataset(chunk)
            batch = PaddingCollator(pad_token_id=PAD)([ds[j] for j in range(len(ds))])
            batch = {k: v.to(dev) for k, v in batch.items()}                             # each (B, T)
            logits = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # (B, T, V)
            targets = batch["labels"][:, 1:]                                             # (B, T-1)
            ce = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().transpose(1, 2), targets, reduction="none", ignore_index=IGNORE_INDEX)
            keep = targets != IGNORE_INDEX                                               # (B, T-1)
            loss_sum += float(ce[keep].sum())
            n_tok += int(keep.sum())
            # a1 is the second answer token: one past the first supervised label of each row
            first = keep.float().argmax(1)                                               # (B,)
            a1_sum += float(ce[torch.arange(len(chunk), device=dev), first + 1].sum())
    finally:
        base.train(was_training)
    n = len(examples)
    return {"solve_rate": exact / n, "first_hop": hop / n, "valid_path": valid / n,
            "ntp_loss": loss_sum / max(n_tok, 1), "a1_loss": a1_sum / n, "num_eval": n}


_OPTIONS = {"degree", "path_len", "num_nodes", "num_train", "num_test", "eval_batch_size", "data_seed", "render"}


@register_task("star_graph")
def build_star_graph(options: dict, tokenizer, seed: int) -> TrainingData:
    """Options: ``degree``, ``path_len``, ``num_nodes`` (the graph family), ``num_train`` (distinct training
    graphs), ``num_test`` (held-out graphs), ``eval_batch_size``, ``data_seed`` (default: the run's seed),
    ``render``: ``ids`` (each node one new token, a vocabulary of its own; the default) or ``text`` (the line
    format as text for a pretrained model's tokenizer: :mod:`mutor.data.star_graph_text`)."""
    check_options(options, _OPTIONS, "star_graph")
    shape = StarGraphShape.from_options(options)
    num_train, num_test = int(options.get("num_train", 20_000)), int(options.get("num_test", 500))
    if num_train < 1 or num_test < 1:
        raise ValueError(f"star_graph: num_train and num_test must be >= 1 (got {num_train}, {num_test})")
    train, test = split_examples(shape, num_train, num_test, int(options.get("data_seed", seed)))
    render = options.get("render", "ids")
    if render not in ("ids", "text"):
        raise ValueError(f"star_graph: render must be 'ids' or 'text' (got {render!r})")
    if render == "text":
        return _text_task(shape, train, test, tokenizer, int(options.get("eval_batch_size", 64)))
    batch_size = int(options.get("eval_batch_size", 256))

    def evaluator(model, step: int, records: Optional[list] = None) -> dict:
        return evaluate(model, test, batch_size=batch_size, records=records)

    return TrainingData(train_dataset=StarGraphDataset(train), vocab_size=shape.vocab_size, pad_token_id=PAD,
                        eos_token_id=None, bos_token_id=None, max_length=shape.seq_len, evaluator=evaluator,
                        primary_metric="solve_rate",
                        info={"task": f"G({shape.degree},{shape.path_len}) over {shape.num_nodes} nodes",
                              "num_train": len(train), "num_test": len(test), "example": test[0].text()})


def _text_task(shape: StarGraphShape, train: list[Example], test: list[Example], tokenizer,
               batch_size: int) -> TrainingData:
    """``render: text``: the same graphs as text, tokenized by the model's own tokenizer."""
    from .star_graph_text import TextStarGraphDataset, render
    from .text import need_tokenizer, pad_id_of

    need_tokenizer(tokenizer, "star_graph (render: text)")
    data = TextStarGraphDataset(train, tokenizer)
    longest = max(len(f["input_ids"]) for f in data.features)
    return TrainingData(train_dataset=data, pad_token_id=pad_id_of(tokenizer), eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.bos_token_id, max_length=longest,
                        evaluator=data.evaluator_for(test, batch_size), primary_metric="solve_rate",
                        info={"task": f"G({shape.degree},{shape.path_len}) over {shape.num_nodes} nodes, as text",
                              "num_train": len(train), "num_test": len(test), "longest_tokens": longest,
                              "example": "".join(render(test[0]))})
