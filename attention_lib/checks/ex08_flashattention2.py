"""Notebook 08's exercises: kernel 3's row reduction by warp shuffles (warm-up), then its online
update (main). Both answers are ``@cuda.jit(device=True)`` functions compiled again in the flash
module's namespace with the sizes of the case's head width (``flash.v3_sizes``), so they may use
flash's compile-time names (MICRO_M, MICRO_N, MICRO_D, NEG_INF) besides ``cuda``, ``math`` and
``np``.

``08_row_reduce`` (warm-up)

``reduce(x, take_max)`` with the contract of ``flash.v3_row_reduce`` (its solution): x (MICRO_M,)
holds a thread's partial value for each of its rows; afterwards every lane of the 8-lane row group
holds the row's max (take_max) or sum, combined by warp shuffles. The check launches one block of
kernel 3's 128 threads that loads random values (some -inf for the max), calls the answer and
writes x back, at head widths 1 and 64 (4 rows a thread) and 127 and 100 (2 rows a thread), for the
max and the sum; then kernel 3 itself with the answer in place of v3_row_reduce (its tile max and the final
sum of l). A shuffle that not every lane its mask names reaches (a partial mask, a shuffle under
a branch) is the simulator's BarrierError: ``divergent_barrier``. Besides the engine's diagnoses:

- ``butterfly_missing_step``: each lane combined only 4 (or 2) of its row group's 8 lanes;
- ``reduced_across_rows``: lanes of other row groups of the warp were combined in too;
- ``not_in_every_lane``: only the row group's first lane holds the row's value (a tree that
  moves values one way, shfl_down, instead of the butterfly);
- ``max_and_sum_swapped``: the max computed where the sum was asked for, or the reverse.

``08_online_update`` (main)

``update(s, m, l, o, tile_max)`` with the contract of ``flash.v3_online_update`` (its solution);
the check builds flash v3 with it in that function's place (``flash.build_flash_v3``) and compares
the fused kernel's output with the reference: one key; fewer queries than keys over three key
tiles; more queries than keys (rows that never see a key); a sliding window (rows whose block
starts in a tile they see none of) at d_k 16 (2 output columns a thread); no mask, two heads;
scores in the hundreds at d_k 64 (8 output columns a thread). Besides the engine's diagnoses:
``online_softmax_no_rescale``, ``rescale_l_only``, ``rescale_o_only``, ``max_not_updated``,
``natural_exp`` (exp of base-2 scores), ``nan_before_first_key`` (a row with no key yet rescaled
by 2^(-inf - (-inf)), NaN), ``missed_output_columns`` (only some of a thread's MICRO_D output
columns rescaled).
"""

import functools
import math
import types
import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import flash, mask
from attention_lib.checks.engine import Diagnosed, Exercise, host_output, register
from attention_lib.checks.ex07_fused_attention import large_scores


def _rebound(answer, d_k):
    """The answer's code as a device function whose globals are flash's, with the compile-time
    sizes of head width d_k (as build_flash_v3 compiles the parts)."""
    fn = getattr(answer, "py_func", answer)
    names = {**vars(flash), **flash.v3_sizes(d_k)}
    return cuda.jit(device=True)(types.FunctionType(fn.__code__, names, fn.__name__, None, fn.__closure__))


def _refuse_library_names(answer, names):
    """Diagnosed calls_given_code when the answer's code names one of flash's functions that do the
    work: compiled in flash's namespace, the name would find the library's own."""
    used = set(getattr(getattr(answer, "py_func", answer), "__code__", types.SimpleNamespace(co_names=())).co_names)
    for name in names:
        if name in used:
            raise Diagnosed("calls_given_code", f"the answer calls {name}, the library's own code for what the "
                            "exercise asks: write that part yourself")


# --- 08_row_reduce (warm-up): the row group's butterfly -------------------------------------

class ReduceCase(NamedTuple):
    """One probe of the answer: head width d_k (its MICRO_M rows a thread), the max or the sum; or
    (kernel) flash v3 itself with the answer as its row reduction, T queries and keys."""

    d_k: int
    take_max: bool
    kernel: bool = False
    T: int = 0

    def __str__(self):
        if self.kernel:
            return f"(kernel 3, T {self.T}, d_k {self.d_k}, causal)"
        rows = flash.v3_sizes(self.d_k)["MICRO_M"]
        return f"(d_k {self.d_k}: {rows} rows a thread, {'max' if self.take_max else 'sum'})"


def _probe_source(x_in, x_out, take_max):
    """One block of kernel 3's threads: each loads its MICRO_M values, reduces them across its row
    group with `reduce` (the answer), writes them back. Compiled by _probe with flash's names."""
    t = cuda.threadIdx.x
    x = cuda.local.array(MICRO_M, np.float32)       # noqa: F821  (flash's sizes, bound by _probe)
    for a in range(MICRO_M):                        # noqa: F821
        x[a] = x_in[t, a]
    reduce(x, take_max)                             # noqa: F821
    for a in range(MICRO_M):                        # noqa: F821
        x_out[t, a] = x[a]


@functools.lru_cache(maxsize=None)
def _probe(answer, d_k):
    """The probe kernel at head width d_k, the answer as its `reduce`."""
    names = {**vars(flash), **flash.v3_sizes(d_k), "reduce": _rebound(answer, d_k)}
    return cuda.jit(types.FunctionType(_probe_source.__code__, names, "row_reduce_probe"))


def _lanes_expected(x, take_max, width=8):
    """(128, MICRO_M): every lane holds its row group's (`width` lanes) max or sum, in float64."""
    groups = x.astype(np.float64).reshape(-1, width, x.shape[1])
    combined = groups.max(axis=1, keepdims=True) if take_max else groups.sum(axis=1, keepdims=True)
    return np.broadcast_to(combined, groups.shape).reshape(x.shape)


def _run_reduce(answer, case, rng, launch):
    _refuse_library_names(answer, ("v3_row_reduce", "v3_tile_max"))
    if case.kernel:
        q, k, v = (rng.standard_normal((1, case.T, case.d_k)).astype(np.float32) for _ in range(3))
        kernel = flash.build_flash_v3(case.d_k, {"v3_row_reduce": answer})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            got = flash.flash_attention(q, k, v, version=3, kernel=kernel)
        return got, reference.attention(q, k, v), None, case
    rows = flash.v3_sizes(case.d_k)["MICRO_M"]
    x = rng.standard_normal((flash.THREADS_V3, rows)).astype(np.float32)
    if case.take_max:                                # masked scores: some -inf, a whole row of them
        x[rng.random(x.shape) < 0.3] = -np.inf
        x[8:16, 0] = -np.inf
    out = host_output(x.shape)
    launch(_probe(answer, case.d_k), 1, flash.THREADS_V3, x, out, case.take_max)
    return out, _lanes_expected(x, case.take_max), x, case


def _diagnose_reduce(got, expected, x, case):
    if case.kernel:
        return None
    close = dict(rtol=1e-5, atol=1e-5)

    def same(want):
        finite = np.isfinite(want)
        return np.array_equal(np.isneginf(got), np.isneginf(want)) and np.allclose(got[finite], want[finite], **close)

    if same(_lanes_expected(x, not case.take_max)):
        return "max_and_sum_swapped", (f"every lane holds the row's {'sum' if case.take_max else 'max'}, not its "
                                       f"{'max' if case.take_max else 'sum'}: take_max says which to combine")
    for width in (4, 2):
        if same(_lanes_expected(x, case.take_max, width)):
            return "butterfly_missing_step", (f"each lane combined only {width} of its row group's 8 lanes: the "
                                              "butterfly takes three steps, partners 1, 2 and 4 lanes away")
    for width in (16, 32):
        if same(_lanes_expected(x, case.take_max, width)):
            return "reduced_across_rows", (f"{width} lanes were combined, not 8: partners 8 and 16 lanes away "
                                           "belong to other row groups of the warp, which hold other rows")
    first = np.arange(x.shape[0]) % 8 == 0
    if same(np.where(first[:, None], expected, got)) and not same(expected):
        return "not_in_every_lane", ("only the first lane of each row group holds the row's value: every lane "
                                     "needs it (each rescales its own sums by it); with xor partners, lanes "
                                     "swap values and all 8 end with the total")
    return None


register(Exercise(
    exercise_id="08_row_reduce",
    title="kernel 3's row reduction: the max or sum of a row over its 8 lanes, by warp shuffles",
    kind="function",
    run=_run_reduce,
    # The max with -inf entries (a row all -inf in one row group), the sum, at 4 rows a thread
    # (d_k 1 and 64) and 2 (d_k 127 and 100); then kernel 3 built around it at d_k 9, T 41 (two
    # key tiles, the second partial).
    cases=[ReduceCase(1, True), ReduceCase(64, False), ReduceCase(127, True), ReduceCase(100, False),
           ReduceCase(9, True, kernel=True, T=41)],
    describe_case=str,
    hint=("the 8 lanes of a row group sit side by side in one warp; in each of three rounds every lane swaps "
          "its value with the partner whose lane number differs in one bit (1, 2, then 4 lanes away) and "
          "combines the two, so after the third round all 8 hold the row's result"),
    more_hints=("where answers go wrong: a mask that does not name every lane calling the shuffle, or a shuffle "
                "that only some lanes reach (under a branch): every lane the mask names must arrive; only two "
                "rounds (4 lanes combined), or five (other rows of the warp mixed in); and a one-way tree that "
                "leaves the result in the first lane only",),
    # float32 sums of 8 values against float64: errors near 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_reduce,
    diagnoses=("butterfly_missing_step", "reduced_across_rows", "not_in_every_lane", "max_and_sum_swapped"),
    solution=flash.v3_row_reduce,
    forbidden=(flash.v3_tile_max, flash.flash_attention_kernel_v3),
))


# --- 08_online_update (main): v3's online update, a device function inside the fused kernel --

class UpdateCase(NamedTuple):
    """One launch of flash v3 with the answer as its online update: BH heads of T_q queries
    against T_k keys of width d_k; a sliding window (0: none); large: scores in the hundreds."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    causal: bool
    window: int = 0
    large: bool = False

    def __str__(self):
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''}"
                f"{', large scores' if self.large else ''})")


def _run_update_kernel(update, case, rng, _launch):   # flash_attention launches it
    _refuse_library_names(update, ("v3_online_update",))
    q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
               for t in (case.T_q, case.T_k, case.T_k))
    if case.large:
        q, k = large_scores(rng, case.BH, case.T_q, case.T_k, case.d_k)
    kernel = flash.build_flash_v3(case.d_k, {"v3_online_update": update})
    window = case.window or None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # a wrong update's overflows: said once
        got = flash.flash_attention(q, k, v, case.causal, version=3, kernel=kernel, window=window)
    return got, reference.attention(q, k, v, case.causal, window), q, k, v, case.causal, window


def _v3_result(q, k, v, causal, window, *, rescale_l=True, rescale_o=True, keep_max=True, guard=True,
               base=2.0, columns=None):
    """Kernel 3's output in float64, tile by tile as its blocks walk their bands (TILE_M queries,
    key tiles of TILE_N), with parts of the update switched off (the mistakes). columns: the output
    columns a thread rescales (None: all; [0]: only the first of its MICRO_D, columns < 8)."""
    sizes = flash.v3_sizes(q.shape[2])
    t_q, t_k = q.shape[1], k.shape[1]
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[2])      # natural units
    visible = reference.causal_mask(t_q, t_k, window) if causal else np.ones((t_q, t_k), bool)
    s = np.where(visible, s * math.log2(math.e), -np.inf)                             # base 2, masked
    rescaled = np.zeros(v.shape[2], bool)
    rescaled[slice(None) if columns is None else slice(0, flash.COL_GROUPS)] = True
    out = np.zeros((q.shape[0], t_q, v.shape[2]))
    for q0, rows, first, tiles in mask.band_key_tiles(t_q, t_k, causal, window, sizes["TILE_M"], sizes["TILE_N"]):
        for h, i in ((h, i) for h in range(q.shape[0]) for i in range(q0, q0 + rows)):
            m, l, o = -np.inf, 0.0, np.zeros(v.shape[2])
            for k0 in range(first * sizes["TILE_N"], (first + tiles) * sizes["TILE_N"], sizes["TILE_N"]):
                keys = slice(k0, min(k0 + sizes["TILE_N"], t_k))
                m_new = max(m, s[h, i, keys].max())
                shift = 0.0 if (guard and m_new == -np.inf) else m_new
                with np.errstate(invalid="ignore", over="ignore"):
                    factor = base ** (m - shift)
                    l = l * factor if rescale_l else l
                    o = np.where(rescaled, o * factor, o) if rescale_o else o
                    p = base ** (s[h, i, keys] - shift)
                l, o = l + p.sum(), o + p @ v[h, keys]
                m = m_new if keep_max else m
            with np.errstate(invalid="ignore"):
                out[h, i] = o / l if (l > 0 or np.isnan(l)) else 0.0
    return out


def _diagnose_update(got, expected, q, k, v, causal, window):
    d_k = q.shape[2]
    candidates = [
        ("online_softmax_no_rescale", dict(rescale_l=False, rescale_o=False),
         "neither l nor o was rescaled when a tile raised a row's max: the sums so far were taken "
         "against the old max and must shrink to the new one"),
        ("rescale_l_only", dict(rescale_o=False),
         "l was rescaled but o was not: the output's sums were taken against the same old max"),
        ("rescale_o_only", dict(rescale_l=False),
         "o was rescaled but l was not: l's sum was taken against the same old max"),
        ("max_not_updated", dict(keep_max=False),
         "each row kept only its last tile of keys: the running max m was never stored, so every "
         "tile's rescale against it wiped what came before"),
        ("natural_exp", dict(base=math.e),
         "the weights are too sharp by a factor log2(e): the scores arrive in base 2 (Q carries "
         "log2(e)), so their exponential is exp2, not exp"),
        ("nan_before_first_key", dict(guard=False),
         "rows that had seen no key yet came out NaN: with the max still -inf, 2^(m - m_new) is "
         "2^(-inf - (-inf)), NaN; shift by 0 until a row has seen a key, so l and o stay 0"),
    ]
    if d_k > flash.COL_GROUPS:
        candidates.append(("missed_output_columns", dict(columns=[0]),
                           f"at d_k {d_k} a thread holds {flash.v3_sizes(d_k)['MICRO_D']} output columns of "
                           "each row, and only its first was rescaled: every one of o's MICRO_D entries of the "
                           "row takes the factor"))
    for code, switches, message in candidates:
        wrong = _v3_result(q, k, v, causal, window, **switches)
        nan = np.isnan(wrong)
        if code == "nan_before_first_key":
            if nan.any() and np.array_equal(np.isnan(got), nan) and np.allclose(got[~nan], wrong[~nan], 1e-4, 1e-4):
                return code, message
            continue
        seen = np.isfinite(wrong)
        if seen.any() and np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
    if not np.isfinite(got).all():
        return "wrong_values", ("the output has inf or NaN: a rescale above 1 overflows (the new max "
                                "is the larger one), and a row with no key yet must keep l and o at 0")
    return None


register(Exercise(
    exercise_id="08_online_update",
    title="flash v3's online update: fold a tile of base-2 scores into the rows' running max, sums and output",
    kind="function",
    run=_run_update_kernel,
    # One key; fewer queries than keys over three key tiles (the causal offset, rows whose max
    # grows); more queries than keys (rows that never see a key); a window of 5 at d_k 16 (2
    # output columns a thread; rows 37-47 see no key of the first tile); two heads, not causal;
    # scores in the hundreds at d_k 64 (8 output columns a thread).
    cases=[UpdateCase(1, 1, 1, 5, True), UpdateCase(1, 19, 70, 8, True), UpdateCase(1, 40, 20, 5, True),
           UpdateCase(1, 48, 48, 16, True, 5), UpdateCase(2, 40, 40, 5, False),
           UpdateCase(1, 33, 33, 64, True, 0, True)],
    describe_case=str,
    hint=("every thread of a row sees the same row-wide tile max, so all of them can bring their "
          "partial sums to the new max by the same factor before the tile's own terms join them"),
    more_hints=("where answers go wrong: a row that has seen no key yet (its max and the tile's both minus "
                "infinity) must keep its sums at 0, not turn them into not-a-number; every one of the thread's "
                "output columns of the row takes the factor, not only the first; the scores are in base 2, so "
                "their exponential is exp2; and the new max must be stored for the next tile",),
    # float32 scores, exp2 and sums of up to 70 terms against float64: errors near 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_update,
    diagnoses=("online_softmax_no_rescale", "rescale_l_only", "rescale_o_only", "max_not_updated",
               "natural_exp", "nan_before_first_key", "missed_output_columns"),
    solution=flash.v3_online_update,
    forbidden=(flash.flash_attention_kernel_v3, flash.v3_key_tile),
))
