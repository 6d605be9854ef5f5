"""A trained toy model (notebook 11x, the backward's deep dive): a two-layer, attention-only transformer
that learns induction.

The task: each sequence holds a segment of L distinct random tokens, the same segment again, then
filler; L changes from sequence to sequence. In the repeat, the next token is the one that
followed the current token's previous occurrence, so no position-only rule predicts it; the
known solution (Olsson et al. 2022, "In-context learning and induction heads") takes two layers:
a previous-token head writes "the token before me" into each position, and an induction head in
the second layer looks for the position whose previous token is the current token, and copies
the token found there.

The model, in NumPy (float64): x = E[tokens] + P[positions]; each layer adds the sum over its
heads of attention(x W_Q, x W_K, x W_V) W_O to x (no MLP, no layer norm); logits = x U. The
attention backward of every head is a function argument (``attention_grad``), the NumPy
``backward.backward`` by default, so the library's kernels can be checked against it while
training. Adam (``adam_step``, one update), seeded: ``scripts/train_toy_model.py`` trains it and writes
``attention_lib/stages/data/toy_heads.npz``; ``load_trained`` reads it back.
"""

import math
from pathlib import Path

import numpy as np

from attention_lib import reference
from attention_lib.stages import backward

WEIGHTS = Path(__file__).resolve().parent / "data" / "toy_heads.npz"
# The model and the task: small, so that NumPy trains it on a CPU (400 steps of 32 sequences).
VOCAB, T, D_MODEL, N_HEAD, N_LAYER = 16, 24, 32, 2, 2
SEGMENT = (4, 11)              # the repeated segment's length L, drawn in [4, 11]


def induction_batch(rng, batch, t=T, vocab=VOCAB, segment=SEGMENT):
    """(tokens (batch, t) int, scored (batch, t - 1) bool, lengths (batch,) int).

    Row b: L_b distinct tokens, the same L_b again, then random filler. scored[b, i] says that
    predicting token i + 1 from positions 0..i is part of the loss: the repeat's positions after
    its first token, whose answer the first copy holds.
    """
    tokens = rng.integers(0, vocab, size=(batch, t))
    scored = np.zeros((batch, t - 1), bool)
    lengths = rng.integers(segment[0], segment[1] + 1, size=batch)
    for b, length in enumerate(lengths):
        seg = rng.permutation(vocab)[:length]
        tokens[b, :2 * length] = np.concatenate([seg, seg])
        scored[b, length:2 * length - 1] = True
    return tokens, scored, lengths


def init_params(rng, vocab=VOCAB, t=T, d_model=D_MODEL, n_head=N_HEAD, n_layer=N_LAYER):
    """The weights, name -> float64 array; layer l's are w_q{l}, w_k{l}, w_v{l} (d_model, d_model,
    heads side by side) and w_o{l}; embed (vocab, d_model), pos (t, d_model), unembed (d_model, vocab)."""
    s = 1.0 / math.sqrt(d_model)
    params = {"embed": rng.standard_normal((vocab, d_model)), "pos": rng.standard_normal((t, d_model)),
              "unembed": rng.standard_normal((d_model, vocab)) * s}
    for layer in range(n_layer):
        for name in ("w_q", "w_k", "w_v", "w_o"):
            params[f"{name}{layer}"] = rng.standard_normal((d_model, d_model)) * s
    return params


def _heads(x, w, n_head):
    return reference.split_heads(x @ w, n_head)            # (B, T, d_model) -> (B, H, T, d_k)


def forward(params, tokens, n_head=N_HEAD):
    """logits (B, T, vocab) and what the backward needs: per layer its input x, the heads' q, k,
    v (B, H, T, d_k), their weights (B, H, T, T) and merged outputs (B, T, d_model)."""
    x = params["embed"][tokens] + params["pos"][: tokens.shape[1]]    # (B, T, d_model)
    saved = []
    layer = 0
    while f"w_q{layer}" in params:
        q, k, v = (_heads(x, params[f"{n}{layer}"], n_head) for n in ("w_q", "w_k", "w_v"))
        weights = reference.attention_weights(q, k)                    # (B, H, T, T)
        merged = reference.merge_heads(weights @ v)                   # (B, T, d_model)
        saved.append({"x": x, "q": q, "k": k, "v": v, "weights": weights, "merged": merged})
        x = x + merged @ params[f"w_o{layer}"]
        layer += 1
    return x @ params["unembed"], saved, x


def loss_and_grads(params, tokens, scored, n_head=N_HEAD, attention_grad=backward.backward):
    """Mean cross-entropy of the scored predictions and its gradient in every weight.

    attention_grad(q, k, v, d_out) -> (dq, dk, dv): the attention backward used for every head.
    Returns (loss, grads (name -> array), saved) with saved as from ``forward``.
    """
    logits, saved, x = forward(params, tokens, n_head)
    z = logits[:, :-1] - logits[:, :-1].max(axis=-1, keepdims=True)   # position i predicts i + 1
    probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)         # (B, T - 1, vocab)
    target = tokens[:, 1:]
    n = scored.sum()
    picked = np.take_along_axis(probs, target[..., None], axis=-1)[..., 0]
    loss = -np.log(picked[scored]).sum() / n
    d_pred = probs.copy()                                              # softmax minus one-hot
    np.put_along_axis(d_pred, target[..., None], picked[..., None] - 1.0, axis=-1)
    d_logits = np.zeros_like(logits)
    d_logits[:, :-1] = d_pred * scored[..., None] / n
    grads = {"unembed": _outer_sum(x, d_logits)}
    dx = d_logits @ params["unembed"].T                                # (B, T, d_model)
    for layer in reversed(range(len(saved))):
        dx = _layer_backward(params, saved[layer], layer, dx, grads, n_head, attention_grad)
    grads["embed"] = np.zeros_like(params["embed"])
    np.add.at(grads["embed"], tokens, dx)
    grads["pos"] = np.zeros_like(params["pos"])
    grads["pos"][: tokens.shape[1]] = dx.sum(axis=0)
    return loss, grads, saved


def _outer_sum(a, b):
    """sum over batch and positions of a[b, t]^T b[b, t]: (B, T, m), (B, T, n) -> (m, n), the
    gradient of a weight w in a @ w given the output's gradient b."""
    return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])


def _layer_backward(params, s, layer, dx, grads, n_head, attention_grad):
    """Back through x_out = x + merge(attention(q, k, v)) W_O; returns d x, fills grads."""
    grads[f"w_o{layer}"] = _outer_sum(s["merged"], dx)
    d_heads = reference.split_heads(dx @ params[f"w_o{layer}"].T, n_head)   # (B, H, T, d_k)
    dq, dk, dv = (np.asarray(g, np.float64) for g in attention_grad(s["q"], s["k"], s["v"], d_heads))
    d_input = dx.copy()                                                      # the residual path
    for name, d_part in (("w_q", dq), ("w_k", dk), ("w_v", dv)):
        d_proj = reference.merge_heads(d_part)                               # (B, T, d_model)
        grads[f"{name}{layer}"] = _outer_sum(s["x"], d_proj)
        d_input += d_proj @ params[f"{name}{layer}"].T
    return d_input


def layer_heads(params, tokens, layer, n_head=N_HEAD):
    """One layer's heads on one token sequence, as the attention kernels take them.

    tokens: (T,) int, T <= toy_model.T. Returns q, k, v, each (n_head, T, d_k) float32 (the
    layer's input x, the residual stream after the layers before it, times W_Q, W_K, W_V, split
    into heads), and the model's own float64 weights softmax(mask(q k^T / sqrt(d_k))), (n_head, T, T).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"tokens must be a (T,) integer array, got shape {tokens.shape} dtype {tokens.dtype}")
    layers = sum(name.startswith("w_q") for name in params)
    if not 0 <= layer < layers:
        raise ValueError(f"layer must be in 0..{layers - 1}, got {layer!r}")
    _, saved, _ = forward(params, tokens[None], n_head)                # a batch of one
    q, k, v = (saved[layer][name][0].astype(np.float32) for name in ("q", "k", "v"))
    return q, k, v, saved[layer]["weights"][0]


def accuracy(params, tokens, scored, n_head=N_HEAD):
    """Fraction of the scored positions whose most likely next token is the right one."""
    logits, _, _ = forward(params, tokens, n_head)
    return float((logits[:, :-1].argmax(axis=-1) == tokens[:, 1:])[scored].mean())


def previous_token_score(weights):
    """Mean weight each query puts on the position just before it: weights (B, H, T, T) ->
    (H,). 1 for a perfect previous-token head."""
    return np.diagonal(weights, offset=-1, axis1=-2, axis2=-1).mean(axis=(0, -1))


def induction_score(weights, lengths):
    """Mean weight a query of the repeat puts on the position after its token's first occurrence
    (i - L + 1, where the answer sits): weights (B, H, T, T), lengths (B,) -> (H,)."""
    picked = [weights[b, :, i, i - length + 1] for b, length in enumerate(lengths)
              for i in range(length, 2 * length - 1)]
    return np.mean(picked, axis=0)


def adam_step(params, grads, moments, step, lr=1e-2):
    """One Adam update (beta 0.9 and 0.999) of every weight, in place. moments: {} before the first
    step (step 1), then name -> (m, v) as this function leaves them."""
    for n in params:
        m, v = moments.get(n, (np.zeros_like(params[n]), np.zeros_like(params[n])))
        m = 0.9 * m + 0.1 * grads[n]
        v = 0.999 * v + 0.001 * grads[n] ** 2
        params[n] -= lr * (m / (1 - 0.9 ** step)) / (np.sqrt(v / (1 - 0.999 ** step)) + 1e-8)
        moments[n] = (m, v)


def train(steps=400, batch=32, seed=0, lr=1e-2, log_every=100):
    """Adam on fresh induction batches; returns (params, history of (step, loss))."""
    rng = np.random.default_rng(seed)
    params, moments, history = init_params(rng), {}, []
    for step in range(1, steps + 1):
        tokens, scored, _ = induction_batch(rng, batch)
        loss, grads, _ = loss_and_grads(params, tokens, scored)
        adam_step(params, grads, moments, step, lr)
        if step % log_every == 0 or step == 1:
            history.append((step, float(loss)))
    return params, history


def load_trained(path=WEIGHTS):
    """(weights name -> float64 array, training history (steps, 2) of (step, loss)), as written
    by scripts/train_toy_model.py."""
    with np.load(path) as data:
        params = {name: data[name].astype(np.float64) for name in data.files if name != "history"}
        return params, data["history"]
