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
    array = np.asarray(array)
    if array.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be a float array of shape {shape_hint}, got dtype {array.dtype}")
    rank_ok = array.ndim == ndim if ndim is not None else array.ndim >= min_ndim
    if not rank_ok:
        axes = f"{ndim}" if ndim is not None else f"at least {min_ndim}"
        raise ValueError(f"{name} must have shape {shape_hint} ({axes} axes), got shape {array.shape}")
    if 0 in array.shape:
        raise ValueError(f"{name} must not be empty, got shape {array.shape}")
    array = np.ascontiguousarray(array, dtype=np.float32)
    bad = np.isnan(array) | np.isposinf(array) | (np.isneginf(array) & (not allow_neg_inf))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name} contains {array[where]} at index {where}; it must be finite")
    return array


def require(condition, message):
    """Raise ValueError(message) unless `condition`: for relations between arguments."""
    if not condition:
        raise ValueError(message)
