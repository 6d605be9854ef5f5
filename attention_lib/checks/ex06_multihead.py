"""Notebook 06's exercises: the head-split kernel (warm-up), then every head's scores read in place
from the fused projection, grouped-query attention and the causal tile skip included (main).

Warm-up, ``06_split_heads``: split_heads_kernel's signature ``(x, out)``, x (B, T, d_model) and out
(B, n_head, T, d_k) float32, out[b, h, t, c] = x[b, t, h*d_k + c], launched on the library's grid
(``multihead.head_grid``: x along c, y along t, z along b * n_head + h), at sizes around its
16 x 16 blocks. A split is a copy, so the values must be exact. Limits: every element of x read
once (``no_reuse``), every warp load of x coalesced (``uncoalesced``). Besides the engine's
diagnoses:

- ``heads_interleaved``: head h got columns h, h + n_head, h + 2 n_head, ... instead of the block
  h*d_k .. (h+1)*d_k - 1, the result of reshaping the model axis to (d_k, n_head) instead of
  (n_head, d_k) (``x.reshape(T, d_k, n_head)`` in NumPy, ``x[b, t, c * n_head + h]`` in a kernel);
- ``grid_layer_order``: a thread whose (c, t) lies inside the output indexed past x or out: the
  sequence or the head it decoded from the grid layer z is out of range.
(Which grid layer copies which (sequence, head) does not matter here: the output is indexed by
both, so any one-to-one reading of z is right.)

Main, ``06_qkv_scores``: qkv_scores_kernel's signature ``(qkv, n_head, n_kv_head, inv_sqrt_dk,
causal, s)``: s[b * n_head + h, i, j] = (Q_h[i] . K_g[j]) * inv_sqrt_dk with g = h // (n_head //
n_kv_head), -inf where causal and j > i, every head read in place from qkv (B, T, (n_head + 2
n_kv_head) d_k) = [Q heads | K heads | V heads], launched on scores.score_grid(B * n_head, T, T)
at T around the tile (1, 16, 17, 33). Limits: a block whose tile lies right of the diagonal reads
nothing of qkv (``skips_too_few``, ``SkipsMaskedTiles``); every element of qkv read at most
ceil(T / TILE) times per query head that reads it (``no_reuse``). Besides the engine's diagnoses
(and those of the causal mask and the scale):

- ``kv_head_not_shared``: query head h read K/V head h, as if every query head had its own;
- ``kv_head_interleaved``: query head h read K/V head h % n_kv_head (heads dealt out in turn);
- ``wrong_group``: query head h read K/V head h // n_kv_head (the group taken as n_kv_head, not
  n_head // n_kv_head), or a head count divided by a larger one (0, then a division by it);
- ``wrong_k_block``: K read from another block of columns: Q's (the n_head heads of Q not skipped)
  or V's;
- ``wrong_head_width``: d_k worked out from a wrong head count (3 n_head, or n_head, heads in qkv);
- ``view_past_the_end``: one head's view of qkv is narrower than the other (it starts too far right, or d_k
  came out too large), so tile_dot reads past it;
- ``grid_layer_order``: the grid layer z read as h * B + b (the scores land in another head's
  place), or decoded into a sequence past B.
"""

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks import cases as sizes
from attention_lib.checks.engine import Diagnosed, Exercise, output_array, read_output, register
from attention_lib.checks.limits import Coalesced, MostLoads
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import multihead, scores


class Case(NamedTuple):
    """One size tried: x (B, T, n_head * d_k) split into n_head heads of width d_k."""

    B: int
    T: int
    n_head: int
    d_k: int

    def __str__(self):
        return f"(B {self.B}, T {self.T}, n_head {self.n_head}, d_k {self.d_k})"


def _guarded_input(array, guard):
    """A device copy of `array` followed by `guard` zeros, and the view of its first array.size
    entries: an unguarded read just past the end stays inside the allocation on a GPU."""
    full = cuda.to_device(np.concatenate([array.ravel(), np.zeros(guard, np.float32)]))
    return full[:array.size].reshape(array.shape)


_OUT_OF_BOUNDS = re.compile(r"out-of-bounds (read|write) (\w+)\[([-\d, ]*)\].*?block \((\d+), (\d+), (\d+)\) "
                            r"thread \((\d+), (\d+), (\d+)\)")


def _out_of_bounds(error):
    """(kind, array, index, block, thread) of the sanitizer's out-of-bounds message, or None."""
    found = _OUT_OF_BOUNDS.search(str(error))
    if found is None:
        return None
    numbers = [tuple(int(x) for x in found.group(3).split(",") if x.strip())]
    numbers += [tuple(int(found.group(g)) for g in group) for group in ((4, 5, 6), (7, 8, 9))]
    return (found.group(1), found.group(2), *numbers)


def _layer_out_of_range(error, inside):
    """Diagnosed grid_layer_order when the out-of-bounds access came from a thread whose own
    position (grid x, grid y) lies inside the output (inside(x, y) is True): only what it decoded
    from the grid layer z can have left the array. None otherwise (a missing guard: the engine's)."""
    parsed = _out_of_bounds(error)
    if parsed is None:
        return None
    kind, array, index, block, thread = parsed
    x, y = block[0] * 16 + thread[0], block[1] * 16 + thread[1]
    if not inside(x, y):
        return None
    return Diagnosed("grid_layer_order", (
        f"the thread at grid x {x}, y {y} of grid layer z {block[2]} lies inside the output, yet it "
        f"{'read' if kind == 'read' else 'wrote'} {array}{list(index)}, outside {array}: the sequence or the head "
        "it decoded from z is out of range; the launch numbers the layers z = b * n_head + h, b < B, h < n_head"))


def _run_split(kernel, case, rng, launch):
    B, T, n_head, d_k = case
    d_model = n_head * d_k
    x = rng.standard_normal((B, T, d_model)).astype(np.float32)
    tx, ty = multihead.BLOCK
    # Guard zones behind the input and the output: an unguarded thread of the last block reaches
    # fewer than ty rows (of d_model in x, of d_k in out) plus tx columns past the end. On a GPU
    # the reads stay inside the allocation and the writes are caught; on the simulator the index
    # is caught first.
    d_x = _guarded_input(x, ty * (d_model + 1) + tx)               # (B, T, d_model)
    full, out = output_array((B, n_head, T, d_k), guard=ty * (d_k + 1) + tx)
    grid, block = multihead.head_grid(B * n_head, T, d_k)
    try:
        launch(kernel, grid, block, d_x, out)
    except IndexError as error:
        raise _layer_out_of_range(error, lambda c, t: c < d_k and t < T) or error from None
    return read_output(full, out), reference.split_heads(x, n_head), x, n_head


def _diagnose_split(got, expected, x, n_head):
    """Name the interleaved split; None for any other mistake (the engine shows where)."""
    B, T, d_model = x.shape
    d_k = d_model // n_head
    interleaved = x.reshape(B, T, d_k, n_head).transpose(0, 3, 1, 2)   # head h: columns h, h + n_head, ...
    if np.array_equal(got, interleaved):
        return "heads_interleaved", (
            f"head h got columns h, h + {n_head}, h + {2 * n_head}, ... (every n_head-th column); "
            f"a head is a contiguous block: head h holds the h-th run of d_k = {d_k} columns "
            "(the model axis is (n_head, d_k), not (d_k, n_head))")
    return None


def _split_cases():
    """One element; then T and d_k around the 16 x 16 block (a partial block down and across, one
    exactly full, two across), several heads (an interleaved split differs), a batch of 2."""
    tile = multihead.BLOCK[0]
    t_short, t_full, t_over = sizes.around(tile)
    return [Case(1, 1, 1, 1), Case(1, 7, 3, 5), Case(2, t_over, 4, 6), Case(1, t_full, 2, t_over + 3),
            Case(2, t_short, 3, t_full)]


register(Exercise(
    exercise_id="06_split_heads",
    title="out[b, h, t, c] = x[b, t, h*d_k + c], one thread per element, all heads in one launch",
    kind="kernel",
    run=_run_split,
    cases=_split_cases(),
    hint=("one thread per output element: the grid's x and y cover a head's components and positions, its "
          "z axis every (sequence, head) pair; head h owns the h-th run of d_k consecutive columns of x"),
    more_hints=("the plan: the thread's component and position come from the grid's x and y, its sequence and "
                "head from the layer number (a quotient and a remainder by the head count); its column of x "
                "is the head's first column plus its component; threads of the edge blocks that fall past "
                "the output do nothing. Where answers go wrong: a head's columns taken one every n_head (the "
                "wrong reshape order), and a layer split into a sequence and a head that leave their ranges",),
    rtol=0.0,   # a split moves values, it computes none: every entry must be exact
    atol=0.0,
    diagnose=_diagnose_split,
    diagnoses=("heads_interleaved", "grid_layer_order"),
    # Each element of x is copied once, and the 16 threads of a block row (half a warp) read 16
    # consecutive floats: a warp's load of two rows touches at most 4 segments of 128 bytes (each
    # row may straddle a boundary, as a head's columns start anywhere).
    limits=(MostLoads("x", 1, why="a copy reads each element once"), Coalesced("x", 4)),
    solution=multihead.split_heads_kernel,
    forbidden=(multihead.split_heads, multihead.launch_heads),
))


# --- The main exercise: every head's scores, read in place from the fused projection ---------------

class ScoreCase(NamedTuple):
    """One size tried: qkv (B, T, (n_head + 2 n_kv_head) d_k); causal or not."""

    B: int
    T: int
    n_head: int
    n_kv_head: int
    d_k: int
    causal: bool

    def __str__(self):
        return (f"(B {self.B}, T {self.T}, n_head {self.n_head}, n_kv_head {self.n_kv_head}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'})")


@dataclass
class SkipsMaskedTiles:
    """Causal: no block whose tile lies right of the diagonal (every key after every query) reads
    an element of `array`; such a block stores -inf and leaves. Measured on the traced launch."""

    array: str = "qkv"
    code: str = "skips_too_few"

    def broken(self, traces, case, compiled):
        if not case.causal:
            return None
        for traced in traces:
            if self.array not in traced.arrays():
                continue
            blocks = {block for _, _, (block, _), *_ in traced.launch.targets[self.array].trace if block[0] > block[1]}
            if blocks:
                return (f"the values are right, but {len(blocks)} blocks whose tile lies right of the diagonal (every "
                        f"key after every query: all -inf) read {self.array}, first block {sorted(blocks)[0]}; such a "
                        "block has no score to compute")
        return None


def _emulated_scores(qkv, n_head, n_kv_head, scale, causal, d_k, q_col, k_col, layer=None):
    """Scores as a kernel computes them that takes head h's Q columns at q_col(h) and its K columns at
    k_col(h), d_k wide (both views as NumPy slices them, cut at qkv's last column), float64
    (B * n_head, T, T); None when the K view is narrower than the Q view (tile_dot would read past
    it). layer(z, B) -> (b, h), default z = b * n_head + h."""
    B, T, _ = qkv.shape
    out = np.empty((B * n_head, T, T))
    for z in range(B * n_head):
        b, h = layer(z, B) if layer else divmod(z, n_head)
        q = qkv[b, :, q_col(h):q_col(h) + d_k].astype(np.float64)
        k = qkv[b, :, k_col(h):k_col(h) + d_k].astype(np.float64)
        if k.shape[1] < q.shape[1]:
            return None
        out[z] = q @ k[:, :q.shape[1]].T * scale
    return np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, out) if causal else out


def _head_candidates(n_head, n_kv_head, width):
    """(code, message, d_k, q_col, k_col, layer): the layouts the usual mistakes read."""
    d_k, group = width // (n_head + 2 * n_kv_head), n_head // n_kv_head
    right_q = lambda h, d=d_k: h * d                                        # noqa: E731
    right_k = lambda h, d=d_k: (n_head + h // group) * d                    # noqa: E731
    shared = ("query head h read K/V head h, as if every query head had its own; with grouped-query "
              f"attention the {n_head} query heads share {n_kv_head} K/V heads in groups of {group}")
    out = [("kv_head_not_shared", shared, d_k, right_q, lambda h: (n_head + h) * d_k, None),
           ("kv_head_interleaved", f"query head h read K/V head h % n_kv_head: the heads dealt out in turn; a K/V "
            f"head serves {group} neighbouring query heads, the group h // {group}", d_k, right_q,
            lambda h: (n_head + h % n_kv_head) * d_k, None),
           ("wrong_group", f"query head h read K/V head h // n_kv_head = h // {n_kv_head}: the group, the number of "
            f"query heads that share one K/V head, is n_head // n_kv_head = {group}", d_k, right_q,
            lambda h: (n_head + h // n_kv_head) * d_k, None),
           ("wrong_k_block", "K was read inside Q's columns: in qkv the K heads start after the "
            f"n_head = {n_head} heads of Q", d_k, right_q, lambda h: (h // group) * d_k, None),
           ("wrong_k_block", "K was read from the query head's own columns: in qkv the K heads start "
            f"after the n_head = {n_head} heads of Q", d_k, right_q, right_q, None),
           ("wrong_k_block", f"K was read from V's columns: in qkv the n_kv_head = {n_kv_head} heads of K come "
            f"right after Q's {n_head}, then V's", d_k, right_q, lambda h: (n_head + n_kv_head + h // group) * d_k,
            None)]
    for heads in (3 * n_head, n_head):
        d = width // heads
        if d != d_k and d > 0:
            out.append(("wrong_head_width", f"the head width came out as {d}, not {d_k}: qkv holds n_head + "
                        f"2 n_kv_head = {n_head + 2 * n_kv_head} heads of d_k side by side, not {heads}",
                        d, lambda h, d=d: h * d, lambda h, d=d: (n_head + h // group) * d, None))
    out.append(("grid_layer_order", "the grid layer z was read as h * B + b: the launch numbers the layers "
                "sequence by sequence, z = b * n_head + h", d_k, right_q, right_k, lambda z, B: (z % B, z // B)))
    return out


def _run_qkv_scores(kernel, case, rng, launch):
    B, T, n_head, n_kv_head, d_k, causal = case
    width = (n_head + 2 * n_kv_head) * d_k
    qkv = rng.standard_normal((B, T, width)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(d_k))
    tile = scores.TILE
    d_qkv = _guarded_input(qkv, tile * (width + 1) + width)      # a read past a view stays in memory
    full, s = output_array((B * n_head, T, T), guard=tile * (T + 1) + tile)
    grid, block = scores.score_grid(B * n_head, T, T)
    expected = _emulated_scores(qkv, n_head, n_kv_head, scale, causal, d_k, lambda h: h * d_k,
                                lambda h: (n_head + h // (n_head // n_kv_head)) * d_k)
    try:
        launch(kernel, grid, block, d_qkv, n_head, n_kv_head, scale, causal, s)
    except ZeroDivisionError:
        raise Diagnosed("wrong_group", (
            "a division by zero: a head count divided by a larger one is 0 in integer arithmetic; the group, "
            f"the query heads per K/V head, is n_head // n_kv_head = {n_head // n_kv_head}")) from None
    except IndexError as error:
        layer = _layer_out_of_range(error, lambda j, i: i < T and j < T)
        parsed = _out_of_bounds(error)
        if parsed is None or parsed[1] != "qkv":
            raise layer or error from None            # the scores' own guard: the engine says so
        if parsed[2][:1] and parsed[2][0] >= B:
            raise layer or Diagnosed("grid_layer_order", (
                f"qkv was read at sequence {parsed[2][0]}, past the batch of {B}: the launch numbers the layers "
                "z = b * n_head + h, b < B, h < n_head")) from None
        # Not a missing guard: a view of qkv is narrower than the other (it starts too far right,
        # or the head width is too large), and tile_dot reads the Q view's width from both.
        raise Diagnosed("view_past_the_end", (
            f"a head's view of qkv has fewer columns than the other: it starts too close to the last of qkv's "
            f"{width} columns, or d_k came out too large; qkv holds Q's {n_head} heads, then K's {n_kv_head}, then "
            f"V's {n_kv_head}, each d_k = {d_k} wide, and K/V head g of n_kv_head starts after Q's")) from None
    return read_output(full, s), expected, qkv, case


def _diagnose_qkv_scores(got, expected, qkv, case):
    B, T, n_head, n_kv_head, d_k, causal = case
    scale = 1 / math.sqrt(d_k)
    close = dict(rtol=1e-4, atol=1e-4, equal_nan=True)
    for code, message, d, q_col, k_col, layer in _head_candidates(n_head, n_kv_head, qkv.shape[2]):
        candidate = _emulated_scores(qkv, n_head, n_kv_head, scale, causal, d, q_col, k_col, layer)
        if candidate is not None and np.allclose(got, candidate, **close):
            return code, message
    visible = np.isfinite(expected)
    for factor, code, message in ((math.sqrt(d_k), "missing_scale", f"the scores were not multiplied by "
                                   f"inv_sqrt_dk = 1/sqrt({d_k})"),
                                  (1 / math.sqrt(d_k), "scaled_by_d_k", "the scores were multiplied by "
                                   "inv_sqrt_dk twice: divided by d_k, not by sqrt(d_k)")):
        if np.allclose(got[visible], expected[visible] * factor, rtol=1e-4, atol=1e-4):
            return code, message
    if causal:
        raw = _emulated_scores(qkv, n_head, n_kv_head, scale, False, d_k, lambda h: h * d_k,
                               lambda h: (n_head + h // (n_head // n_kv_head)) * d_k)
        i, j = np.indices((T, T))
        tile = scores.TILE
        skipped = j // tile > i // tile                  # the tiles right of the diagonal
        for masked, code, message in ((skipped, "mask_not_applied", "inside the tiles on the diagonal the "
                                       "scores with j > i were kept: when causal, key j after query i gets -inf"),
                                      (skipped | (j >= i), "mask_includes_diagonal", "the score of a position "
                                       "with itself (j = i) was masked too: only keys after the query are")):
            if np.allclose(got, np.where(masked, -np.inf, raw), **close):
                return code, message
    return None


def _score_cases():
    """One score; T around the tile (one full tile, one past it, three tiles with a partial last:
    tiles right of the diagonal skipped), a batch of 2; grouped-query attention in groups of 2 and 3
    (a group other than n_kv_head), multi-query attention, no sharing and no mask; heads of 20, two
    steps of tile_dot along d_k. Small: every case is race-checked."""
    tile = scores.TILE
    _, full, over = sizes.around(tile)
    return [ScoreCase(1, 1, 1, 1, 1, True), ScoreCase(2, 7, 4, 2, 5, True), ScoreCase(1, over, 2, 2, 6, False),
            ScoreCase(1, full, 2, 1, 3, True), ScoreCase(1, 2 * tile + 1, 1, 1, 2, True),
            ScoreCase(1, 5, 6, 2, 3, True), ScoreCase(1, 9, 3, 1, 20, True)]


def _most_qkv_loads(case):
    """Q's elements are read once per tile of keys, K's once per tile of queries by each of the group's
    query heads: at most group * ceil(T / TILE) times."""
    return case.n_head // case.n_kv_head * ceil_div(case.T, scores.TILE)


register(Exercise(
    exercise_id="06_qkv_scores",
    title="every head's scores read in place from the fused projection, query head h with K/V head h // group",
    kind="kernel",
    run=_run_qkv_scores,
    cases=_score_cases(),
    hint=("a head is a run of d_k columns of qkv; take the query head's run and its K/V head's run as views "
          "(no copy) and hand them to the tiled dot product, with the sequence as its leading index; a block "
          "whose whole tile lies after the diagonal has nothing to compute (notebook 03's block-wide exit)"),
    more_hints=("the plan: first the block-wide exit, decided from the block's own position only (its column of "
                "tiles right of its row of tiles), where the block stores minus infinity and leaves; then the "
                "sequence and the head from the layer number, the head width from qkv's width and the head "
                "count n_head plus twice n_kv_head, the first column of the query head and of its K/V head "
                "(after all of Q's heads, the group being n_head over n_kv_head), the two views, the tiled dot "
                "product in every thread, and a guarded store of the scaled score or minus infinity. Where "
                "answers go wrong: each query head given its own K/V head, heads dealt out in turn instead of "
                "in groups of neighbours, and K's heads placed before Q's",),
    rtol=1e-4,  # float32 dot products of up to 20 terms against float64, scores of order 1
    atol=1e-4,
    diagnose=_diagnose_qkv_scores,
    diagnoses=("kv_head_not_shared", "kv_head_interleaved", "wrong_group", "wrong_k_block", "wrong_head_width",
               "view_past_the_end", "grid_layer_order", "missing_scale", "scaled_by_d_k", "mask_not_applied",
               "mask_includes_diagonal", "skips_too_few"),
    limits=(SkipsMaskedTiles(), MostLoads("qkv", _most_qkv_loads, why="tile_dot stages each tile in shared "
                                          "memory once per block, and the block's threads share it")),
    solution=multihead.qkv_scores_kernel,
    forbidden=(multihead.launch_layer, multihead.multi_head_attention, multihead.split_heads,
               multihead.split_heads_kernel, scores.scores_kernel_v2),
))
