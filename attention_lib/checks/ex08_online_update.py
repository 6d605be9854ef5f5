"""``08_online_update`` (notebook 08, warm-up 1): notebook 07's online update for a thread's MICRO_M
rows of kernel 3, scores in base 2 (the contract of ``flash.v3_online_update``). Its cases, limits and
named mistakes are declared in the ``Exercise`` below; the float64 walk it diagnoses against is
``_v3_result``.
"""

import math
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import flash, mask
from attention_lib.checks import online_softmax
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output
from attention_lib.checks.limits import NoLocalMemory
from attention_lib.checks.ex08_kernel3 import (COMPILED_D, attention_v3, kernel3, quiet_launch,
                                               rebound, refuse_library_names)


class UpdateCase(NamedTuple):
    """One launch of flash v3 with the answer as its online update: BH heads of T_q queries
    against T_k keys of width d_k; a sliding window (0: none); large: scores in the hundreds. Or
    (probe) one warp calling the answer on chosen states at d_k 64, the launch compiled for a GPU."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    causal: bool
    window: int = 0
    large: bool = False
    probe: bool = False

    def __str__(self):
        if self.probe:
            return ("(one warp's update at d_k 64: rows with no key yet, a first key, a max that rises, a max "
                    "that stays)")
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''}"
                f"{', large scores' if self.large else ''})")


def _large_base2(rng, bh, t_q, t_k, d_k):
    """q and k ((bh, T, d_k) float32) whose base-2 scores in kernel 3 are exact and reach about
    +-185, past exp2's float32 range (128): each query is 2^10 in one component (times the scale,
    a power of 2 times a float32, exact), each key entry -1, 0 or 1, so a score is one exact
    product. A kernel that never subtracts the max overflows; one that does stays within 1e-5 of
    the reference (the weights of a row are 1 at its largest score, 2^-185, which is 0, elsewhere)."""
    q = np.zeros((bh, t_q, d_k), np.float32)
    for i in range(t_q):
        q[:, i, i % d_k] = 1024.0 * rng.choice([-1.0, 1.0], size=bh)
    return q, rng.integers(-1, 2, size=(bh, t_k, d_k)).astype(np.float32)


def _update_probe(answer, d_k):
    return rebuilt(_update_probe_source, {**flash.v3_sizes(d_k), "update": rebound(answer, d_k)}, base=vars(flash),
                   name="online_update_probe")


def _update_states(rng, z):
    """(32, S_SIZE + 3 MICRO_M + O_SIZE) float32: s, m, l, tile_max, o of 32 threads, each row a of a
    thread in one of four states by turn: no key yet and a tile with none; no key yet and a tile
    with some; a running max the tile raises; one it does not."""
    m_, n_, d_ = z["MICRO_M"], z["MICRO_N"], z["MICRO_D"]
    s = 3 * rng.standard_normal((32, m_, n_))
    s[rng.random(s.shape) < 0.2] = -np.inf
    s[..., 0] = 3 * rng.standard_normal((32, m_))                  # a key seen in every row ...
    top = s.max(axis=2) + rng.uniform(0, 1, (32, m_))              # the row's max over all 8 lanes
    m = np.where(np.arange(m_) % 2 == 0, top - rng.uniform(0.5, 3, (32, m_)), top + rng.uniform(0, 2, (32, m_)))
    l, o = rng.uniform(1, 4, (32, m_)), rng.standard_normal((32, m_, d_))
    state = (np.arange(32)[:, None] * m_ + np.arange(m_)) % 4       # 0, 1: no key yet; 2: max rises; 3: stays
    s[state == 0], top[state == 0] = -np.inf, -np.inf              # ... but in the rows with none
    m[state <= 1], l[state <= 1], o[state <= 1] = -np.inf, 0.0, 0.0
    m[state == 2] = top[state == 2] - rng.uniform(0.5, 3, (state == 2).sum())
    return np.concatenate([s.reshape(32, -1), m, l, top, o.reshape(32, -1)], axis=1).astype(np.float32)


def _update_expected(state, z):
    """The state after the update, in float64 (tile_max as it was)."""
    m_, n_, size = z["MICRO_M"], z["MICRO_N"], z["S_SIZE"]
    s = state[:, :size].reshape(32, m_, n_).astype(np.float64)
    m, l, top = (state[:, size + i * m_:size + (i + 1) * m_].astype(np.float64) for i in range(3))
    o = state[:, size + 3 * m_:].reshape(32, m_, -1).astype(np.float64)
    m_new = np.maximum(m, top)
    shift = np.where(np.isneginf(m_new), 0.0, m_new)
    rescale, p = np.exp2(m - shift), np.exp2(s - shift[..., None])
    l, o = l * rescale + p.sum(axis=2), o * rescale[..., None]
    return np.concatenate([p.reshape(32, -1), m_new, l, top, o.reshape(32, -1)], axis=1)


def _run_update_probe(update, launch):
    z = flash.v3_sizes(COMPILED_D)
    state = _update_states(np.random.default_rng(8), z)
    out = host_output(state.shape)
    launch(_update_probe(update, COMPILED_D), 1, 32, state, out)
    top = slice(z["S_SIZE"] + 2 * z["MICRO_M"], z["S_SIZE"] + 3 * z["MICRO_M"])
    out[:, top] = state[:, top]                                    # tile_max: the update may leave it as it likes
    return out, _update_expected(state, z), None, None, None, None, None, update


def _run_update_kernel(update, case, rng, launch):
    refuse_library_names(update, ("v3_online_update",))
    if case.probe:
        return _run_update_probe(update, launch)
    q, k, v = (rng.standard_normal((case.BH, t, case.d_k)).astype(np.float32)
               for t in (case.T_q, case.T_k, case.T_k))
    if case.large:
        q, k = _large_base2(rng, case.BH, case.T_q, case.T_k, case.d_k)
    kernel = kernel3(update, "v3_online_update", case.d_k)
    window = case.window or None
    got = attention_v3(kernel, quiet_launch, q, k, v, case.causal, window)
    return got, reference.attention(q, k, v, case.causal, window), q, k, v, case.causal, window, update


def _v3_result(q, k, v, causal, window, *, base=2.0, columns=None, **mistakes):
    """Kernel 3's output in float64, tile by tile as its blocks walk their bands (TILE_M queries,
    key tiles of TILE_N), scores in base 2, with online_softmax.fold's `mistakes`; base: the
    exponential's (math.e: the natural one, a mistake); columns: the output columns a thread
    rescales (None: all; [0]: only the first of its MICRO_D, columns < 8)."""
    sizes = flash.v3_sizes(q.shape[2])
    t_q, t_k = q.shape[1], k.shape[1]
    s = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[2])      # natural units
    visible = reference.causal_mask(t_q, t_k, window) if causal else np.ones((t_q, t_k), bool)
    s = np.where(visible, s * math.log2(math.e), -np.inf)                             # base 2, masked
    rescaled = None
    if columns is not None:
        rescaled = np.zeros(v.shape[2], bool)
        rescaled[:flash.COL_GROUPS] = True
    out = np.zeros((q.shape[0], t_q, v.shape[2]))
    tile_n = sizes["TILE_N"]
    for q0, rows, first, tiles in mask.band_key_tiles(t_q, t_k, causal, window, sizes["TILE_M"], tile_n):
        walk = [slice(k0, min(k0 + tile_n, t_k)) for k0 in range(first * tile_n, (first + tiles) * tile_n, tile_n)]
        for h, i in ((h, i) for h in range(q.shape[0]) for i in range(q0, q0 + rows)):
            m, l, o = online_softmax.fold(s[h, i], v[h], walk, base=base, rescaled=rescaled, **mistakes)
            out[h, i] = online_softmax.normalised(l, o)
    return out


def _update_probe_source(state_in, state_out):
    """One warp: thread t loads its (s, m, l, o, tile_max) from state_in[t], calls `update` (the
    answer), writes the state back. Compiled by _update_probe with flash's names."""
    t = cuda.threadIdx.x
    s = cuda.local.array(S_SIZE, np.float32)        # noqa: F821  (flash's sizes, bound by _update_probe)
    m = cuda.local.array(MICRO_M, np.float32)       # noqa: F821
    l = cuda.local.array(MICRO_M, np.float32)       # noqa: F821
    o = cuda.local.array(O_SIZE, np.float32)        # noqa: F821
    top = cuda.local.array(MICRO_M, np.float32)     # noqa: F821
    for x in range(S_SIZE):                         # noqa: F821
        s[x] = state_in[t, x]
    for a in range(MICRO_M):                        # noqa: F821
        m[a], l[a], top[a] = state_in[t, S_SIZE + a], state_in[t, S_SIZE + MICRO_M + a], state_in[t, S_SIZE + 2 * MICRO_M + a]   # noqa: F821,E501
    for x in range(O_SIZE):                         # noqa: F821
        o[x] = state_in[t, S_SIZE + 3 * MICRO_M + x]    # noqa: F821
    update(s, m, l, o, top)                         # noqa: F821
    for x in range(S_SIZE):                         # noqa: F821
        state_out[t, x] = s[x]
    for a in range(MICRO_M):                        # noqa: F821
        state_out[t, S_SIZE + a], state_out[t, S_SIZE + MICRO_M + a] = m[a], l[a]   # noqa: F821
    for x in range(O_SIZE):                         # noqa: F821
        state_out[t, S_SIZE + 3 * MICRO_M + x] = o[x]   # noqa: F821


def _no_key_yet(update, d_k):
    """What the answer leaves for rows that have seen no key and get a tile with none (m, tile_max
    and every s -inf, l and o 0): (s, l, o) of one thread's first row, float32."""
    sizes = flash.v3_sizes(d_k)
    probe = _update_probe(update, d_k)
    width = sizes["S_SIZE"] + 3 * sizes["MICRO_M"] + sizes["O_SIZE"]
    state = np.zeros((32, width), np.float32)
    state[:, :sizes["S_SIZE"] + sizes["MICRO_M"]] = -np.inf                       # s and m
    state[:, sizes["S_SIZE"] + 2 * sizes["MICRO_M"]:sizes["S_SIZE"] + 3 * sizes["MICRO_M"]] = -np.inf   # tile_max
    after = np.zeros_like(state)
    quiet_launch(probe, 1, 32, state, after)
    o0 = sizes["S_SIZE"] + 3 * sizes["MICRO_M"]
    return after[0, :sizes["MICRO_N"]], after[0, sizes["S_SIZE"] + sizes["MICRO_M"]], after[0, o0:o0 + sizes["MICRO_D"]]


def _diagnose_update(got, expected, q, k, v, causal, window, update):
    if q is None:                                   # the probe, after every launch of kernel 3 was right
        return None
    d_k = q.shape[2]
    if np.isnan(got).any() and not np.isnan(expected).any():
        s, l, o = _no_key_yet(update, d_k)
        if np.isnan(l) or np.isnan(o).any():
            return "nan_before_first_key", (
                "rows that had seen no key yet came out NaN: for such a row (m and the tile's max both -inf) "
                f"your update left l = {l:g}{' and o NaN' if np.isnan(o).any() else ''}; 2^(m - m_new) is "
                "2^(-inf - (-inf)), NaN: shift by 0 until a row has seen a key, so l and o stay 0")
        if np.isneginf(s).any():
            return "weights_left_as_scores", (
                "rows that had seen no key yet came out NaN: for such a row (m and the tile's max both -inf, "
                "every score -inf) your update left l and o at 0 but the scores s at -inf, and s is what the "
                "kernel stores as the tile's weights P: P V then multiplies -inf by values. Every score "
                "becomes its weight 2^(s - m_new), 0 for a masked key")
    candidates = online_softmax.rescale_mistakes("o", "row", "2^") + [
        ("natural_exp", dict(base=math.e),
         "the weights are too sharp by a factor log2(e): the scores arrive in base 2 (Q carries "
         "log2(e)), so their exponential is exp2, not exp"),
    ]
    if d_k > flash.COL_GROUPS:
        candidates.append(("missed_output_columns", dict(columns=[0]),
                           f"at d_k {d_k} a thread holds {flash.v3_sizes(d_k)['MICRO_D']} output columns of "
                           "each row, and only its first was rescaled: every one of o's MICRO_D entries of the "
                           "row takes the factor"))
    for code, switches, message in candidates:
        wrong = _v3_result(q, k, v, causal, window, **switches)
        seen = np.isfinite(wrong)
        if seen.any() and np.allclose(got[seen], wrong[seen], rtol=1e-4, atol=1e-4):
            return code, message
    if not np.isfinite(got).all():
        return "wrong_values", ("the output has inf or NaN where the reference has none: "
                                f"{int((~np.isfinite(got)).sum())} of {got.size} entries")
    return None


register(Exercise(
    exercise_id="08_online_update",
    kind="device function",
    run=_run_update_kernel,
    # One key; fewer queries than keys over three key tiles (the causal offset, rows whose max
    # grows); more queries than keys (rows that never see a key); a window of 5 at d_k 16 (2
    # output columns a thread; rows 37-47 see no key of the first tile); two heads, not causal;
    # rows 48-49 (a thread's last row, a = 3) with scores in the hundreds at d_k 64 (8 output
    # columns a thread); rows 16-19 (a = 1 of 2 rows) at d_k 72; last, one warp's update on chosen
    # states (the launch compiled for a GPU: kernel 3 is launched without compiling it).
    cases=[UpdateCase(1, 1, 1, 5, True), UpdateCase(1, 19, 70, 8, True), UpdateCase(1, 40, 20, 5, True),
           UpdateCase(1, 48, 48, 16, True, 5), UpdateCase(2, 40, 40, 5, False),
           UpdateCase(1, 50, 50, 64, True, 0, True), UpdateCase(1, 20, 20, 72, True),
           UpdateCase(1, 0, 0, COMPILED_D, True, probe=True)],
    hint=("every thread of a row sees the same row-wide tile max, so all of them can bring their "
          "partial sums to the new max by the same factor before the tile's own terms join them"),
    more_hints=("the plan, per row a of the thread: the new max is the larger of the running max and the tile's; "
                "the shift is that new max, or 0 while it is still minus infinity (no key seen yet); the factor "
                "is 2 to the power old max minus shift, and it multiplies l and every one of the row's MICRO_D "
                "output entries; then each of the row's MICRO_N scores becomes its weight, 2 to the power score "
                "minus shift, stored back in s and added to l; last, the new max is stored. Where answers go "
                "wrong: exp for exp2 (the scores are in base 2), a row without keys turned into not-a-number, "
                "only the first output column rescaled",),
    # float32 scores, exp2 and sums of up to 70 terms against float64: errors near 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_update,
    diagnoses=("online_softmax_no_rescale", "rescale_l_only", "rescale_o_only", "max_not_updated",
               "natural_exp", "nan_before_first_key", "weights_left_as_scores", "missed_output_columns"),
    solution=flash.v3_online_update,
    forbidden=(flash.flash_attention_kernel_v3, flash.v3_key_tile),
    limits=(NoLocalMemory(),),
))
