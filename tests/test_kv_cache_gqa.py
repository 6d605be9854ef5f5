"""Grouped-query attention in the KV cache: n_kv_head key/value heads shared by n_head query heads."""

import math

import numpy as np
import pytest

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform.runtime import ANDREA_120M
from attention_lib.stages import kv_cache
from attention_lib.stages.kv_cache import KEYS_PER_CHUNK, KVCache

C = KEYS_PER_CHUNK
N_HEAD = 4


def gqa_reference(q, keys, values):
    """float64 attention of one query per head, query head h against kv head h // group.

    q: (n_head, d_k); keys, values: (n_kv_head, T, d_k) -> (n_head, d_k). np.repeat gives every
    query head its own copy of its kv head: (n_head, T, d_k).
    """
    group = q.shape[0] // keys.shape[0]
    keys, values = (np.repeat(a, group, axis=0) for a in (keys, values))
    return reference.attention(np.asarray(q, np.float64)[:, None], keys, values)[:, 0]


def stale_cache(rng, n_head, n_kv_head, length, d_k, capacity):
    """A KVCache of n_kv_head heads with `length` random positions and NaN after them (a
    kernel that reads an unfilled slot returns NaN)."""
    cache = KVCache(n_head, capacity, d_k, n_kv_head=n_kv_head)
    for device_array in (cache.k_device, cache.v_device):
        device_array.copy_to_device(np.full((n_kv_head, capacity, d_k), np.nan, np.float32))
    cache.append(*rng.standard_normal((2, n_kv_head, length, d_k)))
    return cache


# --- The decode kernels against the reference --------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("length", [1, 7, 19, 33])
@pytest.mark.parametrize("d_k", [5, 16])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_decode_step_with_shared_kv_heads_matches_the_reference(rng, version, length, d_k, n_kv_head):
    cache = stale_cache(rng, N_HEAD, n_kv_head, length, d_k, capacity=length + 2)
    q = rng.standard_normal((N_HEAD, d_k))
    got = kv_cache.decode_step(q, cache, version=version)
    want = gqa_reference(q, cache.keys, cache.values)
    # float32 sums of d_k products and of `length` weights against float64: errors ~1e-7.
    assert got.dtype == np.float32 and got.shape == (N_HEAD, d_k)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), np.abs(got - want).max()


def test_query_heads_of_one_group_differ_and_read_their_own_kv_head(rng):
    # Two kv heads with very different values: query heads 0, 1 must average kv head 0's
    # values (about +100), heads 2, 3 kv head 1's (about -100), never the other way round.
    cache = KVCache(4, 5, 3, n_kv_head=2)
    values = np.stack([100 + rng.standard_normal((5, 3)), -100 + rng.standard_normal((5, 3))])
    cache.append(rng.standard_normal((2, 5, 3)), values)
    q = rng.standard_normal((4, 3))
    for version in (1, 2):
        got = kv_cache.decode_step(q, cache, version=version)
        assert (got[:2] > 90).all() and (got[2:] < -90).all(), version
        assert not np.allclose(got[0], got[1])          # their own queries: different weights


# --- Loads: each cached number once, whatever the group --------------------------------------

def host_launch(rng, n_head, n_kv_head, length, d_k, capacity):
    """Host arrays of one decode step: q, the cache (NaN past `length`), the partials, out."""
    q = rng.standard_normal((n_head, d_k)).astype(np.float32)
    k, v = np.full((2, n_kv_head, capacity, d_k), np.nan, np.float32)
    k[:, :length], v[:, :length] = rng.standard_normal((2, n_kv_head, length, d_k))
    chunks = kv_cache.n_chunks(length)
    parts = (np.zeros((n_head, chunks), np.float32), np.zeros((n_head, chunks, d_k), np.float32))   # lse_c, o_c
    return q, k, v, parts, np.zeros((n_head, d_k), np.float32)


def counted_traffic(rng, n_kv_head, length, d_k=5):
    """{kernel: {array: (loads, stores)}} counted by the sanitizer, and the partial and v1 reports."""
    q, k, v, parts, out = host_launch(rng, N_HEAD, n_kv_head, length, d_k, length + 3)
    scale = np.float32(1 / math.sqrt(d_k))
    (grid, block), (merge_grid, merge_block) = kv_cache.decode_grid(N_HEAD, d_k, length, 2, n_kv_head)
    (grid_1, block_1), = kv_cache.decode_grid(N_HEAD, d_k, length, 1, n_kv_head)
    reports = {
        "decode_kernel_v2": sanitizer.count_memory(kv_cache.decode_kernel_v2, grid, block,
                                                        q, k, v, length, scale, *parts),
        "decode_merge_kernel": sanitizer.count_memory(kv_cache.decode_merge_kernel, merge_grid, merge_block,
                                                      *parts, out, np.zeros(out.shape[0], np.float32)),
        "decode_kernel_v1": sanitizer.count_memory(kv_cache.decode_kernel_v1, grid_1, block_1,
                                                   q, k, v, length, scale, np.zeros_like(out)),
    }
    want = gqa_reference(q, k[:, :length], v[:, :length])
    assert np.allclose(out, want, rtol=1e-5, atol=1e-6)   # the counted launches computed the answer
    counts = {name: {a.name: (int(a.loads.sum()), int(a.stores.sum()))
                     for a in report.arrays.values() if a.space == "global" and a.loads.sum() + a.stores.sum()}
              for name, report in reports.items()}
    return counts, reports


@pytest.mark.parametrize("n_kv_head, length", [(4, C + 1), (2, 2 * C + 3), (1, 2 * C + 3), (1, 1)])
def test_each_cached_number_is_loaded_once_whatever_the_group(rng, n_kv_head, length):
    counts, reports = counted_traffic(rng, n_kv_head, length)
    formula = {**kv_cache.decode_traffic(length, N_HEAD, 5, 2, n_kv_head),
               **kv_cache.decode_traffic(length, N_HEAD, 5, 1, n_kv_head)}
    assert counts == formula
    for kernel in ("decode_kernel_v2", "decode_kernel_v1"):
        for name in ("k_cache", "v_cache"):
            loads = reports[kernel].loads(name)                       # (n_kv_head, capacity, d_k)
            assert (loads[:, :length] == 1).all() and (loads[:, length:] == 0).all(), (kernel, name)


def test_sharing_kv_heads_divides_the_cache_loads_by_the_group():
    full = kv_cache.decode_traffic(33, 4, 16, 2)["decode_kernel_v2"]
    for n_kv_head in (4, 2, 1):
        shared = kv_cache.decode_traffic(33, 4, 16, 2, n_kv_head)["decode_kernel_v2"]
        assert shared["k_cache"][0] * (4 // n_kv_head) == full["k_cache"][0] == 4 * 33 * 16
        assert shared["q"] == full["q"] and shared["o_part"] == full["o_part"]   # per query head


def test_the_gqa_kernels_have_no_race(rng):
    n_kv_head, length, d_k = 2, 2 * C + 3, 5
    q, k, v, parts, out = host_launch(rng, N_HEAD, n_kv_head, length, d_k, length + 1)
    scale = np.float32(1 / math.sqrt(d_k))
    (grid, block), (merge_grid, merge_block) = kv_cache.decode_grid(N_HEAD, d_k, length, 2, n_kv_head)
    assert sanitizer.find_races(kv_cache.decode_kernel_v2, grid, block, q, k, v, length, scale, *parts) == []
    lse = np.zeros(out.shape[0], np.float32)
    assert sanitizer.find_races(kv_cache.decode_merge_kernel, merge_grid, merge_block, *parts, out, lse) == []
    assert np.allclose(out, gqa_reference(q, k[:, :length], v[:, :length]), rtol=1e-5, atol=1e-6)
    (grid, block), = kv_cache.decode_grid(N_HEAD, d_k, length, 1, n_kv_head)
    assert sanitizer.find_races(kv_cache.decode_kernel_v1, grid, block, q, k, v, length, scale, out) == []


# --- Errors ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_kv_head, error, says", [
    (3, ValueError, r"^n_kv_head must divide n_head = 4 \(each kv head serves a whole group of query heads\), got 3$"),
    (8, ValueError, r"^n_kv_head must divide n_head = 4 .* got 8$"),
    (0, ValueError, r"^n_kv_head must be a positive int, got 0$"),
    (2.0, TypeError, r"^n_kv_head must be a positive int, got float 2.0$"),
])
def test_a_cache_refuses_kv_heads_that_do_not_divide_the_query_heads(n_kv_head, error, says):
    with pytest.raises(error, match=says):
        KVCache(4, 8, 5, n_kv_head=n_kv_head)


def test_a_gqa_cache_appends_its_kv_heads_and_decodes_its_query_heads(rng):
    cache = KVCache(4, 8, 5, n_kv_head=2)
    assert cache.k_device.shape == (2, 8, 5) and cache.group == 2
    assert cache.nbytes == kv_cache.cache_bytes(1, 4, 8, 5, n_kv_head=2)
    with pytest.raises(ValueError, match=r"^k_new must have shape \(n_kv_head, t_new, d_k\) = \(2, t_new, 5\), got \(4, 1, 5\)$"):
        cache.append(np.zeros((4, 1, 5)), np.zeros((4, 1, 5)))     # as many heads as the queries: refused
    cache.append(np.zeros((2, 1, 5)), np.zeros((2, 1, 5)))
    with pytest.raises(ValueError, match=r"^q must have shape \(n_head, d_k\) = \(4, 5\) or \(4, 1, 5\) to match the cache, got \(2, 5\)$"):
        kv_cache.decode_step(np.zeros((2, 5)), cache)              # one query per kv head: refused
    assert "n_kv_head=2" in repr(cache)


# --- Sizes ----------------------------------------------------------------------------------------

def test_the_cache_shrinks_by_the_group():
    m = ANDREA_120M
    full = kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k)
    assert kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k, n_kv_head=12) == full == 75_497_472
    assert kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k, n_kv_head=4) * 3 == full
    assert kv_cache.cache_bytes(m.n_layer, m.n_head, m.T, m.d_k, n_kv_head=1) == 2 * 12 * 1024 * 64 * 4
    # A Llama-style configuration: 32 layers, 32 query heads of 128, 8 kv heads, float16, 4096 positions.
    assert kv_cache.cache_bytes(32, 32, 4096, 128, bytes_per_value=2) == 2 * 32 * 32 * 4096 * 128 * 2 == 2 ** 31
    assert kv_cache.cache_bytes(32, 32, 4096, 128, 2, batch=32, n_kv_head=8) == 2 ** 31 // 4 * 32


def test_bytes_per_token_is_the_own_cache_plus_a_share_of_the_weights():
    weights = 1_000_000
    cache = kv_cache.cache_bytes(12, 12, 1024, 64)
    assert kv_cache.bytes_per_token(12, 12, 1024, 64, weights) == cache + weights
    assert kv_cache.bytes_per_token(12, 12, 1024, 64, weights, batch=8) == cache + weights / 8
    assert kv_cache.bytes_per_token(12, 12, 1024, 64, weights, batch=8, n_kv_head=1) == cache / 12 + weights / 8
    assert kv_cache.bytes_per_token(12, 12, 1024, 64, 0, bytes_per_value=2) == cache / 2


# --- A layer with shared kv heads ------------------------------------------------------------------

def expanded(w, n_kv_head, group):
    """W_K (d_model, n_kv_head * d_k) with each kv head's columns repeated for its group:
    (d_model, n_kv_head, d_k) -> (d_model, n_head, d_k) -> (d_model, n_head * d_k). A plain
    multi-head layer with these weights is the GQA layer."""
    d_model = w.shape[0]
    return np.repeat(w.reshape(d_model, n_kv_head, -1), group, axis=1).reshape(d_model, -1)


@pytest.fixture(scope="module")
def gqa_layer():
    """x (9, 16), W_Q and W_O (16, 16), 4 query heads of d_k 4; W_K, W_V for 2 kv heads (16, 8)."""
    rng = np.random.default_rng(18)
    x = rng.standard_normal((9, 16)).astype(np.float32)
    w_q, w_o = (rng.standard_normal((2, 16, 16)) / 4).astype(np.float32)
    w_k, w_v = (rng.standard_normal((2, 16, 8)) / 4).astype(np.float32)
    return x, (w_q, w_k, w_v, w_o)


def test_numpy_decoding_with_shared_kv_heads_equals_a_layer_with_repeated_weights(gqa_layer):
    x, (w_q, w_k, w_v, w_o) = gqa_layer
    got = kv_cache.decode_layer_numpy(x, w_q, w_k, w_v, w_o, 4, n_kv_head=2)
    want = reference.multi_head_attention(x, w_q, expanded(w_k, 2, 2), expanded(w_v, 2, 2), w_o, 4)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-12)           # both float64


@pytest.mark.parametrize("n_kv_head, n_prompt, version", [(2, 4, 2), (2, 1, 1), (1, 5, 2)])
def test_device_decoding_with_shared_kv_heads_equals_one_causal_pass(n_kv_head, n_prompt, version):
    rng = np.random.default_rng(n_kv_head)
    x = rng.standard_normal((9, 16)).astype(np.float32)
    w_q, w_o = (rng.standard_normal((2, 16, 16)) / 4).astype(np.float32)
    w_k, w_v = (rng.standard_normal((2, 16, 4 * n_kv_head)) / 4).astype(np.float32)
    got = kv_cache.generate_layer_outputs(x, w_q, w_k, w_v, w_o, 4, n_prompt=n_prompt, version=version,
                                          n_kv_head=n_kv_head)
    group = 4 // n_kv_head
    want = reference.multi_head_attention(x, w_q, expanded(w_k, n_kv_head, group),
                                          expanded(w_v, n_kv_head, group), w_o, 4)
    # float32 projections, attention and W_O against float64: errors of a few 1e-7.
    assert got.dtype == np.float32 and got.shape == (9, 16)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5), np.abs(got - want).max()


def test_a_gqa_prefill_fills_only_the_kv_heads(gqa_layer):
    x, (w_q, w_k, w_v, w_o) = gqa_layer
    cache = KVCache(4, 9, 4, n_kv_head=2)
    kv_cache.prefill(x[:3], w_q, w_k, w_v, w_o, cache)
    assert cache.length == 3 and cache.keys.shape == (2, 3, 4)
    assert np.allclose(cache.keys, reference.split_heads(reference.project(x[:3], w_k), 2), rtol=1e-5, atol=1e-6)
    assert np.allclose(cache.values, reference.split_heads(reference.project(x[:3], w_v), 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("change, says", [
    (dict(n_kv_head=3), r"n_kv_head must be a positive int dividing n_head = 4, got 3"),
    (dict(w_k=np.zeros((16, 16))), r"w_k must have shape \(16, 8\) \(d_model = the last axis of x, n_kv_head \* d_k\), got \(16, 16\)"),
    (dict(w_v=np.zeros((16, 4))), r"w_v must have shape \(16, 8\) .* got \(16, 4\)"),
])
def test_bad_gqa_layer_arguments_name_the_argument(gqa_layer, change, says):
    x, (w_q, w_k, w_v, w_o) = gqa_layer
    args = dict(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, n_head=4, n_kv_head=2) | change
    with pytest.raises(ValueError, match=f"^{says}$"):
        kv_cache.generate_layer_outputs(x, **args)


def test_version_1_refuses_a_group_larger_than_a_block():
    cache = KVCache(2048, 2, 1, n_kv_head=1)             # 2,048 query heads on one kv head
    cache.append(np.zeros((1, 1, 1)), np.zeros((1, 1, 1)))
    with pytest.raises(ValueError, match=r"^version 1 runs a block of n_head // n_kv_head threads, at most 1024: "
                                         r"cache has 2048; use version 2$"):
        kv_cache.decode_step(np.zeros((2048, 1)), cache, version=1)
