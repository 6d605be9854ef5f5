"""The exercise checker: planted mistakes get their diagnosis, the right answer passes."""

import numpy as np
import pytest
from attention_lib.stages import basics
from attention_lib.checks import EXERCISES, check
from numba import cuda


@cuda.jit
def no_bounds_guard(alpha, x, y, out):
    i = cuda.grid(1)
    out[i] = alpha * x[i] + y[i]


@cuda.jit
def forgets_alpha(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + y[i]


@cuda.jit
def skips_the_last_element(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0] - 1:
        out[i] = alpha * x[i] + y[i]


@cuda.jit
def only_the_first_block(alpha, x, y, out):
    i = cuda.threadIdx.x                 # forgets blockIdx: right only while n <= one block
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


@cuda.jit
def not_written_yet(alpha, x, y, out):
    raise NotImplementedError()


def test_the_library_kernel_passes(capsys):
    result = check("00_scale_add", basics.scale_add_kernel)
    assert result.passed and result.diagnosis == "ok"
    assert capsys.readouterr().out.startswith("✔ 00_scale_add [ok]")


@pytest.mark.parametrize("answer, diagnosis, says", [
    (no_bounds_guard, "out_of_bounds", "Guard the index"),
    (forgets_alpha, "wrong_values", "entries differ"),
    (skips_the_last_element, "wrong_values", "never written"),
    (only_the_first_block, "wrong_values", "n = 65"),
    (not_written_yet, "not_implemented", "not implemented yet"),
    (None, "not_implemented", "not implemented yet"),
    (lambda alpha, x, y: alpha * x + y, "not_a_kernel", "@cuda.jit"),
])
def test_planted_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = check("00_scale_add", answer, verbose=False)
    assert not result.passed
    assert result.diagnosis == diagnosis
    assert says in result.message
    assert "\n" not in str(result)


def test_an_unknown_exercise_is_named():
    with pytest.raises(ValueError, match="exercise_id must be one of"):
        check("99_nothing", basics.scale_add_kernel)


def _sizes(case):
    """The integer sizes of a case (an int or a tuple of fields); flags such as bias=True are not sizes."""
    fields = case if isinstance(case, tuple) else (case,)
    return [f for f in fields if isinstance(f, (int, np.integer)) and not isinstance(f, (bool, np.bool_))]


def test_every_exercise_tries_awkward_sizes():
    for exercise in EXERCISES.values():
        sizes = [_sizes(case) for case in exercise.cases]
        assert len(exercise.cases) >= 3, exercise.exercise_id
        assert any(1 in s for s in sizes), f"{exercise.exercise_id} never tries a size of 1"
        assert any(n > 1 and n % 2 for s in sizes for n in s), f"{exercise.exercise_id} tries no odd size"


TILE = 16                    # the block of the exercise's launch (projection.TILE)


@cuda.jit
def tiled_projection_missing_barrier(x, w, b, out):
    """A tiled projection whose second barrier is missing: a fast thread overwrites a tile
    that slower threads are still reading."""
    x_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    w_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    col, row = cuda.grid(2)
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    acc = np.float32(0.0)
    for start in range(0, x.shape[1], TILE):
        x_tile[ty, tx] = x[row, start + tx] if row < x.shape[0] and start + tx < x.shape[1] else 0.0
        w_tile[ty, tx] = w[start + ty, col] if start + ty < w.shape[0] and col < w.shape[1] else 0.0
        cuda.syncthreads()
        for k in range(TILE):
            acc += x_tile[ty, k] * w_tile[k, tx]
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = acc + (b[col] if b.shape[0] > 0 else 0.0)


def test_a_missing_barrier_is_diagnosed_as_a_race():
    from attention_lib.stages import projection
    assert TILE == projection.TILE
    result = check("01_projection_naive", tiled_projection_missing_barrier, verbose=False)
    assert result.diagnosis == "race", result
    assert "race on shared" in result.message and "syncthreads" in result.message


def test_the_tiled_library_kernel_is_race_checked_and_passes():
    from attention_lib.stages import projection
    from attention_lib.checks import engine
    assert engine._shares_memory(projection.projection_kernel_v2)       # through its device function
    assert not engine._shares_memory(projection.projection_kernel_v1)
    assert check("01_projection_naive", projection.projection_kernel_v2, verbose=False).passed


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


def test_hints_of_04_and_08_come_in_levels_and_give_no_code(capsys):
    for exercise_id in ("04_row_softmax", "04_block_reduction", "05_single_head", "05_causal_av",
                        "08_decode_step", "08_lse_merge"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2, exercise_id
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: where")
        for text in hints:             # no code: no assignment, no indexing, no call of the API
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)


# --- 08: a decode step without the max subtraction, and the log-sum-exp merge kernel ----------

from attention_lib import reference  # noqa: E402


def decode_step_without_the_max(q, k_new, v_new, k_cache, v_cache, length):
    k_cache[:, length], v_cache[:, length] = k_new, v_new
    s = np.einsum("hd,hnd->hn", q, k_cache[:, :length + 1]) / math.sqrt(q.shape[-1])
    e = np.exp(s)                                                # no shift: inf on large scores
    return np.einsum("hn,hnd->hd", e / e.sum(axis=-1, keepdims=True), v_cache[:, :length + 1]), length + 1


def test_a_decode_step_without_the_max_is_unstable():
    result = check("08_decode_step", decode_step_without_the_max, verbose=False)
    assert result.diagnosis == "unstable_softmax", result


def test_the_decode_step_solution_passes_the_large_case():
    def solution(q, k_new, v_new, k_cache, v_cache, length):
        k_cache[:, length], v_cache[:, length] = k_new, v_new
        s = np.einsum("hd,hnd->hn", q, k_cache[:, :length + 1]) / math.sqrt(q.shape[-1])
        return np.einsum("hn,hnd->hd", reference.softmax(s), v_cache[:, :length + 1]), length + 1
    assert check("08_decode_step", solution, verbose=False).passed


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
    from attention_lib.checks.ex08_kv_cache import lse_merge_reference
    from attention_lib.stages import kv_cache
    rng = np.random.default_rng(8)
    q, keys, values = rng.standard_normal((2, 5)), rng.standard_normal((2, 19, 5)), rng.standard_normal((2, 19, 5))
    m, l, acc = kv_cache.chunk_partials(q, keys, values, chunk=4)
    out, lse = lse_merge_reference(m + np.log(l), acc / l[..., None])
    assert np.allclose(out, kv_cache.merge_partials(m, l, acc), rtol=1e-12, atol=1e-12)
    s = np.einsum("hd,htd->ht", q, keys) / math.sqrt(5)
    assert np.allclose(lse, np.log(np.exp(s).sum(axis=-1)), rtol=1e-12, atol=1e-12)
    result = check("08_lse_merge", lse_merge_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (lse_merge_raw_exp, "unstable_softmax"),
    (lse_merge_plain_mean, "merge_unweighted"),
    (lse_merge_unnormalised, "weights_not_normalised"),
    (lse_merge_lse_is_max, "lse_is_max"),
    (lse_merge_without_guard, "out_of_bounds"),
])
def test_lse_merge_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("08_lse_merge", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)


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


# --- 05: A . V skipping the zero tiles above the diagonal -------------------------------------

from attention_lib.checks.ex05_weighted_values import tile_matmul_until  # noqa: E402
from attention_lib.stages.projection import TILE as AV_TILE             # noqa: E402


@cuda.jit
def causal_av_solution(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], (cuda.blockIdx.y + 1) * AV_TILE + a.shape[2] - a.shape[1])
    acc = tile_matmul_until(a[h], v[h], row, col, k_end)
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_every_tile(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    acc = tile_matmul_until(a[h], v[h], row, col, a.shape[2])       # right, but reads the zeros
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_without_the_diagonal(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], cuda.blockIdx.y * AV_TILE + a.shape[2] - a.shape[1])
    acc = tile_matmul_until(a[h], v[h], row, col, k_end)
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_without_the_offset(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], (cuda.blockIdx.y + 1) * AV_TILE)
    acc = tile_matmul_until(a[h], v[h], row, col, k_end)
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def causal_av_without_guard(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    k_end = min(a.shape[2], (cuda.blockIdx.y + 1) * AV_TILE + a.shape[2] - a.shape[1])
    out[h, row, col] = tile_matmul_until(a[h], v[h], row, col, k_end)


def test_the_causal_av_solution_passes():
    result = check("05_causal_av", causal_av_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis", [
    (causal_av_every_tile, "no_tiles_skipped"),
    (causal_av_without_the_diagonal, "diagonal_tile_skipped"),
    (causal_av_without_the_offset, "mask_ignores_offset"),
    (causal_av_without_guard, "out_of_bounds"),
])
def test_causal_av_mistakes_get_their_diagnosis(answer, diagnosis):
    result = check("05_causal_av", answer, verbose=False)
    assert (result.passed, result.diagnosis) == (False, diagnosis), result
    assert "\n" not in str(result)


# --- The engine: the launch it hands each case, and the one prefill convention ----------------

@cuda.jit
def writes_nan(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * (math.inf - math.inf)           # inf - inf: a NaN the kernel computed


def test_unwritten_is_a_nan_no_arithmetic_makes():
    from attention_lib.checks import engine
    assert np.isnan(engine.UNWRITTEN)
    with np.errstate(invalid="ignore"):
        computed = np.float32(np.inf) - np.float32(np.inf)   # inf - inf, the default NaN
    values = np.array([engine.UNWRITTEN, computed, np.nan, 0.0, -1.0], np.float32)
    assert engine.unwritten(values).tolist() == [True, False, False, False, False]
    # A float64 copy of the marker still reads as UNWRITTEN; an integer array never does.
    assert engine.unwritten(values.astype(np.float64)).tolist() == [True, False, False, False, False]
    assert not engine.unwritten(np.zeros(3, np.int32)).any()


def test_output_array_prefills_out_and_guard_and_read_output_checks_the_guard():
    from attention_lib.checks import engine
    full, out = engine.output_array((2, 3), guard=4)
    assert out.shape == (2, 3) and full.shape == (10,)
    assert engine.unwritten(full.copy_to_host()).all()
    out.copy_to_device(np.ones((2, 3), np.float32))
    assert np.array_equal(engine.read_output(full, out), np.ones((2, 3)))
    full[7:8].copy_to_device(np.zeros(1, np.float32))    # a write past the end, into the guard zone
    with pytest.raises(engine.OutOfBoundsWrite, match=r"out\[7\] was written but out has only 6 elements"):
        engine.read_output(full, out)
    assert engine.unwritten(engine.host_output((3, 1))).all()


def test_a_computed_nan_is_a_wrong_value_not_an_unwritten_entry():
    result = check("00_scale_add", writes_nan, verbose=False)
    assert result.diagnosis == "wrong_values"
    assert "never written" not in result.message and "got nan" in result.message


def test_the_judge_hands_each_case_its_launch():
    """No module state is switched: run receives plain_launch, or race_finding_launch on the
    cases race-checked (the first, or every one for a kernel with shared memory)."""
    from attention_lib.checks import engine
    library = EXERCISES["00_scale_add"]
    given = []

    def recording_run(answer, case, rng, launch):
        given.append(launch)
        return library.run(answer, case, rng, launch)

    exercise = engine.Exercise("test_recording", "scale_add, recorded", "kernel", recording_run,
                               library.cases, library.hint)
    assert engine._judge(exercise, basics.scale_add_kernel)[0] == "ok"
    assert given == [engine.race_finding_launch] + [engine.plain_launch] * (len(library.cases) - 1)
    assert not hasattr(engine, "_race_checking")
