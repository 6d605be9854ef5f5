"""One small, awkward launch of every kernel of the library, through its own launcher.

`CASES[name](stand_in)` calls the kernel's launcher with `kernel=stand_in`: an object that
looks like a kernel to the launcher (`stand_in[griddim, blockdim](*args)`) and does something
with each launch: tests/test_race_free.py runs it under the race finder, tests/test_compile.py
records the argument types to compile the kernel for real GPUs. `library_kernels()` discovers
every kernel in the package, so a kernel without a case is noticed.
"""

import importlib
import pkgutil

import attention_lib
import numpy as np


def library_kernels():
    """name -> kernel, for every @cuda.jit kernel (not device function) in attention_lib."""
    found = {}
    for info in pkgutil.walk_packages(attention_lib.__path__, "attention_lib."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if not hasattr(value, "py_func") or value.py_func.__module__ != info.name:
                continue
            device = getattr(value, "_device", None)                        # simulator
            if device is None:
                device = getattr(value, "targetoptions", {}).get("device", False)  # GPU
            if not device:
                found[f"{info.name.rsplit('.', 1)[1]}.{name}"] = value
    return found


def _rng():
    return np.random.default_rng(7)


def _basics(name):
    from attention_lib import basics
    x, y = _rng().standard_normal((2, 70))
    if name == "add_kernel":
        return lambda k: basics.add(x, y, kernel=k)
    return lambda k: basics.scale_add(1.5, x, y, kernel=k)


def _whoami(name):
    from attention_lib import basics

    def run(recorder):
        ids = [np.zeros(70, np.int32) for _ in range(3)]
        if name == "whoami_kernel":
            recorder[3, 32](*ids)
        else:
            recorder[(2, 2), (8, 8)](np.zeros((11, 13), np.int32), np.zeros((11, 13), np.int32))
    return run


def _projection(version):
    from attention_lib import projection
    x, w = _rng().standard_normal((19, 21)), _rng().standard_normal((21, 18))
    return lambda k: projection.project(x, w, b=np.ones(18), kernel=k, version=version)


def _softmax(version):
    from attention_lib import softmax
    s = _rng().standard_normal((5, 37))
    s[2, :] = -np.inf                                     # a fully masked row exits early
    return lambda k: softmax.softmax(s, kernel=k, version=version)


def _scores(version):
    from attention_lib import scores
    q, k = _rng().standard_normal((2, 2, 19, 7))       # two heads, T 19 (a partial tile), d_k 7
    return lambda kern: scores.scores(q, k, kernel=kern, version=version)


def _mask(name):
    from attention_lib import mask
    if name == "mask_kernel_v1":
        s = _rng().standard_normal((2, 19, 23))
        return lambda kern: mask.apply_causal_mask(s, kernel=kern)
    q, k = _rng().standard_normal((2, 2, 35, 7))       # T 35: skipped, diagonal and partial tiles
    return lambda kern: mask.causal_scores(q, k, kernel=kern)


# kernel name -> a function that launches it, given the recorder standing in for the kernel
CASES = {
    "basics.add_kernel": _basics("add_kernel"),
    "basics.scale_add_kernel": _basics("scale_add_kernel"),
    "basics.whoami_kernel": _whoami("whoami_kernel"),
    "basics.whoami_2d_kernel": _whoami("whoami_2d_kernel"),
    "projection.projection_kernel_v1": _projection(1),
    "projection.projection_kernel_v2": _projection(2),
    "softmax.softmax_kernel_v1": _softmax(1),
    "softmax.softmax_kernel_v2": _softmax(2),
    "scores.scores_kernel_v1": _scores(1),
    "scores.scores_kernel_v2": _scores(2),
    "mask.mask_kernel_v1": _mask("mask_kernel_v1"),
    "mask.mask_kernel_v2": _mask("mask_kernel_v2"),
}


