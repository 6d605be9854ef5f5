"""Numerical edges and bad input, pinned for every public function that takes arrays.

Edges: scores of +-1e4, T = 1, d_k = 1, fully masked rows, queries that see no key, finite
inputs whose float32 arithmetic overflows. Bad input, one table (CALLS) for every array
argument of every function: NaN and +-inf, values beyond float32, ragged lists, bool, complex
and object dtypes, wrong ranks; each must raise a one-line ValueError or TypeError naming the
argument. Accepted input: float64, float16 and integers (converted to float32), non-contiguous
views (converted), read-only arrays (never written). Sizes the simulator would take minutes
on: refused with the estimate and the way to override it.

What the per-module tests already pin is not repeated here: q, k and v whose d_k, T_k or
leading axes disagree (test_attention, test_flash, test_scores, test_weighted_sum,
test_kv_cache), d_model not divisible by n_head (test_multihead), a weight or bias of the
wrong shape in the layer (test_multihead) and in project (test_projection), a full cache, an
empty cache.
"""

import functools
import math
import re
import zlib
from dataclasses import dataclass, field

import attention_lib
import numpy as np
import pytest
from attention_lib.stages import attention as attention_module
from attention_lib.platform import launch
from attention_lib import reference
from attention_lib.stages import softmax as softmax_module
from numba import cuda
from test_properties import (SAFETY, U, assert_within, attention_bound, layer_bound, matmul_bound, score_error,
                             softmax_bound)

N_HEAD = 2                 # multi_head_attention's heads in the table below


# --- Every public function that takes arrays, with small good arguments ----------------------

@dataclass(frozen=True)
class Call:
    """A public function called with named arrays: run(**arrays) -> result, want(**arrays) ->
    the float64 reference. shapes: each array argument's good shape; neg_inf_ok: arguments
    where -inf means a masked score and is allowed."""

    run: object
    want: object
    shapes: dict
    neg_inf_ok: tuple = field(default=())


def _decode(q, k_new, v_new, version=2):
    cache = attention_lib.KVCache(2, 6, 3)
    cache.append(k_new, v_new)
    return attention_lib.decode_step(q, cache, version=version)


def _decode_reference(q, k_new, v_new):
    # One query per head against every cached position: T_q = 1 sees every key.
    return reference.attention(np.asarray(q, np.float64)[:, None], k_new, v_new, causal=False)[:, 0]


def _layer(x, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o):
    return attention_lib.multi_head_attention(x, w_q, w_k, w_v, w_o, N_HEAD, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o)


def _layer_reference(x, w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o):
    return reference.multi_head_attention(x, w_q, w_k, w_v, w_o, N_HEAD, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o)


CALLS = {
    "attention": Call(lambda q, k, v: attention_lib.attention(q, k, v),
                      lambda q, k, v: reference.attention(q, k, v),
                      {"q": (2, 5, 3), "k": (2, 6, 3), "v": (2, 6, 4)}),
    "attention_weights": Call(lambda q, k: attention_module.attention_weights(q, k),
                              lambda q, k: reference.attention_weights(q, k),
                              {"q": (2, 5, 3), "k": (2, 6, 3)}),
    "flash_attention": Call(lambda q, k, v: attention_lib.flash_attention(q, k, v),
                            lambda q, k, v: reference.attention(q, k, v),
                            {"q": (2, 5, 3), "k": (2, 6, 3), "v": (2, 6, 4)}),
    "multi_head_attention": Call(_layer, _layer_reference,
                                 {"x": (2, 5, 4), "w_q": (4, 4), "w_k": (4, 4), "w_v": (4, 4), "w_o": (4, 4),
                                  "b_q": (4,), "b_k": (4,), "b_v": (4,), "b_o": (4,)}),
    "project": Call(lambda x, w, b: attention_lib.project(x, w, b), reference.project,
                    {"x": (2, 5, 3), "w": (3, 4), "b": (4,)}),
    "scores": Call(lambda q, k: attention_lib.scores(q, k), reference.scores, {"q": (2, 5, 3), "k": (2, 6, 3)}),
    "apply_causal_mask": Call(attention_lib.apply_causal_mask, reference.apply_causal_mask, {"s": (2, 5, 6)},
                              neg_inf_ok=("s",)),
    "softmax": Call(lambda s: attention_lib.softmax(s), reference.softmax, {"s": (2, 5, 6)}, neg_inf_ok=("s",)),
    "weighted_sum": Call(lambda a, v: attention_lib.weighted_sum(a, v), reference.weighted_sum,
                         {"a": (2, 5, 6), "v": (2, 6, 4)}),
    "split_heads": Call(lambda x: attention_lib.split_heads(x, 3), lambda x: reference.split_heads(x, 3),
                        {"x": (2, 5, 6)}),
    "merge_heads": Call(attention_lib.merge_heads, lambda heads: reference.merge_heads(heads), {"heads": (2, 3, 5, 2)}),
    # KVCache.append (k_new, v_new), then decode_step (q).
    "decode_step": Call(_decode, _decode_reference, {"q": (2, 3), "k_new": (2, 4, 3), "v_new": (2, 4, 3)}),
}
ARGUMENTS = [(name, arg) for name, call in CALLS.items() for arg in call.shapes]


def arrays_for(name, integers=False):
    """Good float32 arguments of CALLS[name], the same on every call: standard normals, or
    small integers (exact in every dtype tried below)."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    if integers:
        return {arg: rng.integers(-3, 4, shape).astype(np.float32) for arg, shape in CALLS[name].shapes.items()}
    return {arg: rng.standard_normal(shape).astype(np.float32) for arg, shape in CALLS[name].shapes.items()}


@functools.cache
def float32_result(name, integers=False):
    """CALLS[name] on its good float32 arguments (computed once: each run launches kernels)."""
    return CALLS[name].run(**arrays_for(name, integers=integers))


def with_one(name, arg, value):
    """The good arguments of CALLS[name] with `arg` replaced by `value`."""
    arrays = arrays_for(name)
    arrays[arg] = value
    return arrays


def raises_one_line(error, call, arrays, pattern):
    """call(**arrays) raises `error` with a one-line message matching `pattern`; returns it."""
    with pytest.raises(error) as caught:
        call.run(**arrays)
    message = str(caught.value)
    assert "\n" not in message, message
    assert re.search(pattern, message), f"{message!r} does not match {pattern!r}"
    return message


# --- Scores of +-1e4 ---------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_scores_of_1e4_through_the_softmax(version):
    s = np.array([[1e4, -1e4, 0.0, 1e4 - 1.0, -1e4],     # two near the top, the rest vanish
                  [-1e4, -1e4, -1e4, -1e4 + 2.0, -1e4],  # all very negative: exp(s) alone underflows
                  [1e4, 1e4, 1e4, 1e4, 1e4 - 0.5],       # all very positive: exp(s) alone overflows
                  [-1e4, 1e4, -np.inf, -np.inf, 0.0]], np.float32)
    got = attention_lib.softmax(s, version=version)
    assert np.isfinite(got).all()
    assert_within(got, reference.softmax(s), softmax_bound(s.shape[-1]), f"softmax v{version}")
    assert np.allclose(got.sum(axis=-1), 1.0, atol=softmax_bound(s.shape[-1]))


def scores_of_1e4(rng, lead, t_q, t_k, d_k=4, d_v=3):
    """q, k whose scaled scores q . k / sqrt(d_k) are about +-1e4 (std 1e4), v of order 1."""
    q = (rng.standard_normal((*lead, t_q, d_k)) * 100).astype(np.float32)
    k = (rng.standard_normal((*lead, t_k, d_k)) * 100).astype(np.float32)
    return q, k, rng.standard_normal((*lead, t_k, d_v)).astype(np.float32)


@pytest.mark.parametrize("function", ["attention", "flash v1", "flash v2", "flash v3"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_scores_of_1e4_through_attention(rng, function, causal):
    q, k, v = scores_of_1e4(rng, (2,), 7, 9, d_v=4 if function == "flash v3" else 3)   # v3: d_v = d_k
    assert np.abs(reference.scores(q, k)).max() > 1e4
    if function == "attention":
        got = attention_lib.attention(q, k, v, causal=causal)
    else:
        got = attention_lib.flash_attention(q, k, v, causal=causal, version=int(function[-1]))
    assert np.isfinite(got).all()
    # A score of 1e4 carries a float32 rounding of 1e-3 (the bound says how that moves the output).
    assert_within(got, reference.attention(q, k, v, causal), attention_bound(q, k, v), function)


def test_scores_of_1e4_through_the_weights(rng):
    q, k, _ = scores_of_1e4(rng, (2,), 7, 9)
    got = attention_module.attention_weights(q, k)
    assert np.isfinite(got).all() and np.allclose(got.sum(axis=-1), 1.0, atol=softmax_bound(9))


@pytest.mark.parametrize("version", [1, 2])
def test_scores_of_1e4_through_a_decode_step(rng, version):
    q, k, v = scores_of_1e4(rng, (), 2, 11, d_v=4)
    cache = attention_lib.KVCache(2, 11, 4)
    cache.append(np.stack([k, -k]), np.stack([v, v]))                # head 1 gets the opposite scores
    got = attention_lib.decode_step(q, cache, version=version)
    assert np.isfinite(got).all()
    want = reference.attention(q[:, None], cache.keys, cache.values, causal=False)[:, 0]
    assert_within(got, want, attention_bound(q[:, None], cache.keys, cache.values)[:, 0], f"decode v{version}")


def test_scores_of_1e4_through_the_layer(rng):
    # x of std 100 and weights of std 1: q and k of std ~200, scores of several 1e4.
    x = (rng.standard_normal((5, 4)) * 100).astype(np.float32)
    w = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(4)]
    got = attention_lib.multi_head_attention(x, *w, 2)
    assert np.isfinite(got).all()
    want = reference.multi_head_attention(x, *w, 2)
    assert_within(got, want, layer_bound(x, w, [None] * 4, 2), "multi_head_attention")


# --- One position, one dimension ----------------------------------------------------------

T1 = {   # every array of CALLS with T = 1 (and T_k = 1)
    "attention": {"q": (2, 1, 3), "k": (2, 1, 3), "v": (2, 1, 4)},
    "attention_weights": {"q": (2, 1, 3), "k": (2, 1, 3)},
    "flash_attention": {"q": (2, 1, 3), "k": (2, 1, 3), "v": (2, 1, 4)},
    "multi_head_attention": {"x": (1, 4), "w_q": (4, 4), "w_k": (4, 4), "w_v": (4, 4), "w_o": (4, 4),
                             "b_q": (4,), "b_k": (4,), "b_v": (4,), "b_o": (4,)},
    "project": {"x": (1, 3), "w": (3, 4), "b": (4,)},
    "scores": {"q": (1, 3), "k": (1, 3)},
    "apply_causal_mask": {"s": (2, 1, 1)},
    "softmax": {"s": (2, 1, 1)},
    "weighted_sum": {"a": (2, 1, 1), "v": (2, 1, 4)},
    "split_heads": {"x": (1, 6)},
    "merge_heads": {"heads": (3, 1, 2)},
    "decode_step": {"q": (2, 3), "k_new": (2, 1, 3), "v_new": (2, 1, 3)},
}
D1 = {   # d_k = 1 where a function has one (d_model = n_head for the layer and the split)
    "attention": {"q": (2, 5, 1), "k": (2, 6, 1), "v": (2, 6, 1)},
    "attention_weights": {"q": (2, 5, 1), "k": (2, 6, 1)},
    "flash_attention": {"q": (2, 5, 1), "k": (2, 6, 1), "v": (2, 6, 1)},
    "multi_head_attention": {"x": (5, 2), "w_q": (2, 2), "w_k": (2, 2), "w_v": (2, 2), "w_o": (2, 2),
                             "b_q": (2,), "b_k": (2,), "b_v": (2,), "b_o": (2,)},
    "project": {"x": (5, 1), "w": (1, 1), "b": (1,)},
    "scores": {"q": (5, 1), "k": (6, 1)},
    "split_heads": {"x": (5, 3)},
    "merge_heads": {"heads": (3, 5, 1)},
}


def assert_matches(name, got, arrays):
    """got against the reference: exact for copies and masks, within the float32 bounds of
    test_properties for arithmetic (d_model or d_k products, T_k weights)."""
    want = CALLS[name].want(**arrays)
    if name in ("apply_causal_mask", "split_heads", "merge_heads"):
        assert got.dtype == np.float32 and np.array_equal(got, want)
    elif name == "project":
        assert_within(got, want, matmul_bound(arrays["x"], arrays["w"], arrays["b"]), name)
    elif name == "scores":
        q, k = arrays["q"], arrays["k"]
        kt = np.swapaxes(np.abs(k.astype(np.float64)), -1, -2)
        bound = SAFETY * (q.shape[-1] + 2) * U * (np.abs(q.astype(np.float64)) @ kt) / math.sqrt(q.shape[-1])
        assert_within(got, want, bound, name)
    elif name == "softmax":
        assert_within(got, want, softmax_bound(want.shape[-1]), name)
    elif name == "attention_weights":
        # A score error ds moves weight a_j by at most 2 a_j max|ds|; the softmax adds its own.
        bound = SAFETY * 2 * want * score_error(arrays["q"], arrays["k"]) + softmax_bound(want.shape[-1])
        assert_within(got, want, bound, name)
    elif name == "weighted_sum":
        assert_within(got, want, matmul_bound(arrays["a"], arrays["v"]), name)
    elif name == "multi_head_attention":
        weights = [arrays[w] for w in ("w_q", "w_k", "w_v", "w_o")]
        biases = [arrays[b] for b in ("b_q", "b_k", "b_v", "b_o")]
        assert_within(got, want, layer_bound(arrays["x"], weights, biases, N_HEAD), name)
    else:
        q = arrays["q"][:, None] if name == "decode_step" else arrays["q"]
        k, v = (arrays["k_new"], arrays["v_new"]) if name == "decode_step" else (arrays["k"], arrays["v"])
        bound = attention_bound(q, k, v)
        assert_within(got, want, bound[:, 0] if name == "decode_step" else bound, name)


@pytest.mark.parametrize("name", list(T1))
def test_one_position(rng, name):
    arrays = {arg: rng.standard_normal(shape).astype(np.float32) for arg, shape in T1[name].items()}
    got = CALLS[name].run(**arrays)
    assert_matches(name, got, arrays)
    # One key: its weight is exactly 1, so the output is exactly its value.
    if name in ("attention", "flash_attention"):
        assert np.array_equal(got, arrays["v"])
    if name == "decode_step":
        assert np.array_equal(got, arrays["v_new"][:, 0])
    if name in ("softmax", "attention_weights"):
        assert (got == 1.0).all()


@pytest.mark.parametrize("name", list(D1))
def test_heads_of_width_one(rng, name):
    arrays = {arg: rng.standard_normal(shape).astype(np.float32) for arg, shape in D1[name].items()}
    got = CALLS[name].run(**arrays)                 # the layer: 2 heads of d_model 2; the split: 3 of 3
    assert_matches(name, got, arrays)


@pytest.mark.parametrize("version", [1, 2])
def test_decode_with_heads_of_width_one(rng, version):
    q, k, v = rng.standard_normal((3, 2, 9, 1)).astype(np.float32)
    cache = attention_lib.KVCache(2, 9, 1)
    cache.append(k, v)
    got = attention_lib.decode_step(q[:, 0], cache, version=version)
    assert_within(got, reference.attention(q[:, :1], k, v, causal=False)[:, 0],
                  attention_bound(q[:, :1], k, v)[:, 0], f"decode v{version}")


# --- Rows that see nothing ------------------------------------------------------------------

@pytest.mark.parametrize("version", [1, 2])
def test_a_lone_fully_masked_row_gives_zeros(version):
    # One row, every score masked, also longer than softmax v2's block: each thread walks several
    # columns, and all threads must leave together without waiting at a barrier.
    for t_k in (1, softmax_module.THREADS_PER_ROW + 1):
        got = attention_lib.softmax(np.full((1, t_k), -np.inf), version=version)
        assert got.dtype == np.float32 and (got == 0).all()


@pytest.mark.parametrize("function", ["attention", "attention_weights", "flash v1", "flash v2", "flash v3"])
def test_a_single_key_hidden_from_the_first_queries(rng, function):
    # T_q 3 > T_k 1, causal: the queries are the last 3 positions, the key is position 2 of 3,
    # so queries 0 and 1 see no key (zeros) and query 2 sees exactly it.
    q = rng.standard_normal((2, 3, 4)).astype(np.float32)
    k, v = rng.standard_normal((2, 2, 1, 4)).astype(np.float32)
    if function == "attention_weights":
        got = attention_module.attention_weights(q, k)
        assert np.array_equal(got, np.array([[[0.0], [0.0], [1.0]]] * 2, np.float32))
        return
    if function == "attention":
        got = attention_lib.attention(q, k, v)
    else:
        got = attention_lib.flash_attention(q, k, v, version=int(function[-1]))
    assert (got[:, :2] == 0).all() and np.array_equal(got[:, 2], v[:, 0])


# --- Finite inputs that overflow float32 inside the kernels --------------------------------

OVERFLOWING = {   # finite float32 inputs whose scores q . k exceed float32's range
    "attention": lambda q, k, v: attention_lib.attention(q, k, v),
    "attention_weights": lambda q, k, v: attention_module.attention_weights(q, k),
    "flash v1": lambda q, k, v: attention_lib.flash_attention(q, k, v, version=1),
    "flash v2": lambda q, k, v: attention_lib.flash_attention(q, k, v, version=2),
    "flash v3": lambda q, k, v: attention_lib.flash_attention(q, k, v, version=3),
    "decode v1": lambda q, k, v: _decode(q[:, 0], k, v, version=1),
    "decode v2": lambda q, k, v: _decode(q[:, 0], k, v, version=2),
}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")     # the simulator's float32 overflow warnings
@pytest.mark.parametrize("function", list(OVERFLOWING))
def test_scores_beyond_float32_are_refused_not_returned_as_nan(rng, function):
    # Before: q . k = 1e40 became inf, and the softmax inf - inf = NaN, returned silently.
    q = np.full((2, 2, 3), 1e20, np.float32)
    k = np.full((2, 4, 3), 1e20, np.float32)
    v = rng.standard_normal((2, 4, 3)).astype(np.float32)
    what = function.split()[0].replace("flash", "flash_attention").replace("decode", "decode_step")
    with pytest.raises(ValueError) as caught:
        OVERFLOWING[function](q, k, v)
    message = str(caught.value)
    assert "\n" not in message
    assert re.match(rf"^{what}: float32 overflow inside the kernels gave nan at index \([\d, ]+\) of the result; "
                    r"scale (q, k or v|q or k|q or the cached keys and values) down", message), message


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_layer_whose_scores_overflow_is_refused(rng):
    x = np.full((3, 4), 1e15, np.float32)
    w = [np.full((4, 4), 1e5, np.float32) for _ in range(4)]   # q, k of 4e20: scores beyond 3.4e38
    with pytest.raises(ValueError, match=r"^multi_head_attention: float32 overflow .* scale x or the weights down"):
        attention_lib.multi_head_attention(x, *w, 2)


# --- Bad values: NaN, inf, beyond float32, ragged lists --------------------------------------

# -inf is a masked score in the softmax's and the mask's s (test_a_lone_fully_masked_row_gives_zeros).
NOT_FINITE = [(name, arg, bad) for name, arg in ARGUMENTS for bad in (np.nan, np.inf, -np.inf)
              if not (bad == -np.inf and arg in CALLS[name].neg_inf_ok)]


@pytest.mark.parametrize("name, arg, bad", NOT_FINITE, ids=[f"{n}-{a}-{b}" for n, a, b in NOT_FINITE])
def test_nan_and_inf_are_refused_naming_the_argument_and_the_index(name, arg, bad):
    call = CALLS[name]
    value = arrays_for(name)[arg]
    where = np.unravel_index(value.size - 1, value.shape)           # the last element
    value[where] = bad
    index = re.escape(str(tuple(int(i) for i in where)))
    raises_one_line(ValueError, call, with_one(name, arg, value),
                    rf"^{arg} contains {re.escape(str(np.float32(bad)))} at index {index}; it must be finite$")


@pytest.mark.parametrize("sign", [1, -1], ids=["+", "-"])
@pytest.mark.parametrize("name, arg", ARGUMENTS, ids=[f"{n}-{a}" for n, a in ARGUMENTS])
def test_finite_values_beyond_float32_are_refused_not_made_infinite(name, arg, sign):
    # Before: 1e39 became inf in the conversion and was reported as "contains inf"; -1e39 in
    # scores became -inf, a masked score, silently.
    value = arrays_for(name)[arg].astype(np.float64)
    value.flat[0] = sign * 1e39
    index = re.escape(str((0,) * value.ndim))
    raises_one_line(ValueError, CALLS[name], with_one(name, arg, value),
                    rf"^{arg} contains {re.escape(str(sign * 1e39))} at index {index}, beyond float32's range "
                    r"\(\+-3\.403e\+38\); scale it down$")


def test_a_row_of_scores_beyond_float32_is_not_taken_for_a_masked_row():
    # softmax([-1e39, -1e39]) is [0.5, 0.5]; converted to float32 the row was all -inf and came
    # back as zeros, a silent wrong answer. Now it is refused.
    assert np.allclose(reference.softmax(np.array([[-1e39, -1e39]])), 0.5)
    with pytest.raises(ValueError, match=r"^s contains -1e\+39 at index \(0, 0\), beyond float32's range"):
        attention_lib.softmax(np.array([[-1e39, -1e39]]))


@pytest.mark.parametrize("name, arg", ARGUMENTS, ids=[f"{n}-{a}" for n, a in ARGUMENTS])
def test_ragged_lists_are_refused_naming_the_argument(name, arg):
    # Before: NumPy's own "setting an array element with a sequence..." without the argument.
    good = arrays_for(name)[arg].tolist()
    ragged = [good[0], good[0][:-1]] if isinstance(good[0], list) else [good, good[:-1]]
    raises_one_line(ValueError, CALLS[name], with_one(name, arg, ragged),
                    rf"^{arg} must be an array of shape \(.*\), got a ragged list "
                    r"\(nested sequences of different lengths\)$")


# --- Bad dtypes and ranks ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [bool, np.complex64, object], ids=["bool", "complex", "object"])
@pytest.mark.parametrize("name, arg", ARGUMENTS, ids=[f"{n}-{a}" for n, a in ARGUMENTS])
def test_bool_complex_and_object_arrays_are_refused_naming_the_argument(name, arg, dtype):
    value = arrays_for(name)[arg].astype(dtype)
    raises_one_line(TypeError, CALLS[name], with_one(name, arg, value),
                    rf"^{arg} must be a float array of shape \(.*\), got dtype {np.dtype(dtype)}$")


# Arguments of a fixed rank: one more axis is wrong too (elsewhere it is a batch axis).
FIXED_RANK = ({("project", "w"), ("project", "b")} | {("decode_step", arg) for arg in CALLS["decode_step"].shapes}
              | {("multi_head_attention", arg) for arg in CALLS["multi_head_attention"].shapes})


def wrong_ranks(name, arg):
    """Shapes of the wrong rank for CALLS[name]'s `arg`: every element on one axis (a vector
    made a matrix) and, for fixed-rank arguments, one leading axis more."""
    shape = CALLS[name].shapes[arg]
    shapes = [(math.prod(shape),) if len(shape) > 1 else (1, *shape)]
    if (name, arg) in FIXED_RANK and len(shape) > 1:
        shapes.append((1, *shape))
    return shapes


@pytest.mark.parametrize("name, arg", ARGUMENTS, ids=[f"{n}-{a}" for n, a in ARGUMENTS])
def test_wrong_ranks_are_refused_naming_the_argument_and_both_shapes(name, arg):
    for shape in wrong_ranks(name, arg):
        message = raises_one_line(ValueError, CALLS[name], with_one(name, arg, np.zeros(shape, np.float32)),
                                  rf"^{arg} must have shape \(")
        assert f"got shape {shape}" in message or f"got {shape}" in message, message


# Only what the module tests do not pin already (their tables cover attention, flash_attention,
# scores, weighted_sum and KVCache.append).
@pytest.mark.parametrize("name, changes, pattern", [
    ("attention_weights", {"k": (2, 6, 4)},
     r"^k must have d_k = 3 in its last axis, like q \(2, 5, 3\); got shape \(2, 6, 4\)$"),
    ("attention_weights", {"k": (3, 6, 3)},
     r"^k must have shape \('H_kv', 6, 3\) with H_kv one of 1, 2 \(a divisor of q's 2 heads on axis -3\); got shape \(3, 6, 3\)$"),
    ("attention_weights", {"k": (1, 2, 6, 3)}, r"^k must have the leading axes of q \(2,\); got shape \(1, 2, 6, 3\)$"),
    ("decode_step", {"q": (2, 4)},
     r"^q must have shape \(n_head, d_k\) = \(2, 3\) or \(2, 1, 3\) to match the cache, got \(2, 4\)$"),
], ids=["weights-k-d_k", "weights-k-heads", "weights-k-leading-axes", "decode-q-d_k"])
def test_mismatched_d_k_and_leading_axes_are_refused_naming_the_argument(name, changes, pattern):
    arrays = arrays_for(name)
    arrays.update({arg: np.zeros(shape, np.float32) for arg, shape in changes.items()})
    raises_one_line(ValueError, CALLS[name], arrays, pattern)


# --- Accepted input: other dtypes, views, read-only arrays ---------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int64, np.int8],
                         ids=["float64", "float16", "int64", "int8"])
@pytest.mark.parametrize("name", list(CALLS))
def test_other_numeric_dtypes_are_converted_to_float32(name, dtype):
    # Small integers are exact in every dtype here, so the converted arrays are the very float32
    # numbers of the float32 call: the result must be identical, bit for bit.
    arrays = {arg: value.astype(dtype) for arg, value in arrays_for(name, integers=True).items()}
    got = CALLS[name].run(**arrays)
    assert got.dtype == np.float32 and np.array_equal(got, float32_result(name, integers=True))
    assert_matches(name, got, arrays)


@pytest.mark.parametrize("name", list(CALLS))
def test_float64_input_gives_the_reference_in_float32(name):
    arrays = {arg: value.astype(np.float64) for arg, value in arrays_for(name).items()}
    got = CALLS[name].run(**arrays)
    assert got.dtype == np.float32 and np.array_equal(got, float32_result(name))
    assert_matches(name, got, arrays)


def non_contiguous(value):
    """The same numbers in a view that is not C-contiguous: a transposed copy transposed back
    (2 axes or more), every other element of a longer array (1 axis)."""
    if value.ndim >= 2:
        view = np.ascontiguousarray(np.swapaxes(value, -1, -2)).swapaxes(-1, -2)
    else:
        view = np.repeat(value, 2)[::2]
    assert np.array_equal(view, value) and not view.flags.c_contiguous
    return view


@pytest.mark.parametrize("name", list(CALLS))
def test_non_contiguous_views_give_the_same_result(name):
    arrays = {arg: non_contiguous(value) for arg, value in arrays_for(name).items()}
    got = CALLS[name].run(**arrays)
    assert got.dtype == np.float32 and np.array_equal(got, float32_result(name))
    assert_matches(name, got, arrays)


@pytest.mark.parametrize("name", list(CALLS))
def test_read_only_arrays_work_and_are_left_untouched(name):
    arrays = arrays_for(name)
    before = {arg: value.copy() for arg, value in arrays.items()}
    for value in arrays.values():
        value.setflags(write=False)           # float32 and contiguous: passed through unconverted
    got = CALLS[name].run(**arrays)
    assert np.array_equal(got, float32_result(name))
    assert got.flags.writeable and not any(np.shares_memory(got, value) for value in arrays.values())
    for arg, value in arrays.items():
        assert np.array_equal(value, before[arg]), f"{name} changed its argument {arg}"


# --- Sizes the simulator would take minutes on --------------------------------------------

def _big_cache():
    # A context of 2**20 positions in 12 heads. d_k 1 keeps the arrays small (48 MB); the
    # decode launch's grid depends on the positions and the heads only.
    cache = attention_lib.KVCache(12, 2**20, 1)
    cache.append(np.zeros((12, 2**20, 1), np.float32), np.zeros((12, 2**20, 1), np.float32))
    return cache


def _zeros(*shape):
    return np.zeros(shape, np.float32)


# ANDREA-120M sizes: one layer of one sequence, 12 heads of 64, T 1024, or a batch of sequences
# where one takes the simulator less than its two minutes (the softmax: 1.6 min measured).
ANDREA = {
    "attention": lambda: (lambda a=_zeros(12, 1024, 64): attention_lib.attention(a, a, a)),
    "attention_weights": lambda: (lambda a=_zeros(12, 1024, 64): attention_module.attention_weights(a, a)),
    "flash_attention": lambda: (lambda a=_zeros(12, 1024, 64): attention_lib.flash_attention(a, a, a)),
    "multi_head_attention": lambda: (lambda x=_zeros(1024, 768), w=_zeros(768, 768):
                                     attention_lib.multi_head_attention(x, w, w, w, w, 12)),
    "project": lambda: (lambda x=_zeros(1024, 768), w=_zeros(768, 2304): attention_lib.project(x, w)),
    "scores": lambda: (lambda a=_zeros(12, 1024, 64): attention_lib.scores(a, a)),
    "apply_causal_mask": lambda: (lambda s=_zeros(12, 1024, 1024): attention_lib.apply_causal_mask(s)),
    "softmax": lambda: (lambda s=_zeros(4, 12, 1024, 1024): attention_lib.softmax(s)),
    "weighted_sum": lambda: (lambda a=_zeros(12, 1024, 1024), v=_zeros(12, 1024, 64): attention_lib.weighted_sum(a, v)),
    "split_heads": lambda: (lambda x=_zeros(8, 1024, 768): attention_lib.split_heads(x, 12)),
    "merge_heads": lambda: (lambda h=_zeros(8, 12, 1024, 64): attention_lib.merge_heads(h)),
    "decode_step": lambda: (lambda q=_zeros(12, 1), cache=_big_cache(): attention_lib.decode_step(q, cache)),
}


class Launched(Exception):
    """Raised in place of the first copy to the device: the call got past every check."""


@pytest.mark.parametrize("name", list(ANDREA))
def test_sizes_that_take_minutes_are_refused_with_the_estimate_and_the_override(monkeypatch, name):
    call = ANDREA[name]()                           # big arrays made before the device is mocked
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    monkeypatch.delenv(launch.ALLOW_SLOW_VARIABLE, raising=False)

    def launched(*args, **kwargs):
        raise Launched()
    # Never launch for real, even where the budget wrongly lets a launch through.
    monkeypatch.setattr(cuda, "to_device", launched)
    monkeypatch.setattr(cuda, "device_array", launched)
    with pytest.raises(ValueError) as caught:
        call()
    message = str(caught.value)
    found = re.fullmatch(rf"{name}: ([\d,]+) CUDA threads would take about (\d+) min on the simulator; "
                         r"use smaller sizes \(attention_lib\.SIZES\) "
                         r"or set ATTENTION_LIB_ALLOW_SLOW=1 to run it anyway",
                         message)
    assert found, message
    threads, minutes = int(found[1].replace(",", "")), int(found[2])
    assert minutes >= 3, message                    # "more than a few minutes"
    assert minutes * 60 + 30 >= threads / launch.SIMULATOR_THREADS_PER_SECOND   # at least the threads' own time
    monkeypatch.setenv(launch.ALLOW_SLOW_VARIABLE, "1")
    with pytest.raises(Launched):                   # with the override the call goes ahead
        call()
