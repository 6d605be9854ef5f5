"""Every kernel compiles for the GPUs students meet: sm_75 (T4, as on free cloud notebooks),
sm_80 (A100) and sm_90 (H100/H200). sm_90 is the kernel report's architecture: there every
kernel is compiled and also assembled by ptxas (tests/test_kernel_report.py checks a row for
each). This file compiles each kernel to PTX for sm_75 and has ptxas assemble that PTX into
sm_80 machine code, as the driver of an A100 would (a second PTX compile for sm_80 cost 13 of
the check's 35 s and found nothing the two others do not).

The simulator does not type-check, so a kernel can pass every other test and still fail to
compile for a GPU. Here each kernel is launched once through its launcher (attention_lib/measure/kernel_cases.py)
with a stand-in that records the argument types and then runs the real launch
(attention_lib/measure/signatures.py); a separate
process with the simulator off compiles each kernel to PTX with those types
(tests/compile_kernels.py). No GPU is needed: numba-cuda's CUDA toolkit extra provides the
compiler as a pip package.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from attention_lib.measure.kernel_cases import CASES, library_kernels
from attention_lib.measure.signatures import recorded_launches

ARCHITECTURES = ["7.5", "--assemble", "8.0"]     # sm_90: the kernel report
SCRIPT = Path(__file__).with_name("compile_kernels.py")


def test_every_kernel_compiles_for_real_gpus(tmp_path):
    missing = sorted(set(library_kernels()) - set(CASES))
    assert not missing, f"kernels without a case in attention_lib/measure/kernel_cases.py: {missing}"
    path = tmp_path / "signatures.json"
    path.write_text(json.dumps({name: launch["args"] for name, launch in recorded_launches().items()}))
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_LIB_BACKEND"}
    done = subprocess.run([sys.executable, str(SCRIPT), str(path), *ARCHITECTURES],
                          env=env, capture_output=True, text=True, timeout=600)
    report = done.stdout + done.stderr[-3000:]
    assert done.returncode == 0, report
    assert report.count("compiled ") == len(CASES), report
