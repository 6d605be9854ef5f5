"""``10_tiled_k`` (notebook 10, main): a whole kernel ``(q, k, out)`` computing out[i, j] = q[i] . k[j]
on the warm-up's grid (a thread per query row, blocks of 32), which keeps its row of q in registers
and stages k through shared memory in tiles of the student's choosing (the library's
``registers.row_scores_kernel_v3``). Its cases, limits and named mistakes are declared in the
Exercise below.
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.ex10_registers import D, launch_row_scores
from attention_lib.checks.launch import unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import (Coalesced, MostAccessesPerThread, MostBarriers, MostLoads, NoLocalMemory,
                                         NoSerialCopy, RefilledTiles, SharedBanks, StoredOnce)
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import registers

ROWS = registers.ROWS_PER_BLOCK
# The smallest tile of keys the barrier limit allows (two barriers a step); the library's holds 32 keys.
LEAST_TILE = 16
# Tiles a student may pick, for naming a mistake whatever the tile (smaller ones break the barrier limit).
TILES = (8, 16, 32, 64)


def _tiled_cases(tile=LEAST_TILE, rows=ROWS):
    """(T_q, T_k): a partial block against two tiles less a key (a T_k fixed at the simulator's 32
    reads past k), then two and a key (a step that copies the first keys again, or stops after the
    whole tiles, shows there); a block and a row (blockIdx) against a whole tile; a block one row
    short against a tile less a key; two tiles exactly; four tiles and a key; one row and one key."""
    return [(5, 2 * tile - 1), (3, 2 * tile + 1), (rows + 1, tile), (rows - 1, tile - 1), (2, 2 * tile),
            (2, 4 * tile + 1), (1, 1)]


def _last_keys(t_k, tile):
    """For columns 0 .. tile - 1: the key whose score a walk in tiles of `tile` writes there last
    when it forgets the step's first key in the write."""
    return [max(j for j in range(r, t_k, tile)) for r in range(min(tile, t_k))]


def _tile_mistake(got, expected, q, k):
    """(code, message) for a usual mistake of the walk over key tiles, whatever the tile; None."""
    written = ~unwritten(got)
    t_k = got.shape[1]
    close = lambda a, b: np.allclose(a, b, rtol=1e-5, atol=1e-4)             # noqa: E731
    if not written.any() and t_k % LEAST_TILE:
        return "last_tile_dropped", (f"no score was written: T_k = {t_k} keys fill no whole tile of {2 * LEAST_TILE} "
                                     "keys, so a walk over whole tiles takes no step. The last tile may hold fewer "
                                     "keys, and it needs its step too")
    for tile in TILES:
        if t_k <= tile:
            continue
        if written.all() and close(got, reference.scores(q, k[np.arange(t_k) % tile], scale=False)):
            return "same_key_tile", (f"the scores of key j came out as those of key j mod {tile}: every step "
                                     f"copied the first {tile} keys into the tile. A step's keys start where the "
                                     "previous step's ended")
        whole = t_k // tile * tile
        if 0 < whole < t_k and written[:, :whole].all() and not written[:, whole:].any() \
                and close(got[:, :whole], expected[:, :whole]):
            return "last_tile_dropped", (f"the scores of keys {whole} to {t_k - 1} were never written: the walk "
                                         "stopped after the last whole tile. The last tile may hold fewer keys, "
                                         "and it needs its step too")
        if written[:, :tile].all() and not written[:, tile:].any() \
                and close(got[:, :tile], expected[:, _last_keys(t_k, tile)]):
            return "scores_not_placed", (f"only the first {tile} columns of out were written, each with the last "
                                         "step's score for that place in the tile: the score of a tile's key "
                                         "belongs in the column of the key, the step's first key plus its place")
    return None


def _run_tiled(kernel, case, rng, launch):
    t_q, t_k = case
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    got = launch_row_scores(kernel, cuda.to_device(q), cuda.to_device(k), launch)
    expected = reference.scores(q, k, scale=False)
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-4, equal_nan=False):
        named = _tile_mistake(got, expected, q, k)
        if named:
            raise Diagnosed(*named)
    return got, expected


def _barriers_why(case):
    steps = ceil_div(case[1], LEAST_TILE)
    return (f"T_k = {case[1]} keys make at most {steps} step{'s' if steps > 1 else ''} with tiles of at least "
            f"{LEAST_TILE} keys, two barriers each (the tile full before it is read, read before it is refilled)")


register(Exercise(
    exercise_id="10_tiled_k",
    kind="kernel",
    run=_run_tiled,
    cases=_tiled_cases(),
    describe_case=lambda c: f"T_q = {c[0]}, T_k = {c[1]}, D = {D}",
    hint=("the 32 rows of a block all read the same keys: if the block first copies a few keys into shared "
          "memory together, every row can read them there, and k leaves main memory once per block instead of "
          "once per row. The row of q stays in registers as in the warm-up: every index into it must be a "
          "constant the compiler knows"),
    more_hints=(
        "the plan: each thread with a query row copies that row into its register array once. Then the block "
        "walks the keys a tile at a time. In each step the whole warp copies the tile's keys, lanes side by "
        "side along each key's row; a barrier; each thread with a row scores the tile's keys against its "
        "registers and writes those scores; a second barrier before the next copy. The last tile may hold "
        "fewer keys",
        "where answers go wrong: a thread with no query row that returns early skips the copies and the "
        "barriers; a step that copies the first keys again instead of its own; a walk that stops after the "
        "last whole tile; a score written at the key's place in the tile instead of its column of out; "
        "lanes that each copy a whole key touch a segment a lane; a tile stored a key a column puts a warp's "
        "words in one bank; a loop over the row bounded by the "
        "array's shape puts the register array in local memory"),
    # float32 sums of 64 products of standard normals (values up to about 25) against float64.
    rtol=1e-5,
    atol=1e-4,
    limits=(MostLoads("q", 1, why="copy the thread's row into its register array once and read it from there"),
            MostLoads("k", lambda case: ceil_div(case[0], ROWS),
                      why="a block copies each key into shared memory once and all its rows read it there"),
            Coalesced("k", 2), NoSerialCopy("k"), StoredOnce("out"),
            MostAccessesPerThread("out", lambda case: case[1], access="store",
                                  why="a thread per query row writes its row's T_k scores"),
            MostBarriers(lambda case: 2 * ceil_div(case[1], LEAST_TILE), why=_barriers_why),
            RefilledTiles(), NoLocalMemory(),
            # Every row reads the tile D times a key (one round); the copy stores each slot once a step (two
            # rounds: a lane storing two neighbouring words).
            SharedBanks(reads=1, stores=2)),
    diagnoses=("same_key_tile", "last_tile_dropped", "scores_not_placed", "bank_conflict", "output_rewritten"),
    solution=registers.row_scores_kernel_v3,
    forbidden=(registers.row_scores, registers.launch_row_scores, registers.row_scores_kernel_v2),
))
