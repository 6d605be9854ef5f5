"""Notebooks 07 and 08: the online softmax with an output accumulator, the fused attention kernels
against the reference and the pipeline, tile skipping, memory traffic (formulas = counts), barriers
and warp shuffles, bad input. The exercises' tests are in test_exercises_07.py and _08.py."""

import inspect
import linecache
import math
import re
import textwrap
import types

import attention_lib
import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer, traffic
from attention_lib.platform.simulator import BarrierError
from attention_lib.stages import attention, flash, softmax


def qkv(rng, lead, t_q, t_k, d_k, d_v=None):
    d_v = d_k if d_v is None else d_v
    return (rng.standard_normal((*lead, t_q, d_k)).astype(np.float32),
            rng.standard_normal((*lead, t_k, d_k)).astype(np.float32),
            rng.standard_normal((*lead, t_k, d_v)).astype(np.float32))


def assert_close_float32(got, want):
    """Each output is a weighted mean of up to T_k value rows (entries of size ~1), with float32
    scores, exp and sums against a float64 reference: errors around 1e-7 * sqrt(T_k), under
    1e-6 at these sizes. 1e-5 leaves a tenfold margin; a real mistake (no scale, a mask off by
    one, a missing rescale) moves outputs by 1e-2 or more."""
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), np.abs(got - want).max()


# --- NumPy: the online softmax with the output accumulator ---------------------------------

@pytest.mark.parametrize("block", [1, 3, 16, 100])
@pytest.mark.parametrize("causal", [True, False])
def test_online_attention_equals_the_reference(rng, block, causal):
    q, k, v = qkv(rng, (2, 3), 33, 33, 5, 7)
    got = flash.online_attention(q, k, v, causal, block=block)
    # Both float64: only the order of the additions and the rescalings differ, each a relative
    # rounding of about 1e-16, over at most 33 blocks.
    assert np.allclose(got, reference.attention(q, k, v, causal), rtol=1e-12, atol=1e-14)


def test_online_attention_is_online_softmax_weights_times_v(rng):
    q, k, v = qkv(rng, (), 40, 40, 24)
    weights = softmax.online_softmax(reference.apply_causal_mask(reference.scores(q, k)), block=16)
    assert np.allclose(flash.online_attention(q, k, v, block=16), weights @ v, rtol=1e-12, atol=1e-14)


def test_online_attention_rows_that_see_no_key_are_zero(rng):
    q, k, v = qkv(rng, (), 7, 4, 5)              # 7 queries, 4 keys: queries 0-2 see nothing
    got = flash.online_attention(q, k, v, block=2)
    assert (got[:3] == 0).all() and not np.isnan(got).any()
    assert np.allclose(got, reference.attention(q, k, v), rtol=1e-12, atol=1e-14)


def test_online_update_rescales_when_the_max_grows():
    v = np.eye(2)
    m, l, acc = flash.online_update(-np.inf, 0.0, np.zeros(2), np.array([0.0]), v[:1])
    assert (m, l) == (0.0, 1.0) and np.array_equal(acc, [1.0, 0.0])
    m, l, acc = flash.online_update(m, l, acc, np.array([2.0]), v[1:])
    # The old term exp(0 - 0) = 1 becomes exp(0 - 2) against the new max 2.
    assert m == 2.0 and np.isclose(l, math.exp(-2) + 1) and np.allclose(acc, [math.exp(-2), 1.0])
    same = flash.online_update(m, l, acc, np.array([-np.inf, 1.0]), np.eye(2))   # max stays 2
    assert same[0] == 2.0 and np.isclose(same[1], l + math.exp(-1))


# --- The kernels against the reference and the pipeline ------------------------------------

# (leading axes, T_q, T_k, d_k, d_v): one position; T 7 (less than a tile); 33 and 40 (tiles
# plus a remainder); batch x heads; T_q < T_k (the last queries, as with a cache); T_q > T_k
# (the first queries see no key in causal mode); d_v != d_k.
SHAPES = [((), 1, 1, 5, 5), ((), 7, 7, 5, 5), ((), 33, 33, 24, 24), ((), 40, 40, 16, 16),
          ((2, 3), 7, 7, 16, 16), ((2,), 7, 20, 5, 5), ((), 20, 7, 5, 5), ((), 17, 17, 5, 9)]


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, (*s[0], *s[1:]))))
def test_flash_attention_matches_the_reference(rng, version, causal, shape):
    lead, t_q, t_k, d_k, d_v = shape
    q, k, v = qkv(rng, lead, t_q, t_k, d_k, d_v)
    if version == 3 and d_v != d_k:
        with pytest.raises(ValueError, match=r"^v must have d_v = d_k"):
            flash.flash_attention(q, k, v, causal, version=version)
        return
    got, lse = flash.flash_attention(q, k, v, causal, version=version, return_lse=True)
    assert_close_float32(got, reference.attention(q, k, v, causal))
    assert lse.dtype == np.float32 and lse.shape == got.shape[:-1]
    s = reference.scores(q, k)                                  # (..., T_q, T_k) float64
    s = reference.apply_causal_mask(s) if causal else s
    with np.errstate(divide="ignore"):                          # log(0) = -inf: a row with no key
        want = np.log(np.exp(s).sum(axis=-1))
    assert np.array_equal(np.isneginf(lse), np.isneginf(want))
    seen = np.isfinite(want)                                    # float32 sums of up to 40 terms
    assert np.allclose(lse[seen], want[seen], rtol=1e-5, atol=1e-5)
    if causal and t_q > t_k:
        assert (got[..., :t_q - t_k, :] == 0).all()     # no visible key: zeros, never NaN


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_equals_the_stage_by_stage_pipeline(rng, causal):
    q, k, v = qkv(rng, (2,), 20, 20, 16)      # the pipeline's tiled kernels are slow on the simulator
    # Two float32 computations of the same thing, each within the bound above of float64.
    assert np.allclose(flash.flash_attention(q, k, v, causal), attention.attention(q, k, v, causal),
                       rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_max_that_grows_in_every_tile_is_rescaled_correctly(rng, version):
    t, d = 40, 5
    q = np.ones((t, d), np.float32)
    # q . k_j / sqrt(d) = 0.5 j: the scores grow with j, so every new tile (in v1 every new
    # key) raises the running max and the terms already summed must be rescaled.
    k = np.repeat(np.arange(t)[:, None] * (0.5 / math.sqrt(d)), d, axis=1).astype(np.float32)
    v = rng.standard_normal((t, d)).astype(np.float32)
    got = flash.flash_attention(q, k, v, version=version)
    assert_close_float32(got, reference.attention(q, k, v))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_large_scores_do_not_overflow(rng, version):
    q, k, v = qkv(rng, (), 33, 33, 16)
    q *= 40.0                                   # scores of several hundred: exp would overflow
    got = flash.flash_attention(q, k, v, version=version)
    assert np.isfinite(got).all()
    assert_close_float32(got, reference.attention(q, k, v))


def test_the_kernel_argument_is_launched_on_the_versions_grid(rng):
    q, k, v = qkv(rng, (2,), 9, 9, 5)
    assert np.array_equal(flash.flash_attention(q, k, v, version=1, kernel=flash.flash_attention_kernel_v1),
                          flash.flash_attention(q, k, v, version=1))
    assert flash.flash_grid(6, 33, 1) == ((math.ceil(33 / flash.ROWS_PER_BLOCK), 6), flash.ROWS_PER_BLOCK)
    assert flash.flash_grid(6, 33, 2) == ((math.ceil(33 / flash.BLOCK_Q), 6), (flash.BLOCK_Q, 1))
    assert flash.flash_grid(6, 33, 2, group=3) == ((math.ceil(33 / flash.BLOCK_Q), 2), (flash.BLOCK_Q, 3))
    assert flash.flash_grid(6, 65, 3, group=3) == ((4, 2), 128)        # v3: 3 x 65 rows of a kv head
    assert flash.flash_grid(6, 65, 3) == ((2, 6), 128)                  # 64 queries a block at d_k 64
    assert flash.flash_grid(6, 65, 3, d_k=128) == ((3, 6), 128)         # 32 at d_k 128
    assert np.array_equal(flash.flash_attention(q, k, v, version=3, kernel=flash.make_flash_v3(5)),
                          flash.flash_attention(q, k, v, version=3))


# --- Tiles skipped and memory traffic ---------------------------------------------------------

def test_tile_counts(rng):
    assert flash.flash_tile_counts(32, block_q=16, block_k=16) == (3, 1)
    assert flash.flash_tile_counts(32, causal=False, block_q=16, block_k=16) == (4, 0)
    assert flash.flash_tile_counts(1024, block_q=32, block_k=16) == (32 * 33, 32 * 31)
    # Against a brute force over every (query block, key tile): skipped iff no query of the
    # block sees any key of the tile.
    for t_q, t_k in [(33, 33), (7, 40), (40, 7), (1, 1)]:
        visible = reference.causal_mask(t_q, t_k)
        skipped = sum(not visible[q0:q0 + flash.BLOCK_Q, k0:k0 + flash.BLOCK_K].any()
                      for q0 in range(0, t_q, flash.BLOCK_Q) for k0 in range(0, t_k, flash.BLOCK_K))
        assert flash.flash_tile_counts(t_q, t_k)[1] == skipped


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("t_q, t_k, causal", [(33, 33, True), (7, 20, True), (20, 7, True), (17, 17, False)])
def test_fused_traffic_formula_equals_the_count(rng, version, t_q, t_k, causal):
    d_v = 5 if version == 3 else 7                                # v3: d_v = d_k
    q, k, v = qkv(rng, (2,), t_q, t_k, 5, d_v)
    report, out = traffic.count_fused(q, k, v, causal, version)
    assert_close_float32(out, reference.attention(q, k, v, causal))
    want = flash.flash_traffic(t_q, t_k, 5, d_v, causal, version)
    got = {name: int(report.loads(name).sum()) for name in "qkv"}
    got.update({name: int(report.stores(name).sum()) for name in ("out", "lse")})
    assert got == {name: 2 * n for name, n in want.items()}        # two heads
    assert (report.loads("q") == 1).all() and (report.stores("out") == 1).all()
    assert (report.stores("lse") == 1).all()


def test_v2_reads_each_key_once_per_block_of_queries_that_sees_it(rng):
    t, b = 33, flash.BLOCK_Q                    # query blocks 0-15, 16-31, 32
    report, _ = traffic.count_fused(*qkv(rng, (1,), t, t, 5), causal=True)
    blocks_needing_key = np.array([sum(j <= min(q0 + b, t) - 1 for q0 in range(0, t, b)) for j in range(t)])
    assert np.array_equal(report.loads("k")[0], np.repeat(blocks_needing_key[:, None], 5, axis=1))
    assert report.loads("k")[0, t - 1].sum() == 5                  # the last key: one block, once


def test_no_array_of_the_fused_kernel_grows_with_t_squared(rng):
    shapes = {}
    for t in (20, 40):
        report, _ = traffic.count_fused(*qkv(rng, (1,), t, t, 5), causal=True)
        shapes[t] = {name: a.shape for name, a in report.arrays.items()}
    assert set(shapes[40]) == {"q", "k", "v", "out", "lse", "q_tile", "k_tile", "v_tile"}
    assert shapes[40]["q"] == shapes[40]["out"] == (1, 40, 5)        # T x d_k: linear in T
    for tile in ("q_tile", "k_tile", "v_tile"):                        # shared: fixed sizes
        assert shapes[20][tile] == shapes[40][tile]
        assert shapes[40][tile][0] in (flash.BLOCK_Q, flash.BLOCK_K)


@pytest.mark.parametrize("t_q, t_k, causal", [(16, 16, True), (33, 33, True), (7, 12, False)])
def test_pipeline_traffic_formula_equals_the_count(rng, t_q, t_k, causal):
    q, k, v = qkv(rng, (1,), t_q, t_k, 16, 5)
    reports, out = traffic.count_pipeline(q, k, v, causal)
    assert_close_float32(out, reference.attention(q, k, v, causal))
    assert np.allclose(out, attention.attention(q, k, v, causal), rtol=1e-6, atol=1e-6)  # the same kernels
    want = traffic.pipeline_traffic(t_q, t_k, 16, 5, causal)
    assert {stage: (r.total("loads"), r.total("stores")) for stage, r in reports.items()} == want
    assert (reports["scores"].stores("s") == 1).all() and (reports["softmax"].loads("s") == 3).all()


def test_the_fused_kernel_moves_less_than_the_pipeline_and_the_gap_grows_with_t():
    ratios = []
    for t in (32, 128, 1024):
        fused = sum(flash.flash_traffic(t, t, 64, block_q=32).values())
        pipeline = sum(map(sum, traffic.pipeline_traffic(t, t, 64).values()))
        ratios.append(pipeline / fused)
    assert ratios[0] > 1 and ratios == sorted(ratios)


# --- Barriers -----------------------------------------------------------------------------

def launch_args(version, q, k, v, causal=True, window=0):
    """The arguments flash_attention passes to a kernel (group = q's heads / k's), with out
    (index 7) and lse zeroed."""
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]), np.float32)
    return (q, k, v, flash.flash_scale(version, q.shape[2]), causal, np.int32(window), np.int32(q.shape[0] // k.shape[0]),
            out, np.zeros(q.shape[:2], np.float32))


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("t_q, t_k", [(33, 33), (20, 7)])
def test_the_kernels_have_no_race(rng, version, t_q, t_k):
    q, k, v = (a.reshape(2, *a.shape[-2:]) for a in qkv(rng, (2,), t_q, t_k, 5))
    kernel = flash.make_flash_v3(5) if version == 3 else flash.KERNELS[version]
    args = launch_args(version, q, k, v)
    races = sanitizer.find_races(kernel, *flash.flash_grid(2, t_q, version, 5), *args)
    assert races == [], [str(r) for r in races]
    assert_close_float32(args[7], reference.attention(q, k, v))


# Barrier mutants, generated from the library's source: the n-th cuda.syncthreads() of a
# function becomes `pass`, and the kernel is rebuilt around the mutated function.
BARRIER = "cuda.syncthreads()"


def without_barrier(function, n, names=None):
    """function's source with its n-th barrier removed (none when n is None), compiled in
    `names` (by default flash's namespace with v3's sizes for d_k 5) -> that namespace."""
    source = textwrap.dedent(inspect.getsource(function.py_func))
    if n is not None:
        at = [m.start() for m in re.finditer(re.escape(BARRIER), source)][n]
        source = source[:at] + "pass" + source[at + len(BARRIER):]
    names = {**vars(flash), **flash.v3_sizes(5)} if names is None else names
    filename = f"<{function.__name__} without barrier {n}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)   # names shared arrays
    exec(compile(source, filename, "exec"), names)
    return names


def v2_without_barrier(function, n):
    """flash v2 with barrier n of its part `function` removed: the kernel's source compiled again
    where the mutated part stands in for the library's."""
    names = without_barrier(function, n)
    return without_barrier(flash.flash_attention_kernel_v2, None, names)["flash_attention_kernel_v2"]


def v3_without_barrier(function, n):
    """flash v3 for d_k 5 with barrier n of the v3 part `function` removed."""
    mutant = without_barrier(function, n)[function.py_func.__name__]
    return flash.build_flash_v3(5, {function.py_func.__name__: mutant})


def test_the_mutants_remove_every_barrier_of_the_source():
    assert inspect.getsource(flash.v2_stage_queries.py_func).count(BARRIER) == 2
    assert inspect.getsource(flash.v2_walk_keys.py_func).count(BARRIER) == 2
    assert all(BARRIER not in inspect.getsource(p.py_func) for p in (
        flash.flash_attention_kernel_v2, flash.v2_stage_rows, flash.v2_score_tile, flash.v2_scale_row,
        flash.v2_add_row))
    assert inspect.getsource(flash.v3_key_tile.py_func).count(BARRIER) == 3
    others = [p for p in flash.V3_PARTS + flash.V3_GROUPED_PARTS + tuple(flash.V3_GROUPED_SWAPS.values())
              if p is not flash.v3_key_tile]
    assert all(BARRIER not in inspect.getsource(p.py_func) for p in others)
    assert BARRIER not in inspect.getsource(flash.flash_attention_kernel_v3.py_func)
    assert BARRIER not in inspect.getsource(flash.v3_grouped_kernel)


# --- walk_key_tiles: kernel 2's walk written out (notebook 07's main exercise) -------------------

@pytest.mark.parametrize("t_q, t_k, d_k, d_v, causal, window", [
    (17, 17, 5, 6, True, None), (16, 33, 7, 3, True, None), (33, 15, 4, 4, True, None), (1, 1, 3, 3, True, None),
    (48, 48, 3, 3, True, 17), (40, 40, 5, 5, True, 16), (12, 40, 16, 16, True, 5), (19, 19, 64, 64, True, None),
    (5, 19, 128, 128, True, None), (19, 23, 5, 5, False, None)])
def test_walk_key_tiles_in_kernel_2_matches_the_reference(rng, t_q, t_k, d_k, d_v, causal, window):
    q, k, v = qkv(rng, (2,), t_q, t_k, d_k, d_v)
    got = flash.flash_attention(q, k, v, causal, version=2, kernel=flash.kernel_v2_with(flash.walk_key_tiles),
                                window=window)
    assert_close_float32(got, reference.attention(q, k, v, causal, window).astype(np.float32))


def test_walk_key_tiles_serves_query_heads_that_share_a_key_value_head(rng):
    """With 2 query heads to a key/value head kernel 2's block is (BLOCK_Q, 2): the written-out walk
    stages each tile with both rows of threads, without a race, and each row folds its own head."""
    q = rng.standard_normal((4, 21, 5)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 23, 5)).astype(np.float32)
    kernel = flash.kernel_v2_with(flash.walk_key_tiles)
    got = flash.flash_attention(q, k, v, True, version=2, kernel=kernel)
    assert_close_float32(got, reference.attention(q, np.repeat(k, 2, axis=0), np.repeat(v, 2, axis=0)).astype(np.float32))
    assert races_of(kernel, 2, 33, group=2)[0] == []


def test_walk_key_tiles_loads_and_waits_as_kernel_2s_own_walk(rng):
    """The same band, each element of k and v loaded once by each block whose band holds its key, the
    same barriers: the written-out walk and v2_walk_keys differ in how they are split, not in what they do."""
    q, k, v = (a[0] for a in qkv(rng, (1,), 40, 40, 5))
    q, k, v = q[None], k[None], v[None]
    counted = []
    for kernel in (flash.kernel_v2_with(flash.walk_key_tiles), flash.flash_attention_kernel_v2):
        args = launch_args(2, q, k, v, True, 9)
        report = sanitizer.count_memory(kernel, *flash.flash_grid(1, 40, 2), *args)
        counted.append((report.loads("k").tolist(), report.loads("v").tolist(), report.barriers))
    assert counted[0] == counted[1]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")    # a mutant may fold a tile before it is staged
@pytest.mark.parametrize("missing, arrays", [(0, {"k_tile", "v_tile"}), (1, {"k_tile", "v_tile"})],
                         ids=["after-kv-tiles", "before-next-kv-tiles"])
def test_every_barrier_of_walk_key_tiles_is_needed(zeroed_shared, missing, arrays):
    walk = without_barrier(flash.walk_key_tiles, missing)["walk_key_tiles"]
    races, _, _ = races_of(flash.kernel_v2_with(walk), 2, 33)
    assert races and {r.array for r in races} == arrays, [str(r) for r in races]
    assert inspect.getsource(flash.walk_key_tiles.py_func).count(BARRIER) == 2


@pytest.fixture
def zeroed_shared(monkeypatch):
    """The race finder's shared arrays start as zeros, not np.empty's leftovers: a mutant reads
    a tile before it is written, and leftover bits can be NaN or 1e38, which the simulator's
    math.exp2 answers with OverflowError (a GPU returns inf). Races are found all the same:
    they are decided from the accesses, not the values."""
    monkeypatch.setattr(sanitizer, "np", types.SimpleNamespace(**{**vars(np), "empty": np.zeros}))


def races_of(kernel, version, t, group=1):
    """Races of `kernel` on `group` query heads sharing one key/value head of T t, d_k 5."""
    q, k, v = (a.reshape(-1, t, 5) for a in qkv(np.random.default_rng(3), (group,), t, t, 5))
    k, v = k[:1], v[:1]
    args = launch_args(version, q, k, v)
    return sanitizer.find_races(kernel, *flash.flash_grid(group, t, version, 5, group), *args), args[7], (q, k, v)


@pytest.mark.parametrize("function, missing, arrays, group", [
    ("v2_stage_queries", 0, {"q_tile"}, 1), ("v2_stage_queries", 1, {"q_tile"}, 2),
    ("v2_walk_keys", 0, {"k_tile", "v_tile"}, 1), ("v2_walk_keys", 1, {"k_tile", "v_tile"}, 1)],
    ids=["after-q-tile", "before-next-heads-q-tile", "after-kv-tiles", "before-next-kv-tiles"])
def test_every_barrier_of_v2_is_needed(zeroed_shared, function, missing, arrays, group):
    # Three key tiles for the second block; with group 2 the block stages two heads' Q tiles.
    races, _, _ = races_of(v2_without_barrier(getattr(flash, function), missing), 2, 33, group)
    assert races and {r.array for r in races} == arrays, [str(r) for r in races]
    assert all(r.space == "shared" for r in races)


# V is first read after the P barrier, so dropping the first barrier races on Q and K only;
# dropping the last races on V only: the next tile's K and P are written after barriers that
# follow the last reads of this tile's K (the P barrier) and P (the next K and V barrier).
@pytest.mark.filterwarnings("ignore::RuntimeWarning")    # a mutant may multiply stale memory
@pytest.mark.parametrize("function, missing, arrays", [
    ("v3_key_tile", 0, {"k_tile", "q_tile"}), ("v3_key_tile", 1, {"p_tile"}),
    ("v3_key_tile", 2, {"v_tile"})],
    ids=["after-kv-tiles", "after-p-tile", "before-next-tiles"])
def test_every_barrier_of_v3_is_needed(zeroed_shared, function, missing, arrays):
    races, _, _ = races_of(v3_without_barrier(getattr(flash, function), missing), 3, 40)   # two key tiles
    assert races and {r.array for r in races} == arrays, [str(r) for r in races]
    assert all(r.space == "shared" for r in races)


@pytest.mark.parametrize("mutant, message", [
    # Only the first half of each warp takes part: the other lanes reach the next barrier.
    ("            other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w) if cuda.laneid < 16 else y",
     r"shfl_xor_sync at .*: lanes 0-15 wait for lanes 16-31, which wait at the barrier at"),
    # A mask of half the warp, called by every lane: the upper lanes leave themselves out.
    ("            other = cuda.shfl_xor_sync(0x0000FFFF, y, w)",
     r"shfl_xor_sync by lane 16 of warp 0 with mask 0x0000ffff, which leaves the calling lane out")])
def test_a_row_reduction_whose_shuffle_not_every_lane_meets_is_reported(mutant, message):
    """v3's row reductions are warp shuffles on both backends; the simulator holds them to CUDA's
    rule that every live lane a mask names reaches the same call."""
    source = textwrap.dedent(inspect.getsource(flash.v3_row_reduce.py_func))
    line = "            other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w)"
    assert source.count(line) == 1
    names = {**vars(flash), **flash.v3_sizes(5)}
    exec(compile(source.replace(line, mutant), "<row reduce mutant>", "exec"), names)
    kernel = flash.build_flash_v3(5, {"v3_row_reduce": names["v3_row_reduce"]})
    with pytest.raises(BarrierError, match=message):
        races_of(kernel, 3, 40)


def test_a_rebuilt_v3_with_every_barrier_is_race_free_and_right():
    races, out, (q, k, v) = races_of(v3_without_barrier(flash.v3_key_tile, None), 3, 40)
    assert races == []
    assert_close_float32(out, reference.attention(q, k, v))


# --- v3_scores_to_p: the scores through the shared P tile (notebook 08's main exercise) ---------

@pytest.mark.parametrize("t_q, t_k, d_k, causal", [
    (33, 40, 64, True), (65, 63, 16, False), (20, 17, 128, True), (1, 1, 5, True), (64, 32, 64, False),
    (9, 21, 100, True)])
def test_kernel_3_with_scores_through_p_matches_the_reference(rng, t_q, t_k, d_k, causal):
    q, k, v = (rng.standard_normal((2, t, d_k)).astype(np.float32) for t in (t_q, t_k, t_k))
    kernel = flash.kernel_v3_with(flash.v3_scores_to_p, d_k)
    got = flash.flash_attention(q, k, v, causal, version=3, kernel=kernel)
    assert_close_float32(got, reference.attention(q, k, v, causal))


def skewed_scores_to_p():
    """v3_scores_to_p with row group rg's keys rotated by rg: right, but a thread's scores are not the
    slots it reads back, so the kernel's barriers around the S tile matter."""
    source = textwrap.dedent(inspect.getsource(flash.v3_scores_to_p.py_func))
    line = "cg, rg = cuda.threadIdx.x % COL_GROUPS, cuda.threadIdx.x // COL_GROUPS"
    assert source.count(line) == 1
    names = {**vars(flash), **flash.v3_sizes(5)}
    exec(compile(source.replace(line, line + "\n    cg = (cg + rg) % COL_GROUPS"), "<skewed>", "exec"), names)
    return names["v3_scores_to_p"]


def scores_through_p_without_barrier(n):
    """Kernel 3 for d_k 5 with its scores through P (skewed) and barrier n of v3_key_tile_through_p removed."""
    mutant = without_barrier(flash.v3_key_tile_through_p, n)["v3_key_tile_through_p"]
    return flash.build_flash_v3(5, {"v3_key_tile": mutant, "v3_scores_to_p": skewed_scores_to_p()})


@pytest.mark.filterwarnings("ignore::RuntimeWarning")    # a mutant may read a tile before it is written
@pytest.mark.parametrize("missing, arrays", [(0, {"k_tile", "q_tile"}), (1, {"p_tile"}), (2, {"p_tile"}),
                                             (3, {"v_tile"})],
                         ids=["after-kv-tiles", "after-s", "after-p", "before-next-tiles"])
def test_every_barrier_of_the_scores_through_p_is_needed(zeroed_shared, missing, arrays):
    races, _, _ = races_of(scores_through_p_without_barrier(missing), 3, 40)
    assert races and {r.array for r in races} == arrays, [str(r) for r in races]
    assert inspect.getsource(flash.v3_key_tile_through_p.py_func).count(BARRIER) == 4
    assert BARRIER not in inspect.getsource(flash.v3_scores_to_p.py_func)


def test_the_scores_through_p_are_race_free():
    races, out, (q, k, v) = races_of(scores_through_p_without_barrier(None), 3, 40)
    assert races == []
    assert_close_float32(out, reference.attention(q, k, v))


# --- Bad input -----------------------------------------------------------------------------

GOOD = np.zeros((2, 4, 5), np.float32)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((np.zeros(4), GOOD, GOOD), {}, ValueError,
     r"^q must have shape \(\.\.\., T_q, d_k\) \(at least 2 axes\), got shape \(4,\)$"),
    ((GOOD, np.zeros((2, 4, 6)), GOOD), {}, ValueError,
     r"^k must have d_k = 5 in its last axis, like q \(2, 4, 5\); got shape \(2, 4, 6\)$"),
    ((GOOD, np.zeros((3, 4, 5)), GOOD), {}, ValueError,      # 3 key/value heads for 2 query heads
     r"^k must have shape \('H_kv', 4, 5\) with H_kv one of 1, 2 \(a divisor of q's 2 heads on axis -3\); "
     r"got shape \(3, 4, 5\)$"),
    ((GOOD, np.zeros((1, 2, 4, 5)), GOOD), {}, ValueError,
     r"^k must have the leading axes of q \(2,\); got shape \(1, 2, 4, 5\)$"),
    ((GOOD, GOOD, np.zeros((2, 3, 5))), {}, ValueError,
     r"^v must have shape \(2, 4\) \+ \(d_v,\) \(the leading axes and T_k of k\); got shape \(2, 3, 5\)$"),
    ((np.zeros((4, 129)), np.zeros((4, 129)), np.zeros((4, 5))), {}, ValueError,
     r"^q must have d_k <= 128 \(MAX_D\) for the fused kernel; got shape \(4, 129\)$"),
    ((GOOD, GOOD, np.zeros((2, 4, 200))), {}, ValueError,
     r"^v must have d_v <= 128 \(MAX_D\) for the fused kernel; got shape \(2, 4, 200\)$"),
    ((np.full((4, 5), np.nan), GOOD[0], GOOD[0]), {}, ValueError,
     r"^q contains nan at index \(0, 0\); it must be finite$"),
    ((GOOD, GOOD.astype(bool), GOOD), {}, TypeError,
     r"^k must be a float array of shape \(\.\.\., T_k, d_k\), got dtype bool$"),
    ((GOOD, GOOD, np.zeros((2, 0, 5))), {}, ValueError, r"^v must not be empty, got shape \(2, 0, 5\)$"),
    ((GOOD, GOOD, GOOD), {"version": 4}, ValueError, r"^version must be 1, 2 or 3, got 4$"),
    ((GOOD, GOOD, np.zeros((2, 4, 6))), {"version": 3}, ValueError,
     r"^v must have d_v = d_k = 5 for version 3; got shape \(2, 4, 6\)$"),
    ((GOOD, GOOD, GOOD), {"causal": "yes"}, ValueError, r"^causal must be True or False, got 'yes'$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(args, kwargs, error, message):
    with pytest.raises(error, match=message):
        flash.flash_attention(*args, **kwargs)


def test_the_simulator_budget_refuses_huge_launches():
    if not attention_lib.ON_SIMULATOR:
        pytest.skip("only the simulator refuses large launches")
    big = np.zeros((12, 1024, 64), np.float32)                 # one layer's 12 heads at ANDREA-120M
    with pytest.raises(ValueError, match=r"^flash_attention: .* CUDA threads would take about"):
        flash.flash_attention(big, big, big)
