"""Deep dive 04x's exercise, 04x_warps_per_sm: the solution passes as a student submits it, and
each usual mistake, written as a student would, gets its name."""

import math

import pytest

from attention_lib.checks import EXERCISES, check, mutation
from attention_lib.checks.ex04_softmax import OCCUPANCY_CASES, OCCUPANCY_MISTAKES, occupancy_without
from attention_lib.measure import kernel_report


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
