"""Put this folder on a test subprocess's PYTHONPATH: SIGUSR2 then prints where it waits.

For a process that does not stop when told: every thread's stack (faulthandler) and,
in the thread running an event loop, every asyncio task's chain of awaits down to what
it waits on (a thread's stack only shows the loop's idle selector). Printed to stderr,
which the tests send to the process's log.
"""

from __future__ import annotations

import asyncio
import faulthandler
import signal
import sys
from typing import Any


def _dump(_signum: int, _frame: object) -> None:
    err = sys.stderr
    print("=== stack dump (SIGUSR2) ===", file=err, flush=True)
    faulthandler.dump_traceback(file=err, all_threads=True)
    try:
        loop = asyncio.get_running_loop()  # a signal handler runs in the loop's thread
    except RuntimeError:
        print("no running event loop in the main thread", file=err, flush=True)
        return
    for task in asyncio.all_tasks(loop):
        print(f"task {task.get_name()}", file=err)
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is None:
                print(f"    waits on {awaited!r}"[:400], file=err)
                break
            print(
                f"    {frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}", file=err
            )
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    print("=== end of stack dump ===", file=err, flush=True)


signal.signal(signal.SIGUSR2, _dump)
