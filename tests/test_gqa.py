"""Grouped-query attention: H query heads share H_kv key/value heads, query head h reading
key/value head h // (H / H_kv). The reference, the unfused pipeline, the fused kernels v1, v2 and
v3 (output and log-sum-exp), their counted K/V loads, multi-head attention with n_kv_head, and
the errors for shapes that are not grouped-query shapes."""

import math

import attention_lib
import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import traffic
from attention_lib.stages import attention, flash, multihead, scores, weighted_sum


def qkv(rng, lead, n_head, n_kv_head, t_q, t_k, d_k):
    """q (*lead, n_head, T_q, d_k), k and v (*lead, n_kv_head, T_k, d_k) float32."""
    return (rng.standard_normal((*lead, n_head, t_q, d_k)).astype(np.float32),
            rng.standard_normal((*lead, n_kv_head, t_k, d_k)).astype(np.float32),
            rng.standard_normal((*lead, n_kv_head, t_k, d_k)).astype(np.float32))


def per_head_reference(q, k, v, causal):
    """Attention head by head, query head h against key/value head h // group: the definition."""
    group = q.shape[-3] // k.shape[-3]
    return np.stack([reference.attention(q[..., h, :, :], k[..., h // group, :, :], v[..., h // group, :, :], causal)
                     for h in range(q.shape[-3])], axis=-3)


def assert_close_float32(got, want):
    """float32 kernels against the float64 reference: errors near 1e-7 sqrt(T_k) for values of
    order 1, as in test_flash; 1e-5 leaves a tenfold margin, a wrong head moves outputs by 1e-1."""
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), np.abs(got - want).max()


# --- The reference -------------------------------------------------------------------------

@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_the_reference_reads_kv_head_h_over_the_group(rng, n_kv_head):
    q, k, v = qkv(rng, (2,), 4, n_kv_head, 7, 9, 5)
    for causal in (True, False):
        got = reference.attention(q, k, v, causal)
        assert got.shape == (2, 4, 7, 5)
        assert np.allclose(got, per_head_reference(q, k, v, causal), rtol=1e-13, atol=1e-14)
    weights = reference.attention_weights(q, k)                          # (2, 4, 7, 9)
    assert np.allclose(weights[:, 3], reference.attention_weights(q[:, 3], k[:, 3 // (4 // n_kv_head)]))


def test_reference_multi_head_attention_with_one_kv_head_is_multi_query(rng):
    x = rng.standard_normal((5, 8))
    w_q, w_o = rng.standard_normal((2, 8, 8))
    w_k, w_v = rng.standard_normal((2, 8, 2))                            # one head of d_k 2
    got = reference.multi_head_attention(x, w_q, w_k, w_v, w_o, 4, n_kv_head=1)
    # Multi-query by hand: every query head against the same K = x W_K, V = x W_V.
    q = reference.split_heads(x @ w_q, 4)                                # (4, 5, 2)
    heads = [reference.attention(q[h], x @ w_k, x @ w_v) for h in range(4)]
    assert np.allclose(got, np.concatenate(heads, axis=-1) @ w_o, rtol=1e-12, atol=1e-12)


# --- The fused kernels ----------------------------------------------------------------------

# (lead, H, H_kv, T_q, T_k, d_k): one position; T 7 and 19 (partial tiles), 33 (tiles plus one);
# T_q < T_k (the last queries, as with a cache); a batch axis before the heads.
CASES = [((), 4, 2, 1, 1, 5), ((), 4, 1, 7, 7, 16), ((), 4, 4, 19, 19, 5), ((), 4, 2, 33, 33, 5),
         ((), 4, 1, 7, 19, 5), ((2,), 4, 2, 19, 19, 16)]
V3_CASES = [CASES[1], CASES[4], CASES[5]]        # v3 simulates slowly: one of each kind
# v3's grouped kernel (more rows than one slice): 4 slices and a second block of 104 rows; group 3
# with a batch axis and T_q < T_k (75 rows: 2 slices, the second of 11 rows); d_k 100 (slices of
# 32 rows, 66 KB of shared memory: past the 48 KB a GPU gives without raising the kernel's limit).
V3_GROUPED_CASES = [((), 12, 1, 30, 30, 5), ((2,), 6, 2, 25, 30, 8), ((), 4, 1, 20, 20, 100)]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("version, case", [(v, c) for v in (1, 2) for c in CASES]
                         + [(3, c) for c in V3_CASES + V3_GROUPED_CASES], ids=lambda x: str(x))
def test_fused_kernels_equal_the_reference(rng, version, case, causal):
    lead, n_head, n_kv_head, t_q, t_k, d_k = case
    q, k, v = qkv(rng, lead, n_head, n_kv_head, t_q, t_k, d_k)
    got, lse = flash.flash_attention(q, k, v, causal, version=version, return_lse=True)
    assert_close_float32(got, per_head_reference(q, k, v, causal))
    s = reference.scores(q, reference.share_kv_heads(k, q))
    s = reference.apply_causal_mask(s) if causal else s
    want = np.log(np.exp(s).sum(axis=-1))                                # no row is fully masked here
    assert lse.shape == got.shape[:-1] and np.allclose(lse, want, rtol=1e-5, atol=1e-5)


def test_v2_splits_a_large_group_over_blocks_of_eight_heads(rng):
    q, k, v = qkv(rng, (), 16, 1, 7, 7, 5)                               # multi-query, 16 heads
    assert flash.flash_grid(16, 7, 2, group=16) == ((1, 2), (flash.BLOCK_Q, 8))
    assert_close_float32(flash.flash_attention(q, k, v, version=2), per_head_reference(q, k, v, True))


@pytest.mark.parametrize("group", [2, 4])
def test_v2_with_several_heads_a_block_has_no_race(group):
    from attention_lib.measure import sanitizer
    q, k, v = qkv(np.random.default_rng(5), (), 4, 4 // group, 33, 33, 5)   # three key tiles, two query blocks
    args = (q, k, v, flash.flash_scale(2, 5), True, np.int32(0), np.int32(group),
            np.zeros((4, 33, 5), np.float32), np.zeros((4, 33), np.float32))
    races = sanitizer.find_races(flash.flash_attention_kernel_v2, *flash.flash_grid(4, 33, 2, group=group), *args)
    assert races == [], [str(r) for r in races]
    assert_close_float32(args[7], per_head_reference(q, k, v, True))


# --- K and V loaded once per group (v2) or per block of the group's rows (v3), counted ----

def counted_loads(version, group, causal=True, t=19, d_k=5):
    """Loads of k and v counted by the sanitizer for 4 query heads sharing 4 / group K/V heads:
    (loads per element of k, of v, the whole report's k and v totals)."""
    q, k, v = qkv(np.random.default_rng(3), (), 4, 4 // group, t, t, d_k)
    report, out = traffic.count_fused(q, k, v, causal, version)
    assert_close_float32(out, per_head_reference(q, k, v, causal))
    return report.loads("k"), report.loads("v")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_v2_loads_each_kv_tile_once_for_the_whole_group(causal):
    base_k, base_v = counted_loads(2, 1, causal)                         # 4 heads, no sharing
    for group in (2, 4):
        k_loads, v_loads = counted_loads(2, group, causal)
        # Per element the same as one head without GQA; in all, group times fewer loads.
        assert np.array_equal(k_loads, base_k[:4 // group]) and np.array_equal(v_loads, base_v[:4 // group])
        assert k_loads.sum() * group == base_k.sum() and v_loads.sum() * group == base_v.sum()
        want = flash.flash_traffic(19, 19, 5, causal=causal, version=2, group=group)
        assert k_loads.sum() == (4 // group) * want["k"] and v_loads.sum() == (4 // group) * want["v"]


def test_v1_reads_the_shared_head_once_per_query_head():
    base_k, _ = counted_loads(1, 1)
    k_loads, v_loads = counted_loads(1, 2)
    # Two query heads read each K/V head: twice the loads per element, the same in all.
    assert np.array_equal(k_loads, 2 * base_k[:2]) and k_loads.sum() == base_k.sum()
    want = flash.flash_traffic(19, 19, 5, causal=True, version=1, group=2)
    assert k_loads.sum() == 2 * want["k"] and v_loads.sum() == 2 * want["v"]


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_v3_packs_the_group_into_its_rows_and_shares_each_tile_it_loads(causal):
    base_k, base_v = counted_loads(3, 1, causal)                         # 4 heads of T 19: a block each
    # group 2: a kv head's 2 x 19 rows fit one slice of 64; group 4: 76 rows, the grouped
    # kernel's two slices of one block. Either block loads each element once, like one head.
    for group in (2, 4):
        k_loads, v_loads = counted_loads(3, group, causal)
        assert np.array_equal(k_loads, base_k[:4 // group]) and np.array_equal(v_loads, base_v[:4 // group])
        want = flash.flash_traffic(19, 19, 5, causal=causal, version=3, group=group)
        assert k_loads.sum() == (4 // group) * want["k"] and v_loads.sum() == (4 // group) * want["v"]


def v3_loads(q, k, v, kernel, slices=None):
    """K loads of one v3 launch of `kernel` (in `slices` slices, by default v3_slices') on NumPy q,
    k, v (BH, T, d), counted, its output checked."""
    from attention_lib.measure import sanitizer
    (bh, t, d), group = q.shape, q.shape[0] // k.shape[0]
    out, lse = np.zeros((bh, t, d), np.float32), np.zeros((bh, t), np.float32)
    grid, block, nbytes = flash.launch_config(kernel, 3, bh, t, d, group, slices)
    report = sanitizer.count_memory(kernel, grid, block, q, k, v, flash.flash_scale(3, d), True, np.int32(0),
                                    np.int32(group), out, lse, sharedmem=nbytes)
    assert_close_float32(out, per_head_reference(q, k, v, True))
    return int(report.loads("k").sum())


def test_at_long_contexts_the_grouped_kernel_loads_k_as_one_head_alone_does():
    """4 query heads on one K/V head, T 40: the grouped kernel's 3 slices hold all 160 rows in one
    block, which loads K as one head alone does; in one slice, packing alone, the 160 rows take 3
    blocks of 16 queries, each loading its band."""
    q, k, v = qkv(np.random.default_rng(8), (), 4, 1, 40, 40, 5)
    assert flash.v3_slices(40, 4, 5) == 3
    alone = flash.flash_traffic(40, 40, 5, version=3)["k"]               # one head, no group
    grouped = v3_loads(q, k, v, flash.make_flash_v3(5, grouped=True))
    assert grouped == alone == flash.flash_traffic(40, 40, 5, version=3, group=4)["k"]
    one_slice = v3_loads(q, k, v, flash.make_flash_v3(5, grouped=True), slices=1)
    assert one_slice == flash.flash_traffic(40, 40, 5, version=3, group=4, block_q=64)["k"] > alone


def test_v3s_one_head_kernel_refuses_shared_heads(rng):
    """The one-head kernel reads K/V head h for query head h; with a group it would read the wrong
    head, so flash_attention refuses it in one line, naming the kernel to pass instead."""
    q, k, v = qkv(rng, (), 4, 2, 7, 7, 5)
    raises_one_line(ValueError, r"^kernel: v3's one-head kernel reads a key/value head per query head, but q "
                    r"has 2 query heads per key/value head; pass its grouped kernel, make_flash_v3\(d_k, grouped=True\)$",
                    lambda: flash.flash_attention(q, k, v, version=3, kernel=flash.make_flash_v3(5)))
    assert_close_float32(flash.flash_attention(q, k, v, version=3, kernel=flash.make_flash_v3(5, grouped=True)),
                         per_head_reference(q, k, v, True))


def test_v3_grid_runs_over_kv_heads_and_blocks_of_the_groups_rows():
    assert flash.flash_grid(12, 19, 3, d_k=64, group=4) == ((2, 3), flash.THREADS_V3)   # 76 rows: 2 blocks
    assert flash.flash_grid(12, 1, 3, d_k=64, group=12) == ((1, 1), flash.THREADS_V3)  # a decoding step
    assert flash.flash_grid(12, 19, 3, d_k=64, group=4, slices=2) == ((1, 3), (flash.THREADS_V3, 2))
    assert flash.flash_grid(12, 100, 3, d_k=128, group=12, slices=4) == ((10, 1), (flash.THREADS_V3, 4))


def test_the_grouped_kernel_takes_a_slice_per_head_where_rows_fill_them(monkeypatch):
    assert [flash.v3_slices(1, g) for g in (1, 4, 12)] == [1, 1, 1]       # decoding: one slice holds the group
    assert [flash.v3_slices(64, g) for g in (1, 2, 3, 4, 12)] == [1, 2, 3, 4, 4]
    assert flash.v3_slices(20, 4) == 2                                  # 80 rows fill two slices of 64
    assert flash.v3_slices(20, 4, d_k=100) == 3                         # and three of 32
    assert flash.fused_kernel(3, 64, 2, 64) is flash.flash_attention_kernel_v3_grouped
    assert flash.fused_kernel(3, 32, 2, 64) is flash.flash_attention_kernel_v3_grouped   # one slice
    assert flash.fused_kernel(3, 64, 1, 64) is flash.flash_attention_kernel_v3
    # A device whose block holds less shared memory gets fewer slices (80 KB: 2 at d_k 64).
    from attention_lib.platform import dynamic_shared
    monkeypatch.setattr(dynamic_shared, "largest_block_bytes", lambda: 80 * 1024)
    assert flash.v3_slices(64, 4) == 2 and 4 * flash.v3_shared_words(64, 2) <= 80 * 1024 < 4 * flash.v3_shared_words(64, 3)


def test_the_grouped_kernels_shared_memory_is_all_it_needs():
    """2 slices at d_k 64: K (32 x 65) and V (32 x 64), then per slice Q (64 x 65) and P (64 x 40)
    = 17,568 words; one word less and the last view does not fit."""
    assert flash.v3_shared_words(64, 2) == 32 * 65 + 32 * 64 + 2 * 64 * (65 + 40) == 17_568
    q, k, v = qkv(np.random.default_rng(9), (), 3, 1, 23, 23, 5)       # 69 rows: 2 slices
    kernel = flash.make_flash_v3(5, grouped=True)
    grid, block, nbytes = flash.launch_config(kernel, 3, 3, 23, 5, 3)
    assert block == (flash.THREADS_V3, 2) and nbytes == 4 * flash.v3_shared_words(5, 2)
    args = (q, k, v, flash.flash_scale(3, 5), True, np.int32(0), np.int32(3),
            np.zeros((3, 23, 5), np.float32), np.zeros((3, 23), np.float32))
    from attention_lib.platform import dynamic_shared
    from attention_lib.measure import sanitizer
    with pytest.raises(ValueError):                    # simulated, on a GPU machine too
        sanitizer.run(kernel, grid, block, *args, sharedmem=nbytes - 4)
    dynamic_shared.launch(kernel, grid, block, nbytes, *args)   # on a GPU: past 48 KB, the limit raised first
    assert_close_float32(args[7], per_head_reference(q, k, v, True))


# --- The unfused pipeline and the stage launchers -------------------------------------------

@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_the_pipeline_and_its_weights_equal_the_reference(rng, n_kv_head):
    q, k, v = qkv(rng, (), 4, n_kv_head, 7, 19, 5)                     # T_q < T_k: the last queries
    for causal in (True, False):
        assert_close_float32(attention.attention(q, k, v, causal), per_head_reference(q, k, v, causal))
    a = attention.attention_weights(q, k)
    assert np.allclose(a, reference.attention_weights(q, k), rtol=1e-5, atol=1e-6)


def test_scores_and_weighted_sum_take_one_kv_head_per_query_head(rng):
    # Their kernels read head h of k (of v) for head h of q (of a): a grouped-query shape is
    # refused with the plain message, not read wrongly.
    q, k, v = qkv(rng, (), 4, 2, 7, 19, 5)
    raises_one_line(ValueError, r"^k must have the leading axes of q \(4,\); got shape \(2, 19, 5\)$",
                    lambda: scores.scores(q, k))
    a = reference.attention_weights(q, k).astype(np.float32)             # (4, 7, 19)
    raises_one_line(ValueError, r"^v must have the leading axes of a \(4,\); got shape \(2, 19, 5\)$",
                    lambda: weighted_sum.weighted_sum(a, v))


def test_the_device_copies_give_each_query_head_its_kv_head(rng):
    from numba import cuda
    k = rng.standard_normal((3, 4, 2)).astype(np.float32)
    shared = attention.share_kv_heads(cuda.to_device(k), 6).copy_to_host()
    assert np.array_equal(shared, k[[0, 0, 1, 1, 2, 2]])


# --- Multi-head attention with n_kv_head ----------------------------------------------------

@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_multi_head_attention_with_n_kv_head_equals_the_reference(rng, n_kv_head):
    d_model, n_head = 12, 4                                              # d_k 3
    x = rng.standard_normal((7, d_model))
    w_q, w_o = rng.standard_normal((2, d_model, d_model)) / 3
    w_k, w_v = rng.standard_normal((2, d_model, n_kv_head * 3)) / 3
    b_k, b_v = rng.standard_normal((2, n_kv_head * 3))
    got = multihead.multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, b_k=b_k, b_v=b_v, n_kv_head=n_kv_head)
    want = reference.multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, b_k=b_k, b_v=b_v, n_kv_head=n_kv_head)
    assert got.dtype == np.float32 and np.allclose(got, want, rtol=1e-5, atol=1e-5), np.abs(got - want).max()


def raises_one_line(error, pattern, call):
    with pytest.raises(error, match=pattern) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_multi_head_attention_names_a_wrong_kv_width_or_head_count(rng):
    x, w = rng.standard_normal((7, 12)), rng.standard_normal((12, 12))
    narrow = rng.standard_normal((12, 6))                                # 2 heads of d_k 3
    raises_one_line(ValueError, r"^w_k must have shape \(12, 3\) \(d_model = the last axis of x, "
                    r"n_kv_head \* d_k = 1 x 3\), got \(12, 6\)$",
                    lambda: multihead.multi_head_attention(x, w, narrow, narrow, w, 4, n_kv_head=1))
    raises_one_line(ValueError, r"^b_v must have shape \(6,\) .* got \(12,\)$",
                    lambda: multihead.multi_head_attention(x, w, narrow, narrow, w, 4, n_kv_head=2, b_v=np.zeros(12)))
    raises_one_line(ValueError, r"^n_kv_head 3 must divide n_head 4 ",
                    lambda: multihead.multi_head_attention(x, w, narrow, narrow, w, 4, n_kv_head=3))
    raises_one_line(TypeError, r"^n_kv_head must be a positive int, got float 2.0$",
                    lambda: multihead.multi_head_attention(x, w, narrow, narrow, w, 4, n_kv_head=2.0))


# --- Shapes that are not grouped-query shapes -----------------------------------------------

GQA_CALLS = {
    "flash v2": lambda q, k, v: flash.flash_attention(q, k, v, version=2),
    "flash v3": lambda q, k, v: flash.flash_attention(q, k, v, version=3),
    "attention": lambda q, k, v: attention.attention(q, k, v),
    "attention_weights": lambda q, k, v: attention.attention_weights(q, k),
    "scores": lambda q, k, v: scores.scores(q, k),
}


@pytest.mark.parametrize("name", list(GQA_CALLS))
def test_h_not_a_multiple_of_h_kv_is_refused_naming_k(name):
    q, k = np.zeros((2, 4, 3, 5), np.float32), np.zeros((2, 3, 6, 5), np.float32)
    raises_one_line(ValueError, r"^k must have shape \(2, 'H_kv', 6, 5\) with H_kv one of 1, 2, 4 "
                    r"\(a divisor of q's 4 heads on axis -3\); got shape \(2, 3, 6, 5\)$",
                    lambda: GQA_CALLS[name](q, k, k))


@pytest.mark.parametrize("name", list(GQA_CALLS))
def test_other_leading_axes_must_be_equal(name):
    q, k = np.zeros((2, 4, 3, 5), np.float32), np.zeros((3, 2, 6, 5), np.float32)
    raises_one_line(ValueError, r"^k must have the leading axes of q \(2, 4\); got shape \(3, 2, 6, 5\)$",
                    lambda: GQA_CALLS[name](q, k, k))


def test_v_must_have_the_heads_of_k_not_of_q():
    q, k, v = np.zeros((4, 3, 5)), np.zeros((2, 6, 5)), np.zeros((4, 6, 5))
    for call in (GQA_CALLS["flash v2"], GQA_CALLS["attention"]):
        raises_one_line(ValueError, r"^v must have shape \(2, 6\) \+ \(d_v,\) \(the leading axes and T_k of k\); "
                        r"got shape \(4, 6, 5\)$", lambda: call(q, k, v))


def test_the_backward_pass_names_k_when_its_heads_do_not_divide_qs():
    from attention_lib.stages import backward
    q, k = np.zeros((4, 3, 5)), np.zeros((3, 3, 5))
    raises_one_line(ValueError, r"^k must have shape \('H_kv', 3, 5\) with H_kv one of 1, 2, 4 ",
                    lambda: backward.attention_backward(q, k, k, q))


def test_the_simulator_budget_counts_the_query_heads(monkeypatch):
    from attention_lib.platform import launch
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    monkeypatch.delenv(launch.ALLOW_SLOW_VARIABLE, raising=False)
    q, k = np.zeros((32, 1024, 64), np.float32), np.zeros((8, 1024, 64), np.float32)   # 32 heads, 8 kv heads
    with pytest.raises(ValueError, match=r"^flash_attention: .* CUDA threads would take about"):
        flash.flash_attention(q, k, k, version=2)
    with pytest.raises(ValueError, match=r"^attention: .* CUDA threads would take about"):
        attention.attention(q, k, k)
    assert math.prod(flash.flash_grid(32, 1024, 2, group=4)[0]) * flash.BLOCK_Q * 4 == 32 * 1024


# --- The backward pass with shared K/V heads ---------------------------------------------------

# (lead, H, H_kv, T_q, T_k, d_k, d_v, causal): partial tiles both ways; a batch axis and group 3;
# multi-query (one K/V head) without the mask.
BACKWARD_CASES = [((), 4, 2, 7, 9, 5, 3, True), ((2,), 3, 1, 11, 13, 6, 5, True), ((), 4, 1, 13, 13, 3, 4, False)]


def backward_inputs(rng, case):
    lead, n_head, n_kv_head, t_q, t_k, d_k, d_v, causal = case
    q, k, v = (rng.standard_normal((*lead, h, t, d)) for h, t, d in
               ((n_head, t_q, d_k), (n_kv_head, t_k, d_k), (n_kv_head, t_k, d_v)))
    return q, k, v, rng.standard_normal((*lead, n_head, t_q, d_v)), causal


def test_numpy_backward_with_shared_heads_equals_finite_differences(rng):
    """The reference's own grouped-query attention, differentiated numerically: a K/V head's
    gradient is what every query head that reads it gives it, summed."""
    from attention_lib.stages import backward
    q, k, v, d_out, causal = backward_inputs(rng, ((), 4, 2, 5, 7, 3, 2, True))
    grads = backward.backward(q, k, v, d_out, causal)
    for i, x in enumerate((q, k, v)):
        def loss(y):
            args = [q, k, v]
            args[i] = y
            return float(np.sum(reference.attention(*args, causal) * d_out))
        numerical = backward.numerical_gradient(loss, x)
        assert grads[i].shape == x.shape and np.allclose(grads[i], numerical, rtol=1e-6, atol=1e-7), i


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=str)
def test_both_backwards_with_shared_heads_equal_the_numpy_gradients(rng, case):
    from attention_lib.stages import backward
    q, k, v, d_out, causal = backward_inputs(rng, case)
    want = backward.backward(q, k, v, d_out, causal)
    out, lse = reference.attention(q, k, v, causal), backward.log_sum_exp(q, k, causal)
    for got in (attention_lib.attention_backward(q, k, v, d_out, causal),
                attention_lib.flash_attention_backward(q, k, v, out, lse, d_out, causal)):
        for g, w in zip(got, want):
            assert g.dtype == np.float32 and g.shape == w.shape
            assert np.allclose(g, w, rtol=1e-4, atol=2e-5), float(np.abs(g - w).max())


def test_a_shared_heads_gradient_is_the_sum_over_its_group(rng):
    """Against the library's own multi-head backward on K and V repeated for every query head:
    dQ the same, dK and dV of a K/V head the sum of its group's copies."""
    q, k, v, d_out, causal = backward_inputs(rng, ((), 6, 2, 7, 7, 4, 3, True))
    dq, dk, dv = attention_lib.attention_backward(q, k, v, d_out)
    dq_1, dk_1, dv_1 = attention_lib.attention_backward(q, np.repeat(k, 3, axis=0), np.repeat(v, 3, axis=0), d_out)
    assert np.allclose(dq, dq_1, rtol=1e-6, atol=1e-7)
    assert np.allclose(dk, dk_1.reshape(2, 3, 7, 4).sum(axis=1), rtol=1e-5, atol=1e-6)
    assert np.allclose(dv, dv_1.reshape(2, 3, 7, 3).sum(axis=1), rtol=1e-5, atol=1e-6)


def test_the_fused_backward_with_shared_heads_equals_pytorch_autograd(rng):
    torch = pytest.importorskip("torch")
    from attention_lib.stages import backward
    q, k, v, d_out, _ = backward_inputs(rng, ((2,), 4, 2, 9, 9, 4, 3, True))
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    out.backward(torch.tensor(d_out))
    got = attention_lib.flash_attention_backward(q, k, v, out.detach().numpy(), backward.log_sum_exp(q, k), d_out)
    for g, w in zip(got, (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy())):
        assert np.allclose(g, w, rtol=1e-4, atol=2e-5), float(np.abs(g - w).max())


# --- Shared K/V heads inside a sliding window -------------------------------------------------

@pytest.mark.parametrize("version", [1, 2, 3])
def test_shared_heads_and_a_window_together_equal_the_per_head_definition(version):
    """Query head h, key/value head h // group, keys i + off - W < j <= i + off: both at once,
    with T_q < T_k, against the reference head by head (each head's own window)."""
    q, k, v = qkv(np.random.default_rng(11), (2,), 4, 2, 13, 19, 5 if version != 3 else 16)
    out, lse = attention_lib.flash_attention(q, k, v, version=version, window=5, return_lse=True)
    group = 2
    want = np.stack([reference.attention(q[:, h], k[:, h // group], v[:, h // group], True, window=5)
                     for h in range(4)], axis=1)
    assert_close_float32(out, want)
    weights_lse = np.stack([np.log(np.exp(reference.scores(q[:, h], k[:, h // group], scale=True)
                                          + np.where(reference.causal_mask(13, 19, 5), 0.0, -np.inf)).sum(-1))
                            for h in range(4)], axis=1)
    assert np.allclose(lse, weights_lse, rtol=1e-5, atol=1e-5)
    if version == 2:                       # each K/V element inside some window: loaded once per group
        report, counted = traffic.count_fused(q.reshape(8, 13, 5), k.reshape(4, 19, 5), v.reshape(4, 19, 5),
                                              version=2, window=5)
        assert_close_float32(counted.reshape(out.shape), out)
        want_k = flash.flash_traffic(13, 19, 5, version=2, window=5, group=group)["k"]
        assert int(report.loads("k").sum()) == 4 * want_k
