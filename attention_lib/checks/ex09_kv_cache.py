"""Notebook 09's exercises, with their typical mistakes named: the log-sum-exp merge of split-K
partials (warm-up) and a chunk's partial, run by every thread of the split-K kernel's block of one chunk
and one query head (main), below."""

import math
import re
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib.measure import sanitizer
from attention_lib.stages import kv_cache
from attention_lib.checks import shapes
from attention_lib.checks.engine import Exercise, register
from attention_lib.platform.rebuild import rebuilt
from attention_lib.checks.launch import output_array, RaceFound, read_output, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import (Coalesced, MostBarriers, MostLoads, NoSerialCopy, NoUnwrittenReads,
                                         SharedLoadsPerThread)


# --- Warm-up: the log-sum-exp merge of split-K partials, as a kernel --------------------------
# The answer has decode_merge_kernel's signature ``(lse_part, o_part, out, lse)``: lse_part
# (n_head, n_chunks) and o_part (n_head, n_chunks, d_v) float32 are each chunk's log-sum-exp
# LSE_c = m_c + log l_c and its normalised output o_c = acc_c / l_c; it writes out (n_head, d_v) =
# sum_c exp(LSE_c - LSE) o_c and lse (n_head,) = LSE = log sum_c exp(LSE_c), both computed from the
# weights exp(LSE_c - M), M = max_c LSE_c. It is launched as decode_merge_kernel is: a 2-D grid over
# (component e, head h), kv_cache.MERGE_BLOCK threads to a block. A chunk whose keys were all
# masked has LSE_c = -inf and o_c = 0. Besides the engine's diagnoses:
#
# - ``unstable_softmax``: exp of the raw LSE_c, which overflows once an LSE passes 88.7;
# - ``max_not_largest``: inf or NaN where a head's LSEs spread past 88 or one is -inf: M was not the
#   largest LSE_c (the first chunk's, say), so some exp(LSE_c - M) overflows;
# - ``merge_unweighted``: the chunks' outputs averaged (or summed) with equal weights;
# - ``weights_not_normalised``: sum_c exp(LSE_c - M) o_c, without dividing by sum_c exp(LSE_c - M);
# - ``weights_from_rounded_lse``: right to about 1e-4 but not 1e-5 at LSEs near +-1000: the weights
#   exp(LSE_c - LSE) of a float32 LSE (a step of 6e-5 near 1000), which then do not sum to 1;
# - ``lse_is_max``: the merged lse written as M alone, without + log sum_c exp(LSE_c - M);
# - ``lse_without_max``: the outputs right, the merged lse written as log sum_c exp(LSE_c - M), without M.

class LseCase(NamedTuple):
    """One size tried: n_head heads of n_chunks partials with d_v components; LSEs of order 3
    ("normal"), around +-1000 ("large"), with each head's last chunk masked ("masked") or its first
    ("first masked"), or spread over -60 .. 60, the first chunk's the lowest ("spread"), or the last
    chunk's 800, the others' within -60 .. 0 ("last high": a max that misses the last chunk overflows)."""

    n_head: int
    n_chunks: int
    d_v: int
    kind: str

    def __str__(self):
        return f"(n_head {self.n_head}, n_chunks {self.n_chunks}, d_v {self.d_v}, {self.kind} LSEs)"


LSE_CASES = [LseCase(1, 1, 1, "normal"), LseCase(3, 5, 7, "normal"), LseCase(5, 3, 19, "large"),
             LseCase(2, 4, 33, "masked"), LseCase(3, 4, 5, "first masked"), LseCase(2, 5, 9, "spread"),
             LseCase(3, 4, 6, "last high")]


def _lse_partials(n_head, n_chunks, d_v, kind, rng):
    """Random (lse_part, o_part), float32: LSEs of order 3, or of order +-1000, or one chunk masked."""
    lse = 3.0 * rng.standard_normal((n_head, n_chunks))
    if kind == "large":                  # heads alternately around +1000 and -1000
        lse += np.where(np.arange(n_head)[:, None] % 2 == 0, 1000.0, -1000.0)
    if kind == "spread":                 # past exp's float32 range apart, the first chunk's the lowest
        lse = np.sort(rng.uniform(-60.0, 60.0, (n_head, n_chunks)), axis=1)
        lse[:, 0], lse[:, -1] = -60.0, 60.0
    if kind == "last high":              # the last chunk's LSE 800 above the others' (past exp's float64 range)
        lse = rng.uniform(-60.0, 0.0, (n_head, n_chunks))
        lse[:, -1] = 800.0
    o = rng.standard_normal((n_head, n_chunks, d_v))
    if kind in ("masked", "first masked"):  # the last (first) chunk of every head saw only masked keys
        column = -1 if kind == "masked" else 0
        lse[:, column], o[:, column] = -np.inf, 0.0
    return lse.astype(np.float32), o.astype(np.float32)


def _run_lse_merge(kernel, case, rng, launch):
    n_head, n_chunks, d_v, kind = case
    lse_part, o_part = _lse_partials(n_head, n_chunks, d_v, kind, rng)
    want_out, want_lse = kv_cache.merge_partials(lse_part, o_part)
    expected = np.concatenate([want_out, want_lse[:, None]], axis=1)   # column d_v: the merged lse
    full_out, d_out = output_array((n_head, d_v), guard=d_v * kv_cache.MERGE_BLOCK[1])
    full_lse, d_lse = output_array(n_head, guard=kv_cache.MERGE_BLOCK[1])
    (_, _), (grid, block) = kv_cache.decode_grid(n_head, d_v, 1, 2)
    try:
        launch(kernel, grid, block, cuda.to_device(lse_part), cuda.to_device(o_part), d_out, d_lse)
    except (OverflowError, ZeroDivisionError, FloatingPointError, ValueError):
        # The simulator's math.exp raises on overflow, and math.log(0) (a sum that underflowed)
        # raises ValueError; a GPU returns inf, NaN or -inf instead.
        if kind not in ("large", "spread", "last high"):
            raise                        # not the overflow this case tests: the engine reports it
        return np.full(expected.shape, np.inf), expected, lse_part, o_part, kind
    got = np.concatenate([read_output(full_out, d_out), read_output(full_lse, d_lse)[:, None]], axis=1)
    return got, expected, lse_part, o_part, kind


def _diagnose_lse_merge(got, expected, lse_part, o_part, kind):
    close = dict(rtol=1e-5, atol=1e-5)
    out, lse = got[:, :-1], got[:, -1]
    lse64 = lse_part.astype(np.float64)
    m = lse64.max(axis=1, keepdims=True)
    broken = not np.isfinite(got[np.isfinite(expected)]).all()
    if broken and kind in ("masked", "first masked", "spread", "last high"):
        return "max_not_largest", ("inf or NaN where a head's chunk LSEs lie far apart (past 88, or -inf for a chunk "
                                   "whose keys were all masked): exp(LSE_c - M) overflows float32 unless M is the "
                                   "largest LSE_c of the head, which makes every weight at most 1")
    if broken and np.abs(lse64[np.isfinite(lse64)]).max() > 100:
        return "unstable_softmax", ("inf or NaN with chunk LSEs around +-1000: exp(LSE_c) overflows float32 "
                                    "above 88.7; subtract the largest LSE_c first, as the softmax subtracts its max")
    with np.errstate(invalid="ignore"):
        w = np.exp(lse64 - m)
    if np.allclose(out, expected[:, :-1], **close):
        if np.allclose(lse, m[:, 0], **close):
            return "lse_is_max", ("the outputs are right but lse is the largest LSE_c alone: the merged LSE is "
                                  "M + log of the sum of exp(LSE_c - M)")
        if np.allclose(lse, np.log(w.sum(axis=1)), **close):
            return "lse_without_max", ("the outputs are right but lse is log of the sum of exp(LSE_c - M), "
                                       "the log-sum-exp taken against M: add M back")
        return None
    if np.allclose(out, o_part.mean(axis=1), **close) or np.allclose(out, o_part.sum(axis=1), **close):
        return "merge_unweighted", ("every chunk's output got the same weight: chunk c counts in proportion to "
                                    "exp(LSE_c), its share of the softmax's denominator")
    if np.allclose(out, (w[..., None] * o_part).sum(axis=1), **close):
        return "weights_not_normalised", ("the weights exp(LSE_c - M) do not sum to 1: divide by their sum, "
                                          "exp(LSE - M)")
    if kind == "large" and np.allclose(got, expected, rtol=1e-3, atol=1e-3):
        step = float(np.spacing(np.float32(1000)))
        return "weights_from_rounded_lse", (
            f"right to about 1e-4 but not 1e-5 where the LSEs are near +-1000: there float32 holds a number to a "
            f"step of {step:.1e}, so exp(LSE_c - LSE) with LSE rounded carries that error into every weight and "
            "the weights no longer sum to 1; weigh by exp(LSE_c - M), whose exponent is exact, and divide by "
            "the weights' sum")
    return None


register(Exercise(
    exercise_id="09_lse_merge",
    kind="kernel",
    run=_run_lse_merge,
    # (n_head, n_chunks, d_v, kind): one of each; sizes that are no multiple of the (16, 4)
    # block; chunk LSEs around +-1000 (overflow without the max, lost precision with a
    # rounded LSE); the last chunk's LSE -inf; the first chunk's -inf; LSEs 120 apart, the first
    # the lowest (overflow with an M that is not the largest); the last chunk's LSE 800 above the
    # others (overflow with a max that misses the last chunk).
    cases=LSE_CASES,
    hint=("each thread owns one output component of one head: it looks at every chunk's LSE, weighs chunk c "
          "by its share of the softmax's denominator, and adds up"),
    more_hints=("the plan: for thread (e, h) inside the output, a first pass over the head's chunks finds M, "
                "the largest LSE; a second adds up the weights, exp of LSE minus M, and the weighted components "
                "of the chunks' outputs; the component is the weighted sum divided by the sum of the weights, and "
                "the thread of component 0 also writes M plus the log of that sum",
                "where answers go wrong: exp of an LSE as it is (it can be 1000), an M that is not the largest (the "
                "first chunk's may be minus infinity, the last chunk's may be the largest), weights taken against "
                "a rounded total, threads outside the output that still write"),
    # float32 exp and sums of a few terms against float64: errors around 1e-7 on outputs of order 1,
    # and the float32 rounding of an lse near 1000 (6e-5) is inside rtol.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_lse_merge,
    diagnoses=("unstable_softmax", "max_not_largest", "merge_unweighted", "weights_not_normalised",
               "weights_from_rounded_lse", "lse_is_max", "lse_without_max"),
    # One thread per output component: a head's components written by one thread in a loop are refused.
    limits=(NoSerialCopy("out", access="store"),),
    solution=kv_cache.decode_merge_kernel,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v2),
))


# --- Main, part 1: the chunk's (m, l) by one tree of pairs -----------------------------------
# The answer has chunk_stats's signature ``(s, m_s, l_s)``: every thread of a block of KEYS_PER_CHUNK
# calls it with its score s (-inf for a thread without a position) and two (KEYS_PER_CHUNK,) shared
# float32 scratch arrays; it returns (m, l) to every thread, m the block's largest score and l the sum
# of exp(s - m), and every thread may write the scratch again once it returns. The check runs
# kv_cache.chunk_stats_kernel with the answer in chunk_stats's place, every launch traced, at the
# simulator's KEYS_PER_CHUNK (8) and a GPU's (32), on blocks whose n_keys is full, one short, half and
# 1 (runs of empty threads: two empty pairs merge), with scores all below -760, random, and spread past
# exp's range (the first the lowest); the kernel calls the answer, has every thread write its own slot
# of both arrays at once (as a caller may: a late read of the result races with it), and calls it again.
# Limits, for the two calls: shared reads per thread within 2 (4 log2 n + 4) (a pair tree reads 4
# slots a round; ``serial_reduction`` for one thread walking the n pairs), barriers within
# 2 (log2 n + 4) (a pair tree waits at log2 n + 2; a max tree then a sum tree at 2 log2 n + 3 or so,
# past it at n 8 and 32: ``extra_barriers``), no unwritten slot read. Named mistakes, besides the
# engine's:
#
# - ``sums_not_rescaled``: l the plain sum of the pairs' sums (each score counted as 1), or rescaled
#   to the wrong max;
# - ``empty_pairs_nan``: NaN where two threads without a position merge: exp(-inf - (-inf));
# - ``max_from_zero``: m = 0 where every score lies below 0 (the max started from 0);
# - ``result_not_broadcast``: thread 0 right, the others not.

class StatsCase(NamedTuple):
    """One size tried: two blocks of KEYS_PER_CHUNK threads, every thread of the first holding a score
    and the first n_keys of the second; scores "random" (N(0, 3)), "spread" (-700 .. 760, the first
    the lowest) or "low" (-800 .. -760)."""

    n_keys: int
    scores: str = "random"

    def filled(self):
        """Positions of each block, (KEYS_PER_CHUNK, n_keys)."""
        return (kv_cache.KEYS_PER_CHUNK, self.n_keys)

    def __str__(self):
        return f"(blocks of {kv_cache.KEYS_PER_CHUNK} and {self.n_keys} positions, {self.scores} scores)"


def _stats_cases(configuration):
    """Beside a full block of the configuration's chunk n (8 or 32), one of 3 positions with every score
    below -760 (first: a max started from 0 shows there); then one short, half plus one and 1, and 1
    and one short with scores spread past exp's range."""
    n = kv_cache.SHAPE_CONSTANTS["KEYS_PER_CHUNK"][0 if configuration == shapes.SIMULATOR else 1]
    return [StatsCase(3, "low"), StatsCase(n - 1), StatsCase(n // 2 + 1), StatsCase(1), StatsCase(1, "spread"),
            StatsCase(n - 1, "spread")]


def _stats_kernel_around(answer, size):
    """chunk_stats_kernel with the answer in chunk_stats's place (KEYS_PER_CHUNK = size when built)."""
    return rebuilt(kv_cache.chunk_stats_kernel, {"chunk_stats": answer, "KEYS_PER_CHUNK": size})


def _stats_scores(case, rng):
    """(blocks, KEYS_PER_CHUNK) float32 scores, exact integers where they lie past exp's range."""
    n = kv_cache.KEYS_PER_CHUNK
    blocks = len(case.filled())
    if case.scores == "random":
        return (3.0 * rng.standard_normal((blocks, n))).astype(np.float32)
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
    except _FLOAT_ERRORS:
        # The simulator's math.exp raises past float64's range; a GPU's float32 exp returns inf.
        if case.scores == "random":
            raise
        return np.full(expected.shape, np.nan), expected, scores, n_keys
    got = np.stack([read_output(full_m, m_out), read_output(full_l, l_out)], axis=-1)
    return got, expected, scores, n_keys


def _diagnose_chunk_stats(got, expected, scores, n_keys):
    close = dict(rtol=1e-5, atol=1e-5)
    with np.errstate(all="ignore"):
        broken = np.isnan(got).any(axis=(1, 2))                       # per block
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


def _stats_reads(case):
    """Two calls of 4 slots a round (both pairs), log2 n rounds, the result's 2 and 2 to spare each;
    n = KEYS_PER_CHUNK."""
    return 2 * (4 * _log2_chunk() + 4)


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
    diagnoses=("empty_pairs_nan", "result_not_broadcast", "sums_not_rescaled", "max_from_zero"),
    solution=kv_cache.chunk_stats,
    forbidden=(kv_cache.chunk_stats_kernel, kv_cache.chunk_partial, kv_cache.chunk_partial_kernel,
               kv_cache.decode_kernel_v2, kv_cache.attend_chunk, kv_cache.online_step),
    limits=(NoUnwrittenReads(why="read only the slots of this round's pairs"),
            SharedLoadsPerThread(_stats_reads,
                                 why="the check calls it twice; a tree of pairs reads 4 slots a round for "
                                     "log2(KEYS_PER_CHUNK) rounds, two trees 2 a round each; one thread walking "
                                     "all the pairs goes past it"),
            MostBarriers(lambda case: 2 * (_log2_chunk() + 4),
                         why="the check calls it twice, each call with room for one tree of log2(KEYS_PER_CHUNK) "
                             "rounds and 4 barriers more; a tree for the max then one for the sum waits at about "
                             "twice that: one tree whose slots hold (max, sum) pairs fits")),
))


# --- Main: a chunk's partial, a block per (chunk, query head) --------------------------------
# The answer has chunk_partial's signature ``(q, k_cache, v_cache, h, g, c, n_keys, scale, lse_part,
# o_part, tile, a_s, b_s)``: every thread of block (c, h) of chunk_partial_kernel calls it once
# (kv_cache.chunk_grid: (n_chunks, n_head) blocks of KEYS_PER_CHUNK threads), with g = h's kv head,
# n_keys the chunk's filled positions and three shared scratch arrays; it loads the chunk, scores it,
# reduces, weighs and writes lse_part[h, c] = m + log l and o_part[h, c, :] = sum_t exp(s_t - m) v_t
# / l, placing its own barriers (part 1's chunk_stats, the student's own, may give it m and l).
# The check runs chunk_partial_kernel with the answer in chunk_partial's place, every launch traced,
# at the simulator's KEYS_PER_CHUNK (8) and a GPU's (32), on chunks one short, exact and one past,
# heads of 64 and 128, grouped heads, scores spread past exp's range inside a chunk, all below -760,
# and a last chunk 90 above the others; unfilled cache slots hold NaN. Limits (per launch): each
# cached number read at most once per query head of its kv head (``no_reuse``); at a GPU's launch (a
# block one warp), a warp's load of k_cache and v_cache and its store of o_part at most 2 segments of
# 128 bytes (``uncoalesced``), with its lanes side by side (``serial_copy``); no shared slot read that
# no thread wrote (``stale_tile``); shared reads per thread within d_k + n ceil(d_k / n) + 5 log2 n
# + 4, n = KEYS_PER_CHUNK (``serial_reduction``: the max or the sum walked over all n scores by one
# thread, or by every thread; ``values_staged`` where the values went through the tile too, each
# read from shared memory though it serves one thread once); barriers within 2 log2 n + 7 (``extra_barriers``: part 1's limit, one
# after the staging and one after the weights). Named mistakes,
# besides the engine's:
#
# - ``m_is_first_score``: inf or NaN once a chunk's largest score lies past 88 above its first,
#   while right when the largest comes first: m was the first score (or a max over part of the chunk);
# - ``m_is_own_score``: right when every score is equal, inf or NaN when one thread's score lies far
#   below the max: each thread took its own score (not the chunk's max) as m;
# - ``unstable_softmax``: inf or NaN even when every score is 760: exp of a score without m subtracted;
# - ``max_from_zero``: NaN when every score lies below -760: the max started from 0, so every
#   exp(s - m) underflowed to 0 and l = 0;
# - ``partial_chunk``: right in every full chunk, wrong in the last, short one (its missing positions
#   counted: a score of 0 in the sum, or in the max);
# - ``output_not_normalised``, ``lse_is_max``, ``lse_without_max``, ``missing_scale``;
# - ``blocks_overwrite_partials`` / ``threads_overwrite_partials``: two blocks (c or h not used),
#   or two threads of a block (every thread writing lse_part), wrote the same partial;
# - ``components_not_strided``: output components KEYS_PER_CHUNK and up never written.

class ChunkCase(NamedTuple):
    """One size tried: n_head query heads on n_kv_head kv heads of width d_k, `length` positions
    filled; scores random, or "spread" (-700 .. 760 inside each chunk, its first position the
    lowest), "low" (-800 .. -760) or "last high" (the last chunk's 90 .. 100, the others' -50 .. 0),
    exact integers."""

    n_head: int
    n_kv_head: int
    d_k: int
    length: int
    scores: str = "random"

    def __str__(self):
        kind = "" if self.scores == "random" else f", {self.scores} scores"
        return f"(n_head {self.n_head}, n_kv_head {self.n_kv_head}, d_k {self.d_k}, length {self.length}{kind})"


def _chunk_reference(q, keys, values, length, scale, score_padding=None):
    """(n_head, n_chunks, d_k + 1) float64: o_c then LSE_c of every (query head, chunk), chunk c
    holding positions c * KEYS_PER_CHUNK .. of kv head h // group, cut at `length`; with
    score_padding, the missing positions of the last chunk counted with that score and no value."""
    n_head, d_k = q.shape
    group, size = n_head // keys.shape[0], kv_cache.KEYS_PER_CHUNK
    chunks = kv_cache.n_chunks(length)
    out = np.zeros((n_head, chunks, d_k + 1))
    for h in range(n_head):
        for c in range(chunks):
            span = slice(c * size, min((c + 1) * size, length))
            s = keys[h // group, span].astype(np.float64) @ q[h].astype(np.float64) * float(scale)
            padded = np.concatenate([s, np.full(size - len(s), score_padding)]) if score_padding is not None else s
            p = np.exp(padded - padded.max())
            out[h, c, :d_k] = p[:len(s)] @ values[h // group, span].astype(np.float64) / p.sum()
            out[h, c, d_k] = padded.max() + np.log(p.sum())
    return out


def _integer_scores(kind, length, rng):
    """The scores of one kv head's `length` positions, exact integers, as ChunkCase describes."""
    size = kv_cache.KEYS_PER_CHUNK
    if kind == "low":
        return rng.integers(-800, -759, length)
    if kind == "last high":
        last = (kv_cache.n_chunks(length) - 1) * size
        return np.concatenate([rng.integers(-50, 1, last), rng.integers(90, 101, length - last)])
    scores = rng.integers(-700, 761, length)             # spread: in each chunk the first the lowest,
    for start in range(0, length, size):                 # the middle one the largest
        filled = min(size, length - start)
        scores[start], scores[start + filled // 2] = -700, 760
    return scores


def _chunk_inputs(case, rng):
    """(q, keys, values, scale) of a case, float32; unfilled cache slots NaN. Integer scores: q = 8
    times the first unit vector and scale 1/8, so that s_t is the key's first component, exactly."""
    n_head, n_kv_head, d_k, length, kind = case
    keys = np.full((n_kv_head, length + 2, d_k), np.nan, np.float32)     # unfilled slots: NaN
    values = keys.copy()
    keys[:, :length], values[:, :length] = rng.standard_normal((2, n_kv_head, length, d_k))
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(d_k))
    if kind != "random":
        q[:] = 0.0
        q[:, 0], scale = 8.0, np.float32(0.125)
        for g in range(n_kv_head):
            keys[g, :length, 0] = _integer_scores(kind, length, rng)
    return q, keys, values, scale


def _kernel_around(answer, size):
    """chunk_partial_kernel with the answer in chunk_partial's place, its names those of the kv_cache
    module when built (KEYS_PER_CHUNK = size, TILE_SHAPE: the configuration's)."""
    return rebuilt(kv_cache.chunk_partial_kernel, {"chunk_partial": answer, "KEYS_PER_CHUNK": size})


def _partials(kernel, q, keys, values, length, scale, launch):
    """The kernel's (n_head, n_chunks, d_k + 1) output, o_c then LSE_c, launched on chunk_grid."""
    n_head, d_k = q.shape
    chunks, size = kv_cache.n_chunks(length), kv_cache.KEYS_PER_CHUNK
    full_lse, lse_part = output_array((n_head, chunks), guard=size)
    full_o, o_part = output_array((n_head, chunks, d_k), guard=size * d_k)
    grid, block = kv_cache.chunk_grid(n_head, length)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(keys), cuda.to_device(values), length, scale,
           lse_part, o_part)
    return np.concatenate([read_output(full_o, o_part), read_output(full_lse, lse_part)[..., None]], axis=2)


# What a GPU's float32 exp or log does where the simulator's Python math raises instead.
_FLOAT_ERRORS = (OverflowError, ZeroDivisionError, ValueError, FloatingPointError)


def _right_on(kernel, scores, launch):
    """Whether the kernel gets one chunk of one head right whose scores are `scores` (exact integers)."""
    size = kv_cache.KEYS_PER_CHUNK
    q = np.zeros((1, 16), np.float32)
    q[0, 0] = 8.0
    keys = np.zeros((1, size, 16), np.float32)
    keys[0, :, 0] = scores
    values = np.linspace(-1.0, 1.0, size * 16, dtype=np.float32).reshape(1, size, 16)
    expected = _chunk_reference(q, keys, values, size, np.float32(0.125))
    try:
        got = _partials(kernel, q, keys, values, size, np.float32(0.125), launch)
    except Exception:  # noqa: BLE001  (whatever the answer raises, this chunk is not right)
        return False
    return bool(np.allclose(got, expected, rtol=1e-5, atol=1e-5))


def _name_the_max(kernel, kind, launch):
    """Diagnosed for an answer wrong on a case of far-apart scores, from one chunk tried three
    more ways: the largest score first, every score 760, every score below -760."""
    size = kv_cache.KEYS_PER_CHUNK
    if kind == "spread":
        if not _right_on(kernel, np.full(size, 760), launch):
            raise Diagnosed("unstable_softmax", (
                "inf or NaN even when every score of the chunk is 760: exp(s) overflows float32 above 88.7; "
                "take every exponential against the chunk's max, exp(s - m)"))
        first_largest = np.where(np.arange(size) % 2 == 0, -700, 0)
        first_largest[0] = 760
        if _right_on(kernel, first_largest, launch):
            raise Diagnosed("m_is_first_score", (
                "inf or NaN where a chunk's largest score lies 1460 above its first, but right when the largest "
                "comes first: m was the chunk's first score (or a max over part of the chunk), so exp(s - m) "
                "overflowed; m must be the largest of all the chunk's scores"))
        raise Diagnosed("m_is_own_score", (
            "right when every score is equal, inf or NaN when the scores spread past 88: the threads did not "
            "share one m (each took its own score, say), so exp(s - m) overflowed in a thread whose m lay far "
            "below the chunk's max; reduce the scores to the chunk's max and give it to every thread"))
    if kind == "low":
        if not _right_on(kernel, np.arange(-800, -800 + size), launch):
            raise Diagnosed("max_from_zero", (
                "NaN where every score lies below -760: m came out 0, above every score, so every exp(s - m) "
                "underflowed to 0 and l = 0; start the max from -inf, not from 0"))
        raise Diagnosed("partial_chunk", (
            "NaN in the short last chunk where every score lies below -760, right in full chunks: a thread "
            "without a position gave the max a 0 (above every score), so l = 0; give it -inf instead"))


def _run_chunk_partial(answer, case, rng, launch):
    kernel = _kernel_around(answer, kv_cache.KEYS_PER_CHUNK)
    q, keys, values, scale = _chunk_inputs(case, rng)
    length = case.length
    expected = _chunk_reference(q, keys, values, length, scale)
    try:
        got = _partials(kernel, q, keys, values, length, scale, launch)
    except RaceFound as race:
        _name_overwritten_partials(str(race))
        raise
    except _FLOAT_ERRORS:
        # The simulator's math.exp raises past float64's range and math.log(0) raises; a GPU's float32
        # exp returns inf and its log of 0 gives -inf.
        if case.scores == "random":
            raise
        got = np.full(expected.shape, np.nan)
    if case.scores != "random" and not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        _name_the_max(kernel, case.scores, launch)
    never = unwritten(got)
    size, d_k = kv_cache.KEYS_PER_CHUNK, case.d_k
    if d_k > size and never[:, :, size:d_k].all() and not never[:, :, :size].any():
        raise Diagnosed("components_not_strided", (
            f"output components {size} .. {d_k - 1} were never written: a block has {size} threads for "
            f"{d_k} components, so a thread takes more than one"))
    return got, expected, q, keys, values, length, scale


def _name_overwritten_partials(race):
    """Diagnosed when the race is two writes of one partial (global lse_part or o_part), not a
    missing barrier around shared memory; nothing otherwise."""
    if "global 'lse_part'" not in race and "global 'o_part'" not in race:
        return
    blocks = set(re.findall(r"block (\([^)]*\))", race))
    element = "".join(re.search(r"'(\w+)'(\[[^]]*\])", race).groups())      # lse_part[0, 0]
    if len(blocks) > 1:
        raise Diagnosed("blocks_overwrite_partials", (
            f"{element} was written by two blocks, {' and '.join(sorted(blocks))}: the block of chunk c and "
            "query head h writes lse_part[h, c] and o_part[h, c, :] only"))
    raise Diagnosed("threads_overwrite_partials", (
        f"{element} was written by two threads of one block: each partial needs one writer (one thread "
        "for lse_part, one per component of o_part)"))


def _chunk_max(q, keys, length, scale, h, c):
    """The largest scaled score of query head h in chunk c (the right chunk and kv head)."""
    size, group = kv_cache.KEYS_PER_CHUNK, q.shape[0] // keys.shape[0]
    span = slice(c * size, min((c + 1) * size, length))
    return float((keys[h // group, span].astype(np.float64) @ q[h].astype(np.float64) * float(scale)).max())


def _diagnose_chunk_partial(got, expected, q, keys, values, length, scale):
    close = dict(rtol=1e-4, atol=1e-4)
    d_k, size = q.shape[1], kv_cache.KEYS_PER_CHUNK
    o, lse = expected[..., :d_k], expected[..., d_k]
    with np.errstate(all="ignore"):
        if np.allclose(got[..., d_k], lse, **close):
            # lse right: l = exp(lse - m) is known only through the output's normalisation
            ratio = got[..., :d_k] / np.where(o == 0, 1, o)
            constant = np.isfinite(ratio).all() and np.allclose(ratio, ratio[..., :1], **close)
            if constant and not np.allclose(ratio, 1, **close):
                return "output_not_normalised", ("o_part is sum_t exp(s_t - m) v_t: divide it by l, the sum of "
                                                 "the weights, so that each chunk hands over its own softmax's output")
        if np.allclose(got[..., :d_k], o, **close):
            m = np.array([[_chunk_max(q, keys, length, scale, h, c) for c in range(expected.shape[1])]
                          for h in range(q.shape[0])])
            if np.allclose(got[..., d_k], m, **close):
                return "lse_is_max", "lse_part holds m, the chunk's largest score: the log-sum-exp is m + log l"
            if np.allclose(got[..., d_k], lse - m, **close):
                return "lse_without_max", "lse_part holds log l: the weights were taken against m, so add m back"
        if np.allclose(got, _chunk_reference(q, keys, values, length, np.float32(1.0)), **close):
            return "missing_scale", "the scores were not multiplied by scale = 1/sqrt(d_k)"
        full = np.arange(expected.shape[1]) < length // size                 # the chunks holding size positions
        if full.any() and not full.all() and np.allclose(got[:, full], expected[:, full], **close):
            return "partial_chunk", (f"right in every full chunk, wrong in the last one, which holds only "
                                     f"{length % size} of its {size} positions: score, reduce and weigh those "
                                     "only (a thread without a position adds nothing to the max or the sum)")
    return None


def _chunk_cases(configuration):
    """Sizes around the configuration's chunk n (KEYS_PER_CHUNK, 8 or 32): 2 query heads on 1 kv
    head, narrower than the block, over 3 chunks, the last short; one exact chunk at d_k 64; one
    short of a chunk, multi-query, d_k 64; one past a chunk, multi-query, d_k 128; a single position;
    two chunks whose scores spread past exp's range; all scores low, the last chunk short; the last
    chunk's scores 90 above the others'."""
    n = kv_cache.SHAPE_CONSTANTS["KEYS_PER_CHUNK"][0 if configuration == shapes.SIMULATOR else 1]
    return [ChunkCase(2, 1, n // 2 + 1, 2 * n + 3), ChunkCase(2, 2, 64, n), ChunkCase(2, 1, 64, n - 1),
            ChunkCase(2, 1, 128, n + 1), ChunkCase(3, 3, 24, 1), ChunkCase(2, 1, 16, 2 * n, "spread"),
            ChunkCase(2, 2, 16, n + 3, "low"), ChunkCase(1, 1, 16, n + 5, "last high")]


class _InWholeWarps:
    """A limit on what a warp does, measured where a block is a whole warp (a GPU's launch): at the
    simulator's, a warp of 32 threads spans 4 blocks of 8, each in a chunk of its own and some short,
    so neither its segments nor its lanes side by side say anything about one block."""

    def __init__(self, limit):
        self.limit, self.code = limit, limit.code

    def broken(self, traces, case, compiled):
        return self.limit.broken(traces, case, compiled) if kv_cache.KEYS_PER_CHUNK >= 32 else None


def _group(case):
    return case.n_head // case.n_kv_head


def _values_staged(traces):
    """Whether a block wrote more of the tile than one row of d_k + 1 a position it wrote (the values
    copied in beside or over the keys) and a thread read the tile in two rows or more."""
    for traced in traces:
        target = traced.launch.targets.get("tile")
        if target is None:
            continue
        width = target.shape[1]
        writes, rows, read_rows = {}, {}, {}
        for element, kind, (block, thread), *_ in target.trace:
            if kind == sanitizer.LOAD:
                read_rows.setdefault((block, thread), set()).add(element // width)
            else:
                writes[block] = writes.get(block, 0) + 1
                rows.setdefault(block, set()).add(element // width)
        d_k = traced.launch.targets["q"].shape[1]
        staged_twice = any(writes[b] > len(rows[b]) * (d_k + 1) for b in writes)
        if staged_twice and any(len(seen) > 1 for seen in read_rows.values()):
            return True
    return False


class _SharedReadsNamed:
    """The shared-read limit, named ``values_staged`` where the values went through the tile (a read of
    each from shared memory on top of the weights'), ``serial_reduction`` otherwise."""

    def __init__(self, limit):
        self.limit, self.code = limit, limit.code

    def broken(self, traces, case, compiled):
        self.code = self.limit.code
        message = self.limit.broken(traces, case, compiled)
        if message is None or not _values_staged(traces):
            return message
        self.code = "values_staged"
        reads = max(t.shared_loads_per_thread() for t in traces)
        return (f"the values are right, but one thread read shared memory {reads} times, where the limit is "
                f"{_shared_reads(case)}: the values went through the tile, yet each value serves one thread "
                f"once (the one that owns its component), so read V from the cache straight, and keep only "
                f"the keys and the weights in shared memory")


def _log2_chunk():
    return int(math.log2(kv_cache.KEYS_PER_CHUNK))


def _shared_reads(case):
    """A key's row (d_k), one weight a position for each component a thread owns (n ceil(d_k / n)),
    two trees of log2 n rounds (2 reads a round in one, 3 in the other) and 4 more; n = KEYS_PER_CHUNK.
    A max or a sum walked over the chunk's scores adds n - 4 or more at a GPU's launch (n = 32)."""
    n = kv_cache.KEYS_PER_CHUNK
    return case.d_k + n * math.ceil(case.d_k / n) + 5 * _log2_chunk() + 4


register(Exercise(
    exercise_id="09_chunk_partial",
    kind="device function",
    both_shapes=True,
    run=_run_chunk_partial,
    cases=_chunk_cases,
    hint=("every score of the chunk is needed by every output component, so the block computes each score "
          "once and shares it; part 1 gives every thread the chunk's max and sum, and each weight is then "
          "one exponential, shared in turn"),
    more_hints=("the plan: the block first copies the chunk's keys into shared memory, its threads side by "
                "side along the cache; after a barrier each thread scores one position, and a thread without "
                "one holds minus infinity; part 1 gives every thread m and l, each thread turns its score into "
                "a weight and keeps it in shared memory, and after a barrier each thread owns some output "
                "components, walks the positions reading each value straight from the cache, and one thread "
                "writes the log-sum-exp; the limits count that plan: a barrier after the staging, those of "
                "part 1, and one after the weights; a thread's shared reads are its key's row, one weight a "
                "position for each component it owns, and those of part 1",
                "where answers go wrong: m taken from the first score or from the thread's own score (right "
                "until scores spread past 88), a max started from 0 (every weight underflows when all scores "
                "lie below -104), a barrier inside a test on the thread index, a short last chunk whose missing "
                "positions join the max or the sum, weights read before every thread has written its own, a "
                "loop over all scores in one thread (the serial limit), the values staged in shared memory "
                "like the keys though each serves one thread once, a component loop that stops at the "
                "block's size"),
    # float32 sums of up to KEYS_PER_CHUNK terms and dot products of up to 128 against float64
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_chunk_partial,
    diagnoses=("m_is_first_score", "m_is_own_score", "unstable_softmax", "max_from_zero", "partial_chunk",
               "output_not_normalised", "lse_is_max", "lse_without_max", "missing_scale",
               "blocks_overwrite_partials", "threads_overwrite_partials", "components_not_strided",
               "values_staged"),
    solution=kv_cache.chunk_partial,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v1, kv_cache.decode_kernel_v2, kv_cache.attend_chunk,
               kv_cache.weighted_value, kv_cache.stage_tile, kv_cache.attend_tile, kv_cache.online_step,
               kv_cache.chunk_partial_kernel, kv_cache.chunk_partials_device, kv_cache.decode_merge_kernel),
    limits=(MostLoads("k_cache", _group, why="each query head reads its chunk of the cache once"),
            MostLoads("v_cache", _group, why="each query head reads its chunk of the cache once"),
            *(_InWholeWarps(limit) for limit in (Coalesced("k_cache", 2), Coalesced("v_cache", 2),
                                                 Coalesced("o_part", 2, access="store"),
                                                 NoSerialCopy("k_cache"), NoSerialCopy("v_cache"))),
            NoUnwrittenReads(why="read only the rows of the chunk's filled positions"),
            _SharedReadsNamed(SharedLoadsPerThread(
                _shared_reads, why="the limit is a key's row, one weight a position for each component a thread "
                                   "owns, and two trees of log2(KEYS_PER_CHUNK) rounds; a max or a sum walked "
                                   "over all the chunk's scores by one thread (or by each) goes past it")),
            MostBarriers(lambda case: 2 * _log2_chunk() + 7,
                         why="room for reductions of log2(KEYS_PER_CHUNK) rounds and a few barriers around them; "
                             "the second hint counts them")),
))
