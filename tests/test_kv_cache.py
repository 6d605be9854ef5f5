"""Notebook 09: the KV cache, the decode kernels, a layer decoded token by token (its exercises: test_exercises_09.py)."""

import math

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import kv_cache, multihead
from attention_lib.stages.kv_cache import KEYS_PER_CHUNK, KVCache
from attention_lib.platform.runtime import ANDREA_120M

C = KEYS_PER_CHUNK
# Cache lengths: one position; fewer than a chunk; exactly one chunk; one past it; several
# chunks with the last one partly filled.
LENGTHS = [1, 7, C, C + 1, 4 * C + 1]


def filled_cache(rng, n_head, length, d_k, capacity=None, stale=np.nan, n_kv_head=None):
    """A KVCache with `length` random positions; the slots after them hold `stale` (NaN by
    default: a kernel that reads an unfilled slot gets NaN in its output)."""
    cache = KVCache(n_head, capacity or length, d_k, n_kv_head)
    junk = np.full((cache.n_kv_head, cache.capacity, d_k), stale, np.float32)
    cache.k_device.copy_to_device(junk)
    cache.v_device.copy_to_device(junk)
    shape = (cache.n_kv_head, length, d_k)
    cache.append(rng.standard_normal(shape), rng.standard_normal(shape))
    return cache


def expected_decode(q, cache):
    """reference.attention with one query per head: T_q = 1 < T_k, so it sees every key. Query
    head h reads kv head h // group: np.repeat gives each query head its own copy."""
    keys, values = (np.repeat(a, cache.group, axis=0) for a in (cache.keys, cache.values))
    return reference.attention(np.reshape(q, (cache.n_head, 1, cache.d_k)), keys, values)[:, 0]


def assert_decode_matches(got, q, cache):
    """float32 dot products of d_k terms and sums of `length` weights against float64: errors
    around 1e-7 of outputs of order 1 at these sizes; rtol 1e-5 scales with a few ulp times
    sqrt(length), atol 1e-6 covers outputs near 0."""
    want = expected_decode(q, cache)
    assert got.dtype == np.float32 and got.shape == (cache.n_head, cache.d_k)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), np.abs(got - want).max()


# --- Sizes -----------------------------------------------------------------------------------

def test_the_cache_of_andrea_120m_in_bytes():
    m = ANDREA_120M
    per_sequence = kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k)
    assert per_sequence == 2 * 12 * 768 * 1024 * 4 == 75_497_472           # 75.5 MB, 72 MiB
    assert kv_cache.cache_bytes(1, m.n_head, m.T, m.d_k) * 12 == per_sequence
    assert kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k, bytes_per_value=2) == per_sequence // 2
    assert kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k, batch=m.batch) == 603_979_776


def test_a_kvcache_holds_what_its_size_says():
    cache = KVCache(3, 10, 5)
    assert cache.nbytes == kv_cache.cache_bytes(1, 3, 10, 5)
    assert cache.k_device.shape == cache.v_device.shape == (3, 10, 5)


# --- NumPy -------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 3, C, 100])
def test_chunk_partials_merged_with_log_sum_exp_equal_attention(rng, chunk):
    q = rng.standard_normal((3, 5)) * 10.0             # scores up to ~100: the max matters
    keys, values = rng.standard_normal((2, 3, 19, 5))
    lse, o = kv_cache.chunk_partials(q, keys, values, chunk)
    n = math.ceil(19 / chunk)
    assert lse.shape == (3, n) and o.shape == (3, n, 5)
    s = np.einsum("hd,htd->ht", q, keys) / math.sqrt(5)
    first = s[:, :chunk]                               # chunk 0's own softmax and log-sum-exp
    assert np.allclose(lse[:, 0], np.log(np.exp(first).sum(axis=-1)), rtol=1e-12, atol=1e-12)
    assert np.allclose(o[:, 0], reference.attention(q[:, None], keys[:, :chunk], values[:, :chunk])[:, 0])
    out, lse_all = kv_cache.merge_partials(lse, o)
    want = reference.attention(q[:, None], keys, values)[:, 0]
    assert np.allclose(out, want, rtol=1e-12, atol=1e-13)                  # both float64
    assert np.allclose(lse_all, np.log(np.exp(s).sum(axis=-1)), rtol=1e-12, atol=1e-12)


def test_the_merge_ignores_a_chunk_that_saw_no_key():
    lse, o = np.array([[1.0, -np.inf]]), np.array([[[2.0, 3.0], [0.0, 0.0]]])
    out, lse_all = kv_cache.merge_partials(lse, o)
    assert np.array_equal(out, [[2.0, 3.0]]) and lse_all[0] == 1.0


def test_numpy_decoding_token_by_token_equals_one_causal_pass(rng):
    x = rng.standard_normal((11, 12))
    w = rng.standard_normal((4, 12, 12)) / math.sqrt(12)
    got = kv_cache.decode_layer_numpy(x, *w, n_head=3)
    assert np.allclose(got, reference.multi_head_attention(x, *w, 3), rtol=1e-12, atol=1e-13)


# --- The cache -----------------------------------------------------------------------------------

def test_append_fills_the_cache_from_the_front(rng):
    cache = KVCache(2, 9, 5)
    k = rng.standard_normal((2, 9, 5)).astype(np.float32)
    v = rng.standard_normal((2, 9, 5)).astype(np.float32)
    for start, stop in [(0, 4), (4, 5), (5, 9)]:       # a prompt, one token, the rest
        cache.append(k[:, start:stop], v[:, start:stop])
        assert cache.length == stop
        assert np.array_equal(cache.keys, k[:, :stop]) and np.array_equal(cache.values, v[:, :stop])
    assert cache.keys.flags.c_contiguous and cache.keys.shape == (2, 9, 5)


def test_appending_past_the_capacity_is_refused_and_changes_nothing(rng):
    cache = filled_cache(rng, 2, 7, 5, capacity=8)
    before = cache.keys
    with pytest.raises(ValueError, match=r"^KVCache is full: capacity 8, length 7, cannot append 2 more") as error:
        cache.append(np.zeros((2, 2, 5)), np.zeros((2, 2, 5)))
    assert "\n" not in str(error.value)
    assert cache.length == 7 and np.array_equal(cache.keys, before)


@pytest.mark.parametrize("k_new, v_new, error, says", [
    (np.zeros((3, 1, 5)), np.zeros((2, 1, 5)), ValueError, r"^k_new must have shape \(n_kv_head, t_new, d_k\) = \(2, t_new, 5\), got \(3, 1, 5\)"),
    (np.zeros((2, 1, 5)), np.zeros((2, 1, 4)), ValueError, r"^v_new must have shape .* got \(2, 1, 4\)"),
    (np.zeros((2, 1, 5)), np.zeros((2, 2, 5)), ValueError, r"^v_new must have the shape of k_new \(2, 1, 5\), got \(2, 2, 5\)"),
    (np.zeros((2, 5)), np.zeros((2, 5)), ValueError, r"^k_new must have shape .*\(3 axes\), got shape \(2, 5\)"),
    (np.zeros((2, 1, 5), bool), np.zeros((2, 1, 5)), TypeError, r"^k_new must be a float array .* got dtype bool"),
    (np.full((2, 1, 5), np.nan), np.zeros((2, 1, 5)), ValueError, r"^k_new contains nan"),
])
def test_bad_appends_name_the_argument(k_new, v_new, error, says):
    cache = KVCache(2, 4, 5)
    with pytest.raises(error, match=says):
        cache.append(k_new, v_new)
    assert cache.length == 0


@pytest.mark.parametrize("args, error, says", [
    ((0, 4, 5), ValueError, "n_head must be a positive int, got 0"),
    ((2, 4.0, 5), TypeError, "capacity must be a positive int, got float 4.0"),
    ((2, 4, 129), ValueError, "d_k must be at most MAX_D = 128, got 129"),
])
def test_bad_cache_sizes_are_refused(args, error, says):
    with pytest.raises(error, match=says):
        KVCache(*args)


# --- The decode kernels --------------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("length", LENGTHS)
def test_decode_step_matches_the_reference(rng, version, length):
    cache = filled_cache(rng, 3, length, 5, capacity=length + 3)    # NaN in the unfilled slots
    q = rng.standard_normal((3, 5))
    assert_decode_matches(kv_cache.decode_step(q, cache, version=version), q, cache)


@pytest.mark.parametrize("version", [1, 2])
def test_decode_step_with_wide_heads_and_a_query_axis(rng, version):
    cache = filled_cache(rng, 1, 2 * C + 3, 24)                      # d_k 24 > the threads of a chunk
    q = rng.standard_normal((1, 1, 24))                               # (n_head, 1, d_k) is accepted
    assert_decode_matches(kv_cache.decode_step(q, cache, version=version), q, cache)


@pytest.mark.parametrize("version", [1, 2])
def test_large_scores_neither_overflow_nor_underflow(rng, version):
    cache = filled_cache(rng, 2, C + 5, 5)
    q = rng.standard_normal((2, 5)) * 300.0                          # scores in the hundreds
    got = kv_cache.decode_step(q, cache, version=version)
    assert np.isfinite(got).all()
    assert_decode_matches(got, q, cache)


def test_the_two_versions_agree_and_the_kernel_arguments_are_launched_the_same_way(rng):
    cache = filled_cache(rng, 2, 2 * C + 1, 6)
    q = rng.standard_normal((2, 6))
    v2 = kv_cache.decode_step(q, cache)
    assert np.allclose(kv_cache.decode_step(q, cache, version=1), v2, rtol=1e-5, atol=1e-6)
    assert np.array_equal(kv_cache.decode_step(q, cache, kernel=kv_cache.decode_kernel_v2), v2)
    assert np.array_equal(kv_cache.decode_step(q, cache, merge_kernel=kv_cache.decode_merge_kernel), v2)


def test_the_grids(rng):
    assert kv_cache.decode_grid(12, 64, 1024, 1) == [(12, 1)]          # a block per kv head
    assert kv_cache.decode_grid(12, 64, 1024, 1, n_kv_head=4) == [(4, 3)]   # of a thread per query head
    (grid, block), (merge_grid, merge_block) = kv_cache.decode_grid(4, 16, 2 * C + 1, 2)
    assert grid == (3, 4) and block == C
    assert merge_grid == (1, 1) and merge_block == kv_cache.MERGE_BLOCK
    (grid, block), (merge_grid, _) = kv_cache.decode_grid(4, 16, 2 * C + 1, 2, n_kv_head=1)
    assert grid == (3, 1) and block == C and merge_grid == (1, 1)      # the merge is per query head


@pytest.mark.parametrize("q, cache_length, error, says", [
    (np.zeros((2, 5)), 0, ValueError, "^cache is empty: append the new token's k and v before decode_step$"),
    (np.zeros((3, 5)), 2, ValueError, r"^q must have shape \(n_head, d_k\) = \(2, 5\) or \(2, 1, 5\) to match the cache, got \(3, 5\)"),
    (np.zeros((2, 2, 5)), 2, ValueError, r"^q must have shape .* got \(2, 2, 5\)"),
    (np.zeros(5), 2, ValueError, r"^q must have shape .*\(at least 2 axes\), got shape \(5,\)"),
    ("q", 2, TypeError, r"^q must be a NumPy float array"),
])
def test_bad_decode_inputs_name_the_argument(rng, q, cache_length, error, says):
    cache = KVCache(2, 4, 5)
    if cache_length:
        cache.append(np.zeros((2, cache_length, 5)), np.zeros((2, cache_length, 5)))
    with pytest.raises(error, match=says):
        kv_cache.decode_step(q, cache)


def test_decode_step_wants_a_cache_and_a_known_version():
    with pytest.raises(ValueError, match="^cache must be a KVCache, got ndarray$"):
        kv_cache.decode_step(np.zeros((2, 5)), np.zeros((2, 4, 5)))
    with pytest.raises(ValueError, match="^version must be 1 or 2, got 3$"):
        kv_cache.decode_step(np.zeros((2, 5)), KVCache(2, 4, 5), version=3)


# --- The chunk partial kernel: a block per (chunk, query head) -------------------------------------

@pytest.mark.parametrize("n_head, n_kv_head, length, d_k", [
    (1, 1, 1, 5), (2, 1, C - 1, 64), (4, 2, C, 5), (4, 2, C + 1, 128), (3, 3, 3 * C + 2, 17), (4, 1, 2 * C + 5, 3)])
def test_the_chunk_partial_kernel_matches_the_chunks_of_numpy(rng, n_head, n_kv_head, length, d_k):
    cache = filled_cache(rng, n_head, length, d_k, capacity=length + 2, n_kv_head=n_kv_head)
    q = rng.standard_normal((n_head, d_k))
    lse_part, o_part = kv_cache.chunk_partials_device(q, cache)
    group = n_head // n_kv_head                              # query head h reads kv head h // group
    want_lse, want_o = kv_cache.chunk_partials(q, np.repeat(cache.keys, group, 0), np.repeat(cache.values, group, 0))
    assert lse_part.dtype == o_part.dtype == np.float32
    assert np.allclose(lse_part, want_lse, rtol=1e-5, atol=1e-5) and np.allclose(o_part, want_o, rtol=1e-5, atol=1e-5)
    out, _ = kv_cache.merge_partials(lse_part, o_part)       # merged: the decode step's output
    assert np.allclose(out, kv_cache.decode_step(q, cache), rtol=1e-5, atol=1e-5)


def test_the_chunk_partial_kernel_survives_scores_past_exps_range(rng):
    cache = filled_cache(rng, 2, 2 * C + 3, 16)
    q = rng.standard_normal((2, 16)) * 400.0                 # scores spread over hundreds inside a chunk
    lse_part, o_part = kv_cache.chunk_partials_device(q, cache)
    want_lse, want_o = kv_cache.chunk_partials(q, cache.keys, cache.values)
    assert np.isfinite(lse_part).all() and np.isfinite(o_part).all()
    assert np.allclose(lse_part, want_lse, rtol=1e-5, atol=1e-4) and np.allclose(o_part, want_o, rtol=1e-4, atol=1e-5)


def test_the_chunk_partial_kernel_reads_the_cache_once_a_query_head_and_has_no_race(rng):
    """Grouped heads: 4 query heads on 2 kv heads read each cached number twice, decode_kernel_v2 once."""
    n_head, n_kv_head, length, d_k = 4, 2, 2 * C + 3, 5
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    k, v = np.full((2, n_kv_head, length + 2, d_k), np.nan, np.float32)
    k[:, :length], v[:, :length] = rng.standard_normal((2, n_kv_head, length, d_k))
    chunks, scale = kv_cache.n_chunks(length), np.float32(1 / math.sqrt(d_k))
    parts = (np.zeros((n_head, chunks), np.float32), np.zeros((n_head, chunks, d_k), np.float32))
    grid, block = kv_cache.chunk_grid(n_head, length)
    assert grid == (chunks, n_head) and block == C
    args = (q, k, v, length, scale, *parts)
    assert sanitizer.find_races(kv_cache.chunk_partial_kernel, grid, block, *args) == []
    report = sanitizer.count_memory(kv_cache.chunk_partial_kernel, grid, block, *args)
    (grid2, block2), _ = kv_cache.decode_grid(n_head, d_k, length, 2, n_kv_head)
    report2 = sanitizer.count_memory(kv_cache.decode_kernel_v2, grid2, block2, *args)
    for name in ("k_cache", "v_cache"):
        assert (report.loads(name)[:, :length] == 2).all() and (report.loads(name)[:, length:] == 0).all()
        assert (report2.loads(name)[:, :length] == 1).all()


def test_chunk_partials_device_refuses_a_query_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^q must have shape \(n_head, d_k\) = \(2, 5\)"):
        kv_cache.chunk_partials_device(np.zeros((3, 5)), KVCache(2, 4, 5))


# --- Races and memory traffic --------------------------------------------------------------------

def launches(rng, n_head, length, d_k, capacity):
    """Host arrays for one decode step: q, the cache (NaN past `length`), partials, output."""
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    k = np.full((n_head, capacity, d_k), np.nan, np.float32)
    v = np.full((n_head, capacity, d_k), np.nan, np.float32)
    k[:, :length], v[:, :length] = rng.standard_normal((2, n_head, length, d_k))
    chunks = kv_cache.n_chunks(length)
    parts = (np.zeros((n_head, chunks), np.float32), np.zeros((n_head, chunks, d_k), np.float32))   # lse_c, o_c
    return q, k, v, parts, np.zeros((n_head, d_k), np.float32)


def test_the_decode_kernels_have_no_race(rng):
    n_head, length, d_k = 2, 2 * C + 3, 5
    q, k, v, parts, out = launches(rng, n_head, length, d_k, length + 2)
    (grid, block), (merge_grid, merge_block) = kv_cache.decode_grid(n_head, d_k, length, 2)
    scale = np.float32(1 / math.sqrt(d_k))
    assert sanitizer.find_races(kv_cache.decode_kernel_v2, grid, block, q, k, v, length, scale, *parts) == []
    lse = np.zeros(out.shape[0], np.float32)
    assert sanitizer.find_races(kv_cache.decode_merge_kernel, merge_grid, merge_block, *parts, out, lse) == []
    assert np.allclose(out, reference.attention(q[:, None], k[:, :length], v[:, :length])[:, 0], rtol=1e-5, atol=1e-6)
    (grid, block), = kv_cache.decode_grid(n_head, d_k, length, 1)
    assert sanitizer.find_races(kv_cache.decode_kernel_v1, grid, block, q, k, v, length, scale, out) == []


@pytest.mark.parametrize("length", [1, C + 1, 3 * C])
def test_global_traffic_matches_the_formula(rng, length):
    n_head, d_k = 2, 5
    q, k, v, parts, out = launches(rng, n_head, length, d_k, 3 * C + 2)
    scale = np.float32(1 / math.sqrt(d_k))
    (grid, block), (merge_grid, merge_block) = kv_cache.decode_grid(n_head, d_k, length, 2)
    reports = {
        "decode_kernel_v2": sanitizer.count_memory(kv_cache.decode_kernel_v2, grid, block,
                                                        q, k, v, length, scale, *parts),
        "decode_merge_kernel": sanitizer.count_memory(kv_cache.decode_merge_kernel, merge_grid,
                                                      merge_block, *parts, out, np.zeros(out.shape[0], np.float32)),
    }
    (grid, block), = kv_cache.decode_grid(n_head, d_k, length, 1)
    reports["decode_kernel_v1"] = sanitizer.count_memory(kv_cache.decode_kernel_v1, grid, block,
                                                         q, k, v, length, scale, np.zeros_like(out))
    formula = {**kv_cache.decode_traffic(length, n_head, d_k, 2), **kv_cache.decode_traffic(length, n_head, d_k, 1)}
    for kernel, arrays in formula.items():
        report = reports[kernel]
        counted = {a.name: (int(a.loads.sum()), int(a.stores.sum()))
                   for a in report.arrays.values() if a.space == "global" and a.loads.sum() + a.stores.sum()}
        assert counted == arrays, kernel
    for name in ("k_cache", "v_cache"):                 # each filled position once, no unfilled slot
        for report in (reports["decode_kernel_v2"], reports["decode_kernel_v1"]):
            assert (report.loads(name)[:, :length] == 1).all() and (report.loads(name)[:, length:] == 0).all()


def test_token_cost_with_and_without_the_cache():
    d = ANDREA_120M.d_model
    assert kv_cache.token_cost(1, d, cached=True) == kv_cache.token_cost(1, d, cached=False)  # nothing to reuse yet
    flops, nbytes = kv_cache.token_cost(1024, d, cached=True)
    assert flops == 8 * d * d + 4 * 1024 * d and nbytes == 4 * (4 * d * d + 2 * 1024 * d + 8 * d)
    flops_nc, nbytes_nc = kv_cache.token_cost(1024, d, cached=False)
    assert flops_nc == 8 * 1024 * d * d + 2 * 1024 * 1025 * d
    assert flops_nc > 500 * flops and 2 < nbytes_nc / nbytes < 3  # compute saved, traffic much less so
    # The cache-read term of the formula is what the decode kernels read (see the traffic test).
    assert kv_cache.decode_traffic(1024, 12, 64, 1)["decode_kernel_v1"]["k_cache"][0] == 1024 * d


# --- A layer decoded token by token ---------------------------------------------------------------

@pytest.fixture(scope="module")
def layer():
    """x (9, 10) and four (10, 10) weights scaled by 1/sqrt(d_model) (outputs of order 1); 2
    heads of d_k 5; T 9 crosses a chunk boundary of the simulator's KEYS_PER_CHUNK 8."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((9, 10)).astype(np.float32)
    w = (rng.standard_normal((4, 10, 10)) / math.sqrt(10)).astype(np.float32)
    return x, tuple(w), 2


def assert_layer_close(got, want):
    """float32 projections (sums of d_model terms), attention and W_O against float64: errors
    of a few 1e-7 on outputs of order 1; atol 1e-5 leaves an order of magnitude of room."""
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), np.abs(got - want).max()


@pytest.mark.parametrize("n_prompt, version", [(1, 2), (4, 2), (9, 2), (4, 1)])
def test_decoding_with_the_cache_equals_one_causal_pass(layer, n_prompt, version):
    x, w, n_head = layer
    got = kv_cache.generate_layer_outputs(x, *w, n_head, n_prompt=n_prompt, version=version)
    assert_layer_close(got, reference.multi_head_attention(x, *w, n_head))
    assert_layer_close(got, kv_cache.decode_layer_numpy(x, *w, n_head))


def test_decoding_with_the_cache_equals_the_device_layer(layer):
    x, w, n_head = layer
    got = kv_cache.generate_layer_outputs(x, *w, n_head, n_prompt=5)
    assert_layer_close(got, multihead.multi_head_attention(x, *w, n_head).astype(np.float64))


def test_a_decode_step_appends_the_new_keys_and_values(layer):
    x, w, n_head = layer
    cache = KVCache(n_head, 4, 5)
    kv_cache.prefill(x[:2], *w, cache)
    kv_cache.decode_layer_step(x[2], *w, cache)
    assert cache.length == 3
    want_k = reference.split_heads(reference.project(x[:3], w[1]), n_head)     # (n_head, 3, d_k)
    want_v = reference.split_heads(reference.project(x[:3], w[2]), n_head)
    assert np.allclose(cache.keys, want_k, rtol=1e-5, atol=1e-6)
    assert np.allclose(cache.values, want_v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, says", [
    (dict(n_prompt=0), "n_prompt must be an int between 1 and T = 9, got 0"),
    (dict(n_head=3), "n_head must be a positive int dividing d_model 10, got 3"),
    (dict(w_o=np.zeros((10, 8))), r"w_o must have shape \(10, 10\) \(d_model = the last axis of x\), got \(10, 8\)"),
])
def test_bad_layer_arguments_name_the_argument(layer, kwargs, says):
    x, (w_q, w_k, w_v, w_o), n_head = layer
    args = dict(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, n_head=n_head) | kwargs
    with pytest.raises(ValueError, match=f"^{says}$"):
        kv_cache.generate_layer_outputs(x, **args)
