"""The platform under every kernel: where it runs and how it is launched.

Here: the backend choice and course sizes (``runtime``, ``gpu_probe``), the simulator's threads
and every patch of numba-cuda internals (``numba_patches``), shared memory past 48 KB, grid
arithmetic and launch budgets (``launch``), and input validation. Not here: anything that
measures a kernel (``measure``) or a stage's own code (``stages``). Imported by the stages,
never importing them.
"""
