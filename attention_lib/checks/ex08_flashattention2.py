"""Notebook 08's exercises, kernel 3's pieces, and the deep dive 08x's. Every answer is a
``@cuda.jit(device=True)`` function the check compiles again in the flash module's namespace with
the sizes of a case's head width (``flash.v3_sizes``), as ``flash.build_flash_v3`` compiles the
library's parts: it may use flash's compile-time names (MICRO_M, MICRO_N, MICRO_D, ROW_GROUPS,
COL_GROUPS, HEAD, HEAD_PAD, THREADS_V3, NEG_INF) besides ``cuda``, ``math`` and ``np``.

Each check runs the answer in a *probe* (one block that hands it chosen values and reads back what
it left: the values, and the sanitizer's trace for the limits) and in kernel 3 built around it
(the library's other parts), compared with the reference. Kernel 3's tiles depend on the head
width only, not on the stages' SHAPE_CONSTANTS: a GPU launches it as the simulator does, so one
configuration is enough. The probes and kernel 3 at d_k 64 (a GPU's head width) are compiled for
sm_90 (``gpu_code``): code no GPU compiles (a slice assignment), float64 arithmetic, and kernel 3's
0-byte stack frame (``NoLocalMemory``) are checked there; kernel 3 at the other widths is launched
without compiling it again.

``08_online_update`` (warm-up 1): ``update(s, m, l, o, tile_max)`` with the contract of
``flash.v3_online_update``: notebook 07's online update for a thread's MICRO_M rows, scores in base 2.
Cases: one key; three key tiles; rows that never see a key; a sliding window (rows whose band starts
in a tile they see none of); two heads, not causal; rows 48-49 (the last micro-row, a = 3) with
scores in the hundreds at d_k 64; rows 16-19 (a = 1) at d_k 72 (2 rows a thread). Besides the
engine's: ``online_softmax_no_rescale``, ``rescale_l_only``, ``rescale_o_only``, ``max_not_updated``,
``natural_exp``, ``nan_before_first_key`` (a probe saw l or o turn NaN for a row with no key yet),
``weights_left_as_scores`` (a probe saw such a row's scores left at -inf, which P V then multiplies),
``missed_output_columns``.

``08_row_reduce`` (warm-up 2): ``reduce(x, take_max)`` with the contract of ``flash.v3_row_reduce``:
every lane of the 8-lane row group ends with its row's max or sum. Probes of kernel 3's 128 threads
at 4 and 2 rows a thread, the max (some -inf, a whole row of them) and the sum; then kernel 3.
Limit: at most 3 warp collectives a row and no barrier or shared memory (``too_many_rounds``).
A shuffle that a lane its mask names never reaches is the engine's ``divergent_barrier``. Besides:
``butterfly_missing_step``, ``reduced_across_rows``, ``not_in_every_lane``, ``max_and_sum_swapped``.

``08_scores_to_p`` (main): ``scores_to_p(p_tile, q_tile, k_tile)`` with the contract of
``flash.v3_scores_to_p``: the block's 128 threads write a tile's S = Q K^T into the shared P tile, a
MICRO_M x MICRO_N micro-tile a thread, the map the student's. Probes of one block (d_k 64, 5, 16,
128), then kernel 3 with its scores passed through the answer (``flash.kernel_v3_with``) at d_k 64, 16
and 128. Limits, measured here from the probe's trace: at most (MICRO_M + MICRO_N) HEAD_PAD reads of
the Q and K tiles a thread (``no_register_reuse``), and at most one word a bank in a warp's read of
the Q or K tile and in its store to P (``bank_conflict``); no local memory. Besides:
``padding_column_read``, ``scores_missing``, ``columns_left_out``, ``scores_not_accumulated``,
``scores_misplaced``.

``08x_packed_rows`` (deep dive 08x): ``load(tile, src, h, r0, n, group, scale)`` with the contract
of ``flash.v3_load_packed``: packed rows r0 .. r0 + n - 1 of kv head h's group, times scale, into
the shared tile, zeros elsewhere, copied by all the block's slices. Probes of 1 to 4 slices and
groups of 1 to 4, then the grouped kernel. Limits: every element of src read at most once
(``no_reuse``), and a warp's load touching at most ceil(32 / d_k) + 1 segments (``uncoalesced``).
Padding left unwritten is the engine's ``stale_tile``. Besides: ``rows_not_packed`` (each head's rows
one after another), ``slices_left_out`` (only the first slice's threads copy).
"""

import functools
import math
import types
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform import where
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import flash, mask
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import RaceFound, host_output, launch, output_array, plain_launch, read_output
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostAccessesPerThread, MostBarriers, MostLoads, NoLocalMemory

# The head width a GPU runs (ANDREA-120M): kernel 3 at this width is the one compiled for sm_90.
COMPILED_D = 64


def _rebound(answer, d_k):
    """The answer's code as a device function whose globals are flash's, with the compile-time
    sizes of head width d_k (as build_flash_v3 compiles the parts)."""
    return rebuilt(answer, flash.v3_sizes(d_k), base=vars(flash), device=True)


def _refuse_library_names(answer, names):
    """Diagnosed calls_given_code when the answer's code names one of flash's functions that do the
    work: compiled in flash's namespace, the name would find the library's own."""
    used = set(getattr(getattr(answer, "py_func", answer), "__code__", types.SimpleNamespace(co_names=())).co_names)
    for name in names:
        if name in used:
            raise Diagnosed("calls_given_code", f"the answer calls {name}, the library's own code for what the "
                            "exercise asks: write that part yourself")


# A launch the judge neither traces nor compiles: kernel 3 at the head widths past the one compiled
# (each width is a kernel of its own, and compiling each would cost the check seconds), and the
# grouped kernel (its dynamic shared memory).
_quiet_launch = functools.partial(launch, compile=False)


@functools.lru_cache(maxsize=64)
def _kernel3(answer, part, d_k, grouped=False):
    """Kernel 3 (or its grouped kernel) at head width d_k with the answer in the place of `part`,
    built once per answer and width (so the judge compiles it once)."""
    return flash.build_flash_v3(d_k, {part: answer}, grouped=grouped)


def _attention_v3(kernel, launch, q, k, v, causal, window):
    """out (BH, T_q, d_k) float32 of one launch of kernel 3 `kernel` (grouped when q has more heads
    than k), every entry not written left UNWRITTEN; `launch` as the engine's (the grouped kernel,
    which needs dynamic shared memory, is launched quietly)."""
    (bh, t_q, d_k), group = q.shape, q.shape[0] // k.shape[0]
    grid, block, nbytes = flash.launch_config(kernel, 3, bh, t_q, d_k, group)
    full, out = output_array((bh, t_q, d_k), guard=d_k)
    lse = np.zeros((bh, t_q), np.float32)
    args = (cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), flash.flash_scale(3, d_k), bool(causal),
            np.int32(window or 0), np.int32(group), out, lse)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)      # a wrong answer's overflows: said once
        if nbytes:
            _quiet_launch(kernel, grid, block, *args, sharedmem=nbytes)
        else:
            launch(kernel, grid, block, *args)
    return read_output(full, out)


def _launch_for(d_k):
    """Kernel 3's launch: compiled for a GPU (not traced: kernel 3 traced would cost the check
    seconds) at the head width a GPU runs, quiet at the others."""
    return plain_launch if d_k == COMPILED_D else _quiet_launch


def _traced_for(d_k):
    """A traced launch (races found, the trace kept for the case's limits), compiled for a GPU only
    at the head width a GPU runs."""
    return functools.partial(launch, trace=True, compile=d_k == COMPILED_D)


@dataclass
class WarpRounds:
    """At most `most` warp collectives (shuffles, votes, syncwarps) joined by any thread, and no
    barrier or shared memory: a reduction among the lanes of a warp in log2(lanes) rounds.
    `most(case)` None: not measured on that case."""

    most: Callable
    code: str = "too_many_rounds"

    def broken(self, traces, case, compiled):
        limit = self.most(case)
        if limit is None:
            return None
        for traced in traces:
            shared = traced.arrays(sanitizer.SHARED)
            if traced.barriers or shared:
                used = f"shared memory ({', '.join(shared)})" if shared else f"{traced.barriers} barrier(s)"
                return (f"the values are right, but the reduction used {used}: the 8 lanes of a row group sit in "
                        "one warp and can hand each other registers, with no shared memory and no barrier")
            if traced.launch.warp_collectives > limit:
                return (f"the values are right, but a thread joined {traced.launch.warp_collectives} warp "
                        f"collectives for its {limit // 3} rows, where the limit is {limit}: 3 rounds a row "
                        "(8 lanes, halved each round), with every lane combining in each round")
        return None


# --- 08_online_update (warm-up 1): v3's online update, a device function inside the fused kernel --

class UpdateCase(NamedTuple):
    """One launch of flash v3 with the answer as its online update: BH heads of T_q queries
    against T_k keys of width d_k; a sliding window (0: none); large: scores in the hundreds. Or
    (probe) one warp calling the answer on chosen states at d_k 64, the launch compiled for a GPU."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    causal: bool
    window: int = 0
    large: bool = False
    probe: bool = False

    def __str__(self):
        if self.probe:
            return ("(one warp's update at d_k 64: rows with no key yet, a first key, a max that rises, a max "
                    "that stays)")
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''}"
                f"{', large scores' if self.large else ''})")


def _large_base2(rng, bh, t_q, t_k, d_k):
    """q and k ((bh, T, d_k) float32) whose base-2 scores in kernel 3 are exact and reach about
    +-185, past exp2's float32 range (128): each query is 2^10 in one component (times the scale,
    a power of 2 times a float32, exact), each key entry -1, 0 or 1, so a score is one exact
    product. A kernel that never subtracts the max overflows; one that does stays within 1e-5 of
    the reference (the weights of a row are 1 at its largest score, 2^-185, which is 0, elsewhere)."""
    q = np.zeros((bh, t_q, d_k), np.float32)
    for i in range(t_q):
        q[:, i, i % d_k] = 1024.0 * rng.choice([-1.0, 1.0], size=bh)
    return q, rng.integers(-1, 2, size=(bh, t_k, d_k)).astype(np.float32)


def _update_probe(answer, d_k):
    return rebuilt(_update_probe_source, {**flash.v3_sizes(d_k), "update": _rebound(answer, d_k)}, base=vars(flash),
                   name="online_update_probe")


def _update_states(rng, z):
    """(32, S_SIZE + 3 MICRO_M + O_SIZE) float32: s, m, l, tile_max, o of 32 threads, each row a of a
    thread in one of four states by turn: no key yet and a tile with none; no key yet and a tile
    with some; a running max the tile raises; one it does not."""
    m_, n_, d_ = z["MICRO_M"], z["MICRO_N"], z["MICRO_D"]
    s = 3 * rng.standard_normal((32, m_, n_))
    s[rng.random(s.shape) < 0.2] = -np.inf
    s[..., 0] = 3 * rng.standard_normal((32, m_))                  # a key seen in every row ...
    top = s.max(axis=2) + rng.uniform(0, 1, (32, m_))              # the row's max over all 8 lanes
    m = np.where(np.arange(m_) % 2 == 0, top - rng.uniform(0.5, 3, (32, m_)), top + rng.uniform(0, 2, (32, m_)))
    l, o = rng.uniform(1, 4, (32, m_)), rng.standard_normal((32, m_, d_))
    state = (np.arange(32)[:, None] * m_ + np.arange(m_)) % 4       # 0, 1: no key yet; 2: max rises; 3: stays
    s[state == 0], top[state == 0] = -np.inf, -np.inf              # ... but in the rows with none
    m[state <= 1], l[state <= 1], o[state <= 1] = -np.inf, 0.0, 0.0
    m[state == 2] = top[state == 2] - rng.uniform(0.5, 3, (state == 2).sum())
    return np.concatenate([s.reshape(32, -1), m, l, top, o.reshape(32, -1)], axis=1).astype(np.float32)


def _update_expected(state, z):
    """The state after the update, in float64 (tile_max as it was)."""
    m_, n_, size = z["MICRO_M"], z["MICRO_N"], z["S_SIZE"]
    s = state[:, :size].reshape(32, m_, n_).astype(np.float64)
    m, l, top = (state[:, size + i * m_:size + (i + 1) * m_].astype(np.float64) for i in range(3))
    o = state[:, size + 3 * m_:].reshape(32, m_, -1).astype(np.float64)
    m_new = np.maximum(m, top)
    shift = np.where(np.isneginf(m_new), 0.0, m_new)
    rescale, p = np.exp2(m - shift), np.exp2(s - shift[..., None])
    l, o = l * rescale + p.sum(axis=2), o * rescale[..., None]
    return np.concatenate([p.reshape(32, -1), m_new, l, top, o.reshape(32, -1)], axis=1)


def _run_update_probe(update, launch):
    z = flash.v3_sizes(COMPILED_D)
    state = _update_states(np.random.default_rng(8), z)
    out = host_output(state.shape)
    launch(_update_probe(update, COMPILED_D), 1, 32, state, out)
    top = slice(z["S_SIZE"] + 2 * z["MICRO_M"], z["S_SIZE"] + 3 * z["MICRO_M"])
    out[:, top] = state[:, top]                                    # tile_max: the update may leave it as it likes
    return out, _update_expected(state, z), None, None, None, None, None, update


def _run_update_kernel(update, case, rng, launch):
    _refuse_library_names(update, ("v3_online_update",))
    if case.probe:
        return _run_update_probe(update, launch)
    q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
               for t in (case.T_q, case.T_k, case.T_k))
    if case.large:
        q, k = _large_base2(rng, case.BH, case.T_q, case.T_k, case.d_k)
    kernel = _kernel3(update, "v3_online_update", case.d_k)
    window = case.window or None
    got = _attention_v3(kernel, _quiet_launch, q, k, v, case.causal, window)
    return got, reference.attention(q, k, v, case.causal, window), q, k, v, case.causal, window, update


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


def _update_probe_source(state_in, state_out):
    """One warp: thread t loads its (s, m, l, o, tile_max) from state_in[t], calls `update` (the
    answer), writes the state back. Compiled by _update_probe with flash's names."""
    t = cuda.threadIdx.x
    s = cuda.local.array(S_SIZE, np.float32)        # noqa: F821  (flash's sizes, bound by _update_probe)
    m = cuda.local.array(MICRO_M, np.float32)       # noqa: F821
    l = cuda.local.array(MICRO_M, np.float32)       # noqa: F821
    o = cuda.local.array(O_SIZE, np.float32)        # noqa: F821
    top = cuda.local.array(MICRO_M, np.float32)     # noqa: F821
    for x in range(S_SIZE):                         # noqa: F821
        s[x] = state_in[t, x]
    for a in range(MICRO_M):                        # noqa: F821
        m[a], l[a], top[a] = state_in[t, S_SIZE + a], state_in[t, S_SIZE + MICRO_M + a], state_in[t, S_SIZE + 2 * MICRO_M + a]   # noqa: F821,E501
    for x in range(O_SIZE):                         # noqa: F821
        o[x] = state_in[t, S_SIZE + 3 * MICRO_M + x]    # noqa: F821
    update(s, m, l, o, top)                         # noqa: F821
    for x in range(S_SIZE):                         # noqa: F821
        state_out[t, x] = s[x]
    for a in range(MICRO_M):                        # noqa: F821
        state_out[t, S_SIZE + a], state_out[t, S_SIZE + MICRO_M + a] = m[a], l[a]   # noqa: F821
    for x in range(O_SIZE):                         # noqa: F821
        state_out[t, S_SIZE + 3 * MICRO_M + x] = o[x]   # noqa: F821


def _no_key_yet(update, d_k):
    """What the answer leaves for rows that have seen no key and get a tile with none (m, tile_max
    and every s -inf, l and o 0): (s, l, o) of one thread's first row, float32."""
    sizes = flash.v3_sizes(d_k)
    probe = _update_probe(update, d_k)
    width = sizes["S_SIZE"] + 3 * sizes["MICRO_M"] + sizes["O_SIZE"]
    state = np.zeros((32, width), np.float32)
    state[:, :sizes["S_SIZE"] + sizes["MICRO_M"]] = -np.inf                       # s and m
    state[:, sizes["S_SIZE"] + 2 * sizes["MICRO_M"]:sizes["S_SIZE"] + 3 * sizes["MICRO_M"]] = -np.inf   # tile_max
    after = np.zeros_like(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _quiet_launch(probe, 1, 32, state, after)
    o0 = sizes["S_SIZE"] + 3 * sizes["MICRO_M"]
    return after[0, :sizes["MICRO_N"]], after[0, sizes["S_SIZE"] + sizes["MICRO_M"]], after[0, o0:o0 + sizes["MICRO_D"]]


def _diagnose_update(got, expected, q, k, v, causal, window, update):
    if q is None:                                   # the probe, after every launch of kernel 3 was right
        return None
    d_k = q.shape[2]
    if np.isnan(got).any() and not np.isnan(expected).any():
        s, l, o = _no_key_yet(update, d_k)
        if np.isnan(l) or np.isnan(o).any():
            return "nan_before_first_key", (
                "rows that had seen no key yet came out NaN: for such a row (m and the tile's max both -inf) "
                f"your update left l = {l:g}{' and o NaN' if np.isnan(o).any() else ''}; 2^(m - m_new) is "
                "2^(-inf - (-inf)), NaN: shift by 0 until a row has seen a key, so l and o stay 0")
        if np.isneginf(s).any():
            return "weights_left_as_scores", (
                "rows that had seen no key yet came out NaN: for such a row (m and the tile's max both -inf, "
                "every score -inf) your update left l and o at 0 but the scores s at -inf, and s is what the "
                "kernel stores as the tile's weights P: P V then multiplies -inf by values. Every score "
                "becomes its weight 2^(s - m_new), 0 for a masked key")
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
    ]
    if d_k > flash.COL_GROUPS:
        candidates.append(("missed_output_columns", dict(columns=[0]),
                           f"at d_k {d_k} a thread holds {flash.v3_sizes(d_k)['MICRO_D']} output columns of "
                           "each row, and only its first was rescaled: every one of o's MICRO_D entries of the "
                           "row takes the factor"))
    for code, switches, message in candidates:
        wrong = _v3_result(q, k, v, causal, window, **switches)
        seen = np.isfinite(wrong)
        if seen.any() and np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
    if not np.isfinite(got).all():
        return "wrong_values", ("the output has inf or NaN where the reference has none: "
                                f"{int((~np.isfinite(got)).sum())} of {got.size} entries")
    return None


register(Exercise(
    exercise_id="08_online_update",
    title="flash v3's online update: fold a tile of base-2 scores into the rows' running max, sums and output",
    kind="function",
    gpu_code=True,
    run=_run_update_kernel,
    # One key; fewer queries than keys over three key tiles (the causal offset, rows whose max
    # grows); more queries than keys (rows that never see a key); a window of 5 at d_k 16 (2
    # output columns a thread; rows 37-47 see no key of the first tile); two heads, not causal;
    # rows 48-49 (a thread's last row, a = 3) with scores in the hundreds at d_k 64 (8 output
    # columns a thread); rows 16-19 (a = 1 of 2 rows) at d_k 72; last, one warp's update on chosen
    # states (the launch compiled for a GPU: kernel 3 is launched without compiling it).
    cases=[UpdateCase(1, 1, 1, 5, True), UpdateCase(1, 19, 70, 8, True), UpdateCase(1, 40, 20, 5, True),
           UpdateCase(1, 48, 48, 16, True, 5), UpdateCase(2, 40, 40, 5, False),
           UpdateCase(1, 50, 50, 64, True, 0, True), UpdateCase(1, 20, 20, 72, True),
           UpdateCase(1, 0, 0, COMPILED_D, True, probe=True)],
    describe_case=str,
    hint=("every thread of a row sees the same row-wide tile max, so all of them can bring their "
          "partial sums to the new max by the same factor before the tile's own terms join them"),
    more_hints=("the plan, per row a of the thread: the new max is the larger of the running max and the tile's; "
                "the shift is that new max, or 0 while it is still minus infinity (no key seen yet); the factor "
                "is 2 to the power old max minus shift, and it multiplies l and every one of the row's MICRO_D "
                "output entries; then each of the row's MICRO_N scores becomes its weight, 2 to the power score "
                "minus shift, stored back in s and added to l; last, the new max is stored. Where answers go "
                "wrong: exp for exp2 (the scores are in base 2), a row without keys turned into not-a-number, "
                "only the first output column rescaled",),
    # float32 scores, exp2 and sums of up to 70 terms against float64: errors near 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_update,
    diagnoses=("online_softmax_no_rescale", "rescale_l_only", "rescale_o_only", "max_not_updated",
               "natural_exp", "nan_before_first_key", "weights_left_as_scores", "missed_output_columns"),
    solution=flash.v3_online_update,
    forbidden=(flash.flash_attention_kernel_v3, flash.v3_key_tile),
    limits=(NoLocalMemory(),),
))


# --- 08_row_reduce (warm-up 2): the row group's butterfly ---------------------------------------

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


def _reduce_probe_source(x_in, x_out, take_max):
    """One block of kernel 3's threads: each loads its MICRO_M values, reduces them across its row
    group with `reduce` (the answer), writes them back. Compiled by _reduce_probe with flash's names."""
    t = cuda.threadIdx.x
    x = cuda.local.array(MICRO_M, np.float32)       # noqa: F821  (flash's sizes, bound by _reduce_probe)
    for a in range(MICRO_M):                        # noqa: F821
        x[a] = x_in[t, a]
    reduce(x, take_max)                             # noqa: F821
    for a in range(MICRO_M):                        # noqa: F821
        x_out[t, a] = x[a]


def _reduce_probe(answer, d_k):
    """The probe kernel at head width d_k, the answer as its `reduce`."""
    return rebuilt(_reduce_probe_source, {**flash.v3_sizes(d_k), "reduce": _rebound(answer, d_k)}, base=vars(flash),
                   name="row_reduce_probe")


def _lanes_expected(x, take_max, width=8):
    """(128, MICRO_M): every lane holds its row group's (`width` lanes) max or sum, in float64."""
    groups = x.astype(np.float64).reshape(-1, width, x.shape[1])
    combined = groups.max(axis=1, keepdims=True) if take_max else groups.sum(axis=1, keepdims=True)
    return np.broadcast_to(combined, groups.shape).reshape(x.shape)


def _run_reduce(answer, case, rng, launch):
    _refuse_library_names(answer, ("v3_row_reduce", "v3_tile_max"))
    if case.kernel:
        q, k, v = (rng.standard_normal((1, case.T, case.d_k)).astype(np.float32) for _ in range(3))
        got = _attention_v3(_kernel3(answer, "v3_row_reduce", case.d_k), _quiet_launch, q, k, v, True, None)
        return got, reference.attention(q, k, v), None, case
    rows = flash.v3_sizes(case.d_k)["MICRO_M"]
    x = rng.standard_normal((flash.THREADS_V3, rows)).astype(np.float32)
    if case.take_max:                                # masked scores: some -inf, a whole row of them
        x[rng.random(x.shape) < 0.3] = -np.inf
        x[8:16, 0] = -np.inf
    out = host_output(x.shape)
    _traced_for(case.d_k)(_reduce_probe(answer, case.d_k), 1, flash.THREADS_V3, x, out, case.take_max)
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
    gpu_code=True,
    run=_run_reduce,
    # The max with -inf entries (a row all -inf in one row group), the sum, at 4 rows a thread
    # (d_k 1 and 64: one probe kernel) and 2 (d_k 127 and 100: another); then kernel 3 built
    # around it at d_k 9, T 70 (two blocks of queries, rows in every micro-row; three key tiles).
    cases=[ReduceCase(1, True), ReduceCase(64, False), ReduceCase(127, True), ReduceCase(100, False),
           ReduceCase(9, True, kernel=True, T=70)],
    describe_case=str,
    hint=("the 8 lanes of a row group sit side by side in one warp; in each of three rounds every lane swaps "
          "its value with the partner whose lane number differs in one bit (1, 2, then 4 lanes away) and "
          "combines the two, so after the third round all 8 hold the row's result"),
    more_hints=("the plan, per row a: take the row's value from x into a register; three rounds, with partners 1, "
                "2 and 4 lanes away, each a shuffle by exclusive-or whose mask names all 32 lanes of the warp (all "
                "of them call it), then the max of the two or their sum, as take_max says; store the result back "
                "in x. The partners never leave the row group: lane exclusive-or 1, 2 or 4 stays among the same 8 "
                "aligned lanes. Where answers go wrong: a mask that leaves out lanes that call the shuffle, a "
                "shuffle only some lanes reach (under a branch), two rounds or five, and a one-way tree that "
                "leaves the result in the first lane only",),
    # float32 sums of 8 values against float64: errors near 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_reduce,
    diagnoses=("too_many_rounds", "butterfly_missing_step", "reduced_across_rows", "not_in_every_lane",
               "max_and_sum_swapped"),
    solution=flash.v3_row_reduce,
    forbidden=(flash.v3_tile_max, flash.flash_attention_kernel_v3),
    limits=(WarpRounds(lambda case: None if case.kernel else 3 * flash.v3_sizes(case.d_k)["MICRO_M"]),
            NoLocalMemory()),
))


# --- 08_scores_to_p (main): a tile's scores, a micro-tile a thread, into the shared P tile -------

BANKS = 32


class ScoresCase(NamedTuple):
    """A probe of one call at head width d_k: one block of kernel 3's 128 threads, the staged Q and K
    tiles, the answer writing S into the P tile; or (kernel) kernel 3 with its scores passed through
    the answer (flash.kernel_v3_with), BH heads of T_q queries and T_k keys."""

    d_k: int
    kernel: bool = False
    BH: int = 1
    T_q: int = 0
    T_k: int = 0
    causal: bool = True

    def __str__(self):
        z = flash.v3_sizes(self.d_k)
        if self.kernel:
            return (f"(kernel 3, BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, "
                    f"{'causal' if self.causal else 'not causal'})")
        return (f"(one tile, d_k {self.d_k}: {z['TILE_M']} queries x {z['TILE_N']} keys, HEAD_PAD "
                f"{z['HEAD_PAD']}, a {z['MICRO_M']} x {z['MICRO_N']} micro-tile a thread)")


def _scores_probe_source(q_in, k_in, out):
    """One block of kernel 3's threads: the Q and K tiles copied into shared memory (their padding
    column as q_in and k_in hold it), the P tile filled with NaN, one call of the answer, then the
    P tile's first TILE_N columns copied to out. The probe's own accesses are a warp's 32 neighbouring
    words: every bank conflict traced is the answer's."""
    t = cuda.threadIdx.x
    q_tile = cuda.shared.array((TILE_M, ROW_STRIDE), np.float32)   # noqa: F821  (bound by _scores_probe)
    k_tile = cuda.shared.array((TILE_N, ROW_STRIDE), np.float32)   # noqa: F821
    p_tile = cuda.shared.array((TILE_M, P_STRIDE), np.float32)     # noqa: F821
    for e in range(t, TILE_M * ROW_STRIDE, THREADS_V3):            # noqa: F821
        q_tile[e // ROW_STRIDE, e % ROW_STRIDE] = q_in[e // ROW_STRIDE, e % ROW_STRIDE]   # noqa: F821
    for e in range(t, TILE_N * ROW_STRIDE, THREADS_V3):            # noqa: F821
        k_tile[e // ROW_STRIDE, e % ROW_STRIDE] = k_in[e // ROW_STRIDE, e % ROW_STRIDE]   # noqa: F821
    for e in range(t, TILE_M * P_STRIDE, THREADS_V3):              # noqa: F821
        p_tile[e // P_STRIDE, e % P_STRIDE] = math.nan             # noqa: F821
    cuda.syncthreads()                                              # the tiles are complete
    scores_to_p(p_tile, q_tile, k_tile)                             # noqa: F821
    cuda.syncthreads()                                              # the P tile is complete
    for e in range(t, TILE_M * TILE_N, THREADS_V3):                # noqa: F821
        out[e // TILE_N, e % TILE_N] = p_tile[e // TILE_N, e % TILE_N]   # noqa: F821


def _scores_probe(answer, d_k):
    return rebuilt(_scores_probe_source, {**flash.v3_sizes(d_k), "scores_to_p": _rebound(answer, d_k)},
                   base=vars(flash), name="scores_to_p_probe")


def _staged_tiles(rng, d_k):
    """(q_tile, k_tile) as kernel 3 stages them: (rows, ROW_STRIDE) float32, columns HEAD .. HEAD_PAD - 1
    zero, the padding column HEAD_PAD NaN (kernel 3 never writes it: it holds whatever was there)."""
    z = flash.v3_sizes(d_k)
    tiles = []
    for rows in (z["TILE_M"], z["TILE_N"]):
        tile = rng.standard_normal((rows, z["ROW_STRIDE"])).astype(np.float32)
        tile[:, d_k:] = 0.0
        tile[:, z["HEAD_PAD"]] = np.nan
        tiles.append(tile)
    return tiles


def _run_scores(answer, case, rng, launch):
    _refuse_library_names(answer, ("v3_scores_step", "v3_scores", "v3_scores_to_p"))
    if case.kernel:
        q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
                   for t in (case.T_q, case.T_k, case.T_k))
        # Not compiled for a GPU: the probe is. Inside kernel 3, under its cap of 128 registers a
        # thread, ptxas spills for some right answers, a cost of the kernel around them, not theirs.
        got = _attention_v3(flash.kernel_v3_with(answer, case.d_k), _quiet_launch, q, k, v, case.causal, None)
        return got, reference.attention(q, k, v, case.causal), None
    z = flash.v3_sizes(case.d_k)
    q, k = _staged_tiles(rng, case.d_k)
    out = host_output((z["TILE_M"], z["TILE_N"]))
    _traced_for(case.d_k)(_scores_probe(answer, case.d_k), 1, flash.THREADS_V3, q, k, out)
    pad = z["HEAD_PAD"]
    expected = q[:, :pad].astype(np.float64) @ k[:, :pad].T.astype(np.float64)
    return out, expected, (q, k, case, answer)


def _diagnose_scores(got, expected, probe):
    if probe is None:
        return None
    q, k, case, answer = probe
    z = flash.v3_sizes(case.d_k)
    pad = z["HEAD_PAD"]
    if np.isnan(got).all():
        return "padding_column_read", (f"every score is NaN: the products ran past column HEAD_PAD - 1 = {pad - 1} "
                                       f"into the tiles' padding column {pad}, which kernel 3 never writes; a score "
                                       f"sums columns 0 .. HEAD_PAD - 1 (HEAD_PAD is {pad} at d_k {case.d_k})")
    missing = np.argwhere(np.isnan(got))
    if len(missing):
        i, j = (int(x) for x in missing[0])
        return "scores_missing", (f"{len(missing)} of the {got.size} scores were never written, the first "
                                  f"p_tile[{i}, {j}]: the {flash.THREADS_V3} threads' micro-tiles must cover "
                                  f"all {z['TILE_M']} rows and {z['TILE_N']} keys, each slot once")
    q64, k64 = q[:, :pad].astype(np.float64), k[:, :pad].astype(np.float64)
    for c in range(1, pad):
        if np.allclose(got, q64[:, :c] @ k64[:, :c].T, rtol=1e-5, atol=1e-5):
            return "columns_left_out", (f"the scores sum columns 0 .. {c - 1} only: a score sums all HEAD_PAD "
                                        f"= {pad} columns at d_k {case.d_k} (a bound written as a number holds at "
                                        "one head width only)")
    if np.allclose(got, np.outer(q64[:, pad - 1], k64[:, pad - 1]), rtol=1e-5, atol=1e-5):
        return "scores_not_accumulated", ("the scores hold the last column's products alone: each column's "
                                          "products must be added to the sums of the columns before")
    found = np.isclose(got.ravel()[:, None], expected.ravel()[None, :], rtol=1e-5, atol=1e-5)
    if found.any(axis=1).all():
        wrong = np.argwhere(~np.isclose(got, expected, rtol=1e-5, atol=1e-5))
        if len(wrong):
            i, j = (int(x) for x in wrong[0])
            r, c = divmod(int(np.argmax(found[i * got.shape[1] + j])), got.shape[1])
            return "scores_misplaced", (f"p_tile[{i}, {j}] holds the score of query {r} and key {c}: the store "
                                        "must put each score in its own query's row and key's column, whatever "
                                        "micro-tile the thread owns")
    return None


def _scores_loads(case):
    """The shared reads of the Q and K tiles one thread may make: MICRO_M + MICRO_N a column."""
    z = flash.v3_sizes(case.d_k)
    return (z["MICRO_M"] + z["MICRO_N"]) * z["HEAD_PAD"]


def _bank_ways(words):
    """How many rounds a warp's access to these 4-byte words takes: the most different words in one bank."""
    per_bank = {}
    for word in set(words):
        per_bank.setdefault(word % BANKS, set()).add(word)
    return max(len(w) for w in per_bank.values())


@dataclass
class TileReads:
    """No thread reads the Q and K tiles more than `most(case)` times (each value once into a register)."""

    most: Callable
    code: str = "no_register_reuse"

    def broken(self, traces, case, compiled):
        limit = self.most(case)
        for traced in traces:
            counts = {}
            for name in ("q_tile", "k_tile"):
                for _, kind, who, *_ in traced.launch.targets[name].trace:
                    if kind == sanitizer.LOAD:
                        counts[who] = counts.get(who, 0) + 1
            (block, thread), reads = max(counts.items(), key=lambda item: item[1])
            if reads > limit:
                return (f"the values are right, but thread {thread} read the Q and K tiles {reads} times, where "
                        f"the limit is {limit}: MICRO_M + MICRO_N values a column, each loaded once into a "
                        "register and used for a whole row or column of the micro-tile, the work split over "
                        "all 128 threads")
        return None


@dataclass
class NoBankConflicts:
    """A warp's read of the Q or K tile and its store to the P tile each put at most `most` different
    words in one bank (word mod 32): 1, as the library's map does."""

    most: int = 1
    code: str = "bank_conflict"

    def broken(self, traces, case, compiled):
        for traced in traces:
            for name, kind, access in (("q_tile", sanitizer.LOAD, "read"), ("k_tile", sanitizer.LOAD, "read"),
                                       ("p_tile", sanitizer.STORE, "store")):
                for (_, _, site, _), elements in traced._warp_requests(name, kind).items():
                    ways = _bank_ways(elements)
                    if ways > self.most:
                        return (f"the values are right, but a warp's {access} of {name} at "
                                f"{where.describe_with_code(*site)} puts {ways} different words in one bank "
                                f"({ways} rounds instead of 1): choose which rows and keys a warp's 32 lanes own "
                                "so that their words fall in 32 different banks, or the same word")
        return None


register(Exercise(
    exercise_id="08_scores_to_p",
    title="kernel 3's scores: a micro-tile a thread, each value loaded once, stored to P without bank conflicts",
    kind="function",
    gpu_code=True,
    run=_run_scores,
    # Probes at d_k 64 (64 x 32 tiles, 4 x 4 a thread; compiled for a GPU), 5 (HEAD_PAD 8, three
    # zero columns), 16 and 128 (32 x 16 tiles, 2 x 2 a thread); then kernel 3 around the answer at
    # d_k 64 (queries half a tile and one, keys a tile and 8), 16 (not causal, one query past a
    # tile, one key short of two) and 128.
    cases=[ScoresCase(64), ScoresCase(5), ScoresCase(16), ScoresCase(128),
           ScoresCase(64, kernel=True, T_q=33, T_k=40),
           ScoresCase(16, kernel=True, T_q=65, T_k=63, causal=False),
           ScoresCase(128, kernel=True, T_q=20, T_k=17)],
    describe_case=str,
    hint=("a thread's scores form a small grid of its rows times its keys: each query value it loads meets "
          "every one of its keys, so one load can serve a whole row of that grid. Which rows and keys a warp's "
          "32 lanes own decides which banks their reads and their store touch"),
    more_hints=("the plan: give each thread its micro-tile through its index, so that the 8 threads next to "
                "each other share rows and differ in keys; let a thread's keys and rows lie a fixed distance "
                "apart, not side by side, so that the store of the 32 lanes lands in 32 banks; keep the "
                "micro-tile's sums in a small local array; for each column, load the thread's query values and "
                "key values once, then add every product; at the end, store each sum at its row and key",
                "where answers go wrong: keys side by side within a thread (the store's words share banks), the "
                "loop over columns bound by a number instead of HEAD_PAD, the padding column read, a value "
                "loaded again for every product, and sums replaced instead of added"),
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_scores,
    diagnoses=("padding_column_read", "scores_missing", "columns_left_out", "scores_not_accumulated",
               "scores_misplaced", "no_register_reuse", "bank_conflict", "sums_in_shared_memory"),
    solution=flash.v3_scores_to_p,
    forbidden=(flash.v3_scores_step, flash.v3_scores, flash.flash_attention_kernel_v3),
    limits=(TileReads(_scores_loads), NoBankConflicts(),
            # The probe loads P's first TILE_N columns once (TILE_M TILE_N / THREADS_V3 a thread) and fills it
            # with NaN before the call; the answer stores its micro-tile once and reads nothing of P.
            MostAccessesPerThread("p_tile", lambda case: _probe_share(case, "TILE_N"), code="sums_in_shared_memory",
                                  why="keep the micro-tile's sums in registers and store each once at the end"),
            MostAccessesPerThread("p_tile", lambda case: _probe_share(case, "P_STRIDE") + _micro(case),
                                  access="store", code="sums_in_shared_memory",
                                  why="keep the micro-tile's sums in registers and store each once at the end"),
            MostBarriers(2, why="the caller's two barriers wait for the tiles and for P: the step needs none of "
                                "its own"),
            NoLocalMemory()),
))


def _probe_share(case, columns):
    """The probe's own accesses of P a thread: TILE_M rows of `columns` columns over its threads."""
    z = flash.v3_sizes(case.d_k)
    return -(-z["TILE_M"] * z[columns] // flash.THREADS_V3)


def _micro(case):
    z = flash.v3_sizes(case.d_k)
    return z["MICRO_M"] * z["MICRO_N"]


# --- 08x_packed_rows (deep dive 08x): the grouped kernel's packed rows ---------------------------

class PackedCase(NamedTuple):
    """A probe of one load: `slices` slices of 128 threads copy packed rows r0 .. r0 + n - 1 of kv head
    h's `group` query heads (T_q positions each, width d_k) into one shared tile of 64 rows a slice;
    or (kernel) the grouped kernel with the answer in its loads, group query heads on one kv head."""

    d_k: int
    group: int
    T_q: int
    slices: int = 1
    r0: int = 0
    n: int = 0
    kernel: bool = False

    def __str__(self):
        if self.kernel:
            return f"(grouped kernel, group {self.group}, T {self.T_q}, d_k {self.d_k}, causal)"
        return (f"(d_k {self.d_k}, group {self.group}, T_q {self.T_q}, {self.slices} slice(s): packed rows "
                f"{self.r0} .. {self.r0 + self.n - 1})")


def _packed_probe_source(src, out, h, r0, n, group, scale):
    """One block of blockDim.y slices: `load` (the answer) copies the packed rows into the shared
    tile, which the block then copies to `out` (the probe reads it only after the barrier)."""
    tile = cuda.shared.array((ROWS, ROW_STRIDE), np.float32)         # noqa: F821  (bound by _packed_probe)
    load(tile, src, h, r0, n, group, scale)                          # noqa: F821
    cuda.syncthreads()                                               # the tile is complete
    first = cuda.threadIdx.x + cuda.threadIdx.y * THREADS_V3          # noqa: F821
    for e in range(first, ROWS * HEAD_PAD, THREADS_V3 * cuda.blockDim.y):   # noqa: F821
        out[e // HEAD_PAD, e % HEAD_PAD] = tile[e // HEAD_PAD, e % HEAD_PAD]   # noqa: F821


def _packed_probe(answer, d_k, slices):
    z = flash.v3_sizes(d_k)
    return rebuilt(_packed_probe_source, {**z, "ROWS": z["TILE_M"] * slices, "load": _rebound(answer, d_k)},
                   base=vars(flash), name="packed_rows_probe")


def _packed_expected(src, h, r0, n, group, scale, rows, head_pad):
    """(rows, head_pad) float64: packed row r < n is row (r0 + r) // group of head h * group +
    (r0 + r) % group, times scale; 0 past n and past d_k."""
    want = np.zeros((rows, head_pad))
    for r in range(n):
        want[r, :src.shape[2]] = src[h * group + (r0 + r) % group, (r0 + r) // group] * np.float64(scale)
    return want


def _run_packed(answer, case, rng, launch):
    _refuse_library_names(answer, ("v3_load_packed", "v3_load_tile", "v3_load_shared_tile"))
    if case.kernel:
        q = rng.standard_normal((case.group, case.T_q, case.d_k)).astype(np.float32)
        k, v = (rng.standard_normal((1, case.T_q, case.d_k)).astype(np.float32) for _ in range(2))
        got = _attention_v3(_kernel3(answer, "v3_load_packed", case.d_k, grouped=True), _quiet_launch,
                            q, k, v, True, None)
        return got, reference.attention(q, k, v), None
    z = flash.v3_sizes(case.d_k)
    heads = 2 * case.group                                  # kv heads 0 and 1: the probe loads head 1's group
    src = rng.standard_normal((heads, case.T_q, case.d_k)).astype(np.float32)
    rows = z["TILE_M"] * case.slices
    out = host_output((rows, z["HEAD_PAD"]))
    scale = np.float32(0.5)
    try:
        _traced_for(case.d_k)(_packed_probe(answer, case.d_k, case.slices), 1, (flash.THREADS_V3, case.slices),
                              src, out, 1, case.r0, case.n, case.group, scale)
    except RaceFound as found:
        race = found.race
        if race.array == "tile" and race.thread_a[0] == race.thread_b[0] and race.thread_a[1] != race.thread_b[1]:
            raise Diagnosed("slices_left_out", (
                f"threads {race.thread_a} and {race.thread_b} (the same threadIdx.x in two slices) both wrote "
                f"tile{list(race.index)}: the {case.slices} slices repeat one copy instead of sharing it; number "
                "the block's threads across threadIdx.y too")) from None
        raise
    want = _packed_expected(src, 1, case.r0, case.n, case.group, scale, rows, z["HEAD_PAD"])
    return out, want, (src, case, scale)


def _diagnose_packed(got, expected, probe):
    if probe is None:
        return None
    src, case, scale = probe
    z = flash.v3_sizes(case.d_k)
    close = dict(rtol=1e-5, atol=1e-5)
    rows = z["TILE_M"] * case.slices
    swapped = np.zeros_like(expected)
    for r in range(case.n):                             # head r % T_q, position r // T_q (head-major packing)
        p = case.r0 + r
        swapped[r, :case.d_k] = src[case.group + p // case.T_q, p % case.T_q] * np.float64(scale) \
            if p // case.T_q < case.group else np.nan
    if np.allclose(got, swapped, **close):
        return "rows_not_packed", ("packed row r holds position r % T_q of head r // T_q, each head's rows one "
                                   "after another; the grouped kernel packs them interleaved: row r is position "
                                   "r // group of head h * group + r % group")
    if case.slices > 1 and np.allclose(got[:z["TILE_M"]], expected[:z["TILE_M"]], **close) \
            and not np.allclose(got, expected, **close):
        return "slices_left_out", (f"the first slice's {z['TILE_M']} rows are right and the rest of the {rows} "
                                   f"are not: all {case.slices} slices' threads (threadIdx.y too) share the copy")
    return None


def _warp_segments(case):
    """The segments a warp's load of src may touch: 32 neighbouring columns cross ceil(32 / d_k) row
    ends, each a jump to another head's or position's row: ceil(32 / d_k) + 1 segments."""
    return math.ceil(32 / case.d_k) + 1


register(Exercise(
    exercise_id="08x_packed_rows",
    title="the grouped kernel's packed rows: a group's queries interleaved into one shared tile, copied by all slices",
    kind="function",
    gpu_code=True,
    run=_run_packed,
    # Probes: one head (group 1, K and V's load); a group of 2 over one slice; a group of 3 over 2
    # slices, the last rows partly filled; a group of 4 over 4 slices, starting mid-way; a group of 4
    # over 2 slices at d_k 64 (the probe compiled for a GPU: its static tile fits 48 KB); then the
    # grouped kernel, a group of 3 at d_k 5 (2 slices) and of 4 at d_k 16.
    cases=[PackedCase(5, 1, 40, 1, 0, 40), PackedCase(16, 2, 20, 1, 0, 40), PackedCase(5, 3, 33, 2, 0, 99),
           PackedCase(7, 4, 40, 4, 64, 96), PackedCase(64, 4, 40, 2, 32, 100), PackedCase(5, 3, 33, kernel=True),
           PackedCase(16, 4, 20, kernel=True)],
    describe_case=str,
    hint=("a packed row is a (query head, position) pair: consecutive rows walk through the heads of the group "
          "before the position moves on; the copy itself is notebook 08's, spread over every thread of the "
          "block, slices included"),
    more_hints=("the plan: number the block's threads across both axes (threadIdx.x, then the slices along "
                "threadIdx.y) and let them stride together over the tile's rows times HEAD_PAD columns, "
                "consecutive threads on consecutive columns; for element e, its row r and column c; a real entry "
                "when r is below n and c below HEAD: packed row r0 plus r is position (r0 plus r) divided by group, "
                "of head h times group plus the remainder, times scale; every other slot gets 0. Where answers go "
                "wrong: the first slice's threads alone, each head's rows one after another instead of "
                "interleaved, the padding left as it was",),
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_packed,
    diagnoses=("rows_not_packed", "slices_left_out"),
    solution=flash.v3_load_packed,
    forbidden=(flash.v3_load_shared_tile, flash.v3_load_tile, flash.v3_block_grouped),
    limits=(MostLoads("src", 1,
                      why="each element goes into one slot of the tile, read once by one thread"),
            Coalesced("src", _warp_segments), NoLocalMemory()),
))
