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
