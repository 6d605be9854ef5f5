"""How ``07_walk_keys`` (judged in ``ex07_walk_keys``) names a walk whose values are wrong: kernel 2's
output modelled in float64 as its blocks walk their bands (``_v2_result``), under online_softmax.fold's
mistakes and the mask's usual slips (``_mask_candidates``); ``diagnose_walk`` names the first whose
output the answer's matches.
"""

import math

import numpy as np

from attention_lib import reference
from attention_lib.checks import online_softmax
from attention_lib.stages import flash, mask


def _v2_result(q, k, v, bands, ends, visible, **mistakes):
    """Kernel 2's output in float64: each block of queries walks its band of key tiles (bands:
    band_key_tiles' (q0, rows, first tile, tiles); a mistake changes what a query folds, never which
    tiles are loaded) up to key ends[block] (its last query's last), and folds the keys `visible`
    ((T_q, T_k) bool) says a query sees, with online_softmax.fold's `mistakes`."""
    bh, t_q, d_k = q.shape
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / math.sqrt(d_k)           # (BH, T_q, T_k)
    s = np.where(visible, s, -np.inf)
    out = np.zeros((bh, t_q, v.shape[2]))
    for (q0, rows, first_tile, tiles), end in zip(bands, ends):
        walk = [slice(k0, min(k0 + flash.BLOCK_K, end)) for k0 in range(first_tile * flash.BLOCK_K, end, flash.BLOCK_K)]
        for h, i in ((h, i) for h in range(bh) for i in range(q0, q0 + rows)):
            # the walk folds only the tiles where the query sees a key, unless it lacks that guard
            folded = [t for t in walk if not mistakes.get("guard", True) or np.isfinite(s[h, i, t]).any()]
            out[h, i] = online_softmax.normalised(*online_softmax.fold(s[h, i], v[h], folded, **mistakes)[1:])
    return out


def _mask_candidates(t_q, t_k, causal, window):
    """(visible, [(code, visible, message), ...]): the keys a query sees, and those it folds under the
    usual mistakes of the mask."""
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    last = i + (t_k - t_q)                                   # the query's own key
    visible = reference.causal_mask(t_q, t_k, window) if causal else np.ones((t_q, t_k), bool)
    if not causal:
        return visible, []
    start = np.maximum(last - window + 1, 0) if window else np.zeros_like(last)   # the first key a query sees
    offset = t_k - t_q
    why = ("either its own key was left out, or the offset T_k - T_q (here 1) was ignored, query i stopping at "
           "key i" if offset == 1 and not window else "its own key was left out")
    found = [("diagonal_misplaced", visible & (j < last),
              f"each query stopped one key short of its own, i + T_k - T_q: {why}. The keys it sees run up to its "
              "own, included")]
    if offset not in (0, 1):
        ignored = (j <= i) & ((j > i - window) if window else True)
        found += [("diagonal_misplaced", ignored,
                   f"each query's keys ended at key i, not at its own, i + T_k - T_q: the offset T_k - T_q "
                   f"(here {offset}) was ignored. The queries are the last T_q of the T_k positions")]
    found += [
             ("mask_off_by_one", visible | (j == last + 1),
              "each query also folded in the key just after its own: the keys it sees end at its own, i + T_k - T_q"),
             ("mask_off_by_one", visible & (j != start),
              "each query missed the first key it sees (key 0, or the window's first): it sees that key"),
             ("mask_not_applied", np.ones((t_q, t_k), bool),
              "each query folded in every key of the tiles its block loads, past its own: only the keys from "
              "its first to its own are its to see")]
    if window:
        found += [("mask_ignores_window", reference.causal_mask(t_q, t_k),
                   f"with a window of {window} a query also folded in the keys before it, from the tile's first key"),
                  ("window_off_by_one", visible | ((j == start - 1) & (j <= last)),
                   f"with a window of {window} each query also folded in the key before the window: it sees its last "
                   f"{window} positions, its own included")]
    return visible, found


def _started_at_zero(got, expected, q, k, visible):
    """Whether the rows that came out 0 where the reference is not are rows whose every visible score
    lies below -104, where exp(s - 0) is 0 in float32: a running max started at 0 stays there."""
    zero = (got == 0).all(axis=-1) & (expected != 0).any(axis=-1)                     # (BH, T_q)
    if not zero.any():
        return False
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    top = np.where(visible, s, -np.inf).max(axis=-1)
    return bool((top[zero] < -104).all())


def diagnose_walk(got, expected, q, k, v, causal, window):
    t_q, t_k = q.shape[1], k.shape[1]
    bands = mask.band_key_tiles(t_q, t_k, causal, window, flash.BLOCK_Q, flash.BLOCK_K)
    ends = [mask.visible_count(q0 + rows - 1, t_q, t_k, causal) for q0, rows, _, _ in bands]
    visible, masks = _mask_candidates(t_q, t_k, causal, window)
    if _started_at_zero(got, expected, q, k, visible):
        return "max_started_at_zero", ("rows whose every score lies below -104 came out 0: exp(s - m) with m 0 is 0 "
                                       "in float32 there, so l stayed 0. A running max started at 0, not at minus "
                                       "infinity, never takes the row's own maximum")
    candidates = online_softmax.rescale_mistakes("acc", "query", "exp") + [
        ("nan_before_first_key", dict(guard=False),
         "queries came out NaN exactly where a walk that folds a tile the query sees no key of, while its max is "
         "still -inf, makes them NaN: exp(-inf - (-inf)) is NaN, and the NaN stays"),
    ] + [(code, dict(visible=wrong), message) for code, wrong, message in masks]
    for code, switches, message in candidates:
        wrong = _v2_result(q, k, v, bands, ends, **{"visible": visible, **switches})
        if code == "nan_before_first_key":
            nan = np.isnan(wrong)
            if nan.any() and np.array_equal(np.isnan(got), nan) and np.allclose(got[~nan], wrong[~nan], 1e-4, 1e-4):
                return code, message
            continue
        seen = np.isfinite(wrong)
        if seen.any() and not np.allclose(wrong, expected, 1e-4, 1e-4) and \
                np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
    if not np.isfinite(got).all() and np.isfinite(expected).all() and np.abs(q[0] @ k[0].T).max() > 88 * math.sqrt(q.shape[-1]):
        return "unstable_softmax", ("the output has inf or NaN on scores in the hundreds, where the reference is "
                                    "finite: exp of such a score overflows float32 (past about 88) unless the "
                                    "running max is subtracted first")
    if np.isnan(got).any():
        where = tuple(int(x) for x in np.argwhere(np.isnan(got))[0])
        return "wrong_values", (f"the output holds NaN, first at {where} (head, query, column), where the "
                                f"reference is finite ({int(np.isnan(got).sum())} NaN entries)")
    return None
