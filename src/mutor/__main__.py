"""``python -m mutor <command>`` (and ``accelerate launch -m mutor train ...`` for multi-GPU)."""

from .run.cli import main

raise SystemExit(main())
