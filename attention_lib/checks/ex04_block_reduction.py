"""``04_block_reduction`` (notebook 04, warm-up): ``block_reduce(partial, value, take_max)``, a device
function giving every thread of the block the max (take_max) or the sum of one value a thread, by a tree
in the shared array ``partial``; its solution is ``softmax.block_reduce``. The check runs softmax_kernel_v2's
passes with the answer in the library's place (``softmax_around``) and compares what every thread got
from both reductions with the row's max and sum of exp(s - max). Its cases, limits and named mistakes
are declared in the ``Exercise`` below.
"""

import math

import numpy as np
from numba import cuda

from attention_lib.stages import softmax
from attention_lib.stages.softmax import THREADS_PER_ROW, strided_max, strided_sum_exp, strided_write, strided_zeros
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, race_finding_launch, read_output
from attention_lib.checks.limits import NoSharedAtomics, SharedLoadsPerThread
from attention_lib.checks.ex04_row_softmax import BAND, STAGE, case_scores

_AROUND = {}


def softmax_around(block_reduce):
    """softmax_kernel_v2's passes with `block_reduce` in the library's place, one kernel per device
    function.

    Arguments (s, out, seen): s and out (rows, T_k) float32 as the library kernel's; seen
    (rows, THREADS_PER_ROW, 2) float32, written: what each thread got from the two reductions
    (the row's max, then its sum of exp(s - max); 0 for a fully masked row). Unlike kernel 2,
    every thread joins both reductions, also on a fully masked row: a wrong max that differs
    from thread to thread cannot send them to different barriers. Grid: one block of
    THREADS_PER_ROW threads per row.
    """
    if block_reduce not in _AROUND:
        @cuda.jit
        def kernel(s, out, seen):
            partial = cuda.shared.array(THREADS_PER_ROW, np.float32)
            row, tid = cuda.blockIdx.x, cuda.threadIdx.x
            row_max = block_reduce(partial, strided_max(s, row, tid, THREADS_PER_ROW), True)
            masked = row_max == -math.inf          # every score -inf: nothing to add
            mine = np.float32(0.0) if masked else strided_sum_exp(s, row, tid, THREADS_PER_ROW, row_max)
            total = block_reduce(partial, mine, False)
            seen[row, tid, 0] = row_max
            seen[row, tid, 1] = total
            if masked:
                strided_zeros(out, row, tid, THREADS_PER_ROW)
            else:
                strided_write(s, out, row, tid, THREADS_PER_ROW, row_max, np.float32(1.0) / total)
        _AROUND[block_reduce] = kernel
    return _AROUND[block_reduce]


def thread_columns(s):
    """(rows, THREADS_PER_ROW, columns each): each thread's columns tid, tid + threads, ..., -inf past
    the row's end."""
    threads = softmax.THREADS_PER_ROW
    padded = np.full((s.shape[0], -(-s.shape[1] // threads) * threads), -np.inf)
    padded[:, :s.shape[1]] = s
    return padded.reshape(s.shape[0], -1, threads).transpose(0, 2, 1)   # (rows, threads, columns each)


def _tree_result(s, every, width=None):
    """(rows, 2): the max, and the sum of exp(s - that max), over the columns of the threads tid with
    tid % every == 0 only (what slot 0 holds when the tree stops log2(every) rounds early), and
    tid < width (what it holds when the first stride was width / 2)."""
    per = thread_columns(s.astype(np.float64))[:, :width:every]     # (rows, threads / every, columns each)
    m = per.max(axis=(1, 2))
    shift = np.where(np.isneginf(m), 0.0, m)
    return np.stack([m, np.where(np.isneginf(m), 0.0, np.exp(per - shift[:, None, None]).sum(axis=(1, 2)))], -1)


def _row_stats(s):
    """(rows, 2) float64: each row's maximum and sum of exp(s - max); (-inf, 0) if fully masked."""
    return _tree_result(s, 1)


def _run_block_reduction(block_reduce, case, rng, _launch):   # race-checked on every case
    rows, t_k, kind = case
    threads = softmax.THREADS_PER_ROW                  # the configuration's: 32, or a GPU's 128
    s = case_scores(rows, t_k, kind, rng)
    out = cuda.device_array((rows, t_k), np.float32)
    full, seen = output_array((rows, threads, 2), guard=2 * threads)
    try:
        race_finding_launch(softmax_around(block_reduce), rows, threads,
                            cuda.to_device(s), out, seen)
    except (OverflowError, ZeroDivisionError, FloatingPointError):
        if kind != "large":
            raise                        # not the overflow this case tests: the engine reports it
        got = np.full((rows, threads, 2), np.inf)                    # nothing usable came out
    else:
        got = read_output(full, seen)
    expected = np.repeat(_row_stats(s)[:, None], threads, axis=1)   # (rows, threads, 2)
    return got, expected, s


def reads_per_reduction():
    """The shared-memory reads one thread may make in one reduction: 2 a round (its slot and the
    one a stride above), log2(THREADS_PER_ROW) rounds, the result, and one to spare."""
    return 2 * int(math.log2(softmax.THREADS_PER_ROW)) + 2


def atomics_why(case):
    threads = softmax.THREADS_PER_ROW
    return (f"atomics on one slot take turns, {threads} updates one after another, where a tree takes "
            f"{int(math.log2(threads))} rounds")


def _diagnose_block_reduction(got, expected, s):
    close = dict(rtol=1e-5, atol=1e-6)
    first = got[:, 0]                                              # thread 0's view, (rows, 2)
    if np.allclose(first, expected[:, 0], **close):
        return "result_not_broadcast", (
            "thread 0 got the row's result but other threads did not: every thread must read the "
            "result from slot 0 once the last round is over, not from its own slot")
    every, threads = 2, softmax.THREADS_PER_ROW
    while every <= threads:
        if np.allclose(first, _tree_result(s, every), **close):
            rounds = int(np.log2(every))
            return "tree_stops_early", (
                f"slot 0 holds the result of only every {every}{'nd' if every == 2 else 'th'} thread: the tree "
                f"stopped {rounds} "
                f"round{'s' if rounds > 1 else ''} early; it halves the stride down to 1, log2(THREADS_PER_ROW) "
                f"= {int(np.log2(threads))} rounds")
        every *= 2
    width = threads // 2
    while width >= 2:
        if np.allclose(first, _tree_result(s, 1, width), **close):
            return "tree_starts_narrow", (
                f"slot 0 holds the result of threads 0-{width - 1} only, out of {threads}: the first round's "
                f"stride was {width // 2}, where it must be half the block, {threads // 2} at this launch (a "
                "stride written as a number fits one block size: 32 threads a row on the simulator, 128 on a GPU)")
        width //= 2
    return None


register(Exercise(
    exercise_id="04_block_reduction",
    kind="device function",
    run=_run_block_reduction,
    # (rows, T_k, kind), at THREADS_PER_ROW 32 and a GPU's 128: one score (every other thread holds
    # only the neutral value); rows of 7 negative scores; rows of 2 * THREADS_PER_ROW + 5 around
    # +-1000 (each thread has two or three columns); THREADS_PER_ROW + 5 columns, all but the last
    # 5 -inf (every thread's first column masked, 5 threads with a score); causal rows with one
    # fully masked (every thread leaves after the max).
    cases=lambda configuration: [(1, 1, "normal"), (3, 7, "negative"), (2, 2 * softmax.THREADS_PER_ROW + 5, "large"),
                                 (2, softmax.THREADS_PER_ROW + BAND, "left-masked"), (5, 33, "masked")],
    both_shapes=True,
    limits=(SharedLoadsPerThread(lambda case: 2 * reads_per_reduction(), why=(
        "the check's kernel runs two reductions (the max, then the sum), each allowed 2 log2(THREADS_PER_ROW) "
        "+ 2 reads a thread: a tree shares the work round after round; a loop over the slots in one thread "
        "reads all THREADS_PER_ROW of them")),
            # The contract's tree reads and writes partial with plain loads and stores; an atomic of every
            # thread on one slot is a serial reduction that makes one shared read a thread.
            # Each thread makes one atomic, so the shared reads cannot see it, and the race finder lets
            # atomics touch one slot together.
            NoSharedAtomics(why=atomics_why)),
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("each thread puts its value in its own slot; then, round after round, the lower half of the "
          "slots still in play takes in the upper half, until slot 0 holds the whole block's result, "
          "which every thread reads"),
    more_hints=("where each step goes: every thread writes its value to its slot, then waits for the others; "
                "each round, the threads below the stride combine their slot with the one a stride above, and "
                "the whole block waits before the stride halves; from half the block down to 1, "
                "log2(THREADS_PER_ROW) rounds; every thread reads slot 0, and the block waits once more "
                "before the slots can be reused; so the block waits once after the writes, once after each "
                "round and once after the read, two more barriers than rounds",
                "where answers go wrong: a barrier placed inside the test that picks the threads of a "
                "round (every thread of the block must reach every barrier); a barrier missing after "
                "the values are written, after a round, or after the result is read (the next "
                "reduction reuses the slots); the first stride written as a number (32 threads here, 128 "
                "on a GPU); every thread's atomic on one slot, whose updates take turns"),
    # float32 exp and sums of up to 69 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose_block_reduction,
    diagnoses=("result_not_broadcast", "tree_stops_early", "tree_starts_narrow"),
    solution=softmax.block_reduce,
    forbidden=STAGE + (softmax.block_max, softmax.block_sum),
))
