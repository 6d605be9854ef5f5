"""Notebook 09's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib import reference
from attention_lib.checks import EXERCISES, check, hint, mutation
from attention_lib.stages import kv_cache
from attention_lib.stages.kv_cache import KEYS_PER_CHUNK


def variant(exercise_id, *changes):
    """The exercise's solution with each (old, new) text change made (mutation.variant)."""
    return mutation.variant(EXERCISES[exercise_id], *changes)


# --- 09_lse_merge (warm-up): the log-sum-exp merge of the chunks' partials ---------------------

@cuda.jit
def lse_merge_solution(lse_part, o_part, out, lse):
    e, h = cuda.grid(2)
    if h < out.shape[0] and e < out.shape[1]:
        m = np.float32(-math.inf)
        for c in range(lse_part.shape[1]):
            m = max(m, lse_part[h, c])
        total, acc = np.float32(0.0), np.float32(0.0)
        for c in range(lse_part.shape[1]):
            w = math.exp(lse_part[h, c] - m)
            total += w
            acc += w * o_part[h, c, e]
        out[h, e] = acc / total
        if e == 0:
            lse[h] = m + math.log(total)


@cuda.jit
def lse_merge_raw_exp(lse_part, o_part, out, lse):
    e, h = cuda.grid(2)
    if h < out.shape[0] and e < out.shape[1]:
        total, acc = np.float32(0.0), np.float32(0.0)
        for c in range(lse_part.shape[1]):
            w = math.exp(lse_part[h, c])                     # overflows for an LSE above 88.7
            total += w
            acc += w * o_part[h, c, e]
        out[h, e] = acc / total
        if e == 0:
            lse[h] = math.log(total)


@cuda.jit
def lse_merge_plain_mean(lse_part, o_part, out, lse):
    e, h = cuda.grid(2)
    if h < out.shape[0] and e < out.shape[1]:
        acc = np.float32(0.0)
        for c in range(lse_part.shape[1]):
            acc += o_part[h, c, e]
        out[h, e] = acc / lse_part.shape[1]
        if e == 0:
            lse[h] = lse_part[h, 0]


@cuda.jit
def lse_merge_unnormalised(lse_part, o_part, out, lse):
    e, h = cuda.grid(2)
    if h < out.shape[0] and e < out.shape[1]:
        m = np.float32(-math.inf)
        for c in range(lse_part.shape[1]):
            m = max(m, lse_part[h, c])
        total, acc = np.float32(0.0), np.float32(0.0)
        for c in range(lse_part.shape[1]):
            w = math.exp(lse_part[h, c] - m)
            total += w
            acc += w * o_part[h, c, e]
        out[h, e] = acc                                      # not divided by the weights' sum
        if e == 0:
            lse[h] = m + math.log(total)


@cuda.jit
def lse_merge_lse_is_max(lse_part, o_part, out, lse):
    e, h = cuda.grid(2)
    if h < out.shape[0] and e < out.shape[1]:
        m = np.float32(-math.inf)
        for c in range(lse_part.shape[1]):
            m = max(m, lse_part[h, c])
        total, acc = np.float32(0.0), np.float32(0.0)
        for c in range(lse_part.shape[1]):
            w = math.exp(lse_part[h, c] - m)
            total += w
            acc += w * o_part[h, c, e]
        out[h, e] = acc / total
        if e == 0:
            lse[h] = m                                       # forgets + log(total)


@cuda.jit
def lse_merge_without_guard(lse_part, o_part, out, lse):
    e, h = cuda.grid(2)
    m = np.float32(-math.inf)
    for c in range(lse_part.shape[1]):
        m = max(m, lse_part[h, c])
    total, acc = np.float32(0.0), np.float32(0.0)
    for c in range(lse_part.shape[1]):
        w = math.exp(lse_part[h, c] - m)
        total += w
        acc += w * o_part[h, c, e]
    out[h, e] = acc / total
    if e == 0:
        lse[h] = m + math.log(total)


@cuda.jit
def lse_merge_against_rounded_lse(lse_part, o_part, out, lse):
    """The formula as written, in float32: the weights exp(LSE_c - LSE) of a rounded LSE, not normalised."""
    e, h = cuda.grid(2)
    if h < out.shape[0] and e < out.shape[1]:
        m = np.float32(-math.inf)
        for c in range(lse_part.shape[1]):
            m = max(m, lse_part[h, c])
        total = np.float32(0.0)
        for c in range(lse_part.shape[1]):
            total += math.exp(lse_part[h, c] - m)
        row_lse = m + math.log(total)                        # near 1000: a float32 step of 6e-5
        acc = np.float32(0.0)
        for c in range(lse_part.shape[1]):
            acc += math.exp(lse_part[h, c] - row_lse) * o_part[h, c, e]
        out[h, e] = acc
        if e == 0:
            lse[h] = row_lse


@cuda.jit
def lse_merge_one_thread_per_head(lse_part, o_part, out, lse):
    """Right values, but thread 0 of each head writes the head's components in a loop."""
    e, h = cuda.grid(2)
    if h < out.shape[0] and e == 0:
        big = np.float32(-math.inf)
        for c in range(lse_part.shape[1]):
            big = max(big, lse_part[h, c])
        total = np.float32(0.0)
        for c in range(lse_part.shape[1]):
            total += math.exp(lse_part[h, c] - big)
        for d in range(out.shape[1]):
            acc = np.float32(0.0)
            for c in range(lse_part.shape[1]):
                acc += math.exp(lse_part[h, c] - big) * o_part[h, c, d]
            out[h, d] = acc / total
        lse[h] = big + math.log(total)


def test_the_lse_merge_solution_passes_and_the_formula_holds():
    rng = np.random.default_rng(8)
    q, keys, values = rng.standard_normal((2, 5)), rng.standard_normal((2, 19, 5)), rng.standard_normal((2, 19, 5))
    lse_part, o_part = kv_cache.chunk_partials(q, keys, values, chunk=4)
    out, lse = kv_cache.merge_partials(lse_part, o_part)
    assert np.allclose(out, reference.attention(q[:, None], keys, values)[:, 0], rtol=1e-12, atol=1e-12)
    s = np.einsum("hd,htd->ht", q, keys) / math.sqrt(5)
    assert np.allclose(lse, np.log(np.exp(s).sum(axis=-1)), rtol=1e-12, atol=1e-12)
    result = check("09_lse_merge", lse_merge_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (lse_merge_raw_exp, "unstable_softmax"),
    (variant("09_lse_merge", ("big = np.float32(-math.inf)", "big = lse_part[h, 0]"),
             ("big = max(big, lse_part[h, c])", "pass")), "max_not_largest"),    # M: the first chunk's LSE
    (variant("09_lse_merge", ("lse[h] = big + math.log(total)", "lse[h] = math.log(total)")), "lse_without_max"),
    (variant("09_lse_merge", ("big = np.float32(-math.inf)", "big = -math.inf"),
             ("total, acc = np.float32(0.0), np.float32(0.0)", "total, acc = 0.0, 0.0")), "float64_arithmetic"),
    (lse_merge_plain_mean, "merge_unweighted"),
    (lse_merge_unnormalised, "weights_not_normalised"),
    (lse_merge_against_rounded_lse, "weights_from_rounded_lse"),
    (lse_merge_lse_is_max, "lse_is_max"),
    (lse_merge_without_guard, "out_of_bounds"),
    (lse_merge_one_thread_per_head, "serial_copy"),
    (kv_cache.decode_merge_kernel, "calls_given_code"),
])
def test_lse_merge_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("09_lse_merge", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("changes, diagnosis, says", [
    # M started at 0 and maxed with every LSE_c: right near +1000, every weight 0 near -1000
    ([("big = np.float32(-math.inf)", "big = np.float32(0.0)")], "max_started_at_zero", "lie near -1000"),
    # the outputs right, lse off: said as lse[h], not as a column of out
    ([("lse[h] = big + math.log(total)", "lse[h] = big + math.log(total) + np.float32(1.0)")], "wrong_values",
     "the outputs are right but lse is not; lse differs in 1 of 1 heads, first lse[0]"),
], ids=["max_started_at_zero", "lse_off"])
def test_lse_merge_slips_are_named_as_the_student_wrote_them(changes, diagnosis, says):
    result = check("09_lse_merge", variant("09_lse_merge", *changes), verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "column" not in result.message, result


def test_a_merge_whose_max_starts_at_the_first_chunk_passes():
    """M started at the first LSE_c, then maxed with the others: right whatever the LSEs."""
    result = check("09_lse_merge", variant("09_lse_merge", ("big = np.float32(-math.inf)", "big = lse_part[h, 0]")),
                   verbose=False)
    assert result.passed and result.diagnosis == "ok", result


def test_the_rounded_lse_diagnosis_says_why():
    message = check("09_lse_merge", lse_merge_against_rounded_lse, verbose=False).message
    assert "6.1e-05" in message and "exp(LSE_c - M)" in message


# --- 09_chunk_stats (main, part 1): the chunk's (m, l) by one tree of pairs --------------------

PAIR = "l_s[tid] = l_s[tid] * math.exp(m_a - m) + l_s[tid + stride] * math.exp(m_b - m)"

STATS_MISTAKES = {
    "sums_added": ([(PAIR, "l_s[tid] = l_s[tid] + l_s[tid + stride]")], "sums_not_rescaled", "the number of positions"),
    "one_sum_rescaled": ([(PAIR, "l_s[tid] = l_s[tid] + l_s[tid + stride] * math.exp(m_b - m)")],
                         "sums_not_rescaled", "m is right but l is not"),
    "no_empty_guard": ([("if m > -math.inf:", "if True:")], "empty_pairs_nan", "two empty pairs"),
    # an empty thread's sum exp(s - s), NaN at s = -inf, kept out of the tree only while the empty
    # threads come last (a pair merged only when the incoming one has a position)
    "empty_sum_exp_s_minus_s": ([("(np.float32(0.0) if s == -math.inf else np.float32(1.0))", "math.exp(s - s)"),
                                 ("if m > -math.inf:", "if m_b > -math.inf:")], "empty_pairs_nan",
                                "sit among threads with one"),
    # a pair merged only when the slot's own has a position: a full pair above an empty slot is lost
    "guard_on_own_pair": ([("if m > -math.inf:", "if m_a > -math.inf:")], "pair_dropped",
                          "block 0, thread 0 got (m, l) = (-inf, 0)"),
    "max_from_zero": ([("m_s[tid], l_s[tid] = s,", "m_s[tid], l_s[tid] = max(s, np.float32(0.0)),")],
                      "max_from_zero", "not from 0"),
    "own_slot_read": ([("m, l = m_s[0], l_s[0]", "m, l = m_s[tid], l_s[tid]")], "result_not_broadcast",
                      "every thread reads slot 0"),
    "no_barrier_before_the_read": ([("    cuda.syncthreads()                       # wait: slot 0 holds", "    # slot 0")],
                                   "race", "race on shared"),
    "no_barrier_after_the_read": ([("    cuda.syncthreads()                       # wait: every thread has read", "    #")],
                                  "race", "race on shared"),
    "barrier_in_the_test": ([("        if tid < stride:                     # slot tid takes in slot tid + stride\n",
                              "        if tid < stride:\n            cuda.syncthreads()\n")],
                            "divergent_barrier", "On a GPU that hangs the block"),
    "stride_8": ([("stride = KEYS_PER_CHUNK // 2", "stride = 4")], "wrong_values", "with a GPU's launch"),
}


@cuda.jit(device=True)
def stats_walked_by_thread_0(s, m_s, l_s):
    """Thread 0 merges every pair alone, then hands the result over."""
    tid = cuda.threadIdx.x
    m_s[tid], l_s[tid] = s, (np.float32(1.0) if s > -math.inf else np.float32(0.0))
    cuda.syncthreads()
    if tid == 0:
        m, l = m_s[0], l_s[0]
        for t in range(1, KEYS_PER_CHUNK):
            big = max(m, m_s[t])
            if big > -math.inf:
                l = l * math.exp(m - big) + l_s[t] * math.exp(m_s[t] - big)
                m = big
        m_s[0], l_s[0] = m, l
    cuda.syncthreads()
    m, l = m_s[0], l_s[0]
    cuda.syncthreads()
    return m, l


@cuda.jit(device=True)
def stats_in_two_trees(s, m_s, l_s):
    """Right values, a tree for the max then one for the sum: about twice the barriers of one pair tree."""
    tid = cuda.threadIdx.x
    m_s[tid] = s
    stride = KEYS_PER_CHUNK // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride:
            m_s[tid] = max(m_s[tid], m_s[tid + stride])
        stride //= 2
    cuda.syncthreads()
    m = m_s[0]
    l_s[tid] = math.exp(s - m)
    stride = KEYS_PER_CHUNK // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride:
            l_s[tid] += l_s[tid + stride]
        stride //= 2
    cuda.syncthreads()
    l = l_s[0]
    cuda.syncthreads()
    return m, l


@cuda.jit(device=True)
def stats_in_two_trees_no_last_barrier(s, m_s, l_s):
    """Two trees, each thread returning as soon as it has read l: the caller's next write to l_s races."""
    tid = cuda.threadIdx.x
    m_s[tid] = s
    stride = KEYS_PER_CHUNK // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride:
            m_s[tid] = max(m_s[tid], m_s[tid + stride])
        stride //= 2
    cuda.syncthreads()
    m = m_s[0]
    l_s[tid] = math.exp(s - m)
    stride = KEYS_PER_CHUNK // 2
    while stride > 0:
        cuda.syncthreads()
        if tid < stride:
            l_s[tid] += l_s[tid + stride]
        stride //= 2
    cuda.syncthreads()
    return m, l_s[0]


def test_the_chunk_stats_solution_passes_at_both_launches():
    result = check("09_chunk_stats", mutation.solution_copy(EXERCISES["09_chunk_stats"]), verbose=False)
    assert result.passed and result.diagnosis == "ok" and "a GPU's" in result.message, result


def test_two_trees_wait_at_too_many_barriers():
    result = check("09_chunk_stats", stats_in_two_trees, verbose=False)
    assert (result.passed, result.diagnosis) == (False, "extra_barriers"), result
    assert "one tree whose slots hold (max, sum) pairs" in result.message, result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_two_trees_without_the_last_barrier_race_with_the_caller():
    result = check("09_chunk_stats", stats_in_two_trees_no_last_barrier, verbose=False)
    assert (result.passed, result.diagnosis) == (False, "race"), result
    assert "'l_s'[0]" in result.message, result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mistake", sorted(STATS_MISTAKES))
def test_chunk_stats_mistakes_get_their_diagnosis(mistake):
    changes, diagnosis, says = STATS_MISTAKES[mistake]
    result = check("09_chunk_stats", variant("09_chunk_stats", *changes), verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "\n" not in str(result)


def test_chunk_stats_that_merges_only_pairs_with_a_position_passes():
    """A right answer: the pair above is merged only when it has a position, and an empty slot takes
    it in whole (its (-inf, 0) times exp(-inf) adds 0), wherever the empty threads sit."""
    result = check("09_chunk_stats", variant("09_chunk_stats", ("if m > -math.inf:", "if m_b > -math.inf:")),
                   verbose=False)
    assert result.passed and result.diagnosis == "ok" and "scattered scores" in result.message, result


def test_chunk_stats_walked_by_one_thread_is_serial():
    result = check("09_chunk_stats", stats_walked_by_thread_0, verbose=False)
    assert (result.passed, result.diagnosis) == (False, "serial_reduction"), result


# --- 09_chunk_partial (main): a chunk's partial, a block per (chunk, query head) -------------------

from attention_lib.stages.kv_cache import chunk_stats, row_dot  # noqa: E402,F401  (planted answers' names)

STAGED = "    cuda.syncthreads()                                      # wait: the chunk's keys are staged\n"
STAGE = "tile[i // d_k, i % d_k] = k_cache[g, start + i // d_k, i % d_k]"
SCORE = "s = scale * row_dot(q[h], tile, tid, d_k) if tid < n_keys else np.float32(-math.inf)"
STATS = "m, l = chunk_stats(s, a_s, b_s)"
WEIGHTED = "    cuda.syncthreads()                                      # wait: every weight is in\n"
V_LOOP = "for e in range(tid, d_k, KEYS_PER_CHUNK):"
LSE = "lse_part[h, c] = m + math.log(l)"

CHUNK_MISTAKES = {
    # the scores' max, as readers wrote it
    # m the first score, l rescaled to it: right until a score lies 88 above the first
    "m_first_score": ([(STATS, "big, total = chunk_stats(s, a_s, b_s)\n    if tid == 0:\n        b_s[0] = s\n"
                               "    cuda.syncthreads()\n    m = b_s[0]\n    l = total * math.exp(big - m)")],
                      "m_is_first_score", "right when the largest comes first"),
    "max_from_zero": ([(STATS, "big, total = chunk_stats(s, a_s, b_s)\n    m = max(big, np.float32(0.0))\n"
                               "    l = total * math.exp(big - m)")], "max_from_zero", "start the max from -inf"),
    "no_max": ([(STATS, "big, total = chunk_stats(s, a_s, b_s)\n    m, l = np.float32(0.0), total * math.exp(big)")],
               "unstable_softmax", "every score of the chunk is 760"),
    "zero_in_the_max": ([(STATS, "m, l = chunk_stats(s if tid < n_keys else np.float32(0.0), a_s, b_s)")],
                        "partial_chunk", "right in every full chunk, wrong in the last one"),
    "zero_score_counted": ([("else np.float32(-math.inf)", "else np.float32(0.0)")], "partial_chunk",
                           "right in every full chunk, wrong in the last one"),
    # who writes what
    "chunk_ignored": ([("o_part[h, c, e] = acc / l", "o_part[h, 0, e] = acc / l"), (LSE, "lse_part[h, 0] = m + math.log(l)")],
                      "blocks_overwrite_partials", "written by two blocks"),
    "every_thread_lse": ([("if tid == 0:", "if tid >= 0:")], "threads_overwrite_partials", "two threads of one block"),
    "stride_8": ([(V_LOOP, "for e in range(tid, d_k, 8):")], "threads_overwrite_partials", "with a GPU's launch"),
    "one_component": ([(V_LOOP, "for e in range(tid, min(tid + 1, d_k)):")], "components_not_strided", "never written"),
    # the loads
    "every_component_everywhere": ([(V_LOOP, "for e in range(d_k):"),
                                    ("        o_part[h, c, e] = acc / l",
                                     "        if e % KEYS_PER_CHUNK == tid:\n            o_part[h, c, e] = acc / l")],
                                   "no_reuse", "an element of v_cache was read up to"),
    "staged_by_thread_0": ([("for i in range(tid, n_keys * d_k, KEYS_PER_CHUNK):",
                             "for i in range(n_keys * d_k if tid == 0 else 0):")], "serial_copy",
                           "a few lanes copy in a loop"),
    "scored_from_global": ([(STAGE, "pass"),
                            (SCORE, "s = np.float32(-math.inf)\n    if tid < n_keys:\n        s = np.float32(0.0)\n"
                                    "        for e in range(d_k):\n            s += q[h, e] * k_cache[g, start + tid, e]\n"
                                    "        s *= scale")],
                           "uncoalesced", "a warp's load of k_cache"),
    # barriers and guards
    "no_stage_barrier": ([(STAGED, "")], "race", "race on shared"),
    "barrier_in_the_loop": ([(STAGE + "\n" + STAGED, STAGE + "\n    " + STAGED)], "divergent_barrier",
                            "On a GPU that hangs the block"),
    "weights_unsynced": ([(WEIGHTED, "")], "race", "race on shared"),
    "scored_past_n_keys": ([("if tid < n_keys else", "if tid < KEYS_PER_CHUNK else")], "stale_tile",
                           "which no thread of its block had written"),
    "barrier_a_position": ([("    if tid == 0:", "    for t in range(n_keys):\n        cuda.syncthreads()\n    if tid == 0:")],
                           "extra_barriers", "barriers, where the limit is"),
    # the formula
    "not_normalised": ([("o_part[h, c, e] = acc / l", "o_part[h, c, e] = acc")], "output_not_normalised",
                       "divide it by l"),
    # the weights exp(s), divided by the right l: off by exp(m) in every chunk, though divided by l
    "weights_not_shifted": ([("a_s[tid] = math.exp(s - m)", "a_s[tid] = math.exp(s)")], "unstable_softmax",
                            "the weights were exp(s), divided by l"),
    "lse_m": ([(LSE, "lse_part[h, c] = m")], "lse_is_max", "m + log l"),
    "lse_log_l": ([(LSE, "lse_part[h, c] = math.log(l)")], "lse_without_max", "add m back"),
    "no_scale": ([("s = scale * row_dot", "s = row_dot")], "missing_scale", "1/sqrt(d_k)"),
    "float64": ([("acc = np.float32(0.0)", "acc = 0.0")], "float64_arithmetic", "float64"),
    # the writes: each element of o_part and lse_part stored once by its thread
    "summed_in_o_part": ([("        acc = np.float32(0.0)\n        for t in range(n_keys):\n"
                           "            acc += a_s[t] * v_cache[g, start + t, e]\n        o_part[h, c, e] = acc / l",
                           "        o_part[h, c, e] = np.float32(0.0)\n        for t in range(n_keys):\n"
                           "            o_part[h, c, e] += a_s[t] * v_cache[g, start + t, e] / l")],
                         "output_rewritten", "stored o_part[0, 0, 0] 9 times"),
    "lse_in_two_stores": ([(LSE, "lse_part[h, c] = m\n        lse_part[h, c] += math.log(l)")], "output_rewritten",
                          "stored lse_part[0, 0] 2 times"),
}


@cuda.jit(device=True)
def chunk_partial_in_another_style(q, k_cache, v_cache, h, g, c, n_keys, scale, lse_part, o_part, tile, a_s, b_s):
    """A right answer: the keys staged row by row, the scores kept in a_s, its own tree for each
    reduction (3 reads a round in the max's), the weights recomputed from the scores."""
    tid, d_k = cuda.threadIdx.x, q.shape[1]
    first = c * KEYS_PER_CHUNK
    for t in range(n_keys):
        for e in range(tid, d_k, KEYS_PER_CHUNK):
            tile[t, e] = k_cache[g, first + t, e]
    cuda.syncthreads()
    mine = np.float32(-math.inf)
    if tid < n_keys:
        dot = np.float32(0.0)
        for e in range(d_k):
            dot += q[h, e] * tile[tid, e]
        mine = dot * scale
    a_s[tid] = mine
    b_s[tid] = mine
    cuda.syncthreads()
    half = KEYS_PER_CHUNK // 2
    while half >= 1:
        if tid < half and b_s[tid + half] > b_s[tid]:
            b_s[tid] = b_s[tid + half]
        cuda.syncthreads()
        half //= 2
    m = b_s[0]
    cuda.syncthreads()
    b_s[tid] = math.exp(mine - m)
    cuda.syncthreads()
    half = KEYS_PER_CHUNK // 2
    while half >= 1:
        if tid < half:
            b_s[tid] = b_s[tid] + b_s[tid + half]
        cuda.syncthreads()
        half //= 2
    l = b_s[0]
    for e in range(tid, d_k, KEYS_PER_CHUNK):
        acc = np.float32(0.0)
        for t in range(n_keys):
            acc += math.exp(a_s[t] - m) * v_cache[g, first + t, e]
        o_part[h, c, e] = acc / l
    if tid == 0:
        lse_part[h, c] = m + math.log(l)


def _staged_and_scored(rest):
    """An answer that stages and scores as the library's does, then keeps the scores in a_s (a
    barrier after them) and runs `rest` (source text indented by four spaces)."""
    namespace = {"cuda": cuda, "np": np, "math": math, "KEYS_PER_CHUNK": KEYS_PER_CHUNK, "row_dot": row_dot,
                 "chunk_stats": chunk_stats}
    exec("def answer(q, k_cache, v_cache, h, g, c, n_keys, scale, lse_part, o_part, tile, a_s, b_s):\n"
         "    tid, d_k, start = cuda.threadIdx.x, q.shape[1], c * KEYS_PER_CHUNK\n"
         "    for i in range(tid, n_keys * d_k, KEYS_PER_CHUNK):\n"
         "        tile[i // d_k, i % d_k] = k_cache[g, start + i // d_k, i % d_k]\n"
         "    cuda.syncthreads()\n"
         "    s = scale * row_dot(q[h], tile, tid, d_k) if tid < n_keys else np.float32(-math.inf)\n"
         "    a_s[tid] = s\n"
         "    cuda.syncthreads()\n" + rest, namespace)
    return cuda.jit(device=True)(namespace["answer"])


WEIGH = ("    for e in range(tid, d_k, KEYS_PER_CHUNK):\n"
         "        acc = np.float32(0.0)\n"
         "        for t in range(n_keys):\n"
         "            acc += math.exp(a_s[t] - m) * v_cache[g, start + t, e]\n"
         "        o_part[h, c, e] = acc / l\n"
         "    if tid == 0:\n"
         "        lse_part[h, c] = m + math.log(l)\n")

# Thread 0 finds m and l alone and hands them over through shared memory.
serial_thread_0 = _staged_and_scored(
    "    if tid == 0:\n"
    "        m, l = np.float32(-math.inf), np.float32(0.0)\n"
    "        for t in range(n_keys):\n"
    "            m = max(m, a_s[t])\n"
    "        for t in range(n_keys):\n"
    "            l += math.exp(a_s[t] - m)\n"
    "        b_s[0], b_s[1] = m, l\n"
    "    cuda.syncthreads()\n"
    "    m, l = b_s[0], b_s[1]\n" + WEIGH)

# Every thread walks all the scores for m and l (no tree).
serial_in_every_thread = _staged_and_scored(
    "    m, l = np.float32(-math.inf), np.float32(0.0)\n"
    "    for t in range(n_keys):\n"
    "        m = max(m, a_s[t])\n"
    "    for t in range(n_keys):\n"
    "        l += math.exp(a_s[t] - m)\n" + WEIGH)

# The values staged in the tile after the keys, as the keys were (as notebooks 05 and 08 stage K
# and V): right, but each value is read from shared memory by the one thread that owns its component.
values_in_the_tile = _staged_and_scored(
    "    m, l = chunk_stats(s, a_s, b_s)\n"
    "    a_s[tid] = math.exp(s - m)\n"
    "    for i in range(tid, n_keys * d_k, KEYS_PER_CHUNK):\n"
    "        tile[i // d_k, i % d_k] = v_cache[g, start + i // d_k, i % d_k]\n"
    "    cuda.syncthreads()\n"
    "    for e in range(tid, d_k, KEYS_PER_CHUNK):\n"
    "        acc = np.float32(0.0)\n"
    "        for t in range(n_keys):\n"
    "            acc += a_s[t] * tile[t, e]\n"
    "        o_part[h, c, e] = acc / l\n"
    "    if tid == 0:\n"
    "        lse_part[h, c] = m + math.log(l)\n")

# Each thread takes its own score as m (a thread without a position the first score), and weighs
# with it throughout: right until the scores spread past 88.
own_score_as_m = _staged_and_scored(
    "    m = s if tid < n_keys else a_s[0]\n"
    "    l = np.float32(0.0)\n"
    "    for t in range(n_keys):\n"
    "        l += math.exp(a_s[t] - m)\n" + WEIGH)


@cuda.jit(device=True)
def chunk_partial_stub(q, k_cache, v_cache, h, g, c, n_keys, scale, lse_part, o_part, tile, a_s, b_s):
    raise NotImplementedError()


def test_the_chunk_partial_solution_and_another_style_pass_at_both_launches():
    for answer in (mutation.solution_copy(EXERCISES["09_chunk_partial"]), chunk_partial_in_another_style):
        result = check("09_chunk_partial", answer, verbose=False)
        assert result.passed and result.diagnosis == "ok" and "a GPU's" in result.message, result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mistake", sorted(CHUNK_MISTAKES))
def test_chunk_partial_mistakes_get_their_diagnosis(mistake):
    changes, diagnosis, says = CHUNK_MISTAKES[mistake]
    result = check("09_chunk_partial", variant("09_chunk_partial", *changes), verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "\n" not in str(result)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("answer, diagnosis, says", [
    (serial_thread_0, "serial_reduction", "one thread read shared memory"),
    (serial_in_every_thread, "serial_reduction", "with a GPU's launch"),
    (values_in_the_tile, "values_staged", "read V from the cache straight"),
    (own_score_as_m, "m_is_own_score", "right when every score is equal"),
    (chunk_partial_stub, "not_implemented", "Hint:"),
    (kv_cache.chunk_partial, "calls_given_code", "chunk_partial"),
], ids=["serial_thread_0", "serial_in_every_thread", "values_in_the_tile", "own_score_as_m", "stub", "library_function"])
def test_chunk_partial_written_answers(answer, diagnosis, says):
    result = check("09_chunk_partial", answer, verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


def test_a_merge_whose_max_misses_the_last_chunk_fails():
    """M from the first chunk and those after it, all but the last: right until the last chunk's LSE
    lies far above the others'."""
    result = check("09_lse_merge", variant("09_lse_merge", ("big = np.float32(-math.inf)", "big = lse_part[h, 0]"),
                                           ("for c in range(lse_part.shape[1]):\n            big",
                                            "for c in range(1, lse_part.shape[1] - 1):\n            big")),
                   verbose=False)
    assert (result.passed, result.diagnosis) == (False, "max_not_largest"), result
    assert "last high LSEs" in result.message, result


def test_the_hints_of_09_give_no_code(capsys):
    for exercise_id in ("09_lse_merge", "09_chunk_stats", "09_chunk_partial"):
        hints = EXERCISES[exercise_id].hints
        assert [h.split(":")[0] for h in hints[1:]] == ["the plan", "where answers go wrong"], exercise_id
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: the plan")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
