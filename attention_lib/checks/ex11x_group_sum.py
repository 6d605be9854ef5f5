"""``11x_group_sum`` (deep dive 11x): a kernel with ``backward.group_sum_kernel``'s signature
``(per_head, shared)``, launched on ``backward.group_sum_grid``, that sums the gradients of each K/V
head's group of consecutive query heads into that head's, one thread per element. Its solution is
``backward.group_sum_kernel``; its cases, limits and named mistakes are declared in the ``Exercise``
below.
"""

from typing import NamedTuple

import numpy as np

from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output
from attention_lib.checks.limits import Coalesced, MostLoads
from attention_lib.stages import backward


class GroupCase(NamedTuple):
    """BH query heads' gradients summed into BH_kv key/value heads' of (T, d)."""

    BH: int
    BH_kv: int
    T: int
    d: int

    def __str__(self):
        return f"({self.BH} query heads on {self.BH_kv} K/V heads, T {self.T}, d {self.d})"


def _run_group_sum(kernel, case, rng, launch):
    per_head = rng.standard_normal((case.BH, case.T, case.d)).astype(np.float32)
    shared = host_output((case.BH_kv, case.T, case.d))                 # written in place
    launch(kernel, *backward.group_sum_grid(case.BH_kv, case.T, case.d), per_head, shared)
    expected = backward.fold_kv_heads(per_head.astype(np.float64), shared.shape)
    return shared, expected, per_head


def _diagnose_group_sum(got, expected, per_head):
    """Name a wrong grouping of the query heads; None otherwise."""
    bh, bh_kv = per_head.shape[0], got.shape[0]
    group, p = bh // bh_kv, per_head.astype(np.float64)
    wrong = [("group_interleaved", p.reshape(group, bh_kv, *p.shape[1:]).sum(axis=0),
              "K/V head g summed query heads g, g + BH_kv, g + 2 BH_kv, ...: query head h reads K/V head h // group, "
              "so K/V head g's group is the consecutive heads g * group to (g + 1) * group - 1"),
             ("group_not_summed", p[::group], "K/V head g got only the first query head of its group: every query "
                                              "head of the group read it, and each adds its gradient")]
    for code, candidate, message in wrong:
        if not np.allclose(candidate, expected, rtol=1e-5, atol=1e-5) and np.allclose(got, candidate, rtol=1e-5,
                                                                                      atol=1e-5):
            return code, message
    return None


register(Exercise(
    exercise_id="11x_group_sum",
    kind="kernel",
    run=_run_group_sum,
    # No group (1 on 1); a group of 3 (6 on 2) whose T x d entries fill one block and a part (T 9, d 4:
    # 36 entries in blocks of 32); multi-query (4 on 1); a group of 2 over several blocks.
    cases=[GroupCase(1, 1, 1, 1), GroupCase(6, 2, 9, 4), GroupCase(4, 1, 5, 7), GroupCase(4, 2, 17, 3),
           GroupCase(4, 2, 3, 64)],                                 # the model's head width
    hint=("each element of a K/V head's gradient is the sum of group numbers, one from each query head that "
          "reads that K/V head, all at the same position and column; one thread can own that sum, and "
          "neighbouring threads can own neighbouring elements"),
    more_hints=("the plan: the block's second grid index is the K/V head g; the thread's flat index along the "
                "first axis splits into a position (the quotient by d) and a column (the remainder), so that "
                "neighbouring threads touch neighbouring addresses; the last block hangs past T times d entries "
                "and its extra threads write nothing. Query head h reads K/V head h // group, so g's group is the "
                "group consecutive query heads starting at g times group, not every BH_kv-th head. Start the "
                "sum from a float32 zero, add the group's values at the thread's position and column, and "
                "store it once",),
    # Sums of at most 4 float32 standard normals against float64.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_group_sum,
    diagnoses=("group_interleaved", "group_not_summed"),
    limits=(MostLoads("per_head", 1, why="each query head's element is added into exactly one sum"),
            Coalesced("per_head", 2)),
    solution=backward.group_sum_kernel,
    forbidden=(backward.fold_kv_heads, backward.launch_grouped_naive_backward),
))
