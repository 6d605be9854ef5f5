"""Notebook 05's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line.

The solution is checked as a student submits it (mutation.solution_copy: the library's code in a new
function; the library's own kernel would be refused as given code). The mistakes below are the
solution with one thing changed, the way students write them.
"""

import numpy as np
import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check, mutation
from attention_lib.stages import projection, toy_model
from attention_lib.stages.projection import TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 05_weighted_sum (warm-up): one thread per output element --------------------------------------

@cuda.jit
def weighted_sum_solution(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(a.shape[2]):
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_rows_from_x(a, v, out):
    row, col = cuda.grid(2)                            # the query from the grid's x
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(a.shape[2]):
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_columns_of_a(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(a.shape[2]):
            acc += a[h, j, row] * v[h, j, col]         # column `row` of the weights
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_without_guard(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    acc = float32(0.0)
    for j in range(a.shape[2]):
        acc += a[h, row, j] * v[h, j, col]
    out[h, row, col] = acc


@cuda.jit
def weighted_sum_head_0(a, v, out):
    col, row = cuda.grid(2)
    if row < a.shape[1] and col < v.shape[2]:
        for h in range(a.shape[0]):
            acc = float32(0.0)
            for j in range(a.shape[2]):
                acc += a[0, row, j] * v[0, j, col]     # every head gets head 0's output
            out[h, row, col] = acc


@cuda.jit
def weighted_sum_by_tile_matmul(a, v, out):
    col, row = cuda.grid(2)
    acc = projection.tile_matmul(a[cuda.blockIdx.z], v[cuda.blockIdx.z], row, col)
    if row < a.shape[1] and col < v.shape[2]:
        out[cuda.blockIdx.z, row, col] = acc


@cuda.jit
def weighted_sum_stub(a, v, out):
    raise NotImplementedError()


@cuda.jit
def weighted_sum_python_float(a, v, out):
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    if row < a.shape[1] and col < v.shape[2]:
        acc = 0.0                                      # a Python float: float64 on a GPU
        for j in range(a.shape[2]):
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["05_weighted_sum"]),
                                    lambda: weighted_sum_solution])
def test_the_weighted_sum_solution_passes(answer):
    result = verdict("05_weighted_sum", answer())
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (weighted_sum_rows_from_x, "grid_axes_swapped", "the grid's x runs along the output's columns"),
    (weighted_sum_columns_of_a, "weights_transposed", "read column i of the weights"),
    (weighted_sum_without_guard, "out_of_bounds", "out-of-bounds "),
    (weighted_sum_head_0, "race", "blocks never wait for each other"),     # every block writes the same elements: an inter-block race
    (weighted_sum_by_tile_matmul, "calls_given_code", "tile_matmul"),
    (weighted_sum_stub, "not_implemented", "Hint"),
    (weighted_sum_python_float, "float64_arithmetic", "acc = 0.0"),
])
def test_weighted_sum_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("05_weighted_sum", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


# --- 05_causal_av (main): the causal tiled kernel ------------------------------------------------

@cuda.jit
def causal_av_solution(a, v, out):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    v_tile = cuda.shared.array((TILE, TILE), float32)
    col, row = cuda.grid(2)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    (t_q, t_k), d_v, acc = a.shape[1:], v.shape[2], float32(0.0)
    k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE + t_k - t_q)
    for start in range(0, k_end, TILE):
        a_tile[ty, tx] = a[h, row, start + tx] if row < t_q and start + tx < k_end else float32(0.0)
        v_tile[ty, tx] = v[h, start + ty, col] if start + ty < k_end and col < d_v else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            acc += a_tile[ty, j] * v_tile[j, tx]
        cuda.syncthreads()
    if row < t_q and col < d_v:
        out[h, row, col] = acc


def causal_av(stop="block", barriers=(True, True), guard_loads=True, zeroed=("a", "v"), a_across=True,
              extra_step=False, walk="to the stop", col_from_grid=True):
    """The solution with one thing changed: the stopping point (`stop`), a barrier left out, the
    loads unguarded, a tile not zeroed past the edges (`zeroed`), a's tile loaded down its columns
    (neighbouring threads reading rows T_k apart), one step more than the visible keys need
    (`extra_step`), the walk past the stop, the loads still guarded at it (`walk`: "every tile", to
    T_k; "a tile past", one step more up to T_k), or the column taken from threadIdx.x alone
    (`col_from_grid` False)."""
    first_barrier, second_barrier = barriers
    zero_a, zero_v = "a" in zeroed, "v" in zeroed

    @cuda.jit
    def kernel(a, v, out):
        a_tile = cuda.shared.array((TILE, TILE), float32)
        v_tile = cuda.shared.array((TILE, TILE), float32)
        col, row = cuda.grid(2)
        tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
        if not col_from_grid:
            col = tx                                   # every block of a row of blocks: columns 0 to TILE - 1
        (t_q, t_k), d_v, acc = a.shape[1:], v.shape[2], float32(0.0)
        if stop == "block":
            k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE + t_k - t_q)
        elif stop == "every key":
            k_end = t_k
        elif stop == "rounded up":                     # the end of the diagonal tile: no tile above loaded
            k_end = min(t_k, -(-((cuda.blockIdx.y + 1) * TILE + t_k - t_q) // TILE) * TILE)
        elif stop == "before the diagonal":
            k_end = min(t_k, cuda.blockIdx.y * TILE + t_k - t_q)
        elif stop == "no offset":
            k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE)
        else:                                          # "own query": differs between a block's threads
            k_end = min(t_k, row + 1 + t_k - t_q)
        walk_end = k_end + 1 if extra_step else k_end
        if walk == "every tile":
            walk_end = t_k
        elif walk == "a tile past":
            walk_end = min(t_k, k_end + TILE)
        for start in range(0, walk_end, TILE):
            if not a_across:                           # thread (tx, ty) loads query block_row + tx, key start + ty
                query = cuda.blockIdx.y * TILE + tx
                a_tile[tx, ty] = a[h, query, start + ty] if query < t_q and start + ty < k_end else float32(0.0)
                v_tile[ty, tx] = v[h, start + ty, col] if start + ty < k_end and col < d_v else float32(0.0)
            elif not (zero_a and zero_v):              # one tile left as it was past the edges
                if row < t_q and start + tx < k_end:
                    a_tile[ty, tx] = a[h, row, start + tx]
                elif zero_a:
                    a_tile[ty, tx] = float32(0.0)
                if start + ty < k_end and col < d_v:
                    v_tile[ty, tx] = v[h, start + ty, col]
                elif zero_v:
                    v_tile[ty, tx] = float32(0.0)
            elif guard_loads:
                a_tile[ty, tx] = a[h, row, start + tx] if row < t_q and start + tx < k_end else float32(0.0)
                v_tile[ty, tx] = v[h, start + ty, col] if start + ty < k_end and col < d_v else float32(0.0)
            else:
                a_tile[ty, tx] = a[h, row, start + tx]
                v_tile[ty, tx] = v[h, start + ty, col]
            if first_barrier:
                cuda.syncthreads()
            for j in range(TILE):
                acc += a_tile[ty, j] * v_tile[j, tx]
            if second_barrier:
                cuda.syncthreads()
        if row < t_q and col < d_v:
            out[h, row, col] = acc
    return kernel


@cuda.jit
def causal_av_without_tiles(a, v, out):
    """Right values, no tile ever loaded above the diagonal, and no shared memory: every thread reads
    its query's weights and its feature's values from main memory."""
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    t_q, t_k = a.shape[1:]
    if row < t_q and col < v.shape[2]:
        acc = float32(0.0)
        for j in range(min(t_k, row + 1 + t_k - t_q)):
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@cuda.jit
def causal_av_by_tile_count(a, v, out):
    """Another right design: the walk counts the block's visible key tiles, and guards its loads at T_k
    and the last query (inside the diagonal tile every weight past the stop is a 0 of a)."""
    a_tile = cuda.shared.array((TILE, TILE), float32)
    v_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    row, col = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx
    t_q, t_k, d_v = a.shape[1], a.shape[2], v.shape[2]
    last_key = min(t_q, (cuda.blockIdx.y + 1) * TILE) - 1 + t_k - t_q        # the block's last query's
    tiles = (last_key + TILE) // TILE if last_key >= 0 else 0
    acc = float32(0.0)
    for t in range(tiles):
        key = t * TILE
        a_tile[ty, tx] = a[h, row, key + tx] if row < t_q and key + tx < t_k else float32(0.0)
        v_tile[ty, tx] = v[h, key + ty, col] if key + ty < t_k and col < d_v else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            acc += a_tile[ty, j] * v_tile[j, tx]
        cuda.syncthreads()
    if row < t_q and col < d_v:
        out[h, row, col] = acc


@cuda.jit
def causal_av_stub(a, v, out):
    raise NotImplementedError()


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["05_causal_av"]),
                                    lambda: causal_av_solution, lambda: causal_av(stop="rounded up"),
                                    lambda: causal_av_by_tile_count],
                         ids=["solution-copy", "solution", "rounded-up-stop", "tile-count"])
def test_the_causal_av_solution_passes(answer):
    result = verdict("05_causal_av", answer())
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("answer, diagnosis, says", [
    (causal_av(stop="every key"), "no_tiles_skipped", "wholly above the diagonal"),
    (causal_av(stop="before the diagonal"), "diagonal_tile_skipped", "the key tile on the diagonal"),
    (causal_av(stop="no offset"), "mask_ignores_offset", "the queries are the last positions"),
    (causal_av(stop="own query"), "divergent_barrier", "hangs the block"),
    (causal_av(barriers=(False, True)), "race", "a_tile"),
    (causal_av(barriers=(True, False)), "race", "_tile"),
    (causal_av(guard_loads=False), "out_of_bounds", "out-of-bounds "),
    (weighted_sum_by_tile_matmul, "calls_given_code", "tile_matmul"),
    (causal_av_stub, "not_implemented", "Hint"),
    (causal_av_without_tiles, "no_reuse", "an element of a was read up to 5 times from global memory, where the limit is 1"),
    (causal_av(a_across=False), "uncoalesced", "a warp's load of a"),
    (causal_av(zeroed=("a",)), "stale_tile", "v_tile"),
    (causal_av(zeroed=("v",)), "stale_tile", "a_tile"),
    (causal_av(extra_step=True), "extra_barriers", "passed 4 barriers, where that block's limit is 2: two a step"),
    (causal_av(walk="every tile"), "extra_barriers", "(BH 1, T_q 33, T_k 15, d_v 1): the values are right, but a "
     "thread of block (0, 0, 0) passed 2 barriers, where that block's limit is 0: two a step, one step for each "
     "key tile the block's own queries see"),
    (causal_av(walk="a tile past"), "extra_barriers", "block (0, 0, 0) passed 2 barriers, where that block's limit is 0"),
    (causal_av(col_from_grid=False), "race", "(BH 1, T_q 9, T_k 9, d_v 64): race on global 'out'"),
])
def test_causal_av_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("05_causal_av", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


# --- 05_induction_key (predict, then check): the key the trained induction head picks ------------

def induction_key_solution(tokens, i):
    earlier = np.flatnonzero(tokens[:i] == tokens[i])
    return earlier[-1] + 1


def induction_key_by_a_loop(tokens, i):
    """The same rule, walking back from the query."""
    for j in range(i - 1, -1, -1):
        if tokens[j] == tokens[i]:
            return j + 1
    return -1


def induction_key_the_earlier_occurrence(tokens, i):
    return np.flatnonzero(tokens[:i] == tokens[i])[-1]


def induction_key_previous_token(tokens, i):
    return i - 1


def induction_key_the_query_itself(tokens, i):
    return i


def induction_key_not_returned(tokens, i):
    np.flatnonzero(tokens[:i] == tokens[i])


def induction_key_from_the_model(tokens, i):
    return toy_model.layer_heads(toy_model.load_trained()[0], tokens, 1)[3][1][i].argmax()


def induction_key_from_the_next_token(tokens, i):
    """Right on every exact repeat, but it reads the token after the query, which the head cannot see."""
    return int(np.argmax(tokens == tokens[i + 1]))


def induction_key_stub(tokens, i):
    raise NotImplementedError()


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["05_induction_key"]),
                                    lambda: induction_key_solution, lambda: induction_key_by_a_loop])
def test_the_induction_key_solution_passes(answer):
    result = verdict("05_induction_key", answer())
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (induction_key_the_earlier_occurrence, "earlier_occurrence_itself", "one position further"),
    (induction_key_previous_token, "previous_token", "layer 0"),
    (induction_key_the_query_itself, "wrong_values", "first at query 4 (token"),
    (induction_key_not_returned, "raised_error", "TypeError"),
    (induction_key_from_the_next_token, "reads_the_future", "once the tokens after position 4 change: the head at "
                                                            "query 4 sees tokens 0 to 4 only"),
    (induction_key_from_the_model, "calls_given_code", "layer_heads"),
    (induction_key_stub, "not_implemented", "Hint"),
])
def test_induction_key_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("05_induction_key", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


def test_hints_give_the_idea_then_the_plan_then_the_pitfalls_and_name_no_code():
    for exercise_id in ("05_weighted_sum", "05_causal_av", "05_induction_key"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) == 3 and hints[1].startswith("where each step goes")
        assert hints[2].startswith("where answers go wrong")
        for text in hints:
            assert not any(code in text for code in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
