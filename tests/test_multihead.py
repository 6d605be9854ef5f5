"""Notebook 06: head split and merge kernels, the heads read in place, the multi-head layer, the W_O sum."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import multihead

# (shape of x, n_head): one element and one head; fewer positions than a block with 3 heads of
# width 5; T 33 (a partly used third block down) with 4 heads of width 6; batched; two leading
# axes (batch x something). Widths not multiples of the 16-wide block.
SPLIT_CASES = [((1, 1), 1), ((7, 15), 3), ((33, 24), 4), ((2, 7, 12), 4), ((2, 2, 5, 6), 3)]


def case_id(case):
    shape, n_head = case
    return "x" + "x".join(map(str, shape)) + f"-h{n_head}"


def random(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


# --- Split and merge ---------------------------------------------------------------------

@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_id)
def test_split_heads_matches_the_reference_exactly(rng, case):
    shape, n_head = case
    x = random(rng, shape)
    got = multihead.split_heads(x, n_head)
    assert got.dtype == np.float32
    # a copy computes nothing, so equality is exact
    assert np.array_equal(got, reference.split_heads(x, n_head))


@pytest.mark.parametrize("case", SPLIT_CASES, ids=case_id)
def test_merge_heads_matches_the_reference_exactly(rng, case):
    shape, n_head = case
    *lead, T, d_model = shape
    heads = random(rng, (*lead, n_head, T, d_model // n_head))
    got = multihead.merge_heads(heads)
    assert got.dtype == np.float32 and got.shape == tuple(shape)
    assert np.array_equal(got, reference.merge_heads(heads))


def test_merge_undoes_split_and_split_undoes_merge(rng):
    x = random(rng, (2, 9, 20))
    heads = multihead.split_heads(x, 4)                    # (2, 4, 9, 5)
    assert heads.shape == (2, 4, 9, 5)
    assert np.array_equal(multihead.merge_heads(heads), x)
    assert np.array_equal(multihead.split_heads(multihead.merge_heads(heads), 4), heads)


def test_head_h_holds_a_contiguous_block_of_columns(rng):
    x = random(rng, (5, 12))
    heads = multihead.split_heads(x, 3)                    # d_k 4
    for h in range(3):
        assert np.array_equal(heads[h], x[:, 4 * h:4 * h + 4])


def test_all_heads_are_one_launch_with_the_head_on_grid_z():
    grid, block = multihead.head_grid(bh=2 * 12, T=1024, d_k=64)    # ANDREA-120M, batch 2
    assert block == multihead.BLOCK
    assert grid == (64 // block[0], 1024 // block[1], 24)
    grid, _ = multihead.head_grid(bh=3, T=33, d_k=5)
    assert grid == (1, 3, 3)                                           # edge blocks partly used


def test_the_kernel_argument_is_launched_the_same_way(rng):
    x = random(rng, (7, 12))
    calls = []

    class Recorder:
        def __getitem__(self, config):
            calls.append(config)
            return lambda *args: multihead.split_heads_kernel[config](*args)

    got = multihead.split_heads(x, 3, kernel=Recorder())
    assert np.array_equal(got, reference.split_heads(x, 3))
    assert calls == [multihead.head_grid(3, 7, 4)]


def test_split_and_merge_move_every_element_once(rng):
    x = random(rng, (2, 7, 12))                            # B 2, n_head 3, d_k 4
    heads = np.zeros((2, 3, 7, 4), np.float32)
    grid, block = multihead.head_grid(6, 7, 4)
    report = sanitizer.count_memory(multihead.split_heads_kernel, grid, block, x, heads)
    assert (report.loads("x") == 1).all() and (report.stores("out") == 1).all()
    assert report.loads("out").sum() == 0 and report.stores("x").sum() == 0
    merged = np.zeros_like(x)
    report = sanitizer.count_memory(multihead.merge_heads_kernel, grid, block, heads, merged)
    assert (report.loads("heads") == 1).all() and (report.stores("out") == 1).all()
    assert np.array_equal(merged, x)


def test_each_head_is_written_by_its_own_grid_layer(rng):
    x = random(rng, (2, 5, 6))                             # B 2, n_head 3, d_k 2
    out = np.zeros((2, 3, 5, 2), np.float32)
    grid, block = multihead.head_grid(6, 5, 2)             # one block per layer: block id = layer
    blocks = sanitizer.thread_map(multihead.split_heads_kernel, grid, block, x, out, by="block")
    b, h = np.indices((2, 3))
    assert np.array_equal(blocks, np.broadcast_to((b * 3 + h)[..., None, None], out.shape))


# --- The output projection as a sum over heads ---------------------------------------------

@pytest.mark.parametrize("n_groups", [None, 1, 2, 4])
def test_concat_times_w_o_is_the_sum_of_per_head_products(rng, n_groups):
    heads = rng.standard_normal((2, 4, 7, 6))              # float64: the identity is exact algebra
    w_o = rng.standard_normal((24, 24))
    partials = multihead.head_partial_outputs(heads, w_o, n_groups)
    assert partials.shape == ((4 if n_groups is None else n_groups), 2, 7, 24)
    # Only the order of the additions differs: a few float64 ulps of sums of about 10.
    assert np.allclose(partials.sum(axis=0), reference.merge_heads(heads) @ w_o, rtol=1e-12, atol=1e-12)


def test_one_head_alone_is_its_own_rows_of_w_o(rng):
    heads = rng.standard_normal((3, 5, 2))
    w_o = rng.standard_normal((6, 4))
    partials = multihead.head_partial_outputs(heads, w_o)
    assert np.allclose(partials[1], heads[1] @ w_o[2:4], rtol=1e-14, atol=0)


def test_head_partial_outputs_refuses_groups_that_do_not_divide_the_heads(rng):
    with pytest.raises(ValueError, match="n_groups 3 must divide n_head 4"):
        multihead.head_partial_outputs(rng.standard_normal((4, 5, 2)), rng.standard_normal((8, 8)), 3)


# --- The whole layer -----------------------------------------------------------------------

def layer(rng, d_model, bias):
    """Random weights of one layer (scaled by 1/sqrt(d_model), as at initialisation) and biases."""
    ws = [random(rng, (d_model, d_model)) / np.float32(np.sqrt(d_model)) for _ in range(4)]
    bs = [random(rng, d_model) if bias else None for _ in range(4)]
    return ws, dict(zip(("b_q", "b_k", "b_v", "b_o"), bs))


# (shape of x, n_head, causal, bias): one position and one head; T 7 with 3 heads of width 5;
# T 17 (a partly used second tile) with 2 heads of 6, causal and not; a batch with 2 heads.
# Small, because every tiled stage waits at barriers that cost milliseconds on the simulator.
LAYER_CASES = [((1, 4), 1, True, False), ((7, 15), 3, True, True), ((17, 12), 2, True, False),
               ((17, 12), 2, False, True), ((2, 9, 8), 2, True, True), ((2, 9, 8), 2, False, False)]


@pytest.mark.parametrize("shape, n_head, causal, bias", LAYER_CASES,
                         ids=["x" + "x".join(map(str, c[0])) + f"-h{c[1]}" + ("-causal" if c[2] else "")
                              + ("-bias" if c[3] else "") for c in LAYER_CASES])
def test_multi_head_attention_matches_the_reference(rng, shape, n_head, causal, bias):
    x = random(rng, shape)
    (w_q, w_k, w_v, w_o), biases = layer(rng, shape[-1], bias)
    got = multihead.multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal, **biases)
    want = reference.multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal, **biases)
    assert got.dtype == np.float32 and got.shape == x.shape
    # Five float32 stages (two projections of d_model <= 15 terms, scores, softmax, a weighted
    # sum) against float64, on values of order 1: errors of a few 1e-7 each; 1e-4 leaves room
    # without hiding a real mistake (a wrong head or mask moves entries by 0.1 or more).
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4), np.abs(got - want).max()


def test_some_biases_only(rng):
    x = random(rng, (7, 12))
    (w_q, w_k, w_v, w_o), _ = layer(rng, 12, False)
    b_v = random(rng, 12)
    got = multihead.multi_head_attention(x, w_q, w_k, w_v, w_o, 3, b_v=b_v)
    want = reference.multi_head_attention(x, w_q, w_k, w_v, w_o, 3, b_v=b_v)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_the_first_position_of_a_causal_layer_sees_only_itself(rng):
    # Position 0 attends only to itself, so its output is (x0 W_V + b_V) W_O + b_O whatever
    # the queries, keys and the rest of the sequence are.
    x = random(rng, (6, 8))
    (w_q, w_k, w_v, w_o), biases = layer(rng, 8, True)
    got = multihead.multi_head_attention(x, w_q, w_k, w_v, w_o, 2, **biases)
    alone = (x[0].astype(np.float64) @ w_v + biases["b_v"]) @ w_o + biases["b_o"]
    assert np.allclose(got[0], alone, rtol=1e-5, atol=1e-5)


# --- Bad input: one-line errors that name the argument ---------------------------------------

@pytest.fixture
def good(rng):
    x = random(rng, (5, 12))
    (w_q, w_k, w_v, w_o), _ = layer(rng, 12, False)
    return dict(x=x, w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, n_head=3)


def raises_one_line(error, match, **kwargs):
    with pytest.raises(error, match=match) as caught:
        multihead.multi_head_attention(**kwargs)
    assert "\n" not in str(caught.value)


def test_split_heads_refuses_a_width_n_head_does_not_divide(rng):
    with pytest.raises(ValueError, match=r"d_model 10 .* not divisible by n_head 3"):
        multihead.split_heads(random(rng, (4, 10)), 3)


def test_split_heads_refuses_a_non_integer_n_head(rng):
    with pytest.raises(TypeError, match="n_head must be a positive int, got float"):
        multihead.split_heads(random(rng, (4, 10)), 2.0)


def test_split_heads_refuses_zero_heads(rng):
    with pytest.raises(ValueError, match="n_head must be a positive int, got 0"):
        multihead.split_heads(random(rng, (4, 10)), 0)


def test_split_heads_refuses_a_vector(rng):
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, d_model\)"):
        multihead.split_heads(random(rng, 10), 2)


def test_merge_heads_refuses_fewer_than_three_axes(rng):
    with pytest.raises(ValueError, match=r"heads must have shape \(\.\.\., n_head, T, d_k\)"):
        multihead.merge_heads(random(rng, (4, 10)))


def test_layer_refuses_x_with_one_axis(good):
    raises_one_line(ValueError, r"x must have shape \(T, d_model\) or \(B, T, d_model\)",
                    **{**good, "x": good["x"][0]})


def test_layer_refuses_x_with_four_axes(good):
    raises_one_line(ValueError, r"x must have shape .* got shape \(1, 1, 5, 12\)",
                    **{**good, "x": good["x"][None, None]})


def test_layer_refuses_nan_in_x(good):
    x = good["x"].copy()
    x[2, 3] = np.nan
    raises_one_line(ValueError, r"x contains nan at index \(2, 3\)", **{**good, "x": x})


def test_layer_refuses_n_head_not_dividing_d_model(good):
    raises_one_line(ValueError, "d_model 12 .* not divisible by n_head 5", **{**good, "n_head": 5})


@pytest.mark.parametrize("name", ["w_q", "w_k", "w_v", "w_o"])
def test_layer_names_the_weight_with_the_wrong_shape(good, name):
    raises_one_line(ValueError, rf"{name} must have shape \(12, 12\) .* got \(12, 4\)",
                    **{**good, name: good[name][:, :4]})


def test_layer_refuses_a_weight_vector(good):
    raises_one_line(ValueError, r"w_k must have shape \(d_model, d_model\) \(2 axes\)",
                    **{**good, "w_k": good["w_k"][0]})


@pytest.mark.parametrize("name", ["b_q", "b_k", "b_v", "b_o"])
def test_layer_names_the_bias_with_the_wrong_shape(good, rng, name):
    raises_one_line(ValueError, rf"{name} must have shape \(12,\) .* got \(13,\)",
                    **{**good, name: random(rng, 13)})


def test_layer_refuses_a_non_boolean_causal(good):
    raises_one_line(TypeError, "causal must be True or False, got str", **{**good, "causal": "yes"})


@pytest.mark.parametrize("kernel", [multihead.split_heads_kernel, multihead.merge_heads_kernel],
                         ids=["split", "merge"])
def test_split_and_merge_have_no_race(rng, kernel):
    heads = random(rng, (2, 3, 19, 5))                     # B 2, n_head 3, T 19 (a partial block), d_k 5
    x = random(rng, (2, 19, 15))
    grid, block = multihead.head_grid(6, 19, 5)
    args = (x, np.zeros_like(heads)) if kernel is multihead.split_heads_kernel else (heads, np.zeros_like(x))
    assert sanitizer.find_races(kernel, grid, block, *args) == []


# --- Every head's weighted sum, V read in place (qkv_av_kernel) ----------------------------

def qkv_av_reference(a, qkv, n_head, n_kv_head):
    """out[b, i, h * d_k + c] = sum_j a[b * n_head + h, i, j] V_g[j, c] in float64, V split off by NumPy."""
    B, T, width = qkv.shape
    d_k = width // (n_head + 2 * n_kv_head)
    v = qkv[:, :, (n_head + n_kv_head) * d_k:].reshape(B, T, n_kv_head, d_k).transpose(0, 2, 1, 3)
    heads = a.reshape(B, n_head, T, T).astype(np.float64) @ v[:, np.arange(n_head) // (n_head // n_kv_head)]
    return reference.merge_heads(heads)                                  # (B, T, n_head * d_k)


def causal_weights(rng, heads, T, causal=True):
    s = rng.standard_normal((heads, T, T))
    return reference.softmax(reference.apply_causal_mask(s) if causal else s).astype(np.float32)


# (B, T, n_head, n_kv_head, d_k, causal): one position; T around the 16-wide tile with widths that
# are not multiples of it; three query tiles; the model's head width; groups of 1, 2 and 3.
AV_CASES = [(1, 1, 1, 1, 1, True), (2, 7, 4, 2, 5, True), (1, 17, 6, 3, 6, True), (1, 15, 3, 1, 17, False),
            (2, 33, 2, 1, 3, True), (1, 20, 2, 2, 64, True), (1, 9, 3, 3, 20, False)]


@pytest.mark.parametrize("B, T, n_head, n_kv_head, d_k, causal", AV_CASES)
def test_qkv_av_matches_the_reference(rng, B, T, n_head, n_kv_head, d_k, causal):
    a = causal_weights(rng, B * n_head, T, causal)
    qkv = random(rng, (B, T, (n_head + 2 * n_kv_head) * d_k))
    got = multihead.qkv_av(a, qkv, n_head, n_kv_head, causal)
    assert got.dtype == np.float32 and got.shape == (B, T, n_head * d_k)
    assert np.allclose(got, qkv_av_reference(a, qkv, n_head, n_kv_head), rtol=1e-5, atol=1e-5)


def test_qkv_av_is_the_layers_weighted_sum(rng):
    """The teaching kernel and the layer's qkv_weighted_sum_kernel compute the same merged output."""
    from numba import cuda
    from attention_lib.stages import weighted_sum
    B, T, n_head, n_kv_head, d_k = 2, 19, 4, 2, 5
    a, qkv = causal_weights(rng, B * n_head, T), random(rng, (B, T, (n_head + 2 * n_kv_head) * d_k))
    layer = cuda.device_array((B, T, n_head * d_k), np.float32)
    grid, block = weighted_sum.weighted_sum_grid(B * n_head, T, d_k)
    multihead.qkv_weighted_sum_kernel[grid, block](cuda.to_device(a), cuda.to_device(qkv), n_head, n_kv_head, True,
                                                   layer)
    assert np.allclose(multihead.qkv_av(a, qkv, n_head, n_kv_head, True), layer.copy_to_host(), rtol=1e-6, atol=1e-6)


def test_qkv_av_reads_each_value_once_per_query_tile_and_no_tile_after_the_diagonal(rng):
    """Counted by the trace at T 33 (three query tiles), 2 query heads on one V head, causal: V's rows
    in key tile k are read by the query tiles k and after, by both query heads; a is read once per
    tile of columns (one here), and never right of the diagonal's tiles."""
    from attention_lib.measure.trace import Traced
    B, T, n_head, n_kv_head, d_k = 1, 33, 2, 1, 5
    a, qkv = causal_weights(rng, n_head, T), random(rng, (B, T, (n_head + 2 * n_kv_head) * d_k))
    out = np.zeros((B, T, n_head * d_k), np.float32)
    traced = Traced(multihead.qkv_av_kernel, *multihead.qkv_av_grid(B, T, n_head, d_k), a, qkv, n_head, n_kv_head,
                    True, out)
    assert np.allclose(out, qkv_av_reference(a, qkv, n_head, n_kv_head), rtol=1e-5, atol=1e-5)
    v0 = (n_head + n_kv_head) * d_k                                     # V's first column
    v_reads = traced.loads("qkv")[0, :, v0:].max(axis=1)                # per key row, V's columns only
    assert traced.loads("qkv")[0, :, :v0].sum() == 0                    # Q's and K's columns never read
    assert list(v_reads) == [n_head * (3 - j // 16) for j in range(T)]
    i, j = np.indices((T, T))
    assert traced.loads("a").max() == 1 and traced.loads("a")[:, j // 16 > i // 16].sum() == 0
    assert traced.barriers == 2 * 3


def test_qkv_av_refuses_weights_that_do_not_match_qkv(rng):
    qkv = random(rng, (2, 7, 40))
    with pytest.raises(ValueError,
                       match=r"^a must have shape \(B \* n_head, T, T\) = \(8, 7, 7\); got shape \(4, 7, 7\)$"):
        multihead.qkv_av(causal_weights(rng, 4, 7), qkv, 4, 2, True)


def test_qkv_av_refuses_a_width_the_heads_do_not_divide(rng):
    with pytest.raises(ValueError, match=r"^qkv must have a last axis of \(n_head \+ 2 n_kv_head\) d_k"):
        multihead.qkv_av(causal_weights(rng, 8, 7), random(rng, (2, 7, 41)), 4, 2, True)


def test_qkv_av_refuses_causal_weights_above_the_diagonal(rng):
    with pytest.raises(ValueError, match=r"^a must be 0 where j > i when causal=True$"):
        multihead.qkv_av(causal_weights(rng, 4, 7, causal=False), random(rng, (1, 7, 40)), 4, 2, True)


def test_qkv_av_refuses_a_group_that_does_not_divide(rng):
    with pytest.raises(ValueError, match=r"n_kv_head 3 must divide n_head 4"):
        multihead.qkv_av(causal_weights(rng, 4, 7), random(rng, (1, 7, 40)), 4, 3, True)
