"""``mutor demo``: next-token prediction vs MuToR on a path-star graph task, sized for a CPU.

The task is the path-star graph of Bachmann & Nagarajan (2024), "The pitfalls of next-token
prediction", which the MuToR paper (section 4.3) uses as its synthetic benchmark. A source
node has ``degree`` arms of ``path_len - 1`` nodes each; the prompt lists the edges in random
order, then the source and the goal (the last node of one arm); the answer is the path from
source to goal::

    12,40|7,31|40,3|31,9|...|9,22/12,22=12,7,31,9,22

Each node is one token (the commas and ``|`` of the edges are rendered for reading only; the
token stream is ``u v | u v | ... / s g = s a1 ... g``). Under teacher forcing every answer
token after ``a1`` can be read off the edge list by following the previous node's unique
out-edge (the "Clever Hans" shortcut), so next-token training gets almost no signal for the
one hard decision, ``a1``, and typically plateaus at 1/degree exact match. MuToR's registers
with offsets ``d >= 2`` (``min_offset=2``, the paper's star-graph recipe) ask for tokens that
the shortcut cannot give, which is the look-ahead signal that may help.

Two runs start from the same random initialisation of a tiny Llama and see the same data in
the same order; the only difference is the training objective. Held-out greedy-decoded exact
match, first-hop (``a1``) accuracy, and held-out next-token loss are recorded every
``eval_every`` steps. Results go to ``results.json``, ``results.md`` and ``accuracy.png`` in
the output directory, each written atomically.

What the defaults measured (seed 0, degree 2, path length 5, 50 nodes, 1000 steps of batch 64,
Llama 128 hidden x 4 layers): next-token reaches the shortcut plateau (exact match ~0.5 =
1/degree) by step ~400; MuToR with a=0.3, d in {2..4} reaches the same plateau later (~step 900,
0.46 at step 1000), and with the paper's a=0.5 had not left 0 after 1000 steps. In a 3000-step
run neither method left the plateau. So at CPU budgets from scratch this demo shows the
next-token shortcut, and the cost of the auxiliary objective early in training; it does not
show MuToR solving the task (the paper fine-tunes a pretrained GPT-2 for many epochs).

Everything is generated in-process; nothing is downloaded.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from .config import MuToRConfig
from .io import atomic_write, write_text_atomic
from .layout import IGNORE_INDEX

# --------------------------------------------------------------------------- task

PAD, EDGE_SEP, QUERY_SEP, ANSWER_SEP = 0, 1, 2, 3
NUM_SPECIAL = 4
_SPECIAL_TEXT = {PAD: "<pad>", EDGE_SEP: "|", QUERY_SEP: "/", ANSWER_SEP: "="}


@dataclass(frozen=True)
class StarGraphTask:
    """Path-star graphs: ``degree`` arms of ``path_len - 1`` nodes from one source.

    ``path_len`` is the number of nodes on the answer path, source and goal included.
    Node labels are drawn without replacement from ``num_nodes`` labels per example.
    """

    degree: int = 2
    path_len: int = 5
    num_nodes: int = 50

    def __post_init__(self) -> None:
        if self.degree < 2:
            raise ValueError(f"degree must be >= 2 (got {self.degree})")
        if self.path_len < 3:
            raise ValueError(f"path_len must be >= 3 (got {self.path_len})")
        if self.num_nodes < self.nodes_per_graph:
            raise ValueError(f"num_nodes={self.num_nodes} < {self.nodes_per_graph} nodes per graph "
                             f"(degree * (path_len - 1) + 1)")

    @property
    def nodes_per_graph(self) -> int:
        return self.degree * (self.path_len - 1) + 1

    @property
    def num_edges(self) -> int:
        return self.degree * (self.path_len - 1)

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + self.num_nodes

    @property
    def prompt_len(self) -> int:
        return 3 * self.num_edges - 1 + 1 + 3        # edges joined by '|', then '/', s, g, '='

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.path_len


@dataclass(frozen=True)
class Example:
    """One graph. Node ids are labels in ``[0, num_nodes)``; tokens are ``NUM_SPECIAL + id``."""

    edges: tuple[tuple[int, int], ...]   # in prompt order
    source: int
    goal: int
    path: tuple[int, ...]                # source, a1, ..., goal

    @property
    def key(self) -> tuple:
        """Identity of the problem regardless of the order the edges are listed in."""
        return (tuple(sorted(self.edges)), self.source, self.goal)

    def prompt_ids(self) -> list[int]:
        ids: list[int] = []
        for i, (u, v) in enumerate(self.edges):
            if i:
                ids.append(EDGE_SEP)
            ids += [NUM_SPECIAL + u, NUM_SPECIAL + v]
        return ids + [QUERY_SEP, NUM_SPECIAL + self.source, NUM_SPECIAL + self.goal, ANSWER_SEP]

    def answer_ids(self) -> list[int]:
        return [NUM_SPECIAL + n for n in self.path]

    def text(self) -> str:
        edges = "|".join(f"{u},{v}" for u, v in self.edges)
        return f"{edges}/{self.source},{self.goal}=" + ",".join(str(n) for n in self.path)


def sample_example(task: StarGraphTask, rng: random.Random) -> Example:
    nodes = rng.sample(range(task.num_nodes), task.nodes_per_graph)
    source, rest = nodes[0], nodes[1:]
    arms = [rest[i * (task.path_len - 1):(i + 1) * (task.path_len - 1)] for i in range(task.degree)]
    edges = []
    for arm in arms:
        chain = [source] + arm
        edges += list(zip(chain[:-1], chain[1:]))
    rng.shuffle(edges)
    arm = arms[rng.randrange(task.degree)]
    return Example(edges=tuple(edges), source=source, goal=arm[-1], path=(source, *arm))


def make_examples(task: StarGraphTask, n: int, seed: int, exclude: Optional[set] = None) -> list[Example]:
    """``n`` distinct examples, deterministic in ``seed``; none whose :attr:`Example.key` is in ``exclude``."""
    rng = random.Random(seed)
    seen = set(exclude or ())
    out: list[Example] = []
    tries = 0
    while len(out) < n:
        tries += 1
        if tries > 20 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct star graphs of {task}; increase num_nodes")
        ex = sample_example(task, rng)
        if ex.key in seen:
            continue
        seen.add(ex.key)
        out.append(ex)
    return out


def split_examples(task: StarGraphTask, num_train: int, num_test: int, seed: int) -> tuple[list[Example], list[Example]]:
    """A held-out test set, then a training set that shares no problem with it (separate seeds)."""
    test = make_examples(task, num_test, seed=2 * seed + 1)
    train = make_examples(task, num_train, seed=2 * seed, exclude={ex.key for ex in test})
    return train, test


def is_valid_path(ex: Example, path: Sequence[int]) -> bool:
    """True when ``path`` starts at the source and follows listed edges all the way (any arm)."""
    if len(path) != len(ex.path) or path[0] != ex.source:
        return False
    edges = set(ex.edges)
    return all((u, v) in edges for u, v in zip(path[:-1], path[1:]))


# ------------------------------------------------------------------------ data


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


def collate_right(features: Sequence[dict], pad_id: int = PAD) -> dict:
    """Right-pad ``input_ids`` (with ``pad_id``) and ``labels`` (with -100); add ``attention_mask``."""
    T = max(len(f["input_ids"]) for f in features)
    ids = torch.full((len(features), T), pad_id, dtype=torch.long)
    labels = torch.full((len(features), T), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(features), T), dtype=torch.long)
    for b, f in enumerate(features):
        n = len(f["input_ids"])
        ids[b, :n] = torch.tensor(f["input_ids"])
        labels[b, :n] = torch.tensor(f["labels"])
        mask[b, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def pad_left(seqs: Sequence[Sequence[int]], pad_id: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad prompts for batched generation: (ids, attention_mask)."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, T - len(s):] = torch.tensor(list(s))
        mask[b, T - len(s):] = 1
    return ids, mask


# ----------------------------------------------------------------------- model


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512


def build_base_model(task: StarGraphTask, size: ModelSize, seed: int, max_positions: int):
    """A random-init LlamaForCausalLM; the same ``seed`` gives the same weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=task.vocab_size, hidden_size=size.hidden_size, intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_layers, num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_heads, max_position_embeddings=max_positions,
        pad_token_id=PAD, bos_token_id=None, eos_token_id=None, tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    gc = model.generation_config
    gc.pad_token_id, gc.bos_token_id, gc.eos_token_id = PAD, None, None
    gc.do_sample, gc.max_length = False, None
    return model


# ------------------------------------------------------------------ evaluation


@torch.no_grad()
def evaluate(base, examples: Sequence[Example], batch_size: int = 256) -> dict:
    """Greedy decoding of the answer (batched, left-padded prompts) and held-out NTP loss.

    ``exact_match``: the whole decoded path equals the answer. ``first_hop``: the decoded
    ``a1`` (the token after the source, the only one that needs planning) is right.
    ``valid_path``: the decoded path starts at the source and follows listed edges (right arm
    or not; a model that ends every path with the goal can only be valid on the right arm).
    ``ntp_loss``: mean teacher-forced cross-entropy on answer tokens; ``a1_loss``: the same at
    ``a1`` only (ln(degree) for a model that knows the source's neighbours but not the way).
    """
    was_training = base.training
    base.eval()
    exact = hop = valid = 0
    loss_sum = a1_sum = 0.0
    n_tok = 0
    try:
        for i in range(0, len(examples), batch_size):
            chunk = examples[i:i + batch_size]
            L = len(chunk[0].path)
            ids, mask = pad_left([ex.prompt_ids() for ex in chunk])
            out = base.generate(input_ids=ids, attention_mask=mask, max_new_tokens=L, min_new_tokens=L,
                                do_sample=False, pad_token_id=PAD, eos_token_id=None)
            gen = (out[:, ids.shape[1]:] - NUM_SPECIAL).tolist()
            for ex, g in zip(chunk, gen):
                exact += int(tuple(g) == ex.path)
                hop += int(len(g) > 1 and g[1] == ex.path[1])
                valid += int(is_valid_path(ex, g))

            ds = StarGraphDataset(chunk)
            batch = collate_right([ds[j] for j in range(len(ds))])
            logits = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            targets = batch["labels"][:, 1:]
            ce = torch.nn.functional.cross_entropy(
                logits[:, :-1].float().transpose(1, 2), targets, reduction="none", ignore_index=IGNORE_INDEX)
            keep = targets != IGNORE_INDEX
            loss_sum += float(ce[keep].sum())
            n_tok += int(keep.sum())
            # a1 is the second answer token: one past the first supervised label of each row
            first = keep.float().argmax(1)
            a1_sum += float(ce[torch.arange(len(chunk)), first + 1].sum())
    finally:
        base.train(was_training)
    n = len(examples)
    return {"exact_match": exact / n, "first_hop": hop / n, "valid_path": valid / n,
            "ntp_loss": loss_sum / max(n_tok, 1), "a1_loss": a1_sum / n}


# --------------------------------------------------------------------- settings


@dataclass
class DemoSettings:
    """Everything one ``mutor demo`` run depends on (the defaults are the CPU demo)."""

    steps: int = 1000
    seed: int = 0
    batch_size: int = 64
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    weight_decay: float = 0.0
    eval_every: int = 100
    num_test: int = 500
    num_train: Optional[int] = None          # None: steps * batch_size (fresh data every step)
    task: StarGraphTask = field(default_factory=StarGraphTask)
    model: ModelSize = field(default_factory=ModelSize)
    # the paper's star-graph recipe (d in {2..4}: registers never see the next-token shortcut), with the
    # lighter weight a=0.3 it uses for its harder graphs: trained from scratch on this budget, a=0.5 had
    # not even learned the shortcut after 1000 steps (see the module docstring)
    mutor: MuToRConfig = field(default_factory=lambda: MuToRConfig(d_max=4, min_offset=2, loss_weight=0.3))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["task"], d["model"], d["mutor"] = asdict(self.task), asdict(self.model), self.mutor.to_dict()
        return d


def tiny_settings(**overrides) -> DemoSettings:
    """A smoke size (seconds of training): nothing is learned, every code path runs."""
    base = DemoSettings(
        steps=20, batch_size=32, eval_every=10, num_test=48, warmup_steps=5,
        task=StarGraphTask(degree=2, path_len=4, num_nodes=20),
        model=ModelSize(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64),
        mutor=MuToRConfig(d_max=3, min_offset=2, loss_weight=0.3),
    )
    return replace(base, **overrides)


# ----------------------------------------------------------------------- train


def _make_trainer_classes():
    from transformers import Trainer, TrainerCallback

    class LossTrackingTrainer(Trainer):
        """Keeps the running training ntp/reg losses of a MuToR forward for the history."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_parts: dict[str, list[float]] = {"loss": [], "ntp_loss": [], "reg_loss": []}

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            self.loss_parts["loss"].append(float(loss.detach()))
            ntp = getattr(outputs, "ntp_loss", None)
            self.loss_parts["ntp_loss"].append(float(loss.detach() if ntp is None else ntp.detach()))
            reg = getattr(outputs, "reg_loss", None)
            if reg is not None:
                self.loss_parts["reg_loss"].append(float(reg.detach()))
            return (loss, outputs) if return_outputs else loss

    class EvalCallback(TrainerCallback):
        """Evaluate on the held-out set every ``every`` steps (and at the last step)."""

        def __init__(self, base, test, every, history, trainer_ref, on_eval):
            self.base, self.test, self.every = base, test, every
            self.history, self.trainer_ref, self.on_eval = history, trainer_ref, on_eval
            self.eval_seconds = 0.0

        def _eval(self, step):
            t0 = time.perf_counter()
            row = {"step": step, **evaluate(self.base, self.test)}
            parts = self.trainer_ref[0].loss_parts if self.trainer_ref else {}
            for k, v in parts.items():
                if v:
                    row[f"train_{k}"] = sum(v) / len(v)
                    v.clear()
            self.eval_seconds += time.perf_counter() - t0
            self.history.append(row)
            if self.on_eval is not None:
                self.on_eval(row)

        def on_train_begin(self, args, state, control, **kwargs):
            self._eval(0)

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % self.every == 0 or state.global_step >= state.max_steps:
                if not self.history or self.history[-1]["step"] != state.global_step:
                    self._eval(state.global_step)

    return LossTrackingTrainer, EvalCallback


def train_one(method: str, settings: DemoSettings, train: Sequence[Example], test: Sequence[Example],
              work_dir: str, on_eval: Optional[Callable[[dict], None]] = None) -> dict:
    """Train from scratch with ``method`` in {"next-token", "mutor"}; return history and timings."""
    from transformers import TrainingArguments

    s = settings
    max_pos = s.task.seq_len + s.mutor.d_max + 1
    base = build_base_model(s.task, s.model, s.seed, max_pos)
    if method == "mutor":
        from .model import MuToRModel

        model = MuToRModel(base, s.mutor)
    elif method == "next-token":
        model = base
    else:
        raise ValueError(f"unknown method {method!r}")

    args = TrainingArguments(
        output_dir=work_dir, max_steps=s.steps, per_device_train_batch_size=s.batch_size,
        learning_rate=s.learning_rate, warmup_steps=s.warmup_steps, lr_scheduler_type="cosine",
        weight_decay=s.weight_decay, max_grad_norm=1.0, logging_strategy="no", save_strategy="no",
        eval_strategy="no", report_to="none", remove_unused_columns=False, disable_tqdm=True,
        seed=s.seed, data_seed=s.seed, use_cpu=True, dataloader_num_workers=0,
    )
    Trainer, EvalCallback = _make_trainer_classes()
    history: list[dict] = []
    ref: list = []
    cb = EvalCallback(base, list(test), s.eval_every, history, ref, on_eval)
    trainer = Trainer(model=model, args=args, train_dataset=StarGraphDataset(train),
                      data_collator=collate_right, callbacks=[cb])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)          # it prints the final metrics dict; we report ourselves
    ref.append(trainer)
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    final = history[-1]
    return {
        "method": method,
        "steps": final["step"],
        "final": {k: v for k, v in final.items() if k != "step"},
        "best_exact_match": max(r["exact_match"] for r in history),
        "history": history,
        "train_seconds": total - cb.eval_seconds,
        "eval_seconds": cb.eval_seconds,
        "wall_seconds": total,
        "num_parameters": sum(p.numel() for p in model.parameters()),
    }


# ---------------------------------------------------------------------- output


def _legend(method: str, results: dict) -> str:
    if method != "mutor":
        return method
    m = results["settings"]["mutor"]
    return f"MuToR (a={m['loss_weight']:g}, d={m['min_offset']}..{m['d_max']})"


def plot_curves(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("exact_match", "held-out exact match"), ("first_hop", "first-hop (a1) accuracy"),
              ("ntp_loss", "held-out next-token loss (answer)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    degree = results["settings"]["task"]["degree"]
    for ax, (key, title) in zip(axes, panels):
        for run in results["runs"]:
            steps = [r["step"] for r in run["history"]]
            ax.plot(steps, [r[key] for r in run["history"]], marker="o", ms=3, label=_legend(run["method"], results))
        if key != "ntp_loss":
            ax.axhline(1.0 / degree, color="grey", ls=":", lw=1, label="1/degree (shortcut)")
            ax.set_ylim(-0.02, 1.02)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    t = results["settings"]["task"]
    fig.suptitle(f"path-star graph: degree {t['degree']}, path length {t['path_len']}, {t['num_nodes']} nodes; "
                 f"seed {results['settings']['seed']}", fontsize=10)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)


TABLE_COLUMNS = ["method", "steps", "exact match", "best EM", "first-hop acc", "valid path", "final ntp loss",
                 "a1 loss", "train s", "wall s"]


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for run in results["runs"]:
        f = run["final"]
        rows.append([run["method"], str(run["steps"]), f"{f['exact_match']:.3f}", f"{run['best_exact_match']:.3f}",
                     f"{f['first_hop']:.3f}", f"{f['valid_path']:.3f}", f"{f['ntp_loss']:.4f}",
                     f"{f['a1_loss']:.4f}", f"{run['train_seconds']:.0f}", f"{run['wall_seconds']:.0f}"])
    return rows


def markdown_table(results: dict) -> str:
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in table_rows(results)]
    return "\n".join(lines)


def verdict(results: dict) -> str:
    """One honest sentence about what was measured (no claim beyond the numbers)."""
    by = {r["method"]: r["final"] for r in results["runs"]}
    if "mutor" not in by or "next-token" not in by:
        return ""
    n = results["settings"]["num_test"]
    se = math.sqrt(0.25 / n)                         # worst-case standard error of one accuracy
    diff = by["mutor"]["exact_match"] - by["next-token"]["exact_match"]
    if abs(diff) < 2 * math.sqrt(2) * se:
        return (f"MuToR minus next-token exact match: {diff:+.3f}, within noise (2 s.e. of a difference "
                f"~{2 * math.sqrt(2) * se:.3f} on {n} test graphs); no difference measured at this budget.")
    who = "MuToR" if diff > 0 else "next-token"
    return (f"MuToR minus next-token exact match: {diff:+.3f} on {n} held-out graphs (one seed): {who} higher "
            f"in this run.")


def report(results: dict, console_print: Callable[[str], None] = print) -> None:
    """Print the comparison table (rich when available, Markdown otherwise)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        console_print(markdown_table(results))
        console_print(verdict(results))
        return
    t = results["settings"]["task"]
    table = Table(title=f"next-token vs MuToR, path-star graph (degree {t['degree']}, path length "
                        f"{t['path_len']}, {t['num_nodes']} nodes), {results['settings']['num_test']} "
                        f"held-out graphs, seed {results['settings']['seed']}")
    for c in TABLE_COLUMNS:
        table.add_column(c, justify="left" if c == "method" else "right")
    for r in table_rows(results):
        table.add_row(*r)
    console = Console()
    if not console.is_terminal and console.width < 120:
        console = Console(width=120)                # logs and pipes: do not squeeze the table to 80 columns
    console.print(table)
    console.print(verdict(results))


# ------------------------------------------------------------------------- run


def run_demo(settings: DemoSettings, output_dir: str | os.PathLike = "runs/demo", quiet: bool = False,
             methods: Sequence[str] = ("next-token", "mutor"), threads: Optional[int] = None) -> dict:
    """Train both methods, write ``results.json``, ``results.md`` and ``accuracy.png``; return the results.

    ``threads`` sets ``torch.set_num_threads`` for the run (None: leave torch's default). On a
    machine shared with other CPU-heavy jobs, 1 thread is often faster than 2.
    """
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run_demo(settings, Path(output_dir), quiet, methods)
    finally:
        torch.set_num_threads(previous_threads)


def _run_demo(settings: DemoSettings, out: Path, quiet: bool, methods: Sequence[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    torch_threads = torch.get_num_threads()
    num_train = settings.num_train or settings.steps * settings.batch_size
    train, test = split_examples(settings.task, num_train, settings.num_test, settings.seed)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    say(f"[mutor demo] path-star graph {settings.task}; {len(train)} training / {len(test)} held-out graphs; "
        f"example: {test[0].text()}")

    import transformers

    transformers.logging.set_verbosity_error()
    results = {"settings": {**settings.to_dict(), "num_train": len(train)},
               "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                               "torch_threads": torch_threads, "cpu_count": os.cpu_count(),
                               # other jobs on the machine inflate wall times; the load average says how much
                               "load_average_at_start": _load_average()},
               "runs": []}
    work = tempfile.mkdtemp(prefix="mutor-demo-trainer-")   # Trainer's output_dir; nothing is saved there
    try:
        for method in methods:
            say(f"[mutor demo] training {method} for {settings.steps} steps ...")

            def on_eval(row, method=method):
                say(f"  {method:>10} step {row['step']:>5}: exact {row['exact_match']:.3f}  "
                    f"first-hop {row['first_hop']:.3f}  valid {row['valid_path']:.3f}  "
                    f"ntp {row['ntp_loss']:.4f}  a1 {row['a1_loss']:.4f}")

            results["runs"].append(train_one(method, settings, train, test, work, on_eval))
            _write_outputs(results, out)            # partial results survive an interrupted second run
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["verdict"] = verdict(results)
    results["environment"]["load_average_at_end"] = _load_average()
    _write_outputs(results, out)
    if not quiet:
        report(results)
        print(f"[mutor demo] wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'accuracy.png'}")
    return results


def _load_average() -> Optional[list[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # pragma: no cover - not on every platform
        return None


def _write_outputs(results: dict, out: Path) -> None:
    write_text_atomic(out / "results.json", json.dumps(results, indent=2) + "\n")
    md = markdown_table(results)
    if results.get("verdict"):
        md += "\n\n" + results["verdict"]
    write_text_atomic(out / "results.md", md + "\n")
    plot_curves(results, out / "accuracy.png")
