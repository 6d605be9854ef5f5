"""Dynamic shared memory past the 48 KB a block may declare statically (flash v3's grouped kernel).

A kernel declares shared arrays of sizes known when it is compiled, and their total must stay
under 48 KB. Past that it takes one buffer of dynamic shared memory, sized at launch
(``kernel[grid, block, stream, nbytes]``), and a GPU gives a block more than 48 KB of it only
once the kernel's limit is raised (CUDA's ``cudaFuncSetAttribute`` with
``MaxDynamicSharedMemorySize``; an H100 or H200 allows 227 KB a block).

- ``shared_rows(words, start, rows, cols)``: the 2-D (rows, cols) view of the float32 buffer
  ``words`` from element ``start`` on, row-major, inside a kernel. Numba's own ``reshape`` on
  the device builds its shape on the stack and loses track of the shared address space (every
  access becomes a generic load, compiled for sm_90); this view is an array made from the
  buffer's pointer and the two sizes, so accesses stay ``ld.shared`` and nothing goes to local
  memory. The simulator runs its NumPy twin, a view of the buffer.
- ``launch(kernel, grid, block, nbytes, *args)``: the launch, after raising the kernel's limit
  where nbytes needs it (the simulator refuses more than 48 KB without it, as a GPU does).
- ``largest_block_bytes()``: the most shared memory a block of this device may have.
"""

from numba.cuda import types
from numba.cuda.extending import intrinsic

from attention_lib.platform.runtime import ON_SIMULATOR

# What every kernel may take without raising its limit, static and dynamic together.
DEFAULT_LIMIT = 48 * 1024
# A block's opt-in limit on an H100 or H200 (sm_90), which the simulator's launches assume.
H200_BLOCK_LIMIT = 227 * 1024


def _shared_rows_numpy(words, start, rows, cols):
    """shared_rows on the simulator: a view of the buffer, so writes reach every thread's view."""
    return words[start:start + rows * cols].reshape(rows, cols)


@intrinsic
def shared_rows(typingctx, words, start, rows, cols):
    """(rows, cols) C-order view of words[start:] (a 1-D array), built in place."""
    view = types.Array(words.dtype, 2, "C")

    def codegen(context, builder, signature, args):
        source = context.make_array(signature.args[0])(context, builder, args[0])
        start, rows, cols = (context.cast(builder, value, kind, types.intp)
                             for value, kind in zip(args[1:], signature.args[1:]))
        itemsize = context.get_constant(
            types.intp, context.get_abi_sizeof(context.get_data_type(words.dtype)))
        out = context.make_array(view)(context, builder)
        context.populate_array(out, data=builder.gep(source.data, [start]), shape=[rows, cols],
                               strides=[builder.mul(cols, itemsize), itemsize],
                               itemsize=itemsize, meminfo=None)
        return out._getvalue()

    return view(words, start, rows, cols), codegen


# What the simulator runs in its place (simulator.simulated_globals swaps it in for a launch, on
# the simulator and when the sanitizer simulates a GPU kernel).
shared_rows.simulator_version = _shared_rows_numpy


def largest_block_bytes():
    """Shared memory one block may have on this device once its kernel opts in (bytes)."""
    if ON_SIMULATOR:
        return H200_BLOCK_LIMIT
    from numba import cuda
    return cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN


def _raise_limit(kernel, args, nbytes):
    """The kernel specialised for args, its limit of dynamic shared memory raised to nbytes:
    the same driver call as numba-cuda's own set_shared_memory_carveout, on each compiled
    function (numba-cuda 0.30 has no public way to it; numba_patches checks the names). A
    simulated kernel gets the simulator's twin of the call."""
    if not hasattr(kernel, "targetoptions"):              # the simulator's FakeCUDAKernel
        from attention_lib.platform import simulator
        simulator.set_max_dynamic_shared(kernel, nbytes)
        return kernel
    from numba.cuda.cudadrv.driver import binding, driver
    specialized = kernel.specialize(*args)
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    for compiled in specialized.overloads.values():
        function = compiled._codelibrary.get_cufunc()
        driver.cuKernelSetAttribute(attribute, nbytes, function.handle, function.device.id)
    return specialized


def launch(kernel, grid, block, nbytes, *args):
    """kernel[grid, block, 0, nbytes](*args), after raising the kernel's limit where nbytes needs
    more than DEFAULT_LIMIT (on both backends); a stand-in (the tests' recorders) is launched as is."""
    if nbytes > DEFAULT_LIMIT and hasattr(kernel, "specialize"):
        kernel = _raise_limit(kernel, args, nbytes)
    kernel[grid, block, 0, nbytes](*args)
