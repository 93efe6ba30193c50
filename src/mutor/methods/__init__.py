"""The training methods, each a wrapper around an unmodified causal LM: MuToR (``mutor``), the next-token
baseline (``next_token``) and the Multi-Token baseline (``multi_token``), on one base (``wrapper``), with
one registry (``registry``) that everything above consults by method name.

Imports :mod:`mutor.core` and :mod:`mutor.utils` only.
"""
