"""Compile kernels to PTX for real GPUs, in a process where the simulator is off.

    python tests/compile_kernels.py SIGNATURES.json 7.5 8.0 9.0

SIGNATURES.json maps "module.kernel" (a module of attention_lib) to the argument types of one
launch, each {"dtype": "float32", "ndim": 2, "layout": "C"} for an array or {"scalar":
"float32"} for a number (tests/test_compile.py records them). No GPU is needed: numba-cuda's
CUDA toolkit extra brings the compiler. Prints one line per kernel and architecture that
fails, with the compiler's first line, and exits 1 if any failed.
"""

import json
import os
import sys

os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
from numba import cuda  # noqa: E402  (before attention_lib: keep the real CUDA target)

import importlib  # noqa: E402

from attention_lib.numba_patches import compile_for  # noqa: E402
from attention_lib.signatures import numba_type  # noqa: E402


def main(path, architectures):
    signatures = json.load(open(path))
    failures = 0
    for qualified, args in sorted(signatures.items()):
        module_name, kernel_name = qualified.rsplit(".", 1)
        kernel = getattr(importlib.import_module(f"attention_lib.stages.{module_name}"), kernel_name)
        signature = tuple(numba_type(a) for a in args)
        for cc in architectures:
            compile_for(cc)
            try:
                cuda.compile_ptx(kernel.py_func, signature, cc=cc)
            except Exception as error:  # the compiler's own error, whatever its class
                failures += 1
                first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                print(f"FAILED {qualified} for sm_{cc[0]}{cc[1]}: {type(error).__name__}: {first}")
        print(f"compiled {qualified}{signature} for " + ", ".join(f"sm_{a}{b}" for a, b in architectures))
    return 1 if failures else 0


if __name__ == "__main__":
    ccs = [tuple(int(p) for p in a.split(".")) for a in sys.argv[2:]]
    sys.exit(main(sys.argv[1], ccs))
