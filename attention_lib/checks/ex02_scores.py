"""Notebook 02's exercises: the scaled scores, one thread per score, then tiled with K^T given.

``02_scaled_scores`` (warm-up): scores_kernel_v1's signature ``(q, k, inv_sqrt_dk, s)``,
launched on the library's grid. A wrong answer is compared with the usual wrong formulas:
``missing_scale`` (q k^T), ``scaled_by_d_k`` (q k^T / d_k: the scale applied twice, or d_k in
place of its root) and ``transposed``: either Q K instead of Q K^T (q[i] . k[:, j]), or q and k
swapped (S^T). Both stay in bounds only on a square case with T_q = T_k = d_k, which is why one
comes second, after the all-ones case. ``grid_axes_swapped``: the row taken from the grid's x,
so rows past the x extent of the grid are never written (and on a GPU neighbouring threads
would write a row apart).

``02_scores_kt`` (main): K arrives already transposed, kt (BH, d_k, T_k), as some KV caches
store it; the student writes scores_kt_kernel's whole body from its contract. Every case is
traced on the simulator (races, divergent barriers, and the engine's ``stale_tile`` for a slot
read before any write). On wrong values: ``edge_not_zeroed`` (a thread that writes a score read
a slot its block's latest fill did not write: an earlier step's value), ``missing_scale``,
``scale_applied_twice``. With right values: ``scale_not_folded`` (after FOLD_CASE, no shared
array holds q times the scale among the slots its block wrote), then the declared limits:
``no_reuse`` (an element of q read more than ceil(T_k / TILE) times, of kt more than
ceil(T_q / TILE)), ``uncoalesced`` (a warp's load of q or kt touching over 4 segments of 128
bytes on average at one line), ``extra_barriers`` (more than two barriers per step along
d_k: a step past its end).
"""

from collections import defaultdict

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform import where
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import scores
from attention_lib.checks.engine import (Diagnosed, Exercise, host_output, output_array, read_output, register,
                                         traced_launch, unwritten)
from attention_lib.checks.limits import Coalesced, MostBarriers, MostLoads


def _run_scores(kernel, case, rng, launch):
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    full, s = output_array((bh, t_q, t_k), guard=scores.TILE * scores.TILE)
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(k), scores.scale_factor(d_k), s)
    got, expected = read_output(full, s), reference.scores(q, k)
    _check_grid_axes(got, expected, grid)
    return got, expected, q, k


def _check_grid_axes(got, expected, grid):
    """grid_axes_swapped when exactly the scores a kernel with i from the grid's x and j from its y
    cannot reach were left unwritten, and the rest are right."""
    t_q, t_k = got.shape[-2:]
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    reached = (i < grid[0] * scores.TILE) & (j < grid[1] * scores.TILE)      # i from x, j from y
    never = unwritten(got)
    if reached.all() or not np.array_equal(never, np.broadcast_to(~reached, got.shape)):
        return
    if np.allclose(got[~never], expected[~never], rtol=1e-4, atol=1e-4):
        raise Diagnosed("grid_axes_swapped", (
            f"{int(never.sum())} scores were never written, exactly those whose row lies beyond the grid's x "
            "extent: the row i was taken from the grid's x axis. The grid's x runs over keys (the columns j), "
            "y over queries (the rows i); on a GPU such threads would also write addresses a row apart"))


def _warm_up_cases(configuration):
    """(BH, T_q, T_k, d_k): all ones first; then T_q = T_k = d_k = 7, where both transposes stay in
    bounds; T_q != T_k next; then a tile + 1 keys and two tiles + 1 queries in 3 heads: partly used
    blocks, and rows beyond the grid's x extent (two tiles + 1 rows, keys in two tiles)."""
    tile = scores.TILE
    return [(1, 1, 1, 1), (2, 7, 7, 7), (2, 7, 5, 5), (3, 2 * tile + 1, tile + 1, 24)]


def _diagnose(got, expected, q, k):
    """Name the mistake when `got` equals a known wrong formula; None otherwise."""
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    wrong = [("missing_scale", raw, f"the scores are q.k without the scale: multiply by inv_sqrt_dk "
                                    f"(= 1/sqrt({d_k}) here)")]
    wrong.append(("scaled_by_d_k", raw / d_k, (
        f"the scores came out divided by d_k = {d_k}, not by sqrt(d_k) = {np.sqrt(d_k):.3g}: either the scale "
        "was applied twice, or d_k was used in place of its square root; multiply by inv_sqrt_dk exactly once")))
    if k.shape[-2] == d_k:  # only then does k[h, c, j] stay in bounds
        wrong.append(("transposed", (q.astype(np.float64) @ k) / np.sqrt(d_k),
                      "the scores are Q K, not Q K^T: score (i, j) is the dot product of row i "
                      "of q with row j of k, both read along d_k"))
    if q.shape[-2] == k.shape[-2]:  # only then do swapped q and k stay in bounds
        wrong.append(("transposed", np.swapaxes(expected, -1, -2),
                      "the scores are transposed, S^T: q and k are swapped. Row i of s belongs to query "
                      "i (the grid's y), column j to key j (the grid's x)"))
    for code, candidate, message in wrong:
        if np.allclose(got, candidate, rtol=1e-4, atol=1e-4):
            return code, message
    return None


register(Exercise(
    exercise_id="02_scaled_scores",
    title="s[h, i, j] = (q[h, i] . k[h, j]) * inv_sqrt_dk, one thread per score",
    kind="kernel",
    run=_run_scores,
    cases=_warm_up_cases,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("one thread per score, one grid layer per head: the thread of row i and column j "
          "computes one dot product of length d_k and scales it"),
    more_hints=(
        "the plan: take the key (the column) from the grid's x, the query (the row) from its y and the head "
        "from the block's z; a thread whose score lies past an edge of s does nothing; the others sum the "
        "products of row i of q and row j of k along d_k (row j of K is column j of K^T, so both are read "
        "along their last axis), from a float32 zero, multiply the sum by the scale once and store it",
        "where answers go wrong: the grid's x axis is the column of s, the key; a sum begun from a plain "
        "Python 0.0 is float64 on a GPU; the scale is passed in, so no thread computes a square root"),
    # float32 sums of up to 24 products of standard normals, against float64: errors ~1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose,
    diagnoses=("missing_scale", "scaled_by_d_k", "transposed", "grid_axes_swapped"),
    solution=scores.scores_kernel_v1,
    forbidden=(scores.scores, scores.launch_scores, scores.tile_dot, scores.dot_qk_tiles),
))


# A warp of a 16 x 16 block is two rows of 16 threads; 16 neighbouring float32 are 64 bytes, which lie
# in at most 2 segments of 128 bytes: a coalesced load touches at most 4. One that walks down a column
# of rows over 128 bytes apart touches one segment per thread.
COALESCED_SEGMENTS = 4


# --- The main exercise: K^T given ----------------------------------------------------------

def _kt_cases(configuration):
    """(BH, T_q, T_k, d_k), from the tile: one score; FOLD_CASE, one block per head and one partial
    step along d_k (the tile of q then holds a head's whole q, where the fold is read); T_q a whole
    tile, T_k one past two, d_k one whole step (an extra step shows in the barriers); T_q one past
    a tile, T_k two whole tiles, d_k one past two steps (a last step of one column; rows of q and kt
    at least 128 bytes apart, so a load walking down a column touches a segment per thread)."""
    tile = scores.TILE
    return [(1, 1, 1, 1), FOLD_CASE, (1, tile, 2 * tile + 1, tile), (1, tile + 1, 2 * tile, 2 * tile + 1)]


FOLD_CASE = (2, 7, 9, 5)


def _run_scores_kt(kernel, case, rng, launch):
    """Every case traced: races, barriers and reads of unwritten slots (the engine), the tile of q
    after FOLD_CASE, and the limits (reads per element, segments per warp load, barriers)."""
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    kt = np.ascontiguousarray(np.swapaxes(k, 1, 2))                  # (BH, d_k, T_k)
    grid, block = scores.score_grid(bh, t_q, t_k)
    inv_sqrt_dk = scores.scale_factor(d_k)
    expected = reference.scores(q, k)
    got = host_output((bh, t_q, t_k))
    traced = traced_launch(kernel, grid, block, q, kt, inv_sqrt_dk, got)
    reused = traced.loads("q").max(initial=0) <= ceil_div(t_k, scores.TILE)    # else no_reuse says it
    if case == FOLD_CASE and reused and np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        _check_fold(traced, q, inv_sqrt_dk)
    return got, expected, q, k, traced


def _written_by_the_last_block(traced):
    """{shared array: (block, values)}: the slots the launch's last block wrote to each of its shared
    arrays, with what they hold after it (blocks run one after another; a slot no thread wrote holds
    garbage, so it is left out)."""
    found = {}
    for name in traced.arrays(sanitizer.SHARED):
        stores = [(who[0], element) for element, kind, who, *_ in traced.launch.targets[name].trace
                  if kind == sanitizer.STORE]
        if not stores:
            continue
        last = stores[-1][0]
        slots = sorted({element for blk, element in stores if blk == last})
        contents = next(view for view in traced.launch._shared.values() if view._target.name == name)
        found[name] = last, np.array(contents._ary).ravel()[slots]
    return found


def _holds_all(values, wanted):
    """Whether every number of `wanted` stands among `values` (float32 rounding allowed)."""
    return bool(np.isclose(values[None, :], wanted.ravel()[:, None], rtol=1e-6, atol=0).any(axis=1).all())


def _check_fold(traced, q, inv_sqrt_dk):
    """scale_not_folded when, after a case of one block per head and one step along d_k, no shared
    array holds the last block's head of q times the scale among the slots it wrote."""
    written = _written_by_the_last_block(traced)
    if any(_holds_all(values, q[blk[2]] * inv_sqrt_dk) for blk, values in written.values()):
        return
    unscaled = any(_holds_all(values, q[blk[2]]) for blk, values in written.values())
    raise Diagnosed("scale_not_folded", (
        "the values are right, but after this case (one block per head, one step along d_k) no shared array "
        "holds q's elements times inv_sqrt_dk among the slots its block wrote" +
        ("; one holds them unscaled" if unscaled else "") +
        ": the contract has the scale multiplied into the tile of q as it is copied, so the sum is the score"))


def _read_before_refill(traced, t_q, t_k):
    """The first read, by a thread that writes a score, of a shared slot its block did not write in
    the latest fill before the read (an earlier step's value), as a message; None if there is none."""
    tile = scores.TILE
    for name in traced.arrays(sanitizer.SHARED):
        target = traced.launch.targets[name]
        fills = defaultdict(lambda: defaultdict(set))        # block -> barrier interval -> slots stored
        for element, kind, (blk, _), interval, _, _ in target.trace:
            if kind == sanitizer.STORE:
                fills[blk][interval].add(element)
        for element, kind, (blk, thread), interval, site, _ in target.trace:
            owns_a_score = blk[1] * tile + thread[1] < t_q and blk[0] * tile + thread[0] < t_k
            if kind != sanitizer.LOAD or not owns_a_score:
                continue
            latest = max((n for n in fills[blk] if n <= interval), default=None)
            if latest is not None and element not in fills[blk][latest]:
                slot = [int(v) for v in np.unravel_index(element, target.shape)]
                return (f"thread {thread} of block {blk} read {name}{slot} at "
                        f"{where.describe_with_code(*site)}, a slot the block's latest fill did not write: it "
                        "still held an earlier step's value")
    return None


def _diagnose_kt(got, expected, q, k, traced):
    """edge_not_zeroed (a score summed a slot its step did not write), missing_scale (q.k) and
    scale_applied_twice (q.k / d_k); None for any other wrong value."""
    t_q, t_k = got.shape[-2:]
    stale = _read_before_refill(traced, t_q, t_k)
    if stale:
        return "edge_not_zeroed", (f"{stale}. Past an edge of q, kt or d_k every slot a score sums must still be "
                                   "written in that step, with a value that adds nothing")
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    if np.allclose(got, raw, rtol=1e-4, atol=1e-4):
        return "missing_scale", ("the scores are q.k without the scale: the contract has each element of q "
                                 "multiplied by inv_sqrt_dk as it is copied into its tile")
    if d_k > 1 and np.allclose(got, raw / d_k, rtol=1e-4, atol=1e-4):
        return "scale_applied_twice", (
            f"the scores came out divided by d_k = {d_k}: inv_sqrt_dk was applied twice (to both tiles, or on "
            "the load and again in the sum); the contract has it in the tile of q only")
    return None


def _barriers_why(case):
    """What 02_scores_kt's barrier limit counts, for one case."""
    steps = ceil_div(case[3], scores.TILE)
    return (f"{steps} step{'s' if steps > 1 else ''} of {scores.TILE} along d_k = {case[3]}, two barriers each; "
            "every barrier more makes the whole block wait once more")


register(Exercise(
    exercise_id="02_scores_kt",
    title="tiled scores with K given transposed, kt (BH, d_k, T_k): coalesced tiles, the scale folded in",
    kind="kernel",
    run=_run_scores_kt,
    cases=_kt_cases,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("a block needs only 16 rows of q and 16 columns of kt: copy them into shared memory a slice "
          "of d_k at a time, each element by one thread, and choose for each array which of its indices "
          "neighbouring threads (threadIdx.x) vary, so that a warp reads neighbouring addresses"),
    more_hints=(
        "the plan: step along d_k 16 columns at a time. Each thread copies one element of q, times the scale, "
        "into the tile of q with threadIdx.x along d_k (q's last axis), and one element of kt into the tile "
        "of kt with threadIdx.x along the keys (kt's last axis), so kt's tile keeps kt's own layout and needs "
        "no transposing; a slot past an edge of T_q, T_k or d_k gets a 0. Then a barrier, the 16 "
        "multiply-adds of the thread's row of one tile by its column of the other, and a second barrier "
        "before the next copy; after the last step, the guarded write of the sum",
        "where answers go wrong: every thread copies and reaches both barriers, also those whose score lies "
        "past the edge of s (only the final write is guarded); the loop makes exactly as many steps as d_k "
        "needs; the sum begins from a float32 zero"),
    rtol=1e-5,     # float32 sums of up to 33 products of standard normals, against float64
    atol=1e-5,
    diagnose=_diagnose_kt,
    diagnoses=("edge_not_zeroed", "missing_scale", "scale_applied_twice", "scale_not_folded"),
    limits=(MostLoads("q", lambda case: ceil_div(case[2], scores.TILE)),
            MostLoads("kt", lambda case: ceil_div(case[1], scores.TILE)),
            Coalesced("q", COALESCED_SEGMENTS), Coalesced("kt", COALESCED_SEGMENTS),
            MostBarriers(lambda case: 2 * ceil_div(case[3], scores.TILE), why=_barriers_why)),
    solution=scores.scores_kt_kernel,
    forbidden=(scores.scores_kt, scores.launch_scores, scores.tile_dot, scores.dot_qk_tiles),
))
