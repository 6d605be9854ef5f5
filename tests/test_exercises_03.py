"""Notebook 03's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math
import types

import pytest
from numba import cuda, float32

from attention_lib import reference
from attention_lib.checks import EXERCISES, check
from attention_lib.stages import mask
from attention_lib.stages.scores import TILE, tile_dot


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


def as_answer(library_function, device=False):
    """A library kernel or device function as a student's answer: the same code (the notebook's
    solution is held to it), compiled as a function of its own, so the check does not take it
    for the library's."""
    fn = library_function.py_func
    return cuda.jit(device=device)(types.FunctionType(fn.__code__, fn.__globals__, "answer", fn.__defaults__,
                                                      fn.__closure__))


@pytest.mark.parametrize("exercise_id, library, device", [
    ("03_causal_mask", mask.mask_kernel, False),
    ("03_causal_scores", mask.causal_scores_kernel, False),
    ("03_tile_skip", mask.tile_is_masked, True),
])
def test_03_the_library_code_is_the_solution_and_passes(exercise_id, library, device):
    solution = EXERCISES[exercise_id].solution
    assert library is (solution[0] if isinstance(solution, tuple) else solution)
    assert verdict(exercise_id, as_answer(library, device)).diagnosis == "ok"
    assert verdict(exercise_id, library).diagnosis == "calls_given_code"


# --- 03_causal_mask: the warm-up ----------------------------------------------------------------

def in_place(mistake=None):
    """mask_kernel's body, or the same with one typical mistake."""
    @cuda.jit
    def kernel(s, window):
        t_q, t_k = s.shape[1], s.shape[2]
        if mistake == "axes_swapped":
            i, j = cuda.grid(2)
        elif mistake == "threads_swapped":                # the blocks right, a warp's lanes down a column
            i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.x
            j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.y
        else:
            j, i = cuda.grid(2)
        h = cuda.blockIdx.z
        if not (i < t_q and j < t_k):
            return
        position = i if mistake == "no_offset" else i + (t_k - t_q)
        future = j > position
        if mistake == "diagonal_too":
            future = j >= position
        elif mistake == "past":
            future = j < position
        elif mistake == "nothing":
            future = False
        if mistake == "no_window":
            too_old = False
        elif mistake == "window_zero_literal":
            too_old = j <= position - window
        elif mistake == "window_too_wide":
            too_old = window > 0 and j < position - window
        else:
            too_old = window > 0 and j <= position - window
        if future or too_old:
            s[h, i, j] = float32(-1e9) if mistake == "minus_1e9" else -math.inf
    return kernel


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("diagonal_too", "mask_includes_diagonal", "the diagonal is masked too"),
    ("past", "mask_wrong_side", "the past is masked instead of the future"),
    ("nothing", "mask_not_applied", "no score was changed"),
    ("no_offset", "mask_ignores_offset", "T_q = 5, T_k = 9"),
    ("minus_1e9", "mask_value_not_neg_inf", "with -1e+09"),
    ("axes_swapped", "grid_axes_swapped", "T_q = 40, T_k = 5"),
    ("threads_swapped", "uncoalesced", "the values are right, but a warp's store of s at"),
    ("no_window", "mask_ignores_window", "window = 4"),
    ("window_too_wide", "window_off_by_one", "one key off"),
    ("window_zero_literal", "window_zero_not_none", "0 means no window"),
])
def test_03_causal_mask(mistake, diagnosis, says):
    result = verdict("03_causal_mask", in_place(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


# --- 03_causal_scores: the fused kernel's early exit ---------------------------------------------

def fused(mistake=None):
    """causal_scores_kernel's body, or the same with one typical mistake."""
    @cuda.jit
    def kernel(q, k, inv_sqrt_dk, s):
        j, i = cuda.grid(2)
        h = cuda.blockIdx.z
        t_q, t_k = s.shape[1], s.shape[2]
        offset = 0 if mistake == "tile_no_offset" else t_k - t_q
        last_row = min((cuda.blockIdx.y + 1) * TILE, t_q) - 1
        if mistake == "first_row":
            last_row = cuda.blockIdx.y * TILE
        first_col = cuda.blockIdx.x * TILE
        leave = first_col > last_row + offset
        if mistake == "full_tile":                          # the tile's last row uncut at T_q: right too
            leave = first_col > cuda.blockIdx.y * TILE + TILE - 1 + offset
        elif mistake == "ge_full_tile":                     # >= for >: wrong when T_k - T_q is 1 modulo TILE
            leave = first_col >= cuda.blockIdx.y * TILE + TILE - 1 + offset
        if mistake == "per_thread":
            leave = j > i + offset                          # differs between the threads of a diagonal tile
        elif mistake == "no_skip":
            leave = False
        if leave:
            if mistake == "no_guard" or (i < t_q and j < t_k):
                if mistake != "skip_unwritten":
                    s[h, i, j] = -math.inf
            return
        acc = tile_dot(q, k, h, i, j)
        if i < t_q and j < t_k:
            masked = j > i + (t_k - t_q)
            if mistake == "no_diagonal_mask":
                masked = False
            elif mistake == "diagonal_too":
                masked = j >= i + (t_k - t_q)
            elif mistake == "score_no_offset":
                masked = j > i
            if masked:
                s[h, i, j] = -math.inf
            else:
                s[h, i, j] = acc if mistake == "no_scale" else acc * inv_sqrt_dk
    return kernel


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("per_thread", "divergent_barrier", "undefined on a GPU"),
    ("no_skip", "skips_too_few", "tiles wholly in the future were computed"),
    ("full_tile", "ok", "correct at every size"),
    ("ge_full_tile", "skips_visible_tile", "T_q = 16, T_k = 17, d_k = 5: the block of tile (row block 0, col block 1) "
                                           "skipped it, but query 15 sees key 16 there"),
    ("first_row", "skips_visible_tile", "its last query against its first key"),
    ("tile_no_offset", "skips_visible_tile", "its last query against its first key"),
    ("skip_unwritten", "skipped_tile_not_written", "still owes each of its scores a -inf"),
    ("no_guard", "out_of_bounds", "out-of-bounds "),
    ("no_diagonal_mask", "diagonal_tile_unmasked", "written unmasked"),
    ("diagonal_too", "mask_includes_diagonal", "the diagonal is masked too"),
    ("score_no_offset", "mask_ignores_offset", "T_q = 16, T_k = 17"),
    ("no_scale", "missing_scale", "without the scale"),
])
def test_03_causal_scores(mistake, diagnosis, says):
    result = verdict("03_causal_scores", fused(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


@cuda.jit
def scales_twice(q, k, inv_sqrt_dk, s):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    t_q, t_k = s.shape[1], s.shape[2]
    if cuda.blockIdx.x * TILE > min((cuda.blockIdx.y + 1) * TILE, t_q) - 1 + (t_k - t_q):
        if i < t_q and j < t_k:
            s[h, i, j] = -math.inf
        return
    acc = tile_dot(q, k, h, i, j)
    if i < t_q and j < t_k:
        s[h, i, j] = -math.inf if j > i + (t_k - t_q) else acc * inv_sqrt_dk * inv_sqrt_dk


def test_03_causal_scores_scaled_twice_is_named():
    result = verdict("03_causal_scores", scales_twice)
    assert result.diagnosis == "scaled_by_d_k" and "applied twice" in result.message, result.message


# --- 03_tile_skip: the sliding-window tile test ----------------------------------------------------

def skip_test(mistake=None):
    """The solution of 03_tile_skip, or the same with one typical mistake."""
    @cuda.jit(device=True)
    def tile_is_masked(row_block, col_block, t_q, t_k, window):
        if mistake == "blocks_swapped":                     # the tile's rows taken from col_block
            row_block, col_block = col_block, row_block
        if mistake == "block_idx_read":                     # blockIdx.x for the rows, blockIdx.y for the columns
            row_block, col_block = cuda.blockIdx.x, cuda.blockIdx.y
        offset = 0 if mistake == "no_offset" else t_k - t_q
        first_row, first_col = row_block * TILE, col_block * TILE
        last_row = min(first_row + TILE, t_q) - 1
        last_col = min(first_col + TILE, t_k) - 1
        if mistake == "first_row_for_future":
            last_row = first_row
        future = first_col > last_row + offset
        if mistake == "ge_full_tile":                       # >= for >: wrong when T_k - T_q is 1 modulo TILE
            future = first_col >= first_row + TILE - 1 + offset
        if mistake == "window_zero_literal":
            past = last_col <= first_row + offset - window
        elif mistake == "window_lt":                        # < for <=: a tile whose last key is just too old is kept
            past = window > 0 and last_col < first_row + offset - window
        else:
            past = window > 0 and last_col <= first_row + offset - window
        if mistake == "future_only":
            return future
        return past if mistake == "past_only" else future or past
    return tile_is_masked


@cuda.jit(device=True)
def tile_is_masked_row_by_row(row_block, col_block, t_q, t_k, window):
    """A right answer of another design: the tile is masked when none of its rows sees one of its keys."""
    first_col = col_block * TILE
    last_col = min(first_col + TILE, t_k) - 1
    for i in range(row_block * TILE, min(row_block * TILE + TILE, t_q)):
        newest = min(i + t_k - t_q, last_col)              # the latest key row i sees, within the tile
        oldest = first_col if window == 0 else max(first_col, i + t_k - t_q - window + 1)
        if oldest <= newest:
            return False
    return True


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("row_by_row", "ok", "correct at every size"),
    ("blocks_swapped", "tile_axes_swapped", "T_q = 17, T_k = 16, window = 0: tile (row block 1, col block 0) was "
                                            "skipped as if it were tile (row block 0, col block 1)"),
    ("block_idx_read", "tile_axes_swapped", "the tiles' rows and columns were swapped"),
    ("future_only", "skips_too_few", "the ones missed lie before the window"),
    ("past_only", "skips_too_few", "the ones missed lie above the diagonal"),
    ("first_row_for_future", "skips_visible_tile", "was skipped but holds a visible score"),
    ("no_offset", "skips_visible_tile", "T_q = 16, T_k = 17"),
    ("ge_full_tile", "skips_visible_tile", "T_q = 16, T_k = 17, window = 0: tile (row block 0, col block 1) was "
                                           "skipped but holds a visible score (query 15, key 16)"),
    ("window_lt", "skips_too_few", "T_q = 16, T_k = 48, window = 17: the values are right, but 0 of the 1 wholly "
                                   "masked tiles were skipped; the ones missed lie before the window"),
    ("window_zero_literal", "window_zero_not_none", "0 means no window"),
])
def test_03_tile_skip(mistake, diagnosis, says):
    result = verdict("03_tile_skip", tile_is_masked_row_by_row if mistake == "row_by_row" else skip_test(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_03_skipped_tiles_match_the_tile_counts():
    from attention_lib.checks.ex03_mask import wholly_masked_tiles
    for t_q, t_k, window in [(40, 40, None), (33, 17, None), (9, 33, None), (1, 1, None), (40, 40, 7),
                             (9, 33, 5), (1024, 1024, 256)]:
        masked = wholly_masked_tiles(reference.causal_mask(t_q, t_k, window))
        assert (masked.size - masked.sum(), masked.sum()) == mask.causal_tile_counts(t_q, t_k, window=window)


@pytest.mark.parametrize("exercise_id", ["03_causal_mask", "03_causal_scores", "03_tile_skip"])
def test_03_hints_name_the_idea_then_the_plan_then_where_answers_go_wrong(exercise_id):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) == 3 and hints[1].startswith("the plan") and hints[2].startswith("where answers go wrong")
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text
