"""The measuring tools: what a kernel does, counted, compiled or timed, on either backend.

Here: the sanitizer (races, bounds, traffic counts by simulation), traffic formulas, the kernel
report (what ptxas and nvdisasm make of each kernel) with its cases, signatures and row cache,
and the bench with its entries, GPU limits and launch recording. Not here: kernels (``stages``),
exercise checks (``checks``), or what every launch needs to run at all (``platform``).
"""
