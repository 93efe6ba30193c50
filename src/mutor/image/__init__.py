"""MuToR-2D: class-conditional autoregressive image generation over discrete tokens (the paper's 3.4, 4.2).

``tokens`` (the vocabulary of codes, classes and the null class; quantised intensities),
``data`` (digits from scikit-learn and pre-tokenized VQ codes, as ``mutor train`` tasks),
``sample`` (KV-cache sampling with classifier-free guidance), ``metrics`` (bits per token,
Fréchet distance and precision/recall in an in-project classifier's feature space) and
``rotary2d`` (2D RoPE over the token grid, swapped into any RoPE decoder). Imports run one
way: ``data`` -> ``metrics`` -> ``sample`` -> ``tokens``.
"""
