"""attention_lib: transformer self-attention built stage by stage, in NumPy and as Numba CUDA kernels.

Import this package before anything imports ``numba.cuda``: ``runtime`` chooses the GPU or
the CUDA simulator, and Numba reads that choice only once.

Layout (the README's "Using the library" has the map, module by module):

- ``stages``: one module per stage, in the notebooks' order; the kernels the course builds;
- ``checks``: the exercises' checks and hints;
- ``reference``, ``story``, ``plotting``: float64 references, the running example, pictures;
- ``measure``: the sanitizer, traffic counts, the kernel report and the bench;
- ``platform``: GPU or simulator, the simulator's threads, launches, input validation.

The public API, plain functions, NumPy in and NumPy out, on the GPU or the simulator (float32
results; every function has a float64 twin of the same name in ``attention_lib.reference``):

- ``attention(q, k, v, causal=True)``: q, k, v (..., T, d_k) -> (..., T, d_k), stage by stage;
- ``flash_attention(q, k, v, causal=True)``: the same, in one fused kernel;
- ``multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal=True, b_q=None, ...)``;
- the stages on their own: ``project``, ``scores``, ``apply_causal_mask``, ``softmax``,
  ``weighted_sum``, ``split_heads``, ``merge_heads``;
- decoding: ``KVCache`` and ``decode_step``;
- training: ``attention_backward(q, k, v, d_out, causal=True)`` and
  ``flash_attention_backward(q, k, v, out, lse, d_out, causal=True)`` -> (dq, dk, dv).
"""

from attention_lib.platform import runtime  # noqa: F401  (first: it must run before numba.cuda loads)
from attention_lib.platform.runtime import BACKEND, ON_SIMULATOR, SIZES, banner  # noqa: F401

from attention_lib.stages.attention import attention  # noqa: E402,F401
from attention_lib.stages.backward import attention_backward, flash_attention_backward  # noqa: E402,F401
from attention_lib.stages.flash import flash_attention  # noqa: E402,F401
from attention_lib.stages.kv_cache import KVCache, decode_step  # noqa: E402,F401
from attention_lib.stages.mask import apply_causal_mask  # noqa: E402,F401
from attention_lib.stages.multihead import merge_heads, multi_head_attention, split_heads  # noqa: E402,F401
from attention_lib.stages.projection import project  # noqa: E402,F401
from attention_lib.stages.scores import scores  # noqa: E402,F401
from attention_lib.stages.softmax import softmax  # noqa: E402,F401
from attention_lib.stages.weighted_sum import weighted_sum  # noqa: E402,F401

__all__ = [
    "BACKEND", "ON_SIMULATOR", "SIZES", "banner",
    "attention", "flash_attention", "multi_head_attention",
    "project", "scores", "apply_causal_mask", "softmax", "weighted_sum", "split_heads", "merge_heads",
    "KVCache", "decode_step",
    "attention_backward", "flash_attention_backward",
]
