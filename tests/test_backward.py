"""The backward pass (attention_lib/stages/backward.py): NumPy against finite differences, the
naive and fused kernels against NumPy (and PyTorch's autograd where installed), with and without a
sliding window (the forward's conventions: FlashAttention's window_size=(window - 1, 0)), the
traffic counted, bad input refused. The exercises' planted slips are in test_exercises_11.py."""

import math
import os
import warnings

import attention_lib
import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import traffic
from attention_lib.stages import backward


def _inputs(rng, lead, t_q, t_k, d_k, d_v):
    q, k = rng.standard_normal((*lead, t_q, d_k)), rng.standard_normal((*lead, t_k, d_k))
    v, d_out = rng.standard_normal((*lead, t_k, d_v)), rng.standard_normal((*lead, t_q, d_v))
    return q, k, v, d_out


def _assert_close(got, want, atol=2e-5):
    for g, w, name in zip(got, want, ("dq", "dk", "dv")):
        assert g.dtype == np.float32 and g.shape == w.shape, name
        assert np.allclose(g, w, rtol=1e-4, atol=atol), (name, float(np.abs(g - w).max()))


# --- NumPy ---------------------------------------------------------------------------------

@pytest.mark.parametrize("t_q, t_k, causal", [(1, 1, True), (7, 7, True), (5, 9, True), (9, 5, True), (6, 4, False)])
def test_loops_equal_the_vectorised_version(rng, t_q, t_k, causal):
    q, k, v, d_out = _inputs(rng, (), t_q, t_k, 3, 2)
    for got, want in zip(backward.backward_loops(q, k, v, d_out, causal), backward.backward(q, k, v, d_out, causal)):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("t_q, t_k, causal", [(5, 5, True), (3, 7, True), (7, 3, True), (4, 6, False)])
def test_the_gradients_equal_finite_differences(rng, t_q, t_k, causal):
    q, k, v, d_out = _inputs(rng, (), t_q, t_k, 3, 2)
    grads = backward.backward(q, k, v, d_out, causal)
    args = [q, k, v]
    for n, grad in enumerate(grads):
        def loss(x, n=n):                       # L = sum(O o dO): its gradient in O is dO
            inputs = args[:n] + [x] + args[n + 1:]
            return float(np.sum(reference.attention(*inputs, causal=causal) * d_out))
        numeric = backward.numerical_gradient(loss, args[n].copy())
        assert np.allclose(grad, numeric, rtol=1e-7, atol=1e-8), float(np.abs(grad - numeric).max())


def test_no_gradient_reaches_a_masked_key(rng):
    q, k, v, d_out = _inputs(rng, (), 6, 6, 3, 2)
    d_out[1:] = 0.0                              # only query 0's output matters: it sees key 0 only
    dq, dk, dv = backward.backward(q, k, v, d_out, causal=True)
    assert np.all(dk[1:] == 0) and np.all(dv[1:] == 0)
    assert np.any(dv[0] != 0)


def test_log_sum_exp_rebuilds_the_weights(rng):
    q, k = rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 9, 3))
    lse = backward.log_sum_exp(q, k)
    s = reference.apply_causal_mask(reference.scores(q, k))
    assert np.allclose(np.exp(s - lse[..., None]), reference.attention_weights(q, k), atol=1e-12)
    assert np.all(np.isneginf(backward.log_sum_exp(q[:, :4], k[:, :2])[:, :2]))   # rows with no key


# --- Kernels against NumPy -------------------------------------------------------------------

@pytest.mark.parametrize("lead, t_q, t_k, causal", [((1,), 1, 1, True), ((2,), 7, 9, True), ((1,), 9, 4, False)])
def test_naive_backward_equals_numpy(rng, lead, t_q, t_k, causal):
    q, k, v, d_out = _inputs(rng, lead, t_q, t_k, 5, 3)
    _assert_close(attention_lib.attention_backward(q, k, v, d_out, causal), backward.backward(q, k, v, d_out, causal))


@pytest.mark.parametrize("lead, t_q, t_k, d_k, d_v, causal", [
    ((1,), 1, 1, 1, 1, True),
    ((2, 1), 19, 23, 7, 5, True),                # queries the last 19 of 23 positions
    ((1,), 33, 33, 4, 6, True),                  # three tiles, a partial one; tiles skipped
    ((2,), 23, 9, 3, 3, True),                   # 14 queries see no key: lse -inf, gradient 0
    ((1,), 17, 19, 6, 2, False),
])
def test_fused_backward_equals_numpy(rng, lead, t_q, t_k, d_k, d_v, causal):
    q, k, v, d_out = _inputs(rng, lead, t_q, t_k, d_k, d_v)
    out, lse = reference.attention(q, k, v, causal), backward.log_sum_exp(q, k, causal)
    got = attention_lib.flash_attention_backward(q, k, v, out, lse, d_out, causal)
    _assert_close(got, backward.backward(q, k, v, d_out, causal))


@pytest.mark.parametrize("t_q, t_k", [(19, 23), (23, 9)])
def test_fused_backward_from_the_fused_forward(rng, t_q, t_k):
    q, k, v, d_out = _inputs(rng, (2,), t_q, t_k, 5, 5)
    out, lse = attention_lib.flash_attention(q, k, v, return_lse=True)
    assert np.allclose(lse, backward.log_sum_exp(q, k), rtol=1e-5, atol=1e-5)   # -inf where no key, in both
    got = attention_lib.flash_attention_backward(q, k, v, out, lse, d_out)
    _assert_close(got, backward.backward(q, k, v, d_out))


def test_fused_backward_equals_pytorch_autograd(rng):
    torch = pytest.importorskip("torch")
    q, k, v, d_out = _inputs(rng, (2,), 7, 11, 4, 3)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    visible = torch.tensor(reference.causal_mask(7, 11))       # bottom-right, as the library's
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=visible)
    out.backward(torch.tensor(d_out))
    lse = backward.log_sum_exp(q, k)
    got = attention_lib.flash_attention_backward(q, k, v, out.detach().numpy(), lse, d_out)
    _assert_close(got, (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()))


# --- Bad input --------------------------------------------------------------------------------

def _one_line(call, *words):
    with pytest.raises((ValueError, TypeError)) as error:
        call()
    message = str(error.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_bad_input_is_refused_in_one_line_naming_the_argument(rng):
    q, k, v, d_out = _inputs(rng, (2,), 5, 5, 3, 2)
    out, lse = reference.attention(q, k, v), backward.log_sum_exp(q, k)
    fused = attention_lib.flash_attention_backward
    _one_line(lambda: attention_lib.attention_backward(q, k, v, d_out[:, :4]), "d_out", "(2, 5, 2)", "(2, 4, 2)")
    _one_line(lambda: fused(q, k, v, out, lse[:, :3], d_out), "lse", "(2, 5)", "(2, 3)")
    _one_line(lambda: fused(q, k, v, out[..., :1], lse, d_out), "out", "(2, 5, 2)")
    bad = d_out.copy()
    bad[1, 2, 0] = np.nan
    _one_line(lambda: fused(q, k, v, out, lse, bad), "d_out", "nan", "(1, 2, 0)")
    _one_line(lambda: fused(q, k, v, out, np.full_like(lse, np.inf), d_out), "lse", "inf")
    _one_line(lambda: fused(q, k, v, out, lse, d_out, causal=1), "causal")
    _one_line(lambda: fused(q, k, v, out, lse, d_out.astype(bool)), "d_out", "dtype bool")
    wide = rng.standard_normal((1, 2, backward.MAX_D + 1))
    _one_line(lambda: fused(wide, wide, wide, wide, np.zeros((1, 2)), wide), "d_k", str(backward.MAX_D))


# --- Costs, counted ----------------------------------------------------------------------------

def test_the_fused_backward_stores_nothing_t_by_t_and_moves_less(rng):
    q, k, v, d_out = (a.astype(np.float32) for a in _inputs(rng, (1,), 19, 19, 4, 4))
    out = reference.attention(q, k, v).astype(np.float32)
    lse = backward.log_sum_exp(q, k).astype(np.float32)
    naive, naive_grads = traffic.count_backward_naive(q, k, v, d_out)
    fused, fused_grads = traffic.count_backward_fused(q, k, v, out, lse, d_out)
    want = backward.backward(q, k, v, d_out)
    _assert_close(naive_grads, want)
    _assert_close(fused_grads, want)
    square = [(name, a) for r in fused.values() for name, a in r.arrays.items()
              if a.space == "global" and a.shape[-2:] == (19, 19)]
    assert not square, square
    naive_bytes = sum(r.global_bytes for r in naive.values())
    fused_bytes = sum(r.global_bytes for r in fused.values())
    assert fused_bytes < naive_bytes / 2, (fused_bytes, naive_bytes)
    # Each launch of the naive backward writes one (19, 19) matrix or its transpose at least.
    assert all(r.total("stores") >= 19 * 19 for name, r in naive.items() if name in ("P^T", "dP", "dS", "dS^T"))
    footprint = backward.footprint(1, 19, 19, 4)
    assert footprint["naive"] == 4 * (6 * 19 * 19 + 19 * 4 + 19) and footprint["fused"] == 4 * 19


@pytest.mark.parametrize("t_q, t_k, window, skips", [(33, 33, None, True), (19, 23, None, False),
                                                     (50, 50, 7, True), (40, 45, 20, True)])
def test_the_fused_kernels_read_what_their_tile_map_says(rng, t_q, t_k, window, skips):
    q, k, v, d_out = (a.astype(np.float32) for a in _inputs(rng, (1,), t_q, t_k, 3, 2))
    out = reference.attention(q, k, v, window=window).astype(np.float32)
    lse = backward.log_sum_exp(q, k, window=window).astype(np.float32)
    reports, grads = traffic.count_backward_fused(q, k, v, out, lse, d_out, window=window)
    _assert_close(grads, backward.backward(q, k, v, d_out, window=window))
    visits = backward.fused_tile_visits(t_q, t_k, window=window)
    rows = np.minimum(backward.BLOCK_Q, t_q - backward.BLOCK_Q * np.arange(visits["dkdv"].shape[0]))
    # The dK/dV pass reads a query tile's rows once for every key block that visits it.
    assert int(reports["dK, dV"].loads("q").sum()) == int((visits["dkdv"] * rows[:, None]).sum()) * 3
    # The dQ pass reads K tile by tile over each query block's band of keys, as the forward.
    from attention_lib.stages import flash
    assert int(reports["dQ"].loads("k").sum()) == flash.flash_traffic(t_q, t_k, 3, block_q=backward.BLOCK_Q,
                                                                      window=window)["k"]
    # Tiles holding no visible pair are skipped (19 against 23: none is whole); a window skips tiles
    # below the band too, so both maps are bands of the same tiles.
    assert (not visits["dkdv"].all()) == skips and (not visits["dq"].all()) == skips
    assert np.array_equal(visits["dkdv"], visits["dq"])


def test_flop_counts_and_the_dq_strategies():
    flops = backward.backward_flops(64, 64, 16)
    pairs = 64 * 65 // 2
    assert flops["given P"] == 2 * pairs * 4 * 16
    assert flops["fused"] / flops["given P"] == pytest.approx(14 / 8)
    assert flops["fused, dQ by atomics"] / flops["given P"] == pytest.approx(10 / 8)
    costs = backward.dq_strategies(64, 64, 16)
    assert costs["second pass"]["atomic adds"] == 0 and costs["atomics"]["atomic adds"] > 0
    assert costs["second pass"]["extra multiply-adds"] == 3 * costs["atomics"]["extra multiply-adds"]
    # At the GPU's tiles of 32 a causal head of 1024 visits 32 * 33 / 2 query tiles in the dK/dV
    # pass, each adding 32 x d_k partial dQ entries; tiles of 16 visit 64 * 65 / 2 of 16 x d_k.
    gpu = backward.dq_strategies(1024, 1024, 64, block_q=backward.BLOCK_GPU, block_k=backward.BLOCK_GPU)
    assert gpu["atomics"]["atomic adds"] == 32 * 33 // 2 * 32 * 64
    small = backward.dq_strategies(1024, 1024, 64, block_q=16, block_k=16)
    assert small["atomics"]["atomic adds"] == 64 * 65 // 2 * 16 * 64
    # A window of 128 keeps 128 * 1024 - 127 * 128 / 2 pairs of the 1024 * 1025 / 2.
    assert backward.visible_pairs(1024, 1024, window=128) == 128 * 1024 - 127 * 128 // 2


# --- Sliding windows: the forward's conventions ---------------------------------------------

def flash_attention_window_mask(t_q, t_k, left, right):
    """FlashAttention's window_size=(left, right) as its documentation defines it, the queries
    aligned to the last positions (bottom-right, as this library): query i at position
    i + T_k - T_q sees keys j with position - left <= j <= position + right (-1: unbounded)."""
    position = np.arange(t_q)[:, None] + (t_k - t_q)
    j = np.arange(t_k)[None, :]
    return ((left < 0) | (j >= position - left)) & ((right < 0) | (j <= position + right))


@pytest.mark.parametrize("t_q, t_k, window", [(6, 6, 1), (7, 7, 3), (5, 8, 3), (8, 5, 2), (7, 7, 7), (7, 7, 30)])
def test_the_library_window_is_flash_attentions_w_minus_one_on_the_left(t_q, t_k, window):
    assert np.array_equal(reference.causal_mask(t_q, t_k, window), flash_attention_window_mask(t_q, t_k, window - 1, 0))
    if window < t_k:                             # (W, 0) sees one key more: the off-by-one of a port
        assert not np.array_equal(reference.causal_mask(t_q, t_k, window),
                                  flash_attention_window_mask(t_q, t_k, window, 0))


@pytest.mark.parametrize("t_q, t_k, window", [(5, 5, 2), (4, 7, 3), (7, 4, 2), (6, 6, 1)])
def test_windowed_gradients_equal_finite_differences(rng, t_q, t_k, window):
    q, k, v, d_out = _inputs(rng, (), t_q, t_k, 3, 2)
    grads = backward.backward(q, k, v, d_out, window=window)
    loops = backward.backward_loops(q, k, v, d_out, window=window)
    args = [q, k, v]
    for n, grad in enumerate(grads):
        def loss(x, n=n):                       # the forward's own window, in the reference
            inputs = args[:n] + [x] + args[n + 1:]
            return float(np.sum(reference.attention(*inputs, causal=True, window=window) * d_out))
        numeric = backward.numerical_gradient(loss, args[n].copy())
        assert np.allclose(grad, numeric, rtol=1e-7, atol=1e-8), float(np.abs(grad - numeric).max())
        assert np.allclose(loops[n], grad, rtol=1e-12, atol=1e-12)


def test_a_window_of_one_and_a_window_past_the_context(rng):
    q, k, v, d_out = _inputs(rng, (2,), 6, 6, 3, 2)
    dq, dk, dv = backward.backward(q, k, v, d_out, window=1)     # each query sees itself alone: P = 1
    assert np.allclose(dq, 0, atol=1e-12) and np.allclose(dk, 0, atol=1e-12) and np.allclose(dv, d_out)
    for got, want in zip(backward.backward(q, k, v, d_out, window=6), backward.backward(q, k, v, d_out)):
        assert np.allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("lead, k_heads, t_q, t_k, window", [
    ((1,), 1, 33, 33, 5),                        # three tiles, each key block's band a few queries deep
    ((2,), 2, 19, 23, 9),                        # queries the last 19 of 23 positions
    ((1, 4), 2, 40, 40, 16),                     # shared K/V heads (group 2), a window of one tile
    ((1,), 1, 23, 9, 3),                         # 14 queries see no key
])
def test_windowed_kernels_equal_numpy_from_the_fused_forward(rng, lead, k_heads, t_q, t_k, window):
    q = rng.standard_normal((*lead, t_q, 5))
    k, v = rng.standard_normal((*lead[:-1], k_heads, t_k, 5)), rng.standard_normal((*lead[:-1], k_heads, t_k, 4))
    d_out = rng.standard_normal((*lead, t_q, 4))
    out, lse = attention_lib.flash_attention(q, k, v, window=window, return_lse=True)
    assert np.allclose(lse, backward.log_sum_exp(q, k, window=window), rtol=1e-5, atol=1e-5)
    want = backward.backward(q, k, v, d_out, window=window)
    _assert_close(attention_lib.flash_attention_backward(q, k, v, out, lse, d_out, window=window), want)
    _assert_close(attention_lib.attention_backward(q, k, v, d_out, window=window), want)


def test_the_windowed_backward_equals_pytorch_autograd_with_flash_attentions_window(rng):
    torch = pytest.importorskip("torch")
    q, k, v, d_out = _inputs(rng, (2,), 9, 12, 4, 3)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    visible = torch.tensor(flash_attention_window_mask(9, 12, 3, 0))    # window_size=(3, 0): window=4
    out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=visible)
    out.backward(torch.tensor(d_out))
    lse = backward.log_sum_exp(q, k, window=4)
    got = attention_lib.flash_attention_backward(q, k, v, out.detach().numpy(), lse, d_out, window=4)
    _assert_close(got, (tq.grad.numpy(), tk.grad.numpy(), tv.grad.numpy()))


def test_a_bad_window_is_refused_in_one_line(rng):
    q, k, v, d_out = _inputs(rng, (1,), 5, 5, 3, 2)
    out, lse = reference.attention(q, k, v), backward.log_sum_exp(q, k)
    fused = attention_lib.flash_attention_backward
    _one_line(lambda: fused(q, k, v, out, lse, d_out, causal=False, window=3), "window 3 needs causal=True")
    _one_line(lambda: attention_lib.attention_backward(q, k, v, d_out, window=0), "window must be None or an int >= 1")
    _one_line(lambda: fused(q, k, v, out, lse, d_out, window=2.5), "window", "2.5")
    with pytest.raises(ValueError, match="needs causal=True"):
        backward.backward(q, k, v, d_out, causal=False, window=2)


def test_the_naive_backward_counts_the_windows_mask(rng):
    q, k, v, d_out = (a.astype(np.float32) for a in _inputs(rng, (1,), 17, 17, 4, 4))
    naive, grads = traffic.count_backward_naive(q, k, v, d_out, window=4)
    _assert_close(grads, backward.backward(q, k, v, d_out, window=4))
    # mask_kernel writes -inf where a key is masked, the future or older than the window, and reads nothing
    assert naive["window"].total("stores") == 17 * 17 - int(reference.causal_mask(17, 17, 4).sum())
    assert naive["window"].total("loads") == 0


# --- Refusing what does not match ------------------------------------------------------------

def test_a_lse_that_does_not_match_the_forward_is_caught(rng):
    q, k, v, d_out = _inputs(rng, (1,), 5, 5, 3, 2)
    out = reference.attention(q, k, v)
    lse = np.full((1, 5), -np.inf)                 # -inf where rows see keys: exp(s - lse) overflows
    with pytest.raises(ValueError, match="flash_attention_backward: float32 overflow"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # the simulator's NumPy scalars warn of the inf
        attention_lib.flash_attention_backward(q, k, v, out, lse, d_out)
    assert math.isfinite(float(backward.log_sum_exp(q, k)[0, 0]))


# --- The toy model ------------------------------------------------------------------------------

def test_the_toy_model_gradients_equal_finite_differences():
    from attention_lib.stages import toy_model
    rng = np.random.default_rng(5)
    params = toy_model.init_params(rng, vocab=5, t=8, d_model=8)
    tokens, scored, _ = toy_model.induction_batch(rng, 3, t=8, vocab=5, segment=(2, 3))
    _, grads, _ = toy_model.loss_and_grads(params, tokens, scored)
    for name in ("embed", "pos", "w_q0", "w_k1", "w_v0", "w_o1", "unembed"):
        def loss(x, name=name):
            return toy_model.loss_and_grads({**params, name: x}, tokens, scored)[0]
        numeric = backward.numerical_gradient(loss, params[name].copy())
        assert np.allclose(grads[name], numeric, rtol=1e-6, atol=1e-8), name


def test_the_toy_model_trains_reproducibly_and_the_shipped_weights_solve_the_task():
    from attention_lib.stages import toy_model
    first, history = toy_model.train(steps=2, batch=4)
    again, _ = toy_model.train(steps=2, batch=4)
    assert all(np.array_equal(first[n], again[n]) for n in first) and history[0][0] == 1
    params, shipped_history = toy_model.load_trained()
    assert set(params) == set(first) and shipped_history[-1, 1] < shipped_history[0, 1] / 10
    tokens, scored, lengths = toy_model.induction_batch(np.random.default_rng(99), 256)
    assert toy_model.accuracy(params, tokens, scored) > 0.95
    _, saved, _ = toy_model.forward(params, tokens)
    assert toy_model.induction_score(saved[1]["weights"], lengths).max() > 0.9           # an induction head
    assert toy_model.previous_token_score(saved[0]["weights"]).max() > 0.3               # a previous-token head


def test_the_fused_backward_at_the_gpu_block_sizes():
    # BLOCK_Q = BLOCK_K = 32, as on a GPU, in a subprocess (the constants are fixed at import):
    # T 33 is one full tile and one of a single row, both ways.
    import subprocess
    import sys
    from attention_lib.platform import runtime
    program = (
        "import numpy as np\n"
        "import attention_lib\n"
        "from attention_lib import reference\n"
        "from attention_lib.stages import backward\n"
        "assert backward.BLOCK_Q == backward.BLOCK_K == 32\n"
        "rng = np.random.default_rng(3)\n"
        "q, k, v, d_out = rng.standard_normal((4, 1, 33, 5))\n"
        "for causal in (True, False):\n"
        "    out, lse = reference.attention(q, k, v, causal), backward.log_sum_exp(q, k, causal)\n"
        "    got = attention_lib.flash_attention_backward(q, k, v, out, lse, d_out, causal)\n"
        "    for g, w in zip(got, backward.backward(q, k, v, d_out, causal)):\n"
        "        assert np.allclose(g, w, rtol=1e-4, atol=2e-5), np.abs(g - w).max()\n"
        "print('GPU block sizes ran')\n")
    env = dict(os.environ, **{runtime.SHAPES_VARIABLE: "gpu", runtime.BACKEND_VARIABLE: runtime.SIMULATOR})
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "GPU block sizes ran" in done.stdout


def test_a_trained_layers_heads_rebuild_its_weights_and_bad_input_is_named():
    from attention_lib.stages import toy_model
    params, _ = toy_model.load_trained()
    tokens, _, _ = toy_model.induction_batch(np.random.default_rng(5), 1)
    for layer in (0, 1):
        q, k, v, weights = toy_model.layer_heads(params, tokens[0], layer)
        assert q.dtype == np.float32 and q.shape == k.shape == v.shape == (toy_model.N_HEAD, tokens.shape[1], 16)
        # The float64 reference on the float32 heads gives the model's own weights back.
        assert np.abs(reference.attention_weights(q, k) - weights).max() < 1e-4
    with pytest.raises(ValueError, match=r"^tokens must be a \(T,\) integer array, got shape \(1, 24\) dtype int"):
        toy_model.layer_heads(params, tokens, 0)
    with pytest.raises(ValueError, match=r"^layer must be in 0\.\.1, got 2$"):
        toy_model.layer_heads(params, tokens[0], 2)


# --- The dK/dV pass in one kernel (notebook 11's main exercise) -----------------------------------

@pytest.mark.parametrize("bh, t_q, t_k, d_k, d_v", [
    (1, 1, 1, 1, 1),
    (2, 17, 17, 5, 7),                           # a second, one-row tile both ways
    (1, 15, 18, 7, 4),                           # the queries the last 15 of 18 positions
    (1, 33, 33, 3, 2),                           # three tiles: blocks 1 and 2 skip the tiles above them
    (1, 23, 9, 4, 3),                            # 14 queries see no key: lse -inf, never folded
    (1, 3, 18, 64, 64),                          # the model's head width
    (1, 2, 3, 128, 128),                         # MAX_D
])
def test_the_dkdv_pass_kernel_equals_numpy(rng, bh, t_q, t_k, d_k, d_v):
    q, k, v, d_out = _inputs(rng, (bh,), t_q, t_k, d_k, d_v)
    out, lse = reference.attention(q, k, v, True), backward.log_sum_exp(q, k, True)
    dk, dv = backward.dkdv_pass(q, k, v, d_out, lse, np.sum(d_out * out, axis=-1))
    _, want_dk, want_dv = backward.backward(q, k, v, d_out, True)
    for got, want in ((dk, want_dk), (dv, want_dv)):
        assert got.dtype == np.float32 and np.allclose(got, want, rtol=1e-4, atol=2e-5), np.abs(got - want).max()


def test_the_dkdv_pass_kernel_equals_the_fused_kernel_and_loads_only_the_band(rng):
    """Its tiles hold each query row once per key block that needs it: at T 33, tiles of 16, query
    row 0 is read by block 0 only, row 32 by all three blocks (the sanitizer's count)."""
    from attention_lib.measure import sanitizer
    q, k, v, d_out = (a.astype(np.float32) for a in _inputs(rng, (1,), 33, 33, 4, 4))
    out, lse = reference.attention(q, k, v, True), backward.log_sum_exp(q, k, True)
    d_rows = np.sum(d_out * out, axis=-1).astype(np.float32)
    dk, dv = backward.dkdv_pass(q, k, v, d_out, lse, d_rows)
    fused = attention_lib.flash_attention_backward(q, k, v, out, lse, d_out)
    assert np.allclose(dk, fused[1], rtol=1e-5, atol=1e-6) and np.allclose(dv, fused[2], rtol=1e-5, atol=1e-6)
    dk_dev, dv_dev = np.zeros_like(k), np.zeros_like(v)
    report = sanitizer.count_memory(backward.dkdv_pass_kernel, *backward.dkdv_pass_grid(1, 33), q, k, v, d_out,
                                    lse.astype(np.float32), d_rows, np.float32(0.5), dk_dev, dv_dev)
    per_row = report.loads("q")[0, :, 0]
    blocks = -(-33 // backward.BLOCK_K)
    tile = backward.BLOCK_Q
    assert per_row[0] == 1 and per_row[-1] == blocks
    assert all(per_row[i] == min(blocks, i // tile + 1) for i in range(33)), per_row


def test_the_dkdv_pass_refuses_bad_input_in_one_line(rng):
    q, k, v, d_out = _inputs(rng, (1,), 4, 5, 3, 2)
    lse, d_rows = np.zeros((1, 4)), np.zeros((1, 4))
    with pytest.raises(ValueError, match=r"^q, k, v, d_out must have shapes .*got \(1, 4, 3\), \(1, 5, 3\), "
                                         r"\(1, 5, 2\), \(1, 4, 3\)$"):
        backward.dkdv_pass(q, k, v, d_out[..., :1].repeat(3, -1), lse, d_rows)
    with pytest.raises(ValueError, match=r"^lse must have shape \(1, 4\); got shape \(1, 5\)$"):
        backward.dkdv_pass(q, k, v, d_out, np.zeros((1, 5)), d_rows)
