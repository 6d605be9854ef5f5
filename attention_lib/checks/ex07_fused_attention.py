"""Notebook 07's exercises: the online softmax in NumPy (warm-up), then kernel 2's walk over its key tiles.

``07_online_softmax`` (warm-up)

The answer is a function ``update(m, l, acc, s_block, v_block) -> (m, l, acc)`` with the
contract of ``attention_lib.stages.flash.online_update`` for one row: m the running maximum (a float,
-inf before the first block), l the running sum of exp(s - m), acc (d_v,) the running sum of
exp(s - m) * v; s_block (n,) the next block's scores (-inf for masked keys, a whole block of them
included), v_block (n, d_v) their values. The check feeds a row's blocks one after the other,
starting from (-inf, 0, zeros), and compares the final triple with (max s, sum exp(s - max),
sum exp(s - max) v), computed directly ((-inf, 0, zeros) for a row that sees no key). Its rows: one
key; a rising row; the future masked (the last blocks all -inf); the past masked (the first
blocks all -inf, as a sliding window or left padding makes them); every key masked; scores around
1000. Its solution is ``flash.online_update``. Besides the engine's diagnoses:

- ``online_softmax_no_rescale``: right while the first block holds the maximum, wrong once a
  later block raises it: l (and/or acc) was not multiplied by exp(m_old - m_new);
- ``nan_before_first_key``: NaN from a first block all masked, and the fold of an update without
  the guard for a maximum still -inf (exp(-inf - (-inf))) gives the same NaN.

Other wrong values are reported as ``wrong_values`` naming the part (m, l or acc[i]) that
differs, or saying that l or acc came out inf or NaN.

``07_walk_keys`` (main)

The answer is a ``@cuda.jit(device=True)`` function with the contract of ``flash.walk_key_tiles``
(its solution): kernel 2's walk over its block's band of key tiles, by every thread of the block,
with everything but the fold the student's: the band's bounds, the thread's keys, the staging of
each K and V tile in shared memory, both barriers, the guard, and where (m, l) start: the walk
starts them itself (kernel 2 passes it none) and returns them. The one helper given is ``v2_fold_tile`` (notebook 02's score and the warm-up's update, in
float32); ``block_band``, ``first_key``, ``visible_keys``, ``v2_stage_rows`` and ``v2_walk_keys``
are refused. The check builds flash_attention_kernel_v2 with the answer in its walk's place
(``flash.kernel_v2_with``), launches it through the engine's race finder (so the kernel is
compiled for a GPU, float64 named), at the simulator's BLOCK_Q (16) and a GPU's (32), on cases
made from the tile constants: first T_k = T_q + 1 (a thread's own keys span more tiles than
another's) and T = 2 BLOCK_Q (the first block's band ends a tile before the last key); the causal
offsets around BLOCK_Q (``cases.offsets``); one query; window edges around BLOCK_K
(``cases.window_edges``: a query's first tiles in its block's band wholly masked); no mask with two
heads and d_v != d_k; two query heads to a key/value head (flash_grid's block (BLOCK_Q, 2): the
walk's staging spans both rows of threads, each row folds its own head); heads of width 64 and 128; scores in the hundreds, spread past 88 inside one
tile; every score below -104. Limits: each element of k and v is read from global memory only by
the blocks whose band holds its key, once each, and no key past the last one the block's queries
see is read, even inside the band's last tile (``skips_too_few``, ``loads_past_band``,
``no_reuse``; ``OnlyTheBand``); no thread without a query (from the block's n_rows on) reads the
staged tiles, which only this count sees, its row being never written (``folds_without_query``;
``OnlyQueriesFold``); no thread passes more barriers than the queries' staging's (2 G - 1) and two
for each tile of the widest band (``extra_barriers``); every warp load of k and v coalesced
(``uncoalesced``) and made by all lanes side by side (``serial_copy``); every tile slot read was
written in its step (``stale_tile``). Besides the engine's diagnoses:

- ``max_started_at_zero``: rows whose every score lies below -104 came out 0: a running max
  started at 0 (exp(s - 0) is 0 in float32 there);
- ``online_softmax_no_rescale``, ``rescale_l_only``, ``rescale_o_only``: with a fold of the
  student's own, the sums so far were not (or only one of them was) rescaled when a tile raised
  the max;
- ``max_not_updated``: the new max was never kept, so every tile restarted the row;
- ``nan_before_first_key``: the NaN of the output are those of a walk that folds a tile the query
  sees no key of while its max is still -inf (exp(-inf - (-inf)) is NaN);
- ``mask_not_applied``: every key of the loaded tiles was folded in, past the query's own;
- ``diagonal_misplaced``: each query stopped one key short of its own (its own key left out, or, at
  T_k - T_q = 1, the offset ignored), or, at another offset, ended at key i (the offset T_k - T_q ignored);
- ``mask_off_by_one``: the key just after the query's own folded in too, or the first key it sees
  (0, or the window's first) left out;
- ``mask_ignores_window``: with a window, the keys before it (in the loaded tiles) were folded in;
- ``window_off_by_one``: with a window, the key just before it folded in too;
- ``unstable_softmax``: exp of a score without the max subtracted overflowed;
- ``staging_repeats_per_head``: a race in the staging where the block's rows of threads (threadIdx.y,
  one per query head, at G > 1) copied the same elements of a tile;
- ``stride_written_as_number``: a race in the staging whose first copier strides by the simulator's
  BLOCK_Q (16) in a block of more threads (a GPU's BLOCK_Q, or G > 1): a number, or BLOCK_K, where the
  block's size is meant.
A walk whose threads loop over their own keys' tiles stops at different barriers
(``divergent_barrier``, the simulator's own check, at the first case).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks import cases as sizes
from attention_lib.checks import session, shapes
from attention_lib.checks import online_softmax
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output, race_finding_launch, RaceFound
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriers, NoSerialCopy, RefilledTiles
from attention_lib.measure import sanitizer
from attention_lib.platform import where
from attention_lib.stages import flash, mask


# --- 07_online_softmax (warm-up): one row's update in NumPy ----------------------------------

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


# --- 07_walk_keys (main): kernel 2's walk over its band of key tiles ------------------------

class WalkCase(NamedTuple):
    """One launch of kernel 2 with the answer as its walk: BH heads of T_q queries against T_k keys,
    widths d_k and d_v; causal or not; a sliding window (0: none); scores: "normal", "large" (in
    the hundreds, spread past 88 inside a tile) or "low" (every score below -90)."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    d_v: int
    causal: bool = True
    window: int = 0
    scores: str = "normal"
    group: int = 1      # query heads to a key/value head: kernel 2's block is (BLOCK_Q, G), G of them

    def __str__(self):
        said = {"normal": "", "large": ", scores in the hundreds", "low": ", every score below -90"}[self.scores]
        heads = f", {self.group} query heads a key/value head" if self.group > 1 else ""
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, d_v {self.d_v}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''}"
                f"{heads}{said})")


def large_scores(rng, bh, t_q, t_k, d_k):
    """q and k ((bh, T, d_k) float32, d_k a power of 4) whose scores q . k / sqrt(d_k) are exact in
    float32 and reach the hundreds: q's entries +-40, k's small integers, 1 / sqrt(d_k) a power of
    2. exp of such a score overflows float32 (past about 88); exp of it minus the max does not, and
    a correct kernel stays within 1e-5 of the reference, as no score is rounded."""
    q = 40.0 * rng.choice([-1.0, 1.0], size=(bh, t_q, d_k))
    k = rng.integers(-3, 4, size=(bh, t_k, d_k)).astype(np.float64)
    return q.astype(np.float32), k.astype(np.float32)


def low_scores(rng, bh, t_q, t_k, d_k):
    """q and k ((bh, T, d_k) float32, d_k a power of 4) whose scores are exact in float32 and all lie
    far below -90: column 0 adds -150 to every score (q's 40 against k's -15 sqrt(d_k) / 4), the others
    +-1 against small integers at most 3 (d_k - 1) / sqrt(d_k) more or less (d_k 16: -161.25 to
    -138.75). exp of such a score is 0 in float32 (below about -104); exp of it minus the max is not."""
    q = rng.choice([-1.0, 1.0], size=(bh, t_q, d_k))
    k = rng.integers(-3, 4, size=(bh, t_k, d_k)).astype(np.float64)
    q[..., 0], k[..., 0] = 40.0, -15.0 * math.sqrt(d_k) / 4
    return q.astype(np.float32), k.astype(np.float32)


def _block_q(configuration):
    return flash.SHAPE_CONSTANTS["BLOCK_Q"][0 if configuration == shapes.SIMULATOR else 1]


def _walk_cases(configuration):
    """The causal offsets around the configuration's BLOCK_Q (blocks and tiles partly used, T_k - T_q
    at 0, +-1 and a tile +-1, rows that see no key); one query; windows whose edge falls on a key
    tile's first and last key (a query's first tiles of its block's band wholly masked); no mask, two
    heads with d_v != d_k; two query heads to a key/value head (a block of BLOCK_Q x 2 threads); the model's head width 64, and 128 (MAX_D) at a small T; scores spread
    past 88 inside a tile; every score below -90."""
    block_q, block_k = _block_q(configuration), flash.BLOCK_K
    widths = [(5, 5), (7, 5), (3, 6), (4, 4)]
    pairs = sizes.offsets(block_q)
    # First a case where a thread's own keys span more tiles than another's (a walk over them stops at
    # different barriers), then one where the first block's band ends a tile before the last key.
    pairs = [pairs[1], (2 * block_q, 2 * block_q)] + pairs[:1] + pairs[2:]
    cases = [WalkCase(1, t_q, t_k, *widths[n % len(widths)]) for n, (t_q, t_k) in enumerate(pairs)]
    cases += [WalkCase(1, 1, 1, 5, 5)]          # after the others: one key is every key's first and last
    cases += [WalkCase(1, t, t, 3, 3, True, w) for t, w in sizes.window_edges(block_k)]
    cases += [WalkCase(1, 12, 40, 16, 16, True, 5), WalkCase(2, block_q + 3, block_q + 3, 9, 6, False),
              WalkCase(4, block_q + 5, block_q + 6, 5, 4, group=2),
              WalkCase(1, 19, 19, 64, 64), WalkCase(1, 5, 19, 128, 128),     # one tile and 3 keys (simulator), one partial tile (GPU)
              WalkCase(1, 17, 17, 16, 16, scores="large"), WalkCase(1, block_q + 1, block_q + 1, 16, 16, scores="low")]
    return cases


def kernel_around(walk):
    """flash_attention_kernel_v2 with `walk` in its walk's place (flash.kernel_v2_with), for the BLOCK_Q
    in force (the simulator's or, in a check's other configuration, a GPU's): the staging of the
    queries and the division by l are the library's."""
    return flash.kernel_v2_with(walk)


def _case_data(case, rng):
    """q (BH heads), k, v (BH / group heads) of a case, float32."""
    bh_kv = case.BH // case.group
    q, k = (rng.standard_normal((bh, t, case.d_k)).astype(np.float32) for bh, t in ((case.BH, case.T_q), (bh_kv, case.T_k)))
    v = rng.standard_normal((bh_kv, case.T_k, case.d_v)).astype(np.float32)
    if case.scores != "normal":
        q, k = (large_scores if case.scores == "large" else low_scores)(rng, case.BH, case.T_q, case.T_k, case.d_k)
    return q, k, v


def _run_walk(walk, case, rng, _launch):
    q, k, v = _case_data(case, rng)
    out, lse = host_output((case.BH, case.T_q, case.d_v)), np.zeros((case.BH, case.T_q), np.float32)
    grid, block = flash.flash_grid(case.BH, case.T_q, 2, group=case.group)
    try:                                              # every case under the race finder: the tiles are shared
        race_finding_launch(kernel_around(walk), grid, block, q, k, v, flash.flash_scale(2, case.d_k),
                            case.causal, np.int32(case.window), np.int32(case.group), out, lse)
    except RaceFound as error:
        named = _staging_race(error.race, case)
        if named is None:
            raise
        raise Diagnosed(*named) from None
    except OverflowError as error:                    # the simulator's math.exp; a GPU gives inf
        raise Diagnosed("unstable_softmax", f"exp overflowed ({error}) on scores of up to "
                        f"{np.abs(q[0] @ k[0].T).max() / math.sqrt(case.d_k):.0f}, too large for "
                        "float32's exp (past about 88); exp of a score minus the running max is at most 1") from None
    window = case.window or None
    k, v = (np.repeat(a, case.group, axis=0) for a in (k, v))     # query head h reads key/value head h // group
    return (out, reference.attention(q, k, v, case.causal, window), q, k, v, case.causal, window)


def _staging_race(race, case):
    """(code, message) for two threads writing one slot of a staged tile in the same step, where the
    block's first copy says why: its rows of threads (threadIdx.y) copying the same elements, or a
    stride of the simulator's BLOCK_Q in a block of more threads (a stride written as a number); else None."""
    judging = session.current()
    if race.space != sanitizer.SHARED or race.array not in ("k_tile", "v_tile") or judging is None \
            or not judging.traces or (race.kind_a, race.kind_b) != (sanitizer.STORE, sanitizer.STORE):
        return None
    target = judging.traces[-1].launch.targets.get(race.array)
    d, written = case.d_k if race.array == "k_tile" else case.d_v, {}    # thread -> {step: staged elements}
    for element, kind, (block, thread), interval, *_ in (target.trace if target is not None else ()):
        if kind == sanitizer.STORE and tuple(block) == tuple(race.block_a):
            row, column = divmod(int(element), target.shape[1])
            written.setdefault(tuple(thread) + (0,) * (3 - len(thread)), {}).setdefault(interval, set()).add(row * d + column)
    first = {thread: sorted(steps[min(steps)]) for thread, steps in written.items()}
    threads = flash.BLOCK_Q * flash.v2_heads_per_block(case.group)        # the block's, (BLOCK_Q, G)
    heads = {thread[1] for thread in first}
    if len(heads) > 1 and all(first[t] == first.get((t[0], 0, t[2])) for t in first):
        return "staging_repeats_per_head", (
            f"threads (x, 0) and (x, 1) wrote the same elements of {race.array} in one step: the block's rows of "
            "threads (threadIdx.y, one per query head) share the key/value head's tiles, so each element is "
            "copied once by the whole block, not once by each row")
    starter = next((elements for elements in first.values() if elements[:1] == [0] and len(elements) > 1), None)
    sim_block_q = flash.SHAPE_CONSTANTS["BLOCK_Q"][0]
    if starter is not None and starter[1] - starter[0] == sim_block_q and threads != sim_block_q:
        return "stride_written_as_number", (
            f"the staging's stride was {sim_block_q} (the thread that copied element 0 of {race.array} copied element "
            f"{sim_block_q} next) in a block of {threads} threads, so two threads wrote {race.array}{list(race.index)}. "
            "A stride written as a number "
            f"(or as BLOCK_K) fits one block size, the simulator's {sim_block_q} threads with one query head; the "
            "block's own size, from blockDim, fits every launch")
    return None


@dataclass
class OnlyTheBand:
    """Each element of k and v read from global memory only by the blocks of queries whose band
    holds its key, once by each, key by key: no tile outside the band loaded (``skips_too_few``), no
    key after the last one its last query sees (mask.visible_count), even inside the band's last tile
    (``loads_past_band``), no key loaded twice by one block (``no_reuse``)."""

    code: str = "skips_too_few"

    def broken(self, traces, case, compiled):
        bands = mask.band_key_tiles(case.T_q, case.T_k, case.causal, case.window or None, flash.BLOCK_Q,
                                    flash.BLOCK_K)
        for traced in traces:
            for name in ("k", "v"):
                target = traced.launch.targets.get(name)
                counts = {}
                for element, kind, (block, _), *_ in (target.trace if target is not None else ()):
                    if kind == sanitizer.LOAD:
                        counts[block[0], element] = counts.get((block[0], element), 0) + 1
                found = {}                                   # code -> (block, key, reads) of its first case
                for (bx, element), reads in sorted(counts.items()):
                    q0, rows, first, tiles = bands[bx]
                    key = int(np.unravel_index(element, target.shape)[1])
                    if not first <= key // flash.BLOCK_K < first + tiles:
                        found.setdefault("skips_too_few", (bx, key, reads))
                    elif key >= mask.visible_count(q0 + rows - 1, case.T_q, case.T_k, case.causal):
                        found.setdefault("loads_past_band", (bx, key, reads))
                    elif reads > 1:
                        found.setdefault("no_reuse", (bx, key, reads))
                for code in ("skips_too_few", "loads_past_band", "no_reuse"):   # the widest mistake first
                    if code in found:
                        self.code = code
                        return self._message(code, name, bands, case, *found[code])
        return None

    @staticmethod
    def _message(code, name, bands, case, bx, key, reads):
        q0, rows, first, tiles = bands[bx]
        queries = f"the block of queries {q0}-{q0 + rows - 1}"
        if code == "skips_too_few":
            return (f"the values are right, but {queries} read {name} at key {key}, in a tile none of its queries "
                    f"sees a key of: its band is key tiles {first} to {first + tiles - 1} of {flash.BLOCK_K}")
        if code == "loads_past_band":
            end = mask.visible_count(q0 + rows - 1, case.T_q, case.T_k, case.causal)
            return (f"the values are right, but {queries} read {name} at key {key}, past the last key its queries "
                    f"see ({end - 1}): the band's last tile holds only the keys up to it")
        return (f"the values are right, but {queries} read an element of {name} (key {key}) {reads} times from "
                "global memory: each tile of its band is staged once in shared memory, where every thread of the "
                "block reads it")
        return None


@dataclass
class OnlyQueriesFold:
    """No thread without a query (threadIdx.x from the block's n_rows on, in the last block of
    queries) reads the staged k_tile or v_tile: such a thread helps stage the tiles and passes the
    barriers, but folds nothing (``folds_without_query``). Its fold would change no output, since its
    row is never written, so only this count sees it."""

    code: str = "folds_without_query"

    def broken(self, traces, case, compiled):
        for traced in traces:
            for name in ("k_tile", "v_tile"):
                target = traced.launch.targets.get(name)
                for _, kind, (block, thread), _, site, _ in (target.trace if target is not None else ()):
                    rows = min(flash.BLOCK_Q, case.T_q - block[0] * flash.BLOCK_Q)
                    if kind == sanitizer.LOAD and thread[0] >= rows:
                        q0 = block[0] * flash.BLOCK_Q
                        return (f"the values are right, but thread {thread[0]} of the block of queries {q0}-"
                                f"{q0 + rows - 1} read {name} at {where.describe_with_code(*site)}: that block "
                                f"has {rows} queries, so threads {rows} to {flash.BLOCK_Q - 1} own none. They "
                                "help stage the tiles and reach every barrier, but they have no keys to fold")
        return None


def _widest_band(case):
    """The key tiles of the widest band of 07_walk_keys's case (mask.band_key_tiles)."""
    bands = mask.band_key_tiles(case.T_q, case.T_k, case.causal, case.window or None, flash.BLOCK_Q, flash.BLOCK_K)
    return max((band[3] for band in bands), default=0)


def _query_barriers(case):
    """The barriers of v2_stage_queries: two for each of the block's G query heads but the last's one."""
    return 2 * flash.v2_heads_per_block(case.group) - 1


def _band_why(case):
    return (f"the widest band of {_widest_band(case)} key tiles needs two a tile, after the {_query_barriers(case)} "
            "of the queries' staging: the walk stepped through a tile that holds no key of its band")


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


def _diagnose_walk(got, expected, q, k, v, causal, window):
    t_q, t_k = q.shape[1], k.shape[1]
    bands = mask.band_key_tiles(t_q, t_k, causal, window, flash.BLOCK_Q, flash.BLOCK_K)
    ends = [mask.visible_count(q0 + rows - 1, t_q, t_k, causal) for q0, rows, _, _ in bands]
    visible, masks = _mask_candidates(t_q, t_k, causal, window)
    if _started_at_zero(got, expected, q, k, visible):
        return "max_started_at_zero", ("rows whose every score lies below -104 came out 0: exp(s - m) with m 0 is 0 "
                                       "in float32 there, so l stayed 0. A running max started at 0, not at minus "
                                       "infinity, never takes the row's own maximum")
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


register(Exercise(
    exercise_id="07_walk_keys",
    kind="device function",
    run=_run_walk,
    cases=_walk_cases,
    both_shapes=True,
    hint=("every thread of the block must reach every barrier, so the whole block walks the same key tiles: "
          "those that hold a key one of its queries sees. Each tile is copied once by all threads together; each "
          "thread then folds the keys of it that its own query sees"),
    more_hints=("the plan: query i of t_q stands at position i plus t_k minus t_q, the queries being the last "
                "positions; causal, it sees the keys up to that position, its own included, and with a window w only "
                "the last w of them, from that position minus w plus 1 (never below key 0, never past key t_k minus "
                "1). The band runs from the tile holding the first key the block's first query sees (that key rounded "
                "down to a multiple of BLOCK_K) to one past the last key its last query sees. A thread from n_rows on "
                "has no query and no keys. Then, tile after tile of the band: its K and V rows (the last tile may be "
                "partial, and no key past the band's last is read), copied by all threads of the block, every row of "
                "them numbered in one sequence, neighbouring threads on neighbouring elements; a barrier; the thread's keys in this tile, counted from the tile's start, "
                "folded with v2_fold_tile only when there is at least one; a second barrier, before the next copy "
                "overwrites the tiles. Before the first tile nothing is seen: the running max starts below every "
                "score, at minus infinity, and the sum at 0",
                "where answers go wrong: a loop over the thread's own keys instead of the block's band (threads "
                "stop at different barriers); every tile walked, not only the band's; a whole last tile staged past "
                "the band's last key; a barrier inside the branch only some threads take; a thread without a query "
                "folding keys anyway; a tile folded while the query has seen no key, its max still minus infinity; "
                "the max started at 0, which scores far below 0 never pass; a fold of your own that does not "
                "rescale the sum and the output when the max grows"),
    # float32 scores, exp and sums of up to 65 terms against float64: errors around 1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_walk,
    diagnoses=("online_softmax_no_rescale", "rescale_l_only", "rescale_o_only", "max_not_updated",
               "max_started_at_zero", "nan_before_first_key", "mask_not_applied", "diagonal_misplaced",
               "mask_off_by_one", "mask_ignores_window", "window_off_by_one", "unstable_softmax", "skips_too_few",
               "loads_past_band", "folds_without_query",
               "staging_repeats_per_head", "stride_written_as_number"),
    limits=(OnlyTheBand(), OnlyQueriesFold(), MostBarriers(lambda case: _query_barriers(case) + 2 * _widest_band(case), why=_band_why),
            Coalesced("k", 2), Coalesced("v", 2), NoSerialCopy("k"), NoSerialCopy("v"), RefilledTiles()),
    solution=flash.walk_key_tiles,
    # Given: v2_fold_tile (notebook 02's scores and the warm-up's update, in float32). The band, the
    # thread's keys and the staging are the student's.
    forbidden=(flash.v2_walk_keys, flash.v2_stage_rows, flash.v2_stage_queries, flash.block_band, flash.first_key,
               flash.visible_keys, flash.v1_walk_keys, flash.flash_attention_kernel_v2,
               flash.flash_attention_kernel_v1, flash.flash_attention, flash.launch_flash),
))
