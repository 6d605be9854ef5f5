"""How a check launches a student's kernel, and the output buffers that tell a never-written entry.

One ``launch(kernel, griddim, blockdim, *args, trace=False, compile=True, sharedmem=0)`` makes the
two choices a check has: ``trace`` runs the kernel once on the simulator with every access recorded
(races found, the trace kept for the case's limits); ``compile`` reports the launch to the check being
judged, whose first launch of each kernel holding the answer's code is compiled for a GPU once every
case is right (``session``). An exercise's ``run`` gets the launch the judge chooses for the case
(``plain_launch`` or ``race_finding_launch``); it asks for ``traced_launch`` where it needs the trace
itself, and passes ``compile=False`` for a launch no GPU compile should hold (a kernel at a head width
past the one compiled, whose compile would cost the check seconds).

An output the kernel must write comes from ``output_array`` (``host_output`` for a launch on NumPy
arrays), every entry ``UNWRITTEN``: after the launch an entry still holding it was never written.
"""

from functools import partial

import numpy as np
from numba import cuda

from attention_lib.checks import session
from attention_lib.measure import sanitizer
from attention_lib.measure.trace import Traced
from attention_lib.platform import runtime


class RaceFound(Exception):
    """The race finder saw two threads touch the same element without a barrier between them.
    ``race``: the first sanitizer.Race, its message the exception's."""

    def __init__(self, race):
        super().__init__(str(race))
        self.race = race

    def advice(self):
        """What to do about it, in one sentence: blocks never wait for each other, threads of a
        block wait at a barrier."""
        race = self.race
        if getattr(race, "block_a", None) is not None and race.block_a != race.block_b:
            return ("Two blocks touch one element of global memory, and blocks never wait for each other: no "
                    "barrier orders them. Give each block its own elements to write (or combine with atomics).")
        if race.space == sanitizer.GLOBAL:
            return ("Two threads of one block touch one element of global memory: a barrier would order them, "
                    "but one element needs one writer (and its readers after a barrier).")
        return ("Threads of one block touch one slot of shared memory with no barrier (cuda.syncthreads()) between "
                "them: every thread must finish writing a slot before any reads it, and finish reading before it is "
                "overwritten.")


class OutOfBoundsWrite(IndexError):
    """A kernel wrote into the guard zone past the end of an output array."""


def launch(kernel, griddim, blockdim, *args, trace=False, compile=True, sharedmem=0):
    """Launch a student's kernel as the library would, out-of-bounds indices caught (IndexError).

    Untraced, it runs on the sanitizer on the simulator (which names the thread, the array and the
    index) and for real on a GPU, except in a check's other configuration (``shapes``), whose
    constants only a simulated launch sees. Traced, it runs once on the simulator on either backend
    and raises RaceFound with the first race; it returns the Traced launch, which the judge also
    keeps for the case's limits. sharedmem: bytes of dynamic shared memory."""
    judging = session.current()
    if judging is not None and (compile or judging.compile_first):   # graded: every kernel compiled first
        judging.launched(kernel, args)
    if trace:
        traced = Traced(kernel, griddim, blockdim, *args, sharedmem=sharedmem)
        if judging is not None:
            judging.traces.append(traced)
        races = traced.races()
        if races:
            raise RaceFound(races[0])
        return traced
    if runtime.ON_SIMULATOR or (judging is not None and judging.simulate):
        sanitizer.run(kernel, griddim, blockdim, *args, sharedmem=sharedmem)
    else:
        kernel[griddim, blockdim, 0, sharedmem](*args)
    return None


# The two launches the judge hands an exercise's run: traced on the cases it race-checks.
plain_launch = partial(launch)
race_finding_launch = partial(launch, trace=True)
# An exercise's run that needs the trace itself (its counts, its tile slots) calls this name.
traced_launch = race_finding_launch


# The convention for an output the kernel must write: output_array prefills it, and its guard zone,
# with UNWRITTEN, a NaN of its own (the payload 0xFFEE). Arithmetic on numbers never makes it: 0 / 0
# and inf - inf give the default NaN, whose payload is another; only a kernel that reads the
# unwritten entry itself can pass it on. So after the launch an entry still holding UNWRITTEN was
# never written, any other NaN was computed, and the judge tells the two apart (unwritten) without
# the exercise converting anything.
UNWRITTEN = np.array(0x7FC0FFEE, np.uint32).view(np.float32)[()]


def output_array(shape, guard):
    """(full, out): a device float32 vector of prod(shape) + guard entries, all UNWRITTEN, and out,
    the view of its first prod(shape) entries as `shape` (an int or a tuple). The guard zone behind
    out catches writes past its end on a real GPU, where they would otherwise land silently;
    read_output checks it."""
    n = int(np.prod(shape))
    full = cuda.to_device(np.full(n + guard, UNWRITTEN, np.float32))
    return full, full[:n].reshape(shape)


def host_output(shape):
    """A NumPy float32 array of `shape`, all UNWRITTEN: output_array's convention for a launch on
    NumPy arrays, without a guard zone (the simulator's sanitizer checks every index)."""
    return np.full(shape, UNWRITTEN, np.float32)


def unwritten(values):
    """Where `values` (any float array) still hold UNWRITTEN, bit for bit: a bool array of its shape."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return np.zeros(values.shape, bool)
    with np.errstate(over="ignore"):        # float64 beyond float32's range: inf, not UNWRITTEN
        return np.asarray(values, np.float32).view(np.uint32) == UNWRITTEN.view(np.uint32)


def read_output(full, out):
    """The host copy of out (output_array's view), once the guard zone behind it is found intact:
    OutOfBoundsWrite names the first entry written past the end."""
    n = out.size
    tail = full.copy_to_host()[n:]
    if not unwritten(tail).all():
        first = n + int(np.argmax(~unwritten(tail)))
        raise OutOfBoundsWrite(f"out[{first}] was written but out has only {n} elements")
    return out.copy_to_host()
