"""Held-out bits per token, and sample quality on the embedded digits data, with nothing downloaded.

``bits_per_token`` is the teacher-forced cross-entropy of the image tokens given the true class
(any image task). For sample quality, features come from a small classifier trained in-project
on the training split (scikit-learn's ``MLPClassifier``, one hidden layer of 64 ReLU units,
fixed seed); an image's feature vector is its hidden activation. In that space:

* Fréchet distance (FD) between Gaussian fits of real test images and samples, the FID formula;
* precision / recall with k = 3 nearest neighbours (Kynkäänniemi et al., 2019): the share of
  samples inside the real manifold, and of real images inside the sample manifold;
* the real-vs-real floor: FD between the training and test splits (what "as good as data" reads);
* class accuracy of samples under classifier-free guidance scales (how well samples follow their class).

For ImageNet codes, decode ``mutor sample`` outputs with your VQ decoder and use the standard
FID/IS suite (ADM's evaluator) on the images.
"""

from __future__ import annotations

import math
import warnings
from typing import Sequence

import numpy as np
import torch

from .sample import sample_codes
from .tokens import ImageLayout, dequantize

__all__ = ["bits_per_token", "frechet_distance", "precision_recall", "FeatureClassifier", "sample_metrics"]


@torch.no_grad()
def bits_per_token(model: torch.nn.Module, codes: np.ndarray, labels: np.ndarray, layout: ImageLayout,
                   batch_size: int = 256) -> float:
    """Held-out teacher-forced cross-entropy of the image tokens given the true class, in bits per token.

    Args:
        model: A causal LM trained on an image task.
        codes: (N, H*W) image codes.
        labels: (N,) their classes.
        layout: The task's vocabulary and grid.
        batch_size: Images per forward.

    Returns:
        Bits per image token.
    """
    from ..utils.devices import model_device

    dev = model_device(model)
    total, n = 0.0, 0
    for i in range(0, len(codes), batch_size):
        c = torch.as_tensor(codes[i:i + batch_size], device=dev)
        cls = torch.as_tensor(labels[i:i + batch_size], device=dev) + layout.codebook_size
        ids = torch.cat([cls[:, None], c], 1)                                            # (B, 1+HW)
        logits = model(input_ids=ids).logits[:, :-1].float()                             # (B, HW, V)
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), c, reduction="sum")
        total, n = total + float(ce), n + c.numel()
    return total / n / math.log(2)


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The Fréchet distance of Gaussian fits to two feature sets (the FID formula).

    ``||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^(1/2))``.

    Args:
        a: (N, F) features, one row per sample.
        b: (M, F) features.

    Returns:
        The distance.
    """
    from scipy import linalg

    mu_a, mu_b = a.mean(0), b.mean(0)
    eye = np.eye(a.shape[1]) * 1e-6            # dead ReLU features make covariances singular (as pytorch-fid does)
    sa, sb = np.cov(a, rowvar=False) + eye, np.cov(b, rowvar=False) + eye
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        covmean = linalg.sqrtm(sa @ sb)
    covmean = np.real(covmean)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(sa + sb - 2 * covmean))


def _kth_radius(x: np.ndarray, k: int) -> np.ndarray:
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))                                  # (N, N)
    return np.sort(d, axis=1)[:, k]                                                    # column 0 is the point itself


def _inside(points: np.ndarray, centres: np.ndarray, radii: np.ndarray) -> np.ndarray:
    d = np.sqrt(((points[:, None] - centres[None]) ** 2).sum(-1))                      # (P, C)
    return (d <= radii[None]).any(1)


def precision_recall(real: np.ndarray, fake: np.ndarray, k: int = 3) -> tuple[float, float]:
    """Improved precision and recall (Kynkäänniemi et al., 2019) with k-NN manifolds.

    Args:
        real: (N, F) features of real images.
        fake: (M, F) features of samples.
        k: The neighbour whose distance is each point's manifold radius.

    Returns:
        ``(precision, recall)``: the share of samples inside the real manifold, and of real images inside the
        samples' manifold.
    """
    precision = float(_inside(fake, real, _kth_radius(real, k)).mean())
    recall = float(_inside(real, fake, _kth_radius(fake, k)).mean())
    return precision, recall


class FeatureClassifier:
    """The in-project digit classifier whose hidden layer is the feature space.

    scikit-learn's ``MLPClassifier`` with one hidden layer of 64 ReLU units, fitted on dequantized codes.

    Args:
        codes: (N, H*W) training codes.
        labels: (N,) their classes.
        levels: The intensity levels of the codes.
        seed: The classifier's random state.
    """

    def __init__(self, codes: np.ndarray, labels: np.ndarray, levels: int, seed: int = 0):
        from sklearn.neural_network import MLPClassifier

        self.levels = levels
        self.clf = MLPClassifier(hidden_layer_sizes=(64,), max_iter=500, random_state=seed)
        self.clf.fit(self._x(codes), labels)

    def _x(self, codes: np.ndarray) -> np.ndarray:
        return dequantize(codes, self.levels)

    def features(self, codes: np.ndarray) -> np.ndarray:
        """(N, 64) hidden activations of ``codes`` (N, H*W)."""
        x = self._x(codes) @ self.clf.coefs_[0] + self.clf.intercepts_[0]
        return np.maximum(x, 0.0)

    def predict(self, codes: np.ndarray) -> np.ndarray:
        """(N,) predicted classes of ``codes`` (N, H*W)."""
        return self.clf.predict(self._x(codes))


_CLASSIFIERS: dict = {}


def classifier_for(train: tuple, levels: int) -> FeatureClassifier:
    """The classifier for a training split, trained once per process (deterministic, about a second)."""
    key = (train[0].shape, int(train[0].sum()), int(train[1].sum()), levels)
    if key not in _CLASSIFIERS:
        _CLASSIFIERS[key] = FeatureClassifier(train[0], train[1], levels)
    return _CLASSIFIERS[key]


def sample_metrics(model: torch.nn.Module, layout: ImageLayout, train: tuple, test: tuple, per_class: int = 20,
                   scales: Sequence[float] = (1.0, 2.0, 3.0), seed: int = 0, main_scale: float = 2.0) -> dict:
    """Sample quality of an image model on digits, in the feature classifier's space.

    Args:
        model: A causal LM trained on the digits task.
        layout: The task's vocabulary and grid.
        train: ``(codes, labels)`` of the training split (fits the feature classifier).
        test: ``(codes, labels)`` of the held-out split (the real images compared against).
        per_class: Samples per class at each scale.
        scales: Classifier-free guidance scales at which class accuracy is measured.
        seed: Seed of the sampling generator.
        main_scale: The scale of FD, precision and recall (the paper's s=2).

    Returns:
        ``fd``, ``precision`` and ``recall`` at ``main_scale``, ``class_acc_cfg<s>`` at every scale, and
        ``fd_floor``: FD between the training and test splits.
    """
    clf = classifier_for(train, layout.levels or layout.codebook_size)
    classes = [c for c in range(layout.num_classes) for _ in range(per_class)]
    real = clf.features(test[0])
    out = {"fd_floor": frechet_distance(clf.features(train[0]), real)}
    for s in sorted(set(list(scales) + [main_scale])):
        g = torch.Generator().manual_seed(seed)
        codes = sample_codes(model, layout, classes, cfg_scale=s, temperature=1.0, generator=g)
        acc = float((clf.predict(codes) == np.asarray(classes)).mean())
        out[f"class_acc_cfg{s:g}"] = acc
        if s == main_scale:
            fake = clf.features(codes)
            out["fd"] = frechet_distance(real, fake)
            out["precision"], out["recall"] = precision_recall(real, fake, k=3)
    return out
