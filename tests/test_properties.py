"""Property tests: every public function against its float64 twin in attention_lib.reference,
on shapes and magnitudes drawn by Hypothesis, and the invariants attention must keep.

Shapes: T from 1 to 20 (one or two 16-wide tiles, edges partly used), d_k from 1 to 12, 1 to 3
heads, with or without a batch axis. Magnitudes: standard normals times 10**e, e drawn from
[-3, 2]; for q and k together the product of the two scales stays at most 1e2, so scores stay
within a few thousand and every exp argument is sane (±1e4 scores have their own tests in
test_edges.py). Every example is drawn deterministically (derandomize=True), so CI sees the same
examples on every run; the counts keep the whole file around a minute on the simulator.

Tolerances. The inputs are float32 and the reference sees exactly the same numbers in float64,
so the difference is the kernels' float32 rounding alone. Each bound below is the textbook
worst case (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3): a float32 sum of n
products a_i b_i is off by at most n * U * sum |a_i b_i|, U = 2**-24 the unit roundoff, so the
error grows with the sum length (d_model for a projection, d_k for a score, T_k for the softmax
and the weighted sum) and with the magnitudes, never with luck. SAFETY = 2 covers the few
roundings the counts leave out (the scale multiplication, exp's last bit on a GPU). A kernel
that drops the scale, the mask or a tile is off by a fraction of the values themselves, far
above these bounds at ordinary magnitudes.
"""

import math

import attention_lib
import numpy as np
from attention_lib.stages import attention as attention_module
from attention_lib import reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

U = 2.0 ** -24          # float32 unit roundoff
SAFETY = 2.0


def examples(n):
    """Hypothesis settings: n examples, the same ones on every run, no wall-clock deadline
    (the simulator's speed depends on the machine's load), no example database on disk."""
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


# --- Strategies ------------------------------------------------------------------------------

leads = st.one_of(st.just(()), st.tuples(st.integers(1, 3)),                    # heads
                  st.tuples(st.integers(1, 2), st.integers(1, 3)))             # batch, heads
lengths = st.integers(1, 20)
widths = st.integers(1, 12)
seeds = st.integers(0, 2 ** 32 - 1)
exponents = st.floats(-3.0, 2.0)


@st.composite
def qk_exponents(draw):
    """log10 of the scales of q and of k, their sum at most 2: scores of at most ~1e2 std."""
    e_q = draw(exponents)
    e_k = draw(st.floats(-3.0, min(2.0, 2.0 - e_q)))
    return e_q, e_k


def normal(rng, shape, exponent=0.0):
    """Standard normals times 10**exponent, as float32 (the reference gets the same numbers)."""
    return (rng.standard_normal(shape) * 10.0 ** exponent).astype(np.float32)


# --- Error bounds ----------------------------------------------------------------------------

def f64abs(a):
    return np.abs(np.asarray(a, np.float64))


def matmul_bound(x, w, b=None):
    """x @ w (+ b) in float32, x (..., n): each output off by at most (n + 1) U sum |x_i w_i|
    (+ U |b|): n products summed, and the bias added."""
    n = np.shape(x)[-1]
    bound = (n + 1) * U * (f64abs(x) @ f64abs(w))
    return SAFETY * (bound if b is None else bound + U * f64abs(b))


def score_error(q, k, dq=None, dk=None):
    """Worst error of each query's scores q . k_j / sqrt(d_k), over its keys: (..., T_q, 1).

    A dot product of d_k float32 products is off by d_k U sum |q_c k_c|, the scale adds a
    rounding or two (d_k + 3). dq, dk: bounds on errors already in q and k (the projections of
    multi_head_attention), which move the score by |dq| |k| + |q| |dk| + |dq| |dk|.
    """
    aq, ak = f64abs(q), f64abs(k)
    kt = np.swapaxes(ak, -1, -2)
    err = (q.shape[-1] + 3) * U * (aq @ kt)
    if dq is not None:
        dkt = np.swapaxes(dk, -1, -2)
        err = err + dq @ kt + aq @ dkt + dq @ dkt
    return err.max(axis=-1, keepdims=True) / math.sqrt(q.shape[-1])


def attention_bound(q, k, v, dq=None, dk=None, dv=None):
    """Elementwise bound on |attention(q, k, v) - reference.attention(q, k, v)|: (..., T_q, d_v).

    A score error ds moves each weight by a_j (ds_j - sum_l a_l ds_l), so the output moves by at
    most 2 max|ds| max_j |v_j|. The softmax's sum of T_k terms, its exp(s - m) arguments, the
    weighted sum of T_k values and (in the fused kernels) the online rescaling of l and acc once
    per key add at most about 5 T_k roundings of max_j |v_j|, whatever the scores' size.
    dv: a bound on errors already in v.
    """
    v_max = f64abs(v).max(axis=-2, keepdims=True)                  # (..., 1, d_v)
    bound = (2 * score_error(q, k, dq, dk) + (5 * k.shape[-2] + 8) * U) * v_max
    if dv is not None:
        bound = bound + dv.max(axis=-2, keepdims=True)             # weights sum to 1: at most max |dv|
    return SAFETY * bound


def softmax_bound(t_k):
    """|softmax(s) - reference.softmax(s)| per weight: the T_k-term sum and the normalisation
    give each weight a relative error of (T_k + 4) U; s - max rounds too, by U |s - max|, but
    exp(s - max) |s - max| <= 1/e keeps that below U (1 + T_k) / e in absolute terms. Both are
    below (2 T_k + 6) U, whatever the magnitude of s."""
    return SAFETY * (2 * t_k + 6) * U


def assert_within(got, want, bound, what):
    assert got.dtype == np.float32 and got.shape == want.shape, (what, got.dtype, got.shape, want.shape)
    err = np.abs(got.astype(np.float64) - want)
    assert (err <= bound).all(), f"{what}: error {err.max():.3g} exceeds the bound by {(err / bound).max():.3g}x"


# --- The whole attention ------------------------------------------------------------------

@st.composite
def qkv_cases(draw, max_t=20, same_width=False):
    lead, d_k, d_v = draw(leads), draw(widths), draw(widths)
    d_v = d_k if same_width else d_v                           # flash v3 needs d_v = d_k
    t_q, t_k = draw(st.integers(1, max_t)), draw(st.integers(1, max_t))
    e_q, e_k = draw(qk_exponents())
    rng = np.random.default_rng(draw(seeds))
    q = normal(rng, (*lead, t_q, d_k), e_q)
    k = normal(rng, (*lead, t_k, d_k), e_k)
    v = normal(rng, (*lead, t_k, d_v), draw(exponents))
    return q, k, v, draw(st.booleans())


@examples(12)
@given(qkv_cases())
def test_attention_equals_the_reference(case):
    q, k, v, causal = case
    got = attention_lib.attention(q, k, v, causal=causal)
    assert_within(got, reference.attention(q, k, v, causal), attention_bound(q, k, v), "attention")


@examples(25)
@given(qkv_cases(), st.sampled_from([1, 2]))
def test_flash_attention_equals_the_reference(case, version):
    q, k, v, causal = case
    got = attention_lib.flash_attention(q, k, v, causal=causal, version=version)
    assert_within(got, reference.attention(q, k, v, causal), attention_bound(q, k, v), "flash_attention")


@examples(15)
@given(qkv_cases(same_width=True))
def test_flash_attention_v3_equals_the_reference(case):
    q, k, v, causal = case
    got = attention_lib.flash_attention(q, k, v, causal=causal, version=3)
    assert_within(got, reference.attention(q, k, v, causal), attention_bound(q, k, v), "flash_attention v3")


@examples(10)
@given(qkv_cases())
def test_attention_weights_equal_the_reference_and_rows_sum_to_one(case):
    q, k, _, causal = case
    got = attention_module.attention_weights(q, k, causal=causal)
    want = reference.attention_weights(q, k, causal)
    # A score error ds moves weight a_j by at most 2 a_j max|ds|; the softmax adds its own.
    assert_within(got, want, SAFETY * 2 * want * score_error(q, k) + softmax_bound(k.shape[-1]), "attention_weights")
    assert (got >= 0).all()
    sums = got.astype(np.float64).sum(axis=-1)
    sees_a_key = want.sum(axis=-1) > 0.5                       # causal with T_q > T_k: the first queries see none
    # Each weight is e_j * (1 / fl(sum e)): they sum to 1 within the sum's own rounding.
    assert np.allclose(sums[sees_a_key], 1.0, rtol=0, atol=softmax_bound(k.shape[-1]))
    assert (sums[~sees_a_key] == 0).all()
    if causal:                                                 # the future gets exactly 0
        assert (got[..., ~reference.causal_mask(q.shape[-2], k.shape[-2])] == 0).all()


@st.composite
def future_changes(draw, same_width=False):
    """A causal case and a first key j0 from which k and v are replaced by other numbers."""
    q, k, v, _ = draw(qkv_cases(same_width=same_width))
    j0 = draw(st.integers(0, k.shape[-2] - 1))
    rng = np.random.default_rng(draw(seeds))
    k2, v2 = k.copy(), v.copy()
    k2[..., j0:, :] = normal(rng, k2[..., j0:, :].shape)
    v2[..., j0:, :] = 10 + normal(rng, v2[..., j0:, :].shape)
    # Query i sits at position i + (T_k - T_q) and sees keys up to there: those before j0.
    seeing_only_the_past = int(np.clip(j0 - (k.shape[-2] - q.shape[-2]), 0, q.shape[-2]))
    return q, k, v, k2, v2, seeing_only_the_past


def both_in_one_call(function, q, k, v, k2, v2, **kwargs):
    """function on (q, k, v) and on (q, k2, v2), stacked on a new leading axis: one launch."""
    out = function(np.stack([q, q]), np.stack([k, k2]), np.stack([v, v2]), causal=True, **kwargs)
    return out[0], out[1]


@examples(10)
@given(future_changes())
def test_attention_never_leaks_the_future(case):
    q, k, v, k2, v2, n = case
    before, after = both_in_one_call(attention_lib.attention, q, k, v, k2, v2)
    # Exactly equal: a masked weight is exactly 0, and 0 * v adds nothing whatever v is.
    assert np.array_equal(before[..., :n, :], after[..., :n, :])


@examples(20)
@given(future_changes(), st.sampled_from([1, 2]))
def test_flash_attention_never_leaks_the_future(case, version):
    q, k, v, k2, v2, n = case
    before, after = both_in_one_call(attention_lib.flash_attention, q, k, v, k2, v2, version=version)
    # Exactly equal: the fused kernels never score a key after the query's position.
    assert np.array_equal(before[..., :n, :], after[..., :n, :])


@examples(10)
@given(future_changes(same_width=True))
def test_flash_attention_v3_never_leaks_the_future(case):
    q, k, v, k2, v2, n = case
    before, after = both_in_one_call(attention_lib.flash_attention, q, k, v, k2, v2, version=3)
    # Exactly equal: v3 scores a diagonal tile's future keys, but masks them to -inf before the
    # max, so each weighs exactly 0 and 0 * v adds nothing.
    assert np.array_equal(before[..., :n, :], after[..., :n, :])


@st.composite
def layer_cases(draw):
    """x of (T, d_model) or (B, T, d_model), d_model = n_head * d_k <= 12, weights of the
    usual N(0, 1/d_model) initialisation times 10**e, some biases."""
    n_head, d_k = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    d_model = n_head * d_k
    lead = draw(st.sampled_from([(), (1,), (2,)]))
    T = draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(seeds))
    x = normal(rng, (*lead, T, d_model), draw(st.floats(-3.0, 1.0)))
    e_w = draw(st.floats(-1.0, 0.5))
    weights = [normal(rng, (d_model, d_model), e_w - 0.5 * math.log10(d_model)) for _ in range(4)]
    biases = [normal(rng, (d_model,)) if draw(st.booleans()) else None for _ in range(4)]
    return x, weights, biases, n_head, draw(st.booleans())


def layer_bound(x, weights, biases, n_head):
    """The bounds above chained through the layer: projection errors enter the scores (dq, dk)
    and the values (dv); the merged heads' errors pass through W_O, which adds its own sum of
    d_model products."""
    w_q, w_k, w_v, w_o = weights
    b_q, b_k, b_v, b_o = biases
    heads = [reference.split_heads(reference.project(x, w, b), n_head) for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v))]
    errors = [reference.split_heads(matmul_bound(x, w, b), n_head) for w, b in ((w_q, b_q), (w_k, b_k), (w_v, b_v))]
    head_error = attention_bound(*heads, *errors)                              # (..., n_head, T, d_k)
    merged = reference.merge_heads(reference.attention(*heads, causal=True))   # magnitudes only
    return reference.merge_heads(head_error) @ f64abs(w_o) + matmul_bound(merged, w_o, b_o)


@examples(8)
@given(layer_cases())
def test_multi_head_attention_equals_the_reference(case):
    x, weights, biases, n_head, causal = case
    b_q, b_k, b_v, b_o = biases
    got = attention_lib.multi_head_attention(x, *weights, n_head, causal=causal, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o)
    want = reference.multi_head_attention(x, *weights, n_head, causal=causal, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o)
    assert_within(got, want, layer_bound(x, weights, biases, n_head), "multi_head_attention")


# --- The stages ------------------------------------------------------------------------------

@st.composite
def projection_cases(draw):
    lead = draw(st.sampled_from([(), (2,), (2, 2)]))
    T, d_model, d_out = draw(lengths), draw(widths), draw(widths)
    rng = np.random.default_rng(draw(seeds))
    x = normal(rng, (*lead, T, d_model), draw(exponents))
    w = normal(rng, (d_model, d_out), draw(exponents))
    b = normal(rng, (d_out,), draw(exponents)) if draw(st.booleans()) else None
    return x, w, b, draw(st.sampled_from([1, 2, 3]))


@examples(15)
@given(projection_cases())
def test_project_equals_the_reference(case):
    x, w, b, version = case
    assert_within(attention_lib.project(x, w, b, version=version), reference.project(x, w, b),
                  matmul_bound(x, w, b), f"project v{version}")


@examples(12)
@given(qkv_cases(), st.booleans(), st.sampled_from([1, 2]))
def test_scores_equal_the_reference(case, scale, version):
    q, k, _, _ = case
    got = attention_lib.scores(q, k, scale=scale, version=version)
    want = reference.scores(q, k, scale=scale)
    # d_k products summed, then (scaled) one more rounding: (d_k + 2) U sum |q_c k_c| / sqrt(d_k).
    divisor = math.sqrt(q.shape[-1]) if scale else 1.0
    bound = SAFETY * (q.shape[-1] + 2) * U * (f64abs(q) @ np.swapaxes(f64abs(k), -1, -2)) / divisor
    assert_within(got, want, bound, f"scores v{version}")


@st.composite
def score_cases(draw, max_rows=40):
    """Scores (..., T_q, T_k) of std 10**e, e in [-3, 4], some already masked (-inf), causal or
    not; with T_q > T_k the causal mask leaves the first rows with nothing."""
    lead = draw(st.sampled_from([(), (2,), (1, 2)]))
    t_q = draw(st.integers(1, max(1, max_rows // math.prod(lead))))
    t_k = draw(lengths)
    rng = np.random.default_rng(draw(seeds))
    s = normal(rng, (*lead, t_q, t_k), draw(st.floats(-3.0, 4.0)))
    if draw(st.booleans()):
        s[rng.random(s.shape) < draw(st.floats(0.0, 0.5))] = -np.inf
    return s, draw(st.booleans())


@examples(15)
@given(score_cases())
def test_apply_causal_mask_equals_the_reference_exactly(case):
    s, _ = case
    before = s.copy()
    got = attention_lib.apply_causal_mask(s)
    # Copying a score or writing -inf rounds nothing: equal, -inf included.
    assert got.dtype == np.float32 and np.array_equal(got, reference.apply_causal_mask(s))
    assert np.array_equal(s, before)                         # the input is left as it was


@examples(15)
@given(score_cases(max_rows=12), st.sampled_from([1, 2, 3]))
def test_softmax_equals_the_reference_with_its_three_properties(case, version):
    s, causal = case
    s = reference.apply_causal_mask(s).astype(np.float32) if causal else s
    got = attention_lib.softmax(s, version=version)
    want = reference.softmax(s)
    bound = softmax_bound(s.shape[-1])
    assert_within(got, want, bound, f"softmax v{version}")
    assert (got >= 0).all()
    masked_row = np.isneginf(s).all(axis=-1)
    assert (got[masked_row] == 0).all()                       # attends to nothing, never NaN
    assert np.allclose(got.astype(np.float64).sum(axis=-1)[~masked_row], 1.0, rtol=0, atol=bound)
    assert (got[np.isneginf(s)] == 0).all()                   # a masked score gets exactly 0
    # Monotone along a row: a larger score never gets a smaller weight.
    larger = s[..., :, None] > s[..., None, :]
    assert (got[..., :, None] >= got[..., None, :])[larger].all()


@examples(12)
@given(score_cases(), widths, exponents, seeds, st.sampled_from([1, 2]))
def test_weighted_sum_equals_the_reference(case, d_v, e_v, seed, version):
    s, _ = case
    a = reference.softmax(s).astype(np.float32)                # weights in [0, 1], zero rows too
    v = normal(np.random.default_rng(seed), (*s.shape[:-2], s.shape[-1], d_v), e_v)
    assert_within(attention_lib.weighted_sum(a, v, version=version), reference.weighted_sum(a, v),
                  matmul_bound(a, v), f"weighted_sum v{version}")


@st.composite
def head_cases(draw):
    lead = draw(st.sampled_from([(), (1,), (2,), (2, 2)]))
    n_head, d_k, T = draw(st.integers(1, 3)), draw(widths), draw(lengths)
    rng = np.random.default_rng(draw(seeds))
    return normal(rng, (*lead, T, n_head * d_k), draw(exponents)), n_head


@examples(15)
@given(head_cases())
def test_merge_undoes_split_exactly(case):
    x, n_head = case
    heads = attention_lib.split_heads(x, n_head)
    # Copies move numbers without arithmetic: every comparison is exact.
    assert np.array_equal(heads, reference.split_heads(x, n_head))
    merged = attention_lib.merge_heads(heads)
    assert merged.dtype == np.float32 and np.array_equal(merged, x)
    assert np.array_equal(attention_lib.split_heads(merged, n_head), heads)   # and split undoes merge


# --- Decoding with the cache -----------------------------------------------------------------

@st.composite
def decode_cases(draw):
    """A KVCache filled by 1 to 3 appends, a query per head, magnitudes as above."""
    n_head, d_k = draw(st.integers(1, 3)), draw(widths)
    appends = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3))
    length = sum(appends)
    capacity = length + draw(st.integers(0, 5))
    e_q, e_k = draw(qk_exponents())
    e_v = draw(exponents)
    rng = np.random.default_rng(draw(seeds))
    cache = attention_lib.KVCache(n_head, capacity, d_k)
    stale = np.full((n_head, capacity, d_k), np.nan, np.float32)   # a kernel reading past `length` gets NaN
    cache.k_device.copy_to_device(stale)
    cache.v_device.copy_to_device(stale)
    for t_new in appends:
        cache.append(normal(rng, (n_head, t_new, d_k), e_k), normal(rng, (n_head, t_new, d_k), e_v))
    return normal(rng, (n_head, d_k), e_q), cache, draw(st.sampled_from([1, 2]))


@examples(20)
@given(decode_cases())
def test_decode_step_equals_the_reference(case):
    q, cache, version = case
    keys, values = cache.keys, cache.values                       # (n_head, length, d_k)
    got = attention_lib.decode_step(q, cache, version=version)
    # One query per head against every cached position (T_q = 1: the causal mask hides nothing).
    want = reference.attention(q[:, None], keys, values, causal=False)[:, 0]
    assert_within(got, want, attention_bound(q[:, None], keys, values)[:, 0], f"decode_step v{version}")
    assert np.array_equal(cache.keys, keys) and cache.length == keys.shape[1]   # decoding leaves the cache alone
