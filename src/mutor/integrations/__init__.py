"""The methods inside the tools people train and decode with: transformers' ``Trainer`` (``trainer``, with
the clipping it uses, ``clipping``), TRL's ``SFTTrainer`` (``trl``) and register drafting (``speculative``).

Imports :mod:`mutor.methods` and below.
"""
