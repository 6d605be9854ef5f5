"""Notebook 02's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

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
