"""Notebook 05's exercises: ``05_weighted_sum`` (warm-up), a kernel ``(a, v, out)`` computing out = a . v
for every head, one thread per output on weighted_sum_grid (``weighted_sum.weighted_sum_kernel_v1``);
``05_causal_av`` (main), the same product tiled for causal weights, each block's walk along the keys
stopping after its last visible key (``weighted_sum.weighted_sum_causal_kernel``); ``05_induction_key``
(predict, then check), a NumPy function ``induction_key(tokens, i)`` naming the key the trained toy
model's induction head weighs most at query i, held to the head's own choice (``induction_key``
below). Their cases, limits and named mistakes are declared in the Exercises below.
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import attention, projection, toy_model, weighted_sum
from attention_lib.stages.projection import TILE
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output, output_array, read_output, traced_launch, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriersPerBlock, MostLoads, RefilledTiles

# The library code an answer to either exercise may not call: the kernels, their launchers, the
# tiled matmul of notebook 01 that would do the tile loop, and the references.
_STAGE = (weighted_sum.weighted_sum_kernel_v1, weighted_sum.weighted_sum_kernel_v2,
          weighted_sum.weighted_sum_causal_kernel, weighted_sum.launch_weighted_sum, weighted_sum.weighted_sum,
          projection.projection_kernel_v1, projection.projection_kernel_v2, projection.tile_matmul,
          reference.weighted_sum)


class Case(NamedTuple):
    """One size tried: BH heads of weights (T_q, T_k) times values (T_k, d_v)."""

    BH: int
    T_q: int
    T_k: int
    d_v: int

    def __str__(self):
        return f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_v {self.d_v})"


def _weights(case, rng, causal):
    """Attention weights (BH, T_q, T_k) float32, rows >= 0 summing to 1 (or all 0 where a causal
    query sees no key), and values (BH, T_k, d_v) float32."""
    s = rng.standard_normal((case.BH, case.T_q, case.T_k))
    a = reference.softmax(reference.apply_causal_mask(s) if causal else s).astype(np.float32)
    v = rng.standard_normal((case.BH, case.T_k, case.d_v)).astype(np.float32)
    return a, v


# --- The warm-up: one thread per output element, all heads in one launch ------------------------

def _swapped_reach(case):
    """(T_q, d_v) bool: the outputs a kernel reaches when it takes the query from the grid's x and
    the column from its y (the grid being weighted_sum_grid's)."""
    (across, down, _), _ = weighted_sum.weighted_sum_grid(case.BH, case.T_q, case.d_v)
    return (np.arange(case.T_q)[:, None] < across * TILE) & (np.arange(case.d_v)[None, :] < down * TILE)


def _run_weighted_sum(kernel, case, rng, launch):
    a, v = _weights(case, rng, causal=False)
    full, out = output_array((case.BH, case.T_q, case.d_v), guard=TILE * TILE)
    grid, block = weighted_sum.weighted_sum_grid(case.BH, case.T_q, case.d_v)
    launch(kernel, grid, block, cuda.to_device(a), cuda.to_device(v), out)
    got = read_output(full, out)
    written = ~unwritten(got)
    reach = _swapped_reach(case)
    if not written.all() and not reach.all() and (written == reach[None]).all():
        raise Diagnosed("grid_axes_swapped", (
            "the outputs past the first blocks of the grid's x axis were never written: the query was taken "
            "from the grid's x and the column from y; the grid's x runs along the output's columns (d_v), "
            "its y along the queries, its z over the heads"))
    return got, a.astype(np.float64) @ v, a, v


def _diagnose_weighted_sum(got, expected, a, v):
    if a.shape[1] == a.shape[2] and np.allclose(got, np.swapaxes(a, 1, 2).astype(np.float64) @ v,
                                                rtol=1e-5, atol=1e-5):
        return "weights_transposed", ("query i read column i of the weights: its weights are row i of a[h], "
                                      "a[h, i, j] for every key j")
    return None


register(Exercise(
    exercise_id="05_weighted_sum",
    kind="kernel",
    run=_run_weighted_sum,
    # One weight; two square heads (T_q = T_k: transposed weights keep the shape; two block rows
    # and one block across, so swapped axes leave outputs unwritten); d_v 24 (two blocks across,
    # the second partly used); 33 queries of 20 keys (three block rows); three heads of 5 queries;
    # a tile less one query, a tile and one key, two tiles and one column.
    cases=[Case(1, 1, 1, 1), Case(2, 19, 19, 3), Case(2, 7, 5, 24), Case(1, 33, 20, 5), Case(3, 5, 9, 17), Case(1, 3, 4, 64),
           Case(1, TILE - 1, TILE + 1, 2 * TILE + 1)],
    hint=("one thread per output element: the grid's x picks the value's feature, y the query, z the "
          "head; the thread walks the keys, adding each weight of its query's row times that key's "
          "value in its feature"),
    more_hints=("where each step goes: the thread's feature and query from the grid, its head from the block's "
                "z; threads of the edge blocks past the last query or feature do nothing; a float32 total "
                "starts at zero and takes in, key after key, the query's weight times the key's value in the "
                "feature; the total is written once",
                "where answers go wrong: the grid's x is the column, not the query; the weights of a "
                "query are a row of the head's weights, not a column; threads of the edge blocks "
                "that have no output must do nothing; a total started from a plain Python number is "
                "float64 on a GPU"),
    # float32 sums of at most 20 products of order 1 against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_weighted_sum,
    diagnoses=("grid_axes_swapped", "weights_transposed"),
    solution=weighted_sum.weighted_sum_kernel_v1,
    forbidden=_STAGE,
))


# --- The main exercise: the causal tiled kernel ------------------------------------------------

def _visible_keys(block_row, t_q, t_k):
    """Keys the queries of block row `block_row` may see: up to its last query + T_k - T_q (0 or
    less: none)."""
    last_query = min((block_row + 1) * TILE, t_q) - 1
    return max(0, min(t_k, last_query + t_k - t_q + 1))


def _run_causal_av(kernel, case, rng, _launch):          # traced: races and loads on every case
    a, v = _weights(case, rng, causal=True)
    out = host_output((case.BH, case.T_q, case.d_v))
    grid, block = weighted_sum.weighted_sum_grid(case.BH, case.T_q, case.d_v)
    traced = traced_launch(kernel, grid, block, a, v, out)
    expected = a.astype(np.float64) @ v
    if np.allclose(out, expected, rtol=1e-5, atol=1e-5):             # right: were the zero tiles read?
        loads = traced.loads("a")
        for block_row in range(ceil_div(case.T_q, TILE)):
            # the key tiles after the one that holds the block's last visible key are all zero
            first_zero_tile = ceil_div(_visible_keys(block_row, case.T_q, case.T_k), TILE) * TILE
            wasted = int(loads[:, block_row * TILE:(block_row + 1) * TILE, first_zero_tile:].sum())
            if wasted:
                raise Diagnosed("no_tiles_skipped", (
                    f"the values are right, but {wasted} loads of weights lie in key tiles wholly above the "
                    f"diagonal of query block {block_row} (keys {first_zero_tile} and on, all zero): stop the "
                    "block's walk along the keys after the tile that holds its last query's last visible key"))
    return out, expected, a, v


def _diagnose_causal_av(got, expected, a, v):
    close = dict(rtol=1e-5, atol=1e-5)
    bh, t_q, t_k = a.shape

    def up_to(bound):                     # A . V over the first bound(r) keys of each block row r
        result = np.zeros_like(expected)
        for r in range(ceil_div(t_q, TILE)):
            rows, k_end = slice(r * TILE, (r + 1) * TILE), max(0, min(t_k, bound(r)))
            result[:, rows] = a[:, rows, :k_end].astype(np.float64) @ v[:, :k_end]
        return result

    if np.allclose(got, up_to(lambda r: r * TILE + t_k - t_q), **close):
        return "diagonal_tile_skipped", ("the key tile on the diagonal was skipped too: it holds the weights of "
                                        "each query's nearest keys, itself included, which are not zero")
    if t_q != t_k and np.allclose(got, up_to(lambda r: (r + 1) * TILE), **close):
        return "mask_ignores_offset", (f"with T_q = {t_q} and T_k = {t_k} the queries are the last positions: "
                                       f"query i sees keys up to i + {t_k - t_q}, and the block's walk along "
                                       "the keys must stop there")
    return None


def _block_barriers(case, block):
    """The barriers a thread of `block` (its blockIdx) may pass in 05_causal_av: two a step, one step
    for each key tile its own block row sees (up to the tile that holds its last query's last visible
    key), whatever the other block rows see."""
    return 2 * ceil_div(_visible_keys(block[1], case.T_q, case.T_k), TILE)


_STEPS_WHY = ("two a step, one step for each key tile the block's own queries see, up to its last query's last "
              "visible key: a step past it loads nothing and still waits twice")


register(Exercise(
    exercise_id="05_causal_av",
    kind="kernel",
    run=_run_causal_av,
    # One weight; two heads of 7 (one tile, its first step already past every edge: a tile not
    # zeroed there holds the check's garbage); from TILE: T_k - T_q = 0 with the last visible key
    # on a tile's edge and d_v a whole tile, +1, -1 (a second block row); 33 queries of 15 keys
    # (the first block row sees no key); 33 of 33 (three block rows, tiles above the diagonal, each
    # row of blocks with its own steps); the model's head width, 64, at T 9 (four blocks across: a
    # column not taken from blockIdx.x shows; T small, so the simulator stays fast).
    cases=[Case(1, 1, 1, 1), Case(2, 7, 7, 5), Case(1, TILE, TILE, TILE), Case(1, TILE, TILE + 1, 7),
           Case(1, TILE + 1, TILE, 3), Case(1, 2 * TILE + 1, TILE - 1, 1), Case(1, 2 * TILE + 1, 2 * TILE + 1, 8),
           Case(1, 9, 9, 64)],
    limits=(MostLoads("a", lambda case: ceil_div(case.d_v, TILE)),
            MostLoads("v", lambda case: ceil_div(case.T_q, TILE)),
            # A warp of a 16 x 16 block reads two rows of 16 floats, each within at most two segments.
            Coalesced("a", 4), Coalesced("v", 4), RefilledTiles(),
            # Block by block: a walk over every key tile (loads guarded at the stop), or a step past the
            # stop capped at T_k, takes no more steps than the last block row's, which sees every tile.
            MostBarriersPerBlock(_block_barriers, why=_STEPS_WHY)),
    hint=("a block's threads share what they load: a tile of weights serves a block's columns, a tile of "
          "values its queries; and the queries of one block share one stopping point along the keys, the "
          "last key the block's last query may see, after which every key tile is all zeros"),
    more_hints=("where each step goes: work out the block's stopping point first, the same for all its "
                "threads; walk the keys a tile at a time up to it; each step, every thread loads one weight "
                "and one value into the two shared tiles, neighbouring threads taking neighbouring elements of "
                "a row, and a zero wherever the element lies past the stopping point, past the last query or "
                "past the last feature; the block waits; each thread adds a tile's worth of products; the "
                "block waits again before the next step overwrites the tiles; a thread with an output writes "
                "it at the end",
                "where answers go wrong: a stopping point worked out from each thread's own query (the "
                "threads of a block then take different numbers of steps, and every step waits at "
                "barriers); stopping before the tile on the diagonal, which is not all zeros; forgetting "
                "that with fewer queries than keys the queries are the last positions; one of the two "
                "tiles left unzeroed past an edge; a step more than the visible keys need, or a walk over "
                "every key tile with its loads guarded at the stop; a column taken from the thread alone, "
                "not from its block too, which holds only while the values fit one tile"),
    # float32 sums of at most 33 products of order 1 against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_causal_av,
    diagnoses=("no_tiles_skipped", "diagonal_tile_skipped", "mask_ignores_offset"),
    solution=weighted_sum.weighted_sum_causal_kernel,
    forbidden=_STAGE,
))


# --- Predict, then check: the key a trained induction head picks ---------------------------------

def induction_key(tokens, i):
    """The key an induction head puts its weight on at query i: the position right after the latest
    earlier occurrence of the query's token. tokens: (T,) int, one sequence; i: a position whose
    token occurred before it (in the repeated segment of an induction sequence). Returns an int."""
    earlier = np.flatnonzero(tokens[:i] == tokens[i])      # the positions before i holding its token
    return earlier[-1] + 1                                  # the key just after the latest of them


# The sequences tried: toy_model.induction_batch(np.random.default_rng(SEQUENCES_SEED), 512)[k] for
# these k, one for each segment length L from 4 to 11, each a sequence where the trained head's
# largest weight at every query of the repeat lies where an induction head's should.
SEQUENCES_SEED = 99
INDUCTION_SEQUENCES = (0, 10, 12, 33, 53, 39, 35, 36)
INDUCTION_LAYER, INDUCTION_HEAD = 1, 1


@lru_cache(maxsize=1)
def _induction_data():
    """(tokens (512, T) int, lengths (512,) int, the trained model's params)."""
    tokens, _, lengths = toy_model.induction_batch(np.random.default_rng(SEQUENCES_SEED), 512)
    return tokens, lengths, toy_model.load_trained()[0]


class SequenceCase(NamedTuple):
    """One sequence of the batch, by its index."""

    sequence: int

    def __str__(self):
        tokens, lengths, _ = _induction_data()
        return f"sequence {self.sequence} (a segment of {lengths[self.sequence]} tokens, then its repeat)"


def _run_induction_key(answer, case, rng, _launch):
    tokens, lengths, params = _induction_data()
    tokens, length = tokens[case.sequence], int(lengths[case.sequence])
    weights = toy_model.layer_heads(params, tokens, INDUCTION_LAYER)[3][INDUCTION_HEAD]    # (T, T) float64
    queries = np.arange(length, 2 * length - 1)             # the repeat, before its last token
    got = np.array([int(answer(tokens.copy(), int(i))) for i in queries])
    expected = weights[queries].argmax(axis=-1)
    _refuse_the_future(answer, tokens, queries, got, rng)
    return got, expected, tokens, queries, weights


def _refuse_the_future(answer, tokens, queries, got, rng):
    """Diagnosed when an answer changes with the tokens after its query: the head at query i sees tokens
    0..i only (the causal mask), so its pick cannot depend on what comes later. Every token after i is
    replaced by another of the vocabulary, and the answer asked again."""
    for i, said in zip(queries, got):
        future = tokens.copy()
        future[i + 1:] = (tokens[i + 1:] + rng.integers(1, toy_model.VOCAB, tokens.size - i - 1)) % toy_model.VOCAB
        try:
            now = int(answer(future, int(i)))
        except Exception as error:  # noqa: BLE001  (what the answer raises on another future is the answer's)
            now = f"{type(error).__name__}"
        if now != said:
            now = f"key {now}" if isinstance(now, int) else f"an error ({now})"
            raise Diagnosed("reads_the_future", (
                f"at query {i} you said key {said}, but {now} once the tokens after position {i} change: the "
                f"head at query {i} sees tokens 0 to {i} only (the causal mask), so its pick cannot depend on the "
                "tokens after it, the next one included"))


def _diagnose_induction_key(got, expected, tokens, queries, weights):
    if (got == expected - 1).all():
        return "earlier_occurrence_itself", (
            "you picked the key that holds the query's token earlier on; the head looks one position further, "
            "at the token that followed it there: the one the model predicts comes next")
    if (got == queries - 1).all():
        return "previous_token", ("you picked key i - 1 for every query i: that is the previous-token pattern of "
                                  "layer 0's heads; this head, in layer 1, looks much further back")
    first = int(np.flatnonzero(got != expected)[0])
    i, key = int(queries[first]), int(expected[first])
    return "wrong_values", (f"{int((got != expected).sum())} of {got.size} queries differ; first at query {i} (token "
                            f"{tokens[i]}): you said key {got[first]}, the head's largest weight, "
                            f"{weights[i, key]:.2f}, is on key {key} (token {tokens[key]})")


register(Exercise(
    exercise_id="05_induction_key",
    kind="function",
    gpu_code=False,
    run=_run_induction_key,
    cases=[SequenceCase(k) for k in INDUCTION_SEQUENCES],
    hint=("the model predicts the next token; in the repeat, the query's token has been seen once before, "
          "in the first copy, and what followed it there is what comes next now; the head looks for the "
          "position whose previous token is the query's token"),
    more_hints=("where each step goes: find the positions before the query that hold the query's token; "
                "take the latest of them; the key is the position right after it",
                "where answers go wrong: the earlier occurrence itself (the head looks one position further, "
                "at what followed it); the query's own position; the key just before the query, which is "
                "the previous-token pattern of layer 0"),
    rtol=0,
    atol=0,
    diagnose=_diagnose_induction_key,
    diagnoses=("earlier_occurrence_itself", "previous_token", "reads_the_future"),
    solution=induction_key,
    forbidden=(toy_model.layer_heads, toy_model.forward, toy_model.induction_score, attention.attention_weights,
               attention.attention),
))
