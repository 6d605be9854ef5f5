"""``04x_warp_softmax`` (deep dive 04x): a kernel with softmax_kernel_v3's signature ``(s, out)``, one warp
a row on v3's grid: each lane folds its columns into one (m, l) pair with ``merge_stats``, the warp
merges the pairs by shuffles, each lane writes its columns; its solution is ``softmax.softmax_kernel_v3``.
Its cases, limits and named mistakes are declared in the ``Exercise`` below; its scores, its launch and
the diagnoses it shares are notebook 04's (``ex04_row_softmax``).
"""

import math

import numpy as np

from attention_lib.stages import softmax
from attention_lib.stages.softmax import WARP_SIZE, strided_max, strided_sum_exp
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.limits import Coalesced, MostLoads, MostWarpCollectives, SharedLoadsPerThread
from attention_lib.checks.ex04_row_softmax import (BAND, STAGE, computed_nan, fully_masked, run_softmax,
                                                   unstable)


# A pair is two numbers (m and l), so one round of exchanges is two shuffles; log2(WARP_SIZE) = 5 rounds.
_ROUNDS = int(math.log2(WARP_SIZE))


def most_warp_collectives():
    """The warp collectives one lane may join: 3 a round (m's shuffle, l's, and a syncwarp if the
    design has one) for log2(WARP_SIZE) rounds, and one round more to hand the result out (a tree
    that leaves it in lane 0): 18. The butterfly joins 10; lane 0 taking in the 31 other pairs one
    by one joins 62 and more."""
    return 3 * (_ROUNDS + 1)


def most_shared_reads():
    """The shared reads one lane may make: two values a pair, each a tree's worth, 2 a round
    (its slot and the one a stride above) for log2(WARP_SIZE) rounds and one for the result: 24.
    The butterfly reads none; lane 0 reading the 31 other pairs from shared memory reads 62."""
    return 2 * (2 * _ROUNDS + 2)


def _run_warp_softmax(kernel, case, rng, launch):
    return run_softmax(kernel, case, rng, launch, version=3)


def _lane_pairs(s):
    """(rows, 32) m and l of each lane's columns lane, lane + 32, ..., float64."""
    padded = np.full((s.shape[0], -(-s.shape[1] // WARP_SIZE) * WARP_SIZE), -np.inf)
    padded[:, :s.shape[1]] = s
    per = padded.reshape(s.shape[0], -1, WARP_SIZE).transpose(0, 2, 1)     # (rows, lanes, columns each)
    m = per.max(axis=-1)
    shift = np.where(np.isneginf(m), 0.0, m)
    return m, np.exp(per - shift[..., None]).sum(axis=-1)


def _diagnose_warp(got, expected, s, error):
    named = unstable(got, s, error)
    large = np.abs(s[np.isfinite(s)]).max() > 100
    if named and error is None and large:
        high = s.max(axis=-1) > 0                                          # the rows around +1000
        if np.allclose(got[high], expected[high], rtol=1e-5, atol=1e-6) and np.isnan(got[~high]).all():
            return "wrong_neutral_value", (
                "rows around +1000 are right but rows around -1000 came out NaN: a lane's pair started "
                "from m = 0, which stays the max of negative scores, so exp(s - 0) underflows to 0; "
                "start from the pair that changes nothing, (-inf, 0)")
    named = named or fully_masked(got, s)
    if named:
        return named
    m_lane, l_lane = _lane_pairs(s.astype(np.float64))
    m = m_lane.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        unscaled = np.exp(s - m) / l_lane.sum(axis=-1, keepdims=True)    # the l's added as they are
    seen = ~np.isneginf(m[:, 0])
    if np.allclose(got[seen], unscaled[seen], rtol=1e-5, atol=1e-6):
        return "online_softmax_no_rescale", (
            "the lanes' sums were added as they are: each lane's l counts against its own maximum and "
            "must be rescaled by exp(m_lane - m) before it joins another; merge_stats does it")
    lane_0 = np.arange(s.shape[1]) % WARP_SIZE == 0
    right = np.isclose(got, expected, rtol=1e-5, atol=1e-6)
    if s.shape[1] > 1 and right[:, lane_0].all() and not right[:, ~lane_0].all():
        return "result_not_broadcast", (
            "lane 0's columns are right but other lanes' are not: the reduction left the row's pair in "
            "lane 0 alone (as shfl_down_sync does); a butterfly, where lane i trades with lane i ^ step, "
            "leaves it in every lane")
    return computed_nan(got, expected)


register(Exercise(
    exercise_id="04x_warp_softmax",
    kind="kernel",
    run=_run_warp_softmax,
    # (rows, T_k, kind): one score (lanes 1-31 hold nothing, three warps of the block have no
    # row); 3 rows of 7 negative scores; 6 rows of 4 warps + 7 columns (two blocks, the second
    # with two warps, each lane four or five columns: a lane that takes a chunk of the row reads
    # 5 or more segments a warp load); rows around +-1000; rows spanning about 1000; 33 causal rows
    # with one fully masked; rows whose first 32 columns are -inf (every lane's first pair masked).
    cases=[(1, 1, "normal"), (3, 7, "negative"), (6, 4 * WARP_SIZE + 7, "normal"), (6, 37, "large"),
           (5, 19, "spread"), (33, 33, "masked"), (5, WARP_SIZE + BAND, "left-masked")],
    limits=(MostLoads("s", 2, code="stats_not_in_one_pass", why=(
                "fold each score into the lane's (m, l) pair in one pass, then read it once more to write its "
                "weight (2 reads, where kernels 1 and 2 take 3)")),
            Coalesced("s", 2),
            SharedLoadsPerThread(lambda case: most_shared_reads(), why=(
                "two trees (m and l) over the warp's 32 slots read at most 2 log2(32) + 2 slots a lane each; a "
                "lane that reads the other 31 pairs one by one reads 62 and more")),
            MostWarpCollectives(lambda case: most_warp_collectives(), why=(
                f"{_ROUNDS} rounds of exchanges, two shuffles (m and l) and a syncwarp a round, and one round to "
                "hand the result out; a lane that takes in the other lanes' pairs one by one makes the warp wait "
                "31 times"))),
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("each lane folds its own columns into one (m, l) pair as it reads them; then five exchanges "
          "with the lane whose number differs in one bit give every lane the pair of the whole row"),
    more_hints=("where each step goes: the warp's number in the block and the block's number give the row, "
                "the thread's number modulo 32 the lane; a warp past the last row leaves whole; each lane "
                "starts from the pair that has seen nothing and walks the columns that start at its lane, "
                "32 apart (the 32 lanes read 32 neighbouring scores at each step), merging each score in; "
                "five exchanges (a butterfly), steps 16 down to 1, each merging the pair received; a fully masked "
                "row gets zeros, any other its weights, each lane its own columns",
                "where answers go wrong: a lane with no column that leaves before the exchanges (every "
                "lane the mask names must make every shuffle call); adding two sums without bringing "
                "them to the common maximum; an exchange that leaves the result in lane 0 alone; a lane "
                "that takes a contiguous chunk of the row, so a warp's load spreads over many segments; one "
                "lane taking in the 31 other pairs one by one, by shuffles or through shared memory, where "
                "five rounds merge them all"),
    # float32 exp and sums of up to 135 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose_warp,
    diagnoses=("unstable_softmax", "fully_masked_row", "wrong_neutral_value", "online_softmax_no_rescale",
               "result_not_broadcast", "stats_not_in_one_pass"),
    solution=softmax.softmax_kernel_v3,
    forbidden=STAGE + (strided_max, strided_sum_exp, softmax.block_reduce, softmax.block_max, softmax.block_sum),
))
