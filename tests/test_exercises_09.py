"""Notebook 09's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib import reference
from attention_lib.checks import EXERCISES, check, hint
from attention_lib.stages import kv_cache
from attention_lib.stages.kv_cache import (KEYS_PER_CHUNK, TILE_SHAPE, max_and_sum_exp, row_dot, stage_tile,
                                           weighted_value)


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


# --- 09_split_k (main): block (c, g) stages chunk c of kv head g, writes (LSE_c, o_c) ------------

def split_k(start=None, heads="group", sync_scores=True, sync_stage=True, guard_barrier=False, n_keys_of=None,
            components="strided", divide=True, lse="m + log l", scaled=True, lse_thread="0", kv_head="g"):
    """The split-K partial kernel with one step changed (the defaults give the solution).

    start: "c * size" (None), "c" or "0"; heads: "group" (g's own) or "first" (0 .. group - 1);
    sync_scores / sync_stage: the barrier after the scores / before them; guard_barrier: the scores'
    barrier inside the `tid < n_keys` test; n_keys_of: "size" to score and weigh a whole chunk;
    components: "strided" or "one" (component tid only); divide: o divided by l; lse: "m + log l", "m"
    or "log l"; scaled: the scale applied; lse_thread: "0" or "all"; kv_head: "g", or "h" (staged per
    query head)."""
    start_code = {None: 1, "c": 2, "0": 3}[start]
    lse_code = {"m + log l": 1, "m": 2, "log l": 3}[lse]
    first_heads, whole_chunk, one_component = heads == "first", n_keys_of == "size", components == "one"
    every_thread, per_head = lse_thread == "all", kv_head == "h"

    @cuda.jit
    def planted(q, k_cache, v_cache, length, scale, lse_part, o_part):
        k_s = cuda.shared.array(TILE_SHAPE, np.float32)
        v_s = cuda.shared.array(TILE_SHAPE, np.float32)
        s_chunk = cuda.shared.array(KEYS_PER_CHUNK, np.float32)
        c, g, tid, group = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, q.shape[0] // k_cache.shape[0]
        first = c * KEYS_PER_CHUNK if start_code == 1 else (c if start_code == 2 else 0)
        n_keys = min(KEYS_PER_CHUNK, length - c * KEYS_PER_CHUNK)
        if not per_head:
            n_keys = stage_tile(k_s, v_s, k_cache, v_cache, g, first, length, tid, KEYS_PER_CHUNK)
        h0 = 0 if first_heads else g * group
        for h in range(h0, h0 + group):
            if per_head:
                stage_tile(k_s, v_s, k_cache, v_cache, h, first, length, tid, KEYS_PER_CHUNK)
            if sync_stage:
                cuda.syncthreads()
            if tid < n_keys:
                s_chunk[tid] = row_dot(q[h], k_s, tid, q.shape[1]) * (scale if scaled else np.float32(1.0))
                if guard_barrier:
                    cuda.syncthreads()
            if sync_scores and not guard_barrier:
                cuda.syncthreads()
            used = KEYS_PER_CHUNK if whole_chunk else n_keys
            m, l = max_and_sum_exp(s_chunk, used)
            for e in range(tid, q.shape[1] if not one_component else min(tid + 1, q.shape[1]), KEYS_PER_CHUNK):
                o_part[h, c, e] = weighted_value(s_chunk, v_s, used, m, e) / (l if divide else np.float32(1.0))
            if tid == 0 or every_thread:
                lse_part[h, c] = m + math.log(l) if lse_code == 1 else (m if lse_code == 2 else math.log(l))
    return planted


@cuda.jit
def split_k_stub(q, k_cache, v_cache, length, scale, lse_part, o_part):
    raise NotImplementedError()


def test_the_split_k_solution_passes():
    result = check("09_split_k", split_k(), verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (split_k(sync_stage=False), "race", "race on shared"),
    (split_k(sync_scores=False), "race", "race on shared"),
    (split_k(guard_barrier=True), "divergent_barrier", "returned while"),
    (split_k(start="c"), "chunk_not_offset", "staged the positions from c"),
    (split_k(start="0"), "chunk_not_offset", "staged the positions from 0"),
    (split_k(kv_head="h"), "wrong_kv_head", "past the cache's"),
    (split_k(heads="first"), "blocks_overwrite_partials", "written by two blocks"),
    (split_k(lse_thread="all"), "threads_overwrite_partials", "two threads of one block"),
    (split_k(components="one"), "components_not_strided", "never written"),
    (split_k(divide=False), "output_not_normalised", "divide it by l"),
    (split_k(lse="m"), "lse_is_max", "m + log l"),
    (split_k(lse="log l"), "lse_without_max", "add m back"),
    (split_k(scaled=False), "missing_scale", "1/sqrt(d_k)"),
    (split_k(n_keys_of="size"), "partial_chunk", "last one"),
    (split_k_stub, "not_implemented", "Hint:"),
    (kv_cache.decode_kernel_v2, "calls_given_code", "decode_kernel_v2"),
], ids=["no_stage_barrier", "no_score_barrier", "barrier_in_if", "start_c", "start_0", "kv_head_h", "first_group",
        "every_thread_lse", "one_component", "not_normalised", "lse_m", "lse_log_l", "no_scale", "whole_chunk",
        "stub", "library_kernel"])
def test_split_k_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = check("09_split_k", answer, verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "\n" not in str(result)


def test_the_hints_of_09_give_no_code(capsys):
    for exercise_id in ("09_lse_merge", "09_split_k"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: where")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
