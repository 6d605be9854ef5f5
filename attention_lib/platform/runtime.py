"""Where the kernels run: a real NVIDIA GPU or Numba's CUDA simulator, and the sizes that go with it.

Numba reads ``NUMBA_ENABLE_CUDASIM`` once, when its CUDA module is first imported, so the
choice must be made before anything imports ``numba.cuda``. ``attention_lib/__init__.py``
imports this module first for that reason, and notebooks and tests import ``attention_lib``
before they touch Numba.

The choice, in order:

1. ``ATTENTION_LIB_BACKEND=gpu`` or ``=simulator`` forces one (``auto``, the default, decides).
2. ``NUMBA_ENABLE_CUDASIM=1`` set by the user selects the simulator.
3. Otherwise a GPU is used when a child process (``gpu_probe.py``) finds one that can run the
   installed toolkit: the driver reports a GPU, its CUDA version is at least the toolkit's
   (``gpu`` extra: CUDA 13, ``gpu-cu12``: CUDA 12), and a one-thread kernel compiles, runs and
   writes its answer. In every other case the simulator is switched on, and the reason names
   the install command that fixes it. This process never initialises CUDA itself, so it can
   still fork processes that use the GPU.

``BACKEND`` holds the choice, ``REASON`` says why in one line, ``banner()`` prints both.
``SIZES`` holds the model sizes the notebooks and tests use: ANDREA-120M on a GPU, a small
model of the same shape on the simulator.
"""

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass

BACKEND_VARIABLE = "ATTENTION_LIB_BACKEND"
GPU = "gpu"
SIMULATOR = "simulator"


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


# The GPU check (gpu_probe.py) runs in a child process; it imports Numba and compiles a kernel,
# a few seconds on a GPU machine. Past this it counts as failed.
PROBE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_probe.py")
PROBE_TIMEOUT_S = 120
# The oldest CUDA major version a toolkit extra of the course exists for.
OLDEST_CUDA = 12


def _find_driver():
    """The name of a CUDA driver library that loads here, or None. It is only loaded (no cuInit):
    loading leaves CUDA uninitialised, so this process can still fork CUDA-using children."""
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so"]
    found = ctypes.util.find_library("cuda")
    if found:
        names.append(found)
    for name in names:
        try:
            ctypes.CDLL(name)
            return name
        except OSError:
            continue
    return None


def _probe_gpu(driver):
    """Run gpu_probe.py on `driver` in a child process; returns its answers (a dict), or
    {"error": why} when the child failed or did not answer."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    try:
        done = subprocess.run([sys.executable, "-P", PROBE_SCRIPT, driver], env=env,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"driver": driver, "error": f"the GPU check did not finish in {PROBE_TIMEOUT_S} s"}
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"driver": driver, "error": f"the GPU check failed ({last})"}


def cuda_version(encoded):
    """'12.4' from the driver's 12040."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def install_command(driver_version):
    """The command that installs the toolkit matching a driver of `driver_version` (12040 = 12.4)."""
    extra = "gpu-cu12" if driver_version // 1000 == 12 else "gpu"
    return f'pip install -e ".[{extra}]" in the course folder, then restart Python'


def gpu_verdict(probe):
    """(usable, why) from gpu_probe's answers: why is one line, with the fix when there is one."""
    if probe.get("driver") is None:
        return False, "no CUDA driver (libcuda) is installed"
    if "error" in probe:
        return False, probe["error"]
    if "init" in probe:
        return False, f"the CUDA driver ({probe['driver']}) did not initialise ({probe['init']})"
    if not probe.get("devices"):
        return False, "the CUDA driver reports no GPU"
    version = probe["driver_version"]
    found = f"found {probe['name']} (sm_{probe['cc'][0]}{probe['cc'][1]}, driver for CUDA {cuda_version(version)})"
    if version // 1000 < OLDEST_CUDA:
        return False, (f"{found}, older than the CUDA {OLDEST_CUDA} the course's toolkits need: "
                       "update the NVIDIA driver")
    toolkit = probe.get("toolkit")
    if toolkit is None:
        return False, f"{found}, but numba-cuda's CUDA toolkit is missing: {install_command(version)}"
    if "launch" not in probe:                    # the probe saw a toolkit newer than the driver
        return False, (f"{found}, but the installed toolkit is CUDA {toolkit}, newer than the driver runs: "
                       f"{install_command(version)}")
    if probe["launch"] is not None:
        matching = toolkit.split(".")[0] == str(version // 1000)
        fix = (f"update the NVIDIA driver to one for CUDA {'.'.join(toolkit.split('.')[:2])} or newer"
               if matching else install_command(version))
        return False, f"{found}, but a one-thread test kernel failed ({probe['launch']}): {fix}"
    return True, f"{found}, toolkit CUDA {toolkit}; a test kernel ran"


def _choose():
    """Decide the backend; returns (backend, reason). Imports nothing from Numba, and leaves CUDA
    uninitialised in this process: the GPU is tried in a child (gpu_probe.py)."""
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
    if asked == "auto" and os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return SIMULATOR, "NUMBA_ENABLE_CUDASIM=1 is set"
    driver = _find_driver()
    usable, why = gpu_verdict(_probe_gpu(driver) if driver else {"driver": None})
    if asked == GPU:
        if not usable:
            raise RuntimeError(f"{BACKEND_VARIABLE}=gpu but {why}; unset it to use the simulator")
        return GPU, f"{BACKEND_VARIABLE}=gpu, {why}"
    return (GPU, why) if usable else (SIMULATOR, why)


def _activate(backend):
    """Tell Numba the choice, before (or, if Numba is loaded but not its CUDA module, as) it reads it."""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if backend == SIMULATOR else "0"
    if "numba" in sys.modules and "numba.cuda" not in sys.modules:
        from numba.core import config
        config.reload_config()


BACKEND, REASON = _choose()
_activate(BACKEND)
if BACKEND == SIMULATOR:
    from attention_lib.platform import simulator     # greenlets: only where the simulator runs
    simulator.install()
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
