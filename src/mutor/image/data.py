"""Class-conditional image-token data for ``mutor train``: sklearn's digits, or your own VQ codes.

A sequence is ``[class token] + H*W image tokens in raster order``. Ids: image codes
``0..K-1``, then one token per class ``K..K+C-1``, then the null class ``K+C`` that replaces the
class token with probability ``class_dropout`` (0.1, LlamaGen's setting) so that the model also
learns the unconditional distribution needed for classifier-free guidance. The class token
carries no loss; every image token does. Registers use 2D offsets on the ``W``-wide grid that
starts at position 1 (``grid_start``), which the task sets for the recipe.

* ``digits``: ``sklearn.datasets.load_digits`` (1,797 8x8 images, 10 classes, shipped inside
  scikit-learn), pixel values 0..16 quantised to ``levels`` codes; a fixed 80/20 train/test split
  (seed 0, stratified by class), independent of the run's seed.
* ``image_codes``: pre-tokenized codes, e.g. ImageNet through a VQ tokenizer: a ``.npz`` or
  ``.safetensors`` file with ``codes`` (N, H*W) and ``labels`` (N,), a ``.npy`` of codes plus
  ``labels_path``, or a Parquet file with columns ``codes`` (list) and ``label``.

Class dropout is drawn from ``(seed, epoch, index)``; the epoch comes from a Trainer callback,
so runs (and resumed runs) see the same dropped labels.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import numpy as np
import torch
from transformers import TrainerCallback

from ..core.layout import IGNORE_INDEX
from ..data.registry import TrainingData, register_task
from .metrics import bits_per_token, sample_metrics
from .tokens import ImageLayout, quantize

__all__ = ["ImageTokenDataset", "build_digits", "build_image_codes", "load_codes", "load_digits_split"]


def load_digits_split(levels: int = 8, test_fraction: float = 0.2) -> tuple[tuple[np.ndarray, np.ndarray],
                                                                       tuple[np.ndarray, np.ndarray]]:
    """scikit-learn's digits as codes, split once: the same split for every run and seed.

    Args:
        levels: Codes per pixel (pixel values 0..16 quantized into this many bins).
        test_fraction: The test split's share, stratified by class.

    Returns:
        ``((train_codes, train_labels), (test_codes, test_labels))``; codes (N, 64) int64.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    codes = quantize(d.data, levels)
    xtr, xte, ytr, yte = train_test_split(codes, d.target.astype(np.int64), test_size=test_fraction,
                                          random_state=0, stratify=d.target)
    return (xtr, ytr), (xte, yte)


class ImageTokenDataset(torch.utils.data.Dataset):
    """``[class] + codes`` sequences; the class is replaced by the null class with probability ``class_dropout``.

    Which labels are dropped depends on ``(seed, epoch, index)`` only, so runs and resumed runs see the same.

    Args:
        codes: (N, H*W) image codes.
        labels: (N,) their classes.
        layout: The vocabulary and grid.
        class_dropout: Probability of replacing the class token with the null class.
        seed: Seed of the dropout draws.

    Raises:
        ValueError: Codes or labels out of the layout's range, or codes not (N, H*W).
    """

    def __init__(self, codes: np.ndarray, labels: np.ndarray, layout: ImageLayout, class_dropout: float = 0.0,
                 seed: int = 0):
        if codes.ndim != 2 or codes.shape[1] != layout.num_tokens:
            raise ValueError(f"codes must be (N, {layout.num_tokens}); got {codes.shape}")
        if codes.min() < 0 or codes.max() >= layout.codebook_size:
            raise ValueError(f"codes must lie in [0, {layout.codebook_size}); got [{codes.min()}, {codes.max()}]")
        if labels.min() < 0 or labels.max() >= layout.num_classes:
            raise ValueError(f"labels must lie in [0, {layout.num_classes}); got [{labels.min()}, {labels.max()}]")
        self.codes, self.labels, self.layout = codes, labels, layout
        self.class_dropout, self.seed, self.epoch = float(class_dropout), int(seed), 0

    def __len__(self) -> int:
        return len(self.codes)

    def dropped(self, i: int) -> bool:
        """Whether example ``i``'s class is dropped in the current epoch."""
        if self.class_dropout <= 0:
            return False
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) * 1_000_033 + int(i))
        return bool(torch.rand((), generator=g) < self.class_dropout)

    def __getitem__(self, i: int) -> dict:
        cls = self.layout.null_class if self.dropped(i) else self.layout.class_token(self.labels[i])
        img = self.codes[i].tolist()
        return {"input_ids": [cls] + img, "labels": [IGNORE_INDEX] + img}


class _EpochCallback(TrainerCallback):
    """Tell the dataset which epoch Trainer is in (class dropout depends on it)."""

    def __init__(self, dataset: ImageTokenDataset):
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.epoch = int(state.epoch or 0)


def _image_task(train, test, layout: ImageLayout, options: dict, seed: int, evaluate_samples: bool) -> TrainingData:
    ds = ImageTokenDataset(train[0], train[1], layout, float(options.get("class_dropout", 0.1)),
                           int(options.get("data_seed", seed)))
    per_class = int(options.get("eval_samples_per_class", 20))
    scales = [float(s) for s in options.get("cfg_scales", [1.0, 2.0, 3.0])]

    def evaluator(model, step: int) -> dict:
        out = {"bits_per_token": bits_per_token(model, test[0], test[1], layout)}
        if evaluate_samples and per_class > 0:
            out.update(sample_metrics(model, layout, train, test, per_class=per_class, scales=scales,
                                      seed=int(options.get("data_seed", seed))))
        return out

    primary = "fd" if evaluate_samples and per_class > 0 else "bits_per_token"
    return TrainingData(train_dataset=ds, vocab_size=layout.vocab_size, pad_token_id=layout.null_class,
                    bos_token_id=None, eos_token_id=None, max_length=1 + layout.num_tokens,
                    mutor_overrides={"grid_width": layout.width, "grid_start": 1}, evaluator=evaluator,
                    primary_metric=primary, primary_higher_is_better=False, callbacks=[_EpochCallback(ds)],
                    info={"image_layout": layout.to_dict(), "num_train": len(train[0]), "num_test": len(test[0])})


_DIGITS = {"levels", "class_dropout", "eval_samples_per_class", "cfg_scales", "data_seed"}


@register_task("digits")
def build_digits(options: dict, tokenizer: Any, seed: int) -> TrainingData:
    """The ``digits`` task: scikit-learn's 8x8 digits as class-conditional image tokens.

    Args:
        options: The recipe's ``data`` block without ``task``: ``levels`` (2-17, default 8),
            ``class_dropout`` (0.1), ``eval_samples_per_class`` (20), ``cfg_scales`` ([1, 2, 3]),
            ``data_seed`` (the run's seed).
        tokenizer: Unused (the task has its own ids).
        seed: The run's seed.

    Returns:
        The training data, with an evaluator of bits per token and sample quality.

    Raises:
        ValueError: An unknown option, or ``levels`` out of range.
    """
    unknown = sorted(set(options) - _DIGITS)
    if unknown:
        raise ValueError(f"digits: unknown option(s) {unknown}; known: {sorted(_DIGITS)}")
    levels = int(options.get("levels", 8))
    if not 2 <= levels <= 17:
        raise ValueError(f"digits: levels must be in [2, 17] (pixel values are 0..16), got {levels}")
    train, test = load_digits_split(levels)
    layout = ImageLayout(codebook_size=levels, num_classes=10, height=8, width=8, levels=levels)
    return _image_task(train, test, layout, options, seed, evaluate_samples=True)


_CODES = {"path", "labels_path", "codebook_size", "num_classes", "grid_width", "test_fraction", "class_dropout",
          "data_seed", "eval_samples_per_class", "cfg_scales", "limit"}


def load_codes(path: str, labels_path: Optional[str] = None) -> tuple[np.ndarray, np.ndarray]:
    """Read pre-tokenized image codes and their labels.

    Args:
        path: A ``.npz`` or ``.safetensors`` with ``codes`` and ``labels``, a ``.npy`` of codes, or a
            ``.parquet`` with columns ``codes`` (lists) and ``label``.
        labels_path: A ``.npy`` of labels, for a ``.npy`` of codes.

    Returns:
        ``(codes (N, L) int64, labels (N,) int64)``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: An unknown extension, a ``.npy`` without ``labels_path``, or shapes that do not match.
    """
    if not os.path.exists(path):
        raise FileNotFoundError(f"data.path {path!r} does not exist")
    ext = os.path.splitext(path)[1].lower()
    if ext == ".npz":
        with np.load(path) as z:
            codes, labels = z["codes"], z["labels"]
    elif ext == ".safetensors":
        from safetensors.numpy import load_file

        d = load_file(path)
        codes, labels = d["codes"], d["labels"]
    elif ext == ".npy":
        if labels_path is None:
            raise ValueError("a .npy of codes needs data.labels_path (a .npy of class labels)")
        codes, labels = np.load(path), np.load(labels_path)
    elif ext == ".parquet":
        import pyarrow.parquet as pq

        t = pq.read_table(path)
        codes, labels = np.asarray(t.column("codes").to_pylist()), np.asarray(t.column("label").to_pylist())
    else:
        raise ValueError(f"data.path {path!r}: use .npz, .safetensors, .npy (+ labels_path) or .parquet")
    codes, labels = np.asarray(codes, dtype=np.int64), np.asarray(labels, dtype=np.int64)
    if codes.ndim != 2 or labels.shape != (len(codes),):
        raise ValueError(f"{path}: codes must be (N, L) and labels (N,); got {codes.shape} and {labels.shape}")
    return codes, labels


@register_task("image_codes")
def build_image_codes(options: dict, tokenizer: Any, seed: int) -> TrainingData:
    """The ``image_codes`` task: your own pre-tokenized images (e.g. ImageNet through a VQ tokenizer).

    Args:
        options: The recipe's ``data`` block without ``task``: ``path``, ``codebook_size`` and ``num_classes``
            (required); ``labels_path``, ``grid_width`` (default: the square root of the tokens per image),
            ``test_fraction`` (0.01), ``class_dropout`` (0.1), ``data_seed``, ``eval_samples_per_class``,
            ``cfg_scales``, ``limit`` (the first N images only).
        tokenizer: Unused (the task has its own ids).
        seed: The run's seed.

    Returns:
        The training data, with an evaluator of held-out bits per token.

    Raises:
        ValueError: An unknown or missing option, or tokens per image not a multiple of ``grid_width``.
    """
    unknown = sorted(set(options) - _CODES)
    if unknown:
        raise ValueError(f"image_codes: unknown option(s) {unknown}; known: {sorted(_CODES)}")
    for k in ("path", "codebook_size", "num_classes"):
        if k not in options:
            raise ValueError(f"image_codes needs data.{k}")
    codes, labels = load_codes(options["path"], options.get("labels_path"))
    if options.get("limit"):
        codes, labels = codes[:int(options["limit"])], labels[:int(options["limit"])]
    width = int(options.get("grid_width") or round(math.sqrt(codes.shape[1])))
    if codes.shape[1] % width:
        raise ValueError(f"image_codes: {codes.shape[1]} tokens per image is not a multiple of grid_width={width}")
    layout = ImageLayout(codebook_size=int(options["codebook_size"]), num_classes=int(options["num_classes"]),
                         height=codes.shape[1] // width, width=width)
    n_test = int(round(len(codes) * float(options.get("test_fraction", 0.01))))
    perm = np.random.default_rng(0).permutation(len(codes))
    test, train = perm[:n_test], perm[n_test:]
    return _image_task((codes[train], labels[train]), (codes[test], labels[test]), layout, options, seed,
                       evaluate_samples=False)
