"""Notebook 07's exercises: the online softmax in NumPy (warm-up), then kernel 2's key-tile step.

``07_online_softmax`` (warm-up)

The answer is a function ``update(m, l, acc, s_block, v_block) -> (m, l, acc)`` with the
contract of ``attention_lib.stages.flash.online_update`` for one row: m the running maximum (a float,
-inf before the first block), l the running sum of exp(s - m), acc (d_v,) the running sum of
exp(s - m) * v; s_block (n,) the next block's scores (-inf for masked keys; the first block
always has a finite one), v_block (n, d_v) their values. The check feeds a row's blocks one
after the other, starting from (-inf, 0, zeros), and compares the final triple with
(max s, sum exp(s - max), sum exp(s - max) v), computed directly. Its solution is
``flash.online_update``.

Besides the engine's diagnoses:

- ``online_softmax_no_rescale``: right while the first block holds the maximum, wrong once a
  later block raises it: l (and/or acc) was not multiplied by exp(m_old - m_new).

Other wrong values are reported as ``wrong_values`` naming the part (m, l or acc[i]) that
differs, or saying that l or acc overflowed (a rescale factor exp(m_new - m_old), inverted).

``07_key_tile`` (main)

The answer is a ``@cuda.jit(device=True)`` function with the contract of ``flash.v2_key_tile``
(its solution): one key tile of kernel 2, by the whole block: stage the tile's K and V rows in
shared memory (with the given ``v2_stage_rows``), wait, score the keys of the tile the thread's
query sees (the given ``v2_score_tile``, notebook 02's score) and fold them into its running
(m, l, acc) with one rescale per tile (the given ``v2_scale_row`` and ``v2_add_row`` do the
output's arithmetic, notebook 05's weighted sum), wait again; return (m, l). The check builds flash_attention_kernel_v2 with the answer in v2_key_tile's place
(``kernel_around``) and runs it under the race finder on every case (which also reports a
barrier not every thread reaches: ``divergent_barrier``). Its cases: one query and key; three
blocks of queries and three key tiles, the last ones partial, d_v != d_k; more queries than keys
(rows that see nothing get zeros); a sliding window over the last queries of a longer context
(rows whose band starts in a tile they see none of); no mask; scores in the hundreds. Besides the
engine's diagnoses:

- ``online_softmax_no_rescale``, ``rescale_l_only``, ``rescale_o_only``: the sums so far were
  not (or only one of them was) rescaled when a tile raised the max;
- ``max_not_updated``: the new max was never kept, so every tile restarted the row;
- ``nan_before_first_key``: a tile the query sees no key of was folded in while its max was
  still -inf (exp(-inf - (-inf)) is NaN);
- ``mask_not_applied``: every key of the loaded tiles was folded in, past the query's own;
- ``mask_includes_diagonal``: the query's own key was left out;
- ``mask_ignores_window``: with a window, the keys before it (in the loaded tiles) were folded in;
- ``unstable_softmax``: exp of a score without the max subtracted overflowed.
"""

import functools
import math
import types
import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import flash, mask
from attention_lib.checks.engine import Diagnosed, Exercise, host_output, race_finding_launch, register


# --- 07_online_softmax (warm-up): one row's update in NumPy ----------------------------------

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
    more_hints=("where answers go wrong: adding the block's terms without shrinking the old sums, which is "
                "right only while the first block holds the row's maximum; shrinking only one of l and acc; "
                "or the factor upside down: exp of the old max minus the new one, never the reverse, and 0 "
                "when there was no old max",),
    # float64 throughout: the answer and the direct formula differ only by rounding in the order
    # of the additions and the rescalings, around 1e-15 relative; any real mistake is far larger.
    rtol=1e-7,
    atol=1e-10,
    diagnose=_diagnose,
    diagnoses=('online_softmax_no_rescale',),
    solution=flash.online_update,
    forbidden=(flash.online_attention,),
))


# --- 07_key_tile (main): kernel 2's step over one key tile ----------------------------------

class KeyTileCase(NamedTuple):
    """One launch of kernel 2 with the answer as its key-tile step: BH heads of T_q queries against
    T_k keys, widths d_k and d_v; a sliding window (0: none); large: scores in the hundreds."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    d_v: int
    causal: bool
    window: int = 0
    large: bool = False

    def __str__(self):
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, d_v {self.d_v}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''}"
                f"{', large scores' if self.large else ''})")


def large_scores(rng, bh, t_q, t_k, d_k):
    """q and k ((bh, T, d_k) float32, d_k a power of 4) whose scores q . k / sqrt(d_k) are exact in
    float32 and reach the hundreds: q's entries +-40, k's small integers, 1 / sqrt(d_k) a power of
    2. exp of such a score overflows float32 (past about 88); exp of it minus the max does not, and
    a correct kernel stays within 1e-5 of the reference, as no score is rounded."""
    q = 40.0 * rng.choice([-1.0, 1.0], size=(bh, t_q, d_k))
    k = rng.integers(-3, 4, size=(bh, t_k, d_k)).astype(np.float64)
    return q.astype(np.float32), k.astype(np.float32)


@functools.lru_cache(maxsize=None)
def kernel_around(key_tile):
    """flash_attention_kernel_v2 with key_tile in v2_key_tile's place: the staging of the queries,
    the loop over the block's band and the division by l are the library's."""
    kernel = flash.flash_attention_kernel_v2.py_func
    names = {**vars(flash), "v2_key_tile": key_tile}
    return cuda.jit(types.FunctionType(kernel.__code__, names, kernel.__name__))


def _run_key_tile(key_tile, case, rng, _launch):
    q, k = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32) for t in (case.T_q, case.T_k))
    v = rng.standard_normal((case.BH, case.T_k, case.d_v)).astype(np.float32)
    if case.large:
        q, k = large_scores(rng, case.BH, case.T_q, case.T_k, case.d_k)
    out, lse = host_output((case.BH, case.T_q, case.d_v)), np.zeros((case.BH, case.T_q), np.float32)
    grid, block = flash.flash_grid(case.BH, case.T_q, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a wrong answer's float32 overflows: said once
        try:                                              # every case under the race finder: the tiles are shared
            race_finding_launch(kernel_around(key_tile), grid, block, q, k, v, flash.flash_scale(2, case.d_k),
                                case.causal, np.int32(case.window), np.int32(1), out, lse)
        except OverflowError as error:                    # the simulator's math.exp; a GPU gives inf
            raise Diagnosed("unstable_softmax", f"exp overflowed ({error}): exp of a score of about "
                            f"{np.abs(q[0, 0] @ k[0].T).max() / math.sqrt(case.d_k):.0f} is too large for "
                            "float32; every exp must take a score minus the running max") from None
    window = case.window or None
    return out, reference.attention(q, k, v, case.causal, window), q, k, v, case.causal, window, case.large


def _v2_result(q, k, v, bands, visible, *, scale=None, rescale_l=True, rescale_acc=True, keep_max=True,
               guard=True):
    """Kernel 2's output in float64: each block of queries walks its band of key tiles (bands:
    band_key_tiles' (q0, rows, first tile, tiles) of the library's mask; a mistake changes what a
    query folds, never which tiles are loaded) and folds the keys `visible` ((T_q, T_k) bool) says
    a query sees, with parts of the fold switched off (the mistakes)."""
    bh, t_q, d_k = q.shape
    t_k = k.shape[1]
    scale = 1 / math.sqrt(d_k) if scale is None else scale
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale                  # (BH, T_q, T_k)
    out = np.zeros((bh, t_q, v.shape[2]))
    for q0, rows, first_tile, tiles in bands:
        for h, i in ((h, i) for h in range(bh) for i in range(q0, q0 + rows)):
            m, l, acc = -np.inf, 0.0, np.zeros(v.shape[2])
            for k0 in range(first_tile * flash.BLOCK_K, (first_tile + tiles) * flash.BLOCK_K, flash.BLOCK_K):
                keys = [j for j in range(k0, min(k0 + flash.BLOCK_K, t_k)) if visible[i, j]]
                if not keys and guard:
                    continue
                scores = s[h, i, keys]
                m_new = max(m, scores.max()) if keys else m
                with np.errstate(invalid="ignore"):
                    factor = np.exp(m - m_new)                    # NaN when both are -inf
                l, acc = (l * factor if rescale_l else l), (acc * factor if rescale_acc else acc)
                p = np.exp(scores - m_new)
                l, acc = l + p.sum(), acc + p @ v[h, keys]
                m = m_new if keep_max else m
            with np.errstate(invalid="ignore"):
                out[h, i] = acc / l if (l > 0 or np.isnan(l)) else 0.0     # write_row: zeros if no key
    return out


def _diagnose_key_tile(got, expected, q, k, v, causal, window, large):
    t_q, t_k = q.shape[1], k.shape[1]
    bands = mask.band_key_tiles(t_q, t_k, causal, window, flash.BLOCK_Q, flash.BLOCK_K)
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    offset = t_k - t_q
    visible = reference.causal_mask(t_q, t_k, window) if causal else np.ones((t_q, t_k), bool)
    if large and not np.isfinite(got).all():
        return "unstable_softmax", ("the output has inf or NaN on scores in the hundreds: exp of a score "
                                    "without the running max subtracted overflows float32")
    candidates = [
        ("online_softmax_no_rescale", dict(rescale_l=False, rescale_acc=False),
         "neither l nor acc was rescaled when a tile raised the max: the sums so far were taken against the "
         "old max and must be multiplied by exp(m - m_new) before the tile's terms are added"),
        ("rescale_l_only", dict(rescale_acc=False),
         "l was rescaled when a tile raised the max, acc was not: its sums were taken against the same old max"),
        ("rescale_o_only", dict(rescale_l=False),
         "acc was rescaled when a tile raised the max, l was not: its sum was taken against the same old max"),
        ("max_not_updated", dict(keep_max=False),
         "each query kept only the last tile it sees: the new max was never kept as m, so every tile's "
         "rescale against the old -inf wiped what came before"),
        ("nan_before_first_key", dict(guard=False),
         "queries that had seen no key yet came out NaN: a tile the query sees none of has max -inf, and "
         "exp(-inf - (-inf)) is NaN; fold a tile only when the query sees one of its keys"),
    ]
    if causal:
        candidates += [
            ("mask_includes_diagonal", dict(visible=visible & (j < i + offset)),
             "each query missed its own key: the keys it sees run up to my_keys - 1, its own included"),
            ("mask_not_applied", dict(visible=np.ones((t_q, t_k), bool)),
             "each query folded in every key of the tiles its block loads, past its own: only the keys from "
             "my_first to my_keys - 1 are its own to see"),
        ]
    if window:
        candidates.append(("mask_ignores_window", dict(visible=reference.causal_mask(t_q, t_k)),
                           f"with a window of {window} a query also folded in the keys before it: start at "
                           "my_first, not at the tile's first key"))
    for code, switches, message in candidates:
        wrong = _v2_result(q, k, v, bands, **{"visible": visible, **switches})
        if code == "nan_before_first_key":
            nan = np.isnan(wrong)
            if nan.any() and np.array_equal(np.isnan(got), nan) and np.allclose(got[~nan], wrong[~nan], 1e-4, 1e-4):
                return code, message
            continue
        seen = np.isfinite(wrong)
        if seen.any() and np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
    if np.isnan(got).any():
        where = tuple(int(x) for x in np.argwhere(np.isnan(got))[0])
        return "wrong_values", (f"the kernel computed NaN at {where}: a 0 / 0, or exp(-inf - (-inf)) for a "
                                "query that saw no key of a tile?")
    return None


register(Exercise(
    exercise_id="07_key_tile",
    title="kernel 2's key-tile step: stage a K/V tile, wait, score and fold it online, wait",
    kind="function",
    run=_run_key_tile,
    # One query and key; three blocks of queries over three key tiles, the last of each partial,
    # d_v != d_k (threads past T_q in the last block); more queries than keys (rows that see
    # nothing); a window of 5 over the last 12 of 40 positions (the band starts in a tile most of
    # its rows see none of); no mask; scores in the hundreds.
    cases=[KeyTileCase(1, 1, 1, 5, 5, True), KeyTileCase(1, 33, 33, 7, 5, True),
           KeyTileCase(2, 20, 7, 5, 5, True), KeyTileCase(1, 12, 40, 16, 16, True, 5),
           KeyTileCase(1, 24, 24, 9, 9, False), KeyTileCase(1, 17, 17, 16, 16, True, 0, True)],
    describe_case=str,
    hint=("the block copies the tile together and waits; then each thread scores the keys of the tile its "
          "query sees, shrinks its sums once by how much the tile raised its running max, adds the tile's "
          "terms and keeps the new max; then everyone waits before the next copy overwrites the tile"),
    more_hints=("where answers go wrong: a barrier inside the branch that only threads whose query sees a key "
                "of the tile take (every thread of the block must reach both); folding a tile the query sees "
                "none of while its max is still minus infinity (exp of minus infinity minus minus infinity is "
                "not a number); rescaling l but not acc, or forgetting to keep the new max for the next tile",),
    # float32 scores, exp and sums of up to 40 terms against float64: errors around 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_key_tile,
    diagnoses=("online_softmax_no_rescale", "rescale_l_only", "rescale_o_only", "max_not_updated",
               "nan_before_first_key", "mask_not_applied", "mask_includes_diagonal", "mask_ignores_window",
               "unstable_softmax"),
    solution=flash.v2_key_tile,
    forbidden=(flash.flash_attention_kernel_v2, flash.flash_attention_kernel_v1, flash.v1_walk_keys,
               flash.flash_attention, flash.launch_flash),
))
