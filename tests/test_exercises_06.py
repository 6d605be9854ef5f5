"""Notebook 06's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint
from attention_lib.stages import multihead
from attention_lib.stages.scores import tile_dot


# --- 06_split_heads (warm-up): out[b, h, t, c] = x[b, t, h * d_k + c] --------------------------

@cuda.jit
def split_solution(x, out):
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_interleaved(x, out):
    """The typical mistake: head h takes every n_head-th column (x.reshape(T, d_k, n_head))."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, c * n_head + h]


@cuda.jit
def split_without_guard(x, out):
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    out[bh // n_head, bh % n_head, t, c] = x[bh // n_head, t, (bh % n_head) * d_k + c]


@cuda.jit
def split_first_sequence_only(x, out):
    """Forgets the batch: every grid layer is taken for a head of sequence 0."""
    c, t = cuda.grid(2)
    h = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    if t < out.shape[2] and c < d_k and h < n_head:
        out[0, h, t, c] = x[0, t, h * d_k + c]


@cuda.jit
def split_layer_misread(x, out):
    """The grid layer decoded the wrong way round: b = z % n_head runs past the batch."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh % n_head, bh // n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_transposed_in_block(x, out):
    """The block's 16 x 16 tile copied with threadIdx.x along t: right, but a warp reads a column of x."""
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.y
    t = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.x
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_reads_twice(x, out):
    """Reads its element of x twice (once to test it): right values, twice the reads."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        if x[b, t, h * d_k + c] == x[b, t, h * d_k + c]:
            out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_stub(x, out):
    raise NotImplementedError()


@pytest.mark.parametrize("answer, diagnosis, says", [
    (split_solution, "ok", "correct at every size"),
    (split_interleaved, "heads_interleaved", "every n_head-th column"),
    (split_without_guard, "out_of_bounds", "out-of-bounds"),
    (split_first_sequence_only, "wrong_values", "never written"),
    (split_layer_misread, "grid_layer_order", "z = b * n_head + h"),
    (split_transposed_in_block, "uncoalesced", "segments of 128 bytes"),
    (split_reads_twice, "no_reuse", "read up to"),
    (split_stub, "not_implemented", "Hint:"),
    (lambda x, out: None, "not_a_kernel", "@cuda.jit"),
    (multihead.split_heads_kernel, "calls_given_code", "split_heads_kernel"),
], ids=["solution", "interleaved", "no_guard", "batch_ignored", "layer_misread", "transposed_in_block",
        "reads_twice", "stub", "plain_function", "library_kernel"])
def test_split_heads_diagnoses(answer, diagnosis, says):
    result = check("06_split_heads", answer, verbose=False)
    assert (result.diagnosis, result.passed, says in result.message) == (diagnosis, diagnosis == "ok", True), result
    assert "\n" not in str(result)


# --- 06_qkv_scores (main): every head's scores read in place from the fused projection ---------
# The given part of the skeleton (the grid, the tiles right of the diagonal), then the answer's.

@cuda.jit
def qkv_scores_solution(qkv, n_head, n_kv_head, inv_sqrt_dk, causal, s):
    j, i = cuda.grid(2)
    z, T = cuda.blockIdx.z, s.shape[1]
    if causal and cuda.blockIdx.x > cuda.blockIdx.y:
        if i < T and j < T:
            s[z, i, j] = -math.inf
        return
    b, h = z // n_head, z % n_head
    d_k = qkv.shape[2] // (n_head + 2 * n_kv_head)
    group = n_head // n_kv_head
    q_view = qkv[:, :, h * d_k:(h + 1) * d_k]
    k_view = qkv[:, :, (n_head + h // group) * d_k:(n_head + h // group + 1) * d_k]
    acc = tile_dot(q_view, k_view, b, i, j)
    if i < T and j < T:
        if causal and j > i:
            s[z, i, j] = -math.inf
        else:
            s[z, i, j] = acc * inv_sqrt_dk


def scores_with(k_head=None, k_start=None, heads=None, layer_order=False, scale_power=1, mask=">", guard=True,
                group=None, layer=None, skip=True, skip_returns=True):
    """A planted answer: the solution with one step changed.

    k_head(h, group, n_kv_head): the K/V head query head h reads; k_start(g, n_head, n_kv_head): the
    first column of K/V head g (in heads of d_k); heads: the head count d_k is worked out from (None:
    n_head + 2 n_kv_head, "3n": 3 n_head, "n": n_head); group(n_head, n_kv_head): the group size;
    layer_order: z read as h * B + b; layer(z, n_head, B) -> (b, h): another reading of z;
    scale_power: the scale's power; mask: ">" (j > i masked), ">=" or None; guard: the store's bounds
    guard; skip: the causal tile skip; skip_returns: whether the skipping block leaves."""
    k_head = k_head or (lambda h, group, n_kv: h // group)
    k_start = k_start or (lambda g, n, n_kv: n + g)
    group = group or (lambda n, n_kv: n // n_kv)
    layer = layer or ((lambda z, n, B: (z % B, z // B)) if layer_order else (lambda z, n, B: (z // n, z % n)))
    width_of = {None: lambda n, n_kv: n + 2 * n_kv, "3n": lambda n, n_kv: 3 * n, "n": lambda n, n_kv: n}[heads]
    k_head, k_start = cuda.jit(device=True)(k_head), cuda.jit(device=True)(k_start)
    width_of, group, layer = cuda.jit(device=True)(width_of), cuda.jit(device=True)(group), cuda.jit(device=True)(layer)

    @cuda.jit
    def planted(qkv, n_head, n_kv_head, inv_sqrt_dk, causal, s):
        j, i = cuda.grid(2)
        z, T = cuda.blockIdx.z, s.shape[1]
        if skip and causal and cuda.blockIdx.x > cuda.blockIdx.y:
            if i < T and j < T:
                s[z, i, j] = -math.inf
            if skip_returns:
                return
        b, h = layer(z, n_head, qkv.shape[0])
        d_k = qkv.shape[2] // width_of(n_head, n_kv_head)
        g = k_head(h, group(n_head, n_kv_head), n_kv_head)
        k_col = k_start(g, n_head, n_kv_head) * d_k
        acc = tile_dot(qkv[:, :, h * d_k:(h + 1) * d_k], qkv[:, :, k_col:k_col + d_k], b, i, j)
        if (i < T and j < T) or not guard:
            masked = causal and ((mask == ">" and j > i) or (mask == ">=" and j >= i))
            if masked:
                s[z, i, j] = -math.inf
            else:
                s[z, i, j] = acc * inv_sqrt_dk ** scale_power
    return planted


@cuda.jit
def qkv_scores_from_global(qkv, n_head, n_kv_head, inv_sqrt_dk, causal, s):
    """Right values, no tiles: each thread reads its query row and key row from global memory."""
    j, i = cuda.grid(2)
    z, T = cuda.blockIdx.z, s.shape[1]
    if causal and cuda.blockIdx.x > cuda.blockIdx.y:
        if i < T and j < T:
            s[z, i, j] = -math.inf
        return
    b, h = z // n_head, z % n_head
    d_k = qkv.shape[2] // (n_head + 2 * n_kv_head)
    q_col, k_col = h * d_k, (n_head + h // (n_head // n_kv_head)) * d_k
    if i < T and j < T:
        acc = np.float32(0.0)
        for c in range(d_k):
            acc += qkv[b, i, q_col + c] * qkv[b, j, k_col + c]
        s[z, i, j] = np.float32(-math.inf) if causal and j > i else acc * inv_sqrt_dk


@cuda.jit
def qkv_scores_stub(qkv, n_head, n_kv_head, inv_sqrt_dk, causal, s):
    j, i = cuda.grid(2)
    raise NotImplementedError()


@cuda.jit
def split_layers_head_major(x, out):
    """Grid layer z read as h * B + b: still one layer per (sequence, head), so still right."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    B, d_k = out.shape[0], out.shape[3]
    b, h = bh % B, bh // B
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


def test_any_one_to_one_reading_of_the_grid_layer_splits_right():
    assert check("06_split_heads", split_layers_head_major, verbose=False).passed


def test_the_qkv_scores_solution_passes():
    result = check("06_qkv_scores", qkv_scores_solution, verbose=False)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (scores_with(k_head=lambda h, group, n_kv: h), "kv_head_not_shared", "as if every query head had its own"),
    (scores_with(k_head=lambda h, group, n_kv: h % n_kv), "kv_head_interleaved", "dealt out in turn"),
    (scores_with(k_start=lambda g, n, n_kv: g), "wrong_k_block", "inside Q's columns"),
    (scores_with(k_start=lambda g, n, n_kv: n + n_kv + g), "wrong_k_block", "from V's columns"),
    (scores_with(heads="3n"), "wrong_head_width", "heads of d_k side by side, not 12"),
    (scores_with(heads="n"), "view_past_the_end", "d_k came out too large"),
    (scores_with(k_start=lambda g, n, n_kv: n + 2 * n_kv + g), "view_past_the_end", "starts too close"),
    (scores_with(layer_order=True), "grid_layer_order", "z = b * n_head + h"),
    (scores_with(layer=lambda z, n, B: (z % n, z // n)), "grid_layer_order", "decoded from z is out of range"),
    (scores_with(k_head=lambda h, group, n_kv: h // n_kv), "wrong_group", "h // n_kv_head"),
    (scores_with(group=lambda n, n_kv: n_kv // n), "wrong_group", "division by zero"),
    (scores_with(skip=False), "skips_too_few", "right of the diagonal"),
    (scores_with(skip_returns=False), "skips_too_few", "right of the diagonal"),
    (qkv_scores_from_global, "no_reuse", "read up to"),
    (scores_with(scale_power=0), "missing_scale", "not multiplied by inv_sqrt_dk"),
    (scores_with(scale_power=2), "scaled_by_d_k", "twice"),
    (scores_with(mask=None), "mask_not_applied", "j > i were kept"),
    (scores_with(mask=">="), "mask_includes_diagonal", "(j = i) was masked"),
    (scores_with(guard=False), "out_of_bounds", "global array 's'"),
    (qkv_scores_stub, "not_implemented", "Hint:"),
    (multihead.qkv_scores_kernel, "calls_given_code", "qkv_scores_kernel"),
], ids=["not_shared", "interleaved", "k_in_q", "k_in_v", "width_3n", "width_n", "past_the_end", "layer_order",
        "layer_past_batch", "group_n_kv", "group_zero", "no_skip", "skip_without_return", "from_global", "no_scale",
        "scale_twice", "no_mask", "mask_diagonal", "no_guard", "stub", "library_kernel"])
def test_qkv_scores_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = check("06_qkv_scores", answer, verbose=False)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result
    assert "\n" not in str(result)


def test_the_hints_of_06_give_no_code(capsys):
    for exercise_id in ("06_split_heads", "06_qkv_scores"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: the plan")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
