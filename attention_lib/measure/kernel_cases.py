"""One small, awkward launch of every kernel of the library, through its own launcher.

Used by the tests (race check, compile check) and by the kernel report, which compiles each
kernel with the argument types its launcher really passes.

`CASES[name](stand_in)` calls the kernel's launcher with `kernel=stand_in`: an object that
looks like a kernel to the launcher (`stand_in[griddim, blockdim](*args)`) and does something
with each launch: tests/test_race_free.py runs it under the race finder, tests/test_compile.py
records the argument types to compile the kernel for real GPUs. `library_kernels()` discovers
every kernel in the package, so a kernel without a case is noticed.
"""

import importlib
import pkgutil

import numpy as np


def library_kernels():
    """name -> kernel, for every @cuda.jit kernel (not device function) of the library: they live
    in attention_lib.stages (tests/test_architecture.py holds every other module to that)."""
    from attention_lib import stages
    found = {}
    for info in pkgutil.walk_packages(stages.__path__, "attention_lib.stages."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if not hasattr(value, "py_func") or value.py_func.__module__ != info.name:
                continue
            device = getattr(value, "_device", None)                        # simulator
            if device is None:
                device = getattr(value, "targetoptions", {}).get("device", False)  # GPU
            if not device:
                found[f"{info.name.rsplit('.', 1)[1]}.{name}"] = value  # "flash.flash_attention_kernel_v2"
    return found


def _rng():
    return np.random.default_rng(7)


def _basics(name):
    from attention_lib.stages import basics
    x, y = _rng().standard_normal((2, 70))
    if name == "add_kernel":
        return lambda k: basics.add(x, y, kernel=k)
    return lambda k: basics.scale_add(1.5, x, y, kernel=k)


def _whoami(name):

    def run(recorder):
        ids = [np.zeros(70, np.int32) for _ in range(3)]
        if name == "whoami_kernel":
            recorder[3, 32](*ids)
        else:
            recorder[(2, 2), (8, 8)](np.zeros((11, 13), np.int32), np.zeros((11, 13), np.int32))
    return run


def _transpose(tiled=False):
    from attention_lib.stages import basics
    a = _rng().standard_normal((19, 7))                  # 19 rows: two blocks down of 8, the last partly used
    if tiled:                                            # two tiles of 16 down, one across, both partly used
        return lambda k: basics.transpose(a, kernel=k, block=basics.TILED_TRANSPOSE_BLOCK)
    return lambda k: basics.transpose(a, kernel=k)


def _projection(version):
    from attention_lib.stages import projection
    x, w = _rng().standard_normal((19, 21)), _rng().standard_normal((21, 18))
    return lambda k: projection.project(x, w, b=np.ones(18), kernel=k, version=version)


def _softmax(version):
    from attention_lib.stages import softmax
    s = _rng().standard_normal((5, 37))
    s[2, :] = -np.inf                                     # a fully masked row exits early
    return lambda k: softmax.softmax(s, kernel=k, version=version)


def _scores(version):
    from attention_lib.stages import scores
    q, k = _rng().standard_normal((2, 2, 19, 7))       # two heads, T 19 (a partial tile), d_k 7
    if version == "kt":                                # K given transposed: T_q 19, T_k 17, d_k 20 (two steps)
        q, kt = _rng().standard_normal((2, 19, 20)), _rng().standard_normal((2, 20, 17))
        return lambda kern: scores.scores_kt(q, kt, kernel=kern)
    return lambda kern: scores.scores(q, k, kernel=kern, version=version)


def _mask(name):
    from attention_lib.stages import mask
    if name == "mask_kernel":
        s = _rng().standard_normal((2, 19, 23))
        return lambda kern: mask.apply_causal_mask(s, kernel=kern)
    q, k = _rng().standard_normal((2, 2, 35, 7))       # T 35: skipped, diagonal and partial tiles
    if name == "window_scores_kernel":                 # window 5: tiles skipped on both sides of the band
        return lambda kern: mask.causal_scores(q, k, window=5, kernel=kern)
    return lambda kern: mask.causal_scores(q, k, kernel=kern)


def _kv_cache(name):
    from attention_lib.stages import kv_cache

    def run(k):
        # The cache lives on the device: made when the case runs, not when this module is imported.
        rng = _rng()
        cache = kv_cache.KVCache(4, 24, 5, n_kv_head=2)      # grouped-query: 2 query heads per kv head
        cache.append(*rng.standard_normal((2, 2, 19, 5)))   # 19 positions: several chunks, the last partly filled
        q = rng.standard_normal((4, 5))
        if name == "decode_kernel_v1":
            return kv_cache.decode_step(q, cache, version=1, kernel=k)
        if name == "decode_kernel_v2":
            return kv_cache.decode_step(q, cache, kernel=k)
        if name == "chunk_partial_kernel":                   # a block per (chunk, query head)
            return kv_cache.chunk_partials_device(q, cache, kernel=k)
        return kv_cache.decode_step(q, cache, merge_kernel=k)
    return run


def _multihead(name):
    from attention_lib.stages import multihead
    x = _rng().standard_normal((2, 19, 15))            # B 2, T 19 (a partial block), 3 heads of width 5
    if name == "split_heads_kernel":
        return lambda k: multihead.split_heads(x, 3, kernel=k)
    if name == "merge_heads_kernel":
        return lambda k: multihead.merge_heads(x.reshape(2, 19, 3, 5).transpose(0, 2, 1, 3), kernel=k)
    if name == "qkv_av_kernel":                        # causal weights; 4 query heads of width 5 on 2 V heads
        from attention_lib import reference
        a = reference.softmax(reference.apply_causal_mask(_rng().standard_normal((8, 19, 19))))
        return lambda k: multihead.qkv_av(a, _rng().standard_normal((2, 19, 40)), 4, 2, causal=True, kernel=k)
    # The layer's in-place kernels: B 2, T 19 (partial tiles, one skipped right of the diagonal),
    # 4 query heads of width 3 on 2 K/V heads, causal; the launches before them run for real.
    x = _rng().standard_normal((2, 19, 12))
    w_q, w_k, w_v, w_o = (_rng().standard_normal(shape) for shape in ((12, 12), (12, 6), (12, 6), (12, 12)))
    return lambda k: _patched(multihead, name, k, lambda: multihead.multi_head_attention(
        x, w_q, w_k, w_v, w_o, 4, n_kv_head=2))


def _flash(version):
    from attention_lib.stages import flash
    q, k, v = _rng().standard_normal((3, 2, 2, 19, 7))   # 2 x 2 heads, T 19: partial query and key tiles
    if version == 3:                                     # the module's instance is for heads of width 64,
        q, k, v = _rng().standard_normal((3, 2, 19, flash.HEAD))   # one query head per kv head (group 1)
    if version == 1:                                     # grouped-query: both query heads read kv head 0
        k, v = k[..., :1, :, :], v[..., :1, :, :]        # (v2's block would grow to 2 heads: tests/test_gqa.py)
    return lambda kern: flash.flash_attention(q, k, v, version=version, kernel=kern)


def _flash_grouped():
    from attention_lib.stages import flash
    q = _rng().standard_normal((3, 23, flash.HEAD))     # 3 query heads on 1 kv head: 69 rows, 2 slices,
    k, v = _rng().standard_normal((2, 1, 23, flash.HEAD))  # the second of 5 rows; one partial key tile
    return lambda kern: flash.flash_attention(q, k, v, version=3, kernel=kern)


def _weighted_sum(causal=False, version=2):
    from attention_lib import reference
    from attention_lib.stages import weighted_sum
    s = _rng().standard_normal((2, 19, 21))                       # 2 heads, T_q 19, T_k 21
    a = reference.softmax(reference.apply_causal_mask(s) if causal else s)
    v = _rng().standard_normal((2, 21, 6))
    return lambda kern: weighted_sum.weighted_sum(a, v, version=version, kernel=kern, causal=causal)


def _backward(name):
    from attention_lib import reference
    from attention_lib.stages import backward
    rng = _rng()
    if name in ("transpose_kernel", "score_grad_kernel"):
        # The naive backward: T_q 7 against T_k 9 (transposes of non-square matrices, one partial
        # block each way; its tiled stage kernels make larger sizes slow on the simulator).
        q, k = rng.standard_normal((2, 7, 5)), rng.standard_normal((2, 9, 5))
        v, d_out = rng.standard_normal((2, 9, 3)), rng.standard_normal((2, 7, 3))
        if name == "score_grad_kernel":
            return lambda kern: backward.attention_backward(q, k, v, d_out, kernel=kern)
        return lambda kern: _patched(backward, name, kern, lambda: backward.attention_backward(q, k, v, d_out))
    if name == "group_sum_kernel":        # grouped-query: 3 query heads on one K/V head, T 7, 9
        q, k, v, d_out = (rng.standard_normal(s) for s in ((3, 7, 5), (1, 9, 5), (1, 9, 3), (3, 7, 3)))
        return lambda kern: _patched(backward, name, kern, lambda: backward.attention_backward(q, k, v, d_out))
    if name == "dkdv_pass_kernel":        # causal, the queries the last 19 of 23 positions, 2 heads
        q, k, v, d_out = (rng.standard_normal((2, t, d)) for t, d in ((19, 5), (23, 5), (23, 3), (19, 3)))
        out, lse = reference.attention(q, k, v), backward.log_sum_exp(q, k)
        return lambda kern: backward.dkdv_pass(q, k, v, d_out, lse, np.sum(d_out * out, axis=-1), kernel=kern)
    # The fused backward: 2 x 2 query heads on 2 x 1 K/V heads, T_q 19 against T_k 23 (queries the
    # last 19 positions: partial tiles both ways), d_k 7, d_v 5, a sliding window of 9 (tiles
    # skipped on both sides of the band).
    q, k = rng.standard_normal((2, 2, 19, 7)), rng.standard_normal((2, 1, 23, 7))
    v, d_out = rng.standard_normal((2, 1, 23, 5)), rng.standard_normal((2, 2, 19, 5))
    out, lse = reference.attention(q, k, v, window=9), backward.log_sum_exp(q, k, window=9)
    return lambda kern: _patched(backward, name, kern,
                                 lambda: backward.flash_attention_backward(q, k, v, out, lse, d_out, window=9))


def _registers(version):
    from attention_lib.stages import registers
    q, k = _rng().standard_normal((2, 35, registers.D))    # 35 rows: a second block of 3
    return lambda kern: registers.row_scores(q, k[:19], version=version, kernel=kern)


def _patched(module, name, stand_in, launch):
    """Run launch() with module.name replaced by stand_in, for kernels a launcher takes no
    kernel= argument for (one public launcher runs several of them)."""
    original = getattr(module, name)
    setattr(module, name, stand_in)
    try:
        return launch()
    finally:
        setattr(module, name, original)


# kernel name -> a function that launches it, given the recorder standing in for the kernel
CASES = {
    "basics.add_kernel": _basics("add_kernel"),
    "basics.scale_add_kernel": _basics("scale_add_kernel"),
    "basics.whoami_kernel": _whoami("whoami_kernel"),
    "basics.whoami_2d_kernel": _whoami("whoami_2d_kernel"),
    "basics.transpose_kernel": _transpose(),
    "basics.transpose_tiled_kernel": _transpose(tiled=True),
    "projection.projection_kernel_v1": _projection(1),
    "projection.projection_kernel_v2": _projection(2),
    "projection.projection_kernel_v3": _projection(3),     # (19, 18): one 32 x 32 block, partly used
    "projection.projection_kernel_v4": _projection(4),     # one 128 x 128 block, 3 steps of 8 (the last partial)
    "softmax.softmax_kernel_v1": _softmax(1),
    "softmax.softmax_kernel_v2": _softmax(2),
    "softmax.softmax_kernel_v3": _softmax(3),        # 5 rows: a block of 4 warps and one of 1
    "softmax.block_softmax_kernel": _softmax(2),     # launched on kernel 2's grid
    "scores.scores_kernel_v1": _scores(1),
    "scores.scores_kernel_v2": _scores(2),
    "scores.scores_kt_kernel": _scores("kt"),
    "scores.scores_tiled_kernel": _scores(2),              # launched through scores(kernel=...): q and k as v2's
    "mask.mask_kernel": _mask("mask_kernel"),
    "mask.causal_scores_kernel": _mask("causal_scores_kernel"),
    "mask.window_scores_kernel": _mask("window_scores_kernel"),
    "weighted_sum.weighted_sum_kernel_v1": _weighted_sum(version=1),
    "weighted_sum.weighted_sum_kernel_v2": _weighted_sum(),
    "weighted_sum.weighted_sum_causal_kernel": _weighted_sum(causal=True),   # blocks stopping at keys 18 and 21
    "multihead.split_heads_kernel": _multihead("split_heads_kernel"),
    "multihead.merge_heads_kernel": _multihead("merge_heads_kernel"),
    "multihead.qkv_scores_kernel": _multihead("qkv_scores_kernel"),
    "multihead.qkv_weighted_sum_kernel": _multihead("qkv_weighted_sum_kernel"),
    "multihead.qkv_av_kernel": _multihead("qkv_av_kernel"),
    "flash.flash_attention_kernel_v1": _flash(1),
    "flash.flash_attention_kernel_v2": _flash(2),
    "flash.flash_attention_kernel_v3": _flash(3),        # T 19 of 64 queries, one key tile of 32
    "flash.flash_attention_kernel_v3_grouped": _flash_grouped(),
    "kv_cache.decode_kernel_v1": _kv_cache("decode_kernel_v1"),
    "kv_cache.decode_kernel_v2": _kv_cache("decode_kernel_v2"),
    "kv_cache.decode_merge_kernel": _kv_cache("decode_merge_kernel"),
    "kv_cache.chunk_partial_kernel": _kv_cache("chunk_partial_kernel"),
    "kv_cache.chunk_stats_kernel": lambda k: k[2, 8](        # blocks of the simulator's chunk (8): full, and 3 positions
        _rng().standard_normal((2, 8)).astype(np.float32), np.array([8, 3], np.int32), *np.zeros((2, 2, 8), np.float32)),
    "registers.row_scores_kernel_v1": _registers(1),
    "registers.row_scores_kernel_v2": _registers(2),
    "registers.row_scores_kernel_v3": _registers(3),     # 35 rows against 19 keys: one partial key tile
    "backward.row_dot_kernel": _backward("row_dot_kernel"),
    "backward.transpose_kernel": _backward("transpose_kernel"),
    "backward.score_grad_kernel": _backward("score_grad_kernel"),
    "backward.group_sum_kernel": _backward("group_sum_kernel"),
    "backward.flash_backward_dkdv_kernel": _backward("flash_backward_dkdv_kernel"),
    "backward.flash_backward_dq_kernel": _backward("flash_backward_dq_kernel"),
    "backward.dkdv_pass_kernel": _backward("dkdv_pass_kernel"),     # 2 heads, T_q 19 of T_k 23: partial tiles both ways
}


