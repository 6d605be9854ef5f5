"""Notebook 01 and its deep dive 01x: the projection kernels against NumPy, their memory reads
counted, fused QKV, batched input, bad inputs (the exercises' planted mistakes: test_exercises_01)."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.stages import projection
from attention_lib.platform.launch import ceil_div
from numba import cuda

TILE = projection.TILE
# (T, d_model, d_out): one row; a few rows, neither width a multiple of the 16-wide tile;
# T 33 = two full tiles and one row more, d_out 17 = one tile and one column more.
AWKWARD = [(1, 5, 3), (7, 24, 20), (33, 24, 17)]


def tolerance(d_model):
    """float32 kernel vs float64 reference: each output sums d_model products, and rounding
    errors of a sum of K terms grow like sqrt(K) times float32's 1e-7; 1e-5 * sqrt(K) leaves room."""
    return 1e-5 * np.sqrt(d_model)


def random_problem(rng, T, d_model, d_out, lead=()):
    x = rng.standard_normal((*lead, T, d_model)).astype(np.float32)
    w = rng.standard_normal((d_model, d_out)).astype(np.float32)
    b = rng.standard_normal(d_out).astype(np.float32)
    return x, w, b


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("T, d_model, d_out", AWKWARD)
@pytest.mark.parametrize("with_bias", [False, True])
def test_project_matches_reference(rng, version, T, d_model, d_out, with_bias):
    x, w, b = random_problem(rng, T, d_model, d_out)
    b = b if with_bias else None
    got = projection.project(x, w, b, version=version)
    assert got.dtype == np.float32 and got.shape == (T, d_out)
    tol = tolerance(d_model)
    assert np.allclose(got, reference.project(x, w, b), rtol=tol, atol=tol)


@pytest.mark.parametrize("version", [1, 2])
def test_batched_input_keeps_its_leading_axes(rng, version):
    # (B, H, T, d_model): two leading axes, flattened into 2 * 3 * 5 = 30 rows by the launcher.
    x, w, b = random_problem(rng, 5, 6, 7, lead=(2, 3))
    got = projection.project(x, w, b, version=version)
    assert got.shape == (2, 3, 5, 7)
    assert np.allclose(got, reference.project(x, w, b), rtol=tolerance(6), atol=tolerance(6))
    # each sequence of the batch on its own gives the same rows
    assert np.allclose(got[1, 2], projection.project(x[1, 2], w, b, version=version), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_qkv_equals_three_separate_projections(rng, with_bias):
    B, T, d_model = 2, 7, 12
    x = rng.standard_normal((B, T, d_model)).astype(np.float32)
    w_q, w_k, w_v = rng.standard_normal((3, d_model, d_model)).astype(np.float32)
    b_q, b_k, b_v = rng.standard_normal((3, d_model)).astype(np.float32)
    w_qkv = np.concatenate([w_q, w_k, w_v], axis=1)            # (d_model, 3 * d_model), as c_attn
    b_qkv = np.concatenate([b_q, b_k, b_v]) if with_bias else None
    q, k, v = projection.project_qkv(x, w_qkv, b_qkv)
    for got, w, b in [(q, w_q, b_q), (k, w_k, b_k), (v, w_v, b_v)]:
        b = b if with_bias else None
        assert got.shape == (B, T, d_model)
        # the same kernel computes the same sums in the same order: equal to the last bit
        assert np.array_equal(got, projection.project(x, w, b))
        assert np.allclose(got, reference.project(x, w, b), rtol=tolerance(d_model), atol=tolerance(d_model))


@pytest.mark.parametrize("T, d_model, d_out", [(33, 24, 17), (16, 16, 16), (5, 40, 33)])
def test_global_reads_per_element_are_exact(rng, T, d_model, d_out):
    from attention_lib.measure import sanitizer
    x, w, b = random_problem(rng, T, d_model, d_out)
    grid, block = projection.projection_grid(T, d_out)
    expected = {1: (d_out, T), 2: (ceil_div(d_out, TILE), ceil_div(T, TILE))}
    for version, (x_reads, w_reads) in expected.items():
        assert projection.global_reads(T, d_out, version) == (x_reads, w_reads)
        out = np.full((T, d_out), np.nan, np.float32)
        report = sanitizer.count_memory(projection.KERNELS[version], grid, block, x, w, b, out)
        assert np.all(report.loads("x") == x_reads), version
        assert np.all(report.loads("w") == w_reads), version
        assert np.all(report.loads("b") == T), version            # once per output row
        assert np.all(report.stores("out") == 1) and report.loads("out").sum() == 0, version
        assert np.allclose(out, reference.project(x, w, b), rtol=tolerance(d_model), atol=tolerance(d_model))


def test_cost_formulas_at_full_size():
    # ANDREA-120M's fused QKV: T 1024, d_model 768, d_out 3 * 768
    assert projection.flops(1024, 768, 2304) == 3_623_878_656
    assert projection.global_reads(1024, 2304, 1) == (2304, 1024)
    assert projection.global_reads(1024, 2304, 2) == (144, 64)
    with pytest.raises(ValueError, match=r"^version must be 1, 2, 3 or 4, got 0$"):
        projection.global_reads(1024, 2304, 0)


def test_without_bias_nothing_is_read_for_it(rng):
    from attention_lib.measure import sanitizer
    x, w, _ = random_problem(rng, 3, 4, 5)
    grid, block = projection.projection_grid(3, 5)
    report = sanitizer.count_memory(projection.projection_kernel_v2, grid, block, x, w,
                                    np.zeros(0, np.float32), np.zeros((3, 5), np.float32))
    assert report.loads("b").size == 0
    assert report.total("loads") == 3 * 4 + 4 * 5     # x and w once each: one tile covers both


def test_the_grid_has_one_thread_per_output_and_partly_used_edge_blocks():
    grid, block = projection.projection_grid(33, 17)
    assert block == (TILE, TILE)
    assert grid == (2, 3)            # x: ceil(17 / 16) blocks across d_out, y: ceil(33 / 16) down T


@pytest.mark.parametrize("call, error, message", [
    (lambda x, w, b: projection.project(x[0, 0], w), ValueError,
     r"^x must have shape \(\.\.\., T, d_model\) \(at least 2 axes\), got shape \(4,\)$"),
    (lambda x, w, b: projection.project(x, w[0]), ValueError,
     r"^w must have shape \(d_model, d_out\) \(2 axes\), got shape \(5,\)$"),
    (lambda x, w, b: projection.project(x, w.T), ValueError,
     r"^w must have shape \(4, d_out\) \(d_model = the last axis of x\), got \(5, 4\)$"),
    (lambda x, w, b: projection.project(x, w, b[:3]), ValueError,
     r"^b must have shape \(5,\) \(the last axis of w\), got \(3,\)$"),
    (lambda x, w, b: projection.project(x, w, version=5), ValueError,
     r"^version must be 1, 2, 3 or 4, got 5$"),
    (lambda x, w, b: projection.project(x * 1j, w), TypeError,
     r"^x must be a float array of shape \(\.\.\., T, d_model\), got dtype complex64$"),
    (lambda x, w, b: projection.project(np.where(x > 0, np.nan, x), w), ValueError,
     r"^x contains nan at index \(\d+, \d+, \d+\); it must be finite$"),
    (lambda x, w, b: projection.project_qkv(x, w), ValueError,
     r"^w_qkv must have shape \(4, 3 \* d\) \(\[W_Q \| W_K \| W_V\], d_model = the last axis of x\), "
     r"got \(4, 5\)$"),
    (lambda x, w, b: projection.project_qkv(x, np.zeros((4, 6)), b), ValueError,
     r"^b_qkv must have shape \(6,\) \(the last axis of w_qkv\), got \(5,\)$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(rng, call, error, message):
    x, w, b = random_problem(rng, 3, 4, 5, lead=(2,))
    with pytest.raises(error, match=message):
        call(x, w, b)


def test_the_simulator_refuses_a_full_size_projection(monkeypatch):
    from attention_lib.platform import launch
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    monkeypatch.delenv(launch.ALLOW_SLOW_VARIABLE, raising=False)
    # ANDREA-120M's fused QKV: 1024 x 2304 outputs, far beyond the simulator's budget. The
    # check runs before anything is copied, so zeros of the right shape are enough.
    with pytest.raises(ValueError, match=r"^project: 2,359,296 CUDA threads would take about"):
        projection.project(np.zeros((1024, 768), np.float32), np.zeros((768, 2304), np.float32))


# --- projection_kernel_v3 (deep dive 01x): 2 x 2 outputs per thread ---------------------------

WIDE = projection.WIDE_TILE


@pytest.mark.parametrize("T, d_model, d_out", AWKWARD + [(33, 40, 65)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_v3_matches_reference(rng, T, d_model, d_out, with_bias):
    # (33, 40, 65): two blocks down and three across, the last ones partly used, three steps along d_model.
    x, w, b = random_problem(rng, T, d_model, d_out)
    b = b if with_bias else None
    got = projection.project(x, w, b, version=3)
    assert got.dtype == np.float32 and got.shape == (T, d_out)
    tol = tolerance(d_model)
    assert np.allclose(got, reference.project(x, w, b), rtol=tol, atol=tol)


def test_v3_batched_and_fused_qkv(rng):
    x, w, b = random_problem(rng, 5, 6, 9, lead=(2, 3))          # 30 rows after flattening
    got = projection.project(x, w, b, version=3)
    assert got.shape == (2, 3, 5, 9)
    assert np.allclose(got, reference.project(x, w, b), rtol=tolerance(6), atol=tolerance(6))
    q, k, v = projection.project_qkv(x, np.concatenate([w, w, w], axis=1), version=3)
    assert np.allclose(q, reference.project(x, w), rtol=tolerance(6), atol=tolerance(6))
    assert np.array_equal(q, v) and np.array_equal(k, v)          # same sums, same order


def test_v3_grid_covers_32_by_32_outputs_per_block():
    grid, block = projection.projection_grid_v3(33, 17)
    assert block == (TILE, TILE) and WIDE == 32
    assert grid == (1, 2)            # ceil(17 / 32) across, ceil(33 / 32) down: a quarter of v2's 6 blocks


@pytest.mark.parametrize("T, d_model, d_out", [(33, 24, 17), (32, 16, 32), (5, 40, 70)])
def test_v3_global_and_shared_reads_are_exact(rng, T, d_model, d_out):
    from attention_lib.measure import sanitizer
    x, w, b = random_problem(rng, T, d_model, d_out)
    x_reads, w_reads = ceil_div(d_out, WIDE), ceil_div(T, WIDE)
    assert projection.global_reads(T, d_out, 3) == (x_reads, w_reads)
    out = np.full((T, d_out), np.nan, np.float32)
    grid, block = projection.projection_grid_v3(T, d_out)
    report = sanitizer.count_memory(projection.projection_kernel_v3, grid, block, x, w, b, out)
    assert np.all(report.loads("x") == x_reads) and np.all(report.loads("w") == w_reads)
    assert np.all(report.loads("b") == T) and np.all(report.stores("out") == 1)
    assert np.allclose(out, reference.project(x, w, b), rtol=tolerance(d_model), atol=tolerance(d_model))
    # Shared memory: each thread reads 4 numbers per k for its 4 multiply-adds: one load per
    # multiply-add (v2: two), counted over every thread, padding included.
    steps = ceil_div(d_model, TILE)
    assert report.total("loads", space="shared") == report.threads * steps * TILE * 4
    madds = report.threads * steps * TILE * projection.MICRO ** 2
    assert report.total("loads", space="shared") / madds == 1.0


def test_v2_needs_two_shared_loads_per_multiply_add(rng):
    from attention_lib.measure import sanitizer
    x, w, b = random_problem(rng, 33, 24, 17)
    grid, block = projection.projection_grid(33, 17)
    report = sanitizer.count_memory(projection.projection_kernel_v2, grid, block, x, w, b,
                                    np.zeros((33, 17), np.float32))
    madds = report.threads * ceil_div(24, TILE) * TILE
    assert report.total("loads", space="shared") / madds == 2.0


def test_v3_cost_at_full_size():
    # ANDREA-120M's fused QKV: each x element read ceil(2304 / 32) = 72 times, each W_qkv element
    # ceil(1024 / 32) = 32 times: half of v2's (144, 64).
    assert projection.global_reads(1024, 2304, 3) == (72, 32)



# --- projection_kernel_v4: 128 x 128 per block, 8 x 8 outputs per thread, double-buffered ----

BIG = projection.BIG_TILE


# Sizes around the 128-wide block: one row; 7 rows and a partial step of 8 along d_model;
# 33 rows and d_out 130 (two blocks across, the second with 2 columns); 129 and 130 rows (two
# blocks down, the second with 1 or 2 rows). Kept to one step or a few along d_model: the
# simulator runs each of the 256 threads' 64 multiply-adds per k in Python (a few s per block).
@pytest.mark.parametrize("T, d_model, d_out, with_bias", [
    (1, 5, 3, False), (7, 11, 20, True), (33, 17, 130, True), (129, 3, 7, False), (130, 8, 129, True)])
def test_v4_matches_reference(rng, T, d_model, d_out, with_bias):
    x, w, b = random_problem(rng, T, d_model, d_out)
    b = b if with_bias else None
    got = projection.project(x, w, b, version=4)
    assert got.dtype == np.float32 and got.shape == (T, d_out)
    tol = tolerance(d_model)
    assert np.allclose(got, reference.project(x, w, b), rtol=tol, atol=tol)


def test_v4_grid_covers_128_by_128_outputs_per_block():
    grid, block = projection.projection_grid_v4(130, 129)
    assert block == (projection.THREADS_V4,) == (256,) and BIG == 128
    assert grid == (2, 2)            # ceil(129 / 128) across, ceil(130 / 128) down
    assert projection.projection_grid_of(4, 130, 129) == (grid, block)


def test_v4_global_and_shared_reads_are_exact(rng):
    from attention_lib.measure import sanitizer
    T, d_model, d_out = 7, 11, 130               # two blocks across, two steps (the second partial)
    x, w, b = random_problem(rng, T, d_model, d_out)
    x_reads, w_reads = ceil_div(d_out, BIG), ceil_div(T, BIG)
    assert projection.global_reads(T, d_out, 4) == (x_reads, w_reads) == (2, 1)
    out = np.full((T, d_out), np.nan, np.float32)
    grid, block = projection.projection_grid_v4(T, d_out)
    report = sanitizer.count_memory(projection.projection_kernel_v4, grid, block, x, w, b, out)
    assert np.all(report.loads("x") == x_reads) and np.all(report.loads("w") == w_reads)
    assert np.all(report.loads("b") == T) and np.all(report.stores("out") == 1)
    assert np.allclose(out, reference.project(x, w, b), rtol=tolerance(d_model), atol=tolerance(d_model))
    # Shared memory: per k a thread reads 8 + 8 numbers for its 64 multiply-adds: a quarter of
    # a load per multiply-add (v3: one, v2: two); each thread stores 4 + 4 numbers per step.
    steps = ceil_div(d_model, projection.BIG_STEP)
    madds = report.threads * steps * projection.BIG_STEP * projection.MICRO_V4 ** 2
    assert report.total("loads", space="shared") / madds == 0.25
    assert report.total("stores", space="shared") == report.threads * steps * 2 * projection.LOADS_V4


class IndexRecorder:
    """Stands in for a shared array: records the flat offset of every element read or written,
    for the shape it is given (the layout of the kernel's real shared array)."""

    def __init__(self, shape):
        self.shape, self.offsets = shape, []

    def _offset(self, index):
        return int(np.ravel_multi_index(tuple(int(i) for i in index), self.shape))

    def __getitem__(self, index):
        self.offsets.append(self._offset(index))
        return np.float32(0.0)

    def __setitem__(self, index, value):
        self.offsets.append(self._offset(index))


def banks(offsets):
    """The shared-memory bank of each 4-byte word: 32 banks, word i in bank i % 32."""
    return [o % 32 for o in offsets]


def store_offsets(width, tids):
    """Per store instruction of store_tiles, the offsets into xs (width `width`) of `tids`."""
    xs_shape = (2, projection.BIG_STEP, width)
    per_thread = []
    for tid in tids:
        xs, ws = IndexRecorder(xs_shape), IndexRecorder((2, projection.BIG_STEP, BIG))
        regs = np.zeros(projection.LOADS_V4, np.float32)
        projection.store_tiles.py_func(xs, ws, np.uint32(0), np.uint32(tid), regs, regs)
        per_thread.append((xs.offsets, ws.offsets))
    return per_thread


@pytest.mark.parametrize("warp", [0, 5])
def test_v4_tile_stores_hit_32_banks_per_warp(warp):
    # Address arithmetic of the kernel's own store_tiles, for the 32 threads of one warp.
    tids = range(32 * warp, 32 * warp + 32)
    padded, unpadded = store_offsets(projection.XS_WIDTH, tids), store_offsets(BIG, tids)
    for i in range(projection.LOADS_V4):       # the i-th store of every thread: one instruction
        assert len(set(banks(t[0][i] for t in padded))) == 32       # x^T: conflict-free with X_PAD
        assert len(set(banks(t[1][i] for t in padded))) == 32       # w: conflict-free
        # without the padding the 32 stores of x^T fall into 4 banks: an 8-way conflict
        assert len(set(banks(t[0][i] for t in unpadded))) == 4


def test_v4_fragments_are_aligned_16_byte_loads_without_conflict():
    # A 16-byte load is served a quarter-warp (8 threads) at a time; it is conflict-free when
    # those 8 threads read 8 different 16-byte pieces covering all 32 banks, or the same piece.
    width = projection.XS_WIDTH
    assert (width * 4) % 16 == 0               # every row of x^T starts 16-byte aligned
    for which, first in (("x", lambda tid: tid // 16 * 4), ("w", lambda tid: tid % 16 * 4)):
        for quarter in range(4):
            pieces = []
            for tid in range(8 * quarter, 8 * quarter + 8):
                tile = IndexRecorder((2, projection.BIG_STEP, width))
                frag = np.zeros(projection.MICRO_V4, np.float32)
                projection.load_fragment.py_func(tile, np.uint32(1), np.uint32(3),
                                                 np.uint32(first(tid)), frag)
                offs = tile.offsets                # frag[i] and frag[4 + i], i = 0..3
                lo, hi = sorted(offs[0::2]), sorted(offs[1::2])
                assert lo == list(range(lo[0], lo[0] + 4)) and lo[0] % 4 == 0, which
                assert hi[0] - lo[0] == 64 and hi == list(range(hi[0], hi[0] + 4)), which
                pieces.append(lo[0])
            if which == "x":                       # one row of the thread square: a broadcast
                assert len(set(pieces)) == 1
            else:
                assert sorted(set(banks(p + c for p in pieces for c in range(4)))) == list(range(32))


def test_v4_cost_at_full_size():
    # ANDREA-120M's fused QKV: each x element read ceil(2304 / 128) = 18 times, each W_qkv
    # element ceil(1024 / 128) = 8 times: a quarter of v3's (72, 32).
    assert projection.global_reads(1024, 2304, 4) == (18, 8)
    assert projection.FAST == {"projection_kernel_v4": {"max_stack_bytes": 0, "min_ffma_fraction": 0.6}}


def test_the_layers_use_v4_on_a_gpu_and_v1_on_the_simulator():
    from attention_lib.platform.runtime import SIMULATOR_SHAPES
    from attention_lib.stages import kv_cache, multihead
    assert projection.layer_version(gpu=True) == 4 and projection.layer_version(gpu=False) == 1
    assert projection.layer_version() == (1 if SIMULATOR_SHAPES else 4)
    assert multihead.PROJECTION_VERSION == kv_cache.PROJECTION_VERSION == projection.layer_version()


@pytest.mark.parametrize("version", [1, 4])
def test_launch_version_runs_each_kernel_on_its_own_grid(rng, version):
    x, w, b = random_problem(rng, 19, 21, 18)
    out = cuda.device_array((19, 18), np.float32)
    projection.launch_version(version, cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), out)
    assert np.allclose(out.copy_to_host(), reference.project(x, w, b), rtol=tolerance(21), atol=tolerance(21))


# What the compiler makes of v4 on a GPU (no GPU needed: PTX for sm_90 in a process with the
# simulator off). The kernel report checks registers, stack and the hot loop's FFMA share.
PTX_PROGRAM = """
import os
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
from numba import cuda
from numba.cuda import types
from attention_lib.platform.numba_patches import compile_for
from attention_lib.stages import projection
assert projection.SHARED_ALIGNMENT == 16
compile_for((9, 0))
f2, f1 = types.float32[:, ::1], types.float32[::1]
ptx, _ = cuda.compile_ptx(projection.projection_kernel_v4.py_func, (f2, f2, f1, f2), cc=(9, 0),
                          launch_bounds=projection.projection_kernel_v4.targetoptions["launch_bounds"])
print(ptx.count(".f64"), ptx.count("ld.shared.v4.f32"), ptx.count("ld.local") + ptx.count("st.local"),
      ".maxntid 256, 1, 1" in ptx, ".minnctapersm 2" in ptx)
"""


def test_v4_compiles_to_16_byte_shared_loads_without_float64_or_local_memory():
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_LIB_BACKEND"}
    done = subprocess.run([sys.executable, "-c", PTX_PROGRAM], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    f64, vector_loads, local, max_threads, min_blocks = done.stdout.split()
    assert f64 == "0"                    # uint32 indices: no comparison or index goes through float64
    assert vector_loads == "4"           # per k: the two fragments of x^T and the two of w
    assert local == "0" and max_threads == "True" and min_blocks == "True"


@pytest.mark.parametrize("T, d_model, d_out", [(1, 5, 3), (18, 17, 33), (33, 40, 17)])
def test_v2_reads_only_tile_slots_written_in_their_step(rng, T, d_model, d_out):
    # tile_matmul writes every slot of both tiles at every step (a 0 past the edges), so no read
    # sees a number left from an earlier step or never written: what 01_tiled_matmul calls stale.
    from attention_lib.measure.trace import Traced
    x, w, b = random_problem(rng, T, d_model, d_out)
    grid, block = projection.projection_grid(T, d_out)
    out = np.zeros((T, d_out), np.float32)
    traced = Traced(projection.projection_kernel_v2, grid, block, x, w, b, out)
    assert traced.races() == [] and traced.stale_read() is None
    assert np.allclose(out, reference.project(x, w, b), rtol=tolerance(d_model), atol=tolerance(d_model))
