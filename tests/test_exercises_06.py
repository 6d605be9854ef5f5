"""Notebook 06's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import linecache

import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check, hint
from attention_lib.stages import multihead


# --- 06_split_heads (warm-up): out[b, h, t, c] = x[b, t, h * d_k + c] --------------------------

@cuda.jit
def split_solution(x, out):
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_interleaved(x, out):
    """The typical mistake: head h takes every n_head-th column (x.reshape(T, d_k, n_head))."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, c * n_head + h]


@cuda.jit
def split_without_guard(x, out):
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    out[bh // n_head, bh % n_head, t, c] = x[bh // n_head, t, (bh % n_head) * d_k + c]


@cuda.jit
def split_first_sequence_only(x, out):
    """Forgets the batch: every grid layer is taken for a head of sequence 0."""
    c, t = cuda.grid(2)
    h = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    if t < out.shape[2] and c < d_k and h < n_head:
        out[0, h, t, c] = x[0, t, h * d_k + c]


@cuda.jit
def split_layer_misread(x, out):
    """The grid layer decoded the wrong way round: b = z % n_head runs past the batch."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh % n_head, bh // n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_transposed_in_block(x, out):
    """The block's 16 x 16 tile copied with threadIdx.x along t: right, but a warp reads a column of x."""
    c = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.y
    t = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.x
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_reads_twice(x, out):
    """Reads its element of x twice (once to test it): right values, twice the reads."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        if x[b, t, h * d_k + c] == x[b, t, h * d_k + c]:
            out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_one_thread_per_row(x, out):
    """Right values, each element read once: but thread c = 0 copies its row's d_k elements in a loop."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c == 0:
        for e in range(d_k):
            out[b, h, t, e] = x[b, t, h * d_k + e]


@cuda.jit
def split_thread_0_stages_the_tile(x, out):
    """Right values, each element read once: but thread (0, 0) copies its block's tile into shared
    memory in a loop, and every thread stores its element from there."""
    tile = cuda.shared.array((16, 16), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c0, t0, bh = cuda.blockIdx.x * 16, cuda.blockIdx.y * 16, cuda.blockIdx.z
    n_head, T, d_k = out.shape[1], out.shape[2], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if tx == 0 and ty == 0:
        for r in range(16):
            for c in range(16):
                if t0 + r < T and c0 + c < d_k:
                    tile[r, c] = x[b, t0 + r, h * d_k + c0 + c]
    cuda.syncthreads()
    if t0 + ty < T and c0 + tx < d_k:
        out[b, h, t0 + ty, c0 + tx] = tile[ty, tx]


@cuda.jit
def split_by_one_thread(x, out):
    """Right values, each element read once: but the launch's first thread does the whole copy."""
    if cuda.grid(2) == (0, 0) and cuda.blockIdx.z == 0:
        for b in range(out.shape[0]):
            for h in range(out.shape[1]):
                for t in range(out.shape[2]):
                    for c in range(out.shape[3]):
                        out[b, h, t, c] = x[b, t, h * out.shape[3] + c]


@cuda.jit
def split_through_a_tile(x, out):
    """A right answer in another style: each thread copies its element into a shared tile, and stores
    it from there after a barrier."""
    tile = cuda.shared.array((16, 16), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c, t = cuda.grid(2)
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = cuda.blockIdx.z // n_head, cuda.blockIdx.z % n_head
    inside = t < out.shape[2] and c < d_k
    if inside:
        tile[ty, tx] = x[b, t, h * d_k + c]
    cuda.syncthreads()
    if inside:
        out[b, h, t, c] = tile[ty, tx]


def split_head_width_from(axis):
    """The solution with d_k read from out's axis `axis` for the column of x (the guard still on d_k)."""
    @cuda.jit
    def kernel(x, out):
        c, t = cuda.grid(2)
        bh = cuda.blockIdx.z
        n_head, d_k = out.shape[1], out.shape[axis]
        b, h = bh // n_head, bh % n_head
        if t < out.shape[2] and c < out.shape[3]:
            out[b, h, t, c] = x[b, t, h * d_k + c]
    return kernel


@cuda.jit
def split_head_width_16_in_column(x, out):
    """The head width written as the simulator's 16 in the column of x (the guard on out's shape): the
    trial's answer, right whenever d_k is 16."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head = out.shape[1]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < out.shape[3]:
        out[b, h, t, c] = x[b, t, h * 16 + c]


@cuda.jit
def split_head_width_64_in_column(x, out):
    """The same with ANDREA-120M's head width, 64."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head = out.shape[1]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < out.shape[3]:
        out[b, h, t, c] = x[b, t, h * 64 + c]


@cuda.jit
def split_d_k_16(x, out):
    """d_k = 16 written once, so in the guard too: the first case's threads past d_k 1 pass the guard."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = out.shape[1], 16
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_n_head_from_16(x, out):
    """d_k = 16 and n_head computed from it, d_model // 16: 0 heads at d_k 1, a division by zero."""
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    d_k = 16
    n_head = x.shape[2] // d_k
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:
        out[b, h, t, c] = x[b, t, h * d_k + c]


@cuda.jit
def split_stub(x, out):
    raise NotImplementedError()


@pytest.mark.parametrize("answer, diagnosis, says", [
    (split_solution, "ok", "correct at every size"),
    (split_interleaved, "heads_interleaved", "every n_head-th column"),
    (split_without_guard, "out_of_bounds", "out-of-bounds"),
    (split_first_sequence_only, "wrong_values", "never written"),
    (split_layer_misread, "grid_layer_order", "z = b * n_head + h"),
    (split_transposed_in_block, "uncoalesced", "segments of 128 bytes"),
    (split_reads_twice, "no_reuse", "read up to"),
    (split_one_thread_per_row, "serial_copy", "the values are right, but one warp made"),
    (split_thread_0_stages_the_tile, "serial_copy", "the values are right, but one warp made 35 load instructions"),
    (split_by_one_thread, "serial_copy", "the values are right, but one warp made 105 load instructions"),
    (split_through_a_tile, "ok", "correct at every size"),
    (split_head_width_from(2), "wrong_head_width", "read x[0, 0, 15], past x's 15 columns: it took head 2's columns "
                                                   "of x from column 2 * 7 = 14 on, a head width of 7: T, the length "
                                                   "of out's position axis"),
    (split_head_width_from(1), "wrong_head_width", "a head width of 3: n_head, the length of out's head axis"),
    (split_head_width_16_in_column, "head_width_written_as_number",
     "a head width of 16 written as a number. A head is d_k = out.shape[3] columns wide: 5 in this case"),
    (split_head_width_64_in_column, "head_width_written_as_number", "64 only at ANDREA-120M's size"),
    (split_d_k_16, "head_width_written_as_number", "at d_k 16 (T 7, 2 heads) every value is right: the number 16 "
                                                   "stands where d_k belongs"),
    (split_n_head_from_16, "head_width_written_as_number", "16 only at ANDREA-sim's size"),
    (split_stub, "not_implemented", "Hint:"),
    (lambda x, out: None, "not_a_kernel", "@cuda.jit"),
    (multihead.split_heads_kernel, "calls_given_code", "split_heads_kernel"),
], ids=["solution", "interleaved", "no_guard", "batch_ignored", "layer_misread", "transposed_in_block",
        "reads_twice", "one_thread_per_row", "thread_0_stages_the_tile", "one_thread", "through_a_tile",
        "d_k_from_positions", "d_k_from_heads", "d_k_16_in_column", "d_k_64_in_column", "d_k_16",
        "n_head_from_d_k_16", "stub", "plain_function", "library_kernel"])
def test_split_heads_diagnoses(answer, diagnosis, says):
    result = check("06_split_heads", answer, verbose=False)
    assert (result.diagnosis, result.passed, says in result.message) == (diagnosis, diagnosis == "ok", True), result
    assert "\n" not in str(result)


# --- 06_qkv_av (main): every head's A . V, V read in place, the heads written merged ------------

TILE = multihead.TILE

# The library's answer, as a student would type it; each planted mistake below changes one piece of it.
AV_SOURCE = '''
def kernel(a, qkv, n_head, n_kv_head, causal, out):
    tiles = cuda.shared.array((2, TILE, TILE), float32)
    tx, ty, T, d_k = cuda.threadIdx.x, cuda.threadIdx.y, a.shape[1], qkv.shape[2] // (n_head + 2 * n_kv_head)
    col_tiles = (d_k + TILE - 1) // TILE
    z, row = cuda.blockIdx.x // col_tiles % a.shape[0], cuda.blockIdx.x // col_tiles // a.shape[0] * TILE + ty
    col, v0 = cuda.blockIdx.x % col_tiles * TILE + tx, (n_head + n_kv_head + z % n_head // (n_head // n_kv_head)) * d_k
    k_end, acc = min(T, row - ty + TILE) if causal else T, float32(0.0)
    for start in range(0, k_end, TILE):
        tiles[0, ty, tx] = a[z, row, start + tx] if row < T and start + tx < k_end else float32(0.0)
        tiles[1, ty, tx] = qkv[z // n_head, start + ty, v0 + col] if start + ty < k_end and col < d_k else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            acc += tiles[0, ty, j] * tiles[1, j, tx]
        cuda.syncthreads()
    if row < T and col < d_k:
        out[z // n_head, row, z % n_head * d_k + col] = acc
'''


def av_kernel(*changes):
    """The answer above with each (old, new) text change made once: a kernel."""
    source = AV_SOURCE
    for old, new in changes:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    label = f"<planted answer {len(linecache.cache)} of 06_qkv_av>"   # its own file: shown, shipped, compiled
    linecache.cache[label] = (len(source), None, source.splitlines(keepends=True), label)
    namespace = {"cuda": cuda, "float32": float32, "TILE": TILE}
    exec(compile(source, label, "exec"), namespace)
    return cuda.jit(namespace["kernel"])


@cuda.jit
def av_heads_fastest(a, qkv, n_head, n_kv_head, causal, out):
    """A right answer in another style: neighbouring blocks take neighbouring heads of a (the tiles
    slowest), V indexed in qkv without a view, each element loaded into a register before the tile."""
    w_tile = cuda.shared.array((TILE, TILE), float32)
    val_tile = cuda.shared.array((TILE, TILE), float32)
    n, layers = a.shape[1], a.shape[0]
    width = qkv.shape[2] // (n_head + 2 * n_kv_head)
    layer, tile = cuda.blockIdx.x % layers, cuda.blockIdx.x // layers
    seq, head = layer // n_head, layer % n_head
    query_tiles = (n + TILE - 1) // TILE
    i = tile % query_tiles * TILE + cuda.threadIdx.y
    c = tile // query_tiles * TILE + cuda.threadIdx.x
    first = (n_head + n_kv_head) * width + head * n_kv_head // n_head * width
    last = n
    if causal:                                   # the block's last query sees keys up to it
        last = min(n, (tile % query_tiles + 1) * TILE)
    total = float32(0.0)
    for t in range((last + TILE - 1) // TILE):
        weight = float32(0.0)
        if i < n and t * TILE + cuda.threadIdx.x < last:
            weight = a[layer, i, t * TILE + cuda.threadIdx.x]
        value = float32(0.0)
        if t * TILE + cuda.threadIdx.y < last and c < width:
            value = qkv[seq, t * TILE + cuda.threadIdx.y, first + c]
        w_tile[cuda.threadIdx.y, cuda.threadIdx.x] = weight
        val_tile[cuda.threadIdx.y, cuda.threadIdx.x] = value
        cuda.syncthreads()
        for k in range(TILE):
            total += w_tile[cuda.threadIdx.y, k] * val_tile[k, cuda.threadIdx.x]
        cuda.syncthreads()
    if i < n and c < width:
        out[seq, i, head * width + c] = total


@cuda.jit
def av_from_global(a, qkv, n_head, n_kv_head, causal, out):
    """One thread per output, every weight and value read from global memory: no tiles."""
    T = a.shape[1]
    d_k = qkv.shape[2] // (n_head + 2 * n_kv_head)
    col_tiles, row_tiles = (d_k + TILE - 1) // TILE, (T + TILE - 1) // TILE
    col = cuda.blockIdx.x % col_tiles * TILE + cuda.threadIdx.x
    row = cuda.blockIdx.x // col_tiles % row_tiles * TILE + cuda.threadIdx.y
    z = cuda.blockIdx.x // col_tiles // row_tiles
    b, h = z // n_head, z % n_head
    v_col = (n_head + n_kv_head + h // (n_head // n_kv_head)) * d_k
    if row < T and col < d_k:
        acc = float32(0.0)
        for j in range(T):
            acc += a[z, row, j] * qkv[b, j, v_col + col]
        out[b, row, h * d_k + col] = acc


PADDED = TILE + 1   # a row of the tile of values, one word of padding


@cuda.jit
def av_values_by_column(a, qkv, n_head, n_kv_head, causal, out):
    """A right answer in another style: the tile of values holds a column per row, its rows padded to
    17 words (a warp's 16 columns of one key fall in 16 banks), the weights' tile a key per row."""
    w_tile = cuda.shared.array((TILE, TILE), float32)          # [key, query]: its stores meet in banks
    v_tile = cuda.shared.array((TILE, PADDED), float32)        # [column, key]
    tx, ty, T = cuda.threadIdx.x, cuda.threadIdx.y, a.shape[1]
    d_k = qkv.shape[2] // (n_head + 2 * n_kv_head)
    col_tiles = (d_k + TILE - 1) // TILE
    z, row = cuda.blockIdx.x // col_tiles % a.shape[0], cuda.blockIdx.x // col_tiles // a.shape[0] * TILE + ty
    col = cuda.blockIdx.x % col_tiles * TILE + tx
    first = (n_head + n_kv_head + z % n_head // (n_head // n_kv_head)) * d_k
    stop = min(T, row - ty + TILE) if causal else T
    acc = float32(0.0)
    for start in range(0, stop, TILE):
        w_tile[tx, ty] = a[z, row, start + tx] if row < T and start + tx < stop else float32(0.0)
        v_tile[tx, ty] = qkv[z // n_head, start + ty, first + col] if start + ty < stop and col < d_k else float32(0.0)
        cuda.syncthreads()
        for j in range(TILE):
            acc += w_tile[j, ty] * v_tile[tx, j]
        cuda.syncthreads()
    if row < T and col < d_k:
        out[z // n_head, row, z % n_head * d_k + col] = acc


@cuda.jit
def av_stub(a, qkv, n_head, n_kv_head, causal, out):
    raise NotImplementedError()


SERIAL_LOAD = ("        tiles[0, ty, tx] = a[z, row, start + tx] if row < T and start + tx < k_end else float32(0.0)\n",
               "        if tx == 0 and ty == 0:\n"
               "            for r in range(TILE):\n"
               "                for j in range(TILE):\n"
               "                    q = row - ty + r\n"
               "                    tiles[0, r, j] = a[z, q, start + j] if q < T and start + j < k_end "
               "else float32(0.0)\n")
BARRIER_IN_GUARD = ("        cuda.syncthreads()\n        for j",
                    "        if row < T:\n            cuda.syncthreads()\n        for j")
STORE_IN_LOOP = ("        cuda.syncthreads()\n    if row < T and col < d_k:\n        out",
                 "        cuda.syncthreads()\n        if row < T and col < d_k:\n            out")
FIRST = "at (B 2, T 7, n_head 4, n_kv_head 2, d_k 5, causal): "
SECOND = "at (B 1, T 17, n_head 6, n_kv_head 3, d_k 6, causal): "
WHOLE_TILE = "at (B 1, T 16, n_head 3, n_kv_head 1, d_k 16, causal): "
V0 = "(n_head + n_kv_head + z % n_head // (n_head // n_kv_head)) * d_k"
GUARDED_A = "        tiles[0, ty, tx] = a[z, row, start + tx] if row < T and start + tx < k_end else float32(0.0)\n"


@pytest.mark.parametrize("answer, diagnosis, says", [
    (av_kernel(), "ok", "correct at every size tried"),
    (av_heads_fastest, "ok", "correct at every size tried"),
    (av_values_by_column, "ok", "correct at every size tried"),
    # the contract's own mistakes, each named
    (av_kernel(("z % n_head * d_k + col] = acc", "col * n_head + z % n_head] = acc")),
     "heads_interleaved", FIRST + "head h's component c was written at column c * n_head + h"),
    (av_kernel((V0, "(n_head + n_kv_head + z % n_head % n_kv_head) * d_k")),
     "kv_head_interleaved", FIRST + "query head h read V head h % n_kv_head"),
    (av_kernel((V0, "(n_head + n_kv_head + z % n_head // n_kv_head) * d_k")),
     "wrong_group", SECOND + "query head h read V head h // n_kv_head"),
    (av_kernel((V0, "(n_head + n_kv_head + z % n_head // (n_kv_head // n_head)) * d_k")),
     "wrong_group", FIRST + "a division by zero"),
    (av_kernel((V0, "(n_head + z % n_head // (n_head // n_kv_head)) * d_k")),
     "wrong_v_block", FIRST + "V was read from K's columns"),
    (av_kernel((V0, "z % n_head * d_k")), "wrong_v_block", FIRST + "V was read from the query head's own columns"),
    (av_kernel(("// (n_head + 2 * n_kv_head)", "// (3 * n_head)")),
     "wrong_head_width", FIRST + "the head width came out as 3, not 5"),
    (av_kernel((V0, "(n_head + n_kv_head + z % n_head) * d_k")),
     "view_past_the_end", FIRST + "qkv was read at column 40, past its last, 39"),
    (av_kernel(("z // n_head, start + ty", "z % 2, start + ty"),
               ("out[z // n_head, row, z % n_head * d_k", "out[z % 2, row, z // 2 * d_k"),
               ("z % n_head // (n_head // n_kv_head)", "z // 2 // (n_head // n_kv_head)")),
     "grid_layer_order", FIRST + "a's head z was split into sequence z % B and head z // B"),
    (av_kernel((V0, "(2 * n_head + z % n_head // (n_head // n_kv_head)) * d_k")),
     "v_offset_assumes_mha", FIRST + "query head 0 read V from column 2 n_head d_k = 40 on, as if qkv held 4 K "
                             "heads and 4 V heads"),
    (av_kernel((V0, "(2 * n_head + z % n_head) * d_k")),
     "v_offset_assumes_mha", "so V starts at column (n_head + n_kv_head) d_k = 30"),
    (av_kernel(("if start + ty < k_end and col < d_k else", "if start + ty < k_end and v0 + col < qkv.shape[2] else")),
     "reads_next_head", FIRST + "the values are right, but block (0, 0, 0) loaded the columns of heads 6 and 7 of qkv"),
    (av_kernel(("min(T, row - ty + TILE)", "min(T, row - ty)")),
     "diagonal_tile_skipped", FIRST + "each block stopped before the key tile that holds its own queries"),
    # the usual wrong answers of the design: every tile walked, a size fixed at the simulator's, the
    # block's place dropped from an index, work serialised onto one thread, no tiles at all
    (av_kernel(("min(T, row - ty + TILE) if causal else T", "T")),
     "no_tiles_skipped", SECOND + "the values are right, but block (0, 0, 0) made"),
    (av_kernel(("min(T, row - ty + TILE) if causal else T", "min(T, row - ty + TILE)")),
     "wrong_values", "at (B 1, T 17, n_head 2, n_kv_head 2, d_k 7, not causal): "),
    (av_kernel(("d_k = cuda.threadIdx.x, cuda.threadIdx.y, a.shape[1], qkv.shape[2] // (n_head + 2 * n_kv_head)",
                "d_k = cuda.threadIdx.x, cuda.threadIdx.y, a.shape[1], 16")),
     "view_past_the_end", FIRST + "qkv was read at column 96, past its last, 39"),
    (av_kernel(("col, v0 = cuda.blockIdx.x % col_tiles * TILE + tx,", "col, v0 = tx,")),
     "race", "Two blocks touch one element of global memory"),
    (av_kernel(SERIAL_LOAD), "serial_copy", FIRST + "the values are right, but one warp "),
    (av_from_global, "no_reuse", FIRST + "the values are right, but an element of a was read up to"),
    # tiles, barriers and guards
    (av_kernel(("range(0, k_end, TILE)", "range(0, k_end + TILE, TILE)")),
     "extra_barriers", "a thread passed 4 barriers, where the limit is 2"),
    (av_kernel(BARRIER_IN_GUARD), "divergent_barrier", FIRST),
    (av_kernel(("        cuda.syncthreads()\n    if row", "    if row")), "race", "race on shared"),
    (av_kernel(STORE_IN_LOOP), "output_rewritten", SECOND + "the values are right, but thread (0, 0, 0) of block "
                                                   "(6, 0, 0) stored out[0, 16, 0] 2 times"),
    (av_kernel(("tiles[1, ty, tx] = qkv", "tiles[1, tx, ty] = qkv"), ("tiles[1, j, tx]", "tiles[1, tx, j]")),
     "bank_conflict", WHOLE_TILE + "the values are right, but a warp's read of tiles at"),
    (av_kernel((" if row < T and start + tx < k_end else", " if start + tx < k_end else")),
     "out_of_bounds", "out-of-bounds read a["),
    (av_kernel((GUARDED_A, "        if row < T and start + tx < k_end:\n"
                           "            tiles[0, ty, tx] = a[z, row, start + tx]\n")),
     "stale_tile", FIRST),
    (av_kernel((GUARDED_A, "        q = row - ty + tx\n"
                           "        tiles[0, tx, ty] = a[z, q, start + ty] if q < T and start + ty < k_end "
                           "else float32(0.0)\n")),
     "uncoalesced", "a warp's load of a at"),
    (av_kernel(("    if row < T and col < d_k:\n        out", "    if True:\n        out")),
     "out_of_bounds", "out-of-bounds write out["),
    (av_kernel(("k_end, acc = min(T, row - ty + TILE) if causal else T, float32(0.0)",
                "k_end, acc = min(T, row - ty + TILE) if causal else T, 0.0")), "float64_arithmetic", "float64"),
    # the answer's form
    (av_stub, "not_implemented", "Hint:"),
    (lambda a, qkv, n_head, n_kv_head, causal, out: None, "not_a_kernel", "@cuda.jit"),
    (multihead.qkv_av_kernel, "calls_given_code", "qkv_av_kernel"),
    (multihead.qkv_weighted_sum_kernel, "calls_given_code", "qkv_weighted_sum_kernel"),
], ids=["solution", "heads_fastest", "values_by_column", "interleaved", "kv_interleaved", "group_by_n_kv", "group_zero", "k_block",
        "own_block", "head_width", "not_shared", "layer_order", "mha_offset", "mha_offset_own_head",
        "column_guard_on_width", "diagonal_skipped", "every_tile", "causal_ignored",
        "d_k_hard_coded",
        "block_dropped", "serial_load", "from_global", "extra_step", "barrier_in_guard", "no_second_barrier",
        "store_in_key_loop", "values_by_column_unpadded", "no_row_guard", "not_zeroed", "load_down_columns", "no_store_guard", "python_float", "stub",
        "plain_function", "library_kernel", "layer_kernel"])
def test_qkv_av_answers_get_their_diagnosis(answer, diagnosis, says):
    result = check("06_qkv_av", answer, verbose=False)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message
    assert "\n" not in str(result)


def test_the_hints_of_06_give_no_code(capsys):
    for exercise_id in ("06_split_heads", "06_qkv_av"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: the plan")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
    assert EXERCISES["06_qkv_av"].more_hints[1].startswith("where answers go wrong: ")
