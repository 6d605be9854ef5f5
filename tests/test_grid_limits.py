"""CUDA's grid limits (x <= 2**31 - 1 blocks, y and z <= 65,535): launchers refuse a grid past
them in one line naming the argument and the size, before anything is allocated on the device."""

import re

import numpy as np
import pytest
from numba import cuda

import attention_lib
from attention_lib import reference
from attention_lib.platform.launch import MAX_GRID, check_grid
from attention_lib.stages import basics, projection


@pytest.fixture
def no_device_memory(monkeypatch):
    """Any device allocation or copy fails the test: the refusal must come before them."""
    def refuse(*args, **kwargs):
        raise AssertionError("the launcher allocated device memory before checking its grid")
    for name in ("to_device", "device_array", "device_array_like"):
        monkeypatch.setattr(cuda, name, refuse)


def test_limits_are_cudas():
    assert MAX_GRID == {"x": 2_147_483_647, "y": 65_535, "z": 65_535}


@pytest.mark.parametrize("grid, axis", [((2**31, 1, 1), "x"), ((1, 65_536), "y"), ((7, 1, 65_536), "z"),
                                        (2**31, "x")])
def test_check_grid_refuses_each_axis_past_its_limit(grid, axis):
    with pytest.raises(ValueError) as refused:
        check_grid("demo", grid, **{axis: "arg's count"})
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith("demo: arg's count needs ")
    assert f"grid's {axis} axis" in message and f"{MAX_GRID[axis]:,}" in message


def test_check_grid_accepts_the_limits_themselves():
    check_grid("demo", (2**31 - 1, 65_535, 65_535))
    check_grid("demo", 1)


def test_flash_attention_refuses_more_than_65535_heads_on_y(no_device_memory):
    q = np.zeros((65_536, 1, 1), np.float32)                 # BH = 65,536 heads of T 1, d_k 1
    with pytest.raises(ValueError, match=r"^flash_attention: q's batch x heads needs 65,536 blocks "
                                         r"on the grid's y axis, more than CUDA's limit of 65,535"):
        attention_lib.flash_attention(q, q, q)


def test_scores_refuse_more_than_65535_heads_on_z(no_device_memory):
    q = np.zeros((2, 32_768, 1, 1), np.float32)              # batch 2 x 32,768 heads
    with pytest.raises(ValueError, match=r"^scores: q's batch x heads needs 65,536 blocks on the grid's z axis"):
        attention_lib.scores(q, q)


def test_projection_refuses_too_many_rows_on_y(no_device_memory):
    rows = 65_535 * projection.TILE + 1                      # one row past 65,535 tiles of 16
    x = np.zeros((rows, 1), np.float32)
    with pytest.raises(ValueError, match=r"^project: x's rows \(batch x T\) in tiles needs 65,536 blocks"):
        attention_lib.project(x, np.ones((1, 1), np.float32))


def test_a_grid_within_the_limits_still_runs(rng):
    q = rng.standard_normal((3, 7, 4)).astype(np.float32)
    np.testing.assert_allclose(attention_lib.flash_attention(q, q, q), reference.attention(q, q, q),
                               rtol=1e-4, atol=1e-5)
    block_of, _ = basics.whoami_2d(19, 33)                   # a 2-D grid of 5 x 3 blocks of (8, 8)
    assert block_of.max() == 5 * 3 - 1


@pytest.mark.parametrize("version", [0, 3, 2.0, True, "2", None])
def test_a_bad_version_gets_the_same_words_in_every_stage(version):
    from attention_lib.platform.launch import check_version
    with pytest.raises(ValueError, match=rf"^version must be 1, 2 or 4, got {re.escape(repr(version))}$"):
        check_version(version, {1: None, 2: None, 4: None})
    check_version(np.int64(2), {1: None, 2: None, 4: None})
