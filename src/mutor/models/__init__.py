"""Base models to train: named random-init shapes (``presets``) and pretrained models shipped on PyPI (``real``).

Imports only :mod:`mutor.utils`.
"""
