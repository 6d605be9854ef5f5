"""``08x_packed_rows`` (deep dive 08x): the grouped kernel's packed rows of a key/value head's group
into the shared tile (the contract of ``flash.v3_load_packed``). Its cases, limits and named mistakes
are declared in the ``Exercise`` below.
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import flash
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import RaceFound, host_output
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostAccessesPerThread, MostLoads, NoLocalMemory
from attention_lib.checks.ex08_kernel3 import (attention_v3, kernel3, quiet_launch, rebound,
                                               refuse_library_names, traced_for)


class PackedCase(NamedTuple):
    """A probe of one load: `slices` slices of 128 threads copy packed rows r0 .. r0 + n - 1 of kv head
    h's `group` query heads (T_q positions each, width d_k) into one shared tile of 64 rows a slice;
    or (kernel) the grouped kernel with the answer in its loads, group query heads on one kv head."""

    d_k: int
    group: int
    T_q: int
    slices: int = 1
    r0: int = 0
    n: int = 0
    kernel: bool = False

    def __str__(self):
        if self.kernel:
            return f"(grouped kernel, group {self.group}, T {self.T_q}, d_k {self.d_k}, causal)"
        return (f"(d_k {self.d_k}, group {self.group}, T_q {self.T_q}, {self.slices} slice(s): packed rows "
                f"{self.r0} .. {self.r0 + self.n - 1})")


def _packed_probe_source(src, out, h, r0, n, group, scale):
    """One block of blockDim.y slices: `load` (the answer) copies the packed rows into the shared
    tile, which the block then copies to `out` (the probe reads it only after the barrier)."""
    tile = cuda.shared.array((ROWS, ROW_STRIDE), np.float32)         # noqa: F821  (bound by _packed_probe)
    load(tile, src, h, r0, n, group, scale)                          # noqa: F821
    cuda.syncthreads()                                               # the tile is complete
    first = cuda.threadIdx.x + cuda.threadIdx.y * THREADS_V3          # noqa: F821
    for e in range(first, ROWS * HEAD_PAD, THREADS_V3 * cuda.blockDim.y):   # noqa: F821
        out[e // HEAD_PAD, e % HEAD_PAD] = tile[e // HEAD_PAD, e % HEAD_PAD]   # noqa: F821


def _packed_probe(answer, d_k, slices):
    z = flash.v3_sizes(d_k)
    return rebuilt(_packed_probe_source, {**z, "ROWS": z["TILE_M"] * slices, "load": rebound(answer, d_k)},
                   base=vars(flash), name="packed_rows_probe")


def _packed_expected(src, h, r0, n, group, scale, rows, head_pad):
    """(rows, head_pad) float64: packed row r < n is row (r0 + r) // group of head h * group +
    (r0 + r) % group, times scale; 0 past n and past d_k."""
    want = np.zeros((rows, head_pad))
    for r in range(n):
        want[r, :src.shape[2]] = src[h * group + (r0 + r) % group, (r0 + r) // group] * np.float64(scale)
    return want


def _run_packed(answer, case, rng, launch):
    refuse_library_names(answer, ("v3_load_packed", "v3_load_tile", "v3_load_shared_tile"))
    if case.kernel:
        q = rng.standard_normal((case.group, case.T_q, case.d_k)).astype(np.float32)
        k, v = (rng.standard_normal((1, case.T_q, case.d_k)).astype(np.float32) for _ in range(2))
        got = attention_v3(kernel3(answer, "v3_load_packed", case.d_k, grouped=True), quiet_launch,
                            q, k, v, True, None)
        return got, reference.attention(q, k, v), None
    z = flash.v3_sizes(case.d_k)
    heads = 2 * case.group                                  # kv heads 0 and 1: the probe loads head 1's group
    src = rng.standard_normal((heads, case.T_q, case.d_k)).astype(np.float32)
    rows = z["TILE_M"] * case.slices
    out = host_output((rows, z["HEAD_PAD"]))
    scale = np.float32(0.5)
    try:
        traced_for(case.d_k)(_packed_probe(answer, case.d_k, case.slices), 1, (flash.THREADS_V3, case.slices),
                              src, out, 1, case.r0, case.n, case.group, scale)
    except RaceFound as found:
        race = found.race
        if race.array == "tile" and race.thread_a[0] == race.thread_b[0] and race.thread_a[1] != race.thread_b[1]:
            raise Diagnosed("slices_left_out", (
                f"threads {race.thread_a} and {race.thread_b} (the same threadIdx.x in two slices) both wrote "
                f"tile{list(race.index)}: the {case.slices} slices repeat one copy instead of sharing it; number "
                "the block's threads across threadIdx.y too")) from None
        raise
    want = _packed_expected(src, 1, case.r0, case.n, case.group, scale, rows, z["HEAD_PAD"])
    return out, want, (src, case, scale)


def _diagnose_packed(got, expected, probe):
    if probe is None:
        return None
    src, case, scale = probe
    z = flash.v3_sizes(case.d_k)
    close = dict(rtol=1e-5, atol=1e-5)
    rows = z["TILE_M"] * case.slices
    swapped = np.zeros_like(expected)
    for r in range(case.n):                             # head r % T_q, position r // T_q (head-major packing)
        p = case.r0 + r
        swapped[r, :case.d_k] = src[case.group + p // case.T_q, p % case.T_q] * np.float64(scale) \
            if p // case.T_q < case.group else np.nan
    if np.allclose(got, swapped, **close):
        return "rows_not_packed", ("packed row r holds position r % T_q of head r // T_q, each head's rows one "
                                   "after another; the grouped kernel packs them interleaved: row r is position "
                                   "r // group of head h * group + r % group")
    split = _split_offset(got, src, case, scale)
    if split is not None:
        return "row_offset_split", (f"tile row r was filled from {split}, r0 and r divided by the group apart: with r0 "
                                    f"{case.r0} not a multiple of group {case.group} that is another packed row. "
                                    "Tile row r holds packed row r0 + r, divided after the sum: position "
                                    "(r0 + r) // group of head h * group + (r0 + r) % group")
    if case.slices > 1 and np.allclose(got[:z["TILE_M"]], expected[:z["TILE_M"]], **close) \
            and not np.allclose(got, expected, **close):
        return "slices_left_out", (f"the first slice's {z['TILE_M']} rows are right and the rest of the {rows} "
                                   f"are not: all {case.slices} slices' threads (threadIdx.y too) share the copy")
    return None


def _split_offset(got, src, case, scale):
    """The packed row the answer read into tile row r, as a phrase, when it divided r0 and r by the
    group apart (position r0 // group + r // group, head h * group + r % group, or both); else None."""
    if case.r0 % case.group == 0:
        return None
    g, h, r0 = case.group, 1, case.r0
    for head_of, position_of, said in (
            (lambda r: (r0 + r) % g, lambda r: r0 // g + r // g, "position r0 // group + r // group"),
            (lambda r: r % g, lambda r: r0 // g + r // g,
             "position r0 // group + r // group of head h * group + r % group"),
            (lambda r: r % g, lambda r: (r0 + r) // g, "position (r0 + r) // group of head h * group + r % group")):
        wrong = np.zeros(got.shape)
        for r in range(case.n):
            wrong[r, :case.d_k] = src[h * g + head_of(r), position_of(r)] * np.float64(scale)
        if np.allclose(got, wrong, rtol=1e-5, atol=1e-5):
            return said
    return None


def _warp_segments(case):
    """The segments a warp's load of src may touch: 32 neighbouring columns cross ceil(32 / d_k) row
    ends, each a jump to another head's or position's row: ceil(32 / d_k) + 1 segments."""
    return math.ceil(32 / case.d_k) + 1


def _thread_share(case):
    """The most elements of src one thread may load: ceil(rows / warps) ceil(HEAD_PAD / 32), a
    lane's part when each warp copies whole rows, 32 columns at a time, the least even split of a
    right copy (16 at d_k <= 32 with the tile's 64 rows a slice on its 4 warps). A copy striding
    over the tile's slots with every thread loads at most ceil(HEAD_PAD / 2); thread 0 alone loads
    all n d_k (200 or more in every probe)."""
    z = flash.v3_sizes(case.d_k)
    rows, warps = z["TILE_M"] * case.slices, flash.THREADS_V3 * case.slices // 32
    return math.ceil(rows / warps) * math.ceil(z["HEAD_PAD"] / 32)


register(Exercise(
    exercise_id="08x_packed_rows",
    kind="device function",
    run=_run_packed,
    # Probes: one head (group 1, K and V's load); a group of 2 over one slice; a group of 3 over 2
    # slices, the last rows partly filled; the same from packed row 31, not a multiple of the group
    # (r0 // group + r // group is not (r0 + r) // group there); a group of 4 over 4 slices, starting
    # mid-way; a group of 4 over 2 slices at d_k 64 (the probe compiled for a GPU: its static tile
    # fits 48 KB); then the grouped kernel, a group of 3 at d_k 5 (2 slices) and of 4 at d_k 16.
    cases=[PackedCase(5, 1, 40, 1, 0, 40), PackedCase(16, 2, 20, 1, 0, 40), PackedCase(5, 3, 33, 2, 0, 99),
           PackedCase(5, 3, 33, 2, 31, 68), PackedCase(7, 4, 40, 4, 64, 96), PackedCase(64, 4, 40, 2, 32, 100),
           PackedCase(5, 3, 33, kernel=True), PackedCase(16, 4, 20, kernel=True)],
    hint=("a packed row is a (query head, position) pair: consecutive rows walk through the heads of the group "
          "before the position moves on; the copy itself is notebook 08's, spread over every thread of the "
          "block, slices included"),
    more_hints=("the plan: number the block's threads across both axes (threadIdx.x, then the slices along "
                "threadIdx.y) and let them stride together over the tile's rows times HEAD_PAD columns, "
                "consecutive threads on consecutive columns; for element e, its row r and column c; a real entry "
                "when r is below n and c below HEAD: packed row r0 plus r is position (r0 plus r) divided by group, "
                "of head h times group plus the remainder, times scale; every other slot gets 0. Where answers go "
                "wrong: the first slice's threads alone, or thread 0 alone; each head's rows one after another "
                "instead of interleaved; r0 divided by group apart from r, which differs when r0 is not a multiple "
                "of group; the padding left as it was",),
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_packed,
    diagnoses=("rows_not_packed", "slices_left_out", "row_offset_split"),
    solution=flash.v3_load_packed,
    forbidden=(flash.v3_load_shared_tile, flash.v3_load_tile, flash.v3_block_grouped),
    limits=(MostLoads("src", 1,
                      why="each element goes into one slot of the tile, read once by one thread"),
            Coalesced("src", _warp_segments),
            MostAccessesPerThread("src", _thread_share,
                                  why="every thread of the block, in all its slices, copies its share of the tile"),
            NoLocalMemory()),
))
