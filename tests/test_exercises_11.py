"""Notebook 11's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line.

The solutions below are the library's code (the notebook's solution cells), copied: the library's
own kernel would be refused as given code.
"""

import inspect
import linecache
import math
import re

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, ex11_dkdv_pass, mutation
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
def lane_0_walks_its_blocks_row(p, dp, d_rows, scale, d_raw):
    """Right values, coalesced enough: but lane 0 of each row of a block writes the block's 16 entries."""
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and cuda.threadIdx.x == 0:
        for jj in range(j, min(j + cuda.blockDim.x, p.shape[2])):
            d_raw[h, i, jj] = scale * p[h, i, jj] * (dp[h, i, jj] - d_rows[h, i])


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
    (lane_0_walks_its_blocks_row, "serial_copy"),
    (score_grad_stub, "not_implemented"),
])
def test_score_grad_mistakes_get_their_diagnosis(answer, diagnosis):
    result = verdict("11_score_grad", answer)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result


def test_the_library_score_grad_kernel_is_refused_as_given_code():
    assert verdict("11_score_grad", backward.score_grad_kernel).diagnosis == "calls_given_code"


# --- 11_dkdv_pass (main): the walk of the dK/dV pass over the query tiles ---------------------------

# A right answer in another style: the walk by tile number from its first query, its own copies (a
# lane per element, the rows' lse and D by the first threads), each row tested for key j, dV and dK
# summed in one loop.
OTHER = """
@cuda.jit(device=True)
def answer(q, d_out, lse, d_rows, t_k, q_tile, do_tile, stats, k_row, v_row, dk_acc, dv_acc, scale):
    T_q, dk_w, dv_w = q.shape[1], q.shape[2], d_out.shape[2]
    h, x = cuda.blockIdx.y, cuda.threadIdx.x
    key = cuda.blockIdx.x * BLOCK_K + x
    lowest = cuda.blockIdx.x * BLOCK_K - (t_k - T_q)
    if lowest < 0:
        lowest = 0
    for t in range(lowest // BLOCK_Q, (T_q + BLOCK_Q - 1) // BLOCK_Q):
        base = t * BLOCK_Q
        rows = min(BLOCK_Q, T_q - base)
        for e in range(x, rows * dk_w, BLOCK_K):
            q_tile[e // dk_w, e % dk_w] = q[h, base + e // dk_w, e % dk_w]
        for e in range(x, rows * dv_w, BLOCK_K):
            do_tile[e // dv_w, e % dv_w] = d_out[h, base + e // dv_w, e % dv_w]
        if x < rows:
            stats[0, x] = lse[h, base + x]
            stats[1, x] = d_rows[h, base + x]
        cuda.syncthreads()
        for r in range(rows):
            if key < t_k and key <= base + r + t_k - T_q:
                score = np.float32(0.0)
                grad = np.float32(0.0)
                for c in range(dk_w):
                    score += q_tile[r, c] * k_row[c]
                for c in range(dv_w):
                    grad += do_tile[r, c] * v_row[c]
                w = math.exp(scale * score - stats[0, r])
                dsc = w * (grad - stats[1, r])
                for c in range(MAX_D):
                    if c < dv_w:
                        dv_acc[c] += w * do_tile[r, c]
                    if c < dk_w:
                        dk_acc[c] += dsc * q_tile[r, c]
        cuda.syncthreads()
"""
_ANSWERS = []


def pass_answer(source):
    """A walk made from `source`, as a notebook cell makes one (the tile constants and helpers imported)."""
    namespace = {"cuda": cuda, "math": math, "np": np, "BLOCK_Q": backward.BLOCK_Q, "BLOCK_K": backward.BLOCK_K,
                 "MAX_D": backward.MAX_D, "row_dot": row_dot, "add_row": backward.add_row}
    label = f"<answer {len(_ANSWERS)}>"
    _ANSWERS.append(label)
    linecache.cache[label] = (len(source), None, source.splitlines(keepends=True), label)   # the compiler reads it
    exec(compile(source, label, "exec"), namespace)
    return namespace["answer"]


def changed(source, *edits):
    """`source` with each (old, new) edit made; each old must be there."""
    for old, new in edits:
        assert old in source, old
        source = source.replace(old, new)
    return source


SOLUTION = inspect.getsource(backward.dkdv_walk.py_func).replace("def dkdv_walk(", "def answer(")
ROWS = "range(max(0, seen_from + tid - i0), n)"
WALK = "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, t_q, BLOCK_Q)"
NEXT_COPY = "        cuda.syncthreads()                                      # wait: all are done with them before the next copy\n"
DS = "p * (row_dot(v_row, do_tile, r, d_v) - stats[1, r])"
Q_COPY = "range(tid, n * d_k, BLOCK_K)"
EXP = "math.exp(scale * score - stats[0, r])"
PLANTED = {
    "diagonal_skipped": changed(SOLUTION, (ROWS, "range(max(0, seen_from + tid - i0 + 1), n)")),
    "last_query_row_skipped": changed(SOLUTION, (ROWS, "range(max(0, seen_from + tid - i0), n - 1)")),
    "first_query_row_skipped": changed(SOLUTION, (ROWS, "range(max(1, seen_from + tid - i0), n)")),
    "first_query_tile_skipped": changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q + BLOCK_Q, t_q, BLOCK_Q)")),
    "last_query_tile_skipped": changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, (t_q - 1) // BLOCK_Q * BLOCK_Q, BLOCK_Q)")),
    "offset_ignored": changed(SOLUTION, ("seen_from = cuda.blockIdx.x * BLOCK_K - (t_k - t_q)", "seen_from = cuda.blockIdx.x * BLOCK_K")),
    "masked_pairs_folded": changed(SOLUTION, (ROWS, "range(n)")),
    "tile_above_diagonal": changed(SOLUTION, (WALK, "range(0, t_q, BLOCK_Q)")),
    "head_ignored": changed(SOLUTION, ("cuda.blockIdx.y, cuda.threadIdx.x", "0, cuda.threadIdx.x")),
    "block_ignored": changed(SOLUTION, ("seen_from = cuda.blockIdx.x * BLOCK_K - (t_k - t_q)", "seen_from = -(t_k - t_q)")),
    "dk_scaled_twice": changed(SOLUTION, (DS, DS + " * scale")),
    "lse_not_subtracted": changed(OTHER, (EXP, "math.exp(scale * score)")),
    "scores_not_scaled": changed(OTHER, (EXP, "math.exp(score - stats[0, r])")),
    "lse_and_d_swapped": changed(OTHER, ("stats[0, x] = lse", "stats[1, x] = lse"), ("stats[1, x] = d_rows", "stats[0, x] = d_rows")),
    "missing_row_sum": changed(OTHER, ("w * (grad - stats[1, r])", "w * grad")),
    "row_sum_not_weighted": changed(OTHER, ("w * (grad - stats[1, r])", "w * grad - stats[1, r]")),
    "dv_weighted_by_ds": changed(OTHER, ("dv_acc[c] += w * do_tile[r, c]", "dv_acc[c] += dsc * do_tile[r, c]")),
    "dk_weighted_by_p": changed(OTHER, ("dk_acc[c] += dsc * q_tile[r, c]", "dk_acc[c] += w * q_tile[r, c]")),
    "p_and_ds_swapped": changed(OTHER, ("dv_acc[c] += w * do_tile[r, c]", "dv_acc[c] += dsc * do_tile[r, c]"),
                                ("dk_acc[c] += dsc * q_tile[r, c]", "dk_acc[c] += w * q_tile[r, c]")),
    "unstable_softmax": changed(OTHER, (EXP, "math.exp(scale * score) / math.exp(stats[0, r])")),
    "walk_stops_early": changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, "
                                                 "min(t_q, max(0, seen_from) // BLOCK_Q * BLOCK_Q + 2 * BLOCK_Q), BLOCK_Q)")),
    "walk_ends_at_t_k": changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, t_k, BLOCK_Q)")),
    "tile_size_written_as_number": changed(SOLUTION, ("n = min(BLOCK_Q, t_q - i0)", "n = min(16, t_q - i0)")),
    # one query short at either end of the band of queries that see key j (once called wrong_values, and
    # last_query_tile_skipped where the last tile holds only the last query)
    "band_starts_one_late": changed(SOLUTION, (ROWS, "range(max(0, seen_from + tid - i0) + 1, n)")),
    "band_ends_one_short": changed(SOLUTION, (ROWS, "range(max(0, seen_from + tid - i0), min(n, t_q - 1 - i0))")),
    # the walk from the last tile back to the first, its step left positive: no step (once a bare "got 0")
    "walk_never_ran": changed(SOLUTION, (WALK, "range((t_q - 1) // BLOCK_Q * BLOCK_Q, max(0, seen_from) // BLOCK_Q "
                                               "* BLOCK_Q - 1, BLOCK_Q)")),
}
# The usual wrong answers of the design, with the verdict and what its message must say.
DESIGN = {
    "tile copied by one thread": (changed(SOLUTION, (Q_COPY, "range(n * d_k if tid == 0 else 0)")),
                                  "serial_copy", "load instructions of q"),
    "q read by every thread": (changed(SOLUTION, ("row_dot(k_row, q_tile, r, d_k)", "row_dot(k_row, q[h], i0 + r, d_k)")),
                               "no_reuse", "times from global memory: stage each query tile's q in shared memory once"),
    "every tile walked": (PLANTED["tile_above_diagonal"], "tile_above_diagonal",
                          "block (1, 0, 0) (keys 16-16 of head 0) loaded q of query 0, in query tile 0 (queries 0-15), "
                          "whose queries see none of its keys"),
    "blockIdx.y dropped": (changed(SOLUTION, ("cuda.blockIdx.y, cuda.threadIdx.x", "0, cuda.threadIdx.x")),
                           "head_ignored", "(BH 2,"),
    "blockIdx.x dropped": (changed(SOLUTION, ("seen_from = cuda.blockIdx.x * BLOCK_K - (t_k - t_q)", "seen_from = -(t_k - t_q)")),
                           "block_ignored", "(BH 2,"),
    "threads hard-coded at 16": (changed(SOLUTION, (Q_COPY, "range(tid, n * d_k, 16)")), "race", "with a GPU's launch"),
    "tile rows hard-coded at 16": (changed(SOLUTION, (WALK, "range(max(0, seen_from) // 16 * 16, t_q, 16)"),
                                           ("n = min(BLOCK_Q, t_q - i0)", "n = min(16, t_q - i0)")),
                                   "tile_size_written_as_number", "BLOCK_Q and BLOCK_K are 32, 16 on the simulator"),
    "tile step hard-coded at 16": (changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, t_q, 16)")),
                                   "tile_size_written_as_number", "the walk's step came out as 16 queries"),
    "walk capped at its first tile plus 3": (
        changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, "
                                 "min(t_q, max(0, seen_from) // BLOCK_Q * BLOCK_Q + 3 * BLOCK_Q), BLOCK_Q)")),
        "walk_stops_early", "stopped after 3 query tiles from its first"),
    "walk stopped a tile past the diagonal band": (
        changed(SOLUTION, (WALK, "range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, "
                                 "min(t_q, (seen_from + BLOCK_K - 1) // BLOCK_Q * BLOCK_Q + 2 * BLOCK_Q), BLOCK_Q)")),
        "walk_stops_early", "before T_q's last query tile"),
    "rows past the tile read": (changed(SOLUTION, (ROWS, "range(max(0, seen_from + tid - i0), BLOCK_Q)")),
                                "stale_tile", "which no thread of its block had written"),
    "the barrier inside a guard": (changed(SOLUTION, (NEXT_COPY, "        if tid < n:\n            cuda.syncthreads()\n")),
                                   "divergent_barrier", ""),
    "no barrier before the next copy": (changed(SOLUTION, (NEXT_COPY, "")), "race", "race on shared"),
    "the walk's step of the wrong sign": (PLANTED["walk_never_ran"], "walk_never_ran",
                                          "at (BH 2, T_q 17, T_k 17, d_k 2, d_v 3): dK and dV came back 0 for every "
                                          "key, and no thread reached a barrier: the walk over the query tiles made no step"),
    "the band's last query left out": (PLANTED["band_ends_one_short"], "band_ends_one_short",
                                       "at (BH 2, T_q 17, T_k 17, d_k 2, d_v 3): the last query, T_q - 1, was folded "
                                       "into no key's sums, though its tile was walked"),
    "a barrier more": (changed(SOLUTION, ("        n = min(BLOCK_Q, t_q - i0)\n", "        n = min(BLOCK_Q, t_q - i0)\n        cuda.syncthreads()\n")),
                       "extra_barriers", "two a query tile"),
}


# A right answer of another design: the walk from the last query tile back to the first.
BACKWARDS = changed(SOLUTION, (WALK, "range((t_q - 1) // BLOCK_Q * BLOCK_Q, max(0, seen_from) // BLOCK_Q * BLOCK_Q - 1, "
                                     "-BLOCK_Q)"))


def test_the_dkdv_pass_solution_and_another_style_pass():
    for answer in (mutation.solution_copy(EXERCISES["11_dkdv_pass"]), pass_answer(OTHER), pass_answer(BACKWARDS)):
        result = verdict("11_dkdv_pass", answer)
        assert result.passed and result.diagnosis == "ok", result
        assert "with the simulator's launch sizes and a GPU's" in result.message
        assert "Not compiled" not in result.message, result                # compiled for sm_90, no float64


def test_the_cases_reach_the_tiles_of_both_launches():
    from attention_lib.checks import shapes
    for configuration, tile in ((shapes.SIMULATOR, 16), (shapes.GPU, 32)):
        cases = EXERCISES["11_dkdv_pass"].cases_for(configuration)
        assert cases[0].BH > 1 and cases[0].T_q > tile and cases[0].T_k > tile    # no first case of size 1
        assert {c.T_k - c.T_q for c in cases} >= {0, 1, 3} and any(c.T_q > c.T_k + tile for c in cases)
        assert {64, 128} <= {c.d_k for c in cases} and any(c.spread for c in cases)
        assert any(c.d_k < c.d_v for c in cases) and any(c.d_k > c.d_v for c in cases)


def test_every_named_pass_mistake_is_planted():
    assert set(EXERCISES["11_dkdv_pass"].diagnoses) <= set(PLANTED)


@pytest.mark.parametrize("diagnosis", sorted(PLANTED))
def test_dkdv_pass_mistakes_get_their_diagnosis(diagnosis):
    result = verdict("11_dkdv_pass", pass_answer(PLANTED[diagnosis]))
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    message = ex11_dkdv_pass.PASS_MISTAKES.get(diagnosis)
    assert message is None or message in result.message, result


@pytest.mark.parametrize("name", sorted(DESIGN))
def test_the_usual_wrong_designs_are_named(name):
    source, diagnosis, says = DESIGN[name]
    result = verdict("11_dkdv_pass", pass_answer(source))
    assert (result.passed, result.diagnosis) == (False, diagnosis) and says in result.message, result.message
    if diagnosis == "race":           # the copy is the answer's own: the race names a line of it
        assert re.search(r"write by block \([\d, ]+\) thread \([\d, ]+\) at " + re.escape(_ANSWERS[-1]) + ":",
                         result.message), result.message


def test_the_unstable_exponential_is_named_as_a_gpu_would_fail():
    result = verdict("11_dkdv_pass", pass_answer(PLANTED["unstable_softmax"]))
    assert "scores from -1200 to 1200" in result.message and "exp of a float32 past 88.7 is inf" in result.message


def test_the_library_kernels_are_refused_as_given_code():
    assert verdict("11_dkdv_pass", backward.dkdv_walk).diagnosis == "calls_given_code"
    uses_the_tile = changed(SOLUTION, ("        for r in range(max(0, seen_from + tid - i0), n):",
                                       "        backward.dkdv_tile(q_tile, do_tile, stats, max(0, seen_from + tid - i0), n, "
                                       "k_row, v_row, dk_acc, dv_acc, scale, d_k, d_v)\n        for r in range(0):"))
    answer = pass_answer(uses_the_tile)
    answer.py_func.__globals__["backward"] = backward
    assert verdict("11_dkdv_pass", answer).diagnosis == "calls_given_code"


def test_the_pass_hints_give_the_idea_then_the_plan_in_words():
    hints = EXERCISES["11_dkdv_pass"].hints
    assert [h.split(":")[0] for h in hints[1:]] == ["the plan", "where answers go wrong"]
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


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
