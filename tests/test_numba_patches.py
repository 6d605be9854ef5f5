"""The numba-cuda internals that attention_lib/platform/simulator.py and numba_patches.py replace are
still there, and still the ones numba-cuda uses: after an upgrade this file fails first, naming the
attribute."""

import os
import subprocess
import sys

import numpy as np
import pytest

from attention_lib.platform import numba_patches, runtime, simulator
from attention_lib.stages import softmax
from numba import cuda

UPGRADE = f"(checked with numba-cuda {numba_patches.CHECKED_WITH}; see attention_lib/platform/numba_patches.py)"


def test_every_internal_the_library_relies_on_is_there():
    assert numba_patches.missing_internals() == []


def test_a_missing_internal_is_named_in_one_line(monkeypatch):
    monkeypatch.setitem(numba_patches.PATCHED, "a patch", ("numba.cuda.simulator.kernel", "NoSuchThing.run"))
    lines = numba_patches.missing_internals()
    assert lines == [f"numba-cuda patch 'a patch' is off: numba.cuda.simulator.kernel.NoSuchThing.run is gone "
                     f"(AttributeError; checked with numba-cuda {numba_patches.CHECKED_WITH})"]


def test_simulator_thread_patches_still_apply():
    from numba.cuda.simulator import kernel, kernelapi
    from numba.cuda.simulator.cudadrv import devicearray
    simulator.install()
    theirs = {(owner, name): original for owner, name, original, *_ in simulator._originals}
    call = theirs.get((kernel.FakeCUDAKernel, "__call__"), kernel.FakeCUDAKernel.__call__)
    # A launch still runs each block through BlockManager.run, with the fields run_block reads.
    assert {"BlockManager", "run", "swapped_cuda_module", "_kernel_context"} <= set(call.__code__.co_names), \
        f"FakeCUDAKernel no longer runs blocks with BlockManager.run {UPGRADE}"
    assert {"_f", "_block_dim", "_debug", "block_state"} <= set(kernel.BlockManager.__init__.__code__.co_names), \
        f"BlockManager's fields changed {UPGRADE}"
    assert {"grid_dim", "block_dim", "dynshared_size", "fn"} <= set(kernel.FakeCUDAKernel.__init__.__code__.co_names), \
        f"FakeCUDAKernel's launch fields changed {UPGRADE}"
    # The kernel API still finds the running thread through threading.current_thread().
    assert "current_thread" in kernelapi.FakeCUDAModule.threadIdx.fget.__code__.co_names, \
        f"the simulator no longer asks threading.current_thread() for threadIdx {UPGRADE}"
    assert "_item" in devicearray.FakeWithinKernelCUDAArray.__init__.__code__.co_consts, \
        f"FakeWithinKernelCUDAArray no longer wraps _item {UPGRADE}"
    # Shared arrays are still kept per block in _allocations; device calls still counted per module.
    assert "_allocations" in kernelapi.FakeCUDAShared.__init__.__code__.co_names, \
        f"FakeCUDAShared no longer keeps its arrays in _allocations {UPGRADE}"
    assert "_swap_refcount" in kernelapi.swapped_cuda_module.__wrapped__.__code__.co_names, \
        f"swapped_cuda_module no longer counts its users in _swap_refcount {UPGRADE}"
    # numba-cuda's simulator still lacks the warp primitives the library adds (else compare them).
    for name in simulator.WARP_PRIMITIVES:
        assert theirs[kernelapi.FakeCUDAModule, name] is None, f"numba-cuda now has its own {name} {UPGRADE}"


@cuda.jit
def vote(out):
    t = cuda.threadIdx.x
    cuda.syncthreads()
    count = cuda.syncthreads_count(t % 2 == 0 and t < 5)
    every = cuda.syncthreads_and(t < 8)
    some = cuda.syncthreads_or(t == 3)
    if t < 5:
        out[cuda.blockIdx.x, t, 0], out[cuda.blockIdx.x, t, 1], out[cuda.blockIdx.x, t, 2] = count, every, some


@cuda.jit
def one_past_the_end(a):
    a[cuda.threadIdx.x + 3 * cuda.blockIdx.x] = 1.0


@cuda.jit
def sum_in_shared(x, out):
    partial = cuda.shared.array(8, np.float32)
    t = cuda.threadIdx.x
    partial[t] = x[cuda.blockIdx.x, t]
    cuda.syncthreads()
    if t == 0:
        total = 0.0
        for i in range(8):
            total += partial[i]
        out[cuda.blockIdx.x] = total


@cuda.jit
def waits_then_fails(x, out):
    # Threads 0-2 wait at block_sum's first barrier (in softmax's module) when thread 3 fails.
    partial = cuda.shared.array(32, np.float32)
    if cuda.threadIdx.x == 3:
        out[cuda.threadIdx.x] = 1.0
    out[0] = softmax.block_sum(partial, x[0, cuda.threadIdx.x])


def test_simulated_threads_keep_numbas_semantics():
    """Block votes combine every thread of the block, each block has its own shared array, and an
    error names its thread and block as numba-cuda's threads do."""
    if not runtime.ON_SIMULATOR:
        pytest.skip("the simulated threads only exist on the simulator")
    out = np.full((2, 5, 3), -1, np.int64)
    vote[2, 8](out)
    assert (out == [3, 1, 1]).all()
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    sums = np.zeros(3, np.float32)
    sum_in_shared[3, 8](x, sums)
    np.testing.assert_allclose(sums, x.sum(axis=1), rtol=1e-5)
    with pytest.raises(IndexError, match=r"tid=\[1, 0, 0\] ctaid=\[1, 0, 0\]"):
        one_past_the_end[2, 3](np.zeros(4))


def test_every_module_gets_its_cuda_back_after_a_launch_that_fails_at_a_barrier():
    """A block stopped by an error still has threads waiting at a barrier inside device functions
    of other modules; the simulator must hand those modules their real `cuda` back."""
    if not runtime.ON_SIMULATOR:
        pytest.skip("the simulated threads only exist on the simulator")
    import sys
    import attention_lib
    from numba.cuda.simulator import kernelapi
    attention_lib.softmax(np.ones((3, 40), np.float32), version=2)     # device functions with barriers
    with pytest.raises(IndexError):
        waits_then_fails[1, 4](np.zeros((1, 4), np.float32), np.zeros(3, np.float32))
    fake = [name for name, module in sys.modules.items()
            if name.startswith(("attention_lib", "test")) and isinstance(getattr(module, "cuda", None),
                                                                          kernelapi.FakeCUDAModule)]
    assert not fake and not kernelapi._swap_refcount


def test_compile_target_patch_still_applies():
    """In a process with the simulator off, as the compile check and the kernel report run."""
    module_name, attribute = numba_patches.PATCHED["compile_for"]
    program = (
        "import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '0'\n"
        "from numba import cuda\n"
        "from numba.cuda import dispatcher\n"
        f"assert hasattr(dispatcher, {attribute!r}), 'gone'\n"
        "uses = [f for f in vars(dispatcher.CUDADispatcher).values()\n"
        f"        if {attribute!r} in getattr(getattr(f, '__code__', None), 'co_names', ())]\n"
        "assert uses, 'unused'\n"
        "from attention_lib.platform.numba_patches import compile_for\n"
        "compile_for((8, 0))\n"
        f"assert dispatcher.{attribute}().compute_capability == (8, 0), 'not replaced'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_LIB_BACKEND"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (f"{module_name}.{attribute}: {done.stderr.strip().splitlines()[-1]} "
                                  f"{UPGRADE}")


def test_internals_patched_elsewhere_still_exist():
    from numba.cuda.simulator import kernel
    from numba.cuda.simulator.cudadrv import devicearray
    # What the sanitizer and kernel_cases read on the simulator's objects.
    assert "_ary" in devicearray.FakeCUDAArray.__init__.__code__.co_names, f"FakeCUDAArray._ary {UPGRADE}"
    assert "_device" in kernel.FakeCUDAKernel.__init__.__code__.co_names, f"FakeCUDAKernel._device {UPGRADE}"


def test_greenlets_and_numbas_own_threads_give_the_same_results():
    """The library's tiled kernels (barriers, shared memory, device functions in other modules)
    under both schedulers: the same numbers, to the bit."""
    if not runtime.ON_SIMULATOR:
        pytest.skip("the simulated threads only exist on the simulator")
    import attention_lib
    rng = np.random.default_rng(7)
    x, w = rng.standard_normal((19, 21)).astype(np.float32), rng.standard_normal((21, 17)).astype(np.float32)
    s = rng.standard_normal((5, 11)).astype(np.float32)
    q, k, v = (rng.standard_normal((2, 9, 5)).astype(np.float32) for _ in range(3))
    runs = [lambda: attention_lib.project(x, w, version=2), lambda: attention_lib.softmax(s, version=2),
            lambda: attention_lib.flash_attention(q, k, v, version=2)]
    ours = [run() for run in runs]
    with simulator.numba_cuda_threads(keep_shortcuts=True):    # race-free shared arrays
        theirs = [run() for run in runs]
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_numba_cudas_own_threads_get_one_shared_array_per_block_from_the_library_lookup(monkeypatch):
    """Eight operating-system threads declare the same shared array at once while creating it is
    slow: the library's lookup (kept under numba_cuda_threads(keep_shortcuts=True)) must hand
    them all the same array; numba-cuda's unlocked get-then-store handed out one each."""
    import threading
    import time
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    real_empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.01)                     # every thread reaches the lookup before any stores
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(np, "empty", slow_empty)
    shared, got = FakeCUDAShared(0), []

    def declare():
        got.append(simulator._shared_array(shared, 4, np.float32))   # one declaring line

    threads = [threading.Thread(target=declare) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and len({id(a) for a in got}) == 1
