"""Every notebook fits a 16 GB T4 (the usual hosted GPU) at the GPU sizes.

An estimate, not a measurement (no GPU here). Method: on a GPU the notebooks take their sizes
from ``attention_lib.SIZES`` = ANDREA-120M, and notebook 10 benches at
``bench.BenchSizes.of(ANDREA_120M)``. For each notebook, the table below lists the float32
device arrays alive together at its largest step (inputs copied to the device, intermediates,
outputs), with the shapes the library's launchers allocate, evaluated at those sizes. Notebook 10
counts every input of the bench as resident at once, plus the outputs of its largest entry (the
whole layer at batch 8). A CUDA context and Numba's loaded modules are counted as 1 GiB (a
T4's context takes a few hundred MiB). The total must stay under 15 GiB, what a T4 leaves free.
Drift guard: the bench's list of inputs must be the one counted here.
"""

import inspect
import math
import re
from pathlib import Path

import pytest

from attention_lib.measure import bench
from attention_lib.platform.runtime import ANDREA_120M
from attention_lib.stages import flash

FLOAT32 = 4
CONTEXT_BYTES = 1 << 30
T4_FREE_BYTES = 15 << 30
S = ANDREA_120M
H, T, D, DK, B = S.n_head, S.T, S.d_model, S.d_k, S.batch
CHUNKS = math.ceil(T / 32)                    # the decode kernel's chunks of 32 keys on a GPU


def layer(batch):
    """A whole multi-head layer on the device (launch_layer: heads read in place from the fused
    QKV, no split or merge copy): weights, input, the QKV, scores and weights, merged heads, out."""
    return [(D, 3 * D), (D, D), (batch, T, D), (batch * T, 3 * D), *[(batch * H, T, T)] * 2,
            (batch * T, D), (batch * T, D)]


NOTEBOOKS = {
    "00_gpu_basics": [(4096,)] * 3,                                   # the timed 4,096-element add
    "01_qkv_projection": [(T, D), (D, 3 * D), (T, 3 * D)],            # fused QKV: x @ [W_Q | W_K | W_V]
    "02_scaled_scores": [(H, T, DK)] * 2 + [(H, T, T)],               # all heads' scores in one launch
    "03_causal_mask": [(H, T, DK)] * 2 + [(H, T, T)] * 2,             # scores, then their masked copy
    "04_softmax": [(H, T, T)] * 2,                                    # scores in, weights out
    "05_weighted_values": [(H, T, DK)] * 4 + [(H, T, T)] * 2,         # q, k, v, out; scores, weights
    "06_multi_head": layer(1),                                        # one sequence through the layer
    "07_fused_attention": [(H, T, DK)] * 4 + [(H, T, T)] * 2,         # the unfused pipeline it compares
    "08_flashattention2": [(H, T, DK)] * 4 + [(H, T)],                # q, k, v, out and the log-sum-exp
    "09_kv_cache_decoding": [(H, T, DK)] * 2 + [(D, D)] * 4 + [(T, D), (H, CHUNKS), (H, CHUNKS, DK),
                                                                  (H, DK), (H,)],   # lse_part, o_part, out, lse
    # two sequences' heads: q, k, v, d_out, out and the three gradients, the log-sum-exp; counted as
    # if the naive backward's P, dP and dS (T x T each) were resident too
    "11_backward": [(2 * H, T, DK)] * 8 + [(2 * H, T)] + [(2 * H, T, T)] * 3,
}
BENCH = bench.BenchSizes.of(ANDREA_120M)
BENCH_INPUTS = {                              # bench.Inputs' makers and the shapes they make
    "x": (BENCH.B * BENCH.T, BENCH.d_model), "w": (BENCH.d_model, 3 * BENCH.d_model),
    "q": (BENCH.BH, BENCH.T, BENCH.d_k), "k": (BENCH.BH, BENCH.T, BENCH.d_k), "v": (BENCH.BH, BENCH.T, BENCH.d_k),
    "s": (BENCH.BH, BENCH.T, BENCH.T), "masked": (BENCH.BH, BENCH.T, BENCH.T), "a": (BENCH.BH, BENCH.T, BENCH.T),
    "x3": (0,),                               # a view of x: no memory of its own
    "w_o": (BENCH.d_model, BENCH.d_model), "w_q": (BENCH.d_model, BENCH.d_model),
    "w_k": (BENCH.d_model, BENCH.d_model), "w_v": (BENCH.d_model, BENCH.d_model),
    "q1": (BENCH.BH, BENCH.d_k),
}
NOTEBOOKS["10_performance"] = list(BENCH_INPUTS.values()) + layer(BENCH.B)


def device_bytes(shapes):
    return sum(math.prod(shape) for shape in shapes) * FLOAT32 + CONTEXT_BYTES


def test_every_notebook_is_counted():
    names = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert names == sorted(NOTEBOOKS)


def test_the_bench_inputs_counted_are_the_bench_inputs():
    # the names bench.Inputs._make knows, read from its `if name == ...` / `if name in (...)` tests
    source = inspect.getsource(bench.Inputs._make)
    made = {n for test in re.findall(r"if name (?:==|in) (.+?):", source) for n in re.findall(r'"(\w+)"', test)}
    assert made == set(BENCH_INPUTS), "bench.Inputs changed: count its new inputs here"
    assert BENCH == bench.BenchSizes(8, 12, 1024, 64)


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_fits_a_16_gb_t4_at_gpu_sizes(name):
    needed = device_bytes(NOTEBOOKS[name])
    assert needed < T4_FREE_BYTES, f"{name} needs about {needed / 2**30:.1f} GiB on the GPU"


def test_the_largest_is_the_bench_and_leaves_room():
    needed = {name: device_bytes(shapes) for name, shapes in NOTEBOOKS.items()}
    assert max(needed, key=needed.get) == "10_performance"
    assert needed["10_performance"] < T4_FREE_BYTES / 2        # room for a twice larger batch
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    quoted = f"needs about {needed['10_performance'] / 2**30:.1f} GiB"
    assert quoted in " ".join(readme.split()), f"the README should say the largest notebook {quoted}"


def test_the_fused_kernels_tiles_fit_a_t4_block():
    """sm_75: at most 48 KiB of static shared memory per block (64 KiB per SM)."""
    shared = (flash.BLOCK_Q_GPU + 2 * flash.BLOCK_K) * flash.MAX_D * FLOAT32
    assert shared <= 48 * 1024
