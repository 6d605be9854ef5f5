"""Notebook 10's exercises, a local array kept in registers (warm-up) and the same kernel with k staged
through shared memory (main), and deep dive 10x's, the work three kernels cannot avoid.

``10_registers`` (warm-up): a kernel ``(q, k, out)`` computing out[i, j] = q[i] . k[j] for q (T_q, D),
k (T_k, D), one thread per query row holding its row of q in a ``cuda.local.array``, written so that
the array lives in registers (``registers.row_scores_kernel_v2``; the notebook gives
``row_scores_kernel_v1``, whose array sits in local memory). Judged on values (random data, blocks
of 32 rows with the last one partly idle), then by its limits: every element of q read from main
memory once (``no_reuse``: a kernel that reads q again for every key), and, from the engine's
compile for sm_90, a stack frame of 0 bytes (``local_memory``, with ptxas's registers and stack
bytes) and float32 arithmetic (``float64_arithmetic``).

``10_tiled_k`` (main): a whole kernel ``(q, k, out)``, out[i, j] = q[i] . k[j] for q (T_q, D), k (T_k, D),
launched on the warm-up's grid (a thread per query row, blocks of 32), which keeps its row of q in
registers and stages k through shared memory in tiles of the student's choosing
(``registers.row_scores_kernel_v3``). Limits: q read once; each element of k read at most
ceil(T_q / 32) times (once per block); a warp's load of k at most 2 segments, and at most 2 load
instructions of k for every 32 elements the block loads (``NoSerialCopy``); a warp's read of a shared
array at most one word a bank, its store at most two (``bank_conflict``: a tile stored transposed, a key
a column, puts a warp's 32 words in one bank); at most T_k stores of out a thread, none of them to an
element the thread stored already (``output_rewritten``: a score summed in out, a store at every
multiply-add); at most 2 ceil(T_k / 16) barriers (two a step, tiles of at least 16 keys); every slot
read written in its step; a 0-byte stack frame. Named: ``same_key_tile`` (every step copies the
first keys), ``last_tile_dropped`` (the walk stops after the last whole tile), ``scores_not_placed``
(a tile's scores written at their place in the tile, not in out).

``10x_ideal_work`` (deep dive 10x): a function ``ideal_work(kernel, s)`` -> ``(flops, nbytes)`` for kernel
"softmax" (rows of causally masked scores), "flash" (causal attention writing out and the lse) or
"decode" (one query per head against a cache), at sizes ``s`` (a ``BenchSizes``). The FLOPs are
held to the bench's formulas (2 per multiply-add and 1 per other float operation, so 5 per score of
the softmax kernel's rows, masked or not; fused attention and decoding 4 d_k + 5 per visible pair);
the bytes to what the sanitizer counts when the library's kernel runs at those sizes: every element of every array it
reads or writes, once (``softmax v1``, ``flash v2``, ``decode v1``). Both are counts: a float is refused
(``counts_not_integers``, whatever its value). Besides the engine's diagnoses: ``bytes_as_elements``, ``every_access_counted`` (the counted bytes, every request, instead of the
ideal ones), ``arrays_missed`` (an array the kernel reads or writes left out, named),
``multiply_adds_not_flops`` (a multiply-add counted as 1 FLOP), ``softmax_not_counted`` (attention's two
products alone), ``mask_ignored`` (every pair of a causal head),
``diagonal_missed`` (the pairs below the diagonal only), ``visible_scores_only`` (the softmax's
masked scores left out, which its kernel reads and writes too).
"""

import functools
import importlib
import itertools
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import (Coalesced, MostAccessesPerThread, MostBarriers, MostLoads, NoLocalMemory,
                                         NoSerialCopy, RefilledTiles, SharedBanks, StoredOnce)
from attention_lib.measure import bench, recording
from attention_lib.measure.bench_cases import REGISTRY, BenchSizes, Inputs
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import registers

# --- The warm-up: keep a local array in registers ------------------------------------------

D = registers.D
# (T_q, T_k): one row, a partial block, a block one row short, one block and one row.
ROW_CASES = [(1, 1), (7, 19), (31, 2), (33, 5)]


def launch_row_scores(kernel, q, k, launch):
    """Run a kernel with the signature (q, k, out), one thread per query row, on registers'
    grid, through `launch` (the judge's): q (T_q, D), k (T_k, D) float32 device arrays -> out
    (T_q, T_k) float32 NumPy array (the engine's UNWRITTEN where never written)."""
    if q.shape[1] != D or k.shape[1] != D:
        raise ValueError(f"q and k must be (T, {D}) float32, got {q.shape} and {k.shape}")
    full, out = output_array((q.shape[0], k.shape[0]), guard=0)
    launch(kernel, *registers.row_scores_grid(q.shape[0]), q, k, out)
    return read_output(full, out)


def _run_rows(kernel, case, rng, launch):
    t_q, t_k = case
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    got = launch_row_scores(kernel, cuda.to_device(q), cuda.to_device(k), launch)
    return got, reference.scores(q, k, scale=False)


register(Exercise(
    exercise_id="10_registers",
    kind="kernel",
    run=_run_rows,
    cases=ROW_CASES,
    describe_case=lambda c: f"T_q = {c[0]}, T_k = {c[1]}, D = {D}",
    hint=("a thread's local array becomes registers only when every index into it is a constant the compiler "
          "knows once it has unrolled the loops: which of the kernel's loop bounds does the compiler know, and "
          "which only the launch?"),
    more_hints=("where answers go wrong: changing one of the two loops over the row and not the other (both "
                "index the local array), reading q from main memory again for every key instead of from the "
                "local array, and an accumulator started from a plain zero, which Python types as a float64",),
    # float32 sums of 64 products of standard normals (values up to about 25) against float64.
    rtol=1e-5,
    atol=1e-4,
    limits=(MostLoads("q", 1, why="copy the thread's row into its local array once and read it from there"),
            MostAccessesPerThread("out", lambda case: case[1], access="store",
                                  why="a thread per query row writes its row's T_k scores"),
            NoLocalMemory()),
    solution=registers.row_scores_kernel_v2,
    forbidden=(registers.row_scores, registers.launch_row_scores),
))


# --- The main exercise: the row kept in registers, k staged through shared memory ----------------

ROWS = registers.ROWS_PER_BLOCK
# The smallest tile of keys the barrier limit allows (two barriers a step); the library's holds 32 keys.
LEAST_TILE = 16
# Tiles a student may pick, for naming a mistake whatever the tile (smaller ones break the barrier limit).
TILES = (8, 16, 32, 64)


def _tiled_cases(tile=LEAST_TILE, rows=ROWS):
    """(T_q, T_k): a partial block against two tiles less a key (a T_k fixed at the simulator's 32
    reads past k), then two and a key (a step that copies the first keys again, or stops after the
    whole tiles, shows there); a block and a row (blockIdx) against a whole tile; a block one row
    short against a tile less a key; two tiles exactly; four tiles and a key; one row and one key."""
    return [(5, 2 * tile - 1), (3, 2 * tile + 1), (rows + 1, tile), (rows - 1, tile - 1), (2, 2 * tile),
            (2, 4 * tile + 1), (1, 1)]


def _last_keys(t_k, tile):
    """For columns 0 .. tile - 1: the key whose score a walk in tiles of `tile` writes there last
    when it forgets the step's first key in the write."""
    return [max(j for j in range(r, t_k, tile)) for r in range(min(tile, t_k))]


def _tile_mistake(got, expected, q, k):
    """(code, message) for a usual mistake of the walk over key tiles, whatever the tile; None."""
    written = ~unwritten(got)
    t_k = got.shape[1]
    close = lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-4)             # noqa: E731
    if not written.any() and t_k % LEAST_TILE:
        return "last_tile_dropped", (f"no score was written: T_k = {t_k} keys fill no whole tile of {2 * LEAST_TILE} "
                                     "keys, so a walk over whole tiles takes no step. The last tile may hold fewer "
                                     "keys, and it needs its step too")
    for tile in TILES:
        if t_k <= tile:
            continue
        if written.all() and close(got, reference.scores(q, k[np.arange(t_k) % tile], scale=False)):
            return "same_key_tile", (f"the scores of key j came out as those of key j mod {tile}: every step "
                                     f"copied the first {tile} keys into the tile. A step's keys start where the "
                                     "previous step's ended")
        whole = t_k // tile * tile
        if 0 < whole < t_k and written[:, :whole].all() and not written[:, whole:].any() \
                and close(got[:, :whole], expected[:, :whole]):
            return "last_tile_dropped", (f"the scores of keys {whole} to {t_k - 1} were never written: the walk "
                                         "stopped after the last whole tile. The last tile may hold fewer keys, "
                                         "and it needs its step too")
        if written[:, :tile].all() and not written[:, tile:].any() \
                and close(got[:, :tile], expected[:, _last_keys(t_k, tile)]):
            return "scores_not_placed", (f"only the first {tile} columns of out were written, each with the last "
                                         "step's score for that place in the tile: the score of a tile's key "
                                         "belongs in the column of the key, the step's first key plus its place")
    return None


def _run_tiled(kernel, case, rng, launch):
    t_q, t_k = case
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    got = launch_row_scores(kernel, cuda.to_device(q), cuda.to_device(k), launch)
    expected = reference.scores(q, k, scale=False)
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-4, equal_nan=False):
        named = _tile_mistake(got, expected, q, k)
        if named:
            raise Diagnosed(*named)
    return got, expected


def _barriers_why(case):
    steps = ceil_div(case[1], LEAST_TILE)
    return (f"T_k = {case[1]} keys make at most {steps} step{'s' if steps > 1 else ''} with tiles of at least "
            f"{LEAST_TILE} keys, two barriers each (the tile full before it is read, read before it is refilled)")


register(Exercise(
    exercise_id="10_tiled_k",
    kind="kernel",
    run=_run_tiled,
    cases=_tiled_cases(),
    describe_case=lambda c: f"T_q = {c[0]}, T_k = {c[1]}, D = {D}",
    hint=("the 32 rows of a block all read the same keys: if the block first copies a few keys into shared "
          "memory together, every row can read them there, and k leaves main memory once per block instead of "
          "once per row. The row of q stays in registers as in the warm-up: every index into it must be a "
          "constant the compiler knows"),
    more_hints=(
        "the plan: each thread with a query row copies that row into its register array once. Then the block "
        "walks the keys a tile at a time. In each step the whole warp copies the tile's keys, lanes side by "
        "side along each key's row; a barrier; each thread with a row scores the tile's keys against its "
        "registers and writes those scores; a second barrier before the next copy. The last tile may hold "
        "fewer keys",
        "where answers go wrong: a thread with no query row that returns early skips the copies and the "
        "barriers; a step that copies the first keys again instead of its own; a walk that stops after the "
        "last whole tile; a score written at the key's place in the tile instead of its column of out; "
        "lanes that each copy a whole key touch a segment a lane; a tile stored a key a column puts a warp's "
        "words in one bank; a loop over the row bounded by the "
        "array's shape puts the register array in local memory"),
    # float32 sums of 64 products of standard normals (values up to about 25) against float64.
    rtol=1e-5,
    atol=1e-4,
    limits=(MostLoads("q", 1, why="copy the thread's row into its register array once and read it from there"),
            MostLoads("k", lambda case: ceil_div(case[0], ROWS),
                      why="a block copies each key into shared memory once and all its rows read it there"),
            Coalesced("k", 2), NoSerialCopy("k"), StoredOnce("out"),
            MostAccessesPerThread("out", lambda case: case[1], access="store",
                                  why="a thread per query row writes its row's T_k scores"),
            MostBarriers(lambda case: 2 * ceil_div(case[1], LEAST_TILE), why=_barriers_why),
            RefilledTiles(), NoLocalMemory(),
            # Every row reads the tile D times a key (one round); the copy stores each slot once a step (two
            # rounds: a lane storing two neighbouring words).
            SharedBanks(reads=1, stores=2)),
    diagnoses=("same_key_tile", "last_tile_dropped", "scores_not_placed", "bank_conflict", "output_rewritten"),
    solution=registers.row_scores_kernel_v3,
    forbidden=(registers.row_scores, registers.launch_row_scores, registers.row_scores_kernel_v2),
))


# --- The work three kernels cannot avoid --------------------------------

# The library kernel whose launch the sanitizer counts for each name of the contract.
ENTRIES = {"softmax": "softmax v1", "flash": "flash v2", "decode": "decode v1"}
KERNELS = tuple(ENTRIES)
# Sizes (B, H, T, d_k): awkward, no dimension a multiple of another, none deep dive 10x runs the bench
# at above the exercise; one position.
SIZES = (BenchSizes(1, 2, 11, 5), BenchSizes(2, 1, 16, 3), BenchSizes(1, 3, 1, 2))


class WorkCase(NamedTuple):
    """One launch: a kernel of the contract at sizes (B, H, T, d_k)."""

    kernel: str
    sizes: BenchSizes

    def __str__(self):
        s = self.sizes
        return f"({self.kernel}, B {s.B}, H {s.H}, T {s.T}, d_k {s.d_k})"


class Counted(NamedTuple):
    """What one launch of the library's kernel did, counted by the sanitizer: {array: (elements
    read, elements written)} (each element once), the bytes of every load and store, and its
    FLOPs by the bench's formula."""

    arrays: dict
    every_access_bytes: int
    flops: int

    @property
    def ideal_bytes(self):
        return 4 * sum(read + written for read, written in self.arrays.values())

    def describe(self):
        parts = [f"{name} {read:,} read" if read else f"{name} {written:,} written"
                 for name, (read, written) in self.arrays.items()]
        return "elements: " + ", ".join(parts)


@functools.lru_cache(maxsize=None)
def counted(kernel, sizes):
    """Counted for the library's kernel named `kernel` at `sizes`, run once on the simulator (the
    bench's own inputs, seeded) under sanitizer.count_memory; kept for the process."""
    entry = next(e for e in REGISTRY if e.name == ENTRIES[kernel])
    module = importlib.import_module(f"attention_lib.stages.{entry.module}")
    run, _ = entry.prepare(module, sizes, Inputs(sizes))
    with recording.recording_launches(count=True) as launches:
        run()
    arrays, every = {}, 0
    for launch in launches:
        every += launch.report.global_bytes
        for name, traffic in launch.report.arrays.items():
            if traffic.space == "global":
                arrays[name] = (int((traffic.loads > 0).sum()), int((traffic.stores > 0).sum()))
    return Counted(arrays, every, int(entry.flops(sizes)))


def _run_work(answer, case, rng, _launch):              # plain Python: no kernel to launch
    result = answer(case.kernel, case.sizes)
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise TypeError(f"ideal_work must return the tuple (flops, nbytes), got {got}")
    for what, value in zip(("flops", "nbytes"), result):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise Diagnosed("counts_not_integers", (
                f"{what} came back as {value!r}, a {type(value).__name__}. FLOPs and bytes are "
                "counts, whole numbers: return ints (in Python, / gives a float even where it divides exactly)"))
    truth = counted(case.kernel, case.sizes)
    return (np.array([float(result[0]), float(result[1])]), np.array([float(truth.flops), float(truth.ideal_bytes)]),
            case, truth)


def _flops_slip(got, want, case):
    """(code, message) for FLOPs equal to a usual wrong count, else None."""
    s = case.sizes
    wrong = []
    if case.kernel != "softmax":
        pairs = s.BH * s.T * (s.T + 1) // 2 if case.kernel == "flash" else s.BH * s.T
        wrong += [("multiply_adds_not_flops", want - 2 * s.d_k * pairs,
                   "a multiply-add is 2 FLOPs, and attention does two products of d_k multiply-adds per pair (q . k, "
                   "then the weight times v)"),
                  ("softmax_not_counted", want - 5 * pairs,
                   "the two products were counted, not the softmax: each pair's score also costs 5 FLOPs (its "
                   "maximum, subtraction, exponential, sum and scaling)")]
    if case.kernel == "flash":
        per_pair = want / (s.BH * s.T * (s.T + 1) // 2)
        wrong += [("mask_ignored", per_pair * s.BH * s.T * s.T,
                   "every (query, key) pair was counted: under the causal mask query i sees keys 0 .. i only, "
                   "T (T + 1) / 2 pairs per head"),
                  ("diagonal_missed", per_pair * s.BH * s.T * (s.T - 1) // 2,
                   "the pairs below the diagonal were counted, not the diagonal: query i sees key i too, "
                   "T (T + 1) / 2 pairs per head")]
    if case.kernel == "softmax":
        wrong.append(("visible_scores_only", 5 * s.BH * s.T * (s.T + 1) // 2,
                      "only the visible scores were counted: the softmax kernel works on every score of its "
                      "rows, the masked ones too (their weight is computed, 0)"))
    for code, value, message in wrong:
        if value != want and np.isclose(got, value, rtol=1e-12):
            return code, f"{message}; got {got:,.0f} FLOPs, the formula gives {want:,.0f}"
    return None


def _bytes_slip(got, want, truth):
    """(code, message) for bytes equal to a usual wrong count, else None."""
    if np.isclose(got, want / 4, rtol=1e-12):
        return "bytes_as_elements", (f"{got:,.0f} is the number of float32 elements moved; each is 4 bytes: "
                                     f"{want:,.0f} bytes")
    if got != want and np.isclose(got, truth.every_access_bytes, rtol=1e-12):
        return "every_access_counted", (f"{got:,.0f} bytes is every load and store the kernel requests (the "
                                        "counted bytes, as if no cache caught anything); the ideal bytes count "
                                        f"each element once: {want:,.0f}")
    names = list(truth.arrays)
    for size in range(1, len(names)):
        for kept in itertools.combinations(names, size):
            if np.isclose(got, 4 * sum(sum(truth.arrays[n]) for n in kept), rtol=1e-12):
                missed = [n for n in names if n not in kept]
                return "arrays_missed", (f"{got:,.0f} bytes counts {', '.join(kept)} but leaves out "
                                         f"{', '.join(missed)}, which the kernel also "
                                         + " and ".join(sorted({'reads' if truth.arrays[n][0] else 'writes'
                                                                for n in missed}))
                                         + f" ({truth.describe()})")
    return None


def _diagnose_work(got, expected, case, truth):
    """Name the slip in the FLOPs or the bytes; the sanitizer's figures otherwise."""
    if not np.isclose(got[0], expected[0], rtol=1e-12):
        return _flops_slip(got[0], expected[0], case) or (
            "wrong_values", f"the FLOPs: got {got[0]:,.0f}, the bench's formula (the softmax kernel: 5 per score "
                            f"of its rows, masked or not; fused attention and decoding: 4 d_k + 5 per pair, "
                            f"two products of d_k multiply-adds and the softmax of the score) gives {expected[0]:,.0f}")
    return _bytes_slip(got[1], expected[1], truth) or (
        "wrong_values", f"the bytes: got {got[1]:,.0f}, the sanitizer counted {expected[1]:,.0f} ({truth.describe()}, "
                        "4 bytes each)")


register(Exercise(
    exercise_id="10x_ideal_work",
    kind="function",
    run=_run_work,
    # Each kernel at each size: its first case early, so that a slip in one kernel is named at once.
    cases=[WorkCase(kernel, sizes) for sizes in SIZES for kernel in KERNELS],
    hint=("the ideal bytes depend only on the shapes of the arrays a kernel must read and write, never on how "
          "it walks them; the FLOPs depend on how many scores, or (query, key) pairs, the kernel handles and on "
          "what each one costs"),
    more_hints=("the plan, kernel by kernel: list the arrays it reads and writes with their shapes (fused attention "
                "also writes one log-sum-exp per query row), add up their elements and take 4 bytes for each "
                "float32; for the softmax, 5 FLOPs for every score of its rows, the masked ones too, since its "
                "kernel reads and writes them all; for fused attention, count the pairs a causal head lets "
                "through (query i sees keys 0 .. i) and give each pair two products of d_k multiply-adds, 2 FLOPs "
                "each, and the 5 FLOPs of its score's softmax; for decoding, the one query sees every cached key",),
    rtol=0.0,
    atol=0.5,
    diagnose=_diagnose_work,
    diagnoses=("counts_not_integers", "bytes_as_elements", "every_access_counted", "arrays_missed", "multiply_adds_not_flops",
               "softmax_not_counted", "mask_ignored", "diagonal_missed", "visible_scores_only"),
    solution=registers.ideal_work,
    forbidden=(bench.predictions, bench.formula_results),
))
