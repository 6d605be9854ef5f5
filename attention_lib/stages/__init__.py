"""The stages of attention, one module per notebook, in the course's order: the kernels the course builds.

basics (00) -> projection (01) -> scores (02) -> mask (03) -> softmax (04) -> weighted_sum and
attention (05) -> multihead (06) -> flash (07, 08, 08x) -> kv_cache (09) -> registers (10) ->
backward and toy_model (11, 11x).

Every module follows one template: constants, the NumPy algorithm, the kernels
``<stage>_kernel_v1``, ``_v2``, ..., ``KERNELS``, ``<stage>_grid``, ``launch_<stage>`` on device
arrays, the public NumPy launcher, cost formulas. Not here: anything that runs a kernel to measure
it (the sanitizer's counts live in ``measure``), and what every stage's launch needs (``platform``).
"""
