"""Notebook 00's kernels against NumPy at awkward sizes, and their launchers' input checks."""

import numpy as np
import pytest
from attention_lib.stages import basics

# 1 and 7: less than a block; 64: exactly one; 65 and 200: a partly used last block.
SIZES = [1, 7, 64, 65, 200]


@pytest.mark.parametrize("n", SIZES)
def test_add_matches_numpy(rng, n):
    x, y = rng.standard_normal((2, n)).astype(np.float32)
    got = basics.add(x, y)
    assert got.dtype == np.float32 and got.shape == (n,)
    assert np.allclose(got, x.astype(np.float64) + y, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("n", SIZES)
def test_scale_add_matches_reference(rng, n):
    x, y = rng.standard_normal((2, n))
    alpha = rng.uniform(-3, 3)
    assert np.allclose(basics.scale_add(alpha, x, y), basics.scale_add_reference(alpha, x, y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads_per_block", [1, 3, 32, 64])
def test_whoami_covers_every_element_once(threads_per_block):
    n = 70
    block_of, thread_of, global_of = basics.whoami(n, threads_per_block)
    assert np.array_equal(global_of, np.arange(n))
    assert np.array_equal(block_of, np.arange(n) // threads_per_block)
    assert np.array_equal(thread_of, np.arange(n) % threads_per_block)


def test_whoami_2d_tiles_the_matrix_with_x_along_columns():
    rows, cols = 11, 19
    block_of, thread_of = basics.whoami_2d(rows, cols, block=(8, 4))
    r, c = np.indices((rows, cols))
    blocks_across = 3                                  # ceil(19 / 8)
    assert np.array_equal(block_of, (r // 4) * blocks_across + c // 8)
    assert np.array_equal(thread_of, (r % 4) * 8 + c % 8)


def test_bad_inputs_are_one_line_errors_naming_the_argument(rng):
    x = rng.standard_normal(5)
    with pytest.raises(ValueError, match=r"^y must have the shape of x \(5,\), got \(6,\)$"):
        basics.add(x, np.zeros(6))
    with pytest.raises(ValueError, match=r"^x must have shape \(n,\) \(1 axes\), got shape \(2, 3\)$"):
        basics.add(np.zeros((2, 3)), np.zeros((2, 3)))
    with pytest.raises(TypeError, match=r"^y must be a float array of shape \(n,\), got dtype complex128$"):
        basics.add(x, x * 1j)
    with pytest.raises(TypeError, match=r"^x must be a NumPy float array of shape \(n,\), got str$"):
        basics.add("hello", x)
    with pytest.raises(ValueError, match=r"^x contains nan at index \(2,\); it must be finite$"):
        bad = x.copy()
        bad[2] = np.nan
        basics.add(bad, x)
    with pytest.raises(ValueError, match=r"^x must not be empty, got shape \(0,\)$"):
        basics.add(np.zeros(0), np.zeros(0))
    with pytest.raises(TypeError, match=r"^alpha must be a finite number, got inf$"):
        basics.scale_add(np.inf, x, x)


def test_integer_input_is_converted(rng):
    x = rng.integers(-5, 5, 9)
    assert np.array_equal(basics.add(x, x), 2.0 * x)


def test_the_simulator_refuses_launches_that_would_take_minutes(monkeypatch):
    from attention_lib.platform import launch
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    with pytest.raises(ValueError, match=r"^basics: 20,000,000 CUDA threads would take about \d+ min on the simulator"):
        launch.check_simulator_budget("basics", 20_000_000)
    monkeypatch.setenv(launch.ALLOW_SLOW_VARIABLE, "1")
    launch.check_simulator_budget("basics", 20_000_000)   # allowed on request: no error


@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 7), (19, 7), (5, 40), (33, 17)])
def test_transpose_matches_numpy(rng, rows, cols):
    a = rng.standard_normal((rows, cols))
    got = basics.transpose(a)
    assert got.dtype == np.float32 and np.array_equal(got, a.astype(np.float32).T)


@pytest.mark.parametrize("rows, cols", [(1, 1), (16, 16), (15, 17), (33, 20), (5, 40), (47, 3)])
def test_tiled_transpose_matches_numpy(rng, rows, cols):
    a = rng.standard_normal((rows, cols))
    got = basics.transpose(a, kernel=basics.transpose_tiled_kernel, block=basics.TILED_TRANSPOSE_BLOCK)
    assert got.dtype == np.float32 and np.array_equal(got, a.astype(np.float32).T)


def test_the_tiled_transpose_writes_rows_of_out_where_the_plain_one_writes_columns(rng):
    """What the tile is for, counted by the trace. A warp is two rows of 16 lanes: along rows it touches
    two runs of 64 bytes, at most 4 segments of 128 bytes; down a column of out (16 rows of 128 bytes),
    a segment every two lanes."""
    from attention_lib.measure import sanitizer
    from attention_lib.measure.trace import Traced
    a = rng.standard_normal((32, 48)).astype(np.float32)          # whole blocks: every warp full
    stores = {}
    for kernel, block in ((basics.transpose_kernel, basics.TRANSPOSE_BLOCK),
                          (basics.transpose_tiled_kernel, basics.TILED_TRANSPOSE_BLOCK)):
        out = np.zeros((48, 32), np.float32)
        traced = Traced(kernel, basics.grid_2d(32, 48, block), block, a, out)
        assert np.array_equal(out, a.T) and traced.worst_warp_load("a")[0] <= 4
        stores[kernel] = traced.warp_segments("out", kind=sanitizer.STORE)
    assert stores[basics.transpose_tiled_kernel] <= 4 and stores[basics.transpose_kernel] >= 8


def test_transpose_refuses_a_vector():
    with pytest.raises(ValueError, match=r"^a must have shape \(rows, cols\) \(2 axes\), got shape \(3,\)$"):
        basics.transpose(np.zeros(3))


@pytest.mark.parametrize("rows, cols, block, grid", [
    (1, 1, (16, 8), (1, 1)), (8, 16, (16, 8), (1, 1)), (9, 17, (16, 8), (2, 2)), (100, 3, (16, 8), (1, 13))])
def test_grid_2d_is_the_smallest_covering_grid(rows, cols, block, grid):
    assert basics.grid_2d(rows, cols, block) == grid


def measured_divergent_warps(rows, cols, block):
    """The same question answered by a launch: which threads of each warp of whoami_2d wrote an element."""
    block_of, thread_of = basics.whoami_2d(rows, cols, block)
    grid_x, grid_y = basics.grid_2d(rows, cols, block)
    warps = block[0] * block[1] // basics.WARP_SIZE
    wrote = np.zeros((grid_y * grid_x, block[0] * block[1]), bool)     # [block id, thread id]
    wrote[block_of.ravel(), thread_of.ravel()] = True
    per_warp = wrote.reshape(grid_y, grid_x, warps, basics.WARP_SIZE)
    return per_warp.any(axis=-1) & ~per_warp.all(axis=-1)


@pytest.mark.parametrize("rows, cols, block", [
    (1, 1, (16, 8)), (21, 20, (16, 8)), (7, 40, (32, 4)), (19, 13, (8, 8)), (3, 100, (64, 1)), (33, 33, (32, 32))])
def test_divergent_warps_are_those_a_launch_splits(rows, cols, block):
    assert np.array_equal(basics.divergent_warps(rows, cols, block), measured_divergent_warps(rows, cols, block))


def test_in_2d_the_right_edge_splits_every_warp_along_it():
    # blocks one warp wide: the bottom edge never splits a warp, the right edge splits all of its warps
    split = basics.divergent_warps(40, 40, (32, 4))       # grid (2, 10), 4 warps a block
    assert not split[:, 0].any() and split[:, 1].all()
    # in 1-D only the last block's one warp that straddles the end
    assert basics.divergent_warps(1, 100, (64, 1)).sum() == 1
