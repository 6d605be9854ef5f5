"""The GPU configuration's numbers, executed: with ATTENTION_LIB_SHAPES=gpu the stage modules
take the block sizes and kernel versions a GPU uses, and the launchers that depend on them still
match the float64 reference, at tiny awkward sizes on the simulator (in a subprocess, since the
constants are fixed when the modules are imported)."""

import os
import subprocess
import sys
import textwrap

from attention_lib.platform import runtime

PROGRAM = """
import numpy as np
from attention_lib import reference
from attention_lib.platform import runtime
from attention_lib.stages import attention, flash, kv_cache, multihead, projection, softmax

assert runtime.ON_SIMULATOR and not runtime.SIMULATOR_SHAPES
# The GPU values, as the stage modules write them.
assert flash.BLOCK_Q == flash.BLOCK_Q_GPU == 32, flash.BLOCK_Q
assert softmax.THREADS_PER_ROW == 128, softmax.THREADS_PER_ROW
assert kv_cache.KEYS_PER_CHUNK == 32, kv_cache.KEYS_PER_CHUNK
assert attention.SOFTMAX_VERSION == 2
assert kv_cache.PROJECTION_VERSION == multihead.PROJECTION_VERSION == projection.layer_version() == 4

rng = np.random.default_rng(16)
close = lambda got, want: np.allclose(got, want, rtol=1e-5, atol=1e-5)

# Flash v2 at BLOCK_Q 32: T 33 is one full query block and one of a single query.
q, k, v = rng.standard_normal((3, 1, 2, 33, 7))
for causal in (True, False):
    got = flash.flash_attention(q, k, v, causal, version=2)
    assert close(got, reference.attention(q, k, v, causal)), ("flash", causal)

# Softmax v2 with 128 threads a row: rows of 1, 19 and 130 (more than one score per thread).
for width in (1, 19, 130):
    s = rng.standard_normal((3, width))
    assert close(softmax.softmax(s, version=2), reference.softmax(s)), ("softmax", width)

# The unfused pipeline with softmax v2, T_q 7 against T_k 19.
q, k, v = rng.standard_normal((2, 7, 5)), rng.standard_normal((2, 19, 5)), rng.standard_normal((2, 19, 5))
assert close(attention.attention(q, k, v, causal=True), reference.attention(q, k, v, causal=True)), "pipeline"

# A whole layer with projection v4: B 1, T 19, d_model 6, 2 heads.
x = rng.standard_normal((1, 19, 6))
w = rng.standard_normal((4, 6, 6)) / np.sqrt(6)
assert close(multihead.multi_head_attention(x, *w, 2), reference.multi_head_attention(x, *w, 2)), "layer"

# Decoding with 64 keys a chunk: 70 cached positions are one full chunk and one of 6.
cache = kv_cache.KVCache(2, 70, 5)
keys, values = rng.standard_normal((2, 2, 70, 5))
cache.append(keys, values)
q = rng.standard_normal((2, 5))
want = reference.attention(q[:, None], keys, values, causal=False)[:, 0]
assert close(kv_cache.decode_step(q, cache), want), "decode"
print("GPU shapes ran")
"""


def test_gpu_configuration_runs_on_the_simulator():
    env = dict(os.environ, **{runtime.SHAPES_VARIABLE: "gpu", runtime.BACKEND_VARIABLE: runtime.SIMULATOR})
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(PROGRAM)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU shapes ran" in done.stdout


def test_a_wrong_shapes_value_is_refused():
    env = dict(os.environ, **{runtime.SHAPES_VARIABLE: "big", runtime.BACKEND_VARIABLE: runtime.SIMULATOR})
    done = subprocess.run([sys.executable, "-c", "import attention_lib"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ATTENTION_LIB_SHAPES must be 'auto' or 'gpu', got 'big'" in done.stderr.strip().splitlines()[-1]
