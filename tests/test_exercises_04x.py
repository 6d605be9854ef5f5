"""Deep dive 04x's exercises, 04x_warp_softmax and 04x_warps_per_sm: each solution passes as a student
submits it, and each usual mistake, written as a student would, gets its name, in one line."""

import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, mutation
from attention_lib.checks.ex04x_warps_per_sm import OCCUPANCY_CASES, OCCUPANCY_MISTAKES, occupancy_without
from attention_lib.measure import kernel_report
from attention_lib.stages.softmax import FULL_MASK, WARP_SIZE, WARPS_PER_BLOCK, merge_stats, strided_write, strided_zeros


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 04x_warp_softmax: one warp per row, shuffles ---------------------------------------------------

@cuda.jit
def warp_softmax_solution(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_lanes_without_a_column_leave(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0] or lane >= s.shape[1]:
        return                                         # the others wait for these lanes at a shuffle
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_sums_added_as_they_are(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l += cuda.shfl_xor_sync(FULL_MASK, l, step)    # each l still against its own lane's max
        m = max(m, m_other)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_shuffled_down(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_down_sync(FULL_MASK, m, step)   # lane 0 alone ends with the whole row
        l_other = cuda.shfl_down_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_starting_from_zero(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(0.0), np.float32(0.0)            # 0 is not neutral for a maximum
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit(device=True)
def lane_max_then_sum(s, row, lane):
    """Kernel 2's two passes on a warp: the max by shuffles, then the sum: each score read twice here."""
    m = np.float32(-math.inf)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m = max(m, s[row, j])
    for step in (16, 8, 4, 2, 1):
        m = max(m, cuda.shfl_xor_sync(FULL_MASK, m, step))
    l = np.float32(0.0)
    if m > -math.inf:
        for j in range(lane, s.shape[1], WARP_SIZE):
            l += math.exp(s[row, j] - m)
    for step in (16, 8, 4, 2, 1):
        l += cuda.shfl_xor_sync(FULL_MASK, l, step)
    return m, l


@cuda.jit
def warp_three_passes(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = lane_max_then_sum(s, row, lane)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_raw_exponentials(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    l = np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        l += math.exp(s[row, j])                       # no shift: overflows near +1000
    for step in (16, 8, 4, 2, 1):
        l += cuda.shfl_xor_sync(FULL_MASK, l, step)
    strided_write(s, out, row, lane, WARP_SIZE, np.float32(0.0), np.float32(1.0) / l)


@cuda.jit
def warp_nan_on_fully_masked_rows(s, out):
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)   # -inf - (-inf): NaN


@cuda.jit
def warp_softmax_stub(s, out):
    raise NotImplementedError()


@cuda.jit
def warp_lanes_take_chunks(s, out):
    """Right values, each score read twice, but lane i takes columns i * chunk to (i + 1) * chunk - 1:
    a warp's load spreads over chunk times as many segments."""
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    chunk = (s.shape[1] + WARP_SIZE - 1) // WARP_SIZE
    first, end = lane * chunk, min((lane + 1) * chunk, s.shape[1])
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(first, end):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    for j in range(first, end):
        out[row, j] = math.exp(s[row, j] - m) / l if m > -math.inf else np.float32(0.0)


@cuda.jit
def warp_merged_by_lane_0_from_shuffles(s, out):
    """Right values, no rounds: lane 0 takes in the 31 other lanes' pairs one by one, each read by a shuffle."""
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for other in range(1, WARP_SIZE):                  # lane 0 takes in the 31 others' pairs, one by one
        m_other = cuda.shfl_sync(FULL_MASK, m, other)
        l_other = cuda.shfl_sync(FULL_MASK, l, other)
        if lane == 0:
            m, l = merge_stats(m, l, m_other, l_other)
    m = cuda.shfl_sync(FULL_MASK, m, 0)
    l = cuda.shfl_sync(FULL_MASK, l, 0)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_merged_by_lane_0_from_shared(s, out):
    """Right values, no rounds: every lane leaves its pair in shared memory, lane 0 reads the 31 others."""
    ms = cuda.shared.array((WARPS_PER_BLOCK, WARP_SIZE), np.float32)
    ls = cuda.shared.array((WARPS_PER_BLOCK, WARP_SIZE), np.float32)
    warp = cuda.threadIdx.x // WARP_SIZE
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + warp
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    ms[warp, lane] = m
    ls[warp, lane] = l
    cuda.syncwarp()
    if lane == 0:
        for other in range(1, WARP_SIZE):
            m, l = merge_stats(m, l, ms[warp, other], ls[warp, other])
        ms[warp, 0] = m
        ls[warp, 0] = l
    cuda.syncwarp()
    m = ms[warp, 0]
    l = ls[warp, 0]
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_shuffled_down_then_broadcast(s, out):
    """Another right design: a tree of shfl_down leaves the pair in lane 0, which hands it out by shfl_sync."""
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    step = 16
    while step > 0:
        m_other = cuda.shfl_down_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_down_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
        step //= 2
    m = cuda.shfl_sync(FULL_MASK, m, 0)
    l = cuda.shfl_sync(FULL_MASK, l, 0)
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_tree_in_shared_memory(s, out):
    """Another right design: the pairs merged by a tree in shared memory, a syncwarp a round."""
    ms = cuda.shared.array((WARPS_PER_BLOCK, WARP_SIZE), np.float32)
    ls = cuda.shared.array((WARPS_PER_BLOCK, WARP_SIZE), np.float32)
    warp = cuda.threadIdx.x // WARP_SIZE
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + warp
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    ms[warp, lane] = m
    ls[warp, lane] = l
    cuda.syncwarp()
    stride = WARP_SIZE // 2
    while stride > 0:
        if lane < stride:
            m, l = merge_stats(ms[warp, lane], ls[warp, lane], ms[warp, lane + stride], ls[warp, lane + stride])
            ms[warp, lane] = m
            ls[warp, lane] = l
        cuda.syncwarp()
        stride //= 2
    m = ms[warp, 0]
    l = ls[warp, 0]
    if m == -math.inf:
        strided_zeros(out, row, lane, WARP_SIZE)
        return
    strided_write(s, out, row, lane, WARP_SIZE, m, np.float32(1.0) / l)


@cuda.jit
def warp_butterfly_with_a_syncwarp_a_round(s, out):
    """Another right answer: the butterfly with a (needless) syncwarp after each round, and one write loop."""
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return
    m, l = np.float32(-math.inf), np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
        cuda.syncwarp()
    shift = m if m > -math.inf else np.float32(0.0)
    inv = np.float32(1.0) / l if l > 0 else np.float32(0.0)
    for j in range(lane, s.shape[1], WARP_SIZE):
        out[row, j] = math.exp(s[row, j] - shift) * inv


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["04x_warp_softmax"]),
                                    lambda: warp_softmax_solution, lambda: warp_shuffled_down_then_broadcast,
                                    lambda: warp_tree_in_shared_memory, lambda: warp_butterfly_with_a_syncwarp_a_round])
def test_the_warp_softmax_solution_passes(answer):
    result = verdict("04x_warp_softmax", answer())
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("answer, diagnosis, says", [
    (warp_lanes_without_a_column_leave, "divergent_barrier", "hangs the block"),
    (warp_sums_added_as_they_are, "online_softmax_no_rescale", "rescaled by exp(m_lane - m)"),
    (warp_shuffled_down, "result_not_broadcast", "lane 0's columns are right"),
    (warp_starting_from_zero, "wrong_neutral_value", "(-inf, 0)"),
    (warp_three_passes, "stats_not_in_one_pass", "read up to 3 times from global memory, where the limit is 2"),
    (warp_lanes_take_chunks, "uncoalesced", "segments of 128 bytes on average, where the limit is 2"),
    (warp_raw_exponentials, "unstable_softmax", "Subtract the row maximum"),
    (warp_nan_on_fully_masked_rows, "fully_masked_row", "row 3 has every score -inf"),
    (warp_softmax_stub, "not_implemented", "Hint"),
    (warp_merged_by_lane_0_from_shuffles, "serial_reduction", "a lane joined 64 warp collectives (shuffles and "
                                                             "syncwarps), where the limit is 18"),
    (warp_merged_by_lane_0_from_shared, "serial_reduction", "one thread read shared memory 64 times, where the "
                                                           "limit is 24"),
])
def test_warp_softmax_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("04x_warp_softmax", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


def test_the_warp_softmax_hints_give_the_idea_then_the_plan_then_the_pitfalls_and_name_no_code():
    hints = EXERCISES["04x_warp_softmax"].hints
    assert len(hints) == 3 and hints[1].startswith("where each step goes")
    assert hints[2].startswith("where answers go wrong")
    for text in hints:
        assert not any(code in text for code in ("=", "[", "cuda.", "syncthreads")), text


# --- 04x_warps_per_sm: the warps an SM holds ------------------------------------------------------------



def occupancy(mistake=None):
    """A student's warps_per_sm, limit by limit, with one usual `mistake` (an OCCUPANCY_MISTAKES code) or none."""
    def warps_per_sm(registers, shared_bytes, threads_per_block, sm):
        if mistake == "sm_ignored":                     # an H200's numbers typed in
            sm = kernel_report.SMLimits("typed")
        warps = threads_per_block // 32 if mistake == "partial_warp_dropped" else math.ceil(threads_per_block / 32)
        step = 1 if mistake == "registers_not_rounded" else sm.thread_register_step
        unit = 1 if mistake == "registers_not_rounded" else sm.register_unit
        warp_registers = math.ceil(math.ceil(registers / step) * step * 32 / unit) * unit
        parts = 1 if mistake == "sub_partitions_ignored" else sm.sub_partitions
        limits = [(sm.registers // parts // warp_registers) * parts // warps]
        reserve = 0 if mistake == "reserved_shared_missing" else sm.reserved_shared_per_block
        if shared_bytes + reserve > 0:
            limits.append(sm.shared_bytes // (shared_bytes + reserve))
        if mistake != "warp_slots_ignored":
            limits.append(sm.warps // warps)
        if mistake != "block_slots_ignored":
            limits.append(sm.blocks)
        return min(limits) if mistake == "blocks_not_warps" else min(limits) * warps
    return warps_per_sm


def test_the_solution_passes_as_a_student_submits_it_and_the_library_function_is_refused():
    exercise = EXERCISES["04x_warps_per_sm"]
    assert check("04x_warps_per_sm", mutation.solution_copy(exercise), verbose=False).passed
    assert check("04x_warps_per_sm", occupancy(), verbose=False).passed          # written otherwise, right too
    given = check("04x_warps_per_sm", kernel_report.warps_per_sm, verbose=False)
    assert given.diagnosis == "calls_given_code", given


@pytest.mark.parametrize("mistake", sorted(OCCUPANCY_MISTAKES))
def test_each_usual_mistake_gets_its_name(mistake):
    result = check("04x_warps_per_sm", occupancy(mistake), verbose=False)
    assert (result.passed, result.diagnosis) == (False, mistake), result
    assert "expected" in result.message and "\n" not in str(result)


def test_every_rule_changes_the_answer_on_a_chosen_kernel_of_each_sm_that_has_it():
    truth = {k: kernel_report.warps_per_sm(*k) for k in OCCUPANCY_CASES}
    for rule in OCCUPANCY_MISTAKES:
        assert any(occupancy_without(rule, k) != truth[k] for k in OCCUPANCY_CASES), rule
    assert {k.sm.name for k in OCCUPANCY_CASES} == {"H200", "T4"}
    assert any(truth[k] == 0 for k in OCCUPANCY_CASES)             # a block too large for the SM: none resident


def test_a_t4_holds_half_an_h200s_warps_and_blocks_and_reserves_no_shared_memory():
    t4, h200 = kernel_report.T4, kernel_report.H200
    assert (t4.warps, t4.blocks, t4.shared_bytes, t4.reserved_shared_per_block) == (32, 16, 65536, 0)
    assert (t4.warps * 2, t4.blocks * 2) == (h200.warps, h200.blocks)
    assert kernel_report.warps_per_sm(16, 0, 32, t4) == 16                 # no shared memory asked: no limit
