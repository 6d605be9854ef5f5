"""Notebook 11's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line.

The solutions below are the library's code (the notebook's solution cells), copied: the library's
own kernel would be refused as given code.
"""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, mutation
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
def queries_along_x(p, dp, d_rows, scale, d_raw):         # right values on square heads, not coalesced
    i, j = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
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
    (queries_along_x, "uncoalesced"),
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
    "dp_over_d_k": SOLUTION.replace("row_dot(v_row, do_tile, r, d_v)", "row_dot(v_row, do_tile, r, d_k)"),
    "unstable_softmax": SOLUTION.replace("math.exp(s - stats[0, r])", "math.exp(s) / math.exp(stats[0, r])"),
    "wrong_values": SOLUTION.replace("row_dot(v_row, do_tile, r, d_v)", "row_dot(k_row, do_tile, r, d_v)"),
    "not_implemented": "    raise NotImplementedError()",
}
# Verdicts the engine gives, with what the message must say: reads of the tiles' padding or of rows
# never loaded (stale_tile, deterministic now that shared memory starts as NaN), a row count tied to
# the simulator's tile of 16.
ENGINE_VERDICTS = {
    "rows past the range": (SOLUTION.replace("range(rows_from, rows_to)", "range(rows_from, rows_to + 1)"),
                            "stale_tile", "read q_tile[1, 0]"),
    "score over d_v columns": (SOLUTION.replace("row_dot(k_row, q_tile, r, d_k)", "row_dot(k_row, q_tile, r, d_v)"),
                               "stale_tile", "read q_tile[0, 5]"),
    "one dV column too many": (SOLUTION.replace("for c in range(d_v):", "for c in range(d_v + 1):"),
                               "stale_tile", "which no thread of its block had written"),
    "one dK column too many": (SOLUTION.replace("for c in range(d_k):", "for c in range(d_k + 1):"),
                               "stale_tile", "which no thread of its block had written"),
    "the simulator's tile": (SOLUTION.replace("range(rows_from, rows_to)", "range(rows_from, min(rows_to, 16))"),
                             "wrong_values", "with a GPU's launch"),
}


def tile_answer(body):
    """A device function with dkdv_tile's contract, made from `body`, as a notebook cell makes one."""
    namespace = {"cuda": cuda, "math": math, "np": np, "row_dot": row_dot}
    exec(TILE.format(body), namespace)
    return namespace["tile"]


def test_the_dkdv_tile_solution_passes():
    result = verdict("11_dkdv_tile", tile_answer(SOLUTION))
    assert result.passed and result.diagnosis == "ok", result
    assert "with the simulator's launch sizes and a GPU's" in result.message
    copy = verdict("11_dkdv_tile", mutation.solution_copy(EXERCISES["11_dkdv_tile"]))
    assert copy.passed and "Not compiled" not in copy.message, copy      # compiled for sm_90, no float64


def test_the_cases_reach_the_tiles_of_both_launches():
    from attention_lib.checks import shapes
    for configuration, tile in ((shapes.SIMULATOR, 16), (shapes.GPU, 32)):
        cases = EXERCISES["11_dkdv_tile"].cases_for(configuration)
        assert any(c.T_q > tile + 1 and c.T_k > tile + 1 for c in cases)    # a second, partial tile both ways
        assert any(c.T_q > c.T_k for c in cases) and any(c.large for c in cases)
        assert any(c.d_k < c.d_v for c in cases) and any(c.d_k > c.d_v for c in cases)


def test_every_named_tile_mistake_is_planted():
    assert set(EXERCISES["11_dkdv_tile"].diagnoses) <= set(PLANTED)


@pytest.mark.parametrize("diagnosis", sorted(PLANTED))
def test_dkdv_tile_mistakes_get_their_diagnosis(diagnosis):
    result = verdict("11_dkdv_tile", tile_answer(PLANTED[diagnosis]))
    assert (result.passed, result.diagnosis) == (False, diagnosis), result


@pytest.mark.parametrize("name", sorted(ENGINE_VERDICTS))
def test_dkdv_tile_mistakes_the_engine_names(name):
    body, diagnosis, says = ENGINE_VERDICTS[name]
    first = verdict("11_dkdv_tile", tile_answer(body))
    assert (first.passed, first.diagnosis) == (False, diagnosis) and says in first.message, first.message
    assert str(verdict("11_dkdv_tile", tile_answer(body))) == str(first)        # the same verdict every time


def test_the_unstable_exponential_is_named_as_a_gpu_would_fail():
    result = verdict("11_dkdv_tile", tile_answer(PLANTED["unstable_softmax"]))
    assert "scores up to 1200" in result.message and "exp of a float32 past 88.7 is inf" in result.message
    assert "OverflowError" in result.message


def test_the_library_tile_and_its_twin_are_refused_as_given_code():
    assert verdict("11_dkdv_tile", backward.dkdv_tile).diagnosis == "calls_given_code"
    uses_the_dq_tile = tile_answer("    backward.dq_tile(q_tile, do_tile, rows_from, rows_to, k_row, v_row, "
                                   "stats[0, 0], stats[1, 0], dk_acc, scale, d_k, d_v)")
    uses_the_dq_tile.py_func.__globals__["backward"] = backward
    assert verdict("11_dkdv_tile", uses_the_dq_tile).diagnosis == "calls_given_code"


def test_the_kernel_around_an_answer_is_the_librarys_kernel(monkeypatch):
    """dkdv_kernel_with compiles the library's dK/dV kernel's own code, with the answer in the tile's place,
    at the tile sizes the module holds when asked."""
    answer = tile_answer(SOLUTION)
    built = backward.dkdv_kernel_with(answer)
    assert built.py_func.__code__ is backward.flash_backward_dkdv_kernel.py_func.__code__
    assert built.py_func.__globals__["dkdv_tile"] is answer
    assert built.py_func.__globals__["BLOCK_Q"] == backward.BLOCK_Q
    assert backward.dkdv_kernel_with(backward.dkdv_tile) is backward.flash_backward_dkdv_kernel
    monkeypatch.setattr(backward, "BLOCK_Q", 32)
    monkeypatch.setattr(backward, "BLOCK_K", 32)
    assert backward.dkdv_kernel_with(answer).py_func.__globals__["BLOCK_K"] == 32


# --- 11x_group_sum (the deep dive's): a shared K/V head's gradient sums its group ----------------

@cuda.jit
def group_sum_solution(per_head, shared):
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e // shared.shape[2], e % shared.shape[2]
    if t < shared.shape[1]:
        group = per_head.shape[0] // shared.shape[0]
        total = np.float32(0.0)
        for r in range(group):
            total += per_head[g * group + r, t, c]
        shared[g, t, c] = total


@cuda.jit
def group_interleaved(per_head, shared):
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e // shared.shape[2], e % shared.shape[2]
    if t < shared.shape[1]:
        group = per_head.shape[0] // shared.shape[0]
        total = np.float32(0.0)
        for r in range(group):
            total += per_head[g + r * shared.shape[0], t, c]
        shared[g, t, c] = total


@cuda.jit
def group_not_summed(per_head, shared):
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e // shared.shape[2], e % shared.shape[2]
    if t < shared.shape[1]:
        group = per_head.shape[0] // shared.shape[0]
        shared[g, t, c] = per_head[g * group, t, c]


@cuda.jit
def group_sum_transposed_threads(per_head, shared):       # neighbouring threads d elements apart
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e % shared.shape[1], e // shared.shape[1]
    if c < shared.shape[2]:
        group = per_head.shape[0] // shared.shape[0]
        total = np.float32(0.0)
        for r in range(group):
            total += per_head[g * group + r, t, c]
        shared[g, t, c] = total


@cuda.jit
def group_sum_every_thread_sums(per_head, shared):        # thread (g, t, c) of each head sums, one writes
    e, g = cuda.grid(1), cuda.blockIdx.y
    group = per_head.shape[0] // shared.shape[0]
    t, c = e // shared.shape[2] % shared.shape[1], e % shared.shape[2]
    r0 = e // (shared.shape[1] * shared.shape[2])
    if r0 < group:
        total = np.float32(0.0)
        for r in range(group):
            total += per_head[g * group + r, t, c]
        if r0 == 0:
            shared[g, t, c] = total


@cuda.jit
def group_sum_float64(per_head, shared):
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e // shared.shape[2], e % shared.shape[2]
    if t < shared.shape[1]:
        group = per_head.shape[0] // shared.shape[0]
        total = 0.0
        for r in range(group):
            total += per_head[g * group + r, t, c]
        shared[g, t, c] = total


@cuda.jit
def group_sum_unguarded(per_head, shared):
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e // shared.shape[2], e % shared.shape[2]
    group = per_head.shape[0] // shared.shape[0]
    total = np.float32(0.0)
    for r in range(group):
        total += per_head[g * group + r, t, c]
    shared[g, t, c] = total


def test_the_group_sum_solution_passes():
    result = verdict("11x_group_sum", group_sum_solution)
    assert result.passed and result.diagnosis == "ok", result
    assert verdict("11x_group_sum", mutation.solution_copy(EXERCISES["11x_group_sum"])).passed


@pytest.mark.parametrize("answer, diagnosis, says", [
    (group_interleaved, "group_interleaved", "K/V head g summed query heads g, g + BH_kv"),
    (group_not_summed, "group_not_summed", "only the first query head of its group"),
    (group_sum_transposed_threads, "uncoalesced", "segments of 128 bytes"),
    (group_sum_every_thread_sums, "no_reuse", "an element of per_head was read up to"),
    (group_sum_float64, "float64_arithmetic", "computes in float64"),
    (group_sum_unguarded, "out_of_bounds", "out-of-bounds"),
])
def test_group_sum_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("11x_group_sum", answer)
    assert (result.passed, result.diagnosis) == (False, diagnosis) and says in result.message, result.message


def test_the_library_group_sum_is_refused_as_given_code():
    assert verdict("11x_group_sum", backward.group_sum_kernel).diagnosis == "calls_given_code"
