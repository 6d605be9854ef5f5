"""Notebook 09's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint


# --- 08: a decode step without the max subtraction, and the log-sum-exp merge kernel ----------

from attention_lib import reference  # noqa: E402


def decode_step_without_the_max(q, k_new, v_new, k_cache, v_cache, length):
    k_cache[:, length], v_cache[:, length] = k_new, v_new
    s = np.einsum("hd,hnd->hn", q, k_cache[:, :length + 1]) / math.sqrt(q.shape[-1])
    e = np.exp(s)                                                # no shift: inf on large scores
    return np.einsum("hn,hnd->hd", e / e.sum(axis=-1, keepdims=True), v_cache[:, :length + 1]), length + 1


def test_a_decode_step_without_the_max_is_unstable():
    result = check("09_decode_step", decode_step_without_the_max, verbose=False)
    assert result.diagnosis == "unstable_softmax", result


def test_the_decode_step_solution_passes_the_large_case():
    def solution(q, k_new, v_new, k_cache, v_cache, length):
        k_cache[:, length], v_cache[:, length] = k_new, v_new
        s = np.einsum("hd,hnd->hn", q, k_cache[:, :length + 1]) / math.sqrt(q.shape[-1])
        return np.einsum("hn,hnd->hd", reference.softmax(s), v_cache[:, :length + 1]), length + 1
    assert check("09_decode_step", solution, verbose=False).passed


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


def test_the_lse_merge_solution_and_the_library_form_agree():
    from attention_lib.checks.ex09_kv_cache import lse_merge_reference
    from attention_lib.stages import kv_cache
    rng = np.random.default_rng(8)
    q, keys, values = rng.standard_normal((2, 5)), rng.standard_normal((2, 19, 5)), rng.standard_normal((2, 19, 5))
    m, l, acc = kv_cache.chunk_partials(q, keys, values, chunk=4)
    out, lse = lse_merge_reference(m + np.log(l), acc / l[..., None])
    assert np.allclose(out, kv_cache.merge_partials(m, l, acc), rtol=1e-12, atol=1e-12)
    s = np.einsum("hd,htd->ht", q, keys) / math.sqrt(5)
    assert np.allclose(lse, np.log(np.exp(s).sum(axis=-1)), rtol=1e-12, atol=1e-12)
    result = check("09_lse_merge", lse_merge_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (lse_merge_raw_exp, "unstable_softmax"),
    (lse_merge_plain_mean, "merge_unweighted"),
    (lse_merge_unnormalised, "weights_not_normalised"),
    (lse_merge_lse_is_max, "lse_is_max"),
    (lse_merge_without_guard, "out_of_bounds"),
])
def test_lse_merge_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("09_lse_merge", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)
