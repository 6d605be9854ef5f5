"""The running example: tokens, ids, embeddings, x and the projection weights."""

import numpy as np
import pytest

from attention_lib import SIZES, reference, story
from attention_lib.platform.runtime import ANDREA_120M, ANDREA_SIMULATOR


def test_text_fits_the_simulators_context_once():
    words = story.tokenize(story.TEXT)
    assert len(words) == ANDREA_SIMULATOR.T
    assert story.VOCAB[0] == "<pad>" and len(set(story.VOCAB)) == len(story.VOCAB)
    assert [story.VOCAB[i] for i in story.token_ids(words)] == words


@pytest.mark.parametrize("sizes", [ANDREA_SIMULATOR, ANDREA_120M], ids=lambda s: s.name)
def test_shapes_dtypes_and_the_embedding_path(sizes):
    s = story.make_story(sizes)
    assert s.T == sizes.T and s.ids.shape == (sizes.T,) and s.ids.dtype == np.int64
    assert s.token_embedding.shape == (len(story.VOCAB), sizes.d_model)
    assert s.position_embedding.shape == (sizes.T, sizes.d_model)
    for w in (s.w_q, s.w_k, s.w_v):
        assert w.shape == (sizes.d_model, sizes.d_model) and w.dtype == np.float32
    # x is the layer-normed sum of the token's row and the position's row
    want = s.token_embedding[s.ids] + s.position_embedding[np.arange(sizes.T)]
    assert np.array_equal(s.residual, want)
    assert s.x.dtype == np.float32 and s.x.shape == (sizes.T, sizes.d_model)
    r = s.residual.astype(np.float64)
    centred = r - r.mean(axis=-1, keepdims=True)
    normed = centred / np.sqrt(centred.var(axis=-1, keepdims=True) + story.LAYER_NORM_EPS)
    assert np.allclose(s.x, normed, rtol=1e-6, atol=1e-6)
    # rows of mean 0, std just under 1: eps (1e-5) is not small beside a variance near 0.02^2
    assert np.allclose(s.x.mean(axis=-1), 0, atol=1e-5) and (0.95 < s.x.std(axis=-1)).all()
    assert (s.x.std(axis=-1) < 1).all()
    # longer contexts repeat the text
    words = story.tokenize(story.TEXT)
    assert list(s.tokens) == [words[i % len(words)] for i in range(sizes.T)]


def test_shorter_story_is_a_prefix_and_seeded():
    full, short = story.make_story(), story.make_story(T=7)
    assert np.array_equal(short.x, full.x[:7]) and np.array_equal(short.w_k, full.w_k)
    assert short.labels() == ["0:the", "1:cat", "2:sat", "3:on", "4:the", "5:mat", "6:because"]
    assert not np.array_equal(story.make_story(seed=1).x, full.x)
    # the same word at two positions differs only by the position rows
    assert not np.array_equal(full.x[0], full.x[4]) and full.tokens[0] == full.tokens[4]


def test_qkv_is_x_times_the_heads_columns():
    s = story.make_story(T=19)
    d_k = SIZES.d_k
    last = SIZES.n_head - 1
    q, k, v = s.qkv(last)
    for got, w in zip((q, k, v), (s.w_q, s.w_k, s.w_v)):
        assert got.shape == (19, d_k) and got.dtype == np.float32
        assert np.allclose(got, reference.project(s.x, w[:, last * d_k:]), rtol=1e-6, atol=1e-6)
    # unit-variance x and W ~ N(0, 1/d_model): components of q of about unit variance
    assert 0.7 < story.make_story().qkv()[0].std() < 1.3


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="T: must be in 1..") as error:
        story.make_story(T=0)
    assert str(error.value).count("\n") == 0
    with pytest.raises(ValueError, match="T: must be in 1.."):
        story.make_story(T=SIZES.T + 1)
    with pytest.raises(ValueError, match="head: must be in 0.."):
        story.make_story(T=3).head_weights(SIZES.n_head)
    with pytest.raises(ValueError, match=r"text: words \['zebra'\]"):
        story.tokenize("the zebra sat")
