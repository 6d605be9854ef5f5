"""``07_online_softmax`` (notebook 07, warm-up): a NumPy function ``update(m, l, acc, s_block,
v_block) -> (m, l, acc)`` that folds one row's next block of scores (-inf for a masked key) and their
value rows into the running max m, the sum l of exp(s - m) and acc, the sum of exp(s - m) v (the
contract of ``flash.online_update``, its solution). The check folds a row's blocks one after the other
from (-inf, 0, zeros) and compares the last triple with the whole row's, computed at once; its cases
and named mistakes are declared in the Exercise below.
"""

from typing import NamedTuple

import numpy as np

from attention_lib.checks import online_softmax
from attention_lib.checks.engine import Exercise, register
from attention_lib.stages import flash


class Case(NamedTuple):
    """One row tried: T_k scores in blocks of `block`, values of width d_v; `kind` of scores."""

    T_k: int
    d_v: int
    block: int
    kind: str   # "normal", "rising" (the max grows block after block), "future masked", "past masked",
                # "all masked", "large"

    def __str__(self):
        return f"(T_k {self.T_k}, d_v {self.d_v}, blocks of {self.block}, {self.kind} scores)"


def _scores(case, rng):
    """One row of scores, (T_k,) float64."""
    s = rng.standard_normal(case.T_k)
    if case.kind in ("rising", "future masked", "large"):
        s += np.linspace(0.0, 6.0, case.T_k)      # later blocks hold larger scores
    if case.kind == "future masked":              # the keys after position 23 are the future
        s[24:] = -np.inf                          # blocks of 8: two blocks wholly masked
    if case.kind == "past masked":                # a sliding window, or left padding: the first
        s[:2 * case.block + 1] = -np.inf          # two blocks wholly masked, the third but one key
    if case.kind == "all masked":                 # a row that sees no key (more queries than keys)
        s[:] = -np.inf
    if case.kind == "large":
        s += 1000.0                               # exp(s) alone overflows, exp(s - m) does not
    return s


def _exact(s, v):
    """(m, l, acc) of the whole row at once, as one vector [m, l, acc...]; (-inf, 0, zeros) for a row
    whose every key is masked."""
    m = s.max()
    p = np.exp(s - m) if np.isfinite(m) else np.zeros_like(s)
    return np.concatenate([[m, p.sum()], p @ v])


def _fold(update, s, v, block):
    """Feed the row's blocks to `update`, from the empty state; returns [m, l, acc...]."""
    d_v = v.shape[1]
    m, l, acc = -np.inf, 0.0, np.zeros(d_v)
    for start in range(0, s.size, block):
        result = update(m, l, acc.copy(), s[start:start + block].copy(), v[start:start + block].copy())
        if not isinstance(result, tuple) or len(result) != 3:
            got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
            raise TypeError(f"the update must return the tuple (m, l, acc), got {got}")
        m, l, acc = result
        acc = np.asarray(acc, dtype=np.float64)
        if acc.shape != (d_v,):
            raise ValueError(f"acc must keep shape ({d_v},) (one entry per column of v), got {acc.shape}")
    return np.concatenate([[float(np.squeeze(m)), float(np.squeeze(l))], acc])


def _modelled(s, v, block, **mistakes):
    """[m, l, acc...] of the row folded a block at a time by the float64 model, with `mistakes`
    (online_softmax.fold's switches); the update the warm-up asks for has no guard of its own."""
    m, l, acc = online_softmax.fold(s, v, [slice(a, a + block) for a in range(0, s.size, block)], **mistakes)
    return np.concatenate([[m, l], acc])


def _same_non_finite(got, wrong):
    """Whether got is inf or NaN exactly where `wrong` is, and equal elsewhere."""
    bad = ~np.isfinite(wrong)
    return bad.any() and np.array_equal(~np.isfinite(got), bad) and np.allclose(got[~bad], wrong[~bad])


def _run_update(answer, case, rng, _launch):                  # NumPy: no kernel to launch
    s = _scores(case, rng)
    v = rng.standard_normal((case.T_k, case.d_v))
    return _fold(answer, s, v, case.block), _exact(s, v), s, v, case.block


def _diagnose(got, expected, s, v, block):
    """Name the mistake: rescaling left out, or which of m, l, acc is wrong."""
    close = dict(rtol=1e-7, atol=1e-10)
    for rescale_l, rescale_acc, what in [(False, False, "l and acc were"), (False, True, "l was"),
                                         (True, False, "acc was")]:
        with np.errstate(invalid="ignore"):         # a first block all masked: NaN, as the mistake gives
            wrong = _modelled(s, v, block, rescale_l=rescale_l, rescale_acc=rescale_acc, guard=False)
        if np.allclose(got, wrong, **close):
            return "online_softmax_no_rescale", (
                f"{what} not rescaled when a block raised the max: the terms already added were "
                "exp(s - m_old); against the new max they must be multiplied by exp(m_old - m_new) "
                "before the new block's exp(s - m_new) terms are added")
    if not np.isfinite(got[1:]).all():
        with np.errstate(over="ignore", invalid="ignore"):
            unguarded = _modelled(s, v, block, guard=False)
            inverted = _modelled(s, v, block, guard=False, factor=lambda m, m_new: np.exp(m_new - m))
        first_masked = np.isneginf(s[:block]).all()
        if first_masked and _same_non_finite(got, unguarded):
            return "nan_before_first_key", (
                "l and acc came out NaN on a row whose first block is all masked, as they do when that block "
                "is folded with both maxima -inf: exp(-inf - (-inf)) is NaN, and the NaN stays for good")
        said = (", as with the factor exp(m_new - m_old), which overflows"
                if _same_non_finite(got, inverted) else "")
        return "wrong_values", (
            f"after the last block l or acc is inf or NaN (l = {got[1]:.6g}){said}; the direct formula gives "
            "finite values, and the rescale factor exp(m_old - m_new) is at most 1")
    for name, part in [("m", slice(0, 1)), ("l", slice(1, 2)), ("acc", slice(2, None))]:
        if not np.allclose(got[part], expected[part], **close):
            first = int(np.argmax(~np.isclose(got[part], expected[part], **close)))
            where = f"acc[{first}]" if name == "acc" else name
            return "wrong_values", (
                f"after the last block {where} is {got[part][first]:.6g}, expected "
                f"{expected[part][first]:.6g} (m = max of the scores, l = sum of exp(s - m), "
                "acc = sum of exp(s - m) * v, not divided by l)")
    return None


register(Exercise(
    exercise_id="07_online_softmax",
    kind="function",
    run=_run_update,
    # A single key; a rising row (the max grows in every block: no rescaling, no pass); the
    # future masked (two blocks wholly -inf, and a partial last block); the past masked (the first
    # two blocks wholly -inf: the max is still -inf when they are folded); every key masked;
    # scores around 1000.
    cases=[Case(1, 1, 1, "normal"), Case(7, 5, 3, "rising"), Case(33, 24, 8, "future masked"),
           Case(20, 3, 4, "past masked"), Case(9, 2, 4, "all masked"), Case(16, 4, 5, "large")],
    hint=("the new maximum first; l and acc were summed against the old maximum, so bring them to "
          "the new one (a factor between 0 and 1) before the block's own terms join them"),
    more_hints=("the plan: the new maximum is the larger of the old one and the block's; the factor is exp of "
                "the old maximum minus the new one (1 if it stayed, 0 at the start); l and acc are multiplied "
                "by it, then the block's terms exp of each score minus the new maximum are added, to l alone "
                "and, weighting the value rows, to acc. While every score so far is masked the new maximum is "
                "still minus infinity, and minus infinity minus minus infinity is not a number: subtract 0 "
                "instead, so that the sums stay 0. Where answers go wrong: no rescale, a rescale of only one of "
                "l and acc, or the factor upside down",),
    # float64 throughout: the answer and the direct formula differ only by rounding in the order
    # of the additions and the rescalings, around 1e-15 relative; any real mistake is far larger.
    rtol=1e-7,
    atol=1e-10,
    diagnose=_diagnose,
    diagnoses=("online_softmax_no_rescale", "nan_before_first_key"),
    solution=flash.online_update,
    forbidden=(flash.online_attention,),
))
