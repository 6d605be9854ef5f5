"""Notebook 08's exercises and 08x's: each solution gets ok, each typical mistake its own diagnosis, in
one line; hints in levels, without code."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint, mutation
from attention_lib.stages.flash import COL_GROUPS, MICRO_D, MICRO_M, MICRO_N, NEG_INF, ROW_GROUPS

IDS = ["08_online_update", "08_row_reduce", "08_scores_step", "08x_packed_rows"]


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
    """The exercise's solution with each (old, new) text change made: a planted answer whose every
    other line is the library's, so what the check says is about the change alone."""
    exercise = EXERCISES[exercise_id]
    source = mutation.solution_source(exercise)[0]
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    return mutation.build(exercise, source, f"<planted answer of {exercise_id}>")


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
    (variant("08_online_update", *UPDATE_MISTAKES["max_kept"]), "max_not_updated", "never stored"),
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


# --- 08_scores_step ------------------------------------------------------------------------------

STEP_MISTAKES = {
    "neighbouring_rows": [("rg + ROW_GROUPS * a", "rg * MICRO_M + a")],
    "neighbouring_keys": [("cg + COL_GROUPS * b", "cg * MICRO_N + b")],
    "next_column": [("q_tile[rg + ROW_GROUPS * a, d]", "q_tile[rg + ROW_GROUPS * a, d + 1]"),
                    ("k_tile[cg + COL_GROUPS * b, d]", "k_tile[cg + COL_GROUPS * b, d + 1]")],
    "overwritten": [("s[a * MICRO_N + b] += qa[a] * kb[b]", "s[a * MICRO_N + b] = qa[a] * kb[b]")],
    "transposed": [("s[a * MICRO_N + b] += qa[a] * kb[b]", "s[b * MICRO_M + a] += qa[a] * kb[b]")],
    "reloaded": [("s[a * MICRO_N + b] += qa[a] * kb[b]",       # each product loads its two values again
                  "s[a * MICRO_N + b] += q_tile[rg + ROW_GROUPS * a, d] * k_tile[cg + COL_GROUPS * b, d]")],
}


@cuda.jit(device=True)
def step_in_local_memory(s, q_tile, k_tile, rg, cg, d):
    """Right values, but its query values sit in an array indexed at run time: local memory."""
    qa = cuda.local.array(MICRO_M, np.float32)
    kb = cuda.local.array(MICRO_N, np.float32)
    for a in range(MICRO_M):
        qa[(a + d) % MICRO_M] = q_tile[rg + ROW_GROUPS * a, d]
    for b in range(MICRO_N):
        kb[b] = k_tile[cg + COL_GROUPS * b, d]
    for a in range(MICRO_M):
        for b in range(MICRO_N):
            s[a * MICRO_N + b] += qa[(a + d) % MICRO_M] * kb[b]


@cuda.jit(device=True)
def step_stub(s, q_tile, k_tile, rg, cg, d):
    raise NotImplementedError()


@pytest.mark.parametrize("answer, diagnosis, says", [
    (variant("08_scores_step", *STEP_MISTAKES["neighbouring_rows"]), "rows_not_interleaved", "rows rg * 4 + a"),
    (variant("08_scores_step", *STEP_MISTAKES["neighbouring_keys"]), "keys_not_interleaved", "keys cg * 4 + b"),
    (variant("08_scores_step", *STEP_MISTAKES["next_column"]), "wrong_column", "column 1 of the tiles, not of column d = 0"),
    (variant("08_scores_step", *STEP_MISTAKES["overwritten"]), "scores_not_accumulated", "were overwritten"),
    (variant("08_scores_step", *STEP_MISTAKES["transposed"]), "wrong_micro_tile", "kernel 3 reads s[a * MICRO_N + b] as the score of row"),
    (variant("08_scores_step", *STEP_MISTAKES["reloaded"]), "no_register_reuse", "read shared memory 40 times, where the limit is 8"),
    (step_in_local_memory, "local_memory", "stack frame"),
], ids=["neighbouring_rows", "neighbouring_keys", "next_column", "overwritten", "transposed", "reloaded",
        "local_memory"])
def test_planted_step_mistakes_get_their_diagnosis(answer, diagnosis, says):
    assert_diagnosis("08_scores_step", answer, diagnosis, says)


def test_the_step_stub_is_not_implemented():
    assert check("08_scores_step", step_stub, verbose=False).diagnosis == "not_implemented"


def test_a_step_calling_the_librarys_is_refused():
    @cuda.jit(device=True)
    def borrowed(s, q_tile, k_tile, rg, cg, d):
        v3_scores_step(s, q_tile, k_tile, rg, cg, d)      # noqa: F821  (a name flash's namespace would resolve)
    assert_diagnosis("08_scores_step", borrowed, "calls_given_code", "v3_scores_step")


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
}


@cuda.jit(device=True)
def packed_stub(tile, src, h, r0, n, group, scale):
    raise NotImplementedError()


@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("head_major", "rows_not_packed", "each head's rows one after another"),
    ("first_slice_only", "slices_left_out", "the 2 slices repeat one copy"),
    ("padding_left", "stale_tile", "which no thread of its block had written"),
    ("row_per_thread", "uncoalesced", "segments of 128 bytes on average"),
    ("read_twice", "no_reuse", "read up to 3 times from global memory, where the limit is 1"),
])
def test_planted_load_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("08x_packed_rows", variant("08x_packed_rows", *PACKED_MISTAKES[mistake]), diagnosis, says)


def test_the_load_stub_is_not_implemented():
    assert check("08x_packed_rows", packed_stub, verbose=False).diagnosis == "not_implemented"
