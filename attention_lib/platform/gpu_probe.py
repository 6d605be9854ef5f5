"""Can this machine run the course's kernels on its GPU? Asked in a child process.

``attention_lib.platform.runtime`` runs this file as a script (``python -P gpu_probe.py LIBCUDA``), never
imports it: initialising CUDA (``cuInit``) in the notebook's or the test's own process would
leave it unable to hand CUDA to processes it forks later, and a failed launch could leave its
CUDA context broken. The script imports nothing of attention_lib and prints one JSON line:

- ``driver_version``: the CUDA version the driver runs, as the driver says (12040 = CUDA 12.4);
  ``devices``, ``name``, ``cc``: the number of GPUs, and the first one's name and compute capability;
- ``toolkit``: the version of numba-cuda's CUDA toolkit (the ``cuda-toolkit`` pip package of the
  ``gpu`` / ``gpu-cu12`` extras), or None when its compiler (NVVM) does not load;
- ``launch``: None when a one-thread kernel compiled, ran and wrote its answer, else the error.
Whatever step fails ends the probe, with the error in ``init``, ``toolkit_error`` or ``launch``.
"""

import ctypes
import importlib.metadata
import json
import os
import sys


def _driver(name, found):
    """Fill `found` with what the CUDA driver `name` says; returns False when it cannot go on."""
    try:
        driver = ctypes.CDLL(name)
    except OSError as error:
        found["init"] = f"it did not load: {error}"
        return False
    status = driver.cuInit(0)
    if status != 0:
        found["init"] = f"cuInit returned error {status}"
        return False
    version, count = ctypes.c_int(0), ctypes.c_int(0)
    driver.cuDriverGetVersion(ctypes.byref(version))
    found["driver_version"] = version.value
    if driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        found["devices"] = 0
        return False
    device, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    driver.cuDeviceGet(ctypes.byref(device), 0)
    name_buffer = ctypes.create_string_buffer(256)
    driver.cuDeviceGetName(name_buffer, 256, device)
    driver.cuDeviceGetAttribute(ctypes.byref(major), 75, device)    # COMPUTE_CAPABILITY_MAJOR
    driver.cuDeviceGetAttribute(ctypes.byref(minor), 76, device)    # COMPUTE_CAPABILITY_MINOR
    found.update(devices=count.value, name=name_buffer.value.decode(errors="replace"),
                 cc=[major.value, minor.value])
    return True


def _toolkit(found):
    """The toolkit's version into `found`; returns False when its compiler does not load."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        load_nvidia_dynamic_lib("nvvm")
    except Exception as error:                  # any failure means the same here: no usable NVVM
        found["toolkit_error"] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        return False
    try:
        found["toolkit"] = importlib.metadata.version("cuda-toolkit")
    except importlib.metadata.PackageNotFoundError:
        found["toolkit"] = "unknown"             # NVVM from elsewhere (a system CUDA): the launch decides
    return True


def _launch(found):
    """Compile and run a one-thread kernel; its error (one line) into found["launch"], or None."""
    os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    try:
        import numpy as np
        from numba import cuda

        @cuda.jit
        def write_one(out):
            out[0] = 1

        answer = cuda.to_device(np.zeros(1, np.int32))
        write_one[1, 1](answer)
        value = int(answer.copy_to_host()[0])
        found["launch"] = None if value == 1 else f"the test kernel wrote {value} instead of 1"
    except Exception as error:
        message = str(error).strip().splitlines()
        found["launch"] = f"{type(error).__name__}: {message[0] if message else ''}"


def probe(driver_name):
    """Everything the module docstring lists, as a dict."""
    found = {"driver": driver_name}
    if _driver(driver_name, found) and _toolkit(found):
        toolkit_major = found["toolkit"].split(".")[0]
        # A driver runs toolkits of its own CUDA major version or older; launching on an older
        # driver would fail inside numba-cuda, so the mismatch is reported without trying.
        if not toolkit_major.isdigit() or found["driver_version"] // 1000 >= int(toolkit_major):
            _launch(found)
    return found


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1])))
