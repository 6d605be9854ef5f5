"""``09_chunk_partial`` (notebook 09, main): a device function with ``kv_cache.chunk_partial``'s
signature, called once by every thread of block (c, h) of ``kv_cache.chunk_partial_kernel`` (blocks of
KEYS_PER_CHUNK threads, one per chunk and query head): it loads the chunk, scores, reduces and weighs
it, and writes the chunk's log-sum-exp to lse_part[h, c] and its normalised output to o_part[h, c, :],
placing its own barriers (part 1's chunk_stats, the student's own, may give it m and l). The check runs
that kernel around it at the simulator's chunk and a GPU's. Its solution is ``kv_cache.chunk_partial``;
its cases, limits and named mistakes are declared in the ``Exercise`` below.
"""

import math
import re
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib.measure import sanitizer
from attention_lib.stages import kv_cache
from attention_lib.checks import shapes
from attention_lib.checks.engine import Exercise, register
from attention_lib.platform.rebuild import rebuilt
from attention_lib.checks.launch import output_array, RaceFound, read_output, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import (Coalesced, MostBarriers, MostLoads, NoSerialCopy, NoUnwrittenReads,
                                         SharedLoadsPerThread, StoredOnce)
from attention_lib.checks.ex09_chunk_stats import FLOAT_ERRORS, log2_chunk


class ChunkCase(NamedTuple):
    """One size tried: n_head query heads on n_kv_head kv heads of width d_k, `length` positions
    filled; scores random, or "spread" (-700 .. 760 inside each chunk, its first position the
    lowest), "low" (-800 .. -760) or "last high" (the last chunk's 90 .. 100, the others' -50 .. 0),
    exact integers."""

    n_head: int
    n_kv_head: int
    d_k: int
    length: int
    scores: str = "random"

    def __str__(self):
        kind = "" if self.scores == "random" else f", {self.scores} scores"
        return f"(n_head {self.n_head}, n_kv_head {self.n_kv_head}, d_k {self.d_k}, length {self.length}{kind})"


def _chunk_reference(q, keys, values, length, scale, score_padding=None):
    """(n_head, n_chunks, d_k + 1) float64: o_c then LSE_c of every (query head, chunk), chunk c
    holding positions c * KEYS_PER_CHUNK .. of kv head h // group, cut at `length`; with
    score_padding, the missing positions of the last chunk counted with that score and no value."""
    n_head, d_k = q.shape
    group, size = n_head // keys.shape[0], kv_cache.KEYS_PER_CHUNK
    chunks = kv_cache.n_chunks(length)
    out = np.zeros((n_head, chunks, d_k + 1))
    for h in range(n_head):
        for c in range(chunks):
            span = slice(c * size, min((c + 1) * size, length))
            s = keys[h // group, span].astype(np.float64) @ q[h].astype(np.float64) * float(scale)
            padded = np.concatenate([s, np.full(size - len(s), score_padding)]) if score_padding is not None else s
            p = np.exp(padded - padded.max())
            out[h, c, :d_k] = p[:len(s)] @ values[h // group, span].astype(np.float64) / p.sum()
            out[h, c, d_k] = padded.max() + np.log(p.sum())
    return out


def _integer_scores(kind, length, rng):
    """The scores of one kv head's `length` positions, exact integers, as ChunkCase describes."""
    size = kv_cache.KEYS_PER_CHUNK
    if kind == "low":
        return rng.integers(-800, -759, length)
    if kind == "last high":
        last = (kv_cache.n_chunks(length) - 1) * size
        return np.concatenate([rng.integers(-50, 1, last), rng.integers(90, 101, length - last)])
    scores = rng.integers(-700, 761, length)             # spread: in each chunk the first the lowest,
    for start in range(0, length, size):                 # the middle one the largest
        filled = min(size, length - start)
        scores[start], scores[start + filled // 2] = -700, 760
    return scores


def _chunk_inputs(case, rng):
    """(q, keys, values, scale) of a case, float32; unfilled cache slots NaN. Integer scores: q = 8
    times the first unit vector and scale 1/8, so that s_t is the key's first component, exactly."""
    n_head, n_kv_head, d_k, length, kind = case
    keys = np.full((n_kv_head, length + 2, d_k), np.nan, np.float32)     # unfilled slots: NaN
    values = keys.copy()
    keys[:, :length], values[:, :length] = rng.standard_normal((2, n_kv_head, length, d_k))
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(d_k))
    if kind != "random":
        q[:] = 0.0
        q[:, 0], scale = 8.0, np.float32(0.125)
        for g in range(n_kv_head):
            keys[g, :length, 0] = _integer_scores(kind, length, rng)
    return q, keys, values, scale


def _kernel_around(answer, size):
    """chunk_partial_kernel with the answer in chunk_partial's place, its names those of the kv_cache
    module when built (KEYS_PER_CHUNK = size, TILE_SHAPE: the configuration's)."""
    return rebuilt(kv_cache.chunk_partial_kernel, {"chunk_partial": answer, "KEYS_PER_CHUNK": size})


def _partials(kernel, q, keys, values, length, scale, launch):
    """The kernel's (n_head, n_chunks, d_k + 1) output, o_c then LSE_c, launched on chunk_grid."""
    n_head, d_k = q.shape
    chunks, size = kv_cache.n_chunks(length), kv_cache.KEYS_PER_CHUNK
    full_lse, lse_part = output_array((n_head, chunks), guard=size)
    full_o, o_part = output_array((n_head, chunks, d_k), guard=size * d_k)
    grid, block = kv_cache.chunk_grid(n_head, length)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(keys), cuda.to_device(values), length, scale,
           lse_part, o_part)
    return np.concatenate([read_output(full_o, o_part), read_output(full_lse, lse_part)[..., None]], axis=2)


def _right_on(kernel, scores, launch):
    """Whether the kernel gets one chunk of one head right whose scores are `scores` (exact integers)."""
    size = kv_cache.KEYS_PER_CHUNK
    q = np.zeros((1, 16), np.float32)
    q[0, 0] = 8.0
    keys = np.zeros((1, size, 16), np.float32)
    keys[0, :, 0] = scores
    values = np.linspace(-1.0, 1.0, size * 16, dtype=np.float32).reshape(1, size, 16)
    expected = _chunk_reference(q, keys, values, size, np.float32(0.125))
    try:
        got = _partials(kernel, q, keys, values, size, np.float32(0.125), launch)
    except Exception:  # noqa: BLE001  (whatever the answer raises, this chunk is not right)
        return False
    return bool(np.allclose(got, expected, rtol=1e-5, atol=1e-5))


def _name_the_max(kernel, kind, launch):
    """Diagnosed for an answer wrong on a case of far-apart scores, from one chunk tried three
    more ways: the largest score first, every score 760, every score below -760."""
    size = kv_cache.KEYS_PER_CHUNK
    if kind == "spread":
        if not _right_on(kernel, np.full(size, 760), launch):
            raise Diagnosed("unstable_softmax", (
                "inf or NaN even when every score of the chunk is 760: exp(s) overflows float32 above 88.7; "
                "take every exponential against the chunk's max, exp(s - m)"))
        first_largest = np.where(np.arange(size) % 2 == 0, -700, 0)
        first_largest[0] = 760
        if _right_on(kernel, first_largest, launch):
            raise Diagnosed("m_is_first_score", (
                "inf or NaN where a chunk's largest score lies 1460 above its first, but right when the largest "
                "comes first: m was the chunk's first score (or a max over part of the chunk), so exp(s - m) "
                "overflowed; m must be the largest of all the chunk's scores"))
        raise Diagnosed("m_is_own_score", (
            "right when every score is equal, inf or NaN when the scores spread past 88: the threads did not "
            "share one m (each took its own score, say), so exp(s - m) overflowed in a thread whose m lay far "
            "below the chunk's max; reduce the scores to the chunk's max and give it to every thread"))
    if kind == "low":
        if not _right_on(kernel, np.arange(-800, -800 + size), launch):
            raise Diagnosed("max_from_zero", (
                "NaN where every score lies below -760: m came out 0, above every score, so every exp(s - m) "
                "underflowed to 0 and l = 0; start the max from -inf, not from 0"))
        raise Diagnosed("partial_chunk", (
            "NaN in the short last chunk where every score lies below -760, right in full chunks: a thread "
            "without a position gave the max a 0 (above every score), so l = 0; give it -inf instead"))


def _run_chunk_partial(answer, case, rng, launch):
    kernel = _kernel_around(answer, kv_cache.KEYS_PER_CHUNK)
    q, keys, values, scale = _chunk_inputs(case, rng)
    length = case.length
    expected = _chunk_reference(q, keys, values, length, scale)
    try:
        got = _partials(kernel, q, keys, values, length, scale, launch)
    except RaceFound as race:
        _name_overwritten_partials(str(race))
        raise
    except FLOAT_ERRORS:
        # The simulator's math.exp raises past float64's range and math.log(0) raises; a GPU's float32
        # exp returns inf and its log of 0 gives -inf.
        if case.scores == "random":
            raise
        got = np.full(expected.shape, np.nan)
    if case.scores != "random" and not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        _name_the_max(kernel, case.scores, launch)
    never = unwritten(got)
    size, d_k = kv_cache.KEYS_PER_CHUNK, case.d_k
    if d_k > size and never[:, :, size:d_k].all() and not never[:, :, :size].any():
        raise Diagnosed("components_not_strided", (
            f"output components {size} .. {d_k - 1} were never written: a block has {size} threads for "
            f"{d_k} components, so a thread takes more than one"))
    return got, expected, q, keys, values, length, scale


def _name_overwritten_partials(race):
    """Diagnosed when the race is two writes of one partial (global lse_part or o_part), not a
    missing barrier around shared memory; nothing otherwise."""
    if "global 'lse_part'" not in race and "global 'o_part'" not in race:
        return
    blocks = set(re.findall(r"block (\([^)]*\))", race))
    element = "".join(re.search(r"'(\w+)'(\[[^]]*\])", race).groups())      # lse_part[0, 0]
    if len(blocks) > 1:
        raise Diagnosed("blocks_overwrite_partials", (
            f"{element} was written by two blocks, {' and '.join(sorted(blocks))}: the block of chunk c and "
            "query head h writes lse_part[h, c] and o_part[h, c, :] only"))
    raise Diagnosed("threads_overwrite_partials", (
        f"{element} was written by two threads of one block: each partial needs one writer (one thread "
        "for lse_part, one per component of o_part)"))


def _chunk_max(q, keys, length, scale, h, c):
    """The largest scaled score of query head h in chunk c (the right chunk and kv head)."""
    size, group = kv_cache.KEYS_PER_CHUNK, q.shape[0] // keys.shape[0]
    span = slice(c * size, min((c + 1) * size, length))
    return float((keys[h // group, span].astype(np.float64) @ q[h].astype(np.float64) * float(scale)).max())


def _diagnose_chunk_partial(got, expected, q, keys, values, length, scale):
    close = dict(rtol=1e-4, atol=1e-4)
    d_k, size = q.shape[1], kv_cache.KEYS_PER_CHUNK
    o, lse = expected[..., :d_k], expected[..., d_k]
    with np.errstate(all="ignore"):
        if np.allclose(got[..., d_k], lse, **close):
            # lse right: l = exp(lse - m) is known only through the output's normalisation
            m = np.array([[_chunk_max(q, keys, length, scale, h, c) for c in range(expected.shape[1])]
                          for h in range(q.shape[0])])
            if np.allclose(got[..., :d_k], o * np.exp(m)[..., None], **close):
                return "unstable_softmax", (
                    "o_part is each chunk's output times exp(m): the weights were exp(s), divided by "
                    "l = sum of exp(s - m). Take every weight against the chunk's max, exp(s - m), as l is "
                    "(exp(s) alone also overflows float32 above 88.7)")
            ratio = got[..., :d_k] / np.where(o == 0, 1, o)
            constant = np.isfinite(ratio).all() and np.allclose(ratio, ratio[..., :1], **close)
            if constant and not np.allclose(ratio, 1, **close):
                return "output_not_normalised", ("o_part is sum_t exp(s_t - m) v_t: divide it by l, the sum of "
                                                 "the weights, so that each chunk hands over its own softmax's output")
        if np.allclose(got[..., :d_k], o, **close):
            m = np.array([[_chunk_max(q, keys, length, scale, h, c) for c in range(expected.shape[1])]
                          for h in range(q.shape[0])])
            if np.allclose(got[..., d_k], m, **close):
                return "lse_is_max", "lse_part holds m, the chunk's largest score: the log-sum-exp is m + log l"
            if np.allclose(got[..., d_k], lse - m, **close):
                return "lse_without_max", "lse_part holds log l: the weights were taken against m, so add m back"
        if np.allclose(got, _chunk_reference(q, keys, values, length, np.float32(1.0)), **close):
            return "missing_scale", "the scores were not multiplied by scale = 1/sqrt(d_k)"
        full = np.arange(expected.shape[1]) < length // size                 # the chunks holding size positions
        if full.any() and not full.all() and np.allclose(got[:, full], expected[:, full], **close):
            return "partial_chunk", (f"right in every full chunk, wrong in the last one, which holds only "
                                     f"{length % size} of its {size} positions: score, reduce and weigh those "
                                     "only (a thread without a position adds nothing to the max or the sum)")
    return None


def _chunk_cases(configuration):
    """Sizes around the configuration's chunk n (KEYS_PER_CHUNK, 8 or 32): 2 query heads on 1 kv
    head, narrower than the block, over 3 chunks, the last short; one exact chunk at d_k 64; one
    short of a chunk, multi-query, d_k 64; one past a chunk, multi-query, d_k 128; a single position;
    two chunks whose scores spread past exp's range; all scores low, the last chunk short; the last
    chunk's scores 90 above the others'."""
    n = kv_cache.SHAPE_CONSTANTS["KEYS_PER_CHUNK"][0 if configuration == shapes.SIMULATOR else 1]
    return [ChunkCase(2, 1, n // 2 + 1, 2 * n + 3), ChunkCase(2, 2, 64, n), ChunkCase(2, 1, 64, n - 1),
            ChunkCase(2, 1, 128, n + 1), ChunkCase(3, 3, 24, 1), ChunkCase(2, 1, 16, 2 * n, "spread"),
            ChunkCase(2, 2, 16, n + 3, "low"), ChunkCase(1, 1, 16, n + 5, "last high")]


class _InWholeWarps:
    """A limit on what a warp does, measured where a block is a whole warp (a GPU's launch): at the
    simulator's, a warp of 32 threads spans 4 blocks of 8, each in a chunk of its own and some short,
    so neither its segments nor its lanes side by side say anything about one block."""

    def __init__(self, limit):
        self.limit, self.code = limit, limit.code

    def broken(self, traces, case, compiled):
        if kv_cache.KEYS_PER_CHUNK < 32:
            return None
        message = self.limit.broken(traces, case, compiled)
        return (self.code, message) if message else None


def _group(case):
    return case.n_head // case.n_kv_head


def _values_staged(traces):
    """Whether a block wrote more of the tile than one row of d_k + 1 a position it wrote (the values
    copied in beside or over the keys) and a thread read the tile in two rows or more."""
    for traced in traces:
        target = traced.launch.targets.get("tile")
        if target is None:
            continue
        width = target.shape[1]
        writes, rows, read_rows = {}, {}, {}
        for element, kind, (block, thread), *_ in target.trace:
            if kind == sanitizer.LOAD:
                read_rows.setdefault((block, thread), set()).add(element // width)
            else:
                writes[block] = writes.get(block, 0) + 1
                rows.setdefault(block, set()).add(element // width)
        d_k = traced.launch.targets["q"].shape[1]
        staged_twice = any(writes[b] > len(rows[b]) * (d_k + 1) for b in writes)
        if staged_twice and any(len(seen) > 1 for seen in read_rows.values()):
            return True
    return False


class _SharedReadsNamed:
    """The shared-read limit, named ``values_staged`` where the values went through the tile (a read of
    each from shared memory on top of the weights'), ``serial_reduction`` otherwise."""

    def __init__(self, limit):
        self.limit, self.code = limit, limit.code

    def broken(self, traces, case, compiled):
        message = self.limit.broken(traces, case, compiled)
        if message is None:
            return None
        if not _values_staged(traces):
            return self.code, message
        reads = max(t.shared_loads_per_thread() for t in traces)
        return "values_staged", (
            f"the values are right, but one thread read shared memory {reads} times, where the limit is "
            f"{_shared_reads(case)}: the values went through the tile, yet each value serves one thread "
            f"once (the one that owns its component), so read V from the cache straight, and keep only "
            f"the keys and the weights in shared memory")


def _shared_reads(case):
    """A key's row (d_k), one weight a position for each component a thread owns (n ceil(d_k / n)),
    two trees of log2 n rounds (2 reads a round in one, 3 in the other) and 4 more; n = KEYS_PER_CHUNK.
    A max or a sum walked over the chunk's scores adds n - 4 or more at a GPU's launch (n = 32)."""
    n = kv_cache.KEYS_PER_CHUNK
    return case.d_k + n * math.ceil(case.d_k / n) + 5 * log2_chunk() + 4


register(Exercise(
    exercise_id="09_chunk_partial",
    kind="device function",
    both_shapes=True,
    run=_run_chunk_partial,
    cases=_chunk_cases,
    hint=("every score of the chunk is needed by every output component, so the block computes each score "
          "once and shares it; part 1 gives every thread the chunk's max and sum, and each weight is then "
          "one exponential, shared in turn"),
    more_hints=("the plan: the block first copies the chunk's keys into shared memory, its threads side by "
                "side along the cache; after a barrier each thread scores one position, and a thread without "
                "one holds minus infinity; part 1 gives every thread m and l, each thread turns its score into "
                "a weight and keeps it in shared memory, and after a barrier each thread owns some output "
                "components, walks the positions reading each value straight from the cache, and one thread "
                "writes the log-sum-exp; the limits count that plan: a barrier after the staging, those of "
                "part 1, and one after the weights; a thread's shared reads are its key's row, one weight a "
                "position for each component it owns, and those of part 1",
                "where answers go wrong: m taken from the first score or from the thread's own score (right "
                "until scores spread past 88), a max started from 0 (every weight underflows when all scores "
                "lie below -104), a barrier inside a test on the thread index, a short last chunk whose missing "
                "positions join the max or the sum, weights read before every thread has written its own, a "
                "loop over all scores in one thread (the serial limit), the values staged in shared memory "
                "like the keys though each serves one thread once, a component loop that stops at the "
                "block's size, a component summed in o_part itself, stored again at every position"),
    # float32 sums of up to KEYS_PER_CHUNK terms and dot products of up to 128 against float64
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_chunk_partial,
    diagnoses=("m_is_first_score", "m_is_own_score", "unstable_softmax", "max_from_zero", "partial_chunk",
               "output_not_normalised", "lse_is_max", "lse_without_max", "missing_scale",
               "blocks_overwrite_partials", "threads_overwrite_partials", "components_not_strided",
               "values_staged", "output_rewritten"),
    solution=kv_cache.chunk_partial,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v1, kv_cache.decode_kernel_v2, kv_cache.attend_chunk,
               kv_cache.weighted_value, kv_cache.stage_tile, kv_cache.attend_tile, kv_cache.online_step,
               kv_cache.chunk_partial_kernel, kv_cache.chunk_partials_device, kv_cache.decode_merge_kernel),
    limits=(MostLoads("k_cache", _group, why="each query head reads its chunk of the cache once"),
            MostLoads("v_cache", _group, why="each query head reads its chunk of the cache once"),
            *(_InWholeWarps(limit) for limit in (Coalesced("k_cache", 2), Coalesced("v_cache", 2),
                                                 Coalesced("o_part", 2, access="store"),
                                                 NoSerialCopy("k_cache"), NoSerialCopy("v_cache"))),
            NoUnwrittenReads(why="read only the rows of the chunk's filled positions"),
            _SharedReadsNamed(SharedLoadsPerThread(
                _shared_reads, why="the limit is a key's row, one weight a position for each component a thread "
                                   "owns, and two trees of log2(KEYS_PER_CHUNK) rounds; a max or a sum walked "
                                   "over all the chunk's scores by one thread (or by each) goes past it")),
            MostBarriers(lambda case: 2 * log2_chunk() + 7,
                         why="room for reductions of log2(KEYS_PER_CHUNK) rounds and a few barriers around them; "
                             "the second hint counts them"),
            # The contract writes the normalised o_c and the LSE, each element by one thread: a partial
            # summed in o_part (a read-modify-write of main memory at every position) or stored before
            # it is final stores an element twice.
            StoredOnce("o_part", why="add up each component in a register and store it once, divided by l"),
            StoredOnce("lse_part", why="compute m + log l and store it once")),
))
