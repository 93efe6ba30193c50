"""How a multi-process run ends (``mutor.run.teardown``): the process group is left, and the process ends with its
status after the exit handlers ran and the output was flushed, without the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_end_process_runs_the_exit_handlers_flushes_and_exits_with_its_status():
    out = _python("""
        import atexit, sys
        from mutor.run.teardown import end_process

        class Leftover:                        # the interpreter's teardown would print this; end_process skips it
            def __del__(self):
                print("teardown ran")
        leftover = Leftover()
        atexit.register(lambda: print("exit handler ran"))
        print("unflushed", end="")
        sys.stderr.write("to stderr")
        end_process(3)
        print("not reached")
    """)
    assert out.returncode == 3, out
    assert out.stdout == "unflushedexit handler ran\n" and out.stderr == "to stderr", out


def test_leave_process_group_ends_the_group_and_is_a_no_op_without_one():
    out = _python("""
        import torch.distributed as dist
        from mutor.run.teardown import in_process_group, leave_process_group

        leave_process_group()                  # no group: nothing to do
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
        assert in_process_group()
        leave_process_group()
        print(in_process_group())
    """)
    assert out.returncode == 0 and out.stdout.strip() == "False", out
