"""The sanitizer beside a GPU: it simulates each kernel's Python code, so every kernel of the
kernel report's cases is race-checked and counted here at GPU shapes, warp shuffles, device
functions reached through a module and dynamic shared memory included."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import traffic
from attention_lib.measure.trace import Traced
from attention_lib.measure.kernel_cases import CASES, library_kernels
from attention_lib.stages import backward, flash


class Recorder:
    """Looks like a kernel to its launcher: each launch is traced once, races and accesses both."""

    def __init__(self, kernel):
        self.kernel, self.py_func = kernel, kernel.py_func
        self.races, self.accesses = [], []

    def __getitem__(self, config):
        grid, block = config[0], config[1]
        nbytes = config[3] if len(config) > 3 else 0

        def launch(*args):
            traced = Traced(self.kernel, grid, block, *args, sharedmem=nbytes)
            self.races += traced.races()
            self.accesses.append(sum(len(target.trace) for target in traced.launch.targets.values()))
        return launch


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_kernel_is_race_free_and_counted(name):
    recorder = Recorder(library_kernels()[name])
    CASES[name](recorder)
    assert recorder.accesses and recorder.races == [], "\n".join(str(r) for r in recorder.races)
    assert all(count > 0 for count in recorder.accesses)


@pytest.mark.parametrize("version", [2, 3])
def test_the_fused_kernels_count_what_their_formula_says(version):
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 70, 16)).astype(np.float32) for _ in range(3))
    report, out = traffic.count_fused(q, k, v, True, version)
    formula = flash.flash_traffic(70, 70, 16, version=version)
    assert int(report.loads("k").sum()) == formula["k"] and int(report.loads("q").sum()) == formula["q"]
    assert np.allclose(out, reference.attention(q, k, v), rtol=1e-5, atol=1e-5)


def test_the_fused_backward_is_counted_at_gpu_tiles():
    rng = np.random.default_rng(4)
    q, k, v, d_out = (rng.standard_normal((1, 45, 6)).astype(np.float32) for _ in range(4))
    out = reference.attention(q, k, v).astype(np.float32)
    lse = backward.log_sum_exp(q, k).astype(np.float32)
    reports, grads = traffic.count_backward_fused(q, k, v, out, lse, d_out)
    for got, want in zip(grads, backward.backward(q, k, v, d_out)):
        assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
    assert backward.BLOCK_Q == 32
    assert int(reports["dQ"].loads("k").sum()) == flash.flash_traffic(45, 45, 6, block_q=backward.BLOCK_Q)["k"]
