"""Notebook 08's exercises and 08x's: each solution gets ok, each typical mistake its own diagnosis, in
one line; hints in levels, without code."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint, mutation
from attention_lib.stages.flash import COL_GROUPS, MICRO_D, MICRO_M, MICRO_N, NEG_INF, ROW_GROUPS

IDS = ["08_online_update", "08_row_reduce", "08_scores_to_p", "08x_packed_rows"]


def assert_diagnosis(exercise_id, answer, diagnosis, says):
    result = check(exercise_id, answer, verbose=False)
    assert (result.diagnosis, says in result.message) == (diagnosis, True), result.message
    assert not result.passed and "\n" not in str(result)


@pytest.mark.parametrize("exercise_id", IDS)
def test_hints_come_in_levels_without_code(exercise_id, capsys):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) >= 2
    hint(exercise_id, 2)
    assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: the plan")
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


@pytest.mark.parametrize("exercise_id", IDS)
def test_the_solution_passes_and_is_compiled_for_a_gpu(exercise_id):
    exercise = EXERCISES[exercise_id]
    assert exercise.gpu_code
    result = check(exercise_id, mutation.solution_copy(exercise), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


# --- 08_online_update ----------------------------------------------------------------------------

def variant(exercise_id, *changes):
    """The exercise's solution with each (old, new) text change made (mutation.variant)."""
    return mutation.variant(EXERCISES[exercise_id], *changes)


UPDATE_MISTAKES = {
    "no_rescale": [("l[a] *= rescale", "pass"), ("o[a * MICRO_D + e] *= rescale", "pass")],
    "l_only": [("o[a * MICRO_D + e] *= rescale", "pass")],
    "o_only": [("l[a] *= rescale", "pass")],
    "max_kept": [("m[a] = m_new", "pass")],
    "natural_exp": [("math.exp2(m[a] - shift)", "math.exp(m[a] - shift)"),
                    ("math.exp2(s[a * MICRO_N + b] - shift)", "math.exp(s[a * MICRO_N + b] - shift)")],
    "no_guard": [("m_new if m_new != NEG_INF else np.float32(0.0)", "m_new")],
    "first_column_only": [("for e in range(MICRO_D):", "for e in range(1):")],
}


@cuda.jit(device=True)
def update_sliced(s, m, l, o, tile_max):
    """Right on the simulator; a GPU's compiler has no in-place multiply of an array slice."""
    for a in range(MICRO_M):
        m_new = max(m[a], tile_max[a])
        shift = m_new if m_new != NEG_INF else np.float32(0.0)
        rescale = math.exp2(m[a] - shift)
        l[a] *= rescale
        o[a * MICRO_D:(a + 1) * MICRO_D] *= rescale
        for b in range(MICRO_N):
            p = math.exp2(s[a * MICRO_N + b] - shift)
            s[a * MICRO_N + b] = p
            l[a] += p
        m[a] = m_new


@cuda.jit(device=True)
def update_float64(s, m, l, o, tile_max):
    """Right values; the Python float 0.0 makes the shift, and everything after it, float64."""
    for a in range(MICRO_M):
        m_new = max(m[a], tile_max[a])
        shift = m_new if m_new != NEG_INF else 0.0
        rescale = math.exp2(m[a] - shift)
        l[a] *= rescale
        for e in range(MICRO_D):
            o[a * MICRO_D + e] *= rescale
        for b in range(MICRO_N):
            p = math.exp2(s[a * MICRO_N + b] - shift)
            s[a * MICRO_N + b] = p
            l[a] += p
        m[a] = m_new


@cuda.jit(device=True)
def update_skipping_rows_without_keys(s, m, l, o, tile_max):
    """A row with no key yet is skipped: l and o stay 0, but its scores stay -inf in s (P)."""
    for a in range(MICRO_M):
        m_new = max(m[a], tile_max[a])
        if m_new == NEG_INF:
            continue
        rescale = math.exp2(m[a] - m_new)
        l[a] *= rescale
        for e in range(MICRO_D):
            o[a * MICRO_D + e] *= rescale
        for b in range(MICRO_N):
            p = math.exp2(s[a * MICRO_N + b] - m_new)
            s[a * MICRO_N + b] = p
            l[a] += p
        m[a] = m_new


@cuda.jit(device=True)
def update_stub(s, m, l, o, tile_max):
    raise NotImplementedError()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # a planted mistake's NaN and overflows
@pytest.mark.parametrize("answer, diagnosis, says", [
    (variant("08_online_update", *UPDATE_MISTAKES["no_rescale"]), "online_softmax_no_rescale", "neither l nor o was rescaled"),
    (variant("08_online_update", *UPDATE_MISTAKES["l_only"]), "rescale_l_only", "o was not"),
    (variant("08_online_update", *UPDATE_MISTAKES["o_only"]), "rescale_o_only", "l was not"),
    (variant("08_online_update", *UPDATE_MISTAKES["max_kept"]), "max_not_updated", "never kept"),
    (variant("08_online_update", *UPDATE_MISTAKES["natural_exp"]), "natural_exp", "exp2, not exp"),
    (variant("08_online_update", *UPDATE_MISTAKES["no_guard"]), "nan_before_first_key", "2^(-inf - (-inf)), NaN"),
    (variant("08_online_update", *UPDATE_MISTAKES["first_column_only"]), "missed_output_columns", "only its first was rescaled"),
    (update_skipping_rows_without_keys, "weights_left_as_scores", "the scores s at -inf"),
    (update_sliced, "not_gpu_code", "KeyError: <ufunc 'multiply'>"),
    (update_float64, "float64_arithmetic", "shift = m_new if m_new != NEG_INF else 0.0"),
], ids=["no_rescale", "l_only", "o_only", "max_kept", "natural_exp", "no_guard", "first_column_only",
        "continue", "slice", "float64"])
def test_planted_update_mistakes_get_their_diagnosis(answer, diagnosis, says):
    assert_diagnosis("08_online_update", answer, diagnosis, says)


def test_the_update_stub_is_not_implemented():
    assert check("08_online_update", update_stub, verbose=False).diagnosis == "not_implemented"


def test_an_update_calling_the_librarys_is_refused():
    @cuda.jit(device=True)
    def borrowed(s, m, l, o, tile_max):
        v3_online_update(s, m, l, o, tile_max)      # noqa: F821  (a name flash's namespace would resolve)
    assert_diagnosis("08_online_update", borrowed, "calls_given_code", "v3_online_update")


# --- 08_row_reduce -------------------------------------------------------------------------------

REDUCE_MISTAKES = {
    "partial_mask": [("0xFFFFFFFF", "0x000000FF")],                # names lanes 0-7 only, called by all 32
    "under_a_branch": [("other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w)",   # the upper half of a row group skips it
                        "other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w) if cuda.laneid % 8 < 4 else y")],
    "two_steps": [("(1, 2, 4)", "(1, 2)")],
    "five_steps": [("(1, 2, 4)", "(1, 2, 4, 8, 16)")],
    "shfl_down": [("shfl_xor_sync", "shfl_down_sync")],            # a one-way tree: the total reaches lane 0 only
    "always_max": [("max(y, other) if take_max else y + other", "max(y, other)")],
    "not_written_back": [("x[a] = y", "pass")],
    "broadcast_after": [("x[a] = y", "x[a] = cuda.shfl_sync(0xFFFFFFFF, y, cuda.laneid // 8 * 8)")],   # a 4th round
}


@cuda.jit(device=True)
def reduce_stub(x, take_max):
    raise NotImplementedError()


@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("partial_mask", "divergent_barrier", "leaves the calling lane out"),
    ("under_a_branch", "divergent_barrier", "On a GPU that hangs the block"),
    ("two_steps", "butterfly_missing_step", "only 4 of its row group's 8 lanes"),
    ("five_steps", "reduced_across_rows", "32 lanes were combined"),
    ("shfl_down", "not_in_every_lane", "only the first lane of each row group"),
    ("always_max", "max_and_sum_swapped", "the row's max, not its sum"),
    ("not_written_back", "wrong_values", "entries differ"),
    ("broadcast_after", "too_many_rounds", "16 warp collectives for its 4 rows, where the limit is 12"),
])
def test_planted_reduction_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("08_row_reduce", variant("08_row_reduce", *REDUCE_MISTAKES[mistake]), diagnosis, says)


def test_the_reduction_stub_is_not_implemented():
    assert check("08_row_reduce", reduce_stub, verbose=False).diagnosis == "not_implemented"


def test_a_reduction_calling_the_librarys_is_refused():
    @cuda.jit(device=True)
    def borrowed(x, take_max):
        v3_row_reduce(x, take_max)      # noqa: F821  (a name flash's namespace would resolve)
    assert_diagnosis("08_row_reduce", borrowed, "calls_given_code", "v3_row_reduce")


# --- 08_scores_to_p ------------------------------------------------------------------------------

LOAD_KEYS = "k_tile[cg + COL_GROUPS * b, d]"
LOAD_ROWS = "q_tile[rg + ROW_GROUPS * a, d]"
STORE_AT = "p_tile[rg + ROW_GROUPS * (x // MICRO_N), cg + COL_GROUPS * (x % MICRO_N)]"
SCORES_MISTAKES = {
    "neighbouring_keys": [(LOAD_KEYS, "k_tile[cg * MICRO_N + b, d]"),
                          (STORE_AT, "p_tile[rg + ROW_GROUPS * (x // MICRO_N), cg * MICRO_N + x % MICRO_N]")],
    "neighbouring_rows": [(LOAD_ROWS, "q_tile[rg * MICRO_M + a, d]"),
                          (STORE_AT, "p_tile[rg * MICRO_M + x // MICRO_N, cg + COL_GROUPS * (x % MICRO_N)]")],
    "row_across_warps": [("cuda.threadIdx.x % COL_GROUPS, cuda.threadIdx.x // COL_GROUPS",
                          "cuda.threadIdx.x // ROW_GROUPS, cuda.threadIdx.x % ROW_GROUPS")],
    "reloaded": [("s[x] += qa[x // MICRO_N] * kb[x % MICRO_N]",
                  "s[x] += q_tile[rg + ROW_GROUPS * (x // MICRO_N), d] * k_tile[cg + COL_GROUPS * (x % MICRO_N), d]")],
    "bound_hard_coded": [("range(HEAD_PAD)", "range(64)")],
    "padding_read": [("range(HEAD_PAD)", "range(HEAD_PAD + 1)")],
    "column_short": [("range(HEAD_PAD)", "range(HEAD_PAD - 1)")],
    "slot_short": [("    for x in range(S_SIZE):\n        p_tile", "    for x in range(S_SIZE - 1):\n        p_tile")],
    "overwritten": [("s[x] += qa", "s[x] = qa")],
    "transposed": [(STORE_AT, "p_tile[rg + ROW_GROUPS * (x % MICRO_N), cg + COL_GROUPS * (x // MICRO_N)]")],
    "barrier_each_column": [("s[x] += qa[x // MICRO_N] * kb[x % MICRO_N]",
                             "s[x] += qa[x // MICRO_N] * kb[x % MICRO_N]\n        cuda.syncthreads()")],
    "sums_in_p": [(f"    for x in range(S_SIZE):\n        {STORE_AT} = s[x]", ""),
                  ("        s[x] = 0.0", f"        {STORE_AT} = 0.0"),
                  ("s[x] += qa[x // MICRO_N] * kb[x % MICRO_N]",
                   f"{STORE_AT} += qa[x // MICRO_N] * kb[x % MICRO_N]")],
}


@cuda.jit(device=True)
def scores_row_by_row(p_tile, q_tile, k_tile):
    """Right, another style: the map from the tile sizes, a query value at a time."""
    lanes = TILE_N // MICRO_N                                 # noqa: F821  (flash's names)
    row0, key0 = cuda.threadIdx.x // lanes, cuda.threadIdx.x % lanes
    acc = cuda.local.array(S_SIZE, np.float32)                # noqa: F821
    keys = cuda.local.array(MICRO_N, np.float32)
    for x in range(S_SIZE):                                   # noqa: F821
        acc[x] = 0.0
    for d in range(HEAD_PAD):                                 # noqa: F821
        for b in range(MICRO_N):
            keys[b] = k_tile[key0 + lanes * b, d]
        for a in range(MICRO_M):
            qv = q_tile[row0 + (TILE_M // MICRO_M) * a, d]    # noqa: F821
            for b in range(MICRO_N):
                acc[a * MICRO_N + b] += qv * keys[b]
    for a in range(MICRO_M):
        for b in range(MICRO_N):
            p_tile[row0 + (TILE_M // MICRO_M) * a, key0 + lanes * b] = acc[a * MICRO_N + b]


@cuda.jit(device=True)
def scores_skewed_keys(p_tile, q_tile, k_tile):
    """Right, another map: row group rg's lanes take their keys rotated by rg, still 32 banks a store."""
    rg, lane = cuda.threadIdx.x // COL_GROUPS, cuda.threadIdx.x % COL_GROUPS
    cg = (lane + rg) % COL_GROUPS
    s = cuda.local.array(S_SIZE, np.float32)                  # noqa: F821
    qa = cuda.local.array(MICRO_M, np.float32)
    kb = cuda.local.array(MICRO_N, np.float32)
    for x in range(S_SIZE):                                   # noqa: F821
        s[x] = 0.0
    for d in range(HEAD_PAD):                                 # noqa: F821
        for a in range(MICRO_M):
            qa[a] = q_tile[rg + ROW_GROUPS * a, d]
        for b in range(MICRO_N):
            kb[b] = k_tile[cg + COL_GROUPS * b, d]
        for x in range(S_SIZE):                               # noqa: F821
            s[x] += qa[x // MICRO_N] * kb[x % MICRO_N]
    for x in range(S_SIZE):                                   # noqa: F821
        p_tile[rg + ROW_GROUPS * (x // MICRO_N), cg + COL_GROUPS * (x % MICRO_N)] = s[x]


@cuda.jit(device=True)
def scores_by_thread_zero(p_tile, q_tile, k_tile):
    """Right values, but thread 0 computes every score, each value loaded once a product."""
    if cuda.threadIdx.x == 0:
        for i in range(TILE_M):                               # noqa: F821
            for j in range(TILE_N):                           # noqa: F821
                acc = np.float32(0.0)
                for d in range(HEAD_PAD):                     # noqa: F821
                    acc += q_tile[i, d] * k_tile[j, d]
                p_tile[i, j] = acc


@cuda.jit(device=True)
def scores_in_local_memory(p_tile, q_tile, k_tile):
    """Right values, but its sums sit in an array indexed at run time (rotated by the thread): local memory."""
    rg, cg = cuda.threadIdx.x // COL_GROUPS, cuda.threadIdx.x % COL_GROUPS
    turn = cuda.threadIdx.x
    s = cuda.local.array(S_SIZE, np.float32)                  # noqa: F821
    qa = cuda.local.array(MICRO_M, np.float32)
    kb = cuda.local.array(MICRO_N, np.float32)
    for x in range(S_SIZE):                                   # noqa: F821
        s[x] = 0.0
    for d in range(HEAD_PAD):                                 # noqa: F821
        for a in range(MICRO_M):
            qa[a] = q_tile[rg + ROW_GROUPS * a, d]
        for b in range(MICRO_N):
            kb[b] = k_tile[cg + COL_GROUPS * b, d]
        for x in range(S_SIZE):                               # noqa: F821
            s[(x + turn) % S_SIZE] += qa[x // MICRO_N] * kb[x % MICRO_N]     # noqa: F821
    for x in range(S_SIZE):                                   # noqa: F821
        p_tile[rg + ROW_GROUPS * (x // MICRO_N), cg + COL_GROUPS * (x % MICRO_N)] = s[(x + turn) % S_SIZE]   # noqa: F821


@cuda.jit(device=True)
def scores_stub(p_tile, q_tile, k_tile):
    raise NotImplementedError()


@pytest.mark.parametrize("answer", [scores_row_by_row, scores_skewed_keys], ids=["row_by_row", "skewed_keys"])
def test_other_right_scores_pass(answer):
    result = check("08_scores_to_p", answer, verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


@pytest.mark.parametrize("answer, diagnosis, says", [
    (variant("08_scores_to_p", *SCORES_MISTAKES["neighbouring_keys"]), "bank_conflict",
     "a warp's store of p_tile at"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["neighbouring_rows"]), "bank_conflict",
     "a warp's store of p_tile at"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["row_across_warps"]), "bank_conflict",
     "a warp's store of p_tile at"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["reloaded"]), "no_register_reuse",
     "read the Q and K tiles 2560 times, where the limit is 512"),
    (scores_by_thread_zero, "no_register_reuse", "thread (0, 0, 0) read the Q and K tiles 262144 times"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["bound_hard_coded"]), "out_of_bounds", "q_tile"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["padding_read"]), "padding_column_read", "padding column 64"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["column_short"]), "columns_left_out", "columns 0 .. 62 only"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["slot_short"]), "scores_missing", "128 of the 2048 scores"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["overwritten"]), "scores_not_accumulated", "last column's products"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["transposed"]), "scores_misplaced", "p_tile[0, 8] holds the score of query 16 and key 0"),
    (scores_in_local_memory, "local_memory", "stack frame"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["barrier_each_column"]), "extra_barriers",
     "passed 66 barriers, where the limit is 2"),
    (variant("08_scores_to_p", *SCORES_MISTAKES["sums_in_p"]), "sums_in_shared_memory",
     "keep the micro-tile's sums in registers"),
], ids=["neighbouring_keys", "neighbouring_rows", "row_across_warps", "reloaded", "thread_zero", "bound_hard_coded",
        "padding_read", "column_short", "slot_short", "overwritten", "transposed", "local_memory", "barrier_each_column",
        "sums_in_p"])
def test_planted_scores_mistakes_get_their_diagnosis(answer, diagnosis, says):
    assert_diagnosis("08_scores_to_p", answer, diagnosis, says)


def test_the_scores_stub_is_not_implemented():
    assert check("08_scores_to_p", scores_stub, verbose=False).diagnosis == "not_implemented"


def test_scores_calling_the_librarys_are_refused():
    @cuda.jit(device=True)
    def borrowed(p_tile, q_tile, k_tile):
        v3_scores_to_p(p_tile, q_tile, k_tile)      # noqa: F821  (a name flash's namespace would resolve)
    assert_diagnosis("08_scores_to_p", borrowed, "calls_given_code", "v3_scores_to_p")


# --- 08x_packed_rows -----------------------------------------------------------------------------

SOURCE_ROW = "src[h * group + (r0 + r) % group, (r0 + r) // group, c]"
PACKED_MISTAKES = {
    "head_major": [(SOURCE_ROW, "src[h * group + (r0 + r) // src.shape[1], (r0 + r) % src.shape[1], c]")],
    "first_slice_only": [("cuda.threadIdx.x + cuda.threadIdx.y * THREADS_V3, THREADS_V3 * cuda.blockDim.y",
                          "cuda.threadIdx.x, THREADS_V3")],
    "padding_left": [(SOURCE_ROW + " * scale\n        tile[r, c] = x",
                      SOURCE_ROW + " * scale\n            tile[r, c] = x")],
    "row_per_thread": [("r = e // HEAD_PAD\n        c = e - r * HEAD_PAD",      # neighbouring threads, neighbouring rows
                        "r = e % tile.shape[0]\n        c = e // tile.shape[0]")],
    "read_twice": [(SOURCE_ROW + " * scale", SOURCE_ROW + " * scale + (" + SOURCE_ROW + " - " + SOURCE_ROW + ")")],
    "offset_split": [(SOURCE_ROW, "src[h * group + (r0 + r) % group, r0 // group + r // group, c]")],
    "thread_zero_copies": [("range(first, tile.shape[0] * HEAD_PAD, threads)",                    # thread 0 alone
                            "range(0 if first == 0 else tile.shape[0] * HEAD_PAD, tile.shape[0] * HEAD_PAD)")],
}


@cuda.jit(device=True)
def packed_by_warp_rows(tile, src, h, r0, n, group, scale):
    """Right, another split: each warp copies whole rows, its lanes 32 columns at a time (at d_k 5, 13
    loads by one lane where the limit is 16)."""
    first, threads = cuda.threadIdx.x + cuda.threadIdx.y * THREADS_V3, THREADS_V3 * cuda.blockDim.y  # noqa: F821
    for r in range(first // 32, tile.shape[0], threads // 32):
        for c in range(first % 32, HEAD_PAD, 32):                                                    # noqa: F821
            x = np.float32(0.0)
            if r < n and c < HEAD:                                                                   # noqa: F821
                x = src[h * group + (r0 + r) % group, (r0 + r) // group, c] * scale
            tile[r, c] = x


# Right, another split: a thread keeps one column and strides down the rows.
PACKED_BY_COLUMN = [("r = e // HEAD_PAD\n        c = e - r * HEAD_PAD",
                     "c = first % HEAD_PAD\n        r = (e - c) // HEAD_PAD")]


def test_other_right_packed_copies_pass():
    for answer in (packed_by_warp_rows, variant("08x_packed_rows", *PACKED_BY_COLUMN)):
        result = check("08x_packed_rows", answer, verbose=False)
        assert result.passed, result.message


@cuda.jit(device=True)
def packed_stub(tile, src, h, r0, n, group, scale):
    raise NotImplementedError()


@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("head_major", "rows_not_packed", "each head's rows one after another"),
    ("first_slice_only", "slices_left_out", "the 2 slices repeat one copy"),
    ("padding_left", "stale_tile", "which no thread of its block had written"),
    ("row_per_thread", "uncoalesced", "segments of 128 bytes on average"),
    ("read_twice", "no_reuse", "read up to 3 times from global memory, where the limit is 1"),
    ("offset_split", "row_offset_split", "r0 31 not a multiple of group 3"),
    ("thread_zero_copies", "serial_copy", "made 200 loads of src, where the limit is 16"),
])
def test_planted_load_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("08x_packed_rows", variant("08x_packed_rows", *PACKED_MISTAKES[mistake]), diagnosis, says)


def test_the_load_stub_is_not_implemented():
    assert check("08x_packed_rows", packed_stub, verbose=False).diagnosis == "not_implemented"
