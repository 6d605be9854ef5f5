"""``07_walk_keys`` (notebook 07, main): a ``@cuda.jit(device=True)`` function with the contract of
``flash.walk_key_tiles`` (its solution), kernel 2's walk over its block's band of key tiles by every
thread of the block, all of it but the fold (``v2_fold_tile``, given) the student's: the band's bounds,
the thread's keys, the staging of each K and V tile in shared memory, both barriers, the guard, and
where (m, l) start. The check launches kernel 2 built around the answer under the race finder, at the
simulator's BLOCK_Q and a GPU's; its cases, limits and named mistakes are declared in the Exercise
below (the mistakes in the values are told apart by ``ex07_walk_mistakes``).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks import cases as sizes
from attention_lib.checks import session, shapes
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.ex07_walk_mistakes import diagnose_walk
from attention_lib.checks.launch import host_output, race_finding_launch, RaceFound
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriers, NoSerialCopy, RefilledTiles
from attention_lib.measure import sanitizer
from attention_lib.platform import where
from attention_lib.stages import flash, mask


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
    # different barriers: the simulator's divergent_barrier), then one where the first block's band ends
    # a tile before the last key.
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

    code: str = "skips_too_few"     # the widest of the three codes broken() returns with its message

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
                        return code, self._message(code, name, bands, case, *found[code])
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
    diagnose=diagnose_walk,
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
