"""Ending a multi-process run: the ranks leave the process group, then each process ends without the interpreter's
teardown of the objects left over.

Objects of a finished run can outlive ``torch.distributed.destroy_process_group``. Under DeepSpeed ZeRO-3 the
engine, its parameter coordinator and the parameters themselves (each carries its ``ds_process_group``) keep the
gloo process groups alive: after a 2-process ZeRO-3 run has returned, dropped its trainer, called
``destroy_process_group`` (DeepSpeed's too) and collected garbage, each rank still runs all six of its gloo
threads. Those groups are then destroyed while the interpreter tears itself down, where PyTorch's gloo backend
can abort the process ("terminate called without an active exception", SIGABRT) after every file was written,
so that ``torchrun`` reports a failed run: rarely, mostly on a loaded machine. PyTorch reports the same abort for
process groups left to the interpreter's exit.

So a process whose distributed work is done ends here, as an orderly exit does, less that teardown: the ranks
meet and leave the process group, the exit handlers run (``atexit``: loggers, trackers), standard output and
error are flushed, and ``os._exit`` ends the process with its status.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn


def in_process_group() -> bool:
    """Whether this process is a rank of an initialised ``torch.distributed`` process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def leave_process_group(meet: bool = True) -> None:
    """End the process group (nothing without one): the ranks meet first (``meet``), then the group is
    destroyed, DeepSpeed's references to its groups released with it where DeepSpeed set it up."""
    import torch.distributed as dist

    if not in_process_group():
        return
    if meet:
        dist.barrier()
    deepspeed_comm = sys.modules.get("deepspeed.comm")
    if deepspeed_comm is not None and deepspeed_comm.is_initialized():
        deepspeed_comm.destroy_process_group()          # also drops DeepSpeed's module-level group references
    if dist.is_initialized():
        dist.destroy_process_group()


def end_process(status: int = 0) -> NoReturn:
    """End this process with ``status`` after the exit handlers have run and the output is flushed, without
    destroying the objects left over (see the module: a process group they hold would be destroyed there).

    Args:
        status: The exit status.
    """
    atexit._run_exitfuncs()                               # what an orderly exit runs first (loggers, trackers)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):                     # closed or gone: nothing left to flush
            pass
    os._exit(status)
