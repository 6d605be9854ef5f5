"""Notebook 09's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib import reference
from attention_lib.checks import EXERCISES, check, hint, mutation
from attention_lib.stages import kv_cache


def variant(exercise_id, *changes):
    """The exercise's solution with each (old, new) text change made: a planted answer whose every
    other line is the library's, so what the check says is about the change alone."""
    exercise = EXERCISES[exercise_id]
    source = mutation.solution_source(exercise)[0]
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    return mutation.build(exercise, source, f"<planted answer of {exercise_id}>")


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
    (kv_cache.decode_merge_kernel, "calls_given_code"),
])
def test_lse_merge_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("09_lse_merge", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)


def test_the_rounded_lse_diagnosis_says_why():
    message = check("09_lse_merge", lse_merge_against_rounded_lse, verbose=False).message
    assert "6.1e-05" in message and "exp(LSE_c - M)" in message


# --- 09_split_k (main): one query head against a staged chunk --------------------------------

FIRST_BARRIER = "    cuda.syncthreads()                               # wait: the chunk is staged"
SECOND_BARRIER = "    cuda.syncthreads()                               # wait: every score"
SCORE = "s_chunk[tid] = scale * row_dot(q[h], k_s, tid, q.shape[1])"
M_LOOP = "for t in range(n_keys):\n        m = max(m, s_chunk[t])\n    for t in range(n_keys):"

SPLIT_K_MISTAKES = {
    "no_stage_barrier": ([(FIRST_BARRIER, "    pass                               # wait: the chunk is staged")],
                         "race", "race on shared"),
    "no_score_barrier": ([(SECOND_BARRIER, "    pass                               # wait: every score")],
                         "race", "race on shared"),
    "barrier_in_if": ([("   # every thread reads all of q[h]\n    cuda.syncthreads()",
                        "   # every thread reads all of q[h]\n        cuda.syncthreads()")],
                      "divergent_barrier", "On a GPU that hangs the block"),
    "chunk_ignored": ([("o_part[h, c, e] =", "o_part[h, 0, e] ="), ("lse_part[h, c] =", "lse_part[h, 0] =")],
                      "blocks_overwrite_partials", "written by two blocks"),
    "every_thread_lse": ([("if tid == 0:", "if tid >= 0:")], "threads_overwrite_partials", "two threads of one block"),
    "one_component": ([("for e in range(tid, q.shape[1], KEYS_PER_CHUNK):", "for e in range(tid, min(tid + 1, q.shape[1])):")],
                      "components_not_strided", "never written"),
    "stride_8": ([("for e in range(tid, q.shape[1], KEYS_PER_CHUNK):", "for e in range(tid, q.shape[1], 8):")],
                 "threads_overwrite_partials", "with a GPU's launch"),
    "not_normalised": ([("weighted_value(s_chunk, v_s, n_keys, m, e) / l", "weighted_value(s_chunk, v_s, n_keys, m, e)")],
                       "output_not_normalised", "divide it by l"),
    "lse_m": ([("lse_part[h, c] = m + math.log(l)", "lse_part[h, c] = m")], "lse_is_max", "m + log l"),
    "lse_log_l": ([("lse_part[h, c] = m + math.log(l)", "lse_part[h, c] = math.log(l)")], "lse_without_max",
                  "add m back"),
    "no_scale": ([(SCORE, "s_chunk[tid] = row_dot(q[h], k_s, tid, q.shape[1])")], "missing_scale", "1/sqrt(d_k)"),
    "no_max": ([("m = max(m, s_chunk[t])", "m = np.float32(0.0)")], "unstable_softmax", "overflows float32"),
    "zero_padded": ([("if tid < n_keys:", "if True:"), (SCORE, SCORE + " if tid < n_keys else np.float32(0.0)"),
                     (M_LOOP, M_LOOP.replace("n_keys", "KEYS_PER_CHUNK"))], "partial_chunk", "last one"),
    "whole_chunk": ([("if tid < n_keys:", "if tid < KEYS_PER_CHUNK:"), (M_LOOP, M_LOOP.replace("n_keys", "KEYS_PER_CHUNK")),
                     ("weighted_value(s_chunk, v_s, n_keys, m, e)", "weighted_value(s_chunk, v_s, KEYS_PER_CHUNK, m, e)")],
                    "stale_tile", "which no thread of its block had written"),
    "past_n_keys": ([("if tid < n_keys:", "if tid <= n_keys:")], "stale_tile", "the values are right, but"),
    "recomputed": ([("m = max(m, s_chunk[t])", "m = max(m, scale * row_dot(q[h], k_s, t, q.shape[1]))"),
                    ("l += math.exp(s_chunk[t] - m)", "l += math.exp(scale * row_dot(q[h], k_s, t, q.shape[1]) - m)")],
                   "scores_recomputed", "read shared memory"),
    "float64": ([("np.float32(-math.inf), np.float32(0.0)", "-math.inf, 0.0")], "float64_arithmetic", "float64"),
}


@cuda.jit(device=True)
def split_k_stub(q, h, c, k_s, v_s, s_chunk, n_keys, scale, lse_part, o_part):
    raise NotImplementedError()


def test_the_split_k_solution_passes_at_both_launches():
    result = check("09_split_k", mutation.solution_copy(EXERCISES["09_split_k"]), verbose=False)
    assert result.passed and result.diagnosis == "ok" and "a GPU's" in result.message, result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mistake", sorted(SPLIT_K_MISTAKES))
def test_split_k_mistakes_get_their_diagnosis(mistake):
    changes, diagnosis, says = SPLIT_K_MISTAKES[mistake]
    result = check("09_split_k", variant("09_split_k", *changes), verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "\n" not in str(result)


@pytest.mark.parametrize("answer, diagnosis, says", [
    (split_k_stub, "not_implemented", "Hint:"),
    (kv_cache.attend_chunk, "calls_given_code", "attend_chunk"),
], ids=["stub", "library_function"])
def test_split_k_stub_and_library_code(answer, diagnosis, says):
    result = check("09_split_k", answer, verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


def test_the_hints_of_09_give_no_code(capsys):
    for exercise_id in ("09_lse_merge", "09_split_k"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: the plan")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
