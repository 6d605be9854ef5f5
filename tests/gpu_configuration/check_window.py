"""tests/test_window.py's count of the key tiles a sliding window loads, at the GPU's tiles (32
queries a block): its figures come from band_key_tiles, not from the simulator's block size."""

import numpy as np
import test_window

from attention_lib.stages import flash


def test_key_tiles_before_the_window_are_never_loaded_at_gpu_tiles():
    assert flash.BLOCK_Q == 32
    test_window.test_key_tiles_before_the_window_are_never_loaded(np.random.default_rng(12345))
