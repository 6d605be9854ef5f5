"""KV-cache decoding (notebook 09): one new token at a time, attending to the cached keys and values
(the notebook tells why a cache, and what grouped-query attention saves). The file:

- Grouped-query attention throughout: the cache holds n_kv_head heads of K and V; query head h
  reads kv head h // (n_head // n_kv_head) (n_kv_head = n_head: plain, 1: multi-query).
- NumPy: ``chunk_partials`` (one query, chunk by chunk: each chunk's log-sum-exp and normalised
  output) and ``merge_partials`` (their log-sum-exp merge); ``decode_layer_numpy``, the reference
  of a whole layer decoded token by token.
- ``KVCache``: K and V of the kv heads of one layer of one sequence, preallocated on the device
  as (n_kv_head, capacity, d_k) arrays; ``append`` fills them from the front.
- Kernels, each staging a kv head's keys and values in shared memory once for every query head
  of its group: ``decode_kernel_v1`` (a block per kv head, a thread per query head) and, version
  2, ``decode_kernel_v2`` (split-K: a block per chunk of KEYS_PER_CHUNK positions and kv head,
  writing each chunk's log-sum-exp and normalised output) + ``decode_merge_kernel`` (their
  log-sum-exp merge); their device functions (``row_dot``, which the backward reuses,
  ``online_step``, ``attend_chunk``, ``weighted_value``, ...). ``chunk_partial_kernel`` writes the
  same partials with a block per (chunk, query head); its ``chunk_partial``, with the chunk's
  (max, sum) from the pair tree of ``chunk_stats``, is notebook 09's main exercise, in two parts
  (``chunk_stats_kernel`` runs the first alone; ``chunk_grid``, ``chunk_partials_device``).
- ``KERNELS``, ``decode_grid``; the launcher ``decode_step(q, cache, version=2, kernel=None,
  merge_kernel=None)``.
- A layer with a cache on the device: ``qkv_heads``, ``prefill``, ``decode_layer_step``,
  ``generate_layer_outputs``.
- Sizes and cost: ``cache_bytes``, ``bytes_per_token``, ``decode_traffic`` (per array, as
  ``sanitizer.count_memory`` counts) and ``token_cost``.

One decode step's plain reference is ``reference.attention`` with one query (T_q = 1 < T_k: the
causal mask lets the last position see every key).
"""

import math

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import attention, projection, scores
from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.platform.runtime import SIMULATOR_SHAPES
from attention_lib.platform.validation import as_float32, positive_int, require, require_finite_result, weight

# Cached positions per chunk of the split-K kernel, and threads per block (one position each);
# also the tile of positions kernel 1 stages at a time: (simulator, GPU), a check runs answers at
# both. On a GPU 32 (one warp): a chunk's keys and values staged in shared memory, 2 x 32 x 129
# float32, take 33,024 bytes (33,152 with its 32 scores); 64 would pass the 48 KB a block may hold
# statically. ANDREA-120M's T = 1024 is 32 chunks a head, 12 kv heads x 32 = 384 blocks a sequence:
# 2.9 warps per SM on average over an H200's 132 SMs, from the grid, where the kernel's shared memory
# allows 6 (the kernel report); production split-decoding picks the splits from batch x heads and
# the SM count. On the simulator 8: fewer threads to simulate.
SHAPE_CONSTANTS = {"KEYS_PER_CHUNK": (8, 32)}
KEYS_PER_CHUNK_GPU = SHAPE_CONSTANTS["KEYS_PER_CHUNK"][1]
KEYS_PER_CHUNK = SHAPE_CONSTANTS["KEYS_PER_CHUNK"][0 if SIMULATOR_SHAPES else 1]
# Largest head width the kernels accept: q is staged in arrays of MAX_D float32, whose size
# must be known when compiling (the same limit as flash.MAX_D).
MAX_D = 128
# A tile of KEYS_PER_CHUNK cached keys (or values) in shared memory, one position per row. The
# row is one float longer than MAX_D: when the threads of a warp read a column (thread t the
# key of row t), 129-float rows put them in 32 different banks, 128-float rows all in one (from
# the index arithmetic: bank = (t * row + e) mod 32).
SHAPE_CONSTANTS["TILE_SHAPE"] = tuple((keys, MAX_D + 1) for keys in SHAPE_CONSTANTS["KEYS_PER_CHUNK"])
TILE_SHAPE = SHAPE_CONSTANTS["TILE_SHAPE"][0 if SIMULATOR_SHAPES else 1]
# CUDA's limit on the threads of a block: version 1's block is one kv head's group of query heads.
MAX_THREADS_PER_BLOCK = 1024
# The merge kernel: 16 output components x 4 heads per block, x along d_k.
MERGE_BLOCK = (16, 4)
# The projections of the layer helpers: the 128 x 128 kernel v4 on a GPU; the naive v1 on the
# simulator (projection.layer_version says why).
PROJECTION_VERSION = projection.layer_version()


# --- NumPy: one query against the cache, chunk by chunk --------------------------------------

def chunk_partials(q, keys, values, chunk=KEYS_PER_CHUNK):
    """What each chunk of the cache contributes to one query's attention, in float64.

    q: (..., d_k) one query per head; keys: (..., T, d_k); values: (..., T, d_v) -> (lse, o): lse
    (..., n_chunks) each chunk's log-sum-exp m + log l (m its largest scaled score, l the sum of
    exp(s - m)), o (..., n_chunks, d_v) its own output, sum of exp(s - m) * v over l. n_chunks =
    ceil(T / chunk), the last chunk possibly shorter; every chunk independent of the others.
    """
    q, keys, values = (np.asarray(a, dtype=np.float64) for a in (q, keys, values))
    s = np.einsum("...d,...td->...t", q, keys) / math.sqrt(q.shape[-1])   # (..., T) scores
    lses, outputs = [], []
    for start in range(0, s.shape[-1], chunk):
        s_c = s[..., start:start + chunk]                          # (..., <= chunk)
        m = s_c.max(axis=-1)                                       # (...)
        p = np.exp(s_c - m[..., None])                             # every term <= 1
        l = p.sum(axis=-1)                                         # >= 1: the max contributes exp(0)
        lses.append(m + np.log(l))
        outputs.append(np.einsum("...t,...td->...d", p, values[..., start:start + chunk, :]) / l[..., None])
    return np.stack(lses, -1), np.stack(outputs, -2)


def merge_partials(lse, o):
    """Merge the chunks' (LSE_c, o_c) into the attention output and its log-sum-exp, in float64.

    lse: (..., n_chunks); o: (..., n_chunks, d_v) -> (out (..., d_v), lse (...)). Chunk c holds
    the share exp(LSE_c - LSE) of the softmax's denominator; with M = max_c LSE_c every weight
    exp(LSE_c - M) is <= 1 (one is 1), and dividing by their sum gives the shares.
    """
    lse, o = np.asarray(lse, np.float64), np.asarray(o, np.float64)
    big = lse.max(axis=-1, keepdims=True)                          # M, (..., 1)
    weight = np.exp(lse - big)                                     # (..., n_chunks), each <= 1
    total = weight.sum(axis=-1)                                    # (...), >= 1
    return (weight[..., None] * o).sum(axis=-2) / total[..., None], big[..., 0] + np.log(total)


def decode_layer_numpy(x, w_q, w_k, w_v, w_o, n_head, n_kv_head=None):
    """A multi-head attention layer run token by token with a NumPy KV cache, in float64.

    x: (T, d_model); w_q, w_o: (d_model, d_model); w_k, w_v: (d_model, n_kv_head * d_k) -> (T, d_model),
    reference.multi_head_attention(x, ..., causal=True) when n_kv_head = n_head."""
    T, d_model = x.shape
    n_kv_head = n_head if n_kv_head is None else n_kv_head       # group: query heads per kv head
    group, k_cache = n_head // n_kv_head, np.zeros((n_kv_head, T, d_model // n_head))   # (n_kv_head, capacity, d_k)
    v_cache, out = np.zeros_like(k_cache), np.zeros((T, d_model))
    for t in range(T):
        x_t = x[t:t + 1]                                           # (1, d_model)
        q = reference.split_heads(reference.project(x_t, w_q), n_head)   # (n_head, 1, d_k)
        k_cache[:, t:t + 1] = reference.split_heads(reference.project(x_t, w_k), n_kv_head)
        v_cache[:, t:t + 1] = reference.split_heads(reference.project(x_t, w_v), n_kv_head)
        keys = np.repeat(k_cache[:, :t + 1], group, axis=0)        # (n_head, t + 1, d_k): kv head h // group
        values = np.repeat(v_cache[:, :t + 1], group, axis=0)
        heads = reference.attention(q, keys, values, causal=False)
        out[t] = reference.project(reference.merge_heads(heads), w_o)[0]  # (n_head, 1, d_k) -> (d_model,)
    return out


# --- The cache -------------------------------------------------------------------------------

class CacheBookkeeping:
    """What a KVCache needs besides storing and appending: its sizes checked, its shape, copies.

    A mixin for KVCache (which notebook 09 shows): the one-line errors of the constructor and
    of append, the properties n_kv_head, group, capacity, d_k, nbytes, keys and values, and
    __repr__.
    """

    @staticmethod
    def _check_sizes(n_head, capacity, d_k, n_kv_head):
        """(n_head, capacity, d_k, n_kv_head) as ints, n_kv_head None meaning n_head; TypeError
        or ValueError naming the argument otherwise."""
        n_kv_head = n_head if n_kv_head is None else n_kv_head
        sizes = tuple(positive_int(name, value) for name, value in
                      (("n_head", n_head), ("capacity", capacity), ("d_k", d_k), ("n_kv_head", n_kv_head)))
        require(sizes[2] <= MAX_D, f"d_k must be at most MAX_D = {MAX_D}, got {sizes[2]}")
        require(sizes[0] % sizes[3] == 0,
                f"n_kv_head must divide n_head = {sizes[0]} (each kv head serves a whole group of "
                f"query heads), got {sizes[3]}")
        return sizes

    def _check_new(self, k_new, v_new):
        """k_new, v_new as float32 (n_kv_head, t_new, d_k) arrays that fit after the filled positions."""
        hint = f"(n_kv_head, t_new, d_k) = ({self.n_kv_head}, t_new, {self.d_k})"
        k_new = as_float32("k_new", k_new, hint, ndim=3)
        v_new = as_float32("v_new", v_new, hint, ndim=3)
        for name, a in (("k_new", k_new), ("v_new", v_new)):
            require(a.shape[0] == self.n_kv_head and a.shape[2] == self.d_k,
                    f"{name} must have shape {hint}, got {a.shape}")
        require(v_new.shape == k_new.shape,
                f"v_new must have the shape of k_new {k_new.shape}, got {v_new.shape}")
        require(self.length + k_new.shape[1] <= self.capacity,
                f"KVCache is full: capacity {self.capacity}, length {self.length}, "
                f"cannot append {k_new.shape[1]} more position(s)")
        return k_new, v_new

    @property
    def n_kv_head(self):
        return self.k_device.shape[0]

    @property
    def group(self):
        """Query heads per kv head."""
        return self.n_head // self.n_kv_head

    @property
    def capacity(self):
        return self.k_device.shape[1]

    @property
    def d_k(self):
        return self.k_device.shape[2]

    @property
    def nbytes(self):
        """Device memory held by the cache (K and V, the whole capacity)."""
        return 2 * self.k_device.size * 4

    @property
    def keys(self):
        """The cached keys, (n_kv_head, length, d_k) float32: a NumPy copy."""
        return np.ascontiguousarray(self.k_device.copy_to_host()[:, :self.length])

    @property
    def values(self):
        """The cached values, (n_kv_head, length, d_k) float32: a NumPy copy."""
        return np.ascontiguousarray(self.v_device.copy_to_host()[:, :self.length])

    def __repr__(self):
        return (f"KVCache(n_head={self.n_head}, capacity={self.capacity}, d_k={self.d_k}, "
                f"n_kv_head={self.n_kv_head}, length={self.length})")


class KVCache(CacheBookkeeping):
    """The K and V of every position so far, for ONE attention layer of ONE sequence.

    n_head query heads share n_kv_head (None: n_head) kv heads: float32 (n_kv_head, capacity, d_k)."""

    def __init__(self, n_head, capacity, d_k, n_kv_head=None):
        n_head, capacity, d_k, n_kv_head = self._check_sizes(n_head, capacity, d_k, n_kv_head)
        self.n_head = n_head                                       # the queries a decode step brings
        self.k_device = cuda.device_array((n_kv_head, capacity, d_k), np.float32)
        self.v_device = cuda.device_array((n_kv_head, capacity, d_k), np.float32)
        self.length = 0                                            # positions filled

    def append(self, k_new, v_new):
        """Store t_new positions after the filled ones: k_new, v_new (n_kv_head, t_new, d_k) float."""
        k_new, v_new = self._check_new(k_new, v_new)               # refuses what does not fit
        start, t_new = self.length, k_new.shape[1]
        self.k_device[:, start:start + t_new] = k_new              # (n_kv_head, t_new, d_k) slots
        self.v_device[:, start:start + t_new] = v_new
        self.length = start + t_new


# --- Kernels -------------------------------------------------------------------------------

@cuda.jit(device=True)
def stage_tile(k_s, v_s, k_cache, v_cache, g, start, length, tid, n_threads):
    """k_s[t, e] = k_cache[g, start + t, e] and v_s alike for the filled positions of the tile
    starting at `start`; returns n_keys, their number (the last tile may be partial).

    Row by row, the block's n_threads threads take components tid, tid + n_threads, ...:
    neighbouring threads read neighbouring addresses, and each cached number is read from main
    memory once, for every query head of kv head g.
    """
    n_keys = min(KEYS_PER_CHUNK, length - start)
    for t in range(n_keys):
        for e in range(tid, k_cache.shape[2], n_threads):
            k_s[t, e] = k_cache[g, start + t, e]
            v_s[t, e] = v_cache[g, start + t, e]
    return n_keys


@cuda.jit(device=True)
def stage_query(q_row, acc, q, h, scale):
    """q_row = q[h] * scale (the scale folded into q once) and acc = 0, in local arrays."""
    for c in range(q.shape[1]):
        q_row[c] = q[h, c] * scale
        acc[c] = 0.0


@cuda.jit(device=True)
def row_dot(row, tile, r, width):
    """row . tile[r]: a row (a thread's local array, or a row in main memory) against row r of a
    shared tile, float32: a query against a staged key (notebook 11's backward reuses it)."""
    acc = np.float32(0.0)
    for c in range(width):
        acc += row[c] * tile[r, c]
    return acc


@cuda.jit(device=True)
def online_step(acc, v_s, t, d_k, s, m, l):
    """Fold the key in row t of the tile, with score s, into the running (m, l, acc); returns the new (m, l).

    acc (d_k,) holds sum exp(s - m) * v over the keys so far; rescaling it and l to the new
    maximum keeps every exponent <= 0.
    """
    m_new = max(m, s)
    rescale = math.exp(m - m_new)                # 1 if the max stayed, 0 for the first key
    p = math.exp(s - m_new)
    for c in range(d_k):
        acc[c] = acc[c] * rescale + p * v_s[t, c]
    return m_new, l * rescale + p


@cuda.jit(device=True)
def write_normalised(out, acc, h, l, d_k):
    """out[h] = acc / l: one division per head, a product per component."""
    inv_l = np.float32(1.0) / l                  # l >= 1: the largest term is exp(0)
    for c in range(d_k):
        out[h, c] = acc[c] * inv_l


@cuda.jit(device=True)
def attend_tile(acc, q_row, k_s, v_s, n_keys, d_k, m, l):
    """Fold the tile's n_keys staged keys and values into the running (m, l, acc); returns (m, l)."""
    for t in range(n_keys):
        m, l = online_step(acc, v_s, t, d_k, row_dot(q_row, k_s, t, d_k), m, l)
    return m, l


@cuda.jit
def decode_kernel_v1(q, k_cache, v_cache, length, scale, out):
    """One query per head against the first `length` cached positions; block g: kv head g.

    q, out (written): (n_head, d_k); k_cache, v_cache: (n_kv_head, capacity, d_k); float32."""
    k_s = cuda.shared.array(TILE_SHAPE, np.float32)   # the tile's keys, read by every thread
    v_s = cuda.shared.array(TILE_SHAPE, np.float32)   # and its values
    g, tid, group = cuda.blockIdx.x, cuda.threadIdx.x, q.shape[0] // k_cache.shape[0]
    h, d_k = g * group + tid, q.shape[1]         # the thread's query head: h // group = g
    q_row = cuda.local.array(MAX_D, np.float32)   # private to the thread
    acc = cuda.local.array(MAX_D, np.float32)
    stage_query(q_row, acc, q, h, scale)
    m, l = np.float32(-math.inf), np.float32(0.0)   # float32 throughout, as on a GPU
    for start in range(0, length, KEYS_PER_CHUNK):   # only the filled positions
        cuda.syncthreads()                       # wait: every thread is done with the last tile
        n_keys = stage_tile(k_s, v_s, k_cache, v_cache, g, start, length, tid, group)
        cuda.syncthreads()                       # wait: the tile is staged
        m, l = attend_tile(acc, q_row, k_s, v_s, n_keys, d_k, m, l)
    write_normalised(out, acc, h, l, d_k)


@cuda.jit(device=True)
def weighted_value(s_chunk, v_s, n_keys, m, e):
    """sum over the chunk's n_keys positions t of exp(s_chunk[t] - m) * v_s[t, e], float32: one
    component of the chunk's unnormalised output (each call recomputes the weights it needs)."""
    acc = np.float32(0.0)
    for t in range(n_keys):
        acc += math.exp(s_chunk[t] - m) * v_s[t, e]   # neighbouring threads read neighbouring e
    return acc


@cuda.jit(device=True)
def attend_chunk(q, h, c, k_s, v_s, s_chunk, n_keys, scale, lse_part, o_part):
    """Query head h against chunk c, staged in k_s and v_s (n_keys positions), by every thread
    of the block: thread tid scores position tid into s_chunk; then the chunk's (m, l), the same
    in every thread; o_part[h, c, e] = sum_t exp(s_t - m) v_t[e] / l, thread tid taking
    components tid, tid + KEYS_PER_CHUNK, ...; lse_part[h, c] = m + log l, by thread 0."""
    tid = cuda.threadIdx.x
    cuda.syncthreads()                               # wait: the chunk is staged, the last head's scores read
    if tid < n_keys:                                 # the last chunk may hold fewer keys than threads
        s_chunk[tid] = scale * row_dot(q[h], k_s, tid, q.shape[1])   # every thread reads all of q[h]
    cuda.syncthreads()                               # wait: every score of the chunk is in
    m, l = np.float32(-math.inf), np.float32(0.0)    # every thread reads every score, at one address at once
    for t in range(n_keys):
        m = max(m, s_chunk[t])
    for t in range(n_keys):
        l += math.exp(s_chunk[t] - m)                # <= 1 each, exactly 1 at the max: 1 <= l <= n_keys
    for e in range(tid, q.shape[1], KEYS_PER_CHUNK):
        o_part[h, c, e] = weighted_value(s_chunk, v_s, n_keys, m, e) / l
    if tid == 0:                                     # one thread per chunk and head
        lse_part[h, c] = m + math.log(l)


@cuda.jit
def decode_kernel_v2(q, k_cache, v_cache, length, scale, lse_part, o_part):
    """Split-K decoding, step 1: block (c, g) attends the query heads of kv head g to chunk c of the
    cache, staged once for all of them; thread tid owns position c * KEYS_PER_CHUNK + tid.

    q: (n_head, d_k); k_cache, v_cache: (n_kv_head, capacity, d_k); length: filled positions;
    scale: 1/sqrt(d_k); writes lse_part (n_head, n_chunks), the chunk's log-sum-exp m + log l,
    and o_part (n_head, n_chunks, d_k), its normalised output; float32. Grid: (n_chunks,
    n_kv_head) blocks of KEYS_PER_CHUNK threads. Two barriers per query head (attend_chunk).
    """
    k_s = cuda.shared.array(TILE_SHAPE, np.float32)         # the chunk's keys, one position per row
    v_s = cuda.shared.array(TILE_SHAPE, np.float32)         # and its values
    s_chunk = cuda.shared.array(KEYS_PER_CHUNK, np.float32)   # the chunk's scores against q[h]
    c, g, tid, group = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, q.shape[0] // k_cache.shape[0]
    n_keys = stage_tile(k_s, v_s, k_cache, v_cache, g, c * KEYS_PER_CHUNK, length, tid, KEYS_PER_CHUNK)
    for h in range(g * group, (g + 1) * group):          # the query heads that read kv head g
        attend_chunk(q, h, c, k_s, v_s, s_chunk, n_keys, scale, lse_part, o_part)


@cuda.jit(device=True)
def chunk_stats(s, m_s, l_s):
    """The chunk's (m, l), returned to every thread: m the largest of the block's scores s (-inf from a
    thread without a position), l the sum of exp(s - m). One tree of (max, sum) pairs: merging two
    rescales each sum to the larger max, as the online softmax does (notebook 07). m_s, l_s:
    (KEYS_PER_CHUNK,) float32 shared arrays, overwritten. Every thread of the block must call it: it
    waits at log2(KEYS_PER_CHUNK) + 2 barriers, the last once every thread has read the result."""
    tid = cuda.threadIdx.x
    m_s[tid], l_s[tid] = s, (np.float32(0.0) if s == -math.inf else np.float32(1.0))   # no score, or one
    stride = KEYS_PER_CHUNK // 2
    while stride > 0:                        # log2(KEYS_PER_CHUNK) rounds, halving the active threads
        cuda.syncthreads()                   # wait: the last round's pairs are written
        if tid < stride:                     # slot tid takes in slot tid + stride
            m_a, m_b = m_s[tid], m_s[tid + stride]
            m = max(m_a, m_b)
            if m > -math.inf:                # two empty pairs stay (-inf, 0): exp(-inf + inf) is NaN
                l_s[tid] = l_s[tid] * math.exp(m_a - m) + l_s[tid + stride] * math.exp(m_b - m)
                m_s[tid] = m
        stride //= 2
    cuda.syncthreads()                       # wait: slot 0 holds the whole chunk's pair
    m, l = m_s[0], l_s[0]
    cuda.syncthreads()                       # wait: every thread has read it before the slots are reused
    return m, l


@cuda.jit
def chunk_stats_kernel(scores, n_keys, m_out, l_out):
    """chunk_stats over each block's row of scores: thread t of block b holds scores[b, t] when
    t < n_keys[b], -inf otherwise; m_out[b, t], l_out[b, t] receive the (m, l) thread t got. scores,
    m_out, l_out: (blocks, KEYS_PER_CHUNK) float32; n_keys: (blocks,) int. Blocks of KEYS_PER_CHUNK.
    Each thread writes both scratch slots of its own as soon as the first call returns, as a caller
    may (chunk_partial does), then calls it again: a thread still reading the first result when
    another writes its slots is a race."""
    m_s = cuda.shared.array(KEYS_PER_CHUNK, np.float32)
    l_s = cuda.shared.array(KEYS_PER_CHUNK, np.float32)
    b, t = cuda.blockIdx.x, cuda.threadIdx.x
    s = scores[b, t] if t < n_keys[b] else np.float32(-math.inf)
    m, l = chunk_stats(s, m_s, l_s)
    m_s[t], l_s[t] = m, l                           # the caller's own use of the scratch, right away
    m, l = chunk_stats(s, m_s, l_s)                 # the same pairs again, in the same slots
    m_out[b, t] = m
    l_out[b, t] = l


@cuda.jit(device=True)
def chunk_partial(q, k_cache, v_cache, h, g, c, n_keys, scale, lse_part, o_part, tile, a_s, b_s):
    """Chunk c's partial of query head h (kv head g, n_keys positions), by every thread of the block:
    lse_part[h, c] = m + log l, o_part[h, c, e] = sum_t exp(s_t - m) v_t[e] / l. tile (KEYS_PER_CHUNK,
    MAX_D + 1), a_s and b_s (KEYS_PER_CHUNK,): shared float32 scratch. The keys are staged as one run
    of the cache, the values read straight from it (each serves one thread once)."""
    tid, d_k, start = cuda.threadIdx.x, q.shape[1], c * KEYS_PER_CHUNK
    for i in range(tid, n_keys * d_k, KEYS_PER_CHUNK):      # the keys, one run: lanes side by side
        tile[i // d_k, i % d_k] = k_cache[g, start + i // d_k, i % d_k]
    cuda.syncthreads()                                      # wait: the chunk's keys are staged
    s = scale * row_dot(q[h], tile, tid, d_k) if tid < n_keys else np.float32(-math.inf)   # weight 0
    m, l = chunk_stats(s, a_s, b_s)                         # the chunk's max and sum, in every thread
    a_s[tid] = math.exp(s - m)                              # the weights, <= 1, exactly 1 at the max
    cuda.syncthreads()                                      # wait: every weight is in
    for e in range(tid, d_k, KEYS_PER_CHUNK):               # neighbouring lanes, neighbouring addresses
        acc = np.float32(0.0)
        for t in range(n_keys):
            acc += a_s[t] * v_cache[g, start + t, e]
        o_part[h, c, e] = acc / l
    if tid == 0:                                            # one writer per partial
        lse_part[h, c] = m + math.log(l)


@cuda.jit
def chunk_partial_kernel(q, k_cache, v_cache, length, scale, lse_part, o_part):
    """Split-K decoding, step 1, a block per (chunk c, query head h): chunk_partial of both.

    q: (n_head, d_k); k_cache, v_cache: (n_kv_head, capacity, d_k), query head h reading kv head
    h // (n_head // n_kv_head); length: filled positions; scale: 1/sqrt(d_k); writes lse_part
    (n_head, n_chunks) and o_part (n_head, n_chunks, d_k); float32. Grid: chunk_grid(n_head,
    length), blocks of KEYS_PER_CHUNK threads. Each cached number is read once per query head
    (decode_kernel_v2 reads it once per kv head, for its whole group).
    """
    tile = cuda.shared.array(TILE_SHAPE, np.float32)        # a chunk's rows, one position per row
    a_s = cuda.shared.array(KEYS_PER_CHUNK, np.float32)     # a number per thread
    b_s = cuda.shared.array(KEYS_PER_CHUNK, np.float32)     # and another
    c, h = cuda.blockIdx.x, cuda.blockIdx.y
    n_keys = min(KEYS_PER_CHUNK, length - c * KEYS_PER_CHUNK)   # the last chunk may be short
    chunk_partial(q, k_cache, v_cache, h, h // (q.shape[0] // k_cache.shape[0]), c, n_keys, scale,
                  lse_part, o_part, tile, a_s, b_s)


@cuda.jit
def decode_merge_kernel(lse_part, o_part, out, lse):
    """Split-K decoding, step 2: the chunks' (LSE_c, o_c) merged with log-sum-exp, one thread per
    output component: out[h, e] = sum_c w_c o_part[h, c, e] / sum_c w_c, w_c = exp(LSE_c - M),
    M = max_c LSE_c; lse[h] = M + log sum_c w_c, the whole row's log-sum-exp.

    lse_part: (n_head, n_chunks); o_part: (n_head, n_chunks, d_k); out: (n_head, d_k) and lse:
    (n_head,), written; float32. Grid: x over e, y over heads, blocks of MERGE_BLOCK.
    """
    e, h = cuda.grid(2)                          # x along the output's components, y along the heads
    if h < out.shape[0] and e < out.shape[1]:    # edge blocks hang past the output
        big = np.float32(-math.inf)
        for c in range(lse_part.shape[1]):
            big = max(big, lse_part[h, c])       # M, the largest LSE_c
        total, acc = np.float32(0.0), np.float32(0.0)
        for c in range(lse_part.shape[1]):
            w = math.exp(lse_part[h, c] - big)   # <= 1, exactly 1 for the largest: no overflow
            total += w
            acc += w * o_part[h, c, e]
        out[h, e] = acc / total                  # the shares w / total sum to 1
        if e == 0:                               # one thread per head writes its log-sum-exp
            lse[h] = big + math.log(total)


# --- Launchers -------------------------------------------------------------------------------

KERNELS = {1: decode_kernel_v1, 2: decode_kernel_v2}


def n_chunks(length):
    """Chunks of KEYS_PER_CHUNK positions covering `length` cached positions."""
    return ceil_div(length, KEYS_PER_CHUNK)


def decode_grid(n_head, d_k, length, version, n_kv_head=None):
    """[(grid, block), ...] of the launches of one decode step, in order; n_kv_head None: n_head.

    Version 1: a block per kv head, of one thread per query head of its group; version 2: a
    block per (chunk, kv head), then the merge over (component, query head).
    """
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    if version == 1:
        return [(n_kv_head, n_head // n_kv_head)]
    merge_grid = (ceil_div(d_k, MERGE_BLOCK[0]), ceil_div(n_head, MERGE_BLOCK[1]))
    return [((n_chunks(length), n_kv_head), KEYS_PER_CHUNK), (merge_grid, MERGE_BLOCK)]


def chunk_grid(n_head, length):
    """(grid, block) of chunk_partial_kernel: a block per (chunk, query head), KEYS_PER_CHUNK threads."""
    return (n_chunks(length), n_head), KEYS_PER_CHUNK


def _check_query(q, cache):
    """q as a float32 (n_head, d_k) array matching the cache."""
    # Duck-typed, so that a KVCache class typed into a notebook works as well as this one.
    require(all(hasattr(cache, a) for a in ("k_device", "v_device", "length", "n_head", "n_kv_head", "d_k")),
            f"cache must be a KVCache, got {type(cache).__name__}")
    hint = f"(n_head, d_k) = ({cache.n_head}, {cache.d_k}) or ({cache.n_head}, 1, {cache.d_k})"
    q = as_float32("q", q, hint, min_ndim=2)
    shape_ok = q.shape == (cache.n_head, cache.d_k) or q.shape == (cache.n_head, 1, cache.d_k)
    require(shape_ok, f"q must have shape {hint} to match the cache, got {q.shape}")
    require(cache.length > 0, "cache is empty: append the new token's k and v before decode_step")
    return q.reshape(cache.n_head, cache.d_k)                 # (n_head, d_k)


def decode_step(q, cache, version=2, kernel=None, merge_kernel=None):
    """Attention of one new query per head over every cached position, on the device.

    q: (n_head, d_k) or (n_head, 1, d_k) float, the new token's queries; cache: KVCache
    holding positions 0 .. length - 1 of its n_kv_head heads, the new token's own k and v
    included (append first) -> (n_head, d_k) float32: softmax(q K^T / sqrt(d_k)) V per query
    head h over the filled positions of kv head h // (n_head // n_kv_head).
    version 1: a block per kv head, a thread per query head; 2: split-K, a block per
    (chunk, kv head) then a merge.
    kernel: replaces the version's first kernel (same signature), launched the same way;
    merge_kernel: replaces version 2's decode_merge_kernel.
    """
    check_version(version, KERNELS)
    q = _check_query(q, cache)
    require(version == 2 or cache.group <= MAX_THREADS_PER_BLOCK,
            f"version 1 runs a block of n_head // n_kv_head threads, at most {MAX_THREADS_PER_BLOCK}: "
            f"cache has {cache.group}; use version 2")
    n_head, n_kv_head, d_k, length = cache.n_head, cache.n_kv_head, cache.d_k, cache.length
    launches = decode_grid(n_head, d_k, length, version, n_kv_head)
    if version == 1:
        check_grid("decode_step", launches[0][0], x="the cache's n_kv_head")
    else:
        check_grid("decode_step", launches[0][0], x="the cache's length in chunks", y="the cache's n_kv_head")
    check_simulator_budget("decode_step", sum(math.prod(np.atleast_1d(g)) * math.prod(np.atleast_1d(b))
                                              for g, b in launches), 2 * n_head * length * d_k)
    library_kernels = kernel is None and merge_kernel is None     # a kernel passed in answers for itself
    kernel = KERNELS[version] if kernel is None else kernel
    scale = scores.scale_factor(d_k)
    d_q = cuda.to_device(q)
    out = cuda.device_array((n_head, d_k), np.float32)
    (grid, block), *merge = launches
    if version == 1:
        kernel[grid, block](d_q, cache.k_device, cache.v_device, length, scale, out)
    else:
        chunks = n_chunks(length)
        lse_part = cuda.device_array((n_head, chunks), np.float32)       # each chunk's log-sum-exp
        o_part = cuda.device_array((n_head, chunks, d_k), np.float32)    # and its normalised output
        kernel[grid, block](d_q, cache.k_device, cache.v_device, length, scale, lse_part, o_part)
        (grid, block), = merge
        lse = cuda.device_array(n_head, np.float32)                      # the row's: kept by a backward
        (merge_kernel or decode_merge_kernel)[grid, block](lse_part, o_part, out, lse)
    out = out.copy_to_host()                                      # (n_head, d_k)
    if library_kernels:
        require_finite_result("decode_step", out, "q or the cached keys and values")
    return out


def chunk_partials_device(q, cache, kernel=None):
    """Every chunk's partial of every query head, by chunk_partial_kernel (or `kernel`, same
    signature and launch): q (n_head, d_k) or (n_head, 1, d_k) float, cache: KVCache -> (lse_part
    (n_head, n_chunks), o_part (n_head, n_chunks, d_k)), float32, as chunk_partials gives them."""
    q = _check_query(q, cache)
    n_head, d_k, length = cache.n_head, cache.d_k, cache.length
    grid, block = chunk_grid(n_head, length)
    check_grid("chunk_partials_device", grid, x="the cache's length in chunks", y="the cache's n_head")
    check_simulator_budget("chunk_partials_device", grid[0] * grid[1] * block, 2 * n_head * length * d_k)
    lse_part = cuda.device_array((n_head, grid[0]), np.float32)
    o_part = cuda.device_array((n_head, grid[0], d_k), np.float32)
    (chunk_partial_kernel if kernel is None else kernel)[grid, block](
        cuda.to_device(q), cache.k_device, cache.v_device, length, scores.scale_factor(d_k), lse_part, o_part)
    return lse_part.copy_to_host(), o_part.copy_to_host()


# --- A multi-head attention layer with a cache ------------------------------------------------
# Biases are left out: they add a constant to each token's q, k, v and output, and change
# nothing about the cache.

def qkv_heads(x, w_q, w_k, w_v, n_head, n_kv_head=None):
    """Project x to q, k and v on the device and cut each into heads, as multi_head_attention does.

    x: (T, d_model) float; w_q: (d_model, d_model); w_k, w_v: (d_model, n_kv_head * d_k),
    d_k = d_model // n_head, n_kv_head None meaning n_head -> (q, k, v): q (n_head, T, d_k),
    k and v (n_kv_head, T, d_k), float32. One fused projection [Q | K | V] = x @ [W_Q | W_K | W_V]
    (notebook 01); the split is a reshape and a transpose, done by NumPy here.
    """
    T, d_model = x.shape
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    w_qkv = np.concatenate([w_q, w_k, w_v], axis=1)                # (d_model, (n_head + 2 n_kv_head) d_k)
    qkv = projection.project(x, w_qkv, version=PROJECTION_VERSION)   # (T, (n_head + 2 n_kv_head) d_k)
    heads = qkv.reshape(T, n_head + 2 * n_kv_head, d_model // n_head)   # (T, heads of q, k, v, d_k)
    heads = np.ascontiguousarray(heads.transpose(1, 0, 2))         # (n_head + 2 n_kv_head, T, d_k)
    return heads[:n_head], heads[n_head:n_head + n_kv_head], heads[n_head + n_kv_head:]


def prefill(x, w_q, w_k, w_v, w_o, cache):
    """The whole prompt in one causal pass; its keys and values go into the cache.

    x: (T, d_model) float, the layer's input at the prompt's positions; w_q, w_o: (d_model,
    d_model); w_k, w_v: (d_model, n_kv_head * d_k); cache: an empty KVCache with
    d_k = d_model / n_head -> (T, d_model) float32.
    """
    q, k, v = qkv_heads(x, w_q, w_k, w_v, cache.n_head, cache.n_kv_head)   # (n_head | n_kv_head, T, d_k)
    cache.append(k, v)                                            # n_kv_head heads: one copy each
    # attention.attention wants a key and value head per query head: kv head g repeated for
    # its group (query heads g * group .. g * group + group - 1), for this one prefill call.
    keys, values = (np.repeat(a, cache.group, axis=0) for a in (k, v))   # (n_head, T, d_k)
    heads = attention.attention(q, keys, values, causal=True)     # (n_head, T, d_k)
    merged = heads.transpose(1, 0, 2).reshape(x.shape)            # (T, n_head, d_k) -> (T, d_model)
    return projection.project(merged, w_o, version=PROJECTION_VERSION)


def decode_layer_step(x_new, w_q, w_k, w_v, w_o, cache, version=2):
    """One new token through the layer: project it, append its k and v, attend to the cache.

    x_new: (d_model,) float, the layer's input at the new position; w_q, w_o: (d_model,
    d_model); w_k, w_v: (d_model, n_kv_head * d_k); cache: the layer's KVCache, holding the
    earlier positions -> (d_model,) float32, the layer's output at the new position. The cache
    grows by one position.
    """
    x_new = np.reshape(x_new, (1, -1))                            # (1, d_model): a sequence of one
    q, k, v = qkv_heads(x_new, w_q, w_k, w_v, cache.n_head, cache.n_kv_head)   # (heads, 1, d_k)
    cache.append(k, v)                                            # first: the token sees itself too
    heads = decode_step(q, cache, version)                        # (n_head, d_k)
    merged = heads.reshape(1, -1)                                 # (1, d_model): one row, heads side by side
    return projection.project(merged, w_o, version=PROJECTION_VERSION)[0]   # (d_model,)


def _check_layer_weights(d_model, n_head, n_kv_head, **weights):
    """The four weights as float32, W_K and W_V of (d_model, n_kv_head * d_k); one-line errors."""
    require(isinstance(n_head, (int, np.integer)) and n_head > 0 and d_model % n_head == 0,
            f"n_head must be a positive int dividing d_model {d_model}, got {n_head!r}")
    require(isinstance(n_kv_head, (int, np.integer)) and n_kv_head > 0 and n_head % n_kv_head == 0,
            f"n_kv_head must be a positive int dividing n_head = {n_head}, got {n_kv_head!r}")
    d_kv = n_kv_head * (d_model // n_head)                        # W_K's and W_V's columns
    checked = []
    for name, w in weights.items():
        shape = (d_model, d_kv) if name in ("w_k", "w_v") else (d_model, d_model)
        why = "d_model = the last axis of x" + (", n_kv_head * d_k" if shape[1] != d_model else "")
        checked.append(weight(name, w, shape, f"{shape}", why))
    return checked


def generate_layer_outputs(x, w_q, w_k, w_v, w_o, n_head, n_prompt=1, version=2, n_kv_head=None):
    """Run a layer as a generator does: prefill the first n_prompt positions, then one at a time.

    x: (T, d_model) float; w_q, w_o: (d_model, d_model) float; w_k, w_v: (d_model,
    n_kv_head * d_k), d_k = d_model // n_head; n_kv_head divides n_head (None: n_head);
    1 <= n_prompt <= T -> (T, d_model) float32, the outputs of one causal pass over all of x
    (multihead.multi_head_attention when n_kv_head = n_head), computed with a KVCache of
    capacity T holding n_kv_head heads.
    """
    x = as_float32("x", x, "(T, d_model)", ndim=2)
    T, d_model = x.shape
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    weights = _check_layer_weights(d_model, n_head, n_kv_head, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o)
    require(isinstance(n_prompt, (int, np.integer)) and 1 <= n_prompt <= T,
            f"n_prompt must be an int between 1 and T = {T}, got {n_prompt!r}")
    cache = KVCache(n_head, T, d_model // n_head, n_kv_head)
    outputs = [prefill(x[:n_prompt], *weights, cache)]           # (n_prompt, d_model)
    for t in range(n_prompt, T):
        outputs.append(decode_layer_step(x[t], *weights, cache, version)[None])   # (1, d_model)
    return np.concatenate(outputs)                                 # (T, d_model)


# --- Sizes and cost --------------------------------------------------------------------------

def cache_bytes(n_layer, n_head, T, d_k, bytes_per_value=4, batch=1, n_kv_head=None):
    """Bytes of a KV cache: a key and a value of d_k numbers for every position, kv head and layer.

    2 * n_layer * n_kv_head * T * d_k * bytes_per_value * batch; n_kv_head None means n_head
    (one kv head per query head); bytes_per_value 4 for float32, 2 for float16. ANDREA-120M,
    T 1024, float32: 2 * 12 * 12 * 1024 * 64 * 4 = 75,497,472 bytes per sequence.
    """
    n_kv_head = n_head if n_kv_head is None else n_kv_head   # the query heads do not count
    return 2 * n_layer * n_kv_head * T * d_k * bytes_per_value * batch


def bytes_per_token(n_layer, n_head, T, d_k, weight_bytes, batch=1, n_kv_head=None, bytes_per_value=4):
    """Main-memory bytes one decode step reads per generated token, at context T.

    A step of a batch of `batch` sequences reads the weights (weight_bytes, the whole model)
    once for all its tokens, and each sequence's own cache of every layer for its token only:
    -> cache_bytes(n_layer, n_head, T, d_k, bytes_per_value, n_kv_head=n_kv_head)
    + weight_bytes / batch, a float. Activations (a few d_model per layer) are left out.
    """
    own_cache = cache_bytes(n_layer, n_head, T, d_k, bytes_per_value, n_kv_head=n_kv_head)
    return own_cache + weight_bytes / batch



def decode_traffic(length, n_head, d_k, version=2, n_kv_head=None):
    """Global-memory loads and stores of one decode_step, per array, as count_memory counts them.

    -> {kernel name: {array: (loads, stores)}}, totals over the launch; n_kv_head None: n_head.
    Both versions read every filled key and value of the n_kv_head heads exactly once, whatever
    the group, and no unfilled slot. Version 1 reads q once; in version 2 the thread of every
    filled position reads its query head's whole q (all at the same address at once), and the
    partials (n_head * n_chunks * (d_k + 1) numbers) are written, then read back by the merge.
    """
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    filled = n_kv_head * length * d_k                    # shared by the group: read once
    if version == 1:
        return {"decode_kernel_v1": {"q": (n_head * d_k, 0), "k_cache": (filled, 0),
                                     "v_cache": (filled, 0), "out": (0, n_head * d_k)}}
    chunks = n_chunks(length)
    return {
        "decode_kernel_v2": {"q": (n_head * length * d_k, 0), "k_cache": (filled, 0),
                             "v_cache": (filled, 0), "lse_part": (0, n_head * chunks),
                             "o_part": (0, n_head * chunks * d_k)},
        # Each of the n_head * d_k merge threads reads its head's LSE_c twice (the max, then the
        # weights) and its own component of every chunk's o; thread e = 0 writes the head's lse.
        "decode_merge_kernel": {"lse_part": (2 * n_head * d_k * chunks, 0),
                                "o_part": (n_head * chunks * d_k, 0), "out": (0, n_head * d_k),
                                "lse": (0, n_head)},
    }


def token_cost(t, d_model, cached=True, bytes_per_value=4):
    """FLOPs and main-memory bytes for one attention layer to produce its output at position t.

    t: positions so far, the new one included (t >= 1); d_model = d -> (flops, bytes); a
    multiply-add is 2 FLOPs; every stage reads its inputs and writes its outputs once (fused).
    Cached: q, k, v and W_O for one row (8 d^2), one query against t keys and values (4 t d);
    traffic: the weights (4 d^2 values), the t cached keys and values (2 t d), 8 d for the rest.
    Without: every projection on t rows (8 t d^2), t (t + 1) / 2 causal pairs scored and mixed
    (2 t (t + 1) d); traffic: the weights, then x, Q, K, V, heads (written and read), output (10 t d).
    """
    d = d_model
    if cached:
        flops = 8 * d * d + 4 * t * d
        values = 4 * d * d + 2 * t * d + 8 * d
    else:
        flops = 8 * t * d * d + 2 * t * (t + 1) * d
        values = 4 * d * d + 10 * t * d
    return flops, values * bytes_per_value
