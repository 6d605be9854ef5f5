"""The public API at the top of attention_lib: every stage callable, each with a NumPy twin."""

import attention_lib
import numpy as np
import pytest
from attention_lib import reference

STAGES = ["project", "scores", "apply_causal_mask", "softmax", "weighted_sum", "split_heads", "merge_heads"]


def test_public_names():
    for name in attention_lib.__all__:
        assert hasattr(attention_lib, name), name
    for name in STAGES + ["attention", "multi_head_attention"]:
        assert callable(getattr(attention_lib, name))
        assert callable(getattr(reference, name)), f"reference has no twin of {name}"


def test_each_stage_equals_its_twin_at_an_awkward_size(rng):
    q, k, v = rng.standard_normal((3, 2, 7, 5))            # 2 heads, T 7, d_k 5
    x, w = rng.standard_normal((7, 6)), rng.standard_normal((6, 5))
    s = reference.scores(q, k)
    a = reference.softmax(reference.apply_causal_mask(s))
    pairs = [
        ("project", (x, w)), ("scores", (q, k)), ("apply_causal_mask", (s,)), ("softmax", (s,)),
        ("weighted_sum", (a, v)), ("split_heads", (x, 3)), ("merge_heads", (q,)),
        ("attention", (q, k, v)),
    ]
    for name, args in pairs:
        got, want = getattr(attention_lib, name)(*args), getattr(reference, name)(*args)
        assert got.dtype == np.float32 and got.shape == want.shape, name
        # masked entries are -inf in both; float32 kernels against float64 within 1e-5
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5), name


def test_bad_input_at_the_top_level_is_one_line_naming_the_argument(rng):
    q = rng.standard_normal((2, 7, 5))
    with pytest.raises(ValueError) as error:
        attention_lib.attention(q, q[:, :, :4], q)
    message = str(error.value)
    assert "\n" not in message and "k" in message and "(2, 7, 4)" in message


def test_public_functions_are_plain_functions_and_stage_modules_are_not_callable():
    import inspect
    import types

    from attention_lib import stages
    from attention_lib.stages import softmax as softmax_module
    for name in attention_lib.__all__:
        value = getattr(attention_lib, name)
        assert not isinstance(value, types.ModuleType), f"attention_lib.{name} is a module"
        if inspect.isfunction(value):
            assert "args" not in inspect.signature(value).parameters, name
    assert attention_lib.softmax is softmax_module.softmax
    assert not callable(softmax_module) and hasattr(softmax_module, "softmax_kernel_v1")
    assert stages.__file__.endswith("stages/__init__.py")
