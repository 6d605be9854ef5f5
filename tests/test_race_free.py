"""Every kernel of the library is free of data races, at small awkward sizes.

Each kernel is launched through its own launcher (attention_lib/measure/kernel_cases.py), with the `kernel=`
argument set to a recorder that runs the launch under `sanitizer.find_races` (which executes
it too, so the launcher still gets its result). A new kernel without a case fails
`test_every_kernel_is_race_checked`.
"""

import pytest
from attention_lib.measure import sanitizer
from attention_lib.measure.kernel_cases import CASES, library_kernels


class RaceRecorder:
    """Looks like a kernel to a launcher; every launch runs under find_races."""

    def __init__(self, kernel):
        self.kernel, self.py_func = kernel, kernel.py_func
        self.races, self.launches = [], 0

    def __getitem__(self, config):
        griddim, blockdim = config[0], config[1]
        sharedmem = config[3] if len(config) > 3 else 0

        def launch(*args):
            self.races += sanitizer.find_races(self.kernel, griddim, blockdim, *args, sharedmem=sharedmem)
            self.launches += 1
        return launch


def test_every_kernel_is_race_checked():
    missing = sorted(set(library_kernels()) - set(CASES))
    assert not missing, f"kernels without a race check in tests/test_race_free.py: {missing}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_kernel_has_no_race(name):
    kernels = library_kernels()
    assert name in kernels, f"{name} is no longer in the library: remove its case"
    recorder = RaceRecorder(kernels[name])
    CASES[name](recorder)
    assert recorder.launches >= 1
    assert recorder.races == [], "\n".join(str(r) for r in recorder.races)
