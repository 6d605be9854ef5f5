"""NumPy references for every stage of attention: the ground truth the kernels are checked against.

Every function accumulates in float64 and returns float64, whatever it is given, so that a
float32 kernel is compared with something more precise than itself.

Conventions (PyTorch's scaled-dot-product layout):
- per-head tensors are (..., T, d_k): any leading batch and head axes are carried along;
- weights follow the formula: Q = x @ W_Q with W_Q of shape (d_model, d_k);
- a masked score is -inf, and a row whose scores are all masked gets all-zero weights
  (it attends to nothing), never NaN;
- grouped-query attention: k and v may have H_kv heads on axis -3 where q has H, H a multiple
  of H_kv; query head h reads key/value head h // (H // H_kv) (PyTorch's enable_gqa).
"""

import numpy as np


def _f64(array):
    return np.asarray(array, dtype=np.float64)


def project(x, w, b=None):
    """One learned linear map: x @ w (+ b).

    x: (..., T, d_model); w: (d_model, d_out); b: (d_out,) or None -> (..., T, d_out).
    """
    out = _f64(x) @ _f64(w)
    return out if b is None else out + _f64(b)


def scores(q, k, scale=True):
    """Attention scores q @ k^T, divided by sqrt(d_k) when `scale`.

    q: (..., T_q, d_k); k: (..., T_k, d_k) -> (..., T_q, T_k). Entry [i, j] says how well
    query i matches key j.
    """
    q, k = _f64(q), _f64(k)
    raw = q @ np.swapaxes(k, -1, -2)                           # (..., T_q, d_k) @ (..., d_k, T_k)
    return raw / np.sqrt(q.shape[-1]) if scale else raw


def check_window(window, causal=True):
    """The sliding window `window` (an int >= 1, or None for none), or a one-line ValueError.

    A window is an option of the causal mask: it needs causal=True.
    """
    if window is None:
        return None
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"window must be None or an int >= 1 (the keys a query sees, itself included), got {window!r}")
    if not causal:
        raise ValueError(f"window {window} needs causal=True (a sliding window is a causal mask), got causal=False")
    return int(window)


def causal_mask(T_q, T_k=None, window=None):
    """Boolean (T_q, T_k) matrix, True where query i may see key j.

    With T_k > T_q the queries are the *last* T_q positions (as when decoding with a cache):
    query i sits at position i + (T_k - T_q) and sees keys 0 .. that position. With a sliding
    `window` (an int >= 1) it sees only the last `window` of them: key j is visible when
    i + off - window < j <= i + off, off = T_k - T_q (a window >= T_k is the plain causal mask).
    """
    T_k = T_q if T_k is None else T_k
    window = check_window(window)
    position = np.arange(T_q)[:, None] + (T_k - T_q)          # (T_q, 1): where query i sits
    j = np.arange(T_k)[None, :]                                # (1, T_k)
    visible = j <= position
    return visible if window is None else visible & (j > position - window)


def apply_causal_mask(s, window=None):
    """Scores with every future position (key j after query i) set to -inf, and with a sliding
    `window` every key more than window - 1 positions behind the query too.

    s: (..., T_q, T_k) -> same shape, a new array.
    """
    s = _f64(s).copy()
    s[..., ~causal_mask(s.shape[-2], s.shape[-1], window)] = -np.inf
    return s


def softmax(s, axis=-1):
    """Softmax along `axis`, stable for large scores (the row maximum is subtracted first).

    s: any shape -> same shape; along `axis` entries are >= 0 and sum to 1, except for a
    fully masked line (all -inf), which becomes all zeros.
    """
    s = _f64(s)
    row_max = np.max(s, axis=axis, keepdims=True)
    fully_masked = np.isneginf(row_max)
    shifted = s - np.where(fully_masked, 0.0, row_max)     # exp(x - max) never overflows
    e = np.exp(shifted)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.where(fully_masked, 0.0, e / np.where(total == 0.0, 1.0, total))


def weighted_sum(a, v):
    """Each output row is a mix of the value rows: out[i] = sum_j a[i, j] * v[j].

    a: (..., T_q, T_k) attention weights; v: (..., T_k, d_v) -> (..., T_q, d_v).
    """
    return _f64(a) @ _f64(v)


def split_heads(x, n_head):
    """Cut the model width into heads.

    x: (..., T, d_model) -> (..., n_head, T, d_k) with d_k = d_model / n_head; head h holds
    columns h*d_k .. (h+1)*d_k - 1 of x.
    """
    x = _f64(x)
    *lead, T, d_model = x.shape
    if d_model % n_head:
        raise ValueError(f"split_heads: d_model {d_model} is not divisible by n_head {n_head}")
    d_k = d_model // n_head
    heads = x.reshape(*lead, T, n_head, d_k)                   # (..., T, n_head, d_k)
    return np.swapaxes(heads, -3, -2)                          # (..., n_head, T, d_k)


def merge_heads(h):
    """Undo split_heads: put the heads side by side again.

    h: (..., n_head, T, d_k) -> (..., T, n_head * d_k).
    """
    h = _f64(h)
    *lead, n_head, T, d_k = h.shape
    side_by_side = np.swapaxes(h, -3, -2)                      # (..., T, n_head, d_k)
    return side_by_side.reshape(*lead, T, n_head * d_k)        # (..., T, d_model)


def share_kv_heads(kv, q):
    """kv (..., H_kv, T_k, d) with each head repeated for the H / H_kv query heads of q
    (..., H, T_q, d_k) that read it -> (..., H, T_k, d); kv itself when the heads match."""
    kv = _f64(kv)
    if kv.shape[:-2] == np.shape(q)[:-2]:
        return kv
    return np.repeat(kv, np.shape(q)[-3] // kv.shape[-3], axis=-3)   # head h -> kv head h // group


def attention_weights(q, k, causal=True, window=None):
    """softmax(mask(q k^T / sqrt(d_k))): (..., T_q, d_k), (..., T_k, d_k) -> (..., T_q, T_k).
    k may have fewer heads than q on axis -3 (grouped-query attention, share_kv_heads).
    window: a sliding window (causal only, see causal_mask) or None."""
    window = check_window(window, causal)
    s = scores(q, share_kv_heads(k, q), scale=True)
    return softmax(apply_causal_mask(s, window) if causal else s)


def attention(q, k, v, causal=True, window=None):
    """Scaled dot-product attention of one or many heads.

    q: (..., H, T_q, d_k); k: (..., H_kv, T_k, d_k); v: (..., H_kv, T_k, d_v) -> (..., H, T_q, d_v),
    with H_kv = H (or no head axis at all), or H_kv dividing H (grouped-query attention).
    window: a sliding window (causal only, see causal_mask) or None.
    """
    return weighted_sum(attention_weights(q, k, causal, window), share_kv_heads(v, q))


def multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal=True,
                         b_q=None, b_k=None, b_v=None, b_o=None, n_kv_head=None):
    """A whole multi-head self-attention layer.

    x: (..., T, d_model); w_q, w_o: (d_model, d_model); w_k, w_v: (d_model, n_kv_head * d_k)
    with d_k = d_model / n_head; biases of their widths or None -> (..., T, d_model): project,
    split into n_head query heads and n_kv_head key/value heads (None: n_head; fewer: grouped-query
    attention, 1: multi-query), attend per query head, merge, then W_O.
    """
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    q = split_heads(project(x, w_q, b_q), n_head)              # (..., n_head, T, d_k)
    k = split_heads(project(x, w_k, b_k), n_kv_head)           # (..., n_kv_head, T, d_k)
    v = split_heads(project(x, w_v, b_v), n_kv_head)
    heads = attention(q, k, v, causal)                         # (..., n_head, T, d_k)
    return project(merge_heads(heads), w_o, b_o)               # (..., T, d_model)
