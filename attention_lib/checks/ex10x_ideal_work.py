"""``10x_ideal_work`` (deep dive 10x): a function ``ideal_work(kernel, s)`` -> ``(flops, nbytes)``, the
FLOPs by the bench's formulas and the ideal bytes (every element of every array read or written,
once) of the library's "softmax", "flash" or "decode" kernel at sizes ``s`` (a ``BenchSizes``),
held to what the sanitizer counts when that kernel runs (the library's ``registers.ideal_work``).
Its cases and named mistakes are declared in the Exercise below.
"""

import functools
import importlib
import itertools
from typing import NamedTuple

import numpy as np

from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.result import Diagnosed
from attention_lib.measure import bench, recording
from attention_lib.measure.bench_cases import REGISTRY, BenchSizes, Inputs
from attention_lib.stages import registers

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


BATCH_LEFT_OUT = ("the batch was left out{of}: H = {H} heads counted where the kernel runs B·H = {BH} (s.BH, B = {B} "
                  "sequences of H heads each)")


def _flops_slip(got, want, case):
    """(code, message) for FLOPs equal to a usual wrong count, else None."""
    s = case.sizes
    # H for B·H: right at B = 1, where every kernel runs first, so a count that is wrong only at B = 2 is
    # that; there half the count reads like a multiply-add taken for 1 FLOP. Either term, or both.
    per_head = s.T * s.T if case.kernel == "softmax" else s.T * (s.T + 1) // 2 if case.kernel == "flash" else s.T
    products = 0 if case.kernel == "softmax" else 4 * s.d_k
    batch = BATCH_LEFT_OUT.format(of="", H=s.H, BH=s.BH, B=s.B)
    wrong = [("batch_left_out", (products * x + 5 * y) * per_head, batch)
             for x, y in ((s.H, s.H), (s.H, s.BH), (s.BH, s.H))]
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


def _bytes_slip(got, want, truth, case):
    """(code, message) for bytes equal to a usual wrong count, else None."""
    s = case.sizes
    names = list(truth.arrays)
    # H for B·H in some arrays' sizes (every array here has B·H heads): checked first, as in the FLOPs
    for size in range(1, len(names) + 1) if s.B > 1 else ():
        for short in itertools.combinations(names, size):
            if np.isclose(got, 4 * sum(sum(truth.arrays[n]) // (s.B if n in short else 1) for n in names), rtol=1e-12):
                return "batch_left_out", (BATCH_LEFT_OUT.format(of=f" of {', '.join(short)}", H=s.H, BH=s.BH, B=s.B)
                                          + f"; got {got:,.0f} bytes, the sanitizer counted {want:,.0f} "
                                            f"({truth.describe()})")
    if np.isclose(got, want / 4, rtol=1e-12):
        return "bytes_as_elements", (f"{got:,.0f} is the number of float32 elements moved; each is 4 bytes: "
                                     f"{want:,.0f} bytes")
    if got != want and np.isclose(got, truth.every_access_bytes, rtol=1e-12):
        return "every_access_counted", (f"{got:,.0f} bytes is every load and store the kernel requests (the "
                                        "counted bytes, as if no cache caught anything); the ideal bytes count "
                                        f"each element once: {want:,.0f}")
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
    return _bytes_slip(got[1], expected[1], truth, case) or (
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
               "softmax_not_counted", "mask_ignored", "diagonal_missed", "visible_scores_only", "batch_left_out"),
    solution=registers.ideal_work,
    forbidden=(bench.predictions, bench.formula_results),
))
