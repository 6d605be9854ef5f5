"""Every kernel compiles for the GPUs students meet: sm_75 (T4, as on free cloud notebooks),
sm_80 (A100) and sm_90 (H100/H200).

The simulator does not type-check, so a kernel can pass every other test and still fail to
compile for a GPU. Here each kernel is launched once through its launcher (attention_lib/kernel_cases.py)
with a stand-in that records the argument types and then runs the real launch; a separate
process with the simulator off compiles each kernel to PTX with those types
(tests/compile_kernels.py). No GPU is needed: numba-cuda's CUDA toolkit extra provides the
compiler as a pip package.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from attention_lib.kernel_cases import CASES, library_kernels

ARCHITECTURES = ["7.5", "8.0", "9.0"]
SCRIPT = Path(__file__).with_name("compile_kernels.py")


class TypeRecorder:
    """Looks like a kernel to a launcher: records the argument types of the first launch, then launches."""

    def __init__(self, kernel):
        self.kernel, self.py_func = kernel, kernel.py_func
        self.arg_types = None

    def __getitem__(self, config):
        def launch(*args):
            if self.arg_types is None:
                self.arg_types = [describe(a) for a in args]
            self.kernel[config](*args)
        return launch


def describe(arg):
    """The type of one kernel argument, in words the compile script reads back."""
    if hasattr(arg, "shape") and hasattr(arg, "dtype") and np.ndim(arg) > 0:
        c_contiguous = arg.flags["C_CONTIGUOUS"] if hasattr(arg, "flags") else arg.is_c_contiguous()
        return {"dtype": str(arg.dtype), "ndim": len(arg.shape), "layout": "C" if c_contiguous else "A"}
    if isinstance(arg, (bool, np.bool_)):
        return {"scalar": "boolean"}
    if isinstance(arg, np.generic):
        return {"scalar": str(arg.dtype)}
    return {"scalar": "int64" if isinstance(arg, int) else "float64"}


def recorded_signatures():
    kernels = library_kernels()
    signatures = {}
    for name, launch_case in CASES.items():
        recorder = TypeRecorder(kernels[name])
        launch_case(recorder)
        assert recorder.arg_types, f"{name}: its case launched nothing"
        signatures[name] = recorder.arg_types
    return signatures


def test_every_kernel_compiles_for_real_gpus(tmp_path):
    missing = sorted(set(library_kernels()) - set(CASES))
    assert not missing, f"kernels without a case in attention_lib/kernel_cases.py: {missing}"
    path = tmp_path / "signatures.json"
    path.write_text(json.dumps(recorded_signatures()))
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_LIB_BACKEND"}
    done = subprocess.run([sys.executable, str(SCRIPT), str(path), *ARCHITECTURES],
                          env=env, capture_output=True, text=True, timeout=600)
    report = done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, report
    assert report.count("compiled ") == len(CASES), report
