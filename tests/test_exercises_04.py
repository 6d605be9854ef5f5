"""Notebook 04's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line.

The solution is checked as a student submits it (mutation.solution_copy: the library's code in a new
function; the library's own kernel would be refused as given code). The mistakes below are the
solution with one thing changed, the way students write them.
"""

import linecache
import math

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, mutation
from attention_lib.stages import softmax
from attention_lib.stages.softmax import THREADS_PER_ROW


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 04_row_softmax (warm-up): one thread per row ------------------------------------------------

@cuda.jit
def row_softmax_solution(s, out):
    row = cuda.grid(1)
    if row >= s.shape[0]:
        return
    row_max = np.float32(-math.inf)
    for j in range(s.shape[1]):
        row_max = max(row_max, s[row, j])
    if row_max == -math.inf:
        for j in range(s.shape[1]):
            out[row, j] = 0.0
        return
    total = np.float32(0.0)
    for j in range(s.shape[1]):
        total += math.exp(s[row, j] - row_max)
    for j in range(s.shape[1]):
        out[row, j] = math.exp(s[row, j] - row_max) / total


@cuda.jit
def without_the_max(s, out):
    row = cuda.grid(1)
    if row < s.shape[0]:
        total = 0.0
        for j in range(s.shape[1]):
            total += math.exp(s[row, j])
        for j in range(s.shape[1]):
            out[row, j] = math.exp(s[row, j]) / total


@cuda.jit
def without_the_max_float32(s, out):
    """The same mistake in float32 NumPy scalars: inf and NaN instead of an exception."""
    row = cuda.grid(1)
    if row < s.shape[0]:
        total = np.float32(0.0)
        for j in range(s.shape[1]):
            total += np.exp(s[row, j])
        for j in range(s.shape[1]):
            out[row, j] = np.exp(s[row, j]) / total


@cuda.jit
def shifted_by_the_first_score(s, out):
    """Stable on rows that span about 20; overflows once a row spans far more."""
    row = cuda.grid(1)
    if row < s.shape[0]:
        first = s[row, 0]
        total = np.float32(0.0)
        for j in range(s.shape[1]):
            total += math.exp(s[row, j] - first)
        for j in range(s.shape[1]):
            out[row, j] = math.exp(s[row, j] - first) / total


@cuda.jit
def along_the_columns(s, out):
    col = cuda.grid(1)
    if col < s.shape[1]:
        m = -math.inf
        for r in range(s.shape[0]):
            m = max(m, s[r, col])
        total = 0.0
        for r in range(s.shape[0]):
            total += math.exp(s[r, col] - m)
        for r in range(s.shape[0]):
            out[r, col] = math.exp(s[r, col] - m) / total


@cuda.jit
def without_the_guard(s, out):
    row = cuda.grid(1)
    m = -math.inf
    for j in range(s.shape[1]):
        m = max(m, s[row, j])
    for j in range(s.shape[1]):
        out[row, j] = math.exp(s[row, j] - m)


@cuda.jit
def nan_on_fully_masked_rows(s, out):
    row = cuda.grid(1)
    if row < s.shape[0]:
        m = -math.inf
        for j in range(s.shape[1]):
            m = max(m, s[row, j])
        total = 0.0
        for j in range(s.shape[1]):
            total += math.exp(s[row, j] - m)
        for j in range(s.shape[1]):
            out[row, j] = math.exp(s[row, j] - m) / total


@cuda.jit
def not_normalised(s, out):
    row = cuda.grid(1)
    if row < s.shape[0]:
        m = -math.inf
        for j in range(s.shape[1]):
            m = max(m, s[row, j])
        for j in range(s.shape[1]):
            out[row, j] = math.exp(s[row, j] - m) if m > -math.inf else 0.0


@cuda.jit
def skips_the_last_row(s, out):
    row = cuda.grid(1)
    if row < s.shape[0] - 1:
        for j in range(s.shape[1]):
            out[row, j] = 1.0


@cuda.jit
def row_softmax_by_the_library(s, out):
    row = cuda.grid(1)
    if row < s.shape[0]:
        m = softmax.strided_max(s, row, 0, 1)
        softmax.strided_write(s, out, row, 0, 1, m, 1.0 / softmax.strided_sum_exp(s, row, 0, 1, m))


@cuda.jit
def row_softmax_stub(s, out):
    raise NotImplementedError()


@cuda.jit
def row_softmax_total_from_a_python_float(s, out):
    row = cuda.grid(1)
    if row >= s.shape[0]:
        return
    row_max = np.float32(-math.inf)
    for j in range(s.shape[1]):
        row_max = max(row_max, s[row, j])
    if row_max == -math.inf:
        for j in range(s.shape[1]):
            out[row, j] = 0.0
        return
    total = 0.0                                        # a Python float: float64 on a GPU
    for j in range(s.shape[1]):
        total += math.exp(s[row, j] - row_max)
    for j in range(s.shape[1]):
        out[row, j] = math.exp(s[row, j] - row_max) / total


@cuda.jit
def row_softmax_max_from_a_python_float(s, out):
    row = cuda.grid(1)
    if row >= s.shape[0]:
        return
    row_max = -math.inf                                # float64, and so is every s - row_max
    for j in range(s.shape[1]):
        row_max = max(row_max, s[row, j])
    if row_max == -math.inf:
        for j in range(s.shape[1]):
            out[row, j] = 0.0
        return
    total = np.float32(0.0)
    for j in range(s.shape[1]):
        total += math.exp(s[row, j] - row_max)
    for j in range(s.shape[1]):
        out[row, j] = math.exp(s[row, j] - row_max) / total


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["04_row_softmax"]),
                                    lambda: row_softmax_solution])
def test_the_row_softmax_solution_passes(answer):
    result = verdict("04_row_softmax", answer())
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (without_the_max, "unstable_softmax", "Subtract the row maximum"),
    (without_the_max_float32, "unstable_softmax", "NaN or inf weights"),
    (shifted_by_the_first_score, "unstable_softmax", "no other score of the row will do"),
    (along_the_columns, "softmax_wrong_axis", "each column sums to 1"),
    (without_the_guard, "out_of_bounds", "out-of-bounds "),
    (nan_on_fully_masked_rows, "fully_masked_row", "row 3 has every score -inf"),
    (not_normalised, "wrong_values", "entries differ"),
    (skips_the_last_row, "wrong_values", "never written"),
    (row_softmax_by_the_library, "calls_given_code", "strided_"),
    (row_softmax_stub, "not_implemented", "Hint"),
    (row_softmax_total_from_a_python_float, "float64_arithmetic", "total = 0.0"),
    (row_softmax_max_from_a_python_float, "float64_arithmetic", "row_max = -math.inf"),
])
def test_row_softmax_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("04_row_softmax", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


# --- 04_block_reduction (warm-up): the tree of kernel 2 ---------------------------------------------

@cuda.jit(device=True)
def tree_solution(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_interleaved(partial, value, take_max):
    """Another right tree: slot tid takes in slot tid + stride for tid a multiple of 2 stride."""
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = 1
    while stride < THREADS_PER_ROW:
        if tid % (2 * stride) == 0:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride *= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_barrier_inside_the_round(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
            cuda.syncthreads()                         # only the threads still merging come
        stride //= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_without_round_barrier(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        stride //= 2                                   # no barrier between rounds
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_without_first_barrier(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value                               # no barrier: round 1 may read a slot not yet written
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_without_last_barrier(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    return partial[0]                                  # the next reduction may overwrite it first


@cuda.jit(device=True)
def tree_one_round_short(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 1:                                  # the round of stride 1 is missing
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_own_slot(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = partial[tid]                              # only slot 0 holds the block's result
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_starting_too_wide(partial, value, take_max):
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = THREADS_PER_ROW                           # slot tid + stride lies past the array
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_by_the_library(partial, value, take_max):
    return softmax.block_max(partial, value) if take_max else softmax.block_sum(partial, value)


@cuda.jit(device=True)
def tree_stub(partial, value, take_max):
    raise NotImplementedError()


@cuda.jit(device=True)
def tree_serial_in_thread_0(partial, value, take_max):
    """Right values, no tree: thread 0 walks every slot while the others wait."""
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    if tid == 0:
        acc = partial[0]
        for other in range(1, THREADS_PER_ROW):
            acc = max(acc, partial[other]) if take_max else acc + partial[other]
        partial[0] = acc
    cuda.syncthreads()
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_every_thread_adds_every_slot(partial, value, take_max):
    """Right values, no tree: every thread walks every slot itself."""
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    acc = partial[0]
    for other in range(1, THREADS_PER_ROW):
        acc = max(acc, partial[other]) if take_max else acc + partial[other]
    cuda.syncthreads()
    return acc


@cuda.jit(device=True)
def tree_for_32_threads(partial, value, take_max):
    """The simulator's block size written as a number: right at 32 threads, not at a GPU's 128."""
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()
    stride = 16
    while stride > 0:
        if tid < stride:
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()
        stride //= 2
    result = partial[0]
    cuda.syncthreads()
    return result


@cuda.jit(device=True)
def tree_by_atomics(partial, value, take_max):
    """Right values, no tree: every thread's atomic on slot 0, one shared read a thread."""
    tid = cuda.threadIdx.x
    if tid == 0:
        partial[0] = -math.inf if take_max else 0.0
    cuda.syncthreads()
    if take_max:
        cuda.atomic.max(partial, 0, value)
    else:
        cuda.atomic.add(partial, 0, value)
    cuda.syncthreads()
    result = partial[0]
    cuda.syncthreads()
    return result


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["04_block_reduction"]),
                                    lambda: tree_solution, lambda: tree_interleaved])
def test_the_block_reduction_solution_passes(answer):
    result = verdict("04_block_reduction", answer())
    assert result.passed and result.diagnosis == "ok", result
    assert "and a GPU's" in result.message


def test_the_block_reduction_runs_at_a_gpus_block_size_too():
    from attention_lib.checks import shapes
    exercise = EXERCISES["04_block_reduction"]
    assert exercise.both_shapes
    with shapes.configured(shapes.GPU, tree_solution):
        assert softmax.THREADS_PER_ROW == 128
        assert (2, 2 * 128 + 5, "large") in exercise.cases_for(shapes.GPU)
    assert softmax.THREADS_PER_ROW == 32 and (2, 2 * 32 + 5, "large") in exercise.cases_for(shapes.SIMULATOR)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # a racy tree may give 1 / 0
@pytest.mark.parametrize("answer, diagnosis, says", [
    (tree_barrier_inside_the_round, "divergent_barrier", "hangs the block"),
    (tree_without_round_barrier, "race", "partial"),
    (tree_without_first_barrier, "race", "partial"),
    (tree_without_last_barrier, "race", "partial"),
    (tree_one_round_short, "tree_stops_early", "stopped 1 round early"),
    (tree_own_slot, "result_not_broadcast", "thread 0 got the row's result"),
    (tree_starting_too_wide, "out_of_bounds", "partial"),
    (tree_by_the_library, "calls_given_code", "block_"),
    (tree_stub, "not_implemented", "Hint"),
    (tree_serial_in_thread_0, "serial_reduction", "read shared memory 66 times, where the limit is 24"),
    (tree_every_thread_adds_every_slot, "serial_reduction", "a tree shares the work"),
    (tree_by_atomics, "serial_reduction", "made 2 atomic operations on partial, where the limit is 0: atomics "
                                          "on one slot take turns, 32 updates one after another"),
    (tree_for_32_threads, "tree_starts_narrow", "threads 0-31 only, out of 128"),
])
def test_block_reduction_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("04_block_reduction", answer)
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


# --- 04_block_softmax (main): one block per row, the whole kernel -----------------------------------

def block_kernel(body, extra=None):
    """A block-per-row kernel from the source of its body (indented 4 spaces), with the names a
    notebook has: cuda, np, math, THREADS_PER_ROW and the warm-up's block_reduce."""
    namespace = {"cuda": cuda, "np": np, "math": math, "THREADS_PER_ROW": THREADS_PER_ROW,
                 "block_reduce": softmax.block_reduce, "float32": np.float32, **(extra or {})}
    code = "def kernel(s, out):\n" + body
    label = f"<block-per-row answer {len(linecache.cache)}>"      # its source kept, for the GPU's compiler
    linecache.cache[label] = (len(code), None, code.splitlines(keepends=True), label)
    exec(compile(code, label, "exec"), namespace)
    return cuda.jit(namespace["kernel"])


PROLOGUE = ("    partial = cuda.shared.array(THREADS_PER_ROW, np.float32)\n"
            "    row, tid = cuda.blockIdx.x, cuda.threadIdx.x\n")
MAX_WALK = ("    row_max = np.float32(-math.inf)\n"
            "    for j in range(tid, s.shape[1], THREADS_PER_ROW):\n"
            "        row_max = max(row_max, s[row, j])\n")
REDUCE_MAX = "    row_max = block_reduce(partial, row_max, True)\n"
SHIFT = "    shift = row_max if row_max > -math.inf else np.float32(0.0)\n"
SUM_WALK = ("    total = np.float32(0.0)\n"
            "    for j in range(tid, s.shape[1], THREADS_PER_ROW):\n"
            "        total += math.exp(s[row, j] - shift)\n")
REDUCE_SUM = "    total = block_reduce(partial, total, False)\n"
WRITE = ("    inv_total = np.float32(1.0) / total if total > 0 else np.float32(0.0)\n"
         "    for j in range(tid, s.shape[1], THREADS_PER_ROW):\n"
         "        out[row, j] = math.exp(s[row, j] - shift) * inv_total\n")
SOLUTION = PROLOGUE + MAX_WALK + REDUCE_MAX + SHIFT + SUM_WALK + REDUCE_SUM + WRITE


@cuda.jit
def block_softmax_early_exit(s, out):
    """A right answer in another style: the block leaves together on a fully masked row, as kernel 2
    does, and the two reductions run on two shared arrays of their own."""
    maxima = cuda.shared.array(THREADS_PER_ROW, np.float32)
    sums = cuda.shared.array(THREADS_PER_ROW, np.float32)
    row = cuda.blockIdx.x
    m = np.float32(-math.inf)
    for j in range(cuda.threadIdx.x, s.shape[1], THREADS_PER_ROW):
        m = max(m, s[row, j])
    m = softmax.block_reduce(maxima, m, True)
    if m == -math.inf:                                 # the same in every thread: all leave together
        for j in range(cuda.threadIdx.x, s.shape[1], THREADS_PER_ROW):
            out[row, j] = 0.0
        return
    l = np.float32(0.0)
    for j in range(cuda.threadIdx.x, s.shape[1], THREADS_PER_ROW):
        l += math.exp(s[row, j] - m)
    l = softmax.block_reduce(sums, l, False)
    for j in range(cuda.threadIdx.x, s.shape[1], THREADS_PER_ROW):
        out[row, j] = math.exp(s[row, j] - m) / l


@pytest.mark.parametrize("answer", [lambda: mutation.solution_copy(EXERCISES["04_block_softmax"]),
                                    lambda: block_kernel(SOLUTION), lambda: block_softmax_early_exit])
def test_the_block_softmax_solution_passes(answer):
    result = verdict("04_block_softmax", answer())
    assert result.passed and result.diagnosis == "ok", result
    assert "and a GPU's" in result.message


def test_the_block_softmax_cases_follow_the_block():
    from attention_lib.checks import shapes
    exercise = EXERCISES["04_block_softmax"]
    assert exercise.both_shapes
    with shapes.configured(shapes.GPU, block_softmax_early_exit):
        cases = exercise.cases_for(shapes.GPU)
        assert {c[1] for c in cases} >= {127, 128, 129, 2 * 128 + 5}
    assert {c[1] for c in exercise.cases_for(shapes.SIMULATOR)} >= {31, 32, 33, 2 * 32 + 5}


ALL_IN_THREAD_0 = """    if cuda.threadIdx.x == 0:
        row = cuda.blockIdx.x
        m = np.float32(-math.inf)
        for j in range(s.shape[1]):
            m = max(m, s[row, j])
        shift = m if m > -math.inf else np.float32(0.0)
        total = np.float32(0.0)
        for j in range(s.shape[1]):
            total += math.exp(s[row, j] - shift)
        inv = np.float32(1.0) / total if total > 0 else np.float32(0.0)
        for j in range(s.shape[1]):
            out[row, j] = math.exp(s[row, j] - shift) * inv
"""

# The walks in contiguous chunks, the write pass strided: right values, loads spread over segments.
CHUNKS = """    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    partial = cuda.shared.array(THREADS_PER_ROW, np.float32)
    chunk = (s.shape[1] + THREADS_PER_ROW - 1) // THREADS_PER_ROW
    first, end = tid * chunk, min((tid + 1) * chunk, s.shape[1])
    m = np.float32(-math.inf)
    for j in range(first, end):
        m = max(m, s[row, j])
    m = block_reduce(partial, m, True)
    shift = m if m > -math.inf else np.float32(0.0)
    total = np.float32(0.0)
    for j in range(first, end):
        total += math.exp(s[row, j] - shift)
    total = block_reduce(partial, total, False)
    inv = np.float32(1.0) / total if total > 0 else np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        out[row, j] = math.exp(s[row, j] - shift) * inv
"""

# The write pass in contiguous chunks, the walks strided: right values, stores spread over segments.
CHUNKED_WRITE = (PROLOGUE + MAX_WALK + REDUCE_MAX + SHIFT + SUM_WALK + REDUCE_SUM +
                 "    inv_total = np.float32(1.0) / total if total > 0 else np.float32(0.0)\n"
                 "    chunk = (s.shape[1] + THREADS_PER_ROW - 1) // THREADS_PER_ROW\n"
                 "    for j in range(tid * chunk, min((tid + 1) * chunk, s.shape[1])):\n"
                 "        out[row, j] = math.exp(s[row, j] - shift) * inv_total\n")

# Every thread walks the whole row itself: no reduction, each score read THREADS_PER_ROW times a walk.
WHOLE_ROW_EACH = (PROLOGUE +
                  "    row_max = np.float32(-math.inf)\n"
                  "    for j in range(s.shape[1]):\n"
                  "        row_max = max(row_max, s[row, j])\n" + SHIFT +
                  "    total = np.float32(0.0)\n"
                  "    for j in range(s.shape[1]):\n"
                  "        total += math.exp(s[row, j] - shift)\n" + WRITE)

# The max's walk loads a score twice when it beats the running max: 4 reads, 2 on that line.
MAX_LOADED_TWICE = (PROLOGUE +
                    "    row_max = np.float32(-math.inf)\n"
                    "    for j in range(tid, s.shape[1], THREADS_PER_ROW):\n"
                    "        if s[row, j] > row_max: row_max = s[row, j]\n" + REDUCE_MAX + SHIFT + SUM_WALK +
                    REDUCE_SUM + WRITE)

# The tree by hand, thread 0 walking every slot: right values, a serial reduction.
SERIAL_TREE = (PROLOGUE + MAX_WALK +
               "    partial[tid] = row_max\n"
               "    cuda.syncthreads()\n"
               "    row_max = np.float32(-math.inf)\n"
               "    for t in range(THREADS_PER_ROW):\n"
               "        row_max = max(row_max, partial[t])\n"
               "    cuda.syncthreads()\n" + SHIFT + SUM_WALK + REDUCE_SUM + WRITE)

# A fully masked row's zeros written by thread 0 alone: the loads are the solution's, the stores serial.
ZEROS_BY_THREAD_0 = (PROLOGUE + MAX_WALK + REDUCE_MAX +
                     "    if row_max == -math.inf:\n"
                     "        if tid == 0:\n"
                     "            for j in range(s.shape[1]):\n"
                     "                out[row, j] = 0.0\n"
                     "        return\n" + SHIFT + SUM_WALK + REDUCE_SUM + WRITE)

# Only threads with a column write their slot of the max's tree, which reads every slot: the slots
# unwritten are only ever max's second argument, which the simulator's max(x, NaN) drops, so the values
# come out right and the limit names the read.
UNWRITTEN_SLOTS = (PROLOGUE + MAX_WALK +
                   "    if tid < s.shape[1]:\n"
                   "        partial[tid] = row_max\n"
                   "    cuda.syncthreads()\n"
                   "    stride = THREADS_PER_ROW // 2\n"
                   "    while stride > 0:\n"
                   "        if tid < stride:\n"
                   "            partial[tid] = max(partial[tid], partial[tid + stride])\n"
                   "        cuda.syncthreads()\n"
                   "        stride //= 2\n"
                   "    row_max = partial[0]\n"
                   "    cuda.syncthreads()\n" + SHIFT + SUM_WALK + REDUCE_SUM + WRITE)

# The sum's walk stores each exponential in out, the last pass divides it there: right values, each
# weight stored twice (and read back from main memory).
DIVIDED_IN_OUT = (PROLOGUE + MAX_WALK + REDUCE_MAX + SHIFT +
                  "    total = np.float32(0.0)\n"
                  "    for j in range(tid, s.shape[1], THREADS_PER_ROW):\n"
                  "        e = math.exp(s[row, j] - shift)\n"
                  "        out[row, j] = e\n"
                  "        total += e\n" + REDUCE_SUM +
                  "    inv_total = np.float32(1.0) / total if total > 0 else np.float32(0.0)\n"
                  "    for j in range(tid, s.shape[1], THREADS_PER_ROW):\n"
                  "        out[row, j] = out[row, j] * inv_total\n")

# Both reductions as every thread's atomic on one shared slot: right values, one shared read a thread,
# no race (atomics may touch one slot together), but the block's updates take turns.
BY_ATOMICS = ("    slot = cuda.shared.array(2, np.float32)\n"
              "    row, tid = cuda.blockIdx.x, cuda.threadIdx.x\n"
              "    if tid == 0:\n"
              "        slot[0] = np.float32(-math.inf)\n"
              "        slot[1] = np.float32(0.0)\n"
              "    cuda.syncthreads()\n" + MAX_WALK +
              "    cuda.atomic.max(slot, 0, row_max)\n"
              "    cuda.syncthreads()\n"
              "    row_max = slot[0]\n" + SHIFT + SUM_WALK +
              "    cuda.atomic.add(slot, 1, total)\n"
              "    cuda.syncthreads()\n"
              "    total = slot[1]\n" + WRITE)

BY_THE_LIBRARY = ("    row, tid = cuda.blockIdx.x, cuda.threadIdx.x\n"
                  "    partial = cuda.shared.array(THREADS_PER_ROW, np.float32)\n"
                  "    m = softmax.block_max(partial, softmax.strided_max(s, row, tid, THREADS_PER_ROW))\n"
                  "    total = softmax.block_sum(partial, softmax.strided_sum_exp(s, row, tid, THREADS_PER_ROW, m))\n"
                  "    softmax.strided_write(s, out, row, tid, THREADS_PER_ROW, m, np.float32(1.0) / total)\n")

PEAKS = "at rows = 3, T_k = 35 (peaks scores): "


def MAX_WALK_FROM(start):
    """The solution whose max walk starts at `start` instead of tid."""
    return SOLUTION.replace("for j in range(tid, s.shape[1], THREADS_PER_ROW):\n        row_max",
                            f"for j in range({start}, s.shape[1], THREADS_PER_ROW):\n        row_max")



GPU = "with a GPU's launch"
AT_31 = "at rows = 3, T_k = 31 (normal scores): "


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("answer, diagnosis, says", [
    # the named mistakes
    (SOLUTION.replace("row_max = np.float32(-math.inf)", "row_max = np.float32(0.0)"), "wrong_neutral_value",
     "at rows = 2, T_k = 69 (large scores): rows around +1000 are right but rows around -1000 came out all 0"),
    (SOLUTION.replace(SHIFT, "    shift = max(row_max, np.float32(0.0))\n"), "wrong_neutral_value",
     "or a max clamped at 0 after the reduction all give this"),
    (SOLUTION.replace(REDUCE_MAX, "    row_max = block_reduce(partial, row_max if tid < s.shape[1] else "
                                  "np.float32(0.0), True)\n"), "wrong_neutral_value",
     "at rows = 2, T_k = 31 (deep scores): every score of these rows lies below -90"),
    (MAX_WALK_FROM("tid + 1"), "max_misses_a_column", PEAKS + "row 0's largest score, in column 0, was left out"),
    (SOLUTION.replace("for j in range(tid, s.shape[1], THREADS_PER_ROW):\n        row_max",
                      "for j in range(tid, s.shape[1] - 1, THREADS_PER_ROW):\n        row_max"),
     "max_misses_a_column", PEAKS + "row 1's largest score, in column 34, was left out"),
    (SOLUTION.replace("for j in range(tid, s.shape[1], THREADS_PER_ROW):\n        row_max",
                      "for j in range(tid, s.shape[1], THREADS_PER_ROW + 1):\n        row_max"),
     "max_misses_a_column", PEAKS + "row 2's largest score, in column 32, was left out"),
    (SOLUTION.replace(SHIFT, "    shift = np.float32(0.0)\n"), "unstable_softmax", "Subtract the row maximum"),
    (SOLUTION.replace(SHIFT, "    shift = row_max\n").replace(" if total > 0 else np.float32(0.0)", ""),
     "fully_masked_row", "has every score -inf (fully masked) and its weights came out NaN"),
    (SOLUTION.replace(REDUCE_SUM, ""), "sum_not_reduced",
     AT_31 + "each thread divided its columns by its own partial sum"),
    # the usual wrong answers of the design
    (ALL_IN_THREAD_0, "serial_copy", AT_31 + "the values are right, but one warp made 93 load instructions of s"),
    (SOLUTION.replace("row, tid = cuda.blockIdx.x, cuda.threadIdx.x", "row, tid = 0, cuda.threadIdx.x"),
     "race", "Two blocks touch one element of global memory"),
    (SOLUTION.replace("partial = cuda.shared.array(THREADS_PER_ROW, np.float32)",
                      "partial = cuda.shared.array(32, np.float32)"), "out_of_bounds", GPU),
    (SOLUTION.replace("range(tid, s.shape[1], THREADS_PER_ROW)", "range(tid, s.shape[1], 32)"), "race", GPU),
    (WHOLE_ROW_EACH, "no_reuse", AT_31 + "the values are right, but an element of s was read up to 65 times"),
    (MAX_LOADED_TWICE, "no_reuse", "read up to 4 times from global memory, where the limit is 3: kernel 2 reads "
     "each score three times, in the max's walk, the sum's and the weights': a thread gathers its part of the row "
     "as it walks, and the block shares the parts. The line that read s[0, 0] most, 2 of its 4 reads, is "),
    # the limits
    (CHUNKS, "uncoalesced", "the values are right, but a warp's load of s"),
    (CHUNKED_WRITE, "uncoalesced", "a warp's store of out"),
    (SERIAL_TREE, "serial_reduction", AT_31 + "the values are right, but one thread read shared memory 43 times, "
                                      "where the limit is 24"),
    (SOLUTION.replace(REDUCE_MAX, REDUCE_MAX + "    cuda.syncthreads()\n"), "extra_barriers",
     AT_31 + "the values are right, but a thread passed 15 barriers, where the limit is 14"),
    (UNWRITTEN_SLOTS, "stale_tile", AT_31 + "the values are right, but thread (15, 0, 0) of block (0, 0, 0) read "
                                    "partial[31]"),
    (DIVIDED_IN_OUT, "output_rewritten", AT_31 + "the values are right, but thread (0, 0, 0) of block (0, 0, 0) "
                                         "stored out[0, 0] 2 times"),
    (BY_ATOMICS, "serial_reduction", AT_31 + "the values are right, but thread (0, 0, 0) of block (0, 0, 0) made "
                                      "2 atomic operations on slot, where the limit is 0: atomics on one slot take "
                                      "turns"),
    (ZEROS_BY_THREAD_0, "serial_copy", "at rows = 5, T_k = 33 (masked scores): the values are right, but one warp "
                                       "made 33 store instructions of out"),
    # barriers, guards, float32, given code
    (PROLOGUE + "    if tid >= s.shape[1]:\n        return\n" + MAX_WALK + REDUCE_MAX + SHIFT + SUM_WALK
     + REDUCE_SUM + WRITE, "divergent_barrier", AT_31),
    (PROLOGUE + MAX_WALK + "    if row_max == -math.inf:\n        return\n" + REDUCE_MAX + SHIFT + SUM_WALK
     + REDUCE_SUM + WRITE, "divergent_barrier", AT_31 + "block (0, 0, 0): thread (31, 0, 0) returned while"),
    (SOLUTION.replace("total = np.float32(0.0)", "total = 0.0"), "float64_arithmetic", "total = 0.0"),
    (BY_THE_LIBRARY, "calls_given_code", "block_max"),
    ("    raise NotImplementedError()\n", "not_implemented", "Hint"),
])
def test_block_softmax_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("04_block_softmax", block_kernel(answer, {"softmax": softmax}))
    assert (result.passed, result.diagnosis, says in result.message) == (False, diagnosis, True), result


def test_the_block_softmax_hints_give_the_idea_then_the_plan_in_words():
    hints = EXERCISES["04_block_softmax"].hints
    assert [h.split(":")[0] for h in hints[1:]] == ["the plan", "where answers go wrong"]
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


def test_hints_give_the_idea_then_the_plan_then_the_pitfalls_and_name_no_code():
    for exercise_id in ("04_row_softmax", "04_block_reduction"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) == 3 and hints[1].startswith("where each step goes")
        assert hints[2].startswith("where answers go wrong")
        for text in hints:
            assert not any(code in text for code in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
