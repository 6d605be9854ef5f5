"""Notebook 09's exercises, with their typical mistakes named: the log-sum-exp merge of split-K
partials (warm-up) and one query head's partial of a staged chunk, inside the split-K kernel
(main), below."""

import functools
import math
import re
import types
import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib.stages import kv_cache
from attention_lib.checks import shapes
from attention_lib.checks.engine import (Diagnosed, Exercise, RaceFound, output_array, read_output, register,
                                         traced_launch, unwritten)
from attention_lib.checks.limits import NoUnwrittenReads, SharedLoadsPerThread


# --- Warm-up: the log-sum-exp merge of split-K partials, as a kernel --------------------------
# The answer has decode_merge_kernel's signature ``(lse_part, o_part, out, lse)``: lse_part
# (n_head, n_chunks) and o_part (n_head, n_chunks, d_v) float32 are each chunk's log-sum-exp
# LSE_c = m_c + log l_c and its normalised output o_c = acc_c / l_c; it writes out (n_head, d_v) =
# sum_c exp(LSE_c - LSE) o_c and lse (n_head,) = LSE = log sum_c exp(LSE_c), both computed from the
# weights exp(LSE_c - M), M = max_c LSE_c. It is launched as decode_merge_kernel is: a 2-D grid over
# (component e, head h), kv_cache.MERGE_BLOCK threads to a block. A chunk whose keys were all
# masked has LSE_c = -inf and o_c = 0. Besides the engine's diagnoses:
#
# - ``unstable_softmax``: exp of the raw LSE_c, which overflows once an LSE passes 88.7;
# - ``max_not_largest``: inf or NaN where a head's LSEs spread past 88 or one is -inf: M was not the
#   largest LSE_c (the first chunk's, say), so some exp(LSE_c - M) overflows;
# - ``merge_unweighted``: the chunks' outputs averaged (or summed) with equal weights;
# - ``weights_not_normalised``: sum_c exp(LSE_c - M) o_c, without dividing by sum_c exp(LSE_c - M);
# - ``weights_from_rounded_lse``: right to about 1e-4 but not 1e-5 at LSEs near +-1000: the weights
#   exp(LSE_c - LSE) of a float32 LSE (a step of 6e-5 near 1000), which then do not sum to 1;
# - ``lse_is_max``: the merged lse written as M alone, without + log sum_c exp(LSE_c - M);
# - ``lse_without_max``: the outputs right, the merged lse written as log sum_c exp(LSE_c - M), without M.

class LseCase(NamedTuple):
    """One size tried: n_head heads of n_chunks partials with d_v components; LSEs of order 3
    ("normal"), around +-1000 ("large"), with each head's last chunk masked ("masked") or its first
    ("first masked"), or spread over -60 .. 60, the first chunk's the lowest ("spread")."""

    n_head: int
    n_chunks: int
    d_v: int
    kind: str

    def __str__(self):
        return f"(n_head {self.n_head}, n_chunks {self.n_chunks}, d_v {self.d_v}, {self.kind} LSEs)"


LSE_CASES = [LseCase(1, 1, 1, "normal"), LseCase(3, 5, 7, "normal"), LseCase(5, 3, 19, "large"),
             LseCase(2, 4, 33, "masked"), LseCase(3, 4, 5, "first masked"), LseCase(2, 5, 9, "spread")]


def _lse_partials(n_head, n_chunks, d_v, kind, rng):
    """Random (lse_part, o_part), float32: LSEs of order 3, or of order +-1000, or one chunk masked."""
    lse = 3.0 * rng.standard_normal((n_head, n_chunks))
    if kind == "large":                  # heads alternately around +1000 and -1000
        lse += np.where(np.arange(n_head)[:, None] % 2 == 0, 1000.0, -1000.0)
    if kind == "spread":                 # past exp's float32 range apart, the first chunk's the lowest
        lse = np.sort(rng.uniform(-60.0, 60.0, (n_head, n_chunks)), axis=1)
        lse[:, 0], lse[:, -1] = -60.0, 60.0
    o = rng.standard_normal((n_head, n_chunks, d_v))
    if kind in ("masked", "first masked"):  # the last (first) chunk of every head saw only masked keys
        column = -1 if kind == "masked" else 0
        lse[:, column], o[:, column] = -np.inf, 0.0
    return lse.astype(np.float32), o.astype(np.float32)


def _run_lse_merge(kernel, case, rng, launch):
    n_head, n_chunks, d_v, kind = case
    lse_part, o_part = _lse_partials(n_head, n_chunks, d_v, kind, rng)
    want_out, want_lse = kv_cache.merge_partials(lse_part, o_part)
    expected = np.concatenate([want_out, want_lse[:, None]], axis=1)   # column d_v: the merged lse
    full_out, d_out = output_array((n_head, d_v), guard=d_v * kv_cache.MERGE_BLOCK[1])
    full_lse, d_lse = output_array(n_head, guard=kv_cache.MERGE_BLOCK[1])
    (_, _), (grid, block) = kv_cache.decode_grid(n_head, d_v, 1, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # an unstable answer warns in every thread
            launch(kernel, grid, block, cuda.to_device(lse_part), cuda.to_device(o_part), d_out, d_lse)
    except (OverflowError, ZeroDivisionError, FloatingPointError, ValueError):
        # The simulator's math.exp raises on overflow, and math.log(0) (a sum that underflowed)
        # raises ValueError; a GPU returns inf, NaN or -inf instead.
        if kind not in ("large", "spread"):
            raise                        # not the overflow this case tests: the engine reports it
        return np.full(expected.shape, np.inf), expected, lse_part, o_part, kind
    got = np.concatenate([read_output(full_out, d_out), read_output(full_lse, d_lse)[:, None]], axis=1)
    return got, expected, lse_part, o_part, kind


def _diagnose_lse_merge(got, expected, lse_part, o_part, kind):
    close = dict(rtol=1e-5, atol=1e-5)
    out, lse = got[:, :-1], got[:, -1]
    lse64 = lse_part.astype(np.float64)
    m = lse64.max(axis=1, keepdims=True)
    broken = not np.isfinite(got[np.isfinite(expected)]).all()
    if broken and kind in ("masked", "first masked", "spread"):
        return "max_not_largest", ("inf or NaN where a head's chunk LSEs lie far apart (past 88, or -inf for a chunk "
                                   "whose keys were all masked): exp(LSE_c - M) overflows float32 unless M is the "
                                   "largest LSE_c of the head, which makes every weight at most 1")
    if broken and np.abs(lse64[np.isfinite(lse64)]).max() > 100:
        return "unstable_softmax", ("inf or NaN with chunk LSEs around +-1000: exp(LSE_c) overflows float32 "
                                    "above 88.7; subtract the largest LSE_c first, as the softmax subtracts its max")
    with np.errstate(invalid="ignore"):
        w = np.exp(lse64 - m)
    if np.allclose(out, expected[:, :-1], **close):
        if np.allclose(lse, m[:, 0], **close):
            return "lse_is_max", ("the outputs are right but lse is the largest LSE_c alone: the merged LSE is "
                                  "M + log of the sum of exp(LSE_c - M)")
        if np.allclose(lse, np.log(w.sum(axis=1)), **close):
            return "lse_without_max", ("the outputs are right but lse is log of the sum of exp(LSE_c - M), "
                                       "the log-sum-exp taken against M: add M back")
        return None
    if np.allclose(out, o_part.mean(axis=1), **close) or np.allclose(out, o_part.sum(axis=1), **close):
        return "merge_unweighted", ("every chunk's output got the same weight: chunk c counts in proportion to "
                                    "exp(LSE_c), its share of the softmax's denominator")
    if np.allclose(out, (w[..., None] * o_part).sum(axis=1), **close):
        return "weights_not_normalised", ("the weights exp(LSE_c - M) do not sum to 1: divide by their sum, "
                                          "exp(LSE - M)")
    if kind == "large" and np.allclose(got, expected, rtol=1e-3, atol=1e-3):
        step = float(np.spacing(np.float32(1000)))
        return "weights_from_rounded_lse", (
            f"right to about 1e-4 but not 1e-5 where the LSEs are near +-1000: there float32 holds a number to a "
            f"step of {step:.1e}, so exp(LSE_c - LSE) with LSE rounded carries that error into every weight and "
            "the weights no longer sum to 1; weigh by exp(LSE_c - M), whose exponent is exact, and divide by "
            "the weights' sum")
    return None


register(Exercise(
    exercise_id="09_lse_merge",
    title="merge split-K partials (LSE_c, o_c) into out and lse, one thread per output component",
    kind="kernel",
    run=_run_lse_merge,
    # (n_head, n_chunks, d_v, kind): one of each; sizes that are no multiple of the (16, 4)
    # block; chunk LSEs around +-1000 (overflow without the max, lost precision with a
    # rounded LSE); the last chunk's LSE -inf; the first chunk's -inf; LSEs 120 apart, the first
    # the lowest (overflow with an M that is not the largest).
    cases=LSE_CASES,
    hint=("each thread owns one output component of one head: it looks at every chunk's LSE, weighs chunk c "
          "by its share of the softmax's denominator, and adds up"),
    more_hints=("the plan, for thread (e, h) inside the output: a first pass over the head's chunks finds M, the "
                "largest LSE; a second adds up the weights, exp of LSE minus M, and the weighted components of "
                "the chunks' outputs; the component is the weighted sum divided by the sum of the weights, and the "
                "thread of component 0 also writes M plus the log of that sum. Where answers go wrong: exp of an "
                "LSE as it is (it can be 1000), an M that is not the largest (the first chunk's may be minus "
                "infinity), weights taken against a rounded total, threads outside the output that still write",),
    # float32 exp and sums of a few terms against float64: errors around 1e-7 on outputs of order 1,
    # and the float32 rounding of an lse near 1000 (6e-5) is inside rtol.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_lse_merge,
    diagnoses=("unstable_softmax", "max_not_largest", "merge_unweighted", "weights_not_normalised",
               "weights_from_rounded_lse", "lse_is_max", "lse_without_max"),
    solution=kv_cache.decode_merge_kernel,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v2),
))


# --- Main: one query head's partial of a staged chunk, inside the split-K kernel ------------------
# The answer has attend_chunk's signature ``(q, h, c, k_s, v_s, s_chunk, n_keys, scale, lse_part,
# o_part)``: every thread of block (c, g) calls it once per query head h of g's group, after the
# kernel staged chunk c of kv head g (n_keys positions) in the shared k_s and v_s. It writes the
# chunk's log-sum-exp lse_part[h, c] = m + log l and normalised output o_part[h, c, :] = sum_t
# exp(s_t - m) v_t / l, with the shared s_chunk for the scores, and places its own barriers. The
# check runs decode_kernel_v2 with the answer in attend_chunk's place, launched as decode_step
# launches it ((n_chunks, n_kv_head) blocks of KEYS_PER_CHUNK threads), every launch traced, at the
# simulator's KEYS_PER_CHUNK (8) and a GPU's (32): chunk lengths around a chunk, grouped heads, heads
# wider than the block, scores past exp's float32 range. Unfilled slots of the cache hold NaN.
# Limits: no shared slot read that no thread wrote (``stale_tile``), and shared reads per thread
# within 2 d_k + n (4 + 2 ceil(d_k / KEYS_PER_CHUNK)) a query head (``scores_recomputed``: every
# thread scoring every position). Besides the engine's diagnoses (race, divergent_barrier):
#
# - ``blocks_overwrite_partials``: two blocks wrote the same partial;
# - ``threads_overwrite_partials``: several threads of a block wrote the same partial (every thread
#   writing lse_part, say);
# - ``components_not_strided``: output components KEYS_PER_CHUNK and more never written;
# - ``unstable_softmax``: inf or NaN with scores past 88.7 (exp of a score without m subtracted);
# - ``output_not_normalised``: o_part holds sum_t exp(s_t - m) v_t, not divided by l;
# - ``lse_is_max`` / ``lse_without_max``: lse_part holds m alone, or log l alone;
# - ``missing_scale``: the scores not multiplied by scale;
# - ``partial_chunk``: right in every full chunk, wrong in the last, partly filled one (scores past its
#   n_keys positions counted, as zeros say).

class ChunkCase(NamedTuple):
    """One size tried: n_head query heads on n_kv_head kv heads of width d_k, `length` positions
    filled; large: scores 700 .. 760 (exact integers), past exp's float32 range."""

    n_head: int
    n_kv_head: int
    d_k: int
    length: int
    large: bool = False

    def __str__(self):
        return (f"(n_head {self.n_head}, n_kv_head {self.n_kv_head}, d_k {self.d_k}, length {self.length}"
                f"{', scores 700 to 760' if self.large else ''})")


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
            s = keys[h // group, span].astype(np.float64) @ q[h] * scale
            padded = np.concatenate([s, np.full(size - len(s), score_padding)]) if score_padding is not None else s
            p = np.exp(padded - padded.max())
            out[h, c, :d_k] = p[:len(s)] @ values[h // group, span] / p.sum()
            out[h, c, d_k] = padded.max() + np.log(p.sum())
    return out


@functools.lru_cache(maxsize=64)
def _kernel_around(answer, size):
    """decode_kernel_v2 with the answer in attend_chunk's place, its names those of the kv_cache
    module when built (KEYS_PER_CHUNK = size, TILE_SHAPE: the configuration's)."""
    names = {**vars(kv_cache), "attend_chunk": answer}
    return cuda.jit(types.FunctionType(kv_cache.decode_kernel_v2.py_func.__code__, names, "decode_kernel_v2"))


def _run_split_k(answer, case, rng, _launch):
    n_head, n_kv_head, d_k, length, large = case
    capacity, chunks = length + 2, kv_cache.n_chunks(length)
    keys = np.full((n_kv_head, capacity, d_k), np.nan, np.float32)    # unfilled slots: NaN
    values = keys.copy()
    keys[:, :length], values[:, :length] = rng.standard_normal((2, n_kv_head, length, d_k))
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(d_k))
    if large:                            # q . k * scale = k[0] * 4 / sqrt(16): integers 700 .. 760, exact
        q[:] = 0.0
        q[:, 0] = 4.0
        keys[:, :length, 0] = rng.integers(700, 761, size=(n_kv_head, length))
    full_lse, lse_part = output_array((n_head, chunks), guard=kv_cache.KEYS_PER_CHUNK)
    full_o, o_part = output_array((n_head, chunks, d_k), guard=kv_cache.KEYS_PER_CHUNK * d_k)
    (grid, block), _ = kv_cache.decode_grid(n_head, d_k, length, 2, n_kv_head)
    expected = _chunk_reference(q, keys, values, length, scale)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # an unstable answer's overflow: said once
            traced_launch(_kernel_around(answer, kv_cache.KEYS_PER_CHUNK), grid, block, cuda.to_device(q),
                          cuda.to_device(keys), cuda.to_device(values), length, scale, lse_part, o_part)
    except OverflowError:
        # The simulator's math.exp raises past float64's range (a GPU's float32 exp returns inf).
        if not large:
            raise
        return np.full(expected.shape, np.inf), expected, q, keys, values, length, scale, large
    except RaceFound as race:
        _name_overwritten_partials(str(race), n_head // n_kv_head)
        raise
    got = np.concatenate([read_output(full_o, o_part), read_output(full_lse, lse_part)[..., None]], axis=2)
    never = unwritten(got)
    if never.any():
        size = kv_cache.KEYS_PER_CHUNK
        if d_k > size and never[:, :, size:d_k].all() and not never[:, :, :size].any():
            raise Diagnosed("components_not_strided", (
                f"output components {size} .. {d_k - 1} were never written: a block has {size} threads for "
                f"{d_k} components, so thread tid takes components tid, tid + {size}, ..."))
    return got, expected, q, keys, values, length, scale, large


def _name_overwritten_partials(race, group):
    """Diagnosed when the race is two writes of one partial (global lse_part or o_part), not a
    missing barrier around shared memory; nothing otherwise."""
    if "global 'lse_part'" not in race and "global 'o_part'" not in race:
        return
    blocks = set(re.findall(r"block (\([^)]*\))", race))
    element = "".join(re.search(r"'(\w+)'(\[[^]]*\])", race).groups())      # lse_part[0, 0]
    if len(blocks) > 1:
        raise Diagnosed("blocks_overwrite_partials", (
            f"{element} was written by two blocks, {' and '.join(sorted(blocks))}: block (c, g) writes chunk c "
            f"of query head h only, the h it is called with"))
    raise Diagnosed("threads_overwrite_partials", (
        f"{element} was written by two threads of one block: one thread writes the chunk's LSE, and "
        "thread tid the output components tid, tid + KEYS_PER_CHUNK, ..."))


def _diagnose_split_k(got, expected, q, keys, values, length, scale, large):
    close = dict(rtol=1e-4, atol=1e-4)
    d_k, size = q.shape[1], kv_cache.KEYS_PER_CHUNK
    if large and not np.isfinite(got).all():
        return "unstable_softmax", ("inf or NaN where the scores reach 700 to 760: exp(s) overflows float32 "
                                    "above 88.7; take every exponential against the chunk's max, exp(s - m)")
    o, lse = expected[..., :d_k], expected[..., d_k]
    if np.allclose(got[..., d_k], lse, **close):
        # lse right: l = exp(lse - m) is known only through the output's normalisation
        ratio = got[..., :d_k] / np.where(o == 0, 1, o)
        constant = np.isfinite(ratio).all() and np.allclose(ratio, ratio[..., :1], **close)
        if constant and not np.allclose(ratio, 1, **close):
            return "output_not_normalised", ("o_part is sum_t exp(s_t - m) v_t: divide it by l, the sum of the "
                                             "weights, so that each chunk hands over its own softmax's output")
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
                                 f"{length % size} of its {size} positions: score, sum and weigh its n_keys "
                                 "positions only, the ones staged")
    return None


def _chunk_max(q, keys, length, scale, h, c):
    """The largest scaled score of query head h in chunk c (the right chunk and kv head)."""
    size, group = kv_cache.KEYS_PER_CHUNK, q.shape[0] // keys.shape[0]
    span = slice(c * size, min((c + 1) * size, length))
    return float((keys[h // group, span].astype(np.float64) @ q[h] * scale).max())


def _split_k_cases(configuration):
    """Sizes around the configuration's chunk (KEYS_PER_CHUNK, 8 or 32): one full chunk for one head
    of width 1; 4 query heads on 2 kv heads over 2 chunks and 3 positions, heads wider than the
    block (KEYS_PER_CHUNK + 3); one chunk one position short; multi-query attention over three full
    chunks; a single position shared by a group of 2; a chunk and one position, scores 700 to 760."""
    size = kv_cache.SHAPE_CONSTANTS["KEYS_PER_CHUNK"][0 if configuration == shapes.SIMULATOR else 1]
    return [ChunkCase(1, 1, 1, size), ChunkCase(4, 2, size + 3, 2 * size + 3), ChunkCase(3, 3, 5, size - 1),
            ChunkCase(4, 1, 6, 3 * size), ChunkCase(2, 1, 3, 1), ChunkCase(2, 2, 16, size + 1, large=True)]


def _shared_reads(case):
    """The most shared reads a thread may make: per query head of its group, 2 d_k + n (4 + 2 ceil(d_k /
    KEYS_PER_CHUNK)) for a chunk of n positions (about twice what scoring its own position, finding
    (m, l) from the scores and weighing its components read); a thread that scores every position of
    the chunk itself reads n d_k."""
    size = kv_cache.KEYS_PER_CHUNK
    n = min(size, case.length)
    return case.n_head // case.n_kv_head * (2 * case.d_k + n * (4 + 2 * math.ceil(case.d_k / size)))


register(Exercise(
    exercise_id="09_split_k",
    title="split-K decoding: one query head against a staged chunk, its scores, the chunk's (m, l) with its "
          "barriers, (LSE_c, o_c)",
    kind="device function",
    gpu_code=True,
    both_shapes=True,
    run=_run_split_k,
    cases=_split_k_cases,
    hint=("the chunk's scores are shared by its threads: each thread scores its own position once, and after a "
          "barrier every thread can read all of them, find the chunk's max and sum, and work out its own output "
          "components"),
    more_hints=("the plan: a barrier first (the chunk staged; on the next query head, nobody still reading the "
                "last head's scores); thread tid, if its position is one of the chunk's n_keys, writes its scaled "
                "score (row_dot of the head's query and its staged key) into the shared scores; a second barrier "
                "(every score in); every thread then finds m, the largest of the n_keys scores, and l, the sum of "
                "exp of each score minus m; thread tid writes components tid, tid plus KEYS_PER_CHUNK, and so on, "
                "each weighted_value over l; thread 0 writes m plus log l. Where answers go wrong: a barrier "
                "inside the test on tid, which some threads never reach; positions past n_keys read; every thread "
                "writing the LSE; the output not divided by l",),
    # float32 sums of up to KEYS_PER_CHUNK terms against float64, values of order 1
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_split_k,
    diagnoses=("scores_recomputed", "blocks_overwrite_partials", "threads_overwrite_partials",
               "components_not_strided", "unstable_softmax", "output_not_normalised", "lse_is_max",
               "lse_without_max", "missing_scale", "partial_chunk"),
    solution=kv_cache.attend_chunk,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v1, kv_cache.decode_kernel_v2, kv_cache.attend_tile,
               kv_cache.online_step, kv_cache.decode_merge_kernel),
    limits=(NoUnwrittenReads(why="read only the chunk's n_keys staged positions"),
            SharedLoadsPerThread(_shared_reads, code="scores_recomputed",
                                 why="each score is computed once, by the thread of its position, and read by the "
                                     "others from shared memory")),
))
