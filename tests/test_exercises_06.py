"""Notebook 06's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint


# --- 06: Q, K and V split out of the fused projection in one launch ---------------------------

@cuda.jit
def split_qkv_solution(qkv, out):
    c, t = cuda.grid(2)
    z = cuda.blockIdx.z
    n_head, d_k = out.shape[2], out.shape[4]
    p, rest = z // (out.shape[1] * n_head), z % (out.shape[1] * n_head)
    b, h = rest // n_head, rest % n_head
    if t < out.shape[3] and c < d_k:
        out[p, b, h, t, c] = qkv[b, t, p * n_head * d_k + h * d_k + c]


@cuda.jit
def split_qkv_interleaved(qkv, out):
    c, t = cuda.grid(2)
    z = cuda.blockIdx.z
    n_head, d_k = out.shape[2], out.shape[4]
    p, rest = z // (out.shape[1] * n_head), z % (out.shape[1] * n_head)
    b, h = rest // n_head, rest % n_head
    if t < out.shape[3] and c < d_k:
        out[p, b, h, t, c] = qkv[b, t, p * n_head * d_k + c * n_head + h]


@cuda.jit
def split_qkv_without_part_offset(qkv, out):
    c, t = cuda.grid(2)
    z = cuda.blockIdx.z
    n_head, d_k = out.shape[2], out.shape[4]
    p, rest = z // (out.shape[1] * n_head), z % (out.shape[1] * n_head)
    b, h = rest // n_head, rest % n_head
    if t < out.shape[3] and c < d_k:
        out[p, b, h, t, c] = qkv[b, t, h * d_k + c]


@cuda.jit
def split_qkv_per_head_layout(qkv, out):
    c, t = cuda.grid(2)
    z = cuda.blockIdx.z
    n_head, d_k = out.shape[2], out.shape[4]
    p, rest = z // (out.shape[1] * n_head), z % (out.shape[1] * n_head)
    b, h = rest // n_head, rest % n_head
    if t < out.shape[3] and c < d_k:
        out[p, b, h, t, c] = qkv[b, t, h * 3 * d_k + p * d_k + c]


@cuda.jit
def split_qkv_without_guard(qkv, out):
    c, t = cuda.grid(2)
    z = cuda.blockIdx.z
    n_head, d_k = out.shape[2], out.shape[4]
    p, rest = z // (out.shape[1] * n_head), z % (out.shape[1] * n_head)
    b, h = rest // n_head, rest % n_head
    out[p, b, h, t, c] = qkv[b, t, p * n_head * d_k + h * d_k + c]


@cuda.jit
def split_qkv_ignoring_the_batch(qkv, out):
    c, t = cuda.grid(2)
    z = cuda.blockIdx.z
    n_head, d_k = out.shape[2], out.shape[4]
    p, h = z // n_head, z % n_head                     # z read as (part, head): the batch forgotten
    if t < out.shape[3] and c < d_k and p < 3:
        out[p, 0, h, t, c] = qkv[0, t, p * n_head * d_k + h * d_k + c]


def test_the_split_qkv_solution_passes():
    result = check("06_split_qkv", split_qkv_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (split_qkv_interleaved, "heads_interleaved", "every n_head-th column"),
    (split_qkv_without_part_offset, "parts_not_offset", "p * d_model"),
    (split_qkv_per_head_layout, "qkv_per_head_layout", "[Q | K | V]"),
    (split_qkv_without_guard, "out_of_bounds", "Guard the index"),
    (split_qkv_ignoring_the_batch, "wrong_values", "never written"),
])
def test_split_qkv_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = check("06_split_qkv", answer, verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "\n" not in str(result)


def test_the_hints_of_06_give_no_code(capsys):
    for exercise_id in ("06_split_heads", "06_split_qkv"):
        hints = EXERCISES[exercise_id].hints
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: where")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
