"""Notebook 04's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint


# --- 04: the row softmax's first-score shift, and the block reduction -------------------------

import math                                                    # noqa: E402
from attention_lib.checks import hint                           # noqa: E402
from attention_lib.checks.ex04_softmax import merge_stats      # noqa: E402
from attention_lib.stages.softmax import THREADS_PER_ROW      # noqa: E402


@cuda.jit
def softmax_shifted_by_the_first_score(s, out):
    """Stable on rows that span about 20; overflows once a row spans far more."""
    row = cuda.grid(1)
    if row < s.shape[0]:
        first = s[row, 0]
        total = np.float32(0.0)
        for j in range(s.shape[1]):
            total += math.exp(s[row, j] - first)
        for j in range(s.shape[1]):
            out[row, j] = math.exp(s[row, j] - first) / total


def test_a_shift_by_the_first_score_is_unstable():
    result = check("04_row_softmax", softmax_shifted_by_the_first_score, verbose=False)
    assert result.diagnosis == "unstable_softmax", result


@cuda.jit
def row_stats_solution(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid], part_l[tid] = merge_stats(part_m[tid], part_l[tid], part_m[tid + stride],
                                                   part_l[tid + stride])
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0]


@cuda.jit
def row_stats_no_round_barrier(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid], part_l[tid] = merge_stats(part_m[tid], part_l[tid], part_m[tid + stride],
                                                   part_l[tid + stride])
        stride //= 2                                       # no barrier between rounds
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0]


@cuda.jit
def row_stats_column_tid_only(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(-math.inf), np.float32(0.0)
    if tid < s.shape[1]:                                   # one column per thread, no stride
        m, l = s[row, tid], np.float32(1.0)
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid], part_l[tid] = merge_stats(part_m[tid], part_l[tid], part_m[tid + stride],
                                                   part_l[tid + stride])
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0]


@cuda.jit
def row_stats_sums_without_rescaling(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid] = max(part_m[tid], part_m[tid + stride])
            part_l[tid] += part_l[tid + stride]            # each l still against its own maximum
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0]


@cuda.jit
def row_stats_starting_from_zero(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(0.0), np.float32(0.0)                # 0 is not neutral for a maximum
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid], part_l[tid] = merge_stats(part_m[tid], part_l[tid], part_m[tid + stride],
                                                   part_l[tid + stride])
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0]


@cuda.jit
def row_stats_of_raw_exponentials(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        m = max(m, s[row, j])
        l += math.exp(s[row, j])                           # no shift: overflows near +1000
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid] = max(part_m[tid], part_m[tid + stride])
            part_l[tid] += part_l[tid + stride]
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0] * math.exp(-part_m[0])


@cuda.jit
def row_stats_barrier_inside_the_round(s, stats):
    part_m = cuda.shared.array(THREADS_PER_ROW, np.float32)
    part_l = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    part_m[tid] = m
    part_l[tid] = l
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            part_m[tid], part_l[tid] = merge_stats(part_m[tid], part_l[tid], part_m[tid + stride],
                                                   part_l[tid + stride])
            cuda.syncthreads()                             # only the threads still merging come
        stride //= 2
    if tid == 0:
        stats[row, 0] = part_m[0]
        stats[row, 1] = part_l[0]


@cuda.jit
def row_stats_stub(s, stats):
    raise NotImplementedError()


def test_the_block_reduction_solution_passes():
    result = check("04_block_reduction", row_stats_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (row_stats_no_round_barrier, "race"),
    (row_stats_column_tid_only, "row_not_strided"),
    (row_stats_sums_without_rescaling, "online_softmax_no_rescale"),
    (row_stats_starting_from_zero, "wrong_neutral_value"),
    (row_stats_of_raw_exponentials, "unstable_softmax"),
    (row_stats_barrier_inside_the_round, "divergent_barrier"),
    (row_stats_stub, "not_implemented"),
])
def test_block_reduction_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("04_block_reduction", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)
