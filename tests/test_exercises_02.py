"""Notebook 02's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math
import types

import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check
from attention_lib.stages import scores
from attention_lib.stages.scores import KT_WIDTH, TILE


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
        elif mistake == "own_scale":
            s[h, i, j] = acc / math.sqrt(q.shape[2])
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
    ("own_scale", "scale_ignored", "this case passes inv_sqrt_dk = 0.3: the kernel computed the scale itself"),
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


# --- 02_scores_tiled: the main exercise ---------------------------------------------------------

WIDE = 64          # a tile pair as wide as the model's d_k, for the answer that fixes d_k in its tiles
WIDE_PADDED = 65   # its q tile's rows: with 64 words, a warp's two rows would meet in every bank
ONE_PAD = 17       # rows of 16 words and one of padding


def tiled(mistake=None):
    """The solution of 02_scores_tiled, or the same with one typical mistake."""
    @cuda.jit
    def kernel(q, k, inv_sqrt_dk, s):
        if mistake == "q_loaded_down_columns":       # padded, so that its own stores stay free of conflicts
            q_tile = cuda.shared.array((TILE, KT_WIDTH), float32)
        else:
            q_tile = cuda.shared.array((TILE, TILE), float32)
        if mistake in ("unpadded", "not_transposed"):
            kt_tile = cuda.shared.array((TILE, TILE), float32)
        else:
            kt_tile = cuda.shared.array((TILE, KT_WIDTH), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        h = 0 if mistake == "head_dropped" else cuda.blockIdx.z
        i = cuda.blockIdx.y * TILE + ty
        j = cuda.blockIdx.x * TILE + tx
        key = ty if mistake == "key_block_dropped" else cuda.blockIdx.x * TILE + ty
        if mistake == "key_from_x":                  # the key copied taken from the thread's column along d_k
            key = cuda.blockIdx.x * TILE + tx
        q_scale = float32(1.0) if mistake in ("no_scale", "scale_in_k", "scale_at_end", "own_scale") \
            else inv_sqrt_dk
        k_scale = inv_sqrt_dk if mistake in ("scale_in_k", "scale_twice") else float32(1.0)
        acc = float32(0.0)
        if mistake == "columns_zeroed_once":         # the tiles zeroed before the loop, not at every step
            q_tile[ty, tx] = float32(0.0)
            kt_tile[tx, ty] = float32(0.0)
        d_k = q.shape[2]
        if mistake == "d_k_of_the_simulator":
            d_k = 16
        elif mistake == "extra_step":
            d_k = q.shape[2] + 1
        for c0 in range(0, d_k, TILE):
            c = c0 + tx
            q_ok = i < q.shape[1] and c < q.shape[2]
            k_ok = key < k.shape[1] and c < k.shape[2]
            if mistake == "columns_zeroed_once":     # a slot past d_k keeps what the zeroing before the loop put
                if c < q.shape[2]:
                    q_tile[ty, tx] = q[h, i, c] * q_scale if i < q.shape[1] else float32(0.0)
                if c < k.shape[2]:
                    kt_tile[tx, ty] = k[h, key, c] * k_scale if key < k.shape[1] else float32(0.0)
            elif mistake in ("no_zero_fill", "bounded_loop"):
                if q_ok:
                    q_tile[ty, tx] = q[h, i, c] * q_scale
                if k_ok:
                    kt_tile[tx, ty] = k[h, key, c] * k_scale
            elif mistake == "k_loaded_down_columns":  # the tile filled as it is read: a warp walks down k's rows
                row, col = cuda.blockIdx.x * TILE + tx, c0 + ty
                kt_tile[ty, tx] = k[h, row, col] if row < k.shape[1] and col < k.shape[2] else float32(0.0)
                q_tile[ty, tx] = q[h, i, c] * q_scale if q_ok else float32(0.0)
            elif mistake == "q_loaded_down_columns":  # a warp walks down q's rows
                row, col = cuda.blockIdx.y * TILE + tx, c0 + ty
                q_tile[tx, ty] = q[h, row, col] * q_scale if row < q.shape[1] and col < q.shape[2] else float32(0.0)
                kt_tile[tx, ty] = k[h, key, c] if k_ok else float32(0.0)
            elif mistake == "serial_q":               # lane 0 of each row copies its query's row in a loop
                if tx == 0:
                    for cc in range(TILE):
                        ok = i < q.shape[1] and c0 + cc < q.shape[2]
                        q_tile[ty, cc] = q[h, i, c0 + cc] * q_scale if ok else float32(0.0)
                kt_tile[tx, ty] = k[h, key, c] if k_ok else float32(0.0)
            elif mistake == "not_transposed":         # stored as k lies, read as if transposed
                q_tile[ty, tx] = q[h, i, c] * q_scale if q_ok else float32(0.0)
                kt_tile[ty, tx] = k[h, key, c] if k_ok else float32(0.0)
            elif mistake == "q_column_from_y":        # q's column from the query's thread, the guard left on x
                q_tile[ty, tx] = q[h, i, c0 + ty] * q_scale if q_ok else float32(0.0)
                kt_tile[tx, ty] = k[h, key, c] if k_ok else float32(0.0)
            elif mistake == "k_column_from_y":        # k's column from the key's thread, guarded so
                q_tile[ty, tx] = q[h, i, c] * q_scale if q_ok else float32(0.0)
                ok = key < k.shape[1] and c0 + ty < k.shape[2]
                kt_tile[tx, ty] = k[h, key, c0 + ty] if ok else float32(0.0)
            elif mistake == "serial_k":               # lane 0 of each row copies its key's row in a loop
                q_tile[ty, tx] = q[h, i, c] * q_scale if q_ok else float32(0.0)
                if tx == 0:
                    for cc in range(TILE):
                        ok = key < k.shape[1] and c0 + cc < k.shape[2]
                        kt_tile[cc, ty] = k[h, key, c0 + cc] if ok else float32(0.0)
            else:
                q_tile[ty, tx] = q[h, i, c] * q_scale if q_ok else float32(0.0)
                kt_tile[tx, ty] = k[h, key, c] * k_scale if k_ok else float32(0.0)
            if mistake == "barrier_in_if":
                if i < q.shape[1]:
                    cuda.syncthreads()
            elif mistake != "no_first_barrier":
                cuda.syncthreads()
            width = min(TILE, q.shape[2] - c0) if mistake == "bounded_loop" else TILE
            for cc in range(width):
                if mistake == "k_untiled":
                    if c0 + cc < k.shape[2] and j < k.shape[1]:
                        acc += q_tile[ty, cc] * k[h, j, c0 + cc]
                elif mistake == "untiled":
                    if c0 + cc < q.shape[2] and i < q.shape[1] and j < k.shape[1]:
                        acc += q[h, i, c0 + cc] * q_scale * k[h, j, c0 + cc]
                else:
                    acc += q_tile[ty, cc] * kt_tile[cc, tx]
            if mistake != "no_second_barrier":
                cuda.syncthreads()
        if i < s.shape[1] and j < s.shape[2]:
            if mistake == "scale_at_end":
                s[h, i, j] = acc * inv_sqrt_dk
            elif mistake == "own_scale":
                s[h, i, j] = acc / math.sqrt(q.shape[2])
            else:
                s[h, i, j] = acc
    return kernel


@cuda.jit
def k_tile_as_k_lies(q, k, inv_sqrt_dk, s):
    """A right answer in another style: k's tile kept as k lies, rows padded by one word, read down a
    column (the words of a warp's read fall in 16 banks); the sum stops at d_k instead of zero-filling
    the columns past it."""
    q_tile = cuda.shared.array((TILE, TILE), float32)
    k_tile = cuda.shared.array((TILE, ONE_PAD), float32)
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    row0, col0, h = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE, cuda.blockIdx.z
    total = float32(0.0)
    for step in range((q.shape[2] + TILE - 1) // TILE):
        c = step * TILE + x
        q_tile[y, x] = q[h, row0 + y, c] * inv_sqrt_dk if row0 + y < q.shape[1] and c < q.shape[2] else float32(0)
        k_tile[y, x] = k[h, col0 + y, c] if col0 + y < k.shape[1] and c < k.shape[2] else float32(0)
        cuda.syncthreads()
        for n in range(min(TILE, q.shape[2] - step * TILE)):
            total += q_tile[y, n] * k_tile[x, n]
        cuda.syncthreads()
    if row0 + y < s.shape[1] and col0 + x < s.shape[2]:
        s[h, row0 + y, col0 + x] = total


@cuda.jit
def one_tile_pair_of_d_k_64(q, k, inv_sqrt_dk, s):
    """Tiles as wide as ANDREA's d_k, 64, filled once: right up to d_k 64, a sum cut short at 128."""
    q_tile = cuda.shared.array((TILE, WIDE_PADDED), float32)
    kt_tile = cuda.shared.array((WIDE, KT_WIDTH), float32)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    i, j, key = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx, cuda.blockIdx.x * TILE + ty
    for r in range(WIDE // TILE):
        c = r * TILE + tx
        q_tile[ty, c] = q[h, i, c] * inv_sqrt_dk if i < q.shape[1] and c < q.shape[2] else float32(0.0)
        kt_tile[c, ty] = k[h, key, c] if key < k.shape[1] and c < k.shape[2] else float32(0.0)
    cuda.syncthreads()
    acc = float32(0.0)
    for c in range(WIDE):
        acc += q_tile[ty, c] * kt_tile[c, tx]
    if i < s.shape[1] and j < s.shape[2]:
        s[h, i, j] = acc


@cuda.jit
def scores_stored_down_columns(q, k, inv_sqrt_dk, s):
    """Right values, no bank conflict, but thread (x, y) scores query x and key y: a warp's store of s
    runs down a column."""
    q_tile = cuda.shared.array((TILE, ONE_PAD), float32)
    kt_tile = cuda.shared.array((TILE, KT_WIDTH), float32)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    row, key = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + ty
    acc = float32(0.0)
    for c0 in range(0, q.shape[2], TILE):
        c = c0 + tx
        q_tile[ty, tx] = q[h, row, c] * inv_sqrt_dk if row < q.shape[1] and c < q.shape[2] else float32(0.0)
        kt_tile[tx, ty] = k[h, key, c] if key < k.shape[1] and c < k.shape[2] else float32(0.0)
        cuda.syncthreads()
        for cc in range(TILE):
            acc += q_tile[tx, cc] * kt_tile[cc, ty]
        cuda.syncthreads()
    i, j = cuda.blockIdx.y * TILE + tx, cuda.blockIdx.x * TILE + ty
    if i < s.shape[1] and j < s.shape[2]:
        s[h, i, j] = acc


@cuda.jit
def one_thread_writes_the_block(q, k, inv_sqrt_dk, s):
    """Right values, but thread (0, 0) of each block computes and stores all its scores from the tiles."""
    q_tile = cuda.shared.array((TILE, TILE), float32)
    kt_tile = cuda.shared.array((TILE, KT_WIDTH), float32)
    sums = cuda.shared.array((TILE, TILE), float32)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    row0, col0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    sums[ty, tx] = float32(0.0)
    for c0 in range(0, q.shape[2], TILE):
        c = c0 + tx
        ok = row0 + ty < q.shape[1] and c < q.shape[2]
        q_tile[ty, tx] = q[h, row0 + ty, c] * inv_sqrt_dk if ok else float32(0.0)
        ok = col0 + ty < k.shape[1] and c < k.shape[2]
        kt_tile[tx, ty] = k[h, col0 + ty, c] if ok else float32(0.0)
        cuda.syncthreads()
        if tx == 0 and ty == 0:
            for a in range(TILE):
                for b in range(TILE):
                    for cc in range(TILE):
                        sums[a, b] += q_tile[a, cc] * kt_tile[cc, b]
        cuda.syncthreads()
    if tx == 0 and ty == 0:
        for a in range(TILE):
            for b in range(TILE):
                if row0 + a < s.shape[1] and col0 + b < s.shape[2]:
                    s[h, row0 + a, col0 + b] = sums[a, b]


@cuda.jit
def tiled_in_float64(q, k, inv_sqrt_dk, s):
    """The solution with its sum begun as a Python float: float64 on a GPU."""
    q_tile = cuda.shared.array((TILE, TILE), float32)
    kt_tile = cuda.shared.array((TILE, KT_WIDTH), float32)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    i, j, key = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx, cuda.blockIdx.x * TILE + ty
    acc = 0.0
    for c0 in range(0, q.shape[2], TILE):
        c = c0 + tx
        q_tile[ty, tx] = q[h, i, c] * inv_sqrt_dk if i < q.shape[1] and c < q.shape[2] else float32(0.0)
        kt_tile[tx, ty] = k[h, key, c] if key < k.shape[1] and c < k.shape[2] else float32(0.0)
        cuda.syncthreads()
        for cc in range(TILE):
            acc += q_tile[ty, cc] * kt_tile[cc, tx]
        cuda.syncthreads()
    if i < s.shape[1] and j < s.shape[2]:
        s[h, i, j] = acc


@cuda.jit
def calls_tile_dot(q, k, inv_sqrt_dk, s):
    j, i = cuda.grid(2)
    acc = scores.tile_dot(q, k, cuda.blockIdx.z, i, j)
    if i < s.shape[1] and j < s.shape[2]:
        s[cuda.blockIdx.z, i, j] = acc * inv_sqrt_dk


def test_02_the_library_kernel_is_the_main_solution():
    assert EXERCISES["02_scores_tiled"].solution is scores.scores_tiled_kernel
    assert verdict("02_scores_tiled", as_answer(scores.scores_tiled_kernel)).diagnosis == "ok"
    assert verdict("02_scores_tiled", scores.scores_tiled_kernel).diagnosis == "calls_given_code"


FIRST = "at BH = 2, T_q = 15, T_k = 17, d_k = 5, inv_sqrt_dk = 0.3: "
SECOND = "at BH = 1, T_q = 16, T_k = 16, d_k = 16, inv_sqrt_dk = 0.5: "
D_K_64 = "at BH = 1, T_q = 15, T_k = 16, d_k = 64, inv_sqrt_dk = 0.2: "
D_K_33 = "at BH = 1, T_q = 17, T_k = 16, d_k = 33, inv_sqrt_dk = 0.7: "


@pytest.mark.parametrize("answer, diagnosis, says", [
    (tiled(), "ok", "correct at every size"),
    (k_tile_as_k_lies, "ok", "correct at every size"),
    (tiled("no_scale"), "missing_scale", FIRST + "the scores are q.k without the scale"),
    (tiled("scale_twice"), "scale_applied_twice", FIRST + "the scores came out multiplied by inv_sqrt_dk = 0.3 twice"),
    (tiled("own_scale"), "scale_ignored", FIRST + "the scores came out divided by sqrt(d_k) = 2.24, but this case "
                                         "passes inv_sqrt_dk = 0.3"),
    (tiled("scale_in_k"), "scale_not_folded", FIRST + "the values are right, but after this case"),
    (tiled("scale_at_end"), "scale_not_folded", "one holds them unscaled"),
    (tiled("not_transposed"), "tile_not_transposed", FIRST + "the scores are those of a tile of k read with its row "
                                                     "and column exchanged"),
    (tiled("key_block_dropped"), "key_block_dropped", FIRST + "the scores of key j came out as those of key j mod 16"),
    (tiled("key_from_x"), "wrong_thread_axis", FIRST + "the copy of k took the key (the row of k it reads) from "
                                                   "threadIdx.x"),
    (tiled("q_column_from_y"), "wrong_thread_axis", FIRST + "thread (0, 5, 0) of block (0, 0, 0) read q[0, 5, 5], "
                                                        "outside q of shape (2, 15, 5): the copy of q took its column "
                                                        "along d_k from threadIdx.y"),
    (tiled("k_column_from_y"), "wrong_thread_axis", FIRST + "the copy of k took its column along d_k from threadIdx.y"),
    (tiled("d_k_of_the_simulator"), "d_k_cut_short", D_K_64 + "the sums stopped after 16 of d_k = 64 columns"),
    (one_tile_pair_of_d_k_64, "d_k_cut_short", "d_k = 128, inv_sqrt_dk = 1.5: the sums stopped after 64 of d_k = "
                                               "128 columns"),
    (tiled("extra_step"), "extra_barriers", "at BH = 1, T_q = 16, T_k = 16, d_k = 16, inv_sqrt_dk = 0.5: the values "
                                            "are right, but a thread passed 4 barriers, where the limit is 2"),
    (tiled("no_zero_fill"), "stale_tile", FIRST + "thread"),
    (tiled("bounded_loop"), "stale_tile", "it holds an old number"),
    (tiled("columns_zeroed_once"), "edge_not_zeroed", D_K_33 + "thread"),
    (tiled("no_first_barrier"), "race", FIRST + "race on shared"),
    (tiled("no_second_barrier"), "race", D_K_64 + "race on shared"),
    (tiled("barrier_in_if"), "divergent_barrier", "undefined on a GPU"),
    (tiled("head_dropped"), "race", "blocks never wait for each other"),
    (tiled("untiled"), "no_reuse", FIRST + "the values are right, but an element of q was read up to 19 times from "
                                           "global memory, where the limit is 2"),
    (tiled("k_untiled"), "no_reuse", FIRST + "the values are right, but an element of k was read up to"),
    (tiled("q_loaded_down_columns"), "uncoalesced", "the values are right, but a warp's load of q at"),
    (tiled("serial_q"), "serial_copy", FIRST + "the values are right, but one warp "),
    (tiled("k_loaded_down_columns"), "uncoalesced", SECOND + "the values are right, but a warp's load of k at"),
    (scores_stored_down_columns, "uncoalesced", "a warp's store of s at"),
    (tiled("serial_k"), "serial_copy", FIRST + "the values are right, but one warp "),
    (one_thread_writes_the_block, "serial_copy", FIRST + "the values are right, but one warp "),
    (tiled("unpadded"), "bank_conflict", FIRST + "the values are right, but a warp's store of kt_tile at"),
    (tiled_in_float64, "float64_arithmetic", "acc = 0.0"),
    (calls_tile_dot, "calls_given_code", "tile_dot"),
])
def test_02_scores_tiled(answer, diagnosis, says):
    result = verdict("02_scores_tiled", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


@cuda.jit
def k_tile_as_k_lies_unpadded(q, k, inv_sqrt_dk, s):
    """k_tile_as_k_lies with rows of 16 words: the sum's read down a column puts a warp's 16 words in 2 banks."""
    q_tile = cuda.shared.array((TILE, TILE), float32)
    k_tile = cuda.shared.array((TILE, TILE), float32)
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    row0, col0, h = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE, cuda.blockIdx.z
    total = float32(0.0)
    for step in range((q.shape[2] + TILE - 1) // TILE):
        c = step * TILE + x
        q_tile[y, x] = q[h, row0 + y, c] * inv_sqrt_dk if row0 + y < q.shape[1] and c < q.shape[2] else float32(0)
        k_tile[y, x] = k[h, col0 + y, c] if col0 + y < k.shape[1] and c < k.shape[2] else float32(0)
        cuda.syncthreads()
        for n in range(min(TILE, q.shape[2] - step * TILE)):
            total += q_tile[y, n] * k_tile[x, n]
        cuda.syncthreads()
    if row0 + y < s.shape[1] and col0 + x < s.shape[2]:
        s[h, row0 + y, col0 + x] = total


def test_02_a_tile_read_down_its_unpadded_columns_is_a_bank_conflict():
    result = verdict("02_scores_tiled", k_tile_as_k_lies_unpadded)
    assert result.diagnosis == "bank_conflict" and "a warp's read of k_tile" in result.message, result.message
    assert "puts 8 different words in one bank" in result.message, result.message


def test_02_the_cases_reach_every_edge_of_the_tile_and_the_model_widths():
    """T_q and T_k one short of a tile, a whole tile and one past; d_k 5, 16, 33, 64 and 128; no case passes
    1/sqrt(d_k), and the first has more than one block of keys and two heads."""
    cases = EXERCISES["02_scores_tiled"].cases_for("simulator")
    for axis in (1, 2):
        assert {c[axis] % TILE for c in cases} >= {TILE - 1, 0, 1}, axis
    assert sorted(c[3] for c in cases) == [5, 16, 33, 64, 128]
    assert all(not math.isclose(c[4], 1 / math.sqrt(c[3]), rel_tol=1e-3) for c in cases)
    assert cases[0][0] > 1 and cases[0][2] > TILE
    assert min(cases[0][1:4]) > 1      # an index from the wrong thread axis changes the first case's values


@pytest.mark.parametrize("exercise_id", ["02_scaled_scores", "02_scores_tiled"])
def test_02_hints_name_the_idea_then_the_plan_then_where_answers_go_wrong(exercise_id):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) == 3 and hints[1].startswith("the plan") and hints[2].startswith("where answers go wrong")
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text
