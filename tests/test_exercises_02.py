"""Notebook 02's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import types

import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check
from attention_lib.stages import scores
from attention_lib.stages.scores import TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


def as_answer(library_kernel):
    """The library's kernel as a student's answer: the same code (the notebook's solution is held
    to it), compiled as a function of its own, so the check does not take it for the library's."""
    fn = library_kernel.py_func
    return cuda.jit(types.FunctionType(fn.__code__, fn.__globals__, "answer", fn.__defaults__, fn.__closure__))


# --- 02_scaled_scores: the warm-up ------------------------------------------------------------

def naive(mistake=None):
    """scores_kernel_v1's body, or the same with one typical mistake."""
    @cuda.jit
    def kernel(q, k, inv_sqrt_dk, s):
        if mistake == "axes_swapped":
            i, j = cuda.grid(2)
        else:
            j, i = cuda.grid(2)
        h = cuda.blockIdx.z
        if mistake == "only_head_zero":
            h = 0
        if mistake != "no_guard" and not (i < s.shape[1] and j < s.shape[2]):
            return
        acc = float32(0.0)
        for c in range(q.shape[2]):
            if mistake == "q_and_k_swapped":
                acc += k[h, i, c] * q[h, j, c]
            elif mistake == "k_as_kt":
                acc += q[h, i, c] * k[h, c, j]       # k read as if it were already K^T
            else:
                acc += q[h, i, c] * k[h, j, c]
        if mistake == "no_scale":
            s[h, i, j] = acc
        elif mistake == "scaled_twice":
            s[h, i, j] = acc * inv_sqrt_dk * inv_sqrt_dk
        elif mistake == "divides_by_d_k":
            s[h, i, j] = acc / q.shape[2]
        else:
            s[h, i, j] = acc * inv_sqrt_dk
    return kernel


def test_02_the_library_kernel_is_the_warm_up_solution():
    assert EXERCISES["02_scaled_scores"].solution is scores.scores_kernel_v1
    assert verdict("02_scaled_scores", as_answer(scores.scores_kernel_v1)).diagnosis == "ok"
    assert verdict("02_scaled_scores", scores.scores_kernel_v1).diagnosis == "calls_given_code"


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("no_scale", "missing_scale", "without the scale"),
    ("scaled_twice", "scaled_by_d_k", "applied twice"),
    ("divides_by_d_k", "scaled_by_d_k", "not by sqrt(d_k)"),
    ("q_and_k_swapped", "transposed", "q and k are swapped"),
    ("k_as_kt", "transposed", "Q K, not Q K^T"),
    ("axes_swapped", "grid_axes_swapped", "taken from the grid's x axis"),
    ("no_guard", "out_of_bounds", "out-of-bounds "),
    ("only_head_zero", "race", "blocks never wait for each other"),     # every block writes the same elements: an inter-block race
])
def test_02_scaled_scores(mistake, diagnosis, says):
    result = verdict("02_scaled_scores", naive(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


@cuda.jit
def naive_in_float64(q, k, inv_sqrt_dk, s):
    """The warm-up's solution with its sum begun as a Python float: float64 on a GPU."""
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2]:
        acc = 0.0
        for c in range(q.shape[2]):
            acc += q[h, i, c] * k[h, j, c]
        s[h, i, j] = acc * inv_sqrt_dk


def test_02_a_python_float_in_the_warm_up_is_float64_arithmetic():
    result = verdict("02_scaled_scores", naive_in_float64)
    assert result.diagnosis == "float64_arithmetic" and "acc = 0.0" in result.message, result.message


def test_02_swapped_q_and_k_are_named_on_the_square_case():
    result = verdict("02_scaled_scores", naive("q_and_k_swapped"))
    assert "T_q = 7, T_k = 7, d_k = 7" in result.message


# --- 02_scores_kt: the main exercise ------------------------------------------------------------

def scores_kt(mistake=None):
    """The solution of 02_scores_kt, or the same with one typical mistake."""
    @cuda.jit
    def kernel(q, kt, inv_sqrt_dk, s):
        q_tile = cuda.shared.array((TILE, TILE), float32)
        kt_tile = cuda.shared.array((TILE, TILE), float32)
        j, i = cuda.grid(2)
        h = cuda.blockIdx.z
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        q_scale = float32(1.0) if mistake in ("no_scale", "scale_in_kt", "scale_at_end", "scale_per_term") \
            else inv_sqrt_dk
        kt_scale = inv_sqrt_dk if mistake in ("scale_in_kt", "scale_twice") else float32(1.0)
        acc = float32(0.0)
        if mistake == "zeroed_once":               # the tiles zeroed before the loop, not at every step
            q_tile[ty, tx] = float32(0.0)
            kt_tile[ty, tx] = float32(0.0)
        steps = q.shape[2] + 1 if mistake == "extra_step" else q.shape[2]
        for c0 in range(0, steps, TILE):
            q_ok = i < q.shape[1] and c0 + tx < q.shape[2]
            kt_ok = c0 + ty < kt.shape[1] and j < kt.shape[2]
            if mistake in ("no_zero_fill", "zeroed_once", "bounded_loop"):
                if q_ok:
                    q_tile[ty, tx] = q[h, i, c0 + tx] * q_scale
                if kt_ok:
                    kt_tile[ty, tx] = kt[h, c0 + ty, j] * kt_scale
            elif mistake == "uncoalesced":         # right values, but a warp walks down kt's columns
                key = cuda.blockIdx.x * TILE + ty
                ok = c0 + tx < kt.shape[1] and key < kt.shape[2]
                kt_tile[tx, ty] = kt[h, c0 + tx, key] if ok else float32(0.0)
                q_tile[ty, tx] = q[h, i, c0 + tx] * q_scale if q_ok else float32(0.0)
            elif mistake == "uncoalesced_q":       # right values, but a warp walks down q's columns
                row = cuda.blockIdx.y * TILE + tx
                ok = row < q.shape[1] and c0 + ty < q.shape[2]
                q_tile[tx, ty] = q[h, row, c0 + ty] * q_scale if ok else float32(0.0)
                kt_tile[ty, tx] = kt[h, c0 + ty, j] if kt_ok else float32(0.0)
            else:
                q_tile[ty, tx] = q[h, i, c0 + tx] * q_scale if q_ok else float32(0.0)
                kt_tile[ty, tx] = kt[h, c0 + ty, j] * kt_scale if kt_ok else float32(0.0)
            if mistake == "barrier_in_if":
                if i < q.shape[1]:
                    cuda.syncthreads()
            elif mistake != "no_first_barrier":
                cuda.syncthreads()
            width = min(TILE, q.shape[2] - c0) if mistake == "bounded_loop" else TILE
            for cc in range(width):
                if mistake == "untiled":
                    if c0 + cc < q.shape[2] and i < q.shape[1] and j < kt.shape[2]:
                        acc += q[h, i, c0 + cc] * q_scale * kt[h, c0 + cc, j]
                elif mistake == "scale_per_term":
                    acc += q_tile[ty, cc] * kt_tile[cc, tx] * inv_sqrt_dk
                else:
                    acc += q_tile[ty, cc] * kt_tile[cc, tx]
            if mistake != "no_second_barrier":
                cuda.syncthreads()
        if i < s.shape[1] and j < s.shape[2]:
            s[h, i, j] = acc * inv_sqrt_dk if mistake == "scale_at_end" else acc
    return kernel


@cuda.jit
def scores_kt_in_float64(q, kt, inv_sqrt_dk, s):
    """The solution with its sum begun as a Python float: float64 on a GPU."""
    q_tile = cuda.shared.array((TILE, TILE), float32)
    kt_tile = cuda.shared.array((TILE, TILE), float32)
    j, i = cuda.grid(2)
    h, tx, ty = cuda.blockIdx.z, cuda.threadIdx.x, cuda.threadIdx.y
    acc = 0.0
    for c0 in range(0, q.shape[2], TILE):
        inside = i < q.shape[1] and c0 + tx < q.shape[2]
        q_tile[ty, tx] = q[h, i, c0 + tx] * inv_sqrt_dk if inside else float32(0.0)
        inside = c0 + ty < kt.shape[1] and j < kt.shape[2]
        kt_tile[ty, tx] = kt[h, c0 + ty, j] if inside else float32(0.0)
        cuda.syncthreads()
        for c in range(TILE):
            acc += q_tile[ty, c] * kt_tile[c, tx]
        cuda.syncthreads()
    if i < q.shape[1] and j < kt.shape[2]:
        s[h, i, j] = acc


def test_02_the_library_kernel_is_the_main_solution():
    assert EXERCISES["02_scores_kt"].solution is scores.scores_kt_kernel
    assert verdict("02_scores_kt", as_answer(scores.scores_kt_kernel)).diagnosis == "ok"


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("bounded_loop", "ok", "correct at every size"),      # no zero fill, the sum stops at d_k: right too
    ("no_scale", "missing_scale", "without the scale"),
    ("scale_twice", "scale_applied_twice", "applied twice"),
    ("scale_in_kt", "scale_not_folded", "one holds them unscaled"),
    ("scale_at_end", "scale_not_folded", "one holds them unscaled"),
    ("scale_per_term", "scale_not_folded", "one holds them unscaled"),
    ("no_zero_fill", "stale_tile", "which no thread of its block had written"),
    ("zeroed_once", "edge_not_zeroed", "still held an earlier step's value"),
    ("no_first_barrier", "race", "race on shared"),
    ("no_second_barrier", "race", "race on shared"),
    ("barrier_in_if", "divergent_barrier", "undefined on a GPU"),
    ("untiled", "no_reuse", "an element of q was read up to 2 times from global memory, where the limit is 1"),
    ("uncoalesced", "uncoalesced", "a warp's load of kt"),
    ("uncoalesced_q", "uncoalesced", "a warp's load of q"),
    ("extra_step", "extra_barriers", "passed 4 barriers, where the limit is 2"),
])
def test_02_scores_kt(mistake, diagnosis, says):
    result = verdict("02_scores_kt", scores_kt(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_02_a_python_float_in_the_sum_is_float64_arithmetic():
    result = verdict("02_scores_kt", scores_kt_in_float64)
    assert result.diagnosis == "float64_arithmetic", result.message
    assert "acc = 0.0" in result.message, result.message


def test_02_the_cases_reach_every_edge_of_the_tile():
    """Partly used and whole tiles along T_q, T_k and d_k, and d_k a whole number of steps."""
    cases = EXERCISES["02_scores_kt"].cases_for("simulator")
    for axis in (1, 2, 3):                                 # T_q, T_k, d_k
        assert {c[axis] % TILE for c in cases} >= {0, 1}, axis
    assert any(c[3] > TILE and c[3] % TILE == 1 for c in cases)     # a last step of one column


@pytest.mark.parametrize("exercise_id", ["02_scaled_scores", "02_scores_kt"])
def test_02_hints_name_the_idea_then_the_plan_then_where_answers_go_wrong(exercise_id):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) == 3 and hints[1].startswith("the plan") and hints[2].startswith("where answers go wrong")
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text
