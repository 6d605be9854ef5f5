"""The main exercises of notebooks 00-03 and the named verdicts of their warm-ups.

For each exercise: the solution (as in the notebook) gets ``ok``, every typical mistake is
planted and gets its own diagnosis, in one line. Sizes and cases are the exercises' own
(attention_lib/checks/ex00_basics.py .. ex03_mask.py).
"""

import math

import pytest
from numba import cuda, float32

from attention_lib import reference
from attention_lib.checks import EXERCISES, check, hint
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import projection
from attention_lib.stages.scores import TILE

assert TILE == projection.TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- hints ---------------------------------------------------------------------------------

def test_hints_come_in_levels_and_never_give_a_line_away(capsys):
    for exercise_id in ("00_transpose", "01_tiled_matmul", "02_scores_kt", "03_tile_skip"):
        exercise = EXERCISES[exercise_id]
        assert len(exercise.hints) >= 2, exercise_id
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(exercise.hints)}: where")
        for text in exercise.hints:    # no code: no assignment, no indexing, no call of the API
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
    with pytest.raises(ValueError, match="level must be in 1..3 for 01_tiled_matmul, got 4"):
        hint("01_tiled_matmul", 4)


def test_a_stub_is_told_where_the_next_hint_is():
    def stub(rows, cols, block):
        raise NotImplementedError()
    result = verdict("00_transpose", (None, stub))
    assert result.diagnosis == "not_implemented"
    assert "Hint: give every element" in result.message and "hint('00_transpose', 2)" in result.message


# --- 00_transpose --------------------------------------------------------------------------

def transpose_grid(rows, cols, block):
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])


@cuda.jit
def transpose_kernel(a, out):
    c, r = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


def swapped_grid(rows, cols, block):
    return ceil_div(rows, block[0]), ceil_div(cols, block[1])


def rounded_down_grid(rows, cols, block):
    return max(cols // block[0], 1), max(rows // block[1], 1)


def one_block_too_many(rows, cols, block):
    return cols // block[0] + 1, rows // block[1] + 1


@cuda.jit
def row_from_x(a, out):
    r, c = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def copies(a, out):
    c, r = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = a[r, c]


@cuda.jit
def no_guard(a, out):
    c, r = cuda.grid(2)
    out[c, r] = a[r, c]


@pytest.mark.parametrize("answer, diagnosis, says", [
    ((transpose_kernel, transpose_grid), "ok", "correct at every size"),
    ((transpose_kernel, swapped_grid), "grid_axes_swapped", "the grid's x counts blocks across the columns"),
    ((transpose_kernel, rounded_down_grid), "grid_too_small", "round the number of blocks up"),
    ((transpose_kernel, one_block_too_many), "grid_too_large", "nothing to do"),
    ((row_from_x, transpose_grid), "row_is_x", "at a of shape (19, 7)"),
    ((copies, transpose_grid), "not_transposed", "at a of shape (7, 7)"),
    ((no_guard, transpose_grid), "out_of_bounds", "Guard the index"),
])
def test_00_transpose(answer, diagnosis, says):
    result = verdict("00_transpose", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


# --- 01_tiled_matmul ---------------------------------------------------------------------

def tiled(mistake=None):
    """The solution's loop body, or the same with one typical mistake."""
    @cuda.jit
    def kernel(x, w, b, out):
        x_tile = cuda.shared.array((TILE, TILE), float32)
        w_tile = cuda.shared.array((TILE, TILE), float32)
        col, row = cuda.grid(2)
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        acc = float32(0.0)
        for start in range(0, x.shape[1], TILE):
            if mistake == "unguarded":
                x_tile[ty, tx] = x[row, start + tx]
            elif row < x.shape[0] and start + tx < x.shape[1]:
                x_tile[ty, tx] = x[row, start + tx]
            else:
                x_tile[ty, tx] = float32(0.0)
            if start + ty < w.shape[0] and col < w.shape[1]:
                w_tile[ty, tx] = w[start + ty, col]
            else:
                w_tile[ty, tx] = float32(0.0)
            if mistake != "no_first_barrier":
                cuda.syncthreads()
            for k in range(TILE):
                if mistake == "untiled":
                    if start + k < x.shape[1] and row < x.shape[0] and col < w.shape[1]:
                        acc += x[row, start + k] * w[start + k, col]
                else:
                    acc += x_tile[ty, k] * w_tile[k, tx]
            if mistake != "no_second_barrier":
                cuda.syncthreads()
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = acc + (b[col] if b.shape[0] > 0 else float32(0.0))
    return kernel


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("no_first_barrier", "race", "race on shared"),
    ("no_second_barrier", "race", "race on shared"),
    ("unguarded", "out_of_bounds", "Guard the index"),
    ("untiled", "no_reuse", "an element of x was read up to 36 times (a tiled kernel: 3)"),
])
def test_01_tiled_matmul(mistake, diagnosis, says):
    result = verdict("01_tiled_matmul", tiled(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_01_the_library_kernels_against_the_tiled_exercise():
    assert verdict("01_tiled_matmul", projection.projection_kernel_v2).passed
    assert verdict("01_tiled_matmul", projection.projection_kernel_v1).diagnosis == "no_reuse"


# --- 02: swapped q and k in the warm-up; 02_scores_kt ---------------------------------------

@cuda.jit
def q_and_k_swapped(q, k, inv_sqrt_dk, s):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2]:
        acc = float32(0.0)
        for c in range(q.shape[2]):
            acc += k[h, i, c] * q[h, j, c]
        s[h, i, j] = acc * inv_sqrt_dk


def test_02_swapped_q_and_k_are_transposed_not_out_of_bounds():
    result = verdict("02_scaled_scores", q_and_k_swapped)
    assert result.diagnosis == "transposed", result.message
    assert "T_q = 7, T_k = 7, d_k = 7" in result.message and "q and k are swapped" in result.message


def scores_kt(mistake=None):
    """The solution of 02_scores_kt, or the same with one typical mistake."""
    @cuda.jit
    def kernel(q, kt, inv_sqrt_dk, s):
        q_tile = cuda.shared.array((TILE, TILE), float32)
        kt_tile = cuda.shared.array((TILE, TILE), float32)
        j, i = cuda.grid(2)
        h = cuda.blockIdx.z
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        scale = float32(1.0) if mistake == "no_scale" else inv_sqrt_dk
        acc = float32(0.0)
        for c0 in range(0, q.shape[2], TILE):
            q_ok = i < q.shape[1] and c0 + tx < q.shape[2]
            q_tile[ty, tx] = q[h, i, c0 + tx] * scale if q_ok else float32(0.0)
            if mistake == "uncoalesced":           # right values, but a warp walks down kt's columns
                key = cuda.blockIdx.x * TILE + ty
                ok = c0 + tx < kt.shape[1] and key < kt.shape[2]
                kt_tile[tx, ty] = kt[h, c0 + tx, key] if ok else float32(0.0)
            else:
                ok = c0 + ty < kt.shape[1] and j < kt.shape[2]
                kt_tile[ty, tx] = kt[h, c0 + ty, j] if ok else float32(0.0)
            if mistake != "no_second_barrier":
                cuda.syncthreads()
            for cc in range(TILE):
                if mistake == "untiled":
                    if c0 + cc < q.shape[2] and i < q.shape[1] and j < kt.shape[2]:
                        acc += q[h, i, c0 + cc] * kt[h, c0 + cc, j] * scale
                else:
                    acc += q_tile[ty, cc] * kt_tile[cc, tx]
            if mistake != "no_first_barrier":
                cuda.syncthreads()
        if i < s.shape[1] and j < s.shape[2]:
            s[h, i, j] = acc
    return kernel


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("no_scale", "missing_scale", "without the scale"),
    ("no_first_barrier", "race", "race on shared"),
    ("no_second_barrier", "race", "race on shared"),
    ("untiled", "no_reuse", "an element of q was read up to 33 times (tiled: 2)"),
    ("uncoalesced", "uncoalesced", "segments of 128 bytes"),
])
def test_02_scores_kt(mistake, diagnosis, says):
    result = verdict("02_scores_kt", scores_kt(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


# --- 03: swapped grid axes in the warm-up; 03_tile_skip --------------------------------------

@cuda.jit
def mask_with_swapped_axes(s, window):
    i, j = cuda.grid(2)
    if i < s.shape[1] and j < s.shape[2] and j > i + (s.shape[2] - s.shape[1]):
        s[cuda.blockIdx.z, i, j] = -math.inf


def test_03_swapped_grid_axes_are_named():
    result = verdict("03_causal_mask", mask_with_swapped_axes)
    assert result.diagnosis == "grid_axes_swapped", result.message
    assert "T_q = 40, T_k = 5" in result.message and "uncoalesced" in result.message


def skip_test(mistake=None):
    """The solution of 03_tile_skip, or the same with one typical mistake."""
    @cuda.jit(device=True)
    def tile_is_masked(row_block, col_block, t_q, t_k, window):
        offset = 0 if mistake == "no_offset" else t_k - t_q
        first_row, first_col = row_block * TILE, col_block * TILE
        last_row = min(first_row + TILE, t_q) - 1
        last_col = min(first_col + TILE, t_k) - 1
        if mistake == "first_row_for_future":
            last_row = first_row
        future = first_col > last_row + offset
        past = last_col <= first_row + offset - window
        if mistake == "future_only":
            return future
        return past if mistake == "past_only" else future or past
    return tile_is_masked


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("future_only", "skips_too_few", "the ones missed lie before the window"),
    ("past_only", "skips_too_few", "the ones missed lie above the diagonal"),
    ("first_row_for_future", "skips_visible_tile", "was skipped but holds a visible score"),
    ("no_offset", "skips_visible_tile", "T_q = 9, T_k = 33"),
])
def test_03_tile_skip(mistake, diagnosis, says):
    result = verdict("03_tile_skip", skip_test(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_03_skipped_tiles_match_the_causal_formula():
    from attention_lib.checks.ex03_mask import wholly_masked_tiles
    from attention_lib.stages import mask
    for t_q, t_k in [(40, 40), (33, 17), (9, 33), (1, 1)]:
        masked = wholly_masked_tiles(reference.causal_mask(t_q, t_k))   # plain causal
        computed, skipped = mask.causal_tile_counts(t_q, t_k)
        assert (masked.size - masked.sum(), masked.sum()) == (computed, skipped)
