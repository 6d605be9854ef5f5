"""``00_tiled_transpose`` (notebook 00, main): a kernel ``(a, out)`` writing out = a^T through a tile in
shared memory, so that a warp's stores run along a row of out as its loads run along a row of a
(the library's ``basics.transpose_tiled_kernel``). Its cases, limits and named mistakes are
declared in the Exercise below.
"""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.stages.basics import TILED_TRANSPOSE_BLOCK
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.ex00_transpose import diagnose_one_short
from attention_lib.checks.launch import output_array, read_output
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriers, MostLoads, NoSerialCopy, SharedBanks, StoredOnce


def _tiled_cases(tile=basics.TRANSPOSE_TILE):
    """(rows, cols): one tile, where a tile written back untransposed shows; four tiles, where a tile
    transposed in place shows; a tile one short and one past each way (each guard tested alone); one
    element; several tiles with partial edges, wide and tall; a thin matrix."""
    return [(tile, tile), (2 * tile, 2 * tile), (tile - 1, tile + 1), (tile + 1, tile - 1), (1, 1),
            (2 * tile + 1, tile + 4), (tile + 4, 3 * tile - 1), (40, 3)]


def _tile_mistakes(a):
    """{code: (out, written)}: what the two usual tile mistakes write, out as (cols, rows) and written
    the entries they reach. Element (r, c) of a lies at (i, j) of its tile, whose corner is (r0, c0)."""
    rows, cols = a.shape
    tile = basics.TRANSPOSE_TILE
    r, c = np.indices(a.shape)
    r0, c0, i, j = r // tile * tile, c // tile * tile, r % tile, c % tile
    found = {}
    for code, (out_r, out_c) in {"tile_not_transposed": (c0 + i, r0 + j), "tile_not_moved": (r0 + j, c0 + i)}.items():
        inside = (out_r < cols) & (out_c < rows)
        out, written = np.zeros((cols, rows), np.float32), np.zeros((cols, rows), bool)
        out[out_r[inside], out_c[inside]] = a[inside]
        written[out_r[inside], out_c[inside]] = True
        found[code] = out, written
    return found


def _run_tiled_transpose(kernel, shape, rng, launch):
    rows, cols = shape
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    expected = np.ascontiguousarray(a.T)
    full, out = output_array((cols, rows), guard=TILED_TRANSPOSE_BLOCK[0] * TILED_TRANSPOSE_BLOCK[1] * (rows + cols))
    launch(kernel, basics.grid_2d(rows, cols, TILED_TRANSPOSE_BLOCK), TILED_TRANSPOSE_BLOCK, cuda.to_device(a), out)
    got = read_output(full, out)
    wrong_entries = got != expected
    if wrong_entries.any():
        for code, (wrong, written) in _tile_mistakes(a).items():
            # The mistake explains the answer: it differs from the transpose somewhere it writes, the answer
            # holds what it writes there, and every wrong entry of the answer is one it writes.
            explains = (wrong[written] != expected[written]).any() and np.array_equal(got[written], wrong[written])
            if explains and not (wrong_entries & ~written).any():
                raise Diagnosed(code, {
                    "tile_not_transposed": "each tile of a landed in the right place of out, but untransposed: a "
                                           "thread must write back the tile's element across the diagonal from the "
                                           "one it loaded (its x and y exchanged), not its own",
                    "tile_not_moved": "each tile of a was transposed where it stands: block (x, y) must write its "
                                      "tile at block (y, x) of out, so the block's corner changes too, not only "
                                      "the thread's place in the tile"}[code])
        tile = basics.TRANSPOSE_TILE
        diagnose_one_short(kernel, launch, got, expected, TILED_TRANSPOSE_BLOCK, (tile + 1, tile - 1))
    return got, expected


register(Exercise(
    exercise_id="00_tiled_transpose",
    kind="kernel",
    run=_run_tiled_transpose,
    cases=_tiled_cases(),
    describe_case=lambda s: (f"a of {s[0]} rows and {s[1]} columns (blocks of {TILED_TRANSPOSE_BLOCK[0]} x "
                             f"{TILED_TRANSPOSE_BLOCK[1]} threads)"),
    hint=("a block can share what it reads: if the whole block first copies its square of a into shared "
          "memory, a thread may then write out any element of that square, not only the one it read; "
          "pick for each thread the one that makes a warp write along a row of out"),
    more_hints=("the plan: every thread copies one element of the block's square of a into a shared tile, "
                "threads of a warp side by side along a row of a; the block waits until the tile is full; "
                "then every thread writes one element of out's square, threads of a warp side by side along "
                "a row of out. It takes from the tile not the slot it filled but the one mirrored across "
                "the diagonal: the tile's row is the thread's x, its column the thread's y. The square of "
                "out sits where the transpose puts the square of a: the block's x and y exchange roles. "
                "Those reads walk down a column of the tile: with rows of 16 words its 16 words fall in 2 "
                "banks, served in 8 rounds; a row one word longer (TRANSPOSE_TILE_PADDED, 17, since a "
                "shared array's shape must be a constant) puts them in 16",
                "where answers go wrong: the two guards differ (the load is bounded by a's rows and columns, "
                "the store by out's), and the barrier must be reached by every thread of the block, so it "
                "stands outside both guards"),
    rtol=0.0,     # a transpose moves values: exactly equal
    atol=0.0,
    limits=(MostLoads("a", 1, why="each element of a is read once, by one thread"),
            NoSerialCopy("a"), NoSerialCopy("out", access="store"),
            Coalesced("a", 4),
            # A warp is two rows of 16 threads: two runs of 64 bytes, in two to four segments; lanes down
            # a column of out touch one segment each, 8 or 16 for a warp.
            Coalesced("out", 4, access="store",
                      why="neighbouring threads of a warp should {verb} neighbouring addresses; a warp that "
                          "writes down a column of out touches a segment a lane. Go through the shared tile "
                          "so that the block writes rows of out"),
            MostBarriers(1, why="one barrier between filling the tile and reading it"),
            # A warp is two rows of 16 threads. A tile row of 17 words (16 and a padding word) puts a
            # column's 16 words in 16 banks, and a row's 16 in 16; the warp's second row shifts them by
            # one word (a column) or 17 (a row), so one bank gets 2 words: 2 rounds, for a read along
            # columns or rows, a store either way. An unpadded tile of 16-word rows puts a column's 16
            # words in 2 banks, 8 a bank.
            SharedBanks(reads=2, stores=2,
                        why="a column of a tile 16 words wide lies in 2 banks; lay the tile out so that the "
                            "words a warp touches at once fall in different banks"),
            StoredOnce("out", why="each element of out is written once, by one thread, when its value is known")),
    diagnoses=("tile_not_transposed", "tile_not_moved", "guard_one_short", "bank_conflict", "output_rewritten"),
    solution=basics.transpose_tiled_kernel,
    forbidden=(basics.transpose,),
))
