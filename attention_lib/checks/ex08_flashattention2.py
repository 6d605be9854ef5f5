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

``08_scores_step`` (main): ``step(s, q_tile, k_tile, rg, cg, d)`` with the contract of
``flash.v3_scores_step``: thread (rg, cg) adds column d's products to its micro-tile of S, the rows
and keys the ownership map gives it. Probes at 4 x 4 and 2 x 2 micro-tiles, the first and last
column, then kernel 3 at d_k 16, 64 and 100. Limit: MICRO_M + MICRO_N shared loads a step (each
value loaded once, into a register: ``no_register_reuse``). Besides: ``scores_not_accumulated``,
``wrong_column``, ``rows_not_interleaved``, ``keys_not_interleaved``, ``wrong_micro_tile``.

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
from attention_lib.measure.trace import Traced
from attention_lib.platform import runtime
from attention_lib.stages import flash, mask
from attention_lib.checks import session
from attention_lib.checks.engine import (Diagnosed, Exercise, RaceFound, host_output, output_array, plain_launch,
                                         read_output, register, traced_launch)
from attention_lib.checks.limits import Coalesced, MostLoads, NoLocalMemory, SharedLoadsPerThread

# The head width a GPU runs (ANDREA-120M): kernel 3 at this width is the one compiled for sm_90.
COMPILED_D = 64


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


def _quiet_launch(kernel, griddim, blockdim, *args, sharedmem=0):
    """A launch the judge neither traces nor compiles: kernel 3 at the head widths past the one
    compiled, and the grouped kernel (its dynamic shared memory). Indices are checked on the
    simulator as in the engine's plain_launch."""
    if runtime.ON_SIMULATOR:
        sanitizer.run(kernel, griddim, blockdim, *args, sharedmem=sharedmem)
    else:
        kernel[griddim, blockdim, 0, sharedmem](*args)


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
    """Kernel 3's launch: the engine's plain launch (compiled for a GPU, not traced: kernel 3 traced
    would cost the check seconds) at the head width a GPU runs, a quiet one at the others."""
    return plain_launch if d_k == COMPILED_D else _quiet_launch


def _traced_uncompiled(kernel, griddim, blockdim, *args):
    """The engine's traced launch (races found, the trace kept for the case's limits), but not
    compiled: a probe at a head width past the one compiled (each width is a kernel of its own,
    and compiling each would cost the check seconds)."""
    traced = Traced(kernel, griddim, blockdim, *args)
    judging = session.current()
    if judging is not None:
        judging.traces.append(traced)
    races = traced.races()
    if races:
        raise RaceFound(races[0])
    return traced


def _traced_for(d_k):
    """traced_launch (compiled) for the head width a GPU runs, _traced_uncompiled for the others."""
    return traced_launch if d_k == COMPILED_D else _traced_uncompiled


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


@functools.lru_cache(maxsize=64)
def _update_probe(answer, d_k):
    names = {**vars(flash), **flash.v3_sizes(d_k), "update": _rebound(answer, d_k)}
    return cuda.jit(types.FunctionType(_update_probe_source.__code__, names, "online_update_probe"))


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
    names = {**vars(flash), **sizes, "update": _rebound(update, d_k)}
    probe = cuda.jit(types.FunctionType(_update_probe_source.__code__, names, "update_probe"))
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


@functools.lru_cache(maxsize=64)
def _reduce_probe(answer, d_k):
    """The probe kernel at head width d_k, the answer as its `reduce`."""
    names = {**vars(flash), **flash.v3_sizes(d_k), "reduce": _rebound(answer, d_k)}
    return cuda.jit(types.FunctionType(_reduce_probe_source.__code__, names, "row_reduce_probe"))


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


# --- 08_scores_step (main): the micro-tile a thread owns -----------------------------------------

class StepCase(NamedTuple):
    """A probe of one step at head width d_k, column d; or (kernel) kernel 3 built around the answer,
    BH heads of T_q queries and T_k keys."""

    d_k: int
    d: int = 0
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
        return f"(one step, d_k {self.d_k}: a {z['MICRO_M']} x {z['MICRO_N']} micro-tile a thread, column d {self.d})"


def _step_probe_source(q_in, k_in, s_in, s_out, d):
    """One block of kernel 3's threads: the Q and K tiles copied into shared memory, each thread's
    micro-tile of S from s_in, one call of `step` (the answer) at column d, the micro-tile written
    to s_out. The probe reads no shared memory itself: every shared load traced is the answer's."""
    t = cuda.threadIdx.x
    q_tile = cuda.shared.array((TILE_M, ROW_STRIDE), np.float32)   # noqa: F821  (bound by _step_probe)
    k_tile = cuda.shared.array((TILE_N, ROW_STRIDE), np.float32)   # noqa: F821
    for e in range(t, TILE_M * ROW_STRIDE, THREADS_V3):            # noqa: F821
        q_tile[e // ROW_STRIDE, e % ROW_STRIDE] = q_in[e // ROW_STRIDE, e % ROW_STRIDE]   # noqa: F821
    for e in range(t, TILE_N * ROW_STRIDE, THREADS_V3):            # noqa: F821
        k_tile[e // ROW_STRIDE, e % ROW_STRIDE] = k_in[e // ROW_STRIDE, e % ROW_STRIDE]   # noqa: F821
    s = cuda.local.array(S_SIZE, np.float32)                        # noqa: F821
    for x in range(S_SIZE):                                         # noqa: F821
        s[x] = s_in[t, x]
    cuda.syncthreads()                                              # the tiles are complete
    step(s, q_tile, k_tile, t // COL_GROUPS, t % COL_GROUPS, np.uint32(d))   # noqa: F821
    for x in range(S_SIZE):                                         # noqa: F821
        s_out[t, x] = s[x]


@functools.lru_cache(maxsize=64)
def _step_probe(answer, d_k):
    names = {**vars(flash), **flash.v3_sizes(d_k), "step": _rebound(answer, d_k)}
    return cuda.jit(types.FunctionType(_step_probe_source.__code__, names, "scores_step_probe"))


def _owned(d_k):
    """(rows, keys): (THREADS_V3, S_SIZE) int arrays, the row and key of slot a * MICRO_N + b of each
    thread's micro-tile, as kernel 3 reads it: row rg + 16 a, key cg + 8 b."""
    z = flash.v3_sizes(d_k)
    t = np.arange(flash.THREADS_V3)[:, None]
    slot = np.arange(z["S_SIZE"])[None, :]
    a, b = slot // z["MICRO_N"], slot % z["MICRO_N"]
    return t // flash.COL_GROUPS + flash.ROW_GROUPS * a, t % flash.COL_GROUPS + flash.COL_GROUPS * b


def _run_step(answer, case, rng, launch):
    _refuse_library_names(answer, ("v3_scores_step", "v3_scores"))
    if case.kernel:
        q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
                   for t in (case.T_q, case.T_k, case.T_k))
        got = _attention_v3(_kernel3(answer, "v3_scores_step", case.d_k), _launch_for(case.d_k),
                            q, k, v, case.causal, None)
        return got, reference.attention(q, k, v, case.causal), None
    z = flash.v3_sizes(case.d_k)
    q = rng.standard_normal((z["TILE_M"], z["ROW_STRIDE"])).astype(np.float32)
    k = rng.standard_normal((z["TILE_N"], z["ROW_STRIDE"])).astype(np.float32)
    s0 = rng.standard_normal((flash.THREADS_V3, z["S_SIZE"])).astype(np.float32)
    out = host_output(s0.shape)
    _traced_for(case.d_k)(_step_probe(answer, case.d_k), 1, flash.THREADS_V3, q, k, s0, out, case.d)
    rows, keys = _owned(case.d_k)
    expected = s0 + q[rows, case.d].astype(np.float64) * k[keys, case.d]
    return out, expected, (q, k, s0, case, answer)


def _identify(answer, d_k, d):
    """(rows, keys, columns): (THREADS_V3, S_SIZE) arrays saying, for each slot of each thread's
    micro-tile, which row of q_tile, key of k_tile and column the answer's step put a product of
    there; three quiet probes whose tiles hold row + 1, key + 1, column + 1 (all products exact)."""
    z = flash.v3_sizes(d_k)
    shape_q, shape_k = (z["TILE_M"], z["ROW_STRIDE"]), (z["TILE_N"], z["ROW_STRIDE"])
    found = []
    for q, k in ((np.arange(1, shape_q[0] + 1)[:, None] + np.zeros(shape_q), np.ones(shape_k)),
                 (np.ones(shape_q), np.arange(1, shape_k[0] + 1)[:, None] + np.zeros(shape_k)),
                 (np.arange(1, shape_q[1] + 1)[None, :] + np.zeros(shape_q), np.ones(shape_k))):
        out = np.zeros((flash.THREADS_V3, z["S_SIZE"]), np.float32)
        _quiet_launch(_step_probe(answer, d_k), 1, flash.THREADS_V3, q.astype(np.float32), k.astype(np.float32),
                      np.zeros_like(out), out, d)
        found.append(np.where(np.isfinite(out), np.rint(out), 0).astype(int) - 1)   # -1: no product there
    return found


def _diagnose_step(got, expected, probe):
    if probe is None:
        return None
    q, k, s0, case, answer = probe
    z = flash.v3_sizes(case.d_k)
    if np.allclose(got, expected - s0, rtol=1e-5, atol=1e-5):
        return "scores_not_accumulated", ("s holds this step's products alone: the sums of the steps before "
                                          "were overwritten; each step adds its MICRO_M x MICRO_N products to s")
    rows, keys, columns = _identify(answer, case.d_k, case.d)
    want_rows, want_keys = _owned(case.d_k)
    t = np.arange(flash.THREADS_V3)[:, None]
    slot = np.arange(z["S_SIZE"])[None, :]
    a, b = slot // z["MICRO_N"], slot % z["MICRO_N"]
    rg, cg = t // flash.COL_GROUPS, t % flash.COL_GROUPS
    if (columns != case.d).any():
        c = columns[columns != case.d][0]
        return "wrong_column", (f"the products are of column {c} of the tiles, not of column d = {case.d}: "
                                "a step multiplies the queries' and keys' entries of its own column d")
    if (rows == rg * z["MICRO_M"] + a).all():
        return "rows_not_interleaved", (f"thread (rg, cg) scored rows rg * {z['MICRO_M']} + a, a block of "
                                        f"{z['MICRO_M']} neighbouring rows; the map gives it rows rg, rg + 16, ..."
                                        ": the mask, the store of P and the output read s that way")
    if (keys == cg * z["MICRO_N"] + b).all():
        return "keys_not_interleaved", (f"thread (rg, cg) scored keys cg * {z['MICRO_N']} + b, neighbouring "
                                        "keys; the map gives it keys cg, cg + 8, ...: the 8 lanes of a row group "
                                        "then read 8 neighbouring keys at once, and the kernel reads s that way")
    wrong = np.argwhere((rows != want_rows) | (keys != want_keys))
    if len(wrong) == 0:
        return None
    th, x = (int(i) for i in wrong[0])
    return "wrong_micro_tile", (
        f"thread {th} (rg {th // flash.COL_GROUPS}, cg {th % flash.COL_GROUPS}) added to s[{x}] (a "
        f"{x // z['MICRO_N']}, b {x % z['MICRO_N']}) the product of row {rows[th, x]} and key {keys[th, x]}; "
        f"kernel 3 reads s[a * MICRO_N + b] as the score of row rg + 16 a = {want_rows[th, x]} and key "
        f"cg + 8 b = {want_keys[th, x]} (the ownership map)")


def _step_loads(case):
    """The shared loads one step may make: each of its MICRO_M query values and MICRO_N key values once."""
    z = flash.v3_sizes(case.d_k)
    return z["MICRO_M"] + z["MICRO_N"]


register(Exercise(
    exercise_id="08_scores_step",
    title="kernel 3's micro-tile: one step of a thread's scores, the rows and keys it owns, each value loaded once",
    kind="function",
    gpu_code=True,
    run=_run_step,
    # Probes: column 0 and the last padded column at d_k 64 (4 x 4 a thread), a middle column at
    # d_k 100 (2 x 2), column 5 at d_k 5 (every thread and slot of the micro-tile, each time); then
    # kernel 3 at d_k 64 (two key tiles; compiled for a GPU), d_k 100 (tiles 32 x 16), two heads not causal.
    cases=[StepCase(64, 0), StepCase(64, 63), StepCase(100, 57), StepCase(5, 5),
           StepCase(64, kernel=True, T_q=33, T_k=40),
           StepCase(100, kernel=True, T_q=20, T_k=20), StepCase(16, kernel=True, BH=2, T_q=17, T_k=17, causal=False)],
    describe_case=str,
    hint=("in the ownership map a thread's rows come back at a fixed distance, and so do its keys (read thread "
          "17's printed line); its scores form a small grid of its rows times its keys, where each of its query "
          "values meets each of its key values, so a value loaded once can serve a whole row, or column, of that "
          "grid"),
    more_hints=("the plan: read from the ownership map which rows and which keys thread (rg, cg) owns (a row group "
                "strides down the tile by 16, a column group across by 8); load the MICRO_M query values of column "
                "d of those rows into a small local array, and the MICRO_N key values into another; then, for "
                "every pair, add the product to slot a times MICRO_N plus b of s. Where answers go wrong: "
                "neighbouring rows or keys instead of strided ones, replacing s instead of adding to it, and "
                "loading a value from shared memory again for every product",),
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_step,
    diagnoses=("no_register_reuse", "scores_not_accumulated", "wrong_column", "rows_not_interleaved",
               "keys_not_interleaved", "wrong_micro_tile"),
    solution=flash.v3_scores_step,
    forbidden=(flash.v3_scores, flash.flash_attention_kernel_v3),
    limits=(SharedLoadsPerThread(_step_loads, code="no_register_reuse",
                                 why="load each of the step's MICRO_M query values and MICRO_N key values once "
                                     "into a register, then use each for MICRO_N (or MICRO_M) products"),
            NoLocalMemory()),
))


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


@functools.lru_cache(maxsize=64)
def _packed_probe(answer, d_k, slices):
    z = flash.v3_sizes(d_k)
    names = {**vars(flash), **z, "ROWS": z["TILE_M"] * slices, "load": _rebound(answer, d_k)}
    return cuda.jit(types.FunctionType(_packed_probe_source.__code__, names, "packed_rows_probe"))


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
