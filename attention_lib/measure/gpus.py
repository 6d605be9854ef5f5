"""What each GPU can do at most: the roofs of the roofline, and the name of the GPU in use."""

import re
from dataclasses import dataclass

from attention_lib.platform import runtime


@dataclass(frozen=True)
class GpuLimits:
    """What one GPU can do at most, from the vendor's data sheets, rounded: FP32 arithmetic
    without tensor cores (Numba cannot use them), main-memory bandwidth, and the dense bf16
    tensor-core peak (where production attention kernels live)."""

    name: str
    fp32_flop_per_s: float
    bytes_per_s: float
    tensor_flop_per_s: float = None

    @property
    def ridge(self) -> float:
        """FLOP per byte at which the two roofs meet: below it memory limits, above it arithmetic."""
        return self.fp32_flop_per_s / self.bytes_per_s

    def attainable(self, intensity):
        """The roofline: the most FLOP/s a kernel of `intensity` FLOP/byte can reach."""
        return min(self.fp32_flop_per_s, self.bytes_per_s * intensity)


# Matched in order against the lowercased device name that Numba reports.
KNOWN_GPUS = [
    (r"h200", GpuLimits("NVIDIA H200", 67e12, 4.8e12, 989e12)),
    (r"h100.*pcie", GpuLimits("NVIDIA H100 PCIe", 51e12, 2.0e12, 756e12)),
    (r"h100", GpuLimits("NVIDIA H100 SXM", 67e12, 3.35e12, 989e12)),
    (r"a100.*80\s*gb", GpuLimits("NVIDIA A100 80GB", 19.5e12, 2.0e12, 312e12)),
    (r"a100", GpuLimits("NVIDIA A100 40GB", 19.5e12, 1.56e12, 312e12)),
    (r"\bl4\b", GpuLimits("NVIDIA L4", 30e12, 0.3e12, 121e12)),
    (r"\bt4\b", GpuLimits("NVIDIA T4", 8.1e12, 0.32e12, None)),
]
REFERENCE_GPU = KNOWN_GPUS[0][1]      # the roofs drawn when there is no GPU to ask


def gpu_limits(device_name):
    """GpuLimits for a device name as Numba reports it, or None for a GPU not in KNOWN_GPUS."""
    if not device_name:
        return None
    for pattern, limits in KNOWN_GPUS:
        if re.search(pattern, device_name.lower()):
            return limits
    return None


def device_name():
    """The GPU's name as Numba reports it; None on the simulator."""
    if runtime.ON_SIMULATOR:
        return None
    from numba import cuda
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)
