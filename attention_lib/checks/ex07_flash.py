"""Notebook 07's exercises: the online-softmax update of one query row in NumPy, and (optional)
the fused kernel's inner loop.

``07_online_softmax``

The answer is a function ``update(m, l, acc, s_block, v_block) -> (m, l, acc)`` with the
contract of ``attention_lib.stages.flash.online_update`` for one row: m the running maximum (a float,
-inf before the first block), l the running sum of exp(s - m), acc (d_v,) the running sum of
exp(s - m) * v; s_block (n,) the next block's scores (-inf for masked keys; the first block
always has a finite one), v_block (n, d_v) their values. The check feeds a row's blocks one
after the other, starting from (-inf, 0, zeros), and compares the final triple with
(max s, sum exp(s - max), sum exp(s - max) v), computed directly.

Besides the engine's diagnoses:

- ``online_softmax_no_rescale``: right while the first block holds the maximum, wrong once a
  later block raises it: l (and/or acc) was not multiplied by exp(m_old - m_new).

Other wrong values are reported as ``wrong_values`` naming the part (m, l or acc[i]) that
differs, or saying that l or acc overflowed (a rescale factor exp(m_new - m_old), inverted).

``07_online_update`` (main): ``update(s, m, l, o, tile_max)``, a ``@cuda.jit(device=True)``
function with the contract of ``flash.v3_online_update``; the check builds flash v3 with it in
that function's place (``flash.build_flash_v3``) and compares the fused kernel's output with
the reference. Diagnoses: ``online_softmax_no_rescale``, ``rescale_l_only``,
``rescale_o_only``, ``max_not_updated``, ``natural_exp`` (exp of base-2 scores).

``07_flash_inner`` (optional, harder): ``walk_keys(q_row, acc, k, v, h, i, t_q, causal, window)``, a
``@cuda.jit(device=True)`` function with the contract of ``flash.v1_walk_keys``; the check puts it in
that function's place in flash_attention_kernel_v1 (``kernel_around``) and launches the kernel on
version 1's grid (one thread per query; lse is not checked). Its output comes from the engine's
output_array (UNWRITTEN where never written; a NaN the kernel computed stays NaN). Besides the
engine's diagnoses: ``online_softmax_no_rescale``, ``scaled_by_d_k`` (q_row is already scaled),
``mask_not_applied``, ``mask_includes_diagonal``, ``mask_ignores_offset`` (the queries are the
last T_q positions), ``mask_ignores_window`` (a sliding window's case saw the keys before the
window).
"""

import functools
import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import flash, mask
from attention_lib.checks.engine import Exercise, output_array, read_output, register


class Case(NamedTuple):
    """One row tried: T_k scores in blocks of `block`, values of width d_v; `kind` of scores."""

    T_k: int
    d_v: int
    block: int
    kind: str   # "normal", "rising" (the max grows block after block), "masked", "large"

    def __str__(self):
        return f"(T_k {self.T_k}, d_v {self.d_v}, blocks of {self.block}, {self.kind} scores)"


def _scores(case, rng):
    """One row of scores, (T_k,) float64."""
    s = rng.standard_normal(case.T_k)
    if case.kind in ("rising", "masked", "large"):
        s += np.linspace(0.0, 6.0, case.T_k)      # later blocks hold larger scores
    if case.kind == "masked":                     # the keys after position 23 are the future
        s[24:] = -np.inf                          # blocks of 8: two blocks wholly masked
    if case.kind == "large":
        s += 1000.0                               # exp(s) alone overflows, exp(s - m) does not
    return s


def _exact(s, v):
    """(m, l, acc) of the whole row at once, as one vector [m, l, acc...]."""
    m = s.max()
    p = np.exp(s - m)
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


def _update_without_rescale(rescale_l, rescale_acc):
    """The update with the rescaling of l and/or acc left out: the typical mistakes."""
    def update(m, l, acc, s_block, v_block):
        m_new = max(m, s_block.max())
        factor = np.exp(m - m_new)
        p = np.exp(s_block - m_new)
        return (m_new, (l * factor if rescale_l else l) + p.sum(),
                (acc * factor if rescale_acc else acc) + p @ v_block)
    return update


def _run_update(answer, case, rng, _launch):                  # NumPy: no kernel to launch
    s = _scores(case, rng)
    v = rng.standard_normal((case.T_k, case.d_v))
    return _fold(answer, s, v, case.block), _exact(s, v), s, v, case.block


def _diagnose(got, expected, s, v, block):
    """Name the mistake: rescaling left out, or which of m, l, acc is wrong."""
    close = dict(rtol=1e-7, atol=1e-10)
    for rescale_l, rescale_acc, what in [(False, False, "l and acc were"), (False, True, "l was"),
                                         (True, False, "acc was")]:
        if np.allclose(got, _fold(_update_without_rescale(rescale_l, rescale_acc), s, v, block), **close):
            return "online_softmax_no_rescale", (
                f"{what} not rescaled when a block raised the max: the terms already added were "
                "exp(s - m_old); against the new max they must be multiplied by exp(m_old - m_new) "
                "before the new block's exp(s - m_new) terms are added")
    if not np.isfinite(got[1:]).all():
        return "wrong_values", (
            "l or acc came out inf or NaN: the rescale factor is exp(m_old - m_new), at most 1 "
            "(0 at the first block, where m_old = -inf); exp(m_new - m_old) overflows")
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
    title="(m, l, acc) <- one more block of scores and values, the online-softmax update",
    kind="function",
    run=_run_update,
    # A single key; a rising row (the max grows in every block: no rescaling, no pass); the
    # future masked (two blocks wholly -inf, and a partial last block); scores around 1000.
    cases=[Case(1, 1, 1, "normal"), Case(7, 5, 3, "rising"), Case(33, 24, 8, "masked"),
           Case(16, 4, 5, "large")],
    hint=("the new maximum first; l and acc were summed against the old maximum, so bring them to "
          "the new one (a factor between 0 and 1) before the block's own terms join them"),
    # float64 throughout: the answer and the direct formula differ only by rounding in the order
    # of the additions and the rescalings, around 1e-15 relative; any real mistake is far larger.
    rtol=1e-7,
    atol=1e-10,
    diagnose=_diagnose,
    diagnoses=('online_softmax_no_rescale',),
))


# --- The optional exercise: the fused kernel's inner loop -----------------------------------

class KernelCase(NamedTuple):
    """One launch tried: BH heads of T_q queries against T_k keys, widths d_k and d_v."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    d_v: int
    causal: bool
    window: int = 0      # a sliding window, 0 for none

    def __str__(self):
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, d_v {self.d_v}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''})")


@functools.lru_cache(maxsize=None)
def kernel_around(walk_keys):
    """flash_attention_kernel_v1 with walk_keys in v1_walk_keys' place: the guard, the scaled
    query, acc's zeros and the division by l are the library's (v1_start_row, write_row)."""
    @cuda.jit
    def kernel(q, k, v, scale, causal, window, group, out, lse):
        i, h = cuda.grid(2)
        if i >= q.shape[1]:
            return
        q_row = cuda.local.array(flash.MAX_D, np.float32)
        acc = cuda.local.array(flash.MAX_D, np.float32)
        flash.v1_start_row(q_row, acc, q, h, i, scale, v.shape[2])
        m, l = walk_keys(q_row, acc, k, v, h, i, q.shape[1], causal, window)
        flash.write_row(out, lse, h, i, acc, m, l)
    return kernel


def _run_kernel(walk_keys, case, rng, launch):
    q = rng.standard_normal((case.BH, case.T_q, case.d_k)).astype(np.float32)
    k = rng.standard_normal((case.BH, case.T_k, case.d_k)).astype(np.float32)
    v = rng.standard_normal((case.BH, case.T_k, case.d_v)).astype(np.float32)
    # A guard zone of the rows of a whole extra block behind the (BH, T_q, d_v) output.
    full, out = output_array((case.BH, case.T_q, case.d_v), guard=flash.ROWS_PER_BLOCK * case.d_v)
    grid, block = flash.flash_grid(case.BH, case.T_q, version=1)
    with warnings.catch_warnings():
        # A wrong answer's float32 scalars may overflow in every simulated thread; the
        # diagnosis says it once.
        warnings.simplefilter("ignore", RuntimeWarning)
        launch(kernel_around(walk_keys), grid, block, cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
               np.float32(1.0 / np.sqrt(case.d_k)), case.causal, np.int32(case.window), np.int32(1), out,
               cuda.device_array((case.BH, case.T_q), np.float32))
    window = case.window or None
    return read_output(full, out), reference.attention(q, k, v, case.causal, window), q, k, v, case.causal, window


def _attention_with(q, k, v, visible, scale):
    """Attention in float64 with a given (T_q, T_k) visibility and score scale; rows that see
    nothing come out NaN (0 / 0), as a kernel dividing by l = 0 would make them."""
    s = np.where(visible, (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        return (e @ v) / e.sum(axis=-1, keepdims=True)


def _without_rescale(q, k, v, visible, scale):
    """Key by key, each term against the running max of its time, never rescaled afterwards."""
    s = np.where(visible, (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale, -np.inf)
    running = np.maximum.accumulate(s, axis=-1)              # the max when key j was added
    with np.errstate(invalid="ignore"):
        e = np.where(np.isneginf(s), 0.0, np.exp(s - running))
        return (e @ v) / e.sum(axis=-1, keepdims=True)


def _diagnose_kernel(got, expected, q, k, v, causal, window):
    t_q, t_k, d_k = q.shape[1], k.shape[1], q.shape[2]
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    offset = t_k - t_q
    visible = reference.causal_mask(t_q, t_k, window) if causal else np.ones((t_q, t_k), bool)
    scale = 1.0 / np.sqrt(d_k)
    candidates = [
        ("online_softmax_no_rescale", _without_rescale(q, k, v, visible, scale),
         "l and acc were not rescaled when a key raised the max: multiply both by exp(m - m_new) "
         "before adding p = exp(s - m_new) and p * v[h, j, c]"),
        ("scaled_by_d_k", _attention_with(q, k, v, visible, 1.0 / d_k),
         "the scores are divided by d_k: q_row already holds q / sqrt(d_k), scale it no further"),
    ]
    if window:
        candidates.append(("mask_ignores_window", _attention_with(q, k, v, j <= i + offset, scale),
                           f"with a window of {window} query i sees only keys j > i + (T_k - T_q) - window: "
                           "start the walk at first_key, not at key 0"))
    elif causal:
        candidates += [
            ("mask_not_applied", _attention_with(q, k, v, np.ones((t_q, t_k), bool), scale),
             "every query saw every key: with causal, query i sees keys 0 .. i + (T_k - T_q) only"),
            ("mask_includes_diagonal", _attention_with(q, k, v, j < i + offset, scale),
             "each query missed its own key: key i + (T_k - T_q) is visible, loop while j <= i + T_k - T_q"),
        ]
        if offset:
            candidates.append(("mask_ignores_offset", _attention_with(q, k, v, j <= i, scale),
                               f"T_k = {t_k} keys but T_q = {t_q} queries: the queries are the last "
                               "T_q positions, so query i sees keys 0 .. i + (T_k - T_q), not 0 .. i"))
    for code, wrong, message in candidates:
        # Rows that see no key in the wrong variant are NaN there; a kernel may make them
        # anything (0, NaN), so only the other entries decide.
        seen = np.isfinite(wrong)
        if seen.any() and np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
        if not seen.any() and code == "mask_includes_diagonal" and not np.any(np.isfinite(got) & (got != 0)):
            return code, message          # one key, its own: missing it leaves l = 0, and write_row zeros
    if np.isnan(got).any():                                  # a NaN the kernel computed
        where = tuple(int(x) for x in np.argwhere(np.isnan(got))[0])
        return "wrong_values", (f"the kernel computed NaN at {where}: a division by l = 0, or "
                                "exp(-inf - (-inf))? Score only the visible keys")
    return None


register(Exercise(
    exercise_id="07_flash_inner",
    title="the fused kernel's loop: score each visible key, update (m, l, acc) online",
    kind="function",
    run=_run_kernel,
    # One query and key; a few heads of 7; 33 queries (a partly used second block) with
    # d_v != d_k; fewer queries than keys (the causal offset); not causal; a sliding window of 4.
    cases=[KernelCase(1, 1, 1, 1, 1, True), KernelCase(2, 7, 7, 5, 5, True),
           KernelCase(1, 33, 33, 24, 16, True), KernelCase(2, 5, 12, 5, 5, True),
           KernelCase(1, 9, 9, 5, 5, False), KernelCase(1, 19, 19, 5, 5, True, 4)],
    describe_case=str,
    hint=("walk only the keys query i sees (first_key and visible_keys bound them); score each against the "
          "scaled query and fold it into (m, l, acc) as online_update folds a block: whenever the "
          "max grows, the sums so far were taken against the old max and must shrink to match"),
    # float32 scores, exp and sums of up to 33 terms against float64: errors around 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_kernel,
    diagnoses=('online_softmax_no_rescale', 'scaled_by_d_k', 'mask_not_applied',
               'mask_includes_diagonal', 'mask_ignores_offset', 'mask_ignores_window'),
))


# --- 07_online_update (main): v3's online update, a device function inside the fused kernel --

class UpdateCase(NamedTuple):
    """One launch of flash v3 with the answer as its online update: BH heads of T_q queries
    against T_k keys of width d_k; q times `gain` (gain 30: scores near 100, whose exp alone
    overflows float32)."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    causal: bool
    gain: float

    def __str__(self):
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'}{', large scores' if self.gain > 1 else ''})")


def _run_update_kernel(update, case, rng, _launch):   # flash_attention launches it
    q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
               for t in (case.T_q, case.T_k, case.T_k))
    q *= np.float32(case.gain)
    kernel = flash.build_flash_v3(case.d_k, {"v3_online_update": update})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)    # a wrong update's overflows: said once
        got = flash.flash_attention(q, k, v, case.causal, version=3, kernel=kernel)
    return got, reference.attention(q, k, v, case.causal), q, k, v, case.causal


def _masked_scores(q, k, causal):
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / np.sqrt(q.shape[2])   # (BH, T_q, T_k)
    return np.where(reference.causal_mask(q.shape[1], k.shape[1]), s, -np.inf) if causal else s


def _rescaled_partly(q, k, v, causal, rescale_l, rescale_o):
    """v3's tile-by-tile result when l and/or o keep terms against the max of their own tile."""
    s = _masked_scores(q, k, causal)
    tile = flash.v3_sizes(q.shape[2])["TILE_N"]
    starts = range(0, k.shape[1], tile)
    running = np.maximum.accumulate(np.stack([s[..., j:j + tile].max(-1) for j in starts]), axis=0)
    safe = lambda m: np.where(np.isneginf(m), 0.0, m)[..., None]
    num = den = 0.0
    for n, j in enumerate(starts):
        own, final = np.exp(s[..., j:j + tile] - safe(running[n])), np.exp(s[..., j:j + tile] - safe(running[-1]))
        num = num + (final if rescale_o else own) @ v[:, j:j + tile]
        den = den + (final if rescale_l else own).sum(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return num / den


def _last_tile_only(q, k, v, causal):
    """v3's result when the running max is never stored: every tile restarts the row (its
    rescale is 2^(-inf) = 0), so a row keeps only the last tile its block loads."""
    s = _masked_scores(q, k, causal)
    sizes = flash.v3_sizes(q.shape[2])
    t_q, t_k = s.shape[1:]
    out = np.zeros((q.shape[0], t_q, v.shape[2]))
    for i in range(t_q):
        last = min((i // sizes["TILE_M"] + 1) * sizes["TILE_M"], t_q) - 1
        j = (-(-mask.visible_count(last, t_q, t_k, causal) // sizes["TILE_N"]) - 1) * sizes["TILE_N"]
        seen = s[:, i, j:j + sizes["TILE_N"]]
        if j >= 0 and np.isfinite(seen).any():
            out[:, i] = reference.softmax(seen) @ v[:, j:j + sizes["TILE_N"]]
    return out


def _diagnose_update(got, expected, q, k, v, causal):
    candidates = [
        ("online_softmax_no_rescale", _rescaled_partly(q, k, v, causal, False, False),
         "neither l nor o was rescaled when a tile raised a row's max: the sums so far were taken "
         "against the old max and must shrink to the new one"),
        ("rescale_l_only", _rescaled_partly(q, k, v, causal, True, False),
         "l was rescaled but o was not: the output's sums were taken against the same old max"),
        ("rescale_o_only", _rescaled_partly(q, k, v, causal, False, True),
         "o was rescaled but l was not: l's sum was taken against the same old max"),
        ("max_not_updated", _last_tile_only(q, k, v, causal),
         "each row kept only its last tile of keys: the running max m was never stored, so every "
         "tile's rescale against it wiped what came before"),
        ("natural_exp", reference.softmax(_masked_scores(q, k, causal) * flash.LOG2E) @ v,
         "the weights are too sharp by a factor log2(e): the scores arrive in base 2 (Q carries "
         "log2(e)), so their exponential is exp2, not exp"),
    ]
    for code, wrong, message in candidates:
        seen = np.isfinite(wrong)
        if seen.any() and np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
    if not np.isfinite(got).all():
        return "wrong_values", ("the output has inf or NaN: a rescale above 1 overflows (the new max "
                                "is the larger one), and a row with no key yet must keep l and o at 0")
    return None


register(Exercise(
    exercise_id="07_online_update",
    title="flash v3's online update: fold a tile of base-2 scores into the rows' running max, sums and output",
    kind="function",
    run=_run_update_kernel,
    # One key; fewer queries than keys over three key tiles (the causal offset, rows whose max
    # grows); two heads, not causal; scores near 100 (exp without the max overflows).
    cases=[UpdateCase(1, 1, 1, 5, True, 1.0), UpdateCase(1, 19, 70, 8, True, 1.0),
           UpdateCase(2, 40, 40, 5, False, 1.0), UpdateCase(1, 33, 33, 7, True, 30.0)],
    hint=("every thread of a row sees the same row-wide tile max, so all of them can bring their "
          "partial sums to the new max by the same factor before the tile's own terms join them"),
    # float32 scores, exp2 and sums of up to 70 terms against float64: errors near 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_update,
    diagnoses=("online_softmax_no_rescale", "rescale_l_only", "rescale_o_only", "max_not_updated",
               "natural_exp"),
))
