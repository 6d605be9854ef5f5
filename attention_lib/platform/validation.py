"""Input checks shared by every launcher: one-line errors that name the argument.

A kernel given the wrong thing either crashes deep inside Numba or, worse, returns a silently
wrong answer. Launchers call these first, so a mistake is reported where it was made:
the argument's name, what it got, and what it needs.
"""

import numpy as np


def as_float32(name, array, shape_hint, min_ndim=1, ndim=None, allow_neg_inf=False):
    """Return `array` as a C-contiguous float32 NumPy array, or raise a one-line error.

    name: the argument's name, used in the message; shape_hint: the shape it needs, in words,
    such as "(..., T, d_k)". Integers and other float widths are converted; booleans, complex
    numbers and objects are refused (TypeError). NaN and +-inf are refused (ValueError), except
    -inf when `allow_neg_inf` (masked scores).
    """
    if hasattr(array, "copy_to_host"):  # a device array: bring it back to check it
        array = array.copy_to_host()
    if not isinstance(array, (np.ndarray, list, tuple, float, int)):
        raise TypeError(f"{name} must be a NumPy float array of shape {shape_hint}, got {type(array).__name__}")
    try:
        array = np.asarray(array)
    except ValueError:  # NumPy's own message does not say which argument was ragged
        raise ValueError(f"{name} must be an array of shape {shape_hint}, got a ragged "
                         f"{type(array).__name__} (nested sequences of different lengths)") from None
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a float array of shape {shape_hint}, got dtype {array.dtype}")
    rank_ok = array.ndim == ndim if ndim is not None else array.ndim >= min_ndim
    if not rank_ok:
        axes = f"{ndim}" if ndim is not None else f"at least {min_ndim}"
        raise ValueError(f"{name} must have shape {shape_hint} ({axes} axes), got shape {array.shape}")
    if 0 in array.shape:
        raise ValueError(f"{name} must not be empty, got shape {array.shape}")
    given = array
    with np.errstate(over="ignore"):  # a finite value beyond float32's range becomes +-inf: reported below
        array = np.ascontiguousarray(array, dtype=np.float32)
    bad = np.isnan(array) | np.isposinf(array) | (np.isneginf(array) & (not allow_neg_inf))
    # Also a finite value that became -inf: with allow_neg_inf it would silently turn into a mask.
    bad |= np.isinf(array) & np.isfinite(given)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        if np.isfinite(given[where]):
            raise ValueError(f"{name} contains {given[where]} at index {where}, beyond float32's range "
                             f"(+-{np.finfo(np.float32).max:.4g}); scale it down")
        raise ValueError(f"{name} contains {array[where]} at index {where}; it must be finite")
    return array


def require_finite_result(what, result, culprits):
    """Raise a one-line ValueError when a launch from finite inputs gave NaN or +-inf.

    Finite float32 inputs can still overflow inside a kernel (a score q . k beyond 3.4e38 turns
    the softmax into inf - inf = NaN); the answer would be silently wrong, so it is refused.
    culprits: the arguments to scale down, in words, such as "q, k or v".
    """
    bad = ~np.isfinite(result)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what}: float32 overflow inside the kernels gave {result[where]} at index {where} "
                         f"of the result; scale {culprits} down (too large for float32 arithmetic)")
    return result


def require(condition, message):
    """Raise ValueError(message) unless `condition`: for relations between arguments."""
    if not condition:
        raise ValueError(message)


def kv_group(name, array, like_name, like):
    """How many query heads share each key/value head: 1, or H / H_kv under grouped-query attention.

    like: q (..., H, T_q, d_k); array: k or v (..., H_kv, T_k, d) with the same other leading
    axes, H a multiple of H_kv (query head h reads key/value head h // (H // H_kv)). Anything
    else is a one-line ValueError naming `name` and the shape it needs.
    """
    lead, kv_lead = like.shape[:-2], array.shape[:-2]
    if kv_lead == lead:
        return 1
    require(len(kv_lead) == len(lead) >= 1 and kv_lead[:-1] == lead[:-1],
            f"{name} must have the leading axes of {like_name} {lead}; got shape {array.shape}")
    n_head = lead[-1]
    divisors = [d for d in range(1, n_head + 1) if n_head % d == 0]
    require(n_head % kv_lead[-1] == 0,
            f"{name} must have shape {(*lead[:-1], 'H_kv', *array.shape[-2:])} with H_kv one of "
            f"{', '.join(map(str, divisors))} (a divisor of {like_name}'s {n_head} heads on axis -3); "
            f"got shape {array.shape}")
    return n_head // kv_lead[-1]


def attention_inputs(q, k, v=None):
    """Check q, k (and v) of attention and flatten their leading axes; returns (q3, k3, v3, lead, group).

    q: (..., T_q, d_k); k: (..., T_k, d_k); v: (..., T_k, d_v) or None, float. k and v share
    all leading axes; q's equal theirs, except that under grouped-query attention q has H heads on
    axis -3 and k, v have H_kv, H a multiple of H_kv -> q3 (BH, T_q, d_k), k3 (BH_kv, T_k, d_k),
    v3 (BH_kv, T_k, d_v) (None without v) float32, lead = q's leading axes, group = H / H_kv
    (1 without GQA): flat query head bh reads flat key/value head bh // group.
    """
    q = as_float32("q", q, "(..., T_q, d_k)", min_ndim=2)
    k = as_float32("k", k, "(..., T_k, d_k)", min_ndim=2)
    if v is not None:
        v = as_float32("v", v, "(..., T_k, d_v)", min_ndim=2)
    require(k.shape[-1] == q.shape[-1],
            f"k must have d_k = {q.shape[-1]} in its last axis, like q {q.shape}; got shape {k.shape}")
    group = kv_group("k", k, "q", q)
    (t_q, d_k), t_k = q.shape[-2:], k.shape[-2]
    q3, k3 = q.reshape(-1, t_q, d_k), k.reshape(-1, t_k, d_k)        # (BH, T_q, d_k), (BH_kv, T_k, d_k)
    if v is None:
        return q3, k3, None, q.shape[:-2], group
    require(v.shape[:-1] == k.shape[:-1],
            f"v must have shape {k.shape[:-1]} + (d_v,) (the leading axes and T_k of k); got shape {v.shape}")
    return q3, k3, v.reshape(-1, t_k, v.shape[-1]), q.shape[:-2], group   # v3: (BH_kv, T_k, d_v)


def weight(name, array, shape, hint, why):
    """A weight or bias as a float32 array of exactly `shape`, or a one-line error.

    shape: the tuple of ints it needs; hint: the same in words, such as "(d_model, d_model)",
    for a wrong rank; why: where the sizes come from, such as "d_model = the last axis of x".
    """
    array = as_float32(name, array, hint, ndim=len(shape))
    require(array.shape == tuple(shape), f"{name} must have shape {tuple(shape)} ({why}), got {array.shape}")
    return array


def positive_int(name, value):
    """value as an int >= 1, or TypeError (not an int; a bool is refused) or ValueError (< 1)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be a positive int, got {type(value).__name__} {value!r}")
    require(value >= 1, f"{name} must be a positive int, got {value}")
    return int(value)


def head_counts(d_model, n_head, n_kv_head=None):
    """Check a layer's head counts; returns (n_kv_head, d_k).

    n_head must divide d_model (each head gets d_k = d_model / n_head columns); n_kv_head, the
    key/value heads of grouped-query attention (None: n_head; 1: multi-query attention), must
    divide n_head, so that each serves n_head / n_kv_head query heads.
    """
    positive_int("n_head", n_head)
    require(d_model % n_head == 0,
            f"d_model {d_model} (the last axis of x) is not divisible by n_head {n_head}; "
            f"each head needs d_k = d_model / n_head columns")
    if n_kv_head is None:
        return n_head, d_model // n_head
    positive_int("n_kv_head", n_kv_head)
    require(n_head % n_kv_head == 0,
            f"n_kv_head {n_kv_head} must divide n_head {n_head} (each key/value head serves "
            f"n_head / n_kv_head query heads)")
    return n_kv_head, d_model // n_head
