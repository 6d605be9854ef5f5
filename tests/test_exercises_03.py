"""Notebook 03's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda, float32

from attention_lib import reference
from attention_lib.checks import EXERCISES, check, hint
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import basics, projection
from attention_lib.stages.scores import TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result




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
