"""The NumPy references: small cases worked out by hand, and the identities that tie them together."""

import numpy as np
import pytest
from attention_lib import reference as ref


def test_project_by_hand():
    x = np.array([[1.0, 2.0], [3.0, -1.0]])
    w = np.array([[1.0, 0.0, 2.0], [0.5, -1.0, 1.0]])
    b = np.array([0.0, 1.0, -1.0])
    # row 0: [1 + 1, 0 - 2, 2 + 2] = [2, -2, 4]; row 1: [3 - 0.5, 0 + 1, 6 - 1] = [2.5, 1, 5]
    assert np.array_equal(ref.project(x, w), [[2.0, -2.0, 4.0], [2.5, 1.0, 5.0]])
    assert np.array_equal(ref.project(x, w, b), [[2.0, -1.0, 3.0], [2.5, 2.0, 4.0]])


def test_scores_by_hand_scaled_by_sqrt_d_k():
    q = np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    k = np.array([[2.0, 0.0, 0.0, 0.0], [1.0, -1.0, 1.0, -1.0], [1.0, 1.0, 1.0, 1.0]])
    raw = np.array([[2.0, 1.0, 1.0], [2.0, 0.0, 4.0]])
    assert np.array_equal(ref.scores(q, k, scale=False), raw)
    assert np.array_equal(ref.scores(q, k), raw / 2.0)      # sqrt(d_k) = sqrt(4) = 2


def test_causal_mask_by_hand():
    assert np.array_equal(ref.causal_mask(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    # two new queries at positions 2 and 3 of a 4-long sequence (decoding with a cache)
    assert np.array_equal(ref.causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    masked = ref.apply_causal_mask(np.ones((3, 3)))
    assert np.array_equal(np.isneginf(masked), ~ref.causal_mask(3))
    assert np.all(masked[ref.causal_mask(3)] == 1.0)


def test_softmax_by_hand_and_stable():
    e = np.exp(1.0)
    assert np.allclose(ref.softmax(np.array([0.0, 1.0])), [1 / (1 + e), e / (1 + e)], rtol=1e-15)
    # scores near 1000 overflow a naive exp; subtracting the max keeps the same answer
    assert np.allclose(ref.softmax(np.array([1000.0, 1001.0])), [1 / (1 + e), e / (1 + e)], rtol=1e-15)
    assert np.array_equal(ref.softmax(np.array([0.0, -np.inf])), [1.0, 0.0])


def test_fully_masked_row_attends_to_nothing():
    s = np.array([[-np.inf, -np.inf, -np.inf], [0.0, 0.0, -np.inf]])
    a = ref.softmax(s)
    assert np.array_equal(a[0], [0.0, 0.0, 0.0])
    assert np.array_equal(a[1], [0.5, 0.5, 0.0])


def test_softmax_properties_on_random_rows(rng):
    s = rng.standard_normal((5, 7, 9)) * 10
    a = ref.softmax(s)
    assert np.all(a >= 0)
    assert np.allclose(a.sum(-1), 1.0, rtol=1e-13)
    order = np.argsort(s, axis=-1)                       # larger score -> larger weight
    assert np.all(np.diff(np.take_along_axis(a, order, -1), axis=-1) >= 0)
    assert np.allclose(ref.softmax(s, axis=0).sum(0), 1.0, rtol=1e-13)


def test_weighted_sum_by_hand():
    a = np.array([[1.0, 0.0], [0.25, 0.75]])
    v = np.array([[4.0, 8.0], [0.0, -4.0]])
    assert np.array_equal(ref.weighted_sum(a, v), [[4.0, 8.0], [1.0, -1.0]])


def test_split_heads_by_hand_and_merge_inverts_it(rng):
    x = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]])         # T = 1, d_model = 6
    assert np.array_equal(ref.split_heads(x, 3), [[[0.0, 1.0]], [[2.0, 3.0]], [[4.0, 5.0]]])
    x = rng.standard_normal((2, 5, 12))
    heads = ref.split_heads(x, 4)
    assert heads.shape == (2, 4, 5, 3)
    assert np.array_equal(heads[1, 2], x[1, :, 6:9])
    assert np.array_equal(ref.merge_heads(heads), x)
    with pytest.raises(ValueError, match="d_model 12 is not divisible by n_head 5"):
        ref.split_heads(x, 5)


def test_causal_attention_of_the_first_position_copies_its_value(rng):
    q, k, v = rng.standard_normal((3, 6, 4))
    out = ref.attention(q, k, v, causal=True)
    assert np.allclose(out[0], v[0], rtol=1e-13)           # position 0 sees only itself


def test_attention_weights_rows_sum_to_one_and_future_is_zero(rng):
    q, k = rng.standard_normal((2, 3, 7, 5))
    a = ref.attention_weights(q, k, causal=True)
    assert np.allclose(a.sum(-1), 1.0, rtol=1e-13)
    assert np.all(a[..., ~ref.causal_mask(7)] == 0.0)
    assert np.all(a[..., ref.causal_mask(7)] > 0.0)


def test_causal_attention_ignores_the_future(rng):
    q, k, v = rng.standard_normal((3, 9, 4))
    changed_k, changed_v = k.copy(), v.copy()
    changed_k[5:] += 10.0
    changed_v[5:] -= 3.0
    before = ref.attention(q, k, v, causal=True)
    after = ref.attention(q, changed_k, changed_v, causal=True)
    assert np.array_equal(before[:5], after[:5])
    assert not np.allclose(before[5:], after[5:])


def test_identical_keys_average_the_values(rng):
    q, v = rng.standard_normal((2, 5, 3))
    k = np.tile(rng.standard_normal(3), (5, 1))
    assert np.allclose(ref.attention(q, k, v, causal=False), np.tile(v.mean(0), (5, 1)), rtol=1e-12)


def test_batched_attention_equals_per_head_attention(rng):
    q, k, v = rng.standard_normal((3, 2, 3, 6, 4))
    out = ref.attention(q, k, v, causal=True)
    for b in range(2):
        for h in range(3):
            assert np.allclose(out[b, h], ref.attention(q[b, h], k[b, h], v[b, h]), rtol=1e-13)


def test_multi_head_equals_heads_done_by_hand(rng):
    T, d_model, n_head = 5, 8, 2
    x = rng.standard_normal((T, d_model))
    w_q, w_k, w_v, w_o = rng.standard_normal((4, d_model, d_model))
    b_q, b_k, b_v, b_o = rng.standard_normal((4, d_model))
    heads = []
    for h in range(n_head):
        cols = slice(h * 4, (h + 1) * 4)
        q = x @ w_q[:, cols] + b_q[cols]
        k = x @ w_k[:, cols] + b_k[cols]
        v = x @ w_v[:, cols] + b_v[cols]
        heads.append(ref.attention(q, k, v, causal=False))
    expected = np.concatenate(heads, axis=1) @ w_o + b_o
    got = ref.multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal=False, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o)
    assert np.allclose(got, expected, rtol=1e-12)
    batched = ref.multi_head_attention(np.stack([x, 2 * x]), w_q, w_k, w_v, w_o, n_head)
    assert batched.shape == (2, T, d_model)
    assert np.allclose(batched[0], ref.multi_head_attention(x, w_q, w_k, w_v, w_o, n_head), rtol=1e-12)


def test_references_work_in_float64_whatever_they_are_given(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    for out in (ref.project(x, x.T), ref.scores(x, x), ref.softmax(x), ref.attention(x, x, x)):
        assert out.dtype == np.float64
