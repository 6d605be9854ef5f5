"""Notebook 05: scaled dot-product attention assembled from the stage kernels, against NumPy and
PyTorch; its weights, the causal mask's guarantee, bad inputs."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.stages import attention

# (leading axes, T_q, T_k, d_k, d_v): one position; d_k 5 with d_v 24 (two tiles, the second
# partly used); T 33 (two tiles and one more) with d_k 24; batch x heads; T_q < T_k (the queries
# are the last positions, as when decoding); T_q > T_k (causal: the first queries see no key).
AWKWARD = [((), 1, 1, 5, 5), ((), 7, 7, 5, 24), ((), 33, 33, 24, 5), ((2, 3), 7, 7, 5, 5),
           ((), 5, 9, 5, 7), ((), 9, 5, 24, 3)]


def qkv(rng, lead, t_q, t_k, d_k, d_v):
    q = rng.standard_normal((*lead, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((*lead, t_k, d_k)).astype(np.float32)
    v = rng.standard_normal((*lead, t_k, d_v)).astype(np.float32)
    return q, k, v


def assert_matches_reference(got, q, k, v, causal):
    """Three float32 stages against float64: the scores sum d_k products, the softmax and the
    weighted sum T_k terms each, all of order 1; errors around 1e-7 (measured up to 5e-7 at
    these sizes). rtol = atol = 1e-5 leaves room without hiding a wrong scale or mask."""
    want = reference.attention(q, k, v, causal)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), np.abs(got - want).max()


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "not_causal"])
@pytest.mark.parametrize("lead, t_q, t_k, d_k, d_v", AWKWARD, ids=str)
def test_attention_matches_the_reference(rng, lead, t_q, t_k, d_k, d_v, causal):
    q, k, v = qkv(rng, lead, t_q, t_k, d_k, d_v)
    assert_matches_reference(attention.attention(q, k, v, causal=causal), q, k, v, causal)


def test_the_pipeline_with_the_gpus_softmax_gives_the_same(rng, monkeypatch):
    # On a GPU the pipeline uses softmax version 2; run that path here too, at a small size.
    q, k, v = qkv(rng, (2,), 5, 6, 3, 4)
    with_v1 = attention.attention(q, k, v)
    monkeypatch.setattr(attention, "SOFTMAX_VERSION", 2)
    with_v2 = attention.attention(q, k, v)
    assert_matches_reference(with_v2, q, k, v, causal=True)
    assert np.allclose(with_v1, with_v2, rtol=1e-6, atol=1e-6)


def test_the_pipelines_weights_are_the_reference_weights_and_rows_sum_to_one(rng):
    q, k, _ = qkv(rng, (2,), 9, 5, 5, 1)          # 9 queries, 5 keys: queries 0-3 see no key
    a = attention.attention_weights(q, k, causal=True)
    assert a.dtype == np.float32 and a.shape == (2, 9, 5)
    assert np.allclose(a, reference.attention_weights(q, k, causal=True), rtol=1e-5, atol=1e-6)
    assert (a >= 0).all()
    sums = a.sum(axis=-1)
    assert np.allclose(sums[:, 4:], 1.0, atol=1e-6)     # every query that sees a key: sum 1
    assert (a[:, :4] == 0).all()                         # the others attend to nothing, not NaN
    assert (a[..., ~reference.causal_mask(9, 5)] == 0).all()          # the future gets exactly 0
    full = attention.attention_weights(q, k, causal=False)
    assert np.allclose(full.sum(axis=-1), 1.0, atol=1e-6) and (full > 0).all()


def test_a_query_that_sees_no_key_gets_a_zero_output(rng):
    q, k, v = qkv(rng, (), 4, 2, 3, 3)             # queries 0 and 1 come before every key
    out = attention.attention(q, k, v, causal=True)
    assert not np.isnan(out).any() and (out[:2] == 0).all()


def test_no_future_leak(rng):
    # Causal: output i depends on keys and values 0..i only. Change every key and value after
    # position m: rows 0..m stay exactly the same (their weights there are exactly 0), the rest change.
    t, m = 7, 3
    q, k, v = qkv(rng, (), t, t, 5, 4)
    before = attention.attention(q, k, v, causal=True)
    k2, v2 = k.copy(), v.copy()
    k2[m + 1:] = rng.standard_normal(k2[m + 1:].shape)
    v2[m + 1:] = 10 + rng.standard_normal(v2[m + 1:].shape)
    after = attention.attention(q, k2, v2, causal=True)
    assert np.array_equal(before[:m + 1], after[:m + 1])
    assert not np.isclose(before[m + 1:], after[m + 1:]).any()
    # Without the mask every position sees the future, so every row changes.
    open_before = attention.attention(q, k, v, causal=False)
    open_after = attention.attention(q, k2, v2, causal=False)
    assert not np.isclose(open_before, open_after).any()


def test_causal_queries_are_the_last_positions(rng):
    # 4 queries against 9 keys: the same as the last 4 rows of 9 queries against 9 keys.
    q, k, v = qkv(rng, (), 9, 9, 5, 3)
    assert np.allclose(attention.attention(q[-4:], k, v), attention.attention(q, k, v)[-4:],
                       rtol=1e-6, atol=1e-6)


def test_scaling_the_inputs_like_the_formula(rng):
    # Scaling q by sqrt(d_k) undoes the 1/sqrt(d_k): the result is softmax(q k^T) v.
    q, k, v = qkv(rng, (), 6, 6, 4, 3)
    got = attention.attention(q * np.float32(2.0), k, v, causal=False)   # sqrt(4) = 2
    want = reference.softmax(reference.scores(q, k, scale=False)) @ v
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lead, t_q, t_k, causal", [((2, 3), 7, 7, True), ((2, 3), 7, 7, False),
                                                    ((1, 2), 5, 9, True), ((3,), 9, 4, False)], ids=str)
def test_attention_matches_pytorch(rng, lead, t_q, t_k, causal):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    q, k, v = qkv(rng, lead, t_q, t_k, 5, 6)
    got = attention.attention(q, k, v, causal=causal)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    if causal and t_q != t_k:
        # is_causal=True aligns the queries with the first keys (top-left); the library puts them
        # at the last positions, so pass that mask explicitly (True: may attend).
        allowed = torch.from_numpy(reference.causal_mask(t_q, t_k))
        want = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=allowed)
    else:
        want = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    # Both float32, different summation orders (PyTorch's CPU kernel may use an online
    # softmax): a few float32 ulps of values of order 1, so 1e-5.
    assert np.allclose(got, want.numpy(), rtol=1e-5, atol=1e-5), np.abs(got - want.numpy()).max()


@pytest.mark.parametrize("call, error, message", [
    (lambda q, k, v: attention.attention(q[0, 0], k, v), ValueError,
     r"^q must have shape \(\.\.\., T_q, d_k\) \(at least 2 axes\), got shape \(5,\)$"),
    (lambda q, k, v: attention.attention(q, k[None], v), ValueError,
     r"^k must have the leading axes of q \(2,\); got shape \(1, 2, 6, 5\)$"),
    (lambda q, k, v: attention.attention(q, k[:1], v), ValueError,   # one kv head for 2 query heads, but v has 2
     r"^v must have shape \(1, 6\) \+ \(d_v,\) \(the leading axes and T_k of k\); got shape \(2, 6, 3\)$"),
    (lambda q, k, v: attention.attention(q, k[..., :4], v), ValueError,
     r"^k must have d_k = 5 in its last axis, like q \(2, 4, 5\); got shape \(2, 6, 4\)$"),
    (lambda q, k, v: attention.attention(q, k, v[:, :5]), ValueError,
     r"^v must have shape \(2, 6\) \+ \(d_v,\) \(the leading axes and T_k of k\); got shape \(2, 5, 3\)$"),
    (lambda q, k, v: attention.attention(q, k, v[:1]), ValueError,
     r"^v must have shape \(2, 6\) \+ \(d_v,\) \(the leading axes and T_k of k\); got shape \(1, 6, 3\)$"),
    (lambda q, k, v: attention.attention(q, k, v[0, 0]), ValueError,
     r"^v must have shape \(\.\.\., T_k, d_v\) \(at least 2 axes\), got shape \(3,\)$"),
    (lambda q, k, v: attention.attention(q, k, v * 1j), TypeError,
     r"^v must be a float array of shape \(\.\.\., T_k, d_v\), got dtype complex64$"),
    (lambda q, k, v: attention.attention(q, np.where(k > 0, np.nan, k), v), ValueError,
     r"^k contains nan at index \(\d+, \d+, \d+\); it must be finite$"),
    (lambda q, k, v: attention.attention(q, k, v, causal="yes"), ValueError,
     r"^causal must be True or False, got 'yes'$"),
    (lambda q, k, v: attention.attention_weights(q, k, causal=None), ValueError,
     r"^causal must be True or False, got None$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(rng, call, error, message):
    q, k, v = qkv(rng, (2,), 4, 6, 5, 3)
    with pytest.raises(error, match=message):
        call(q, k, v)


def test_the_simulator_refuses_full_size_attention(monkeypatch):
    from attention_lib.platform import launch
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    monkeypatch.delenv(launch.ALLOW_SLOW_VARIABLE, raising=False)
    # ANDREA-120M, one head of one sequence: already the scores are 1024 x 1024 threads.
    big = np.zeros((1024, 64), np.float32)
    with pytest.raises(ValueError, match=r"^attention: 1,048,576 CUDA threads would take about"):
        attention.attention(big, big, big)
