"""A process configured exactly as on a GPU machine, but for the device itself.

Import this module first (before attention_lib, before anything imports numba.cuda). It keeps
the simulator off in this process, so Numba's CUDA module is the GPU target, ``cuda.jit`` makes
real dispatchers and ``import attention_lib`` chooses the GPU (numba.cuda was imported first:
its choice stands): GPU block sizes, the GPU's default kernel versions, launch bounds, the
sanitizer simulating kernels beside a GPU. What a GPU would do is done by stand-ins, each the
smallest that lets the library's own code path run:

- ``CUDADispatcher[grid, block, stream, nbytes](*args)`` runs the kernel's Python code on the
  simulator, with the launch bounds the dispatcher was compiled with, and the dynamic shared
  memory limit a launcher raised through the driver call (``dynamic_shared._raise_limit``, whose
  ``specialize`` and ``cuKernelSetAttribute`` are stood in for). A launch identical to the one
  simulated just before it (kernel, configuration and the very same arrays: a timing harness's
  repeats, which the fake clock below does not need) is not simulated again;
- device memory is the simulator's (``cuda.to_device``, ``device_array``, ``device_array_like``);
- ``cuda.event()`` is a fake clock: every interval between two events lasts ``EVENT_MS``, so a
  timing harness takes its fewest samples (and no figure it prints is a time of anything);
- ``cuda.get_current_device()`` describes an H200-sized device named as a stand-in, so no GPU
  figure can be taken from it (gpus.gpu_limits does not know the name).

Model sizes follow the stand-in's speed: ``attention_lib.SIZES`` is set to ``STAND_IN_SIZES``
after the import (on a GPU it is ANDREA-120M), while block sizes and kernel versions stay the
GPU's: what runs here is the GPU's code path, at sizes the simulator gets through in seconds.
"""

import os
from types import SimpleNamespace

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
for variable in ("ATTENTION_LIB_BACKEND", "ATTENTION_LIB_SHAPES"):
    os.environ.pop(variable, None)

from numba import cuda  # noqa: E402  (the GPU target, before attention_lib)
from numba.cuda import dispatcher  # noqa: E402
from numba.cuda.cudadrv import driver as driver_module  # noqa: E402

DEVICE_NAME = "stand-in for a GPU (kernels run on the simulator)"
STAND_IN_SIZES = None          # the model sizes of this process, set by install()
DEFAULT_DYNAMIC_LIMIT = 48 * 1024


class Device:
    """What the library asks of cuda.get_current_device(), an H200's limits."""

    name = DEVICE_NAME
    id = 0
    compute_capability = (9, 0)
    MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 227 * 1024
    MULTIPROCESSOR_COUNT = 132


EVENT_MS = 1000.0


class Event:
    """A CUDA event on a fake clock: any two recorded events are EVENT_MS apart."""

    def __init__(self, timing=True):
        self.recorded = False

    def record(self, stream=0):
        self.recorded = True

    def synchronize(self):
        pass

    def wait(self, stream=0):
        pass

    def elapsed_time(self, end):
        if not (self.recorded and end.recorded):
            raise RuntimeError("elapsed_time between events that were not both recorded")
        return EVENT_MS


def _simulated_kernel(kernel):
    """The dispatcher's simulator twin, made once, carrying its launch bounds and its limit."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    twin = kernel.__dict__.get("_stand_in_twin")
    if twin is None:
        twin = kernel.__dict__["_stand_in_twin"] = FakeCUDAKernel(kernel.py_func, device=False)
        bounds = kernel.targetoptions.get("launch_bounds")
        twin.launch_bounds = (bounds,) if isinstance(bounds, int) else bounds
    twin.max_dynamic_shared_bytes = kernel.__dict__.get("_stand_in_limit", DEFAULT_DYNAMIC_LIMIT)
    return twin


def _configure(kernel, config):
    """kernel[grid, block(, stream, nbytes)]: a launch that runs on the simulator."""
    if len(config) not in (2, 3, 4):
        raise ValueError(f"a launch configuration has 2 to 4 items, got {config!r}")
    grid, block = config[0], config[1]
    stream = config[2] if len(config) > 2 else 0
    nbytes = config[3] if len(config) > 3 else 0

    def launch(*args):
        signature = (kernel, str(grid), str(block), str(stream), nbytes, tuple(map(id, args)))
        if signature == _last_launch[0]:
            return              # a timing harness's repeat: the same work on the same arrays, done
        _simulated_kernel(kernel)[grid, block, stream, nbytes](*args)
        _last_launch[0] = signature
    return launch


_last_launch = [None]   # (kernel, configuration, argument identities) of the launch simulated last


class _Compiled:
    """What _raise_limit reads of one compiled overload: its function handle on device 0."""

    def __init__(self, kernel):
        function = SimpleNamespace(handle=kernel, device=Device())
        self._codelibrary = SimpleNamespace(get_cufunc=lambda: function)


class _Specialized(SimpleNamespace):
    """kernel.specialize(*args): one overload to raise the limit on, launched as the kernel."""

    def __getitem__(self, config):
        return _configure(self.kernel, config)


def _set_attribute(attribute, value, handle, device):
    """driver.cuKernelSetAttribute: the only attribute the library sets is the dynamic limit."""
    name = getattr(attribute, "name", str(attribute))
    if "MAX_DYNAMIC_SHARED_SIZE_BYTES" not in name:
        raise ValueError(f"the stand-in driver sets only MAX_DYNAMIC_SHARED_SIZE_BYTES, got {name}")
    if not 0 <= value <= Device.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
        raise ValueError(f"CUDA_ERROR_INVALID_VALUE: {value} bytes of dynamic shared memory")
    handle.__dict__["_stand_in_limit"] = value


def install():
    """Stand in for the GPU in this process (see the module docstring); returns attention_lib."""
    from numba.cuda.simulator.cudadrv import devicearray
    dispatcher.CUDADispatcher.__getitem__ = _configure
    dispatcher.CUDADispatcher.specialize = lambda self, *args: _Specialized(
        overloads={"stand-in": _Compiled(self)}, kernel=self)
    driver_module.driver.cuKernelSetAttribute = _set_attribute
    for name in ("to_device", "device_array", "device_array_like", "pinned_array"):
        setattr(cuda, name, getattr(devicearray, name))
    cuda.event = cuda.Event = Event
    cuda.synchronize = lambda: None
    cuda.is_available = lambda: True
    cuda.get_current_device = Device
    global STAND_IN_SIZES
    import attention_lib
    from attention_lib.platform import runtime, simulator
    STAND_IN_SIZES = _stand_in_sizes()
    simulator.install()                      # as the sanitizer does beside a GPU
    assert attention_lib.BACKEND == runtime.GPU and not runtime.SIMULATOR_SHAPES, attention_lib.banner()
    attention_lib.SIZES = runtime.SIZES = STAND_IN_SIZES
    return attention_lib


def _stand_in_sizes():
    from attention_lib.platform.runtime import ModelSizes
    return ModelSizes("stand-in sizes", d_model=16, n_head=2, T=12, n_layer=2, batch=1)
