"""Notebook 09's exercises, with their typical mistakes named: the log-sum-exp merge of split-K
partials (warm-up) and the split-K partial kernel (main), below."""

import math
import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib.stages import kv_cache
from attention_lib.checks.engine import Diagnosed, Exercise, RaceFound, output_array, read_output, register, unwritten


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
# - ``merge_unweighted``: the chunks' outputs averaged (or summed) with equal weights;
# - ``weights_not_normalised``: sum_c exp(LSE_c - M) o_c, without dividing by sum_c exp(LSE_c - M);
# - ``weights_from_rounded_lse``: right to about 1e-4 but not 1e-5 at LSEs near +-1000: the weights
#   exp(LSE_c - LSE) of a float32 LSE (a step of 6e-5 near 1000), which then do not sum to 1;
# - ``lse_is_max``: the merged lse written as M alone, without + log sum_c exp(LSE_c - M).

class LseCase(NamedTuple):
    """One size tried: n_head heads of n_chunks partials with d_v components; LSEs of order 3
    ("normal"), around +-1000 ("large"), or with each head's last chunk masked ("masked")."""

    n_head: int
    n_chunks: int
    d_v: int
    kind: str

    def __str__(self):
        return f"(n_head {self.n_head}, n_chunks {self.n_chunks}, d_v {self.d_v}, {self.kind} LSEs)"


LSE_CASES = [LseCase(1, 1, 1, "normal"), LseCase(3, 5, 7, "normal"), LseCase(5, 3, 19, "large"),
             LseCase(2, 4, 33, "masked")]


def _lse_partials(n_head, n_chunks, d_v, kind, rng):
    """Random (lse_part, o_part), float32: LSEs of order 3, or of order +-1000, or one chunk masked."""
    lse = 3.0 * rng.standard_normal((n_head, n_chunks))
    if kind == "large":                  # heads alternately around +1000 and -1000
        lse += np.where(np.arange(n_head)[:, None] % 2 == 0, 1000.0, -1000.0)
    o = rng.standard_normal((n_head, n_chunks, d_v))
    if kind == "masked":                 # the last chunk of every head saw only masked keys
        lse[:, -1], o[:, -1] = -np.inf, 0.0
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
        if kind != "large":
            raise                        # not the overflow this case tests: the engine reports it
        return np.full(expected.shape, np.inf), expected, lse_part, o_part, kind
    got = np.concatenate([read_output(full_out, d_out), read_output(full_lse, d_lse)[:, None]], axis=1)
    return got, expected, lse_part, o_part, kind


def _diagnose_lse_merge(got, expected, lse_part, o_part, kind):
    close = dict(rtol=1e-5, atol=1e-5)
    out, lse = got[:, :-1], got[:, -1]
    if not np.isfinite(got[np.isfinite(expected)]).all() and np.abs(lse_part[np.isfinite(lse_part)]).max() > 100:
        return "unstable_softmax", ("inf or NaN with chunk LSEs around +-1000: exp(LSE_c) overflows float32 "
                                    "above 88.7; subtract the largest LSE_c first, as the softmax subtracts its max")
    if np.allclose(out, o_part.mean(axis=1), **close) or np.allclose(out, o_part.sum(axis=1), **close):
        return "merge_unweighted", ("every chunk's output got the same weight: chunk c counts in proportion to "
                                    "exp(LSE_c), its share of the softmax's denominator")
    m = lse_part.astype(np.float64).max(axis=1, keepdims=True)
    w = np.exp(lse_part - m)
    if np.allclose(out, (w[..., None] * o_part).sum(axis=1), **close):
        return "weights_not_normalised", ("the weights exp(LSE_c - M) do not sum to 1: divide by their sum, "
                                          "exp(LSE - M)")
    if np.allclose(out, expected[:, :-1], **close) and np.allclose(lse, m[:, 0], **close):
        return "lse_is_max", ("the outputs are right but lse is the largest LSE_c alone: the merged LSE is "
                              "M + log of the sum of exp(LSE_c - M)")
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
    # rounded LSE); a chunk with LSE -inf.
    cases=LSE_CASES,
    hint=("each thread owns one output component of one head: it looks at every chunk's LSE, weighs chunk c "
          "by its share of the softmax's denominator, and adds up"),
    more_hints=("where answers go wrong: taking exp of an LSE as it is (it can be 1000: find the largest "
                "first), weights that do not sum to 1 or are taken against a rounded total, and threads outside "
                "the output that still write",),
    # float32 exp and sums of a few terms against float64: errors around 1e-7 on outputs of order 1,
    # and the float32 rounding of an lse near 1000 (6e-5) is inside rtol.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_lse_merge,
    diagnoses=("unstable_softmax", "merge_unweighted", "weights_not_normalised", "weights_from_rounded_lse",
               "lse_is_max"),
    solution=kv_cache.decode_merge_kernel,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v2),
))


# --- Main: the split-K partial kernel ----------------------------------------------------------
# The answer has decode_kernel_v2's signature ``(q, k_cache, v_cache, length, scale, lse_part,
# o_part)`` and is launched as decode_step launches it: (n_chunks, n_kv_head) blocks of
# KEYS_PER_CHUNK threads. Block (c, g) stages positions c * KEYS_PER_CHUNK .. of kv head g once and
# writes, for every query head h of g's group, the chunk's log-sum-exp lse_part[h, c] = m + log l
# and normalised output o_part[h, c, :] = sum_t exp(s_t - m) v_t / l. Unfilled slots of the cache
# hold NaN: a kernel that reads one fails. Besides the engine's diagnoses (race, divergent_barrier):
#
# - ``chunk_not_offset``: every block staged the chunk at position c (or 0), not c * KEYS_PER_CHUNK;
# - ``wrong_kv_head``: a block read another kv head than its own, blockIdx.y (past the cache's heads);
# - ``blocks_overwrite_partials``: two blocks wrote the same partial (the heads 0 .. group - 1 taken by
#   every block, say, instead of g's own group);
# - ``threads_overwrite_partials``: several threads of a block wrote the same partial (every thread
#   writing lse_part, say);
# - ``components_not_strided``: output components KEYS_PER_CHUNK and more never written;
# - ``output_not_normalised``: o_part holds sum_t exp(s_t - m) v_t, not divided by l;
# - ``lse_is_max`` / ``lse_without_max``: lse_part holds m alone, or log l alone;
# - ``missing_scale``: the scores not multiplied by scale;
# - ``partial_chunk``: right everywhere but in the last, partly filled chunk (its n_keys < KEYS_PER_CHUNK
#   positions are the only ones to score, sum and weigh).

class ChunkCase(NamedTuple):
    """One size tried: n_head query heads on n_kv_head kv heads of width d_k, `length` positions filled."""

    n_head: int
    n_kv_head: int
    d_k: int
    length: int

    def __str__(self):
        return f"(n_head {self.n_head}, n_kv_head {self.n_kv_head}, d_k {self.d_k}, length {self.length})"


def _chunk_reference(q, keys, values, length, scale, start_of=None, kv_of=None):
    """(n_head, n_chunks, d_k + 1) float64: o_c then LSE_c of every (query head, chunk), chunk c
    holding positions start_of(c) .. + KEYS_PER_CHUNK of kv head kv_of(h), cut at `length`."""
    n_head, d_k = q.shape
    group, size = n_head // keys.shape[0], kv_cache.KEYS_PER_CHUNK
    start_of = start_of or (lambda c: c * size)
    kv_of = kv_of or (lambda h: h // group)
    chunks = kv_cache.n_chunks(length)
    out = np.zeros((n_head, chunks, d_k + 1))
    for h in range(n_head):
        for c in range(chunks):
            span = slice(start_of(c), min(start_of(c) + size, length))
            s = keys[kv_of(h), span].astype(np.float64) @ q[h] * scale
            p = np.exp(s - s.max())
            out[h, c, :d_k] = p @ values[kv_of(h), span] / p.sum()
            out[h, c, d_k] = s.max() + np.log(p.sum())
    return out


def _run_split_k(kernel, case, rng, launch):
    n_head, n_kv_head, d_k, length = case
    capacity, chunks = length + 2, kv_cache.n_chunks(length)
    keys = np.full((n_kv_head, capacity, d_k), np.nan, np.float32)    # unfilled slots: NaN
    values = keys.copy()
    keys[:, :length], values[:, :length] = rng.standard_normal((2, n_kv_head, length, d_k))
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    scale = np.float32(1 / math.sqrt(d_k))
    full_lse, lse_part = output_array((n_head, chunks), guard=kv_cache.KEYS_PER_CHUNK)
    full_o, o_part = output_array((n_head, chunks, d_k), guard=kv_cache.KEYS_PER_CHUNK * d_k)
    (grid, block), _ = kv_cache.decode_grid(n_head, d_k, length, 2, n_kv_head)
    try:
        launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(keys), cuda.to_device(values),
               length, scale, lse_part, o_part)
    except IndexError as error:
        if "'k_cache'" in str(error) or "'v_cache'" in str(error):
            raise Diagnosed("wrong_kv_head", (
                f"a block read past the cache's {n_kv_head} kv heads: block (c, g) serves kv head g, its "
                "blockIdx.y, for the query heads h of its group (h // group = g)")) from None
        raise
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
    expected = _chunk_reference(q, keys, values, length, scale)
    return got, expected, q, keys, values, length, scale


def _name_overwritten_partials(race, group):
    """Diagnosed when the race is two writes of one partial (global lse_part or o_part), not a
    missing barrier around shared memory; nothing otherwise."""
    import re
    if "global 'lse_part'" not in race and "global 'o_part'" not in race:
        return
    blocks = set(re.findall(r"block (\([^)]*\))", race))
    element = "".join(re.search(r"'(\w+)'(\[[^]]*\])", race).groups())      # lse_part[0, 0]
    if len(blocks) > 1:
        raise Diagnosed("blocks_overwrite_partials", (
            f"{element} was written by two blocks, {' and '.join(sorted(blocks))}: block (c, g) writes chunk c "
            f"of the query heads of kv head g only, the {group} heads whose h // group is g"))
    raise Diagnosed("threads_overwrite_partials", (
        f"{element} was written by two threads of one block: thread 0 alone writes the chunk's LSE, and "
        "thread tid the output components tid, tid + KEYS_PER_CHUNK, ..."))


def _diagnose_split_k(got, expected, q, keys, values, length, scale):
    close = dict(rtol=1e-4, atol=1e-4)
    d_k, size = q.shape[1], kv_cache.KEYS_PER_CHUNK
    for start_of, where in ((lambda c: c, "c"), (lambda c: 0, "0")):
        if np.allclose(got, _chunk_reference(q, keys, values, length, scale, start_of), **close):
            return "chunk_not_offset", (f"block c staged the positions from {where}: chunk c starts at position "
                                        f"c * KEYS_PER_CHUNK = c * {size}")
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
                                 f"{length % size} of its {size} positions: score, sum and weigh n_keys positions, "
                                 "the ones stage_tile filled")
    return None


def _chunk_max(q, keys, length, scale, h, c):
    """The largest scaled score of query head h in chunk c (the right chunk and kv head)."""
    size, group = kv_cache.KEYS_PER_CHUNK, q.shape[0] // keys.shape[0]
    span = slice(c * size, min((c + 1) * size, length))
    return float((keys[h // group, span].astype(np.float64) @ q[h] * scale).max())


def _split_k_cases():
    size = kv_cache.KEYS_PER_CHUNK
    # One full chunk for one head of width 1; 3 heads of width 5 on a chunk and 7 positions (the
    # last chunk partly filled); 4 query heads on 2 kv heads, 2 chunks and 3 more positions, heads
    # wider than the block (KEYS_PER_CHUNK + 3); multi-query attention on three full chunks; a
    # single position shared by a group of 2.
    return [ChunkCase(1, 1, 1, size), ChunkCase(3, 3, 5, size + 7), ChunkCase(4, 2, size + 3, 2 * size + 3),
            ChunkCase(4, 1, 6, 3 * size), ChunkCase(2, 1, 3, 1)]


register(Exercise(
    exercise_id="09_split_k",
    title="split-K decoding: block (c, g) stages chunk c of kv head g once and writes every query head's "
          "(LSE_c, o_c)",
    kind="kernel",
    run=_run_split_k,
    cases=_split_k_cases(),
    hint=("a block owns one chunk of one kv head: stage it once, then for each query head of the group score "
          "the chunk (a thread per position), find its max and sum, and write the chunk's output and LSE"),
    more_hints=("where answers go wrong: reading a staged key or score before the barrier that makes it "
                "complete, starting the chunk at c instead of c chunks of positions along, taking the first "
                "group of query heads in every block, forgetting to divide by l, and a last chunk with fewer "
                "positions than threads",),
    # float32 sums of up to KEYS_PER_CHUNK terms against float64, values of order 1
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_split_k,
    diagnoses=("chunk_not_offset", "wrong_kv_head", "blocks_overwrite_partials", "threads_overwrite_partials",
               "components_not_strided",
               "output_not_normalised", "lse_is_max", "lse_without_max", "missing_scale", "partial_chunk"),
    solution=kv_cache.decode_kernel_v2,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v1, kv_cache.attend_tile, kv_cache.online_step,
               kv_cache.decode_merge_kernel),
))
