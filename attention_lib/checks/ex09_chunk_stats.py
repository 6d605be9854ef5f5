"""``09_chunk_stats`` (notebook 09, main part 1): a device function with ``kv_cache.chunk_stats``'s
signature ``(s, m_s, l_s)``, called by every thread of a block of KEYS_PER_CHUNK with its score (-inf
without a position) and two shared scratch arrays, that returns the block's (m, l) to every thread by
one tree of (max, sum) pairs. The check runs ``kv_cache.chunk_stats_kernel`` around it at the
simulator's chunk and a GPU's. Its solution is ``kv_cache.chunk_stats``; its cases, limits and named
mistakes are declared in the ``Exercise`` below. ``FLOAT_ERRORS`` and ``log2_chunk`` serve
``09_chunk_partial`` too.
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib.stages import kv_cache
from attention_lib.checks import shapes
from attention_lib.checks.engine import Exercise, register
from attention_lib.platform.rebuild import rebuilt
from attention_lib.checks.launch import output_array, read_output
from attention_lib.checks.limits import MostBarriers, NoUnwrittenReads, SharedLoadsPerThread

# What a GPU's float32 exp or log does where the simulator's Python math raises instead.
FLOAT_ERRORS = (OverflowError, ZeroDivisionError, ValueError, FloatingPointError)


def log2_chunk():
    return int(math.log2(kv_cache.KEYS_PER_CHUNK))


# Threads without a position anywhere in the block, not only after the last filled one: of each 8
# threads, these hold -inf in a "scattered" case (an empty pair then meets a full one on either side).
SCATTERED_EMPTY = (0, 3, 6, 7)


class StatsCase(NamedTuple):
    """One size tried: two blocks of KEYS_PER_CHUNK threads, every thread of the first holding a score
    and the first n_keys of the second; scores "random" (N(0, 3)), "spread" (-700 .. 760, the first
    the lowest), "low" (-800 .. -760) or "scattered" (random, -inf in threads 0, 3, 6 and 7 of every 8)."""

    n_keys: int
    scores: str = "random"

    def filled(self):
        return (kv_cache.KEYS_PER_CHUNK, self.n_keys)

    def __str__(self):
        return f"(blocks of {kv_cache.KEYS_PER_CHUNK} and {self.n_keys} positions, {self.scores} scores)"


def _stats_cases(configuration):
    """Beside a full block of the configuration's chunk n (8 or 32), one of 3 positions with every score
    below -760 (first: a max started from 0 shows there); then one short, half plus one and 1, and 1
    and one short with scores spread past exp's range; last, threads without a position scattered
    through both blocks."""
    n = kv_cache.SHAPE_CONSTANTS["KEYS_PER_CHUNK"][0 if configuration == shapes.SIMULATOR else 1]
    # half plus one and 1: runs of threads without a position, where two empty pairs merge; scattered:
    # an empty pair below a full one, which a pair tree merges into the empty slot
    return [StatsCase(3, "low"), StatsCase(n - 1), StatsCase(n // 2 + 1), StatsCase(1), StatsCase(1, "spread"),
            StatsCase(n - 1, "spread"), StatsCase(n - 1, "scattered")]


def _stats_kernel_around(answer, size):
    return rebuilt(kv_cache.chunk_stats_kernel, {"chunk_stats": answer, "KEYS_PER_CHUNK": size})


def _stats_scores(case, rng):
    """(blocks, KEYS_PER_CHUNK) float32 scores, exact integers where they lie past exp's range."""
    n = kv_cache.KEYS_PER_CHUNK
    blocks = len(case.filled())
    if case.scores in ("random", "scattered"):
        scores = (3.0 * rng.standard_normal((blocks, n))).astype(np.float32)
        if case.scores == "scattered":               # a thread without a position passes -inf
            scores[:, np.isin(np.arange(n) % 8, SCATTERED_EMPTY)] = -np.inf
        return scores
    if case.scores == "low":
        return rng.integers(-800, -760, (blocks, n)).astype(np.float32)
    scores = rng.integers(-700, 761, (blocks, n)).astype(np.float32)
    scores[:, 0] = -700.0                            # the first the lowest
    for b, filled in enumerate(case.filled()):
        scores[b, filled - 1] = 760.0                # the largest, last of the filled
    return scores


def _stats_reference(scores, n_keys):
    """(blocks, KEYS_PER_CHUNK, 2) float64: each block's (m, l), in every thread."""
    out = np.zeros(scores.shape + (2,))
    for b, filled in enumerate(n_keys):
        s = scores[b, :filled].astype(np.float64)
        out[b, :, 0], out[b, :, 1] = s.max(), np.exp(s - s.max()).sum()
    return out


def _run_chunk_stats(answer, case, rng, launch):
    kernel = _stats_kernel_around(answer, kv_cache.KEYS_PER_CHUNK)
    scores, n_keys = _stats_scores(case, rng), np.array(case.filled(), np.int32)
    expected = _stats_reference(scores, n_keys)
    blocks, n = scores.shape
    full_m, m_out = output_array((blocks, n), guard=n)
    full_l, l_out = output_array((blocks, n), guard=n)
    try:
        launch(kernel, blocks, n, cuda.to_device(scores), cuda.to_device(n_keys), m_out, l_out)
    except FLOAT_ERRORS:
        # The simulator's math.exp raises past float64's range; a GPU's float32 exp returns inf.
        if case.scores in ("random", "scattered"):
            raise
        return np.full(expected.shape, np.nan), expected, scores, n_keys
    got = np.stack([read_output(full_m, m_out), read_output(full_l, l_out)], axis=-1)
    return got, expected, scores, n_keys


def _diagnose_chunk_stats(got, expected, scores, n_keys):
    close = dict(rtol=1e-5, atol=1e-5)
    with np.errstate(all="ignore"):
        broken = np.isnan(got).any(axis=(1, 2))                       # per block
        if np.isneginf(scores[0]).any():                              # a scattered case
            said = ("threads without a position sit among threads with one (threads 0, 3, 6 and 7 of every 8), "
                    "where the earlier cases had them all after the last position")
            if broken.any():
                return "empty_pairs_nan", (
                    f"NaN where {said}: a pair without a position merged with a pair that has one gave NaN. "
                    "A thread without a position holds (-inf, 0) from the start (exp(s - s) is NaN at s = -inf), "
                    "and a NaN sum times exp(-inf) = 0 stays NaN")
            # a dropped pair leaves less than the whole: m no larger, l exp(m_got - m) smaller
            mass = got[..., 1] * np.exp(got[..., 0] - expected[..., 0])
            if (mass < expected[..., 1] * (1 - 1e-5)).any() and (got[..., 0] <= expected[..., 0]).all():
                return "pair_dropped", (
                    f"m or l wrong where {said}: {_say_first(got, expected)}. A pair with a position was dropped "
                    "when merged into an empty slot: when one of the two pairs is empty, the merged pair is the "
                    "other one")
        if broken[n_keys < kv_cache.KEYS_PER_CHUNK - 1].any() and not broken[n_keys == kv_cache.KEYS_PER_CHUNK].any():
            return "empty_pairs_nan", (
                "NaN in a block with several threads without a position: two empty pairs (-inf, 0) merged "
                "give exp(-inf - (-inf)), NaN; when both maxima are -inf, leave the pair as it is")
        if np.allclose(got[:, 0], expected[:, 0], **close):
            return "result_not_broadcast", (
                "thread 0 got the chunk's (m, l) but the other threads did not: once the last round is "
                "over, every thread reads slot 0")
        if np.allclose(got[..., 0], expected[..., 0], **close):
            if np.allclose(got[..., 1], n_keys[:, None], **close):
                return "sums_not_rescaled", (
                    "l is the number of positions: each pair's sum counts exp(s - its own max), so before two "
                    "sums are added each is rescaled to the larger max, multiplied by exp(its max - m)")
            return "sums_not_rescaled", (
                "m is right but l is not: before two pairs' sums are added, each is rescaled to the larger "
                "of the two maxima, multiplied by exp(its own max - the larger)")
        if (expected[..., 0] < 0).all() and np.allclose(got[..., 0], 0.0):
            return "max_from_zero", ("m came out 0 where every score lies below 0: start from the thread's "
                                     "score (-inf without one), not from 0")
    return None


def _say_first(got, expected):
    """'block b, thread t got (m, l), expected (m, l)' for the first thread whose pair is wrong."""
    bad = ~np.isclose(got, expected, rtol=1e-5, atol=1e-5).all(axis=-1)
    b, t = (int(i) for i in np.argwhere(bad)[0])
    return (f"block {b}, thread {t} got (m, l) = ({got[b, t, 0]:.6g}, {got[b, t, 1]:.6g}), "
            f"expected ({expected[b, t, 0]:.6g}, {expected[b, t, 1]:.6g})")


def _stats_reads(case):
    """Two calls of 4 slots a round (both pairs), log2 n rounds, the result's 2 and 2 to spare each;
    n = KEYS_PER_CHUNK."""
    return 2 * (4 * log2_chunk() + 4)


register(Exercise(
    exercise_id="09_chunk_stats",
    kind="device function",
    both_shapes=True,
    run=_run_chunk_stats,
    cases=_stats_cases,
    hint=("the online softmax of notebook 07 merged a running (max, sum) with each new score; two (max, sum) "
          "pairs merge the same way, the sum of the smaller max rescaled to the larger, so one tree can carry "
          "both at once; a thread's score is a pair of its own: the score and 1, or minus infinity and 0"),
    more_hints=("the plan: every thread writes its pair to its slots; each round, after a barrier, the threads "
                "below the stride merge the pair a stride above into their own, and the stride halves from "
                "half the block down to 1; after a last barrier every thread reads slot 0, and waits once "
                "more before returning, so that no thread writes the slots while another still reads them",
                "where answers go wrong: sums added without rescaling, two empty pairs merged (minus infinity "
                "minus minus infinity is not a number), a max started from 0, only thread 0 reading the "
                "result, a barrier inside the test that picks a round's threads, a first stride written as a "
                "number"),
    # float32 exp and sums of up to 32 terms against float64
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_chunk_stats,
    diagnoses=("empty_pairs_nan", "pair_dropped", "result_not_broadcast", "sums_not_rescaled", "max_from_zero"),
    solution=kv_cache.chunk_stats,
    forbidden=(kv_cache.chunk_stats_kernel, kv_cache.chunk_partial, kv_cache.chunk_partial_kernel,
               kv_cache.decode_kernel_v2, kv_cache.attend_chunk, kv_cache.online_step),
    limits=(NoUnwrittenReads(why="read only the slots of this round's pairs"),
            SharedLoadsPerThread(_stats_reads,
                                 why="the check calls it twice; a tree of pairs reads 4 slots a round for "
                                     "log2(KEYS_PER_CHUNK) rounds, two trees 2 a round each; one thread walking "
                                     "all the pairs goes past it"),
            # a pair tree waits at log2 n + 2 a call, a max tree then a sum tree at about 2 log2 n + 3:
            # past the limit at n 8 and 32
            MostBarriers(lambda case: 2 * (log2_chunk() + 4),
                         why="the check calls it twice, each call with room for one tree of log2(KEYS_PER_CHUNK) "
                             "rounds and 4 barriers more; a tree for the max then one for the sum waits at about "
                             "twice that: one tree whose slots hold (max, sum) pairs fits")),
))
