"""ATTENTION_LIB_SHAPES: gpu gives the stage modules the block sizes and kernel versions a GPU uses
on the simulator (the kernel report records its launches so); any other value is refused. The
GPU configuration itself runs in tests/test_gpu_configuration.py."""

import os
import subprocess
import sys

from attention_lib.platform import runtime


def test_a_wrong_shapes_value_is_refused():
    env = dict(os.environ, **{runtime.SHAPES_VARIABLE: "big", runtime.BACKEND_VARIABLE: runtime.SIMULATOR})
    done = subprocess.run([sys.executable, "-c", "import attention_lib"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "ATTENTION_LIB_SHAPES must be 'auto' or 'gpu', got 'big'" in done.stderr.strip().splitlines()[-1]
