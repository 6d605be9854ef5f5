"""Notebook 05's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint


# --- 05: A . V skipping the zero tiles above the diagonal -------------------------------------

from attention_lib.checks.ex05_weighted_values import tile_matmul_until  # noqa: E402
from attention_lib.stages.projection import TILE as AV_TILE             # noqa: E402


@cuda.jit
def causal_av_solution(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], (cuda.blockIdx.y + 1) * AV_TILE + a.shape[2] - a.shape[1])
    acc = tile_matmul_until(a[h], v[h], row, col, k_end)
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_every_tile(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    acc = tile_matmul_until(a[h], v[h], row, col, a.shape[2])       # right, but reads the zeros
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_without_the_diagonal(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], cuda.blockIdx.y * AV_TILE + a.shape[2] - a.shape[1])
    acc = tile_matmul_until(a[h], v[h], row, col, k_end)
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_without_the_offset(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], (cuda.blockIdx.y + 1) * AV_TILE)
    acc = tile_matmul_until(a[h], v[h], row, col, k_end)
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_without_guard(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], (cuda.blockIdx.y + 1) * AV_TILE + a.shape[2] - a.shape[1])
    out[h, row, col] = tile_matmul_until(a[h], v[h], row, col, k_end)


def test_the_causal_av_solution_passes():
    result = check("05_causal_av", causal_av_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (causal_av_every_tile, "no_tiles_skipped"),
    (causal_av_without_the_diagonal, "diagonal_tile_skipped"),
    (causal_av_without_the_offset, "mask_ignores_offset"),
    (causal_av_without_guard, "out_of_bounds"),
])
def test_causal_av_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("05_causal_av", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)
