"""Compile kernels to PTX for real GPUs, in a process where the simulator is off.

    python tests/compile_kernels.py SIGNATURES.json 7.5 [--assemble 8.0 ...]

SIGNATURES.json maps "module.kernel" (a module of attention_lib) to the argument types of one
launch, each {"dtype": "float32", "ndim": 2, "layout": "C"} for an array or {"scalar":
"float32"} for a number (tests/test_compile.py records them). Each kernel is compiled to PTX
for every architecture before --assemble, and that PTX is assembled by ptxas into machine code
for every architecture after it (as a driver does with PTX of an older target). No GPU is
needed: numba-cuda's CUDA toolkit extra brings the compiler and ptxas. Prints one line per
kernel and architecture that fails, with the tool's first line, and exits 1 if any failed.
"""

import json
import os
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
from numba import cuda  # noqa: E402  (before attention_lib: keep the real CUDA target)

import importlib  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402

from attention_lib.measure.kernel_report import tool  # noqa: E402
from attention_lib.platform.numba_patches import compile_for  # noqa: E402
from attention_lib.measure.signatures import numba_type  # noqa: E402


def assemble(ptx, cc):
    """ptxas on one kernel's PTX for compute capability cc; raises with ptxas's message."""
    with tempfile.TemporaryDirectory() as workdir:
        source = os.path.join(workdir, "kernel.ptx")
        with open(source, "w") as f:
            f.write(ptx)
        done = subprocess.run([tool("ptxas"), f"-arch=sm_{cc[0]}{cc[1]}", source, "-o", os.path.join(workdir, "k.cubin")],
                              capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas: {done.stderr.strip()}")


def main(path, architectures, assembled=()):
    signatures = json.load(open(path))
    failures = 0
    for qualified, args in sorted(signatures.items()):
        module_name, kernel_name = qualified.rsplit(".", 1)
        kernel = getattr(importlib.import_module(f"attention_lib.stages.{module_name}"), kernel_name)
        signature = tuple(numba_type(a) for a in args)
        for cc in architectures:
            compile_for(cc)
            try:
                ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=cc)
            except Exception as error:  # the compiler's own error, whatever its class
                failures += 1
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                print(f"FAILED {qualified} for sm_{cc[0]}{cc[1]}: {type(error).__name__}: {first}")
                continue
            for target in assembled:
                try:
                    assemble(ptx, target)
                except RuntimeError as error:
                    failures += 1
                    print(f"FAILED {qualified} assembled for sm_{target[0]}{target[1]}: {str(error).splitlines()[0]}")
        print(f"compiled {qualified}{signature} for " + ", ".join(f"sm_{a}{b}" for a, b in architectures)
              + "".join(f", assembled for sm_{a}{b}" for a, b in assembled))
    return 1 if failures else 0


if __name__ == "__main__":
    words = sys.argv[2:]
    split = words.index("--assemble") if "--assemble" in words else len(words)
    ccs, targets = ([tuple(int(p) for p in a.split(".")) for a in part] for part in (words[:split], words[split + 1:]))
    sys.exit(main(sys.argv[1], ccs, targets))
