"""Dynamic shared memory: shared_rows' views, the launch, and the numba-cuda internals that
raising a kernel's limit past 48 KB relies on (checked with the real CUDA target imported, no GPU)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import attention_lib
import numpy as np
import pytest
from attention_lib.platform import dynamic_shared
from numba import cuda


def test_shared_rows_is_a_view_of_the_buffer_from_start_on():
    words = np.arange(20, dtype=np.float32)
    tile = dynamic_shared.shared_rows.simulator_version(words, 6, 3, 4)    # what the simulator runs
    assert tile.shape == (3, 4) and tile[2, 1] == 6 + 2 * 4 + 1
    tile[1, 3] = -1.0                                     # what one thread writes, another reads
    assert words[6 + 1 * 4 + 3] == -1.0


class Recorder:
    def __getitem__(self, config):
        self.config = config
        return lambda *args: setattr(self, "args", args)


def test_launch_passes_the_dynamic_bytes_in_the_launch_configuration():
    recorder = Recorder()
    dynamic_shared.launch(recorder, (3, 2), (128, 4), 132_224, "a", 1)
    assert recorder.config == ((3, 2), (128, 4), 0, 132_224) and recorder.args == ("a", 1)


def test_the_block_limit_is_an_h200s_on_the_simulator():
    # 227 KB: the opt-in limit of compute capability 9.0 (CUDA programming guide, table of limits);
    # on a GPU the device's own, above the 48 KB every kernel has.
    if dynamic_shared.ON_SIMULATOR:
        assert dynamic_shared.largest_block_bytes() == 232_448
    else:
        assert dynamic_shared.largest_block_bytes() > dynamic_shared.DEFAULT_LIMIT


CHECK_INTERNALS = textwrap.dedent("""
    import inspect
    import numba.cuda.cudadrv.driver as driver_module
    from numba.cuda import codegen, dispatcher
    from attention_lib.platform import dynamic_shared
    from numba.cuda.cudadrv.driver import CudaPythonFunction, binding
    assert not dynamic_shared.ON_SIMULATOR
    assert dynamic_shared.shared_rows.simulator_version is dynamic_shared._shared_rows_numpy

    # The names the limit's driver call goes through, as numba-cuda 0.30's own carveout setter uses them.
    assert "handle" in CudaPythonFunction.__slots__
    assert "driver.cuKernelSetAttribute(" in inspect.getsource(CudaPythonFunction.set_shared_memory_carveout)
    assert hasattr(binding, "cuKernelSetAttribute")
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    assert hasattr(codegen.CUDACodeLibrary, "get_cufunc")
    assert "self._codelibrary" in inspect.getsource(dispatcher._Kernel.__init__)
    assert hasattr(dispatcher.CUDADispatcher, "specialize")

    # _raise_limit on stand-ins: one driver call per compiled function, with its handle and device.
    class Function:
        handle, device = "handle-7", type("Device", (), {"id": 2})()
    class Compiled:
        _codelibrary = type("Library", (), {"get_cufunc": lambda self: Function()})()
    class Kernel:
        targetoptions = {}                            # a compiled kernel's, not the simulator's
        def specialize(self, *args):
            self.args = args
            return type("Specialized", (), {"overloads": {"sig": Compiled()}})()
    calls = []
    driver_module.driver = type("Driver", (), {"cuKernelSetAttribute": lambda self, *a: calls.append(a)})()
    kernel = Kernel()
    dynamic_shared._raise_limit(kernel, (1, 2), 100_000)
    assert kernel.args == (1, 2) and calls == [(attribute, 100_000, "handle-7", 2)], calls
    print("ok")
""")


def test_numba_cudas_internals_for_raising_the_limit_are_there():
    env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", CHECK_INTERNALS], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@cuda.jit
def first_word(out):
    words = cuda.shared.array(0, np.float32)
    words[cuda.threadIdx.x] = cuda.threadIdx.x
    out[cuda.threadIdx.x] = words[cuda.threadIdx.x]


def test_the_simulator_refuses_more_than_48_kb_until_the_limit_is_raised():
    """As a GPU does: past DEFAULT_LIMIT a launch needs the kernel's limit raised first, which
    dynamic_shared.launch does on both backends."""
    if not attention_lib.ON_SIMULATOR:
        pytest.skip("the simulator's own check; a GPU refuses such a launch itself")
    out = np.zeros(4, np.float32)
    nbytes = dynamic_shared.DEFAULT_LIMIT + 4
    with pytest.raises(ValueError, match=r"first_word: 49,156 bytes of dynamic shared memory, more than the "
                                         r"kernel's limit of 49,152"):
        first_word[1, 4, 0, nbytes](out)
    dynamic_shared.launch(first_word, 1, 4, nbytes, out)
    assert out.tolist() == [0, 1, 2, 3]
