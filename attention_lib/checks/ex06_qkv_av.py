"""``06_qkv_av`` (notebook 06, main): a kernel with qkv_av_kernel's signature ``(a, qkv, n_head,
n_kv_head, causal, out)`` that writes every head's weighted sum out[b, i, h * d_k + c] = sum_j
a[b * n_head + h, i, j] V_g[j, c], V_g (g = h // (n_head // n_kv_head)) read in place from the fused
projection qkv = [Q heads | K heads | V heads], the heads merged, grouped-query heads and the causal
tile skip included, on multihead.qkv_av_grid (the block numbers the kernel's to map to tiles). Its
solution is ``multihead.qkv_av_kernel``; its cases, limits and named mistakes are declared in the
Exercise below.
"""

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks import cases as sizes
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.ex06_split_heads import guarded_input
from attention_lib.checks.launch import output_array, read_output, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import (Coalesced, MostBarriers, MostLoads, NoSerialCopy, RefilledTiles, SharedBanks,
                                         StoredOnce)
from attention_lib.measure import sanitizer
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import multihead, weighted_sum
from attention_lib.stages.projection import tile_matmul

TILE = multihead.TILE


class AvCase(NamedTuple):
    """One size tried: a (B * n_head, T, T) weights, qkv (B, T, (n_head + 2 n_kv_head) d_k); causal or not."""

    B: int
    T: int
    n_head: int
    n_kv_head: int
    d_k: int
    causal: bool

    def __str__(self):
        return (f"(B {self.B}, T {self.T}, n_head {self.n_head}, n_kv_head {self.n_kv_head}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'})")


def _av_cases():
    """From TILE: a batch of 2 with 7 positions, heads of 5 in groups of 2 (an index slip shows at once);
    T one past a tile, a tile exactly and one short, with d_k 6, a whole tile and one past, in groups
    of 2 (6 heads on 3: a group other than n_kv_head), 3 (multi-query) and 1; not causal over two key
    tiles (a kernel that stops at the diagonal whatever `causal` says); three query tiles, tiles above
    the diagonal; the model's head width, 64, at T 9; heads of 128 at T 4. Small: every case is
    traced."""
    _, full, over = sizes.around(TILE)
    return [AvCase(2, 7, 4, 2, 5, True), AvCase(1, over, 6, 3, 6, True), AvCase(1, full, 3, 1, full, True),
            AvCase(1, full - 1, 3, 3, over, False), AvCase(1, over, 2, 2, 7, False),
            AvCase(1, 2 * TILE + 1, 2, 1, 5, True),
            AvCase(1, 9, 2, 1, 64, True), AvCase(1, 4, 1, 1, 128, False)]


def _emulated_av(a, qkv, case, d, v_head, out_col=None, layer=None):
    """What a kernel writes that takes head width d, reads query head h's V from columns v_head(h) * d
    onwards and writes its component c at out_col(h, c, d) (default h * d + c); layer(z, B) -> (b, h),
    default z = b * n_head + h. float64 (B, T, n_head * d_k), NaN where nothing is written; None where
    such a kernel would index past qkv or out."""
    B, T, n_head, _, d_k, _ = case
    width_out = n_head * d_k
    out = np.full((B, T, width_out), np.nan)
    for z in range(B * n_head):
        b, h = layer(z, B) if layer else divmod(z, n_head)
        start = v_head(h) * d
        if not 0 <= b < B or start < 0 or start + d > qkv.shape[2]:
            return None
        cols = [out_col(h, c, d) if out_col else h * d + c for c in range(d)]
        if max(cols) >= width_out:
            return None
        out[b][:, cols] = a[z].astype(np.float64) @ qkv[b, :, start:start + d].astype(np.float64)
    return out


def _band_cut(a):
    """The weights a kernel uses that stops each block of queries before its own key tile."""
    i, j = np.indices(a.shape[1:])
    return np.where(j < i // TILE * TILE, a, np.float32(0))


def _av_candidates(a, qkv, case):
    """(code, message, what such a kernel writes) of the usual mistakes."""
    B, T, n_head, n_kv_head, d_k, causal = case
    group, width = n_head // n_kv_head, qkv.shape[2]
    v_first = n_head + n_kv_head                         # V's heads follow Q's and K's
    right = lambda h: v_first + h // group                # noqa: E731
    found = [("heads_interleaved", f"head h's component c was written at column c * n_head + h of out: a head is a "
              f"contiguous run of d_k = {d_k} columns, so it goes at h * d_k + c", d_k, right,
              lambda h, c, d: c * n_head + h, None),
             ("kv_head_interleaved", f"query head h read V head h % n_kv_head: the heads dealt out in turn; a V head "
              f"serves {group} neighbouring query heads, the group h // {group}", d_k,
              lambda h: v_first + h % n_kv_head, None, None),
             ("wrong_group", f"query head h read V head h // n_kv_head = h // {n_kv_head}: the group, the query heads "
              f"that share one V head, is n_head // n_kv_head = {group}", d_k, lambda h: v_first + h // n_kv_head,
              None, None),
             ("wrong_v_block", f"V was read from K's columns: in qkv the n_kv_head = {n_kv_head} heads of V come after "
              f"Q's {n_head} and K's {n_kv_head}", d_k, lambda h: n_head + h // group, None, None),
             ("wrong_v_block", f"V was read from the query head's own columns: in qkv V's heads start after Q's "
              f"{n_head} and K's {n_kv_head}", d_k, lambda h: h, None, None)]
    for heads in (3 * n_head, n_head):
        d = width // heads
        if d not in (d_k, 0):
            found.append(("wrong_head_width", f"the head width came out as {d}, not {d_k}: qkv holds n_head + "
                          f"2 n_kv_head = {n_head + 2 * n_kv_head} heads of d_k side by side, not {heads}", d,
                          right, None, None))
    found.append(("grid_layer_order", "a's head z was split into sequence z % B and head z // B: a's heads "
                  "run sequence by sequence, z = b * n_head + h", d_k, right, None, lambda z, B: (z % B, z // B)))
    for code, message, d, v_head, out_col, layer in found:
        yield code, message, _emulated_av(a, qkv, case, d, v_head, out_col, layer)
    if causal:
        yield ("diagonal_tile_skipped", "each block stopped before the key tile that holds its own queries: that "
               "tile holds each query's nearest keys, itself included, whose weights are not zero",
               _emulated_av(_band_cut(a), qkv, case, d_k, right))


def _named_mistake(got, expected, a, qkv, case):
    """Diagnosed for the first usual mistake whose output got matches (the entries it writes, and none
    other written), or None."""
    written = ~unwritten(got)
    for code, message, candidate in _av_candidates(a, qkv, case):
        if candidate is None:
            continue
        reached = ~np.isnan(candidate)
        if np.allclose(candidate[reached], expected[reached], rtol=1e-5, atol=1e-5) and reached.all():
            continue                                      # the mistake changes nothing in this case
        if (written == reached).all() and np.allclose(got[reached], candidate[reached], rtol=1e-5, atol=1e-5):
            return Diagnosed(code, message)
    return None


_SHAPE = re.compile(r"out-of-bounds read qkv\[([-\d, ]*)\].*?has shape \(([\d, ]*)\)")


def _qkv_index_error(error, case):
    """Diagnosed for a read of qkv past its end: a sequence past B, a view of V narrower than d_k (it
    starts too far right), a column past qkv's width; None otherwise (the engine's out_of_bounds)."""
    found = _SHAPE.search(str(error))
    if found is None:
        return None
    index = [int(i) for i in found.group(1).split(",") if i.strip()]
    shape = [int(n) for n in found.group(2).split(",") if n.strip()]
    if len(shape) == 3 and index and index[0] >= case.B:
        return Diagnosed("grid_layer_order", f"qkv was read at sequence {index[0]}, past the batch of {case.B}: "
                         "the sequence your kernel decodes from its block number is out of range")
    narrow = len(shape) == 2 and shape[-1] < case.d_k
    if narrow or (len(shape) == 3 and len(index) == 3 and index[2] >= shape[2]):
        seen = f"the view of V has {shape[-1]} columns, fewer than d_k = {case.d_k}" if narrow else (
            f"qkv was read at column {index[2]}, past its last, {shape[2] - 1}")
        return Diagnosed("view_past_the_end", (
            f"{seen}: qkv holds Q's {case.n_head} heads, then K's {case.n_kv_head}, then V's {case.n_kv_head}, "
            f"each d_k = {case.d_k} wide (work d_k out from qkv's width, not a constant), and query head h reads "
            "V head h // (n_head // n_kv_head), shared by its group; a thread whose column lies past d_k reads "
            "nothing"))
    return None


def _assumes_mha(kernel, launch):
    """Whether the kernel's query head 0 reads its V from column 2 n_head d_k, where V would start if
    there were n_head K heads. Probed at 2 query heads on 1 K/V head of width 1, with qkv 3 columns
    wider than its 4 heads: the columns where such a kernel looks exist, and qkv's width // 4 is still
    d_k = 1. False when the probe raises or reads elsewhere."""
    T, n_head, n_kv_head = 7, 2, 1
    rng = np.random.default_rng(6)
    qkv = rng.standard_normal((1, T, 7)).astype(np.float32)
    a = reference.softmax(rng.standard_normal((n_head, T, T))).astype(np.float32)
    full, out = output_array((1, T, n_head), guard=TILE * (n_head + 1))
    try:
        launch(kernel, *multihead.qkv_av_grid(1, T, n_head, 1), cuda.to_device(a), cuda.to_device(qkv), n_head,
               n_kv_head, False, out)
        got = read_output(full, out)
    except Exception:  # noqa: BLE001  (the probe only names a mistake; the case's own verdict stands)
        return False
    head_0 = got[0, :, 0].astype(np.float64)
    return bool(np.allclose(head_0, a[0].astype(np.float64) @ qkv[0, :, 2 * n_head], rtol=1e-5, atol=1e-5))


def _qkv_width(case):
    return (case.n_head + 2 * case.n_kv_head) * case.d_k


def _wasted_tile_loads(traced, case):
    """(block, loads) of the first block that loaded weights or values of a key tile wholly after its last
    query (the last query it stores an output of), or None."""
    B, T, n_head, _, d_k, _ = case
    last, loaded = {}, {}
    targets = traced.launch.targets
    for element, kind, (block, _), *_ in targets["out"].trace:
        if kind == sanitizer.STORE:
            last[block] = max(last.get(block, -1), element // (n_head * d_k) % T)
    for name, row_of in (("a", lambda e: e % T), ("qkv", lambda e: e // _qkv_width(case) % T)):
        for element, kind, (block, _), *_ in targets[name].trace:
            if kind == sanitizer.LOAD:
                loaded.setdefault(block, []).append(row_of(element))
    for block in sorted(loaded):
        # the first key of the tiles after the one that holds the block's last query
        first_after = ceil_div(last.get(block, -1) + 1, TILE) * TILE
        wasted = sum(1 for j in loaded[block] if j >= first_after)
        if wasted:
            return block, wasted
    return None


def _run_qkv_av(kernel, case, rng, launch):
    B, T, n_head, n_kv_head, d_k, causal = case
    qkv = rng.standard_normal((B, T, _qkv_width(case))).astype(np.float32)
    s = rng.standard_normal((B * n_head, T, T))
    a = reference.softmax(reference.apply_causal_mask(s) if causal else s).astype(np.float32)
    grid, block = multihead.qkv_av_grid(B, T, n_head, d_k)
    d_a = guarded_input(a, TILE * (T + 1))
    d_qkv = guarded_input(qkv, TILE * (_qkv_width(case) + 1))
    full, out = output_array((B, T, n_head * d_k), guard=TILE * (n_head * d_k + 1))
    expected = _emulated_av(a, qkv, case, d_k, lambda h: n_head + n_kv_head + h // (n_head // n_kv_head))
    try:
        traced = launch(kernel, grid, block, d_a, d_qkv, n_head, n_kv_head, causal, out)
    except ZeroDivisionError:
        raise Diagnosed("wrong_group", (
            "a division by zero: a head count divided by a larger one is 0 in integer arithmetic; the group, "
            f"the query heads per V head, is n_head // n_kv_head = {n_head // n_kv_head}")) from None
    except IndexError as error:
        named = _qkv_index_error(error, case)
        if named is not None and named.code == "view_past_the_end" and n_kv_head < n_head \
                and _assumes_mha(kernel, launch):
            named = Diagnosed("v_offset_assumes_mha", (
                f"query head 0 read V from column 2 n_head d_k = {2 * n_head * d_k} on, as if qkv held "
                f"{n_head} K heads and {n_head} V heads; it holds Q's {n_head} heads, then K's {n_kv_head}, "
                f"then V's {n_kv_head}, so V starts at column (n_head + n_kv_head) d_k = "
                f"{(n_head + n_kv_head) * d_k}"))
        raise named or error from None
    got = read_output(full, out)
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        named = _named_mistake(got, expected, a, qkv, case)
        if named:
            raise named
    elif causal and traced is not None:
        wasted = _wasted_tile_loads(traced, case)
        if wasted:
            raise Diagnosed("no_tiles_skipped", (
                f"the values are right, but block {wasted[0]} made {wasted[1]} loads of weights or values in key "
                "tiles that lie wholly after its last query (all weights 0 there): stop a block's walk along the "
                "keys after the tile that holds its last query"))
    return got, expected


def _most_qkv_loads(case):
    """V's elements are read once per tile of queries by each query head of the group."""
    return case.n_head // case.n_kv_head * ceil_div(case.T, TILE)


_QKV_LOADS = MostLoads("qkv", _most_qkv_loads, why="a tile of values in shared memory serves all of a block's "
                       "queries, for each query head that reads that V head")


@dataclass
class WholeTiles:
    """A limit measured only on the cases whose heads are whole tiles wide: in a narrower head a warp's
    lanes past d_k load nothing, which NoSerialCopy would count as lanes left waiting."""

    limit: object

    @property
    def code(self):
        return self.limit.code

    def broken(self, traces, case, compiled):
        if case.d_k % TILE:
            return None
        broken = self.limit.broken(traces, case, compiled)
        return (self.code, broken) if broken and not isinstance(broken, tuple) else broken


@dataclass
class OneHeadOfV:
    """A block's loads of qkv stay within one head's d_k columns. Checked where the reads of qkv break
    their limit `loads`, so that a column guard on qkv's width alone is named before no_reuse."""

    loads: MostLoads
    code: str = "reads_next_head"

    def broken(self, traces, case, compiled):
        if not self.loads.broken(traces, case, compiled):
            return None
        width = _qkv_width(case)
        for traced in (t for t in traces if "qkv" in t.arrays()):
            heads = {}
            for element, kind, (block, _), *_ in traced.launch.targets["qkv"].trace:
                if kind == sanitizer.LOAD:
                    heads.setdefault(block, set()).add(element % width // case.d_k)
            for block, seen in sorted(heads.items()):
                if len(seen) > 1:
                    first = min(seen)
                    return (f"the values are right, but block {block} loaded the columns of heads {first} and "
                            f"{first + 1} of qkv: its threads whose column lies past the head's d_k = {case.d_k} "
                            "columns read the next head's values, which no output of the block needs. Those loads "
                            "repeat what the next head's blocks read, so qkv is read more often than its limit")
        return None


@dataclass
class OneWholeTile:
    """A limit measured only on the cases of one whole tile of queries and of columns (T and d_k both
    TILE): a shared tile's shape is a constant of the kernel, so its layout is the same in every case,
    and there every lane of every warp reads the tiles. Counting a warp's words in each bank on every
    case would add about two thirds to the check's time and find nothing more."""

    limit: object

    @property
    def code(self):
        return self.limit.code

    def broken(self, traces, case, compiled):
        if (case.T, case.d_k) != (TILE, TILE):
            return None
        broken = self.limit.broken(traces, case, compiled)
        return (self.code, broken) if broken and not isinstance(broken, tuple) else broken


def _steps_why(case):
    tiles = ceil_div(case.T, TILE)
    return (f"two a step, and the last row of query tiles sees {tiles} key tile{'s' if tiles != 1 else ''}: a step "
            "past the block's last visible key loads nothing and still waits twice")


register(Exercise(
    exercise_id="06_qkv_av",
    kind="kernel",
    run=_run_qkv_av,
    cases=_av_cases(),
    hint=("a block can share what it loads: a tile of weights serves all of a block's columns, a tile of "
          "values all its queries. A head of V is a run of d_k columns of qkv, so a view of those columns is "
          "a (T, d_k) matrix with no copy. In the merged output, head h's columns sit side by side with the "
          "other heads' in each row"),
    more_hints=("the plan: split the block number, by quotients and remainders, into a tile of the head's "
                "columns, a tile of queries and a head of the weights, itself a sequence and a head. Work out "
                "the head width from qkv's width and the head counts, then the first column of the V head that "
                "the query head reads (after all of Q's and K's heads). Walk the keys a tile at a time: every "
                "thread copies one weight and one value into the shared tiles, zero past an edge; the block "
                "waits; each thread adds a tile's worth of products; the block waits again. When causal, the "
                "walk ends with the key tile that holds the block's last query, the same stop for all its threads",
                "where answers go wrong: a stop worked out from each thread's own query (threads then take "
                "different numbers of steps between barriers); stopping before the tile on the diagonal; a "
                "tile not zeroed past an edge; V's heads placed before K's, or a query head given its own V "
                "head instead of its group's; the head's output written every n_head columns instead of as a "
                "run of d_k; the output stored at every step of the walk instead of once after it; a tile of "
                "values that holds a column per row in rows of 16 words, so a warp's 16 columns of one key meet "
                "in two banks"),
    # float32 sums of at most 33 products of order 1 against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnoses=("no_tiles_skipped", "diagonal_tile_skipped", "heads_interleaved", "kv_head_interleaved", "wrong_group",
               "wrong_v_block", "wrong_head_width", "view_past_the_end", "v_offset_assumes_mha",
               "reads_next_head", "grid_layer_order", "output_rewritten", "bank_conflict"),
    limits=(MostLoads("a", lambda case: ceil_div(case.d_k, TILE), why="a tile of weights in shared memory serves "
                      "all of a block's columns"),
            OneHeadOfV(_QKV_LOADS), _QKV_LOADS,
            NoSerialCopy("a"), WholeTiles(NoSerialCopy("qkv")), NoSerialCopy("out", access="store"),
            Coalesced("a", 4), Coalesced("qkv", 4), Coalesced("out", 4, access="store"),
            RefilledTiles(), MostBarriers(lambda case: 2 * ceil_div(case.T, TILE), why=_steps_why),
            # A thread owns one output: its sum is done after the last key tile, so it stores it once.
            StoredOnce("out", why="a thread's output is done after its last key tile: store it once, after the walk"),
            # Reads only: the contract limits no store (stores=32: a warp's 32 lanes cannot put more words
            # than that in one bank).
            # A right answer stores out along threadIdx.x (else uncoalesced), so at each key a warp (two
            # rows of 16 threads) reads the values of 16 columns of one key and one weight of each of its
            # two queries: rows of 16 words put both in different banks. A value tile with the key along
            # its rows in rows of 16 words puts the 16 columns 16 words apart: 8 in one bank.
            OneWholeTile(SharedBanks(reads=1, stores=32, why="lay each tile out (which index is its row, how many "
                                     "words a row holds) so that the words a warp reads at once fall in different "
                                     "banks"))),
    solution=multihead.qkv_av_kernel,
    forbidden=(multihead.qkv_av, multihead.qkv_weighted_sum_kernel, multihead.launch_layer,
               multihead.multi_head_attention, multihead.split_heads_kernel,
               multihead.merge_heads_kernel, weighted_sum.weighted_sum_kernel_v2,
               weighted_sum.weighted_sum_causal_kernel, tile_matmul,
               reference.weighted_sum),
))
