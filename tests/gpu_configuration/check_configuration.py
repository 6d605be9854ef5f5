"""The process is configured as on a GPU machine, and the stage launchers run there at GPU block
sizes with the GPU's kernel versions, against the float64 reference at tiny awkward sizes."""

import numba
import numpy as np
from attention_lib import reference
from attention_lib.platform import runtime
from attention_lib.stages import attention, flash, kv_cache, multihead, projection, softmax
from numba import cuda


def close(got, want):
    return np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_process_is_configured_as_on_a_gpu():
    assert not numba.config.ENABLE_CUDASIM and runtime.BACKEND == runtime.GPU
    assert not runtime.ON_SIMULATOR and not runtime.SIMULATOR_SHAPES
    assert type(flash.flash_attention_kernel_v3).__name__ == "CUDADispatcher"
    assert flash.DEFAULT_VERSION == 3 and flash.BLOCK_Q == flash.BLOCK_Q_GPU == 32
    assert softmax.THREADS_PER_ROW == 128 and kv_cache.KEYS_PER_CHUNK == 32
    assert attention.SOFTMAX_VERSION == 2
    assert kv_cache.PROJECTION_VERSION == multihead.PROJECTION_VERSION == projection.layer_version() == 4
    assert flash.flash_attention_kernel_v3.targetoptions["launch_bounds"] == (flash.THREADS_V3, 4)


def test_flash_at_its_gpu_defaults(rng=np.random.default_rng(16)):
    # v3 (the GPU's default) and v2 at BLOCK_Q 32: T 33 is one full block and one of one query.
    q, k, v = rng.standard_normal((3, 1, 2, 33, 7))
    for version in (2, 3):
        for causal in (True, False):
            assert close(flash.flash_attention(q, k, v, causal, version=version), reference.attention(q, k, v, causal))


def test_the_grouped_kernel_raises_its_limit_and_launches():
    """4 query heads on one K/V head, T 40: 160 rows, three slices of v3's grouped kernel, 97 KB of
    dynamic shared memory, past the 48 KB a launch gets until dynamic_shared raises the limit."""
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((4, 40, 64)), rng.standard_normal((1, 40, 64)), rng.standard_normal((1, 40, 64))
    kernel, nbytes = flash.fused_kernel(3, 40, 4, 64), 4 * flash.v3_shared_words(64, flash.v3_slices(40, 4))
    assert flash.is_grouped(kernel) and flash.v3_slices(40, 4) == 3 and nbytes > 48 * 1024
    want = reference.attention(q, np.repeat(k, 4, axis=0), np.repeat(v, 4, axis=0))
    assert close(flash.flash_attention(q, k, v, version=3), want)
    assert kernel.__dict__["_stand_in_limit"] == nbytes


def test_the_other_launchers_at_gpu_shapes():
    rng = np.random.default_rng(17)
    for width in (1, 19, 130):                       # softmax v2, 128 threads a row
        s = rng.standard_normal((3, width))
        assert close(softmax.softmax(s, version=2), reference.softmax(s)), ("softmax", width)
    q, k, v = rng.standard_normal((2, 7, 5)), rng.standard_normal((2, 19, 5)), rng.standard_normal((2, 19, 5))
    assert close(attention.attention(q, k, v, causal=True), reference.attention(q, k, v, causal=True))
    x, w = rng.standard_normal((1, 19, 6)), rng.standard_normal((4, 6, 6)) / np.sqrt(6)
    assert close(multihead.multi_head_attention(x, *w, 2), reference.multi_head_attention(x, *w, 2))
    cache = kv_cache.KVCache(2, 70, 5)               # 70 positions: a chunk of 32, another, and 6
    keys, values = rng.standard_normal((2, 2, 70, 5))
    cache.append(keys, values)
    q = rng.standard_normal((2, 5))
    assert close(kv_cache.decode_step(q, cache), reference.attention(q[:, None], keys, values, causal=False)[:, 0])


def test_device_arrays_and_events_are_the_stand_ins():
    d = cuda.to_device(np.arange(4, dtype=np.float32))
    assert d.copy_to_host().tolist() == [0, 1, 2, 3]
    begin, end = cuda.event(), cuda.event()
    begin.record()
    end.record()
    end.synchronize()
    assert begin.elapsed_time(end) > 0
