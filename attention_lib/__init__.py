"""attention_lib: transformer self-attention built stage by stage, in NumPy and as Numba CUDA kernels.

Import this package before anything imports ``numba.cuda``: ``runtime`` chooses the GPU or
the CUDA simulator, and Numba reads that choice only once.

The public API, NumPy in and NumPy out, on the GPU or the simulator (float32 results; every
function has a float64 twin of the same name in ``attention_lib.reference``):

- ``attention(q, k, v, causal=True)``: q, k, v (..., T, d_k) -> (..., T, d_k), stage by stage;
- ``flash_attention(q, k, v, causal=True)``: the same, in one fused kernel;
- ``multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal=True, b_q=None, ...)``;
- the stages on their own: ``project``, ``scores``, ``apply_causal_mask``, ``softmax``,
  ``weighted_sum``, ``split_heads``, ``merge_heads``;
- decoding: ``KVCache`` and ``decode_step``.

``scores``, ``softmax``, ``weighted_sum`` and ``attention`` are also the names of the modules
that build those stages (one module per concept). Here they stay modules, so that
``from attention_lib import softmax`` still gives notebook 04's kernels, and calling one runs
its launcher: ``attention_lib.softmax(s)`` is ``attention_lib.softmax.softmax(s)``.
"""

import types

from attention_lib import runtime  # noqa: F401  (first: it must run before numba.cuda loads)
from attention_lib.runtime import BACKEND, ON_SIMULATOR, SIZES, banner  # noqa: F401

from attention_lib import attention, scores, softmax, weighted_sum  # noqa: E402
from attention_lib.flash import flash_attention  # noqa: E402,F401
from attention_lib.kv_cache import KVCache, decode_step  # noqa: E402,F401
from attention_lib.mask import apply_causal_mask  # noqa: E402,F401
from attention_lib.multihead import merge_heads, multi_head_attention, split_heads  # noqa: E402,F401
from attention_lib.projection import project  # noqa: E402,F401


class _CallableStageModule(types.ModuleType):
    """A stage module that runs its launcher (the function of the same name) when called."""

    def __call__(self, *args, **kwargs):
        return getattr(self, self.__name__.rsplit(".", 1)[1])(*args, **kwargs)


for _module in (attention, scores, softmax, weighted_sum):
    _module.__class__ = _CallableStageModule

__all__ = [
    "BACKEND", "ON_SIMULATOR", "SIZES", "banner",
    "attention", "flash_attention", "multi_head_attention",
    "project", "scores", "apply_causal_mask", "softmax", "weighted_sum", "split_heads", "merge_heads",
    "KVCache", "decode_step",
]
