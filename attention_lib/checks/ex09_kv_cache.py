"""Notebook 09's exercises, with their typical mistakes named: one decode step with a NumPy KV
cache (below), the log-sum-exp merge of split-K partials, and the kv head of a query head.

The answer is a function ``decode_step_numpy(q, k_new, v_new, k_cache, v_cache, length)``:
q, k_new, v_new (n_head, d_k) are the new token's query, key and value per head; k_cache and
v_cache (n_head, capacity, d_k) hold positions 0 .. length - 1, and stale numbers from an
earlier sequence after that (a cache is reused, never cleared). It must write k_new and v_new
at position `length`, in place, attend with q to positions 0 .. length (the new one included)
and return ``(out, length + 1)``, out (n_head, d_k). Besides the engine's diagnoses:

- ``wrong_length``: the returned length is not length + 1;
- ``cache_not_appended``: k_new or v_new is not at position `length` of the cache afterwards,
  or the output ignores the new token (attention computed before appending, over 0 .. length - 1);
- ``cache_overwritten``: a position before `length` changed;
- ``attends_past_length``: the output attends to the whole capacity, stale slots included;
- ``missing_scale``: the scores were not divided by sqrt(d_k) (or were divided by d_k);
- ``unstable_softmax``: inf or NaN on scores in the thousands: exp was taken of the raw
  scores, without subtracting their maximum.
"""

import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks.engine import Exercise, output_array, read_output, register


class Case(NamedTuple):
    """One size tried: n_head heads of width d_k, a cache of `capacity` positions, `length` filled;
    `large`: scores in the thousands (exp overflows even float64 without the max subtraction)."""

    n_head: int
    d_k: int
    capacity: int
    length: int
    large: bool = False

    def __str__(self):
        return (f"(n_head {self.n_head}, d_k {self.d_k}, capacity {self.capacity}, "
                f"length {self.length}{', scores in the thousands' if self.large else ''})")


def _attend(q, keys, values, scale):
    """One query per head against keys (n_head, n, d_k): reference.attention with a custom scale."""
    s = np.einsum("hd,hnd->hn", q, keys) * scale                  # (n_head, n) scores
    return np.einsum("hn,hnd->hd", reference.softmax(s), values) if keys.shape[1] else np.full(q.shape, np.nan)


def _run_decode_step(answer, case, rng, _launch):       # NumPy: no kernel to launch
    n_head, d_k, capacity, length = case[:4]
    q, k_new, v_new = rng.standard_normal((3, n_head, d_k)).astype(np.float32)
    # Positions 0 .. length - 1 filled; the rest stale, from an earlier sequence.
    k_cache = rng.standard_normal((n_head, capacity, d_k)).astype(np.float32)
    v_cache = rng.standard_normal((n_head, capacity, d_k)).astype(np.float32)
    if case.large:
        # Integer queries and keys of +-1: every score q.k is an exact integer in float32, so a
        # float32 answer's scores carry no rounding, yet they reach thousands (exp(710) is
        # already inf in float64).
        q = rng.integers(-2000, 2001, q.shape).astype(np.float32)
        k_cache, k_new = np.sign(k_cache) + (k_cache == 0), np.sign(k_new) + (k_new == 0)
    k_before, v_before = k_cache.copy(), v_cache.copy()
    keys, values = k_cache.copy(), v_cache.copy()                  # what the cache must become
    keys[:, length], values[:, length] = k_new, v_new
    expected = reference.attention(q[:, None], keys[:, :length + 1], values[:, :length + 1])[:, 0]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):   # an unstable answer's warnings
        result = answer(q.copy(), k_new.copy(), v_new.copy(), k_cache, v_cache, length)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(f"decode_step_numpy must return (out, new_length), got {type(result).__name__}")
    out, new_length = np.asarray(result[0], dtype=np.float64), result[1]
    info = dict(q=q, k_new=k_new, v_new=v_new, keys=keys, values=values, length=length,
                new_length=new_length, out=out, k_after=k_cache, v_after=v_cache,
                k_before=k_before, v_before=v_before)
    cache_right = (np.array_equal(k_cache, keys) and np.array_equal(v_cache, values))
    if new_length != length + 1 or not cache_right:
        # Wrong bookkeeping with a right-looking output still fails: the diagnosis says why.
        return np.full(expected.shape, np.inf), expected, info
    return out, expected, info


def _diagnose(got, expected, info):
    """Name the mistake; None when it is none of the known ones (the engine shows where)."""
    length, out = info["length"], info["out"]
    if info["new_length"] != length + 1:
        return "wrong_length", (f"returned new_length {info['new_length']!r}; after appending one "
                                f"position to a cache of length {length} it must be {length + 1}")
    before = (slice(None), slice(0, length))
    if not (np.array_equal(info["k_after"][before], info["k_before"][before])
            and np.array_equal(info["v_after"][before], info["v_before"][before])):
        return "cache_overwritten", (f"positions 0 .. {length - 1} of the cache changed: they hold "
                                     f"earlier tokens; write the new k and v at position length = {length}")
    for name, new, after in (("k_new", info["k_new"], info["k_after"]),
                             ("v_new", info["v_new"], info["v_after"])):
        if not np.array_equal(after[:, length], new):
            return "cache_not_appended", (
                f"{name} is not at position length = {length} of the cache afterwards: append it "
                f"(k_cache[:, length] = k_new), or the next step will not see this token")
    if not np.isfinite(out).all() and np.abs(info["q"]).max() > 100:
        return "unstable_softmax", ("the output is inf or NaN on scores in the thousands: exp overflows "
                                    "(e^710 is inf even in float64) or every term underflows to 0 (0 / 0). "
                                    "Subtract each head's maximum score before exp, or use a stable softmax")
    q, keys, values = info["q"], info["keys"], info["values"]
    d_k, scale = q.shape[-1], 1.0 / np.sqrt(q.shape[-1])
    alternatives = [
        (_attend(q, keys[:, :length], values[:, :length], scale), "cache_not_appended",
         f"the output ignores the new token: attend after appending, to positions 0 .. length "
         f"({length + 1} of them, the new one included), not 0 .. length - 1"),
        (_attend(q, keys, values, scale), "attends_past_length",
         f"the output attends to all {keys.shape[1]} slots of the cache; only positions 0 .. length "
         "are filled, the rest is stale data from an earlier sequence: slice the cache to [:, :length + 1]"),
        (_attend(q, keys[:, :length + 1], values[:, :length + 1], 1.0), "missing_scale",
         f"the scores were not divided by sqrt(d_k) = sqrt({d_k})"),
        (_attend(q, keys[:, :length + 1], values[:, :length + 1], 1.0 / d_k), "missing_scale",
         f"the scores were divided by d_k = {d_k}, not by sqrt(d_k)"),
    ]
    for candidate, code, message in alternatives:
        if out.shape == candidate.shape and np.allclose(out, candidate, rtol=1e-5, atol=1e-6, equal_nan=True):
            return code, message
    if length == 0 and not np.isfinite(out).all():
        return "cache_not_appended", ("with an empty cache the output is NaN: the new token must be "
                                      "appended before attending, so that it attends at least to itself")
    return None


register(Exercise(
    exercise_id="09_decode_step",
    title="append the new token's k and v to a NumPy cache, then attend with its query",
    kind="function",
    run=_run_decode_step,
    # A general case first (every mistake shows: d_k 5 is no square, stale slots after the
    # new one); one head of width 1; the first token of a sequence (empty cache: the output is
    # v_new); the step that fills the cache to its last slot.
    # Last, scores in the thousands: a softmax without the max subtraction overflows.
    cases=[Case(2, 5, 9, 3), Case(1, 1, 2, 1), Case(4, 16, 32, 0), Case(3, 24, 40, 39),
           Case(2, 16, 12, 7, large=True)],
    hint=("the new token is a position of the cache like any other: store it first, then attend over the "
          "filled positions only, its own included"),
    more_hints=("where answers go wrong: attending before the new token is stored (it cannot see itself), "
                "attending to the stale slots past the filled ones, and a softmax that does not subtract "
                "the maximum score",),
    # float32 inputs; an answer may compute in float32 (errors ~1e-7 of values of order 1) or float64.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose,
    diagnoses=('cache_not_appended', 'attends_past_length', 'missing_scale', 'wrong_length',
               'cache_overwritten', 'unstable_softmax'),
))


# --- The main exercise: the log-sum-exp merge of split-K partials, as a kernel -------------------
# The answer has the signature ``(lse_part, o_part, out, lse)``: lse_part (n_head, n_chunks) and
# o_part (n_head, n_chunks, d_v) float32 are each chunk's log-sum-exp LSE_c = m_c + log l_c and
# its normalised output o_c = acc_c / l_c; it writes out (n_head, d_v) = sum_c exp(LSE_c - LSE) o_c
# and lse (n_head,) = LSE = log sum_c exp(LSE_c), computed as M + log sum_c exp(LSE_c - M) with
# M = max_c LSE_c. It is launched as decode_merge_kernel is: a 2-D grid over (component e, head
# h), kv_cache.MERGE_BLOCK threads to a block. A chunk whose keys were all masked has
# LSE_c = -inf and o_c = 0. Besides the engine's diagnoses:
#
# - ``unstable_softmax``: exp of the raw LSE_c, which overflows once an LSE passes 88.7;
# - ``merge_unweighted``: the chunks' outputs averaged (or summed) with equal weights;
# - ``weights_not_normalised``: sum_c exp(LSE_c - M) o_c, without dividing by sum_c exp(LSE_c - M);
# - ``lse_is_max``: the merged lse written as M alone, without + log sum_c exp(LSE_c - M).

LSE_CASES = [(1, 1, 1, "normal"), (3, 5, 7, "normal"), (5, 3, 19, "large"), (2, 4, 33, "masked")]


def _lse_partials(n_head, n_chunks, d_v, kind, rng):
    """Random (lse_part, o_part), float32: LSEs of order 3, or of order +-1000, or one chunk masked."""
    lse = 3.0 * rng.standard_normal((n_head, n_chunks))
    if kind == "large":                  # heads alternately around +1000 and -1000
        lse += np.where(np.arange(n_head)[:, None] % 2 == 0, 1000.0, -1000.0)
    o = rng.standard_normal((n_head, n_chunks, d_v))
    if kind == "masked":                 # the last chunk of every head saw only masked keys
        lse[:, -1], o[:, -1] = -np.inf, 0.0
    return lse.astype(np.float32), o.astype(np.float32)


def lse_merge_reference(lse_part, o_part):
    """(out, lse) of the log-sum-exp merge, float64: out (..., d_v), lse (...)."""
    lse_part, o_part = np.asarray(lse_part, np.float64), np.asarray(o_part, np.float64)
    m = lse_part.max(axis=-1, keepdims=True)
    w = np.exp(lse_part - m)                                     # (..., n_chunks), each <= 1
    total = w.sum(axis=-1)
    return (w[..., None] * o_part).sum(axis=-2) / total[..., None], m[..., 0] + np.log(total)


def _run_lse_merge(kernel, case, rng, launch):
    from attention_lib.stages import kv_cache
    n_head, n_chunks, d_v, kind = case
    lse_part, o_part = _lse_partials(n_head, n_chunks, d_v, kind, rng)
    want_out, want_lse = lse_merge_reference(lse_part, o_part)
    expected = np.concatenate([want_out, want_lse[:, None]], axis=1)   # column d_v: the merged lse
    full_out, d_out = output_array((n_head, d_v), guard=d_v * kv_cache.MERGE_BLOCK[1])
    full_lse, d_lse = output_array(n_head, guard=kv_cache.MERGE_BLOCK[1])
    (_, _), (grid, block) = kv_cache.decode_grid(n_head, d_v, 1, 2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # an unstable answer warns in every thread
            launch(kernel, grid, block, cuda.to_device(lse_part), cuda.to_device(o_part),
                   d_out, d_lse)
    except (OverflowError, ZeroDivisionError, FloatingPointError, ValueError):
        # The simulator's math.exp raises on overflow, and math.log(0) (a sum that underflowed)
        # raises ValueError; a GPU returns inf, NaN or -inf instead.
        if kind != "large":
            raise                        # not the overflow this case tests: the engine reports it
        return np.full(expected.shape, np.inf), expected, lse_part, o_part
    got = np.concatenate([read_output(full_out, d_out), read_output(full_lse, d_lse)[:, None]], axis=1)
    return got, expected, lse_part, o_part


def _diagnose_lse_merge(got, expected, lse_part, o_part):
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
    return None


register(Exercise(
    exercise_id="09_lse_merge",
    title="merge split-K partials (LSE_c, o_c) into out and lse, one thread per output component",
    kind="kernel",
    run=_run_lse_merge,
    # (n_head, n_chunks, d_v, kind): one of each; sizes that are no multiple of the (16, 4)
    # block; chunk LSEs around +-1000 (overflow without the max); a chunk with LSE -inf.
    cases=LSE_CASES,
    describe_case=lambda c: f"n_head = {c[0]}, n_chunks = {c[1]}, d_v = {c[2]} ({c[3]} LSEs)",
    hint=("each thread owns one output component of one head: it looks at every chunk's LSE, weighs chunk c "
          "by its share exp(LSE_c - LSE) of the softmax, and adds up"),
    more_hints=("where answers go wrong: taking exp of an LSE as it is (it can be 1000: find the largest "
                "first), weights that do not sum to 1, and threads outside the output that still write",),
    # float32 exp and sums of a few terms against float64: errors around 1e-7 on outputs of order 1,
    # and the float32 rounding of an lse near 1000 (6e-5) is inside rtol.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_lse_merge,
    diagnoses=("unstable_softmax", "merge_unweighted", "weights_not_normalised", "lse_is_max"),
))


# --- Grouped-query attention: which kv head a query head reads -----------------------------------
# The answer has the signature ``(kv_of, n_kv_head)``: kv_of (n_head,) float32, n_head =
# kv_of.shape[0] a multiple of n_kv_head; thread h = cuda.grid(1) writes kv_of[h], the kv head
# whose keys and values query head h reads, h // (n_head // n_kv_head): the group of
# n_head // n_kv_head consecutive query heads 0 .. group - 1 shares kv head 0, and so on. The
# grid has more threads than heads. Besides the engine's diagnoses:
#
# - ``heads_interleaved``: h % n_kv_head, the query heads dealt out to the kv heads in turn;
# - ``divided_by_n_kv_head``: h // n_kv_head, dividing by the number of kv heads, not the group;
# - ``multiplied_by_group``: h * group, going up from a query head instead of down;
# - ``not_whole_number``: h / group, a true division where an integer index is needed.

KV_HEAD_CASES = [(8, 2), (12, 12), (12, 1), (33, 11), (32, 8), (1, 1)]
KV_HEAD_BLOCK = 32


def _run_kv_head(kernel, case, rng, launch):
    n_head, n_kv_head = case
    expected = (np.arange(n_head) // (n_head // n_kv_head)).astype(np.float64)
    full, d_kv_of = output_array(n_head, guard=KV_HEAD_BLOCK)
    blocks = (n_head + KV_HEAD_BLOCK - 1) // KV_HEAD_BLOCK
    launch(kernel, blocks + 1, KV_HEAD_BLOCK, d_kv_of, n_kv_head)   # a whole block of threads too many
    return read_output(full, d_kv_of).astype(np.float64), expected, n_head, n_kv_head


def _diagnose_kv_head(got, expected, n_head, n_kv_head):
    h, group = np.arange(n_head), n_head // n_kv_head
    mistakes = [
        (h % n_kv_head, "heads_interleaved",
         f"query head h got kv head h % n_kv_head: the heads are dealt out in turn ({', '.join(map(str, (h % n_kv_head)[:5]))}, ...); "
         f"a kv head serves {group} neighbouring query heads, as the projection lays them out"),
        (h // n_kv_head, "divided_by_n_kv_head",
         f"query head h got kv head h // n_kv_head: divide by the size of a group, n_head // n_kv_head = {group}, "
         f"not by the number of kv heads, {n_kv_head}"),
        (h * group, "multiplied_by_group",
         f"query head h got kv head h * {group}: from a query head to its kv head the index goes down, by the group size"),
        (h / group, "not_whole_number",
         f"query head 1 got kv head {1 / group:g}: an index must be a whole number, use integer division"),
    ]
    for candidate, code, message in mistakes:
        if got.shape == candidate.shape and np.array_equal(got, candidate):
            return code, message
    return None


register(Exercise(
    exercise_id="09_kv_head",
    title="grouped-query attention: the kv head that query head h reads, one thread per query head",
    kind="kernel",
    run=_run_kv_head,
    # (n_head, n_kv_head): a group of 4 first (every mistake shows); plain multi-head (group 1);
    # multi-query (one kv head); 33 heads in groups of 3 (past one block); a Llama-style 32 / 8;
    # a single head.
    cases=KV_HEAD_CASES,
    describe_case=lambda c: f"n_head = {c[0]}, n_kv_head = {c[1]}",
    hint=("the query heads come in groups of neighbours, all of one size, one group per kv head: "
          "which group is head h in?"),
    more_hints=("where answers go wrong: dealing heads out in turn instead of in blocks, dividing by the number "
                "of kv heads instead of the group size, and threads past the last head that still write",),
    rtol=0.0,
    atol=0.0,                       # whole numbers: exact
    diagnose=_diagnose_kv_head,
    diagnoses=("heads_interleaved", "divided_by_n_kv_head", "multiplied_by_group", "not_whole_number"),
))
