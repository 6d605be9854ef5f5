"""The argument types and block size of each kernel's launch, as its launcher really makes it.

The simulator does not type-check, so the types a kernel is compiled with for a GPU are taken
from a real launch: ``kernel_cases.CASES`` runs each launcher with a ``TypeRecorder`` standing
in for the kernel, up to that launch. Used by the compile check (tests/test_compile.py) and the kernel report.

An argument is described in words that survive JSON: ``{"dtype": "float32", "ndim": 3,
"layout": "C"}`` for an array, ``{"scalar": "float32"}`` for a number; ``numba_type`` reads
one back as a Numba type (``str`` of it is how Numba prints it: ``array(float32, 3d, C)``).
"""

import math

import numpy as np


def describe(arg):
    """The type of one kernel argument, in words (see the module docstring)."""
    if hasattr(arg, "shape") and hasattr(arg, "dtype") and np.ndim(arg) > 0:
        c_contiguous = arg.flags["C_CONTIGUOUS"] if hasattr(arg, "flags") else arg.is_c_contiguous()
        return {"dtype": str(arg.dtype), "ndim": len(arg.shape), "layout": "C" if c_contiguous else "A"}
    if isinstance(arg, (bool, np.bool_)):
        return {"scalar": "boolean"}
    if isinstance(arg, np.generic):
        return {"scalar": str(arg.dtype)}
    return {"scalar": "int64" if isinstance(arg, int) else "float64"}


def numba_type(arg):
    """The Numba type of one described argument."""
    from numba.cuda import types
    if "scalar" in arg:
        return getattr(types, arg["scalar"])
    return types.Array(getattr(types, arg["dtype"]), arg["ndim"], arg["layout"])


def threads_in(blockdim):
    """Threads per block of a launch's block shape (an int or a tuple of up to 3 ints)."""
    return int(blockdim) if np.ndim(blockdim) == 0 else math.prod(int(d) for d in blockdim)


class Recorded(Exception):
    """Raised by a TypeRecorder at the launch it records: the launcher stops there."""


class TypeRecorder:
    """Looks like a kernel to a launcher: records the argument types, block size and dynamic
    shared memory of its launch, then stops the launcher (raises ``Recorded``) instead of running the kernel."""

    def __init__(self, kernel):
        self.kernel, self.py_func = kernel, kernel.py_func
        self.arg_types = None
        self.threads_per_block = None
        self.dynamic_shared_bytes = 0

    def __getitem__(self, config):
        def launch(*args):
            self.arg_types = [describe(a) for a in args]
            self.threads_per_block = threads_in(config[1])
            self.dynamic_shared_bytes = int(config[3]) if len(config) > 3 else 0
            raise Recorded(self.kernel)
        return launch


def check_names(names):
    """A one-line error unless every name in `names` (None: all) has a case in kernel_cases.CASES."""
    from attention_lib.measure.kernel_cases import CASES
    unknown = sorted(set(names or ()) - set(CASES))
    if unknown:
        raise ValueError(f"names: no case in kernel_cases.CASES for {unknown}; known: {sorted(CASES)}")


def recorded_launches(names=None):
    """name -> {"args": [described argument, ...], "threads_per_block": N,
    "dynamic_shared_bytes": B} for every kernel of ``kernel_cases.CASES`` (or those in `names`),
    from the first launch its launcher makes.

    What runs before that launch runs for real (input copies, the kernels a launcher starts
    first); nothing after it does.
    """
    from attention_lib.measure.kernel_cases import CASES, library_kernels
    check_names(names)
    kernels = library_kernels()
    launches = {}
    for name in sorted(CASES if names is None else names):
        recorder = TypeRecorder(kernels[name])
        try:
            CASES[name](recorder)
        except Recorded:
            pass
        if not recorder.arg_types:
            raise RuntimeError(f"{name}: its case in kernel_cases.CASES launched nothing")
        launches[name] = {"args": recorder.arg_types, "threads_per_block": recorder.threads_per_block,
                          "dynamic_shared_bytes": recorder.dynamic_shared_bytes}
    return launches
