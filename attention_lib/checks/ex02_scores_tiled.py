"""``02_scores_tiled`` (notebook 02's main exercise): the whole tiled kernel for K as the projection
writes it, (BH, T_k, d_k), from its contract: who copies which element of q and k, where k's element
lands in its tile, the walk along d_k, the barriers and the guards are the student's
(``scores.scores_tiled_kernel``). Its cases, limits and named mistakes are declared in the Exercise below.
"""

import re
from collections import defaultdict

import numpy as np

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform import where
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import scores
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output, traced_launch
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriers, MostLoads, NoSerialCopy, RefilledTiles, SharedBanks
from attention_lib.checks.ex02_scaled_scores import scale_ignored


# A warp of a 16 x 16 block is two rows of 16 threads; 16 neighbouring float32 are 64 bytes, which lie
# in at most 2 segments of 128 bytes: a coalesced load touches at most 4. One that walks down a column
# of rows over 128 bytes apart touches one segment per thread.
COALESCED_SEGMENTS = 4


# --- The main exercise: the whole tiled kernel, K in its own layout ------------------------------

def _tiled_cases(configuration):
    """(BH, T_q, T_k, d_k, scale), from the tile, each with a scale other than 1/sqrt(d_k): FOLD_CASE
    first (two heads, one row of blocks a head and two columns, T_k a tile + 1: a block offset dropped
    from the key shows; one partial step along d_k, where the tile of q holds a head's whole q); then
    one whole tile and one whole step (an extra step shows in the barriers); the model's head width, 64,
    and 128, in one block each (the simulator stays fast: a d_k fixed at 64 shows at 128); one query past
    a tile with a last step of one column (d_k 33: two whole steps and one past). T_q and T_k each take
    the residues 15, 16 and 17 of the tile."""
    tile = scores.TILE
    return [FOLD_CASE, (1, tile, tile, tile, 0.5), (1, tile - 1, tile, 64, 0.2), (1, tile, tile - 1, 128, 1.5),
            (1, tile + 1, tile, 2 * tile + 1, 0.7)]


FOLD_CASE = (2, scores.TILE - 1, scores.TILE + 1, 5, 0.3)


def _describe_tiled(case):
    return f"BH = {case[0]}, T_q = {case[1]}, T_k = {case[2]}, d_k = {case[3]}, inv_sqrt_dk = {case[4]:g}"


def _run_tiled(kernel, case, rng, launch):
    """Every case traced: races, barriers and reads of unwritten slots (the engine); once the values are
    right, the tile of q after FOLD_CASE and the banks of every warp's access to a tile; then the
    declared limits."""
    bh, t_q, t_k, d_k, scale = case
    scale = np.float32(scale)
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(bh, t_q, t_k)
    expected = reference.scores(q, k, scale=False) * scale
    got = host_output((bh, t_q, t_k))
    try:
        traced = traced_launch(kernel, grid, block, q, k, scale, got)
    except IndexError as error:
        raise _axis_slip_past_the_edge(error, q.shape, k.shape) or error from None
    if np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        reused = traced.loads("q").max(initial=0) <= ceil_div(t_k, scores.TILE)    # else no_reuse says it
        if case == FOLD_CASE and reused:
            _check_fold(traced, q, scale)
    return got, expected, q, k, scale, traced


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


def _check_fold(traced, q, scale):
    """scale_not_folded when, after a case of one row of blocks a head and one step along d_k, no shared
    array holds the last block's head of q times the scale among the slots it wrote."""
    written = _written_by_the_last_block(traced)
    if any(_holds_all(values, q[blk[2]] * scale) for blk, values in written.values()):
        return
    unscaled = any(_holds_all(values, q[blk[2]]) for blk, values in written.values())
    raise Diagnosed("scale_not_folded", (
        "the values are right, but after this case (one row of blocks a head, one step along d_k) no shared "
        "array holds q's elements times inv_sqrt_dk among the slots its block wrote" +
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


def _untransposed(q, k):
    """q.k^T as a kernel gets it that reads k's tile with its row and column exchanged: thread (x, y)
    of block (bx, by) sums q[i, c0 + c] k[16 bx + c, c0 + x] over c and the steps c0 (0 past an edge)."""
    tile = scores.TILE
    bh, t_q, d_k = q.shape
    t_k = k.shape[1]
    width = ceil_div(d_k, tile) * tile
    qp = np.zeros((bh, t_q, width))
    qp[:, :, :d_k] = q
    out = np.zeros((bh, t_q, t_k))
    for bx in range(ceil_div(t_k, tile)):
        kb = np.zeros((bh, tile, width))                     # the block's 16 keys, zero past T_k and d_k
        rows = k[:, bx * tile:(bx + 1) * tile]
        kb[:, :rows.shape[1], :d_k] = rows
        block = sum(qp[:, :, c0:c0 + tile] @ kb[:, :, c0:c0 + tile] for c0 in range(0, width, tile))
        out[:, :, bx * tile:(bx + 1) * tile] = block[:, :, :min(tile, t_k - bx * tile)]
    return out


def _padded(x):
    """x (BH, T, d_k) with zeros after its rows and columns, up to whole tiles."""
    tile = scores.TILE
    bh, t, d_k = x.shape
    out = np.zeros((bh, ceil_div(t, tile) * tile, ceil_div(d_k, tile) * tile))
    out[:, :t, :d_k] = x
    return out


def _copied_along(x, slip):
    """What each row of x's tile gives its sums when the copy takes one index from the other thread
    axis (0 past an edge): "row" (the row from the thread along d_k: every row of the tile holds the
    tile's diagonal, x[r0 + c, c]) or "column" (the column from the row's thread: row r holds
    x[r0 + r, c0 + r] in every column of the step)."""
    tile = scores.TILE
    padded = _padded(x)
    r, c = np.indices(padded.shape[1:])
    if slip == "row":
        return padded[:, r // tile * tile + c % tile, c]
    return padded[:, r, c // tile * tile + r % tile]


_AXIS_SLIPS = {
    ("q", "row"): ("the copy of q took the query (the row of q it reads) from threadIdx.x, the thread's column "
                   "along d_k: thread x copied query x of the block at column c0 + x, so every row of q's tile held "
                   "the same diagonal. The query a thread copies is its own, from threadIdx.y"),
    ("q", "column"): ("the copy of q took its column along d_k from threadIdx.y, the thread's query: row y of q's "
                      "tile held one element, q[i, c0 + y], in every column. The column comes from threadIdx.x"),
    ("k", "row"): ("the copy of k took the key (the row of k it reads) from threadIdx.x, the thread's column along "
                   "d_k: thread x copied key x of the block at column c0 + x, so every key of the tile held the same "
                   "diagonal. The key a thread copies is the block's first key plus threadIdx.y"),
    ("k", "column"): ("the copy of k took its column along d_k from threadIdx.y, the key's thread: key y of the tile "
                      "held one element, k[key, c0 + y], in every column. The column comes from threadIdx.x")}


_OUT_OF_BOUNDS = re.compile(r"out-of-bounds read ([qk])\[(\d+), (\d+), (\d+)\].*?block \((\d+), (\d+), (\d+)\) "
                            r"thread \((\d+), (\d+), (\d+)\)")


def _axis_slip_past_the_edge(error, q_shape, k_shape):
    """Diagnosed wrong_thread_axis when a read of q or k past its edge took its row or column from the
    other thread axis than the contract's copy (q's row: the block's query y, k's row: its key y, the
    column c0 + x in both), the thread's own index differing; None otherwise (the engine's
    out_of_bounds: a guard left out)."""
    found = _OUT_OF_BOUNDS.search(str(error))
    if found is None:
        return None
    array, (h, row, col, bx, by, bz, tx, ty, _) = found.group(1), [int(g) for g in found.groups()[1:]]
    tile = scores.TILE
    first_row = (by if array == "q" else bx) * tile
    if tx == ty or col % tile not in (tx, ty):
        return None
    if row == first_row + tx:
        slip = "row"
    elif row == first_row + ty and col % tile == ty:
        slip = "column"
    else:
        return None
    shape = q_shape if array == "q" else k_shape
    return Diagnosed("wrong_thread_axis", (
        f"thread ({tx}, {ty}, 0) of block ({bx}, {by}, {bz}) read {array}[{h}, {row}, {col}], outside {array} of "
        f"shape {shape}: " + _AXIS_SLIPS[array, slip]))


def _wrong_thread_axis(q, k, scale):
    """(code, scores, message) of the copies of q or k that take one index from the other thread axis."""
    for (array, slip), message in _AXIS_SLIPS.items():
        q_rows = _copied_along(q, slip) if array == "q" else _padded(q)
        k_rows = _copied_along(k, slip) if array == "k" else _padded(k)
        got = (q_rows @ np.swapaxes(k_rows, -1, -2))[:, :q.shape[1], :k.shape[1]] * scale
        yield "wrong_thread_axis", got, message


def _diagnose_tiled(got, expected, q, k, scale, traced):
    """edge_not_zeroed (a score summed a slot its step did not write), then the usual wrong formulas:
    missing_scale, scale_applied_twice, scale_ignored, tile_not_transposed, key_block_dropped,
    wrong_thread_axis and d_k_cut_short; None for any other wrong value."""
    tile = scores.TILE
    t_q, t_k = got.shape[-2:]
    stale = _read_before_refill(traced, t_q, t_k)
    if stale:
        return "edge_not_zeroed", (f"{stale}. Past an edge of q, k or d_k every slot a score sums must still be "
                                   "written in that step, with a value that adds nothing")
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    wrong = [("missing_scale", raw, "the scores are q.k without the scale: the contract has each element of q "
                                    "multiplied by inv_sqrt_dk as it is copied into its tile"),
             ("scale_applied_twice", raw * scale * scale, (
                 f"the scores came out multiplied by inv_sqrt_dk = {scale:g} twice (in both tiles, or on the copy "
                 "and again on the sum); the contract has it in the tile of q only"))]
    wrong += [(code, candidate * scale if code != "scale_ignored" else candidate, message)
              for code, candidate, message in scale_ignored(raw, scale, d_k)]
    wrong.append(("tile_not_transposed", _untransposed(q, k) * scale, (
        "the scores are those of a tile of k read with its row and column exchanged: thread x summed "
        "column x of the step from 16 keys, not the 16 columns of key x. Store k's element where the sum "
        "reads it (its key along the tile's columns), or read the tile as it was stored")))
    if t_k > tile:
        first_keys = k[:, np.arange(t_k) % tile]
        wrong.append(("key_block_dropped", reference.scores(q, first_keys, scale=False) * scale, (
            f"the scores of key j came out as those of key j mod {tile}: every block copied the first {tile} "
            "keys. The key a thread copies is the block's first key (blockIdx.x times 16) plus its row in "
            "the block")))
    wrong += list(_wrong_thread_axis(q, k, scale))
    for cut in range(tile, d_k, tile):
        wrong.append(("d_k_cut_short", reference.scores(q[..., :cut], k[..., :cut], scale=False) * scale, (
            f"the sums stopped after {cut} of d_k = {d_k} columns: the walk along d_k must take "
            f"ceil(d_k / {tile}) steps, with d_k read from the arrays, not fixed in the code")))
    for code, candidate, message in wrong:
        if np.allclose(got, candidate, rtol=1e-4, atol=1e-4):
            return code, message
    return None


def _barriers_why(case):
    """What 02_scores_tiled's barrier limit counts, for one case."""
    steps = ceil_div(case[3], scores.TILE)
    return (f"{steps} step{'s' if steps > 1 else ''} of {scores.TILE} along d_k = {case[3]}, two barriers each; "
            "every barrier more makes the whole block wait once more")


register(Exercise(
    exercise_id="02_scores_tiled",
    kind="kernel",
    run=_run_tiled,
    cases=_tiled_cases,
    describe_case=_describe_tiled,
    hint=("a block's 256 scores need only 16 rows of q and 16 rows of k: copy them into shared memory a slice "
          "of d_k at a time, each element by one thread, neighbouring threads on neighbouring addresses. Rows "
          "of k are read along d_k, yet a thread's sum walks down one key's row while its neighbours walk down "
          "the next keys' rows: choose where each element of k lands in its tile so that a warp's reads of "
          "the tile fall in different banks"),
    more_hints=(
        "the plan: step along d_k 16 columns at a time. Each thread copies one column of the step from one "
        "query row of its block, times the scale, and the same column from one key row of its block (the "
        "block's keys start at its x times 16), neighbouring threads along d_k in both. The key's element "
        "goes into its tile with row and column exchanged, so that the sum reads a row of that tile, and "
        "the tile's rows get a word or two of padding so that the exchanged stores of a warp fall in "
        "different banks. A slot past an edge of T_q, T_k or d_k gets a 0. Then a barrier, the 16 "
        "multiply-adds, and a second barrier before the next copy; after the last step, the guarded "
        "write of the sum",
        "where answers go wrong: the key a thread copies is not the key it scores (the copy takes the "
        "thread's y as the key, its x as the column); every thread copies and reaches both barriers, also "
        "those whose score lies past the edge of s; rows of 16 words put a warp's exchanged stores in 4 "
        "banks; the loop takes as many steps as the arrays' d_k needs, which may be 128; the scale is an "
        "argument, not computed from d_k"),
    rtol=1e-5,     # float32 sums of up to 128 products of standard normals, scaled by at most 1.5
    atol=1e-4,
    diagnose=_diagnose_tiled,
    diagnoses=("edge_not_zeroed", "missing_scale", "scale_applied_twice", "scale_ignored", "tile_not_transposed",
               "key_block_dropped", "d_k_cut_short", "scale_not_folded", "bank_conflict", "wrong_thread_axis"),
    # The sum reads a tile 16 times a step (one round); the copy stores into it once (two rounds, which
    # one word of padding gives).
    limits=(SharedBanks(reads=1, stores=2, why=("a tile the sum reads 16 times a step must be read in one round, and "
                                                "the copy into it in at most two. Lay the tile out (which index is "
                                                "its row, how many words a row holds) so that a warp's words fall "
                                                "in different banks")),
            MostLoads("q", lambda case: ceil_div(case[2], scores.TILE)),
            MostLoads("k", lambda case: ceil_div(case[1], scores.TILE)),
            NoSerialCopy("q"), NoSerialCopy("k"), NoSerialCopy("s", access="store"),
            Coalesced("q", COALESCED_SEGMENTS), Coalesced("k", COALESCED_SEGMENTS),
            Coalesced("s", COALESCED_SEGMENTS, access="store"),
            MostBarriers(lambda case: 2 * ceil_div(case[3], scores.TILE), why=_barriers_why),
            RefilledTiles()),
    solution=scores.scores_tiled_kernel,
    forbidden=(scores.scores, scores.launch_scores, scores.scores_kernel_v2, scores.tile_dot,
               scores.load_qk_tiles, scores.dot_qk_tiles),
))
