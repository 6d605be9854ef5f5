"""Notebook 08's exercise: one decode step with a NumPy KV cache, with its typical mistakes named.

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
- ``missing_scale``: the scores were not divided by sqrt(d_k) (or were divided by d_k).
"""

from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks.engine import Exercise, register


class Case(NamedTuple):
    """One size tried: n_head heads of width d_k, a cache of `capacity` positions, `length` filled."""

    n_head: int
    d_k: int
    capacity: int
    length: int

    def __str__(self):
        return (f"(n_head {self.n_head}, d_k {self.d_k}, capacity {self.capacity}, "
                f"length {self.length})")


def _attend(q, keys, values, scale):
    """One query per head against keys (n_head, n, d_k): reference.attention with a custom scale."""
    s = np.einsum("hd,hnd->hn", q, keys) * scale                  # (n_head, n) scores
    return np.einsum("hn,hnd->hd", reference.softmax(s), values) if keys.shape[1] else np.full(q.shape, np.nan)


def _run_decode_step(answer, case, rng):
    n_head, d_k, capacity, length = case
    q, k_new, v_new = rng.standard_normal((3, n_head, d_k)).astype(np.float32)
    # Positions 0 .. length - 1 filled; the rest stale, from an earlier sequence.
    k_cache = rng.standard_normal((n_head, capacity, d_k)).astype(np.float32)
    v_cache = rng.standard_normal((n_head, capacity, d_k)).astype(np.float32)
    k_before, v_before = k_cache.copy(), v_cache.copy()
    keys, values = k_cache.copy(), v_cache.copy()                  # what the cache must become
    keys[:, length], values[:, length] = k_new, v_new
    expected = reference.attention(q[:, None], keys[:, :length + 1], values[:, :length + 1])[:, 0]
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
    exercise_id="08_decode_step",
    title="append the new token's k and v to a NumPy cache, then attend with its query",
    kind="function",
    run=_run_decode_step,
    # A general case first (every mistake shows: d_k 5 is no square, stale slots after the
    # new one); one head of width 1; the first token of a sequence (empty cache: the output is
    # v_new); the step that fills the cache to its last slot.
    cases=[Case(2, 5, 9, 3), Case(1, 1, 2, 1), Case(4, 16, 32, 0), Case(3, 24, 40, 39)],
    hint=("k_cache[:, length] = k_new and v_cache[:, length] = v_new first; then with "
          "K = k_cache[:, :length + 1] (n_head, length + 1, d_k): s = (K @ q[:, :, None])[..., 0] / sqrt(d_k), "
          "a stable softmax along the last axis, out = (weights[:, None, :] @ V)[:, 0]; return (out, length + 1)"),
    # float32 inputs; an answer may compute in float32 (errors ~1e-7 of values of order 1) or float64.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose,
    diagnoses=('cache_not_appended', 'attends_past_length', 'missing_scale', 'wrong_length',
               'cache_overwritten'),
))
