"""``11_dkdv_pass`` (notebook 11, main): a ``@cuda.jit(device=True)`` walk with ``backward.dkdv_walk``'s
contract, which every thread of block (x, h) of ``backward.dkdv_pass_kernel`` calls (the kernel loads each
key's k and v rows and stores its sums): it walks the query tiles that see the block's keys, copies each
tile's q, dO, lse and D into shared memory itself, and folds the queries that see its key into its dK and
dV sums, P rebuilt from the lse. The check compiles the kernel around it (``backward.pass_kernel_with``)
at the simulator's tiles and a GPU's and compares dK and dV with the NumPy backward. Its solution is
``backward.dkdv_walk``; its cases, limits and named mistakes are declared in the ``Exercise`` below.
"""

import math
from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks import shapes
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output, traced_launch
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriers, NoSerialCopy, RefilledTiles
from attention_lib.measure import sanitizer
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import backward, scores


class PassCase(NamedTuple):
    """One launch of a dK/dV kernel: BH heads of T_q queries (the last T_q positions) against T_k keys,
    widths d_k and d_v, causal; spread: integer scores up to 1200, one row's all below -90."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    d_v: int
    spread: bool = False

    def __str__(self):
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, d_v {self.d_v}"
                f"{', scores from -1200 to 1200' if self.spread else ''})")


def pass_cases(configuration):
    """The cases at a configuration's tiles (BLOCK_Q = BLOCK_K = t: 16 on the simulator, 32 on a GPU):
    two heads of t + 1 (a second, one-row tile both ways, where a slip of the head or the key block
    shows; block 1 starts past tile 0); queries the last t - 1 of t + 2 (offset 3: block 1's first
    query in tile 0); offset 1 over five key blocks, the last one key, and four whole query tiles
    (block 1's first query the last of tile 0, block 2's of tile 1; block 0 walks four tiles, so a walk
    capped at its first tile plus 2 or 3, or stopped a tile past the diagonal band, misses one; a walk
    one query too long steps into an empty fifth tile); more queries than keys (tile 0 sees no key, lse -inf); the model's d_k of 64 and
    MAX_D's 128 at small T; three queries whose last row's scores spread from 1200 (exp overflows) in
    one tile and whose row 1's are all below -90 (exp is 0). Narrow rows elsewhere: the simulator's
    time goes to the pairs' multiply-adds."""
    t = backward.SHAPE_CONSTANTS["BLOCK_Q"][0 if configuration == shapes.SIMULATOR else 1]
    return [PassCase(2, t + 1, t + 1, 2, 3), PassCase(1, t - 1, t + 2, 3, 2), PassCase(1, 4 * t, 4 * t + 1, 2, 1),
            PassCase(1, 2 * t + 1, t - 1, 4, 3), PassCase(1, 2, t + 1, 64, 64), PassCase(1, 2, 3, 128, 128),
            PassCase(1, 3, 3, 4, 3, spread=True)]


def _pass_inputs(case, rng):
    """q, k, v, d_out (float64). Spread: integer q and k (with d_k 4 the scale is 1/2, so every score is
    exact in float32); key 0 holds 300s and key 1 50s, the last query 2s (its score with key 0 is 1200,
    exp overflows) and query 1 -2s (its scores -1200 and -200, all below -90: exp is 0)."""
    q = rng.standard_normal((case.BH, case.T_q, case.d_k))
    k = rng.standard_normal((case.BH, case.T_k, case.d_k))
    if case.spread:
        q, k = np.round(q), np.round(100 * k)                  # scores of several hundred
        k[:, 0], k[:, 1], q[:, -1], q[:, 1] = 300.0, 50.0, 2.0, -2.0
    v = rng.standard_normal((case.BH, case.T_k, case.d_v))
    d_out = rng.standard_normal((case.BH, case.T_q, case.d_v))
    return q, k, v, d_out


UNSTABLE = ("exp of a raw score: on a GPU exp of a float32 past 88.7 is inf (and below -104 it is 0), so "
            "exp(S) / exp(lse) is inf / inf or 0 / 0, NaN; here the simulator raised {error} at a score "
            "of 1200 or -1200. Take the exponential of the difference, S - lse, which is never above 0")

# The arrays a step stages, by position in the kernel's signature, and what each holds.
STAGED = {0: "q", 3: "d_out", 4: "lse", 5: "d_rows"}


def _first_tile(j0, t_q, t_k, block_q):
    """The first query of the tile holding the first query that sees key j0 (causal, offset T_k - T_q)."""
    first = max(0, j0 - (t_k - t_q))
    return first - first % block_q


def _staged_loads(traced, case):
    """Diagnosed when a block read an element of a staged array twice (no_reuse), or a row of a query
    tile above its diagonal (tile_above_diagonal): each block of keys walks the tiles from the one
    holding the first query that sees its first key, and reads each of their elements once."""
    launch = traced.launch
    for position, role in STAGED.items():
        name = launch.params[position]
        target = launch.targets.get(name)
        if target is None:
            continue
        per_block = {}
        for element, kind, (block, _), *_ in target.trace:
            if kind == sanitizer.LOAD:
                counts = per_block.setdefault(block, {})
                counts[element] = counts.get(element, 0) + 1
        for block, counts in sorted(per_block.items()):
            j0 = block[0] * backward.BLOCK_K
            keys = f"keys {j0}-{min(j0 + backward.BLOCK_K, case.T_k) - 1} of head {block[1]}"
            element, reads = max(counts.items(), key=lambda item: item[1])
            index = tuple(int(i) for i in np.unravel_index(element, target.shape))
            if reads > 1:
                raise Diagnosed("no_reuse", (
                    f"the values are right, but block {block} ({keys}) read {name}{list(index)} {reads} times "
                    f"from global memory: stage each query tile's {role} in shared memory once, and let every "
                    "thread read it there"))
            start = _first_tile(j0, case.T_q, case.T_k, backward.BLOCK_Q)
            above = sorted({int(np.unravel_index(e, target.shape)[1]) for e in counts} & set(range(start)))
            if above:
                tile = above[0] // backward.BLOCK_Q
                raise Diagnosed("tile_above_diagonal", (
                    f"the values are right, but block {block} ({keys}) loaded {name} of query {above[0]}, in query "
                    f"tile {tile} (queries {tile * backward.BLOCK_Q}-{tile * backward.BLOCK_Q + backward.BLOCK_Q - 1}"
                    f"), whose queries see none of its keys: the walk starts at the tile holding query {start}"
                    f" at the earliest (the first that sees key {j0}, as query i sees key j when j <= i + T_k - T_q)"))


def _run_pass(walk, case, rng, _launch):
    q, k, v, d_out = _pass_inputs(case, rng)
    out = reference.attention(q, k, v, True)                                 # (BH, T_q, d_v)
    lse = backward.log_sum_exp(q, k, True)                                   # (BH, T_q), -inf: no key
    d_rows = np.sum(d_out * out, axis=-1)                                    # (BH, T_q)
    dk, dv = host_output(k.shape), host_output(v.shape)                      # written in place
    f32 = [a.astype(np.float32) for a in (q, k, v, d_out, lse, d_rows)]
    try:
        traced = traced_launch(backward.pass_kernel_with(walk), *backward.dkdv_pass_grid(case.BH, case.T_k),
                               *f32, scores.scale_factor(case.d_k), dk, dv)
    except (OverflowError, ZeroDivisionError) as error:     # the simulator's math.exp; a GPU gives inf, NaN
        raise Diagnosed("unstable_softmax", UNSTABLE.format(error=type(error).__name__)) from None
    _, want_dk, want_dv = backward.backward(q, k, v, d_out, True)
    got, expected = np.concatenate([dk, dv], axis=-1), np.concatenate([want_dk, want_dv], axis=-1)
    if np.allclose(got, expected, rtol=PASS_RTOL, atol=PASS_ATOL):
        _staged_loads(traced, case)                          # right values: then how they were read
        _walk_barriers(traced, case)
    elif not got.any() and traced.barriers == 0:
        raise Diagnosed("walk_never_ran", (
            "dK and dV came back 0 for every key, and no thread reached a barrier: the walk over the query tiles "
            "made no step. Its range is empty: look at its start, its stop and its step (a start past the stop, a "
            "stop counted in tiles where the start counts queries, or a step of the wrong sign makes none)"))
    return got, expected, q, k, v, d_out, _last_query_loaded(traced, case)


def _last_query_loaded(traced, case):
    """Whether a block loaded q of the last query, T_q - 1 (its tile was walked)."""
    name = traced.launch.params[0]
    return name in traced.launch.targets and bool(traced.loads(name)[:, case.T_q - 1].any())


def _tiles_walked(t_q, t_k, rows, end):
    """The most query tiles of `rows` a block walks, from the tile holding its first query to `end`."""
    return max(len(range(_first_tile(j0, t_q, t_k, rows), end, rows)) for j0 in range(0, t_k, backward.BLOCK_K))


def _walk_barriers(traced, case):
    """Diagnosed when the values are right but a thread passed two barriers for each tile of a walk that
    ends at T_k (walk_ends_at_t_k), or of a walk in tiles of 16 rows at a GPU's 32 (tile_size_written_as_number)."""
    passed, most = traced.barriers, _most_barriers(case)
    if passed <= most:
        return
    to_t_k = 2 * _tiles_walked(case.T_q, case.T_k, backward.BLOCK_Q, case.T_k)
    if passed == to_t_k != 2 * _tiles_walked(case.T_q, case.T_k, backward.BLOCK_Q, case.T_q + 1):
        raise Diagnosed("walk_ends_at_t_k", (
            f"the values are right, but a thread passed {passed} barriers, where the limit is {most}: "
            f"{WALK_ENDS_AT_T_K} (here T_q {case.T_q}, T_k {case.T_k})"))
    if backward.BLOCK_Q != 16 and passed == 2 * _tiles_walked(case.T_q, case.T_k, 16, case.T_q):
        raise Diagnosed("tile_size_written_as_number", (
            f"the values are right, but a thread passed {passed} barriers, where the limit is {most}: the walk "
            f"went in tiles of 16 queries. {TILE_AS_NUMBER.format(tile=backward.BLOCK_Q)}"))


WALK_ENDS_AT_T_K = ("the walk's last tile was computed from T_k, the number of keys; the query tiles end at T_q's "
                    "last query, T_q - 1")
TILE_AS_NUMBER = ("At this launch BLOCK_Q and BLOCK_K are {tile}, 16 on the simulator: a tile size written as the "
                  "number 16 fits one launch only, so write BLOCK_Q or BLOCK_K")


def _walked(t_q, t_k, first, step, rows, end):
    """(T_q, T_k) counts: how often a walk folds each visible pair (i, j). The block of key j starts at the
    tile of `first` queries holding the first query that sees its first key j0, steps `step` queries at a
    time while the step's first query is below end(j0, start), and folds `rows` rows a step."""
    i, j = np.indices((t_q, t_k))
    counts = np.zeros((t_q, t_k))
    for j0 in range(0, t_k, backward.BLOCK_K):
        start = _first_tile(j0, t_q, t_k, first)
        for i0 in range(start, min(t_q, end(j0, start)), step):
            counts[i0:i0 + rows, j0:j0 + backward.BLOCK_K] += 1
    return counts * (j <= i + t_k - t_q)


def _short_walks(t_q, t_k):
    """(description, counts) of walks that stop early: capped at a number of tiles from the first, or
    stopped a number of tiles past the block's diagonal band."""
    tile, offset = backward.BLOCK_Q, t_k - t_q
    tiles = ceil_div(t_q, tile)
    for m in range(1, tiles):
        yield (f"after {m} query tile{'s' if m > 1 else ''} from its first",
               _walked(t_q, t_k, tile, tile, tile, lambda j0, start: start + m * tile))
    for m in range(tiles):
        yield (f"{m} tile{'s' if m != 1 else ''} past its diagonal band" if m else "at the end of its diagonal band",
               _walked(t_q, t_k, tile, tile, tile,
                       lambda j0, start: (max(0, min(t_q - 1, j0 + backward.BLOCK_K - 1 - offset)) // tile + 1 + m)
                       * tile))


def _folded(t_q, t_k, mistake):
    """(T_q, T_k) bool: the pairs (i, j) a dK/dV pass with a walk or row mistake folds in (None: the
    visible pairs, j <= i + T_k - T_q), its tiles of BLOCK_Q queries and blocks of BLOCK_K keys."""
    i, j = np.indices((t_q, t_k))
    offset, tile = t_k - t_q, backward.BLOCK_Q
    visible = j <= i + offset
    first_tile = np.vectorize(lambda jj: _first_tile(jj - jj % backward.BLOCK_K, t_q, t_k, tile))(j)
    last_row = (i % tile == tile - 1) | (i == t_q - 1)
    return {None: visible,
            "diagonal_skipped": visible & (j != i + offset),
            "last_query_row_skipped": visible & ~last_row,
            "first_query_row_skipped": visible & (i % tile != 0),
            "first_query_tile_skipped": visible & (i >= first_tile + tile),
            "last_query_tile_skipped": visible & (i // tile != (t_q - 1) // tile),
            "offset_ignored": (j <= i) & (i >= first_tile),
            "masked_pairs_folded": i >= first_tile,
            "block_ignored": j % backward.BLOCK_K <= i + offset,
            "walk_ends_at_t_k": visible & (i < ceil_div(t_k, tile) * tile),
            "band_starts_one_late": visible & (i != np.maximum(i // tile * tile, j - offset)),
            "band_ends_one_short": visible & (i != t_q - 1)}[mistake]


def _pass_variant(q, k, v, d_out, mistake=None, folded=None):
    """dK and dV (concatenated on the last axis) of a dK/dV pass with one of the usual mistakes (None:
    right), float64; folded: (T_q, T_k) how often each pair is folded, in place of the mistake's."""
    (t_q, d_k), t_k = q.shape[1:], k.shape[1]
    scale = 1.0 / math.sqrt(d_k)
    if folded is None:
        folded = _folded(t_q, t_k, mistake if mistake in PAIR_MISTAKES else None)
    if mistake == "head_ignored":           # every block reads head 0's queries, its own head's keys
        q, d_out = np.broadcast_to(q[:1], q.shape), np.broadcast_to(d_out[:1], d_out.shape)
        lse0 = backward.log_sum_exp(q[:1], k[:1], True)[..., None]
        d_0 = np.sum(d_out[:1] * reference.attention(q[:1], k[:1], v[:1], True), axis=-1, keepdims=True)
    s = q @ np.swapaxes(k, -1, -2) * (1.0 if mistake == "scores_not_scaled" else scale)   # (BH, T_q, T_k)
    lse = backward.log_sum_exp(q, k, True)[..., None]                                     # (BH, T_q, 1)
    d_i = np.sum(d_out * reference.attention(q, k, v, True), axis=-1, keepdims=True)
    dp = d_out @ np.swapaxes(v, -1, -2)                                                   # (BH, T_q, T_k)
    if mistake == "head_ignored":
        lse, d_i = lse0, d_0
    shift, minus = {"lse_not_subtracted": (0.0, d_i), "lse_and_d_swapped": (d_i, lse)}.get(mistake, (lse, d_i))
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(folded > 0, np.exp(s - shift), 0.0) * folded
        ds = np.where(folded > 0, {"missing_row_sum": p * dp,
                               "row_sum_not_weighted": p * dp - d_i}.get(mistake, p * (dp - minus)), 0.0)
    dv_weights = ds if mistake in ("dv_weighted_by_ds", "p_and_ds_swapped") else p
    dk_weights = p if mistake in ("dk_weighted_by_p", "p_and_ds_swapped") else ds
    dk_scale = scale * scale if mistake == "dk_scaled_twice" else scale
    dk = np.swapaxes(dk_weights, -1, -2) @ q * dk_scale
    dv = np.swapaxes(dv_weights, -1, -2) @ d_out
    return np.concatenate([dk, dv], axis=-1)


# Mistakes of the walk and of the rows a tile folds (which pairs), then of the recomputation.
PAIR_MISTAKES = {
    "diagonal_skipped": "key j missed the query on its diagonal (j = i + T_k - T_q), the first query that sees "
                        "it: the rows a thread folds start one too late",
    "last_query_row_skipped": "the last query row of every tile was left out: a tile's rows run to its last "
                              "query, BLOCK_Q rows or fewer at the end of T_q",
    "first_query_row_skipped": "the first query row of every tile was left out: a tile's rows start at its "
                               "first query",
    "first_query_tile_skipped": "each block missed the query tile holding the first query that sees its keys: "
                                "the walk starts one tile too late",
    "last_query_tile_skipped": "the last query tile was never walked: the walk stops one tile too early",
    "offset_ignored": "query i was taken to see key j when j <= i, but the queries are the last T_q of T_k "
                      "positions: query i sees key j when j <= i + T_k - T_q",
    "masked_pairs_folded": "every query of the walked tiles was folded into key j, also those that cannot see "
                           "it (j > i + T_k - T_q): their P is 0, not what exp gives",
    "block_ignored": "every block folded the queries of keys 0 .. BLOCK_K - 1: block x holds keys from "
                     "x * BLOCK_K on, which later queries see",
    "walk_ends_at_t_k": WALK_ENDS_AT_T_K,
    # one query short at either end of the rows a thread folds, counted from the band of queries that see
    # key j (its first, j - (T_k - T_q), to T_q - 1) where the slips above count from the tile
    "band_starts_one_late": "in every tile the rows key j folds started one past the first that sees it: the "
                            "key missed its diagonal query (j = i + T_k - T_q) and the first query of each later "
                            "tile; a thread's rows start at its first query that sees the key, included",
    "band_ends_one_short": "the last query, T_q - 1, was folded into no key's sums, though its tile was walked: "
                           "the queries that see key j run to T_q - 1 included, so a range of them stops at T_q",
}
FORMULA_MISTAKES = {
    "lse_not_subtracted": "P_ij is exp(S_ij) without the log-sum-exp: the weights are not normalised; "
                          "subtract the query's lse from the score before the exponential",
    "scores_not_scaled": "the recomputed score was not multiplied by scale: the forward's lse is the "
                         "log-sum-exp of the scaled scores, q . k / sqrt(d_k)",
    "lse_and_d_swapped": "the query's lse and its row sum D were used the other way round",
    "missing_row_sum": "dS_ij is P_ij dP_ij: the row sum D was not subtracted, so dK misses the softmax's "
                       "off-diagonal part",
    "row_sum_not_weighted": "dS_ij came out as P_ij dP_ij - D_i: the row sum belongs inside the factor P, "
                            "P_ij (dP_ij - D_i)",
    "dv_weighted_by_ds": "dV took dS_ij dO_i: the output is P V, so dV_j sums P_ij dO_i",
    "dk_weighted_by_p": "dK took P_ij Q_i: the scores' gradient is dS, so dK_j sums dS_ij Q_i",
    "p_and_ds_swapped": "P and dS swapped places: dV_j sums P_ij dO_i and dK_j sums dS_ij Q_i",
    "dk_scaled_twice": "dK came out scaled twice: the kernel multiplies the sum by scale once, at the end",
}
PASS_MISTAKES = {**PAIR_MISTAKES, **FORMULA_MISTAKES,
                 "head_ignored": "every head's keys were folded with head 0's queries: block (x, h) walks the "
                                 "queries of head h, its blockIdx.y"}
# float32 scores, exp and sums of up to 129 terms against float64: errors around 1e-6.
PASS_RTOL, PASS_ATOL = 1e-4, 5e-5


def _matches(got, expected, wrong):
    """Whether `got` is the wrong result `wrong` (where it is finite), and that differs from the right one."""
    seen = np.isfinite(wrong)
    return bool(seen.any() and not np.allclose(wrong[seen], expected[seen], rtol=PASS_RTOL, atol=PASS_ATOL)
                and np.allclose(got[seen], wrong[seen], rtol=1e-3, atol=1e-4))


def _diagnose_pass(got, expected, q, k, v, d_out, last_query_loaded):
    for code, message in PASS_MISTAKES.items():
        if code == "last_query_tile_skipped" and last_query_loaded:   # walked, its rows not folded: a row slip
            continue
        if _matches(got, expected, _pass_variant(q, k, v, d_out, code)):
            return code, message
    t_q, t_k, tile = q.shape[1], k.shape[1], backward.BLOCK_Q
    for stop, folded in _short_walks(t_q, t_k):
        if _matches(got, expected, _pass_variant(q, k, v, d_out, folded=folded)):
            return "walk_stops_early", (
                f"each block's walk stopped {stop}, before T_q's last query tile (queries "
                f"{(t_q - 1) // tile * tile}-{t_q - 1}): every query after the first that sees key j sees it too, "
                "so the walk runs to the last query, T_q - 1")
    if tile != 16:                          # a GPU's launch, the simulator's passed: a size written as 16?
        for first, step, rows in ((16, 16, tile), (tile, 16, tile), (tile, tile, 16), (16, tile, 16), (16, 16, 16)):
            folded = _walked(t_q, t_k, first, step, rows, lambda j0, start: t_q)
            if _matches(got, expected, _pass_variant(q, k, v, d_out, folded=folded)):
                return "tile_size_written_as_number", (
                    f"the walk's {'step' if step == 16 else 'rows a step'} came out as 16 queries. "
                    + TILE_AS_NUMBER.format(tile=tile))
    if not np.isfinite(got).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return "wrong_values", (f"dK or dV is {got[where]} at (head, key, column) {where}, where NumPy's is "
                                f"{expected[where]:.4g}: a computed inf or NaN (an exponential that overflowed, or "
                                "a query with lse -inf folded in)")
    return None


def _most_barriers(case):
    """Two a query tile: the most tiles a block walks are all of T_q's (block 0's)."""
    return 2 * ceil_div(case.T_q, backward.BLOCK_Q)


register(Exercise(
    exercise_id="11_dkdv_pass",
    kind="device function",
    run=_run_pass,
    cases=pass_cases,
    hint=("dK_j and dV_j are sums over the queries that see key j, and the block's keys are seen by the queries "
          "from some point on, so its walk over the query tiles has a first tile; all its threads share each "
          "tile's copy. The forward kept neither the scores nor the weights, but a pair's weight follows from "
          "its score and the query's log-sum-exp alone"),
    more_hints=("the plan: find the first query that sees the block's first key, and start at the tile that "
                "holds it; walk to the last query, a tile at a time. Each step, the whole block copies the "
                "tile's q and dO rows, lse and D to the shared tiles: number the tile's elements row after row, "
                "and let thread t take elements t, t plus the block's thread count, and so on, so that "
                "neighbouring threads read neighbouring addresses; then it waits. Each thread then takes the "
                "tile's queries that see its key: the weight (exp of the score times the scale, minus lse), dS "
                "(the weight times its v against the row's dO, minus D), and adds the weight times dO to its dV "
                "sum and dS times q to its dK sum. A second wait comes before the next copy. That is two "
                "barriers a query tile, and the budget is two for each tile of T_q, as if a block walked them all",
                "where answers go wrong: the walk's first tile (the queries are the last T_q of T_k positions), "
                "the rows of a tile that see the key (the diagonal itself counts; the last tile may be short), "
                "threads past T_k (they copy and wait like the others but fold nothing), a copy whose stride is "
                "not the block's thread count (two threads write one slot, or a slot is left unwritten), a "
                "barrier inside a branch that some threads skip, and the exponential of a raw score (past 88.7 "
                "a float32 overflows)"),
    rtol=PASS_RTOL,
    atol=PASS_ATOL,
    diagnose=_diagnose_pass,
    diagnoses=tuple(PASS_MISTAKES) + ("unstable_softmax", "tile_above_diagonal", "walk_stops_early",
                                      "tile_size_written_as_number", "walk_never_ran"),
    both_shapes=True,
    limits=(Coalesced("q", 2), Coalesced("d_out", 2), Coalesced("lse", 2), Coalesced("d_rows", 2),
            NoSerialCopy("q"), NoSerialCopy("d_out"), NoSerialCopy("lse"), NoSerialCopy("d_rows"),
            MostBarriers(_most_barriers, why=lambda case: f"two a query tile of BLOCK_Q {backward.BLOCK_Q} rows: one "
                                                             "after its copy, one before the next"),
            RefilledTiles()),
    solution=backward.dkdv_walk,
    forbidden=(backward.dkdv_tile, backward.load_query_tiles, backward.load_rows, backward.load_entries,
               backward.query_ranges, backward.queries_seeing,
               backward.dq_tile, backward.flash_backward_dkdv_kernel, backward.launch_fused_backward,
               backward.flash_attention_backward, backward.dkdv_pass),
))
