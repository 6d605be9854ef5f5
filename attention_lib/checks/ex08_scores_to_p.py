"""``08_scores_to_p`` (notebook 08's main exercise): a tile's scores S = Q K^T into the shared P tile,
a MICRO_M x MICRO_N micro-tile a thread, the map the student's (the contract of
``flash.v3_scores_to_p``). Besides the declared limits, two are measured from the probe's trace here:
reads of the Q and K tiles a thread (``TileReads``) and bank conflicts (``limits.SharedBanks`` on the three tiles).
"""

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import flash
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output
from attention_lib.checks.limits import MostAccessesPerThread, MostBarriers, NoLocalMemory, SharedBanks
from attention_lib.checks.ex08_kernel3 import attention_v3, quiet_launch, rebound, refuse_library_names, traced_for


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
    return rebuilt(_scores_probe_source, {**flash.v3_sizes(d_k), "scores_to_p": rebound(answer, d_k)},
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
    refuse_library_names(answer, ("v3_scores_step", "v3_scores", "v3_scores_to_p"))
    if case.kernel:
        q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
                   for t in (case.T_q, case.T_k, case.T_k))
        # Not compiled for a GPU: the probe is. Inside kernel 3, under its cap of 128 registers a
        # thread, ptxas spills for some right answers, a cost of the kernel around them, not theirs.
        got = attention_v3(flash.kernel_v3_with(answer, case.d_k), quiet_launch, q, k, v, case.causal, None)
        return got, reference.attention(q, k, v, case.causal), None
    z = flash.v3_sizes(case.d_k)
    q, k = _staged_tiles(rng, case.d_k)
    out = host_output((z["TILE_M"], z["TILE_N"]))
    traced_for(case.d_k)(_scores_probe(answer, case.d_k), 1, flash.THREADS_V3, q, k, out)
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


register(Exercise(
    exercise_id="08_scores_to_p",
    kind="device function",
    run=_run_scores,
    # Probes at d_k 64 (64 x 32 tiles, 4 x 4 a thread; compiled for a GPU), 5 (HEAD_PAD 8, three
    # zero columns), 16 and 128 (32 x 16 tiles, 2 x 2 a thread); then kernel 3 around the answer at
    # d_k 64 (queries half a tile and one, keys a tile and 8), 16 (not causal, one query past a
    # tile, one key short of two) and 128.
    cases=[ScoresCase(64), ScoresCase(5), ScoresCase(16), ScoresCase(128),
           ScoresCase(64, kernel=True, T_q=33, T_k=40),
           ScoresCase(16, kernel=True, T_q=65, T_k=63, causal=False),
           ScoresCase(128, kernel=True, T_q=20, T_k=17)],
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
    limits=(TileReads(_scores_loads), SharedBanks(reads=1, stores=1, arrays=(("q_tile", ("load",)), ("k_tile", ("load",)), ("p_tile", ("store",))),
                        why=("choose which rows and keys a warp's 32 lanes own so that their words fall in 32 "
                             "different banks, or the same word")),
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
