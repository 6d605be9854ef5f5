"""A check's time limit, in CPU seconds: an answer that never ends is stopped and named.

A kernel with a loop that never ends would keep a simulated check running until someone interrupts
the notebook (in grading, until nbgrader's cell timeout). ``limited(seconds)`` stops the code
inside it once this process has spent `seconds` of CPU time in it, by raising ``OutOfTime`` where
the code is (simulated threads are greenlets of this thread, so a kernel's loop is interrupted
too). CPU time, not wall time: a machine busy with other work gives a check the same budget, so a
verdict never depends on the load. Outside the main thread (where no signal can be delivered), or
where the platform has no CPU-time timer, the block runs without a limit.

On a real GPU a kernel that never ends cannot be stopped from Python: the launch's next copy waits
in the driver. The limit still stops what runs on the CPU (simulated cases, NumPy answers).
"""

import signal
import threading
from contextlib import contextmanager

# A right answer's check takes a few seconds of CPU on the simulator (tests/test_checks.py holds the
# slowest under this budget's fifth); a loop that never ends is stopped after this many.
DEFAULT_SECONDS = 30.0


class OutOfTime(BaseException):
    """The budget ran out. A BaseException, as KeyboardInterrupt is, so that an answer's or a
    simulated thread's ``except Exception`` cannot swallow it."""


def _available():
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextmanager
def limited(seconds=DEFAULT_SECONDS):
    """Run the block with at most `seconds` of this process's CPU time; OutOfTime past it."""
    if not _available() or seconds is None:
        yield
        return

    def stop(signum, frame):
        raise OutOfTime(f"still running after {seconds:g} s of CPU time")

    previous = signal.signal(signal.SIGPROF, stop)
    remaining, _ = signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)
        if remaining:                                   # an enclosing limit starts again from what it had left
            signal.setitimer(signal.ITIMER_PROF, remaining)
