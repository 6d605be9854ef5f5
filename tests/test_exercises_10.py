"""Notebook 10's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line;
and what the notebook builds on them: the registers kernels' report rows. Deep dive 10x's exercise is
in test_exercises_10x.py.

The solutions below are the library's code (the notebook's solution cells), copied: the library's
own code would be refused as given code.
"""

import inspect
import linecache
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check
from attention_lib.checks import mutation
from attention_lib.measure import kernel_report
from attention_lib.stages import registers
from attention_lib.stages.registers import D

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "10_performance.ipynb"


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 10_registers (warm-up): a local array kept in registers ------------------------------------

def planted_kernels():
    """The solution and the typical mistakes. Defined inside a function, as a notebook's would be
    by a cell, so that the kernel report recompiles them from their source."""
    @cuda.jit
    def rows_in_local_memory(q, k, out):                 # the kernel the student starts from
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(q.shape[1]):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(q.shape[1]):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_in_registers(q, k, out):                    # the solution
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_one_loop_changed(q, k, out):                # the copy unrolled, the dot product not
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(q.shape[1]):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_in_float64(q, k, out):                      # registers, but a float64 accumulator
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = 0.0
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_half_loaded(q, k, out):                     # registers, but half of q's row copied
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c] if c < D // 2 else float32(0.0)
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_unguarded(q, k, out):                       # no bounds guard: the last block overruns
        i = cuda.grid(1)
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_q_from_main_memory(q, k, out):              # the local array unused: q read for every key
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q[i, c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_all_by_thread_0(q, k, out):                 # registers, but thread 0 computes every row
        if cuda.grid(1) != 0:
            return
        q_row = cuda.local.array(D, float32)
        for i in range(q.shape[0]):
            for c in range(D):
                q_row[c] = q[i, c]
            for j in range(k.shape[0]):
                acc = float32(0.0)
                for c in range(D):
                    acc += q_row[c] * k[j, c]
                out[i, j] = acc

    @cuda.jit
    def rows_not_written(q, k, out):
        raise NotImplementedError()

    return {f.py_func.__name__: f for f in (rows_all_by_thread_0, rows_in_local_memory, rows_in_registers,
                                            rows_one_loop_changed,
                                            rows_in_float64, rows_half_loaded, rows_unguarded, rows_q_from_main_memory,
                                            rows_not_written)}


PLANTED = planted_kernels()


def compiled_report(kernel):
    """The kernel report's row of a (q, k, out) kernel at sm_90, one warp per block."""
    return kernel_report.report_kernel(kernel, ["array(float32, 2d, C)"] * 3, registers.ROWS_PER_BLOCK, arch="sm_90")


def test_the_kernel_report_tells_local_memory_from_registers():
    spilled, kept = compiled_report(PLANTED["rows_in_local_memory"]), compiled_report(PLANTED["rows_in_registers"])
    assert spilled["stack_bytes"] == 4 * D and kept["stack_bytes"] == 0      # the whole q_row, or nothing
    assert spilled["hot_loop"]["local"] > 0 and kept["hot_loop"]["local"] == 0
    assert kept["registers"] > D and kept["hot_loop"]["ffma"] == D           # the inner loop, unrolled


def test_the_library_rows_are_the_notebooks_story():
    """What notebook 10 prints from the report: v1 keeps q_row in a stack frame; v2 none, more
    registers and fewer warps per SM, and a global load of k beside each of its D multiply-adds."""
    rows = kernel_report.report(names=["registers.row_scores_kernel_v1", "registers.row_scores_kernel_v2"])["kernels"]
    v1, v2 = rows["registers.row_scores_kernel_v1"], rows["registers.row_scores_kernel_v2"]
    assert v1["stack_bytes"] == 4 * D and v2["stack_bytes"] == 0
    assert v2["registers"] > D > v1["registers"] and v2["warps_per_sm"] < v1["warps_per_sm"]
    assert v2["hot_loop"]["ffma"] == v2["hot_loop"]["ldg"] == D and v2["hot_loop"]["local"] == 0


def test_the_notebooks_given_kernel_is_the_librarys_v1():
    """The kernel the warm-up starts from, typed in the notebook, is row_scores_kernel_v1."""
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    given = next(c for c in cells if "def row_scores_local(" in c)
    body = textwrap.dedent(given[given.index("@cuda.jit"):]).strip().replace("row_scores_local", "row_scores_kernel_v1")
    library = inspect.getsource(registers.row_scores_kernel_v1.py_func).strip()
    strip = lambda text: [re.sub(r"\s+#.*$", "", line) for line in text.splitlines() if line.strip()]  # noqa: E731
    assert strip(body) == strip(library)


def test_the_registers_solution_passes():
    result = verdict("10_registers", PLANTED["rows_in_registers"])
    assert result.passed and result.diagnosis == "ok", result.message


@pytest.mark.parametrize("name, diagnosis, says", [
    ("rows_in_local_memory", "local_memory", f"a {4 * D}-byte stack frame (32 registers)"),
    ("rows_one_loop_changed", "local_memory", "-byte stack frame"),
    ("rows_in_float64", "float64_arithmetic", "computes in float64"),
    ("rows_q_from_main_memory", "no_reuse", "an element of q was read up to 19 times from global memory, where the "
                                            "limit is 1"),
    ("rows_half_loaded", "wrong_values", "at T_q = 1, T_k = 1, D = 64: got "),
    ("rows_unguarded", "out_of_bounds", "out-of-bounds "),
    ("rows_all_by_thread_0", "serial_copy", "the values are right, but thread (0, 0, 0) of block (0, 0, 0) made 133 "
                                            "stores of out, where the limit is 19"),
    ("rows_not_written", "not_implemented", "not implemented yet"),
])
def test_planted_mistakes_of_the_registers_exercise_get_their_diagnosis(name, diagnosis, says):
    result = verdict("10_registers", PLANTED[name])
    assert (result.passed, result.diagnosis) == (False, diagnosis) and says in result.message, result.message


def test_a_plain_function_is_not_a_kernel():
    result = verdict("10_registers", PLANTED["rows_in_registers"].py_func)
    assert result.diagnosis == "not_a_kernel" and "decorate it with @cuda.jit" in result.message


def test_the_library_kernels_are_refused_as_given_code():
    assert verdict("10_registers", registers.row_scores_kernel_v2).diagnosis == "calls_given_code"


# --- 10_tiled_k (main): the row in registers, k staged through shared memory --------------------

KT = ROWS = registers.ROWS_PER_BLOCK          # the solution's tile: as many keys as the block has rows
SMALL = 16                                  # the smallest tile the barrier limit allows
TINY = 8
PADDED = KT + 1                             # a row of the transposed tile, one word of padding


@cuda.jit
def tiled_k(q, k, out):                                 # the solution, as the notebook has it
    q_row = cuda.local.array(D, float32)                       # this thread's row of q: registers (report: 0 B of stack)
    k_tile = cuda.shared.array((ROWS, D), float32)   # a tile of as many keys as rows: 8 KB
    i = cuda.grid(1)
    for c in range(D):
        q_row[c] = q[i, c] if i < q.shape[0] else float32(0.0)
    for j0 in range(0, k.shape[0], ROWS):
        for e in range(cuda.threadIdx.x, min(ROWS, k.shape[0] - j0) * D, ROWS):
            k_tile[e // D, e % D] = k[j0 + e // D, e % D]       # lanes side by side along a key's row
        cuda.syncthreads()                                     # the tile is full before any row reads it
        for j in range(j0, min(j0 + ROWS, k.shape[0]) if i < q.shape[0] else j0):   # none past T_q
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k_tile[j - j0, c]            # every lane reads one slot: a broadcast
            out[i, j] = acc
        cuda.syncthreads()                                     # every row is done before the next copy


@cuda.jit
def tiled_k_rows_of_16(q, k, out):
    """A right answer in another style: tiles of 16 keys copied key by key, each lane two columns, zeros
    past T_k; the row of q copied under a guard; every slot scored, the write guarded."""
    tile = cuda.shared.array((SMALL, D), float32)
    lane = cuda.threadIdx.x
    i = cuda.blockIdx.x * ROWS + lane
    q_row = cuda.local.array(D, float32)
    if i < q.shape[0]:
        for c in range(D):
            q_row[c] = q[i, c]
    for step in range((k.shape[0] + SMALL - 1) // SMALL):
        for r in range(SMALL):
            key = step * SMALL + r
            tile[r, lane] = k[key, lane] if key < k.shape[0] else float32(0.0)
            tile[r, lane + 32] = k[key, lane + 32] if key < k.shape[0] else float32(0.0)
        cuda.syncthreads()
        for r in range(SMALL):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * tile[r, c]
            if i < q.shape[0] and step * SMALL + r < k.shape[0]:
                out[i, step * SMALL + r] = acc
        cuda.syncthreads()


def _tiled_variant(*edits):
    """The solution's source with lines replaced, each edit (old line stripped, new lines, which
    occurrence: 0 the first, None every one), compiled as a kernel whose source the compiler can read."""
    lines = inspect.getsource(tiled_k.py_func).splitlines()[1:]              # the decorator dropped
    seen = {}
    out = []
    for line in lines:
        indent = line[:len(line) - len(line.lstrip())]
        key = line.strip()
        nth = seen[key] = seen.get(key, -1) + 1
        new = next((n for old, n, which in edits if old == key and which in (None, nth)), None)
        out += [line] if new is None else [indent + n for n in new.split("\n") if n]
    source = "\n".join(out).replace("def tiled_k(", "def variant(") + "\n"
    filename = f"<planted variant {len(linecache.cache)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = dict(globals())
    exec(compile(source, filename, "exec"), namespace)
    return cuda.jit(namespace["variant"])


@cuda.jit
def k_read_from_main_memory(q, k, out):                 # the warm-up's kernel: no tile at all
    i = cuda.grid(1)
    if i >= q.shape[0]:
        return
    q_row = cuda.local.array(D, float32)
    for c in range(D):
        q_row[c] = q[i, c]
    for j in range(k.shape[0]):
        acc = float32(0.0)
        for c in range(D):
            acc += q_row[c] * k[j, c]
        out[i, j] = acc


@cuda.jit
def rows_in_local_memory_tiled(q, k, out):              # the tile right, q_row's loops bounded at run time
    k_tile = cuda.shared.array((KT, D), float32)
    lane = cuda.threadIdx.x
    i = cuda.blockIdx.x * ROWS + lane
    q_row = cuda.local.array(D, float32)
    if i < q.shape[0]:
        for c in range(q.shape[1]):
            q_row[c] = q[i, c]
    for j0 in range(0, k.shape[0], KT):
        keys = min(KT, k.shape[0] - j0)
        for r in range(keys):
            for c in range(lane, D, ROWS):
                k_tile[r, c] = k[j0 + r, c]
        cuda.syncthreads()
        if i < q.shape[0]:
            for r in range(keys):
                acc = float32(0.0)
                for c in range(q.shape[1]):
                    acc += q_row[c] * k_tile[r, c]
                out[i, j0 + r] = acc
        cuda.syncthreads()


@cuda.jit
def tile_stored_transposed(q, k, out):                  # a key a column: a warp's 32 stores in one bank
    k_tile = cuda.shared.array((D, KT), float32)
    i = cuda.grid(1)
    q_row = cuda.local.array(D, float32)
    for c in range(D):
        q_row[c] = q[i, c] if i < q.shape[0] else float32(0.0)
    for j0 in range(0, k.shape[0], KT):
        for e in range(cuda.threadIdx.x, min(KT, k.shape[0] - j0) * D, KT):
            k_tile[e % D, e // D] = k[j0 + e // D, e % D]
        cuda.syncthreads()
        for j in range(j0, min(j0 + KT, k.shape[0]) if i < q.shape[0] else j0):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k_tile[c, j - j0]
            out[i, j] = acc
        cuda.syncthreads()


@cuda.jit
def tile_transposed_and_padded(q, k, out):              # a key a column, rows of KT + 1 words: no conflict
    k_tile = cuda.shared.array((D, PADDED), float32)
    i = cuda.grid(1)
    q_row = cuda.local.array(D, float32)
    for c in range(D):
        q_row[c] = q[i, c] if i < q.shape[0] else float32(0.0)
    for j0 in range(0, k.shape[0], KT):
        for e in range(cuda.threadIdx.x, min(KT, k.shape[0] - j0) * D, KT):
            k_tile[e % D, e // D] = k[j0 + e // D, e % D]
        cuda.syncthreads()
        for j in range(j0, min(j0 + KT, k.shape[0]) if i < q.shape[0] else j0):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k_tile[c, j - j0]
            out[i, j] = acc
        cuda.syncthreads()


COPY = "for e in range(cuda.threadIdx.x, min(ROWS, k.shape[0] - j0) * D, ROWS):"
SCORE = "for j in range(j0, min(j0 + ROWS, k.shape[0]) if i < q.shape[0] else j0):   # none past T_q"
FIRST = "at T_q = 5, T_k = 31, D = 64: "
SECOND = "at T_q = 3, T_k = 33, D = 64: "

TILED_MISTAKES = {
    "ok_rows_of_16": (tiled_k_rows_of_16, "ok", "correct at every size tried"),
    "no_tile": (k_read_from_main_memory, "no_reuse", FIRST + "the values are right, but an element of k was read "
                "up to 5 times from global memory, where the limit is 1"),
    "lane_0_copies": (_tiled_variant((COPY, "for e in range(0 if cuda.threadIdx.x else min(ROWS, k.shape[0] - j0) "
                                            "* D):", None)),
                      "serial_copy", FIRST + "the values are right, but one warp made 1984 load instructions of k"),
    "lanes_along_keys": (_tiled_variant((COPY, "for e in range(min(ROWS, k.shape[0] - j0) * D):", None),
                                        ("k_tile[e // D, e % D] = k[j0 + e // D, e % D]       # lanes side by side "
                                         "along a key's row", "if e // D == cuda.threadIdx.x:\n    k_tile[e // D, "
                                                              "e % D] = k[j0 + e // D, e % D]", None)),
                         "uncoalesced", FIRST + "the values are right, but a warp's load of k at"),
    "early_return": (_tiled_variant(("i = cuda.grid(1)", "i = cuda.grid(1)\nif i >= q.shape[0]:\n    return", None)),
                     "divergent_barrier", FIRST + "block (0, 0, 0): 27 threads"),
    "one_barrier": (_tiled_variant(("cuda.syncthreads()                                     # every row is done "
                                    "before the next copy", "pass", None)), "race", SECOND + "race on shared 'k_tile'"),
    "no_barrier_before_scoring": (_tiled_variant(("cuda.syncthreads()                                     # the "
                                                  "tile is full before any row reads it", "pass", None)), "race",
                                  FIRST + "race on shared 'k_tile'"),
    "same_key_tile": (_tiled_variant(("k_tile[e // D, e % D] = k[j0 + e // D, e % D]       # lanes side by side "
                                      "along a key's row", "k_tile[e // D, e % D] = k[e // D, e % D]", None)),
                      "same_key_tile", SECOND + "the scores of key j came out as those of key j mod 32: every step "
                                                "copied the first 32 keys"),
    "last_tile_dropped": (_tiled_variant(("for j0 in range(0, k.shape[0], ROWS):",
                                          "for j0 in range(0, k.shape[0] - ROWS + 1, ROWS):", None)),
                          "last_tile_dropped", FIRST + "no score was written: T_k = 31 keys fill no whole tile of 32 keys"),
    "last_tile_of_16_dropped": (_tiled_variant((COPY, "for e in range(cuda.threadIdx.x, SMALL * D, ROWS):", None),
                                               (SCORE, "for j in range(j0, j0 + SMALL if i < q.shape[0] else j0):",
                                                None),
                                               ("for j0 in range(0, k.shape[0], ROWS):",
                                                "for j0 in range(0, k.shape[0] - SMALL + 1, SMALL):", None)),
                                "last_tile_dropped", FIRST + "the scores of keys 16 to 30 were never written: the walk "
                                                             "stopped after the last whole tile"),
    "scores_not_placed": (_tiled_variant(("out[i, j] = acc", "out[i, j - j0] = acc", None)),
                          "scores_not_placed", SECOND + "only the first 32 columns of out were written"),
    "block_dropped": (_tiled_variant(("i = cuda.grid(1)", "i = cuda.threadIdx.x", None)),
                      "race", "at T_q = 33, T_k = 16, D = 64: race on global 'out'[0, 0] (and 511 more elements): "
                              "write by block (0, 0, 0)"),
    "tile_of_8": (_tiled_variant((COPY, "for e in range(cuda.threadIdx.x, min(TINY, k.shape[0] - j0) * D, ROWS):",
                                  None),
                                 (SCORE, "for j in range(j0, min(j0 + TINY, k.shape[0]) if i < q.shape[0] else j0):",
                                  None),
                                 ("for j0 in range(0, k.shape[0], ROWS):", "for j0 in range(0, k.shape[0], TINY):",
                                  None)),
                  "extra_barriers", FIRST + "the values are right, but a thread passed 8 barriers, where the limit "
                                            "is 4: T_k = 31 keys make at most 2 steps with tiles of at least 16 keys"),
    "stale_slots": (_tiled_variant((SCORE, "for j in range(j0, j0 + ROWS if i < q.shape[0] else j0):", None),
                                   ("out[i, j] = acc", "if j < k.shape[0]:\n    out[i, j] = acc", None)),
                    "stale_tile", FIRST + "thread (0, 0, 0) of block (0, 0, 0) read k_tile[31, 0]"),
    "t_k_hard_coded": (_tiled_variant(("for j0 in range(0, k.shape[0], ROWS):", "for j0 in range(0, 32, ROWS):", None),
                                      (COPY, "for e in range(cuda.threadIdx.x, min(ROWS, 32 - j0) * D, ROWS):", None),
                                      (SCORE, "for j in range(j0, min(j0 + ROWS, 32) if i < q.shape[0] else j0):",
                                       None)),
                       "out_of_bounds", FIRST + "out-of-bounds read k[31, 0]"),
    "summed_in_out": (_tiled_variant(("acc = float32(0.0)", "out[i, j] = float32(0.0)", None),
                                     ("acc += q_row[c] * k_tile[j - j0, c]            # every lane reads one slot: "
                                      "a broadcast", "out[i, j] += q_row[c] * k_tile[j - j0, c]", None),
                                     ("out[i, j] = acc", "", None)),
                      "output_rewritten", FIRST + "the values are right, but thread (0, 0, 0) of block (0, 0, 0) "
                                                  "stored out[0, 0] 65 times, the second at "),
    "float64_acc": (_tiled_variant(("acc = float32(0.0)", "acc = 0.0", None)), "float64_arithmetic",
                    "computes in float64"),
    "q_row_in_local_memory": (rows_in_local_memory_tiled, "local_memory", "-byte stack frame"),
    "tile_stored_transposed": (tile_stored_transposed, "bank_conflict", FIRST + "the values are right, but a "
                               "warp's store of k_tile at "),
    "ok_tile_transposed_and_padded": (tile_transposed_and_padded, "ok", "correct at every size tried"),
    "library": (registers.row_scores_kernel_v3, "calls_given_code", "row_scores_kernel_v3"),
}


def test_the_tiled_solution_passes():
    result = verdict("10_tiled_k", tiled_k)
    assert result.passed and result.diagnosis == "ok", result.message
    assert verdict("10_tiled_k", mutation.solution_copy(EXERCISES["10_tiled_k"])).passed


@pytest.mark.parametrize("name", sorted(TILED_MISTAKES))
def test_planted_answers_of_the_tiled_exercise(name):
    answer, diagnosis, says = TILED_MISTAKES[name]
    result = verdict("10_tiled_k", answer)
    print(name, result.diagnosis, result.message)
    assert (result.passed, result.diagnosis) == (diagnosis == "ok", diagnosis) and says in result.message, result.message


def test_every_named_tile_mistake_is_planted():
    planted = {diagnosis for _, diagnosis, _ in TILED_MISTAKES.values()}
    assert set(EXERCISES["10_tiled_k"].diagnoses) <= planted


def test_the_tiled_hints_give_the_idea_then_the_plan_in_words():
    hints = EXERCISES["10_tiled_k"].hints
    assert [h.split(":")[0] for h in hints[1:]] == ["the plan", "where answers go wrong"]
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


def test_the_tiled_kernel_keeps_its_row_in_registers_and_reads_k_from_shared_memory():
    """What notebook 10 shows after the reveal: the main exercise's solution has no stack frame, a tile
    of 32 keys in shared memory, and a hot loop that reads k from there (LDS), never from main memory
    (LDG), where the warm-up's solution loads k beside every multiply-add."""
    rows = kernel_report.report(names=["registers.row_scores_kernel_v2", "registers.row_scores_kernel_v3"])["kernels"]
    v2, v3 = rows["registers.row_scores_kernel_v2"], rows["registers.row_scores_kernel_v3"]
    assert v3["stack_bytes"] == 0 and v3["shared_bytes"] == 4 * registers.ROWS_PER_BLOCK * D
    assert v3["hot_loop"]["ffma"] == v2["hot_loop"]["ffma"] == D
    assert v3["hot_loop"]["ldg"] == 0 < v3["hot_loop"]["lds"] and v2["hot_loop"]["ldg"] == D
