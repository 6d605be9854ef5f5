"""``09_lse_merge`` (notebook 09, warm-up): the log-sum-exp merge of split-K partials, as a kernel with
``kv_cache.decode_merge_kernel``'s signature ``(lse_part, o_part, out, lse)``, launched as that kernel
is: each head's chunks' log-sum-exps LSE_c and normalised outputs o_c merged into the head's output
and its log-sum-exp, weighed by exp(LSE_c - M) with M the largest LSE_c. Its solution is
``kv_cache.decode_merge_kernel``; its cases, limits and named mistakes are declared in the
``Exercise`` below.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib.stages import kv_cache
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output
from attention_lib.checks.limits import NoSerialCopy
from attention_lib.checks.result import Diagnosed, got_and_expected


class LseCase(NamedTuple):
    """One size tried: n_head heads of n_chunks partials with d_v components; LSEs of order 3
    ("normal"), around +-1000 ("large"), with each head's last chunk masked ("masked") or its first
    ("first masked"), or spread over -60 .. 60, the first chunk's the lowest ("spread"), or the last
    chunk's 800, the others' within -60 .. 0 ("last high": a max that misses the last chunk overflows)."""

    n_head: int
    n_chunks: int
    d_v: int
    kind: str

    def __str__(self):
        return f"(n_head {self.n_head}, n_chunks {self.n_chunks}, d_v {self.d_v}, {self.kind} LSEs)"


LSE_CASES = [LseCase(1, 1, 1, "normal"), LseCase(3, 5, 7, "normal"), LseCase(5, 3, 19, "large"),
             LseCase(2, 4, 33, "masked"), LseCase(3, 4, 5, "first masked"), LseCase(2, 5, 9, "spread"),
             LseCase(3, 4, 6, "last high"), LseCase(2, 3, 64, "normal")]       # the last: the model's d_v


def _lse_partials(n_head, n_chunks, d_v, kind, rng):
    """Random (lse_part, o_part), float32: LSEs of order 3, or of order +-1000, or one chunk masked."""
    lse = 3.0 * rng.standard_normal((n_head, n_chunks))
    if kind == "large":                  # heads alternately around +1000 and -1000
        lse += np.where(np.arange(n_head)[:, None] % 2 == 0, 1000.0, -1000.0)
    if kind == "spread":                 # past exp's float32 range apart, the first chunk's the lowest
        lse = np.sort(rng.uniform(-60.0, 60.0, (n_head, n_chunks)), axis=1)
        lse[:, 0], lse[:, -1] = -60.0, 60.0
    if kind == "last high":              # the last chunk's LSE 800 above the others' (past exp's float64 range)
        lse = rng.uniform(-60.0, 0.0, (n_head, n_chunks))
        lse[:, -1] = 800.0
    o = rng.standard_normal((n_head, n_chunks, d_v))
    if kind in ("masked", "first masked"):  # the last (first) chunk of every head saw only masked keys
        column = -1 if kind == "masked" else 0
        lse[:, column], o[:, column] = -np.inf, 0.0
    return lse.astype(np.float32), o.astype(np.float32)


FLOAT_ERRORS = (OverflowError, ZeroDivisionError, FloatingPointError, ValueError)


def _merged(kernel, lse_part, o_part, launch):
    """The kernel's (n_head, d_v + 1) result: out, then the merged lse as one more column."""
    n_head, _, d_v = o_part.shape
    full_out, d_out = output_array((n_head, d_v), guard=d_v * kv_cache.MERGE_BLOCK[1])
    full_lse, d_lse = output_array(n_head, guard=kv_cache.MERGE_BLOCK[1])
    (_, _), (grid, block) = kv_cache.decode_grid(n_head, d_v, 1, 2)
    launch(kernel, grid, block, cuda.to_device(lse_part), cuda.to_device(o_part), d_out, d_lse)
    return np.concatenate([read_output(full_out, d_out), read_output(full_lse, d_lse)[:, None]], axis=1)


def _right_near(kernel, centre, launch):
    """Whether the kernel merges two heads of 4 chunks whose LSEs all lie within 3 of `centre` right."""
    lse_part = (centre + np.array([[0.0, -2.0, 1.5, -0.5], [2.5, -1.0, 0.0, 3.0]])).astype(np.float32)
    o_part = np.linspace(-1.0, 1.0, 2 * 4 * 5, dtype=np.float32).reshape(2, 4, 5)
    want_out, want_lse = kv_cache.merge_partials(lse_part, o_part)
    try:
        got = _merged(kernel, lse_part, o_part, launch)
    except Exception:  # noqa: BLE001  (whatever the answer raises, these heads are not right)
        return False
    return bool(np.allclose(got, np.concatenate([want_out, want_lse[:, None]], axis=1), rtol=1e-5, atol=1e-5))


def _name_a_max_from_zero(kernel, launch):
    """Diagnosed when the answer merges heads whose LSEs lie near +1000 right but not those near
    -1000: M started at 0 (above every LSE of such a head), not at -inf or the first LSE_c."""
    if _right_near(kernel, 1000.0, launch) and not _right_near(kernel, -1000.0, launch):
        raise Diagnosed("max_started_at_zero", (
            "inf or NaN for heads whose chunk LSEs all lie near -1000, right for heads near +1000: M started at "
            "0, above every LSE_c of such a head, so M stayed 0, every weight exp(LSE_c - M) underflowed to 0 "
            "and their sum was 0; start M at -inf (or at the head's first LSE_c), so that it becomes the "
            "largest LSE_c"))


def _run_lse_merge(kernel, case, rng, launch):
    n_head, n_chunks, d_v, kind = case
    lse_part, o_part = _lse_partials(n_head, n_chunks, d_v, kind, rng)
    want_out, want_lse = kv_cache.merge_partials(lse_part, o_part)
    expected = np.concatenate([want_out, want_lse[:, None]], axis=1)   # column d_v: the merged lse
    try:
        got = _merged(kernel, lse_part, o_part, launch)
    except FLOAT_ERRORS:
        # The simulator's math.exp raises on overflow, and math.log(0) (a sum that underflowed)
        # raises ValueError; a GPU returns inf, NaN or -inf instead.
        if kind not in ("large", "spread", "last high"):
            raise                        # not the overflow this case tests: the engine reports it
        got = np.full(expected.shape, np.inf)
    if kind == "large" and not np.isfinite(got).all():
        _name_a_max_from_zero(kernel, launch)
    return got, expected, lse_part, o_part, kind


def _wrong_values_said(got, expected, close):
    """wrong_values, said as out[h, e] and lse[h] (the check holds lse as one more column of out)."""
    out, lse = got[:, :-1], got[:, -1]
    out_bad = ~np.isclose(out, expected[:, :-1], **close)
    lse_bad = ~np.isclose(lse, expected[:, -1], **close)
    said = []
    if out_bad.any():
        h, e = (int(i) for i in np.argwhere(out_bad)[0])
        said.append(f"out differs in {int(out_bad.sum())} of {out.size} entries, first out[{h}, {e}]: "
                    f"{got_and_expected(out[h, e], expected[h, e])}")
    if lse_bad.any():
        h = int(np.argmax(lse_bad))
        said.append(f"lse differs in {int(lse_bad.sum())} of {lse.size} heads, first lse[{h}]: "
                    f"{got_and_expected(lse[h], expected[h, -1])}")
    if not out_bad.any():
        said.insert(0, "the outputs are right but lse is not")
        said.append("lse[h] is M + log of the sum of the weights exp(LSE_c - M)")
    return "wrong_values", "; ".join(said)


def _diagnose_lse_merge(got, expected, lse_part, o_part, kind):
    close = dict(rtol=1e-5, atol=1e-5)
    out, lse = got[:, :-1], got[:, -1]
    lse64 = lse_part.astype(np.float64)
    m = lse64.max(axis=1, keepdims=True)
    broken = not np.isfinite(got[np.isfinite(expected)]).all()
    if broken and kind in ("masked", "first masked", "spread", "last high"):
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
        return _wrong_values_said(got, expected, close)
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
    return _wrong_values_said(got, expected, close)


register(Exercise(
    exercise_id="09_lse_merge",
    kind="kernel",
    run=_run_lse_merge,
    # (n_head, n_chunks, d_v, kind): one of each; sizes that are no multiple of the (16, 4)
    # block; chunk LSEs around +-1000 (overflow without the max, underflow of every weight of the
    # heads near -1000 with a max started at 0, lost precision with a rounded LSE); the last chunk's LSE -inf; the first chunk's -inf; LSEs 120 apart, the first
    # the lowest (overflow with an M that is not the largest); the last chunk's LSE 800 above the
    # others (overflow with a max that misses the last chunk).
    cases=LSE_CASES,
    hint=("each thread owns one output component of one head: it looks at every chunk's LSE, weighs chunk c "
          "by its share of the softmax's denominator, and adds up"),
    more_hints=("the plan: for thread (e, h) inside the output, a first pass over the head's chunks finds M, "
                "the largest LSE; a second adds up the weights, exp of LSE minus M, and the weighted components "
                "of the chunks' outputs; the component is the weighted sum divided by the sum of the weights, and "
                "the thread of component 0 also writes M plus the log of that sum",
                "where answers go wrong: exp of an LSE as it is (it can be 1000), an M that is not the largest (the "
                "first chunk's may be minus infinity, the last chunk's may be the largest), weights taken against "
                "a rounded total, threads outside the output that still write"),
    # float32 exp and sums of a few terms against float64: errors around 1e-7 on outputs of order 1,
    # and the float32 rounding of an lse near 1000 (6e-5) is inside rtol.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_lse_merge,
    diagnoses=("unstable_softmax", "max_not_largest", "max_started_at_zero", "merge_unweighted", "weights_not_normalised",
               "weights_from_rounded_lse", "lse_is_max", "lse_without_max"),
    # One thread per output component: a head's components written by one thread in a loop are refused.
    limits=(NoSerialCopy("out", access="store"),),
    solution=kv_cache.decode_merge_kernel,
    forbidden=(kv_cache.decode_step, kv_cache.decode_kernel_v2),
))
