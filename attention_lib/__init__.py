"""attention_lib: transformer self-attention built stage by stage, in NumPy and as Numba CUDA kernels.

Import this package before anything imports ``numba.cuda``: ``runtime`` chooses the GPU or
the CUDA simulator, and Numba reads that choice only once.
"""

from attention_lib import runtime  # noqa: F401  (first: it must run before numba.cuda loads)
from attention_lib.runtime import BACKEND, ON_SIMULATOR, SIZES, banner  # noqa: F401
