"""Notebook 11's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line.

The solutions below are the library's code (the notebook's solution cells), copied: the library's
own kernel would be refused as given code.
"""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check
from attention_lib.stages import backward
from attention_lib.stages.kv_cache import row_dot


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 11_score_grad (warm-up): dS of the softmax's backward, one thread per entry ---------------

@cuda.jit
def score_grad_solution(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = scale * p[h, i, j] * (dp[h, i, j] - d_rows[h, i])


@cuda.jit
def forgets_p_on_the_row_sum(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = scale * (p[h, i, j] * dp[h, i, j] - d_rows[h, i])


@cuda.jit
def no_row_sum(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = scale * p[h, i, j] * dp[h, i, j]


@cuda.jit
def reads_p_transposed(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = scale * p[h, j, i] * (dp[h, i, j] - d_rows[h, i])


@cuda.jit
def no_scale(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = p[h, i, j] * (dp[h, i, j] - d_rows[h, i])


@cuda.jit
def scale_twice(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = scale * scale * p[h, i, j] * (dp[h, i, j] - d_rows[h, i])


@cuda.jit
def divides_by_the_scale(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = p[h, i, j] * (dp[h, i, j] - d_rows[h, i]) / scale


@cuda.jit
def scales_dp_only(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = p[h, i, j] * (scale * dp[h, i, j] - d_rows[h, i])


@cuda.jit
def scales_the_row_sum_only(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = p[h, i, j] * (dp[h, i, j] - scale * d_rows[h, i])


@cuda.jit
def no_guard(p, dp, d_rows, scale, d_raw):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    d_raw[h, i, j] = scale * p[h, i, j] * (dp[h, i, j] - d_rows[h, i])


@cuda.jit
def score_grad_stub(p, dp, d_rows, scale, d_raw):
    raise NotImplementedError()


def test_the_score_grad_solution_passes():
    result = verdict("11_score_grad", score_grad_solution)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (forgets_p_on_the_row_sum, "gradient_to_masked_keys"),
    (no_row_sum, "missing_row_sum"),
    (reads_p_transposed, "transposed_p"),
    (no_scale, "missing_scale"),
    (scale_twice, "scale_applied_twice"),
    (divides_by_the_scale, "scale_inverted"),
    (scales_dp_only, "scale_on_one_term"),
    (scales_the_row_sum_only, "scale_on_one_term"),
    (no_guard, "out_of_bounds"),
    (score_grad_stub, "not_implemented"),
])
def test_score_grad_mistakes_get_their_diagnosis(answer, diagnosis):
    result = verdict("11_score_grad", answer)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result


def test_the_library_score_grad_kernel_is_refused_as_given_code():
    assert verdict("11_score_grad", backward.score_grad_kernel).diagnosis == "calls_given_code"


# --- 11_dkdv_tile (main): the fused dK/dV pass's tile -------------------------------------------

TILE = '''
@cuda.jit(device=True)
def tile(q_tile, do_tile, stats, rows_from, rows_to, k_row, v_row, dk_acc, dv_acc, scale, d_k, d_v):
{}
'''
SOLUTION = '''    for r in range(rows_from, rows_to):
        s = row_dot(k_row, q_tile, r, d_k) * scale
        p = math.exp(s - stats[0, r])
        ds = p * (row_dot(v_row, do_tile, r, d_v) - stats[1, r])
        for c in range(d_v):
            dv_acc[c] += p * do_tile[r, c]
        for c in range(d_k):
            dk_acc[c] += ds * q_tile[r, c]'''
PLANTED = {
    "lse_not_subtracted": SOLUTION.replace("math.exp(s - stats[0, r])", "math.exp(s)"),
    "scores_not_scaled": SOLUTION.replace(" * scale\n", "\n"),
    "lse_and_d_swapped": SOLUTION.replace("stats[0, r]", "LSE").replace("stats[1, r]", "stats[0, r]")
                                 .replace("LSE", "stats[1, r]"),
    "missing_row_sum": SOLUTION.replace(" - stats[1, r])", ")"),
    "row_sum_not_weighted": SOLUTION.replace("ds = p * (row_dot(v_row, do_tile, r, d_v) - stats[1, r])",
                                             "ds = p * row_dot(v_row, do_tile, r, d_v) - stats[1, r]"),
    "dv_weighted_by_ds": SOLUTION.replace("dv_acc[c] += p *", "dv_acc[c] += ds *"),
    "dk_weighted_by_p": SOLUTION.replace("dk_acc[c] += ds *", "dk_acc[c] += p *"),
    "p_and_ds_swapped": SOLUTION.replace("dv_acc[c] += p *", "dv_acc[c] += ds *")
                                .replace("dk_acc[c] += ds *", "dk_acc[c] += p *"),
    "dk_scaled_twice": SOLUTION.replace("dk_acc[c] += ds * q_tile[r, c]", "dk_acc[c] += ds * q_tile[r, c] * scale"),
    "mask_ignored": SOLUTION.replace("range(rows_from, rows_to)", "range(rows_to)"),
    "wrong_values": SOLUTION.replace("row_dot(v_row, do_tile, r, d_v)", "row_dot(k_row, do_tile, r, d_v)"),
    "not_implemented": "    raise NotImplementedError()",
}


def tile_answer(body):
    """A device function with dkdv_tile's contract, made from `body`, as a notebook cell makes one."""
    namespace = {"cuda": cuda, "math": math, "np": np, "row_dot": row_dot}
    exec(TILE.format(body), namespace)
    return namespace["tile"]


def test_the_dkdv_tile_solution_passes():
    result = verdict("11_dkdv_tile", tile_answer(SOLUTION))
    assert result.passed and result.diagnosis == "ok", result


def test_every_named_tile_mistake_is_planted():
    assert set(EXERCISES["11_dkdv_tile"].diagnoses) <= set(PLANTED)


@pytest.mark.parametrize("diagnosis", sorted(PLANTED))
def test_dkdv_tile_mistakes_get_their_diagnosis(diagnosis):
    result = verdict("11_dkdv_tile", tile_answer(PLANTED[diagnosis]))
    assert (result.passed, result.diagnosis) == (False, diagnosis), result


def test_the_library_tile_and_its_twin_are_refused_as_given_code():
    assert verdict("11_dkdv_tile", backward.dkdv_tile).diagnosis == "calls_given_code"
    uses_the_dq_tile = tile_answer("    backward.dq_tile(q_tile, do_tile, rows_from, rows_to, k_row, v_row, "
                                   "stats[0, 0], stats[1, 0], dk_acc, scale, d_k, d_v)")
    uses_the_dq_tile.py_func.__globals__["backward"] = backward
    assert verdict("11_dkdv_tile", uses_the_dq_tile).diagnosis == "calls_given_code"


def test_the_kernel_around_an_answer_is_the_librarys_kernel():
    """dkdv_kernel_with compiles the library's dK/dV kernel's own code, with the answer in the tile's place."""
    answer = tile_answer(SOLUTION)
    built = backward.dkdv_kernel_with(answer)
    assert built.py_func.__code__ is backward.flash_backward_dkdv_kernel.py_func.__code__
    assert built.py_func.__globals__["dkdv_tile"] is answer
    assert backward.dkdv_kernel_with(backward.dkdv_tile) is backward.flash_backward_dkdv_kernel
