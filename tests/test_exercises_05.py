"""Notebook 05's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line.

The solutions below are the library's code (the notebook's solution cells), copied: the library's
own kernel would be refused as given code.
"""

import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check
from attention_lib.stages import projection
from attention_lib.stages.projection import TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 05_weighted_sum (warm-up): one thread per output element --------------------------------------

@cuda.jit
def weighted_sum_solution(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(a.shape[2]):
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_rows_from_x(a, v, out):
    row, col = cuda.grid(2)                            # the query from the grid's x
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(a.shape[2]):
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_columns_of_a(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(a.shape[2]):
            acc += a[h, j, row] * v[h, j, col]         # column `row` of the weights
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_without_guard(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    acc = float32(0.0)
    for j in range(a.shape[2]):
        acc += a[h, row, j] * v[h, j, col]
    out[h, row, col] = acc


@cuda.jit
def weighted_sum_head_0(a, v, out):
    col, row = cuda.grid(2)
    if row < a.shape[1] and col < v.shape[2]:
        for h in range(a.shape[0]):
            acc = float32(0.0)
            for j in range(a.shape[2]):
                acc += a[0, row, j] * v[0, j, col]     # every head gets head 0's output
            out[h, row, col] = acc


@cuda.jit
def weighted_sum_by_tile_matmul(a, v, out):
    col, row = cuda.grid(2)
    acc = projection.tile_matmul(a[cuda.blockIdx.z], v[cuda.blockIdx.z], row, col)
    if row < a.shape[1] and col < v.shape[2]:
        out[cuda.blockIdx.z, row, col] = acc


@cuda.jit
def weighted_sum_stub(a, v, out):
    raise NotImplementedError()


def test_the_weighted_sum_solution_passes():
    result = verdict("05_weighted_sum", weighted_sum_solution)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (weighted_sum_rows_from_x, "grid_axes_swapped", "the grid's x runs along the output's columns"),
    (weighted_sum_columns_of_a, "weights_transposed", "read column i of the weights"),
    (weighted_sum_without_guard, "out_of_bounds", "out-of-bounds "),
    (weighted_sum_head_0, "race", "blocks never wait for each other"),     # every block writes the same elements: an inter-block race
    (weighted_sum_by_tile_matmul, "calls_given_code", "tile_matmul"),
    (weighted_sum_stub, "not_implemented", "Hint"),
])
def test_weighted_sum_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("05_weighted_sum", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


# --- 05_causal_av (main): the causal tiled kernel ------------------------------------------------

@cuda.jit
def causal_av_solution(a, v, out):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    v_tile = cuda.shared.array((TILE, TILE), float32)
    col, row = cuda.grid(2)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    (t_q, t_k), d_v, acc = a.shape[1:], v.shape[2], float32(0.0)
    k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE + t_k - t_q)
    for start in range(0, k_end, TILE):
        a_tile[ty, tx] = a[h, row, start + tx] if row < t_q and start + tx < k_end else float32(0.0)
        v_tile[ty, tx] = v[h, start + ty, col] if start + ty < k_end and col < d_v else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            acc += a_tile[ty, j] * v_tile[j, tx]
        cuda.syncthreads()
    if row < t_q and col < d_v:
        out[h, row, col] = acc


def causal_av(stop="block", barriers=(True, True), guard_loads=True):
    """The solution with one thing changed: the stopping point (`stop`), a barrier left out, or
    the loads unguarded."""
    first_barrier, second_barrier = barriers

    @cuda.jit
    def kernel(a, v, out):
        a_tile = cuda.shared.array((TILE, TILE), float32)
        v_tile = cuda.shared.array((TILE, TILE), float32)
        col, row = cuda.grid(2)
        tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
        (t_q, t_k), d_v, acc = a.shape[1:], v.shape[2], float32(0.0)
        if stop == "block":
            k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE + t_k - t_q)
        elif stop == "every key":
            k_end = t_k
        elif stop == "rounded up":                     # the end of the diagonal tile: no tile above loaded
            k_end = min(t_k, -(-((cuda.blockIdx.y + 1) * TILE + t_k - t_q) // TILE) * TILE)
        elif stop == "before the diagonal":
            k_end = min(t_k, cuda.blockIdx.y * TILE + t_k - t_q)
        elif stop == "no offset":
            k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE)
        else:                                          # "own query": differs between a block's threads
            k_end = min(t_k, row + 1 + t_k - t_q)
        for start in range(0, k_end, TILE):
            if guard_loads:
                a_tile[ty, tx] = a[h, row, start + tx] if row < t_q and start + tx < k_end else float32(0.0)
                v_tile[ty, tx] = v[h, start + ty, col] if start + ty < k_end and col < d_v else float32(0.0)
            else:
                a_tile[ty, tx] = a[h, row, start + tx]
                v_tile[ty, tx] = v[h, start + ty, col]
            if first_barrier:
                cuda.syncthreads()
            for j in range(TILE):
                acc += a_tile[ty, j] * v_tile[j, tx]
            if second_barrier:
                cuda.syncthreads()
        if row < t_q and col < d_v:
            out[h, row, col] = acc
    return kernel


@cuda.jit
def causal_av_stub(a, v, out):
    raise NotImplementedError()


@pytest.mark.parametrize("answer", [causal_av_solution, causal_av(stop="rounded up")],
                         ids=["solution", "rounded-up-stop"])
def test_the_causal_av_solution_passes(answer):
    result = verdict("05_causal_av", answer)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("answer, diagnosis, says", [
    (causal_av(stop="every key"), "no_tiles_skipped", "wholly above the diagonal"),
    (causal_av(stop="before the diagonal"), "diagonal_tile_skipped", "the key tile on the diagonal"),
    (causal_av(stop="no offset"), "mask_ignores_offset", "the queries are the last positions"),
    (causal_av(stop="own query"), "divergent_barrier", "hangs the block"),
    (causal_av(barriers=(False, True)), "race", "a_tile"),
    (causal_av(barriers=(True, False)), "race", "_tile"),
    (causal_av(guard_loads=False), "out_of_bounds", "out-of-bounds "),
    (weighted_sum_by_tile_matmul, "calls_given_code", "tile_matmul"),
    (causal_av_stub, "not_implemented", "Hint"),
])
def test_causal_av_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("05_causal_av", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


def test_hints_name_no_code():
    for exercise_id in ("05_weighted_sum", "05_causal_av"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2 and hints[1].startswith("where answers go wrong")
        for text in hints:
            assert not any(code in text for code in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
