"""Where the kernels run: a real NVIDIA GPU or Numba's CUDA simulator, and the sizes that go with it.

Numba reads ``NUMBA_ENABLE_CUDASIM`` once, when its CUDA module is first imported, so the
choice must be made before anything imports ``numba.cuda``. ``attention_lib/__init__.py``
imports this module first for that reason, and notebooks and tests import ``attention_lib``
before they touch Numba.

The choice, in order:

1. ``ATTENTION_LIB_BACKEND=gpu`` or ``=simulator`` forces one (``auto``, the default, decides).
2. ``NUMBA_ENABLE_CUDASIM=1`` set by the user selects the simulator.
3. Otherwise a GPU is used when the CUDA driver reports one *and* numba-cuda's CUDA toolkit
   (the ``gpu`` extra) is installed; in every other case the simulator is switched on.

``BACKEND`` holds the choice, ``REASON`` says why in one line, ``banner()`` prints both.
``SIZES`` holds the model sizes the notebooks and tests use: ANDREA-120M on a GPU, a small
model of the same shape on the simulator.
"""

import ctypes
import ctypes.util
import os
import sys
from dataclasses import dataclass

from attention_lib import numba_patches

BACKEND_VARIABLE = "ATTENTION_LIB_BACKEND"
GPU = "gpu"
SIMULATOR = "simulator"

# The simulator runs each CUDA thread as a Python thread. Python hands the interpreter from
# one thread to the next every 5 ms by default, so a thread waiting at a barrier can keep the
# interpreter for 5 ms doing nothing. Measured on a 2-core machine (numba-cuda 0.30.4) with
# scripts/simulator_speed.py, a 16x16-tiled 64x64 matmul: 5.6 s at 5 ms, 3.2 s at 1 ms,
# 2.5 s at 0.5 ms and at 0.1 ms; a kernel without barriers is unchanged within noise.
# See README, "The simulator".
SIMULATOR_SWITCH_INTERVAL_S = 5e-4


@dataclass(frozen=True)
class ModelSizes:
    """The shape of one attention layer of the running example.

    d_model: width of the vector at each position; n_head: heads; T: context length
    (positions); n_layer: transformer layers; batch: sequences processed together.
    """

    name: str
    d_model: int
    n_head: int
    T: int
    n_layer: int
    batch: int

    @property
    def d_k(self) -> int:
        """Width of one head: d_model / n_head."""
        return self.d_model // self.n_head

    def __str__(self) -> str:
        return (f"{self.name}: d_model {self.d_model}, n_head {self.n_head}, d_k {self.d_k}, "
                f"T {self.T}, n_layer {self.n_layer}, batch {self.batch}")


# The course's running example, GPT-2-small-like.
ANDREA_120M = ModelSizes("ANDREA-120M", d_model=768, n_head=12, T=1024, n_layer=12, batch=8)
# Same structure (several heads, T a multiple of a 16-wide tile plus sizes that are not),
# small enough that a whole notebook runs on the simulator in well under a minute.
ANDREA_SIMULATOR = ModelSizes("ANDREA-sim", d_model=64, n_head=4, T=32, n_layer=12, batch=2)


def _gpu_count_from_driver():
    """Ask the CUDA driver how many GPUs it sees, without importing Numba.

    Returns (count, why): count is 0 when there is no driver or no device, and `why` says
    what was found in words.
    """
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so"]
    found = ctypes.util.find_library("cuda")
    if found:
        names.append(found)
    for name in names:
        try:
            driver = ctypes.CDLL(name)
        except OSError:
            continue
        if driver.cuInit(0) != 0:
            return 0, f"the CUDA driver ({name}) did not initialise"
        count = ctypes.c_int(0)
        if driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
            return 0, "the CUDA driver reports no GPU"
        device_name = ctypes.create_string_buffer(256)
        driver.cuDeviceGet(ctypes.byref(ctypes.c_int()), 0)
        driver.cuDeviceGetName(device_name, 256, 0)
        return count.value, f"found {device_name.value.decode(errors='replace')}"
    return 0, "no CUDA driver (libcuda) is installed"


def _toolkit_installed():
    """True when numba-cuda can compile for a GPU: its NVVM library is importable."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        load_nvidia_dynamic_lib("nvvm")
        return True
    except Exception:  # any failure means the same thing here: no usable toolkit
        return False


def _choose():
    """Decide the backend; returns (backend, reason). Imports nothing from Numba."""
    if "numba.cuda" in sys.modules:
        import numba
        backend = SIMULATOR if numba.config.ENABLE_CUDASIM else GPU
        return backend, ("numba.cuda was imported before attention_lib, so its choice stands; "
                         "import attention_lib first to let it choose")
    asked = os.environ.get(BACKEND_VARIABLE, "auto").strip().lower()
    if asked not in ("auto", GPU, SIMULATOR):
        raise ValueError(f"{BACKEND_VARIABLE} must be 'auto', 'gpu' or 'simulator', got {asked!r}")
    if asked == SIMULATOR:
        return SIMULATOR, f"{BACKEND_VARIABLE}=simulator"
    if asked == GPU:
        count, found = _gpu_count_from_driver()
        if count == 0:
            raise RuntimeError(f"{BACKEND_VARIABLE}=gpu but {found}; unset it to use the simulator")
        return GPU, f"{BACKEND_VARIABLE}=gpu, {found}"
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return SIMULATOR, "NUMBA_ENABLE_CUDASIM=1 is set"
    count, found = _gpu_count_from_driver()
    if count == 0:
        return SIMULATOR, found
    if not _toolkit_installed():
        return SIMULATOR, (f"{found}, but numba-cuda's CUDA toolkit is missing: "
                           "pip install -e '.[gpu]' (or '.[gpu-cu12]' for CUDA 12 drivers)")
    return GPU, found


def _activate(backend):
    """Tell Numba the choice, before (or, if Numba is loaded but not its CUDA module, as) it reads it."""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if backend == SIMULATOR else "0"
    if "numba" in sys.modules and "numba.cuda" not in sys.modules:
        from numba.core import config
        config.reload_config()
    if backend == SIMULATOR:
        sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)


BACKEND, REASON = _choose()
_activate(BACKEND)
if BACKEND == SIMULATOR:
    numba_patches.lock_simulator_shared_arrays()
ON_SIMULATOR = BACKEND == SIMULATOR
SIZES = ANDREA_SIMULATOR if ON_SIMULATOR else ANDREA_120M

# The stage modules' backend-dependent constants (block sizes, the kernel versions a composite
# uses) read SIMULATOR_SHAPES, not ON_SIMULATOR: ATTENTION_LIB_SHAPES=gpu gives them their GPU
# values on the simulator too, so the kernel report records the launches a GPU makes and a test
# runs the GPU configuration at tiny sizes. Model sizes (SIZES) still follow the backend.
SHAPES_VARIABLE = "ATTENTION_LIB_SHAPES"
_shapes = os.environ.get(SHAPES_VARIABLE, "auto").strip().lower()
if _shapes not in ("auto", GPU):
    raise ValueError(f"{SHAPES_VARIABLE} must be 'auto' or 'gpu', got {_shapes!r}")
SIMULATOR_SHAPES = ON_SIMULATOR and _shapes != GPU


def banner() -> str:
    """One line: where kernels run, why, and how to switch."""
    where = "Numba's CUDA simulator (on the CPU)" if ON_SIMULATOR else "a real NVIDIA GPU"
    other = SIMULATOR if not ON_SIMULATOR else GPU
    return (f"Kernels run on {where}: {REASON}. Sizes: {SIZES}. "
            f"To switch, set {BACKEND_VARIABLE}={other} before importing attention_lib.")
