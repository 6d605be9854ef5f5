"""A small compute-sanitizer for Numba's CUDA simulator: count memory traffic, find data races,
catch out-of-bounds indices, and show which thread wrote what.

Without a GPU a kernel cannot be timed, so the course reasons about performance by counting
memory accesses; and the most common kernel bug, a missing ``cuda.syncthreads()``, gives a
wrong answer only for some thread orders (on the simulator, one fixed order). This module makes
both visible. It launches a ``@cuda.jit`` kernel once on the simulator with every array argument
replaced by a recording wrapper, and, for the length of that launch only, records shared
arrays (``simulator.shared_recorder``) and patches the methods of ``FakeCUDAAtomic``
(``cuda.atomic.*``) so atomics are recorded as atomics. The simulated threads themselves
(attention_lib/platform/simulator.py) keep what the race finder needs: the barriers each thread
has passed, and the warp collectives (shuffles, votes, ``syncwarp``) it has joined. A barrier
that not every thread reaches raises ``BarrierError`` there, in every mode.

Everything is restored afterwards, also when the kernel raises. The installed package is not
edited. On a machine whose kernels run on a real GPU the same functions work: they simulate the
kernel's Python source on the CPU (see ``_simulated``), so a notebook's counts are the same on
both backends. Public functions:

- ``run(kernel, griddim, blockdim, *args)``: a launch with bounds checking only.
- ``count_memory(...) -> MemoryReport``: loads, stores and atomics per element of every array.
- ``find_races(...) -> list[Race]``: shared- and global-memory data races of one launch.
- ``thread_map(..., array="out", by="thread")``: which thread (or block) last wrote each element.

``args`` may be NumPy arrays, simulator device arrays (``cuda.to_device``) and scalars. The
kernel writes straight into the caller's arrays, so results land where a normal launch puts them.
An out-of-bounds index raises ``OutOfBoundsError`` in every mode.

What is counted: each scalar element read ``a[i, j]`` is one load, each scalar element write
one store (``a[i] += x`` is both), a slice assignment ``a[i, :] = 0`` one store per element;
taking a view (``row = a[i]``) moves nothing until its elements are read. Every access counts as
if it went to memory: no caches, no coalescing, no registers holding a value for reuse.
``cuda.local.array`` (private to a thread) is not recorded.
"""

import bisect
import dis
import inspect
import linecache
import os
import re
import sys
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from attention_lib.platform import runtime, where

LOAD, STORE, ATOMIC = "read", "write", "atomic"
GLOBAL, SHARED = "global", "shared"
# Modes of an instrumented launch, cheapest first.
_BOUNDS, _COUNT, _TRACE = "bounds", "count", "trace"
_ATOMICS = ("add", "sub", "and_", "or_", "xor", "inc", "dec", "exch", "max", "min",
            "nanmax", "nanmin", "cas", "compare_and_swap")


class OutOfBoundsError(IndexError):
    """An index outside an array's shape in an instrumented launch (negative indices included).

    Attributes (None when the error was rebuilt from its message alone): ``block``, ``thread``
    (blockIdx, threadIdx as tuples), ``array`` (name), ``index`` (tuple), ``shape``, ``line``
    ("file:line" of the kernel code).
    """

    # The simulator re-creates a thread's exception as type(e)(message) before raising it in
    # the launching thread, so the constructor must accept the message alone.
    def __init__(self, message, *, block=None, thread=None, array=None, index=None,
                 shape=None, line=None):
        super().__init__(message)
        self.block, self.thread, self.array = block, thread, array
        self.index, self.shape, self.line = index, shape, line


# ----------------------------------------------------------------------------------------------
# What the kernel sees instead of an array


def _kernel_frame():
    """The innermost frame outside this module: the kernel (or device function) line."""
    frame = sys._getframe(1)
    while frame.f_code.co_filename == __file__:
        frame = frame.f_back
    return frame


def _where(frame):
    """Where a frame is, in words a student can find (``where.describe``)."""
    return where.describe(frame.f_code.co_filename, frame.f_lineno)


class _Target:
    """One recorded array of a launch: a global argument or a shared-array declaration."""

    def __init__(self, launch, name, space, ary):
        mode = launch.mode
        self.name, self.space = name, space
        self.errors = launch.errors  # out-of-bounds errors, shared by the launch's arrays
        self.warp_events = launch.warp_events
        self.current_thread = launch.current_thread
        self.shape, self.dtype = ary.shape, ary.dtype
        self.recording = mode != _BOUNDS
        # Counting needs only the element ids; list.append is atomic under the GIL, so the
        # simulator's threads can share the lists without locks and no count is lost.
        self.counts = {LOAD: [], STORE: [], ATOMIC: []} if mode == _COUNT else None
        # Race finding needs who, when (barrier interval) and where, decided after the launch.
        self.trace = [] if mode == _TRACE else None

    def note(self, kind, ids):
        """Record an access of `kind` to the element id(s) `ids` (flat index into the array)."""
        flat = ids.ravel().tolist() if isinstance(ids, np.ndarray) else [ids]
        if self.counts is not None:
            self.counts[kind].extend(flat)
            return
        thread = self.current_thread()
        frame = _kernel_frame()
        site = (frame.f_code.co_filename, frame.f_lineno)
        interval, step = thread.barriers, len(thread.warp_events)
        try:
            who = thread._sanitizer_who
        except AttributeError:  # first access of this thread: (blockIdx, threadIdx) as tuples
            who = thread._sanitizer_who = (tuple(thread.blockIdx), tuple(thread.threadIdx))
            self.warp_events[who] = thread.warp_events        # grows until the launch ends
        for element in flat:
            self.trace.append((element, kind, who, interval, site, step))

    def out_of_bounds(self, kind, key, shape):
        """The error for index `key` into a view of this array with `shape`."""
        thread = self.current_thread()
        frame = _kernel_frame()
        block, tid = tuple(thread.blockIdx), tuple(thread.threadIdx)
        index = tuple(int(i) if isinstance(i, (int, np.integer)) else i for i in key)
        shown = ", ".join(str(i) for i in index)
        code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
        negative = " (negative: a kernel must not rely on wrap-around)" if any(
            isinstance(i, int) and i < 0 for i in index) else ""
        message = (f"out-of-bounds {kind} {self.name}[{shown}]{negative}: {self.space} array "
                   f"'{self.name}' has shape {tuple(shape)}; block {block} thread {tid} at "
                   f"{_where(frame)}: {code}")
        error = OutOfBoundsError(message, block=block, thread=tid, array=self.name, index=index,
                                 shape=tuple(shape), line=_where(frame))
        self.errors.append(error)
        return error


class _View:
    """Stands in for an array (or a view of one) inside the kernel: checks and records accesses.

    `_ids` has the view's shape and holds, for each of its elements, the flat index of that
    element in the whole array, so a row view `a[i]` records into the right elements of `a`.
    """

    __slots__ = ("_ary", "_ids", "_target")

    def __init__(self, ary, ids, target):
        self._ary, self._ids, self._target = ary, ids, target

    def _check(self, kind, idx):
        """Raise OutOfBoundsError for a bad integer index; True when `idx` picks one element."""
        key = idx if type(idx) is tuple else (idx,)
        shape = self._ary.shape
        single = len(key) == len(shape)
        for axis, i in enumerate(key):
            if isinstance(i, (int, np.integer)):
                # NumPy (and Numba) wrap negative indices; in a kernel that is almost always an
                # off-by-one, so a negative index is reported like any other bad one.
                if axis >= len(shape) or not 0 <= i < shape[axis]:
                    raise self._target.out_of_bounds(kind, key, shape)
            else:
                single = False
                if not isinstance(i, slice):  # Ellipsis, None, arrays: axes no longer line up
                    break
        return single

    def __getitem__(self, idx):
        single = self._check(LOAD, idx)
        value = self._ary[idx]
        if not single:  # a view (a row, a slice): nothing is read until its elements are
            return _View(value, self._ids[idx], self._target) if isinstance(
                value, np.ndarray) else value
        if self._target.recording:
            self._target.note(LOAD, self._ids[idx])
        return value

    def __setitem__(self, idx, value):
        self._check(STORE, idx)
        if self._target.recording:
            self._target.note(STORE, self._ids[idx])
        self._ary[idx] = value

    def _atomic_element(self, index):
        """Check and record the element an atomic works on; returns the raw array for it."""
        if not self._check(ATOMIC, index):
            raise IndexError(f"atomic on '{self._target.name}' needs one element, got {index}")
        if self._target.recording:
            self._target.note(ATOMIC, self._ids[index])
        return self._ary

    @property
    def shape(self):
        return self._ary.shape

    def __len__(self):
        return len(self._ary)

    def __iter__(self):  # `for x in row:` reads element by element, each one recorded
        for i in range(len(self._ary)):
            yield self[i]

    def reshape(self, *shape):  # a view of the same elements (dynamic_shared.shared_rows)
        return _View(self._ary.reshape(*shape), self._ids.reshape(*shape), self._target)

    def __getattr__(self, name):  # size, ndim, dtype, strides...
        return getattr(self._ary, name)

    def __repr__(self):
        return f"<recorded {self._target.space} array '{self._target.name}' {self._ary.shape}>"


def _wrap(ary, target):
    return _View(ary, np.arange(ary.size).reshape(ary.shape), target)


# ----------------------------------------------------------------------------------------------
# The instrumented launch


@contextmanager
def _simulated(kernel, sharedmem):
    """Yield the kernel as the simulator runs it, allowed `sharedmem` bytes of dynamic shared
    memory (as a launcher raises the limit of a kernel that needs more than 48 KB).

    On the simulator that is the kernel itself. On a real GPU, a simulator kernel is built from
    the kernel's Python source (``py_func``): the simulator swaps the module's ``cuda`` for its
    own during the launch, and what the code reaches that has a simulated twin (device
    functions, also through a module attribute such as ``flash.visible_keys``; intrinsics such
    as ``dynamic_shared.shared_rows``) is swapped in too (``simulator.simulated_globals``), so the
    same code runs on the CPU, instrumented, beside the GPU.
    """
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    simulated = kernel if runtime.ON_SIMULATOR else FakeCUDAKernel(kernel.py_func, device=False)
    limit = simulated.__dict__.get("max_dynamic_shared_bytes")
    simulated.max_dynamic_shared_bytes = max(sharedmem, limit or 0)
    try:
        yield simulated
    finally:
        if limit is None:
            del simulated.max_dynamic_shared_bytes
        else:
            simulated.max_dynamic_shared_bytes = limit


def _dim3(dims, what):
    """(x, y, z) from an int or a tuple of 1 to 3 ints."""
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 for d in dims):
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {dims}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


def _shared_name(frame, taken):
    """A readable key for the shared array `frame` is declaring: the variable the call's result is
    stored in (the first store after the call in its code), else the one its line assigns, else
    file:line."""
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    stores = (i.argval for i in dis.get_instructions(frame.f_code)
              if i.offset > frame.f_lasti and i.opname in ("STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL"))
    match = re.match(r"\s*([A-Za-z_]\w*)\s*=", linecache.getline(filename, lineno))
    name = next(stores, None) or (match.group(1) if match else f"shared@{os.path.basename(filename)}:{lineno}")
    return name if name not in taken else f"{name}@{lineno}"


class _Launch:
    """The arrays of one instrumented launch and what was recorded on them."""

    def __init__(self, kernel, griddim, blockdim, mode):
        fn = getattr(kernel, "py_func", None)
        if fn is None or not hasattr(kernel, "__getitem__"):
            raise TypeError(f"kernel must be a @cuda.jit kernel, got {type(kernel).__name__}")
        self.kernel_name = fn.__name__
        self.params = list(inspect.signature(fn).parameters)
        self.griddim, self.blockdim = _dim3(griddim, "griddim"), _dim3(blockdim, "blockdim")
        self.mode = mode
        self.targets = {}  # name -> _Target: global arguments first, then shared arrays
        self._shared = {}  # declaration (file, line) or dtype for dynamic -> _View
        self._holder = {}  # the same key -> the block that declared it last (blocks run one by one)
        self.errors = []  # out-of-bounds errors raised in the simulator's threads
        self.device_copies = []  # (GPU device array, its host copy) to write back after the launch
        self.warp_events = {}  # (blockIdx, threadIdx) -> ids of the warp collectives it joined
        self.barriers = self.warp_collectives = 0  # the most any thread passed, and joined
        self.barriers_by_block = {}  # blockIdx (x, y, z) -> the most barriers a thread of that block passed
        from attention_lib.platform import simulator  # greenlets: only once something is simulated
        simulator.install()
        self.current_thread = simulator.current_thread

    def wrap_arg(self, position, arg):
        """What the kernel receives for `arg`: a recording view for arrays, else `arg`."""
        from numba.cuda.simulator.args import ArgHint, In
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        if isinstance(arg, ArgHint):
            # cuda.In promises nothing is copied back: let the kernel write into a copy.
            arg = np.array(arg.value) if isinstance(arg, In) else arg.value
        if isinstance(arg, FakeCUDAArray):
            arg = arg._ary  # a simulator device array is a NumPy array underneath
        elif hasattr(arg, "copy_to_host"):
            # A real GPU's device array: the simulated launch works on a host copy, written
            # back to the device afterwards (see _launch), as a GPU launch would leave it.
            device, arg = arg, arg.copy_to_host()
            self.device_copies.append((device, arg))
        if not isinstance(arg, np.ndarray) or arg.ndim == 0:
            return arg
        name = self.params[position] if position < len(self.params) else f"arg{position}"
        self.targets[name] = _Target(self, name, GLOBAL, arg)
        return _wrap(arg, self.targets[name])

    def shared_array(self, fake_shared, original, shape, dtype, caller):
        """The simulator's shared arrays of this launch (simulator.shared_recorder): the same
        array for every thread of a launch, per declaration line, wrapped for recording."""
        from numba.cuda import types
        from numba.cuda.np import numpy_support
        from attention_lib.platform import simulator

        site = simulator.declaration(caller)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        # Dynamic shared memory (shape 0) is one buffer for all declarations of a dtype.
        key = ("dynamic", np.dtype(dtype).str) if shape == 0 else site
        view = self._shared.get(key)  # the block's first thread to declare it creates it
        if view is None:
            name = _shared_name(caller, self.targets) + (" (dynamic)" if shape == 0 else "")
            ary = original(fake_shared, 0, dtype) if shape == 0 else np.empty(shape, dtype)
            self.targets[name] = _Target(self, name, SHARED, ary)
            view = self._shared[key] = _wrap(ary, self.targets[name])
        block = tuple(self.current_thread().blockIdx)
        if self._holder.get(key) != block:  # a block's first declaration: garbage, as a GPU hands it over
            simulator.poison(view._ary)
            self._holder[key] = block
        return view

    def block_done(self, threads):
        """A block has finished (simulator.block_recorder): keep its barriers and warp collectives."""
        most = max(t.barriers for t in threads)
        self.barriers = max(self.barriers, most)
        self.barriers_by_block[tuple(threads[0].blockIdx)] = most
        self.warp_collectives = max(self.warp_collectives, max(len(t.warp_events) for t in threads))

    @property
    def threads_per_block(self):
        return int(np.prod(self.blockdim))

    def warp_ordered(self, a, step_a, b, step_b):
        """Whether a warp collective orders thread a's access (made after joining step_a of
        them) and thread b's: both lanes of one warp joined it, one before and one after."""
        events_a, events_b = self.warp_events.get(a), self.warp_events.get(b)
        if not events_a or not events_b or a[0] != b[0]:
            return False
        (xa, ya, za), (xb, yb, zb), (dx, dy, _) = a[1], b[1], self.blockdim
        if (xa + dx * (ya + dy * za)) // 32 != (xb + dx * (yb + dy * zb)) // 32:
            return False
        return _shares_event(events_a, step_a, events_b, step_b) or _shares_event(events_b, step_b, events_a, step_a)

    def global_id(self, block, thread, by="thread"):
        """Linear id of a block, or of a thread: block id * threads per block + thread id,
        both counted x fastest (CUDA's order). In a 1-D launch this equals cuda.grid(1)."""
        (bx, by_, bz), (gx, gy, _) = block, self.griddim
        block_id = bx + gx * (by_ + gy * bz)
        if by == "block":
            return block_id
        (tx, ty, tz), (dx, dy, _) = thread, self.blockdim
        return block_id * self.threads_per_block + tx + dx * (ty + dy * tz)


@contextmanager
def _instrumented(launch):
    """Record the shared arrays and atomics of `launch`; undo on exit."""
    from numba.cuda.simulator import kernelapi
    from attention_lib.platform import simulator

    patched = []  # (owner, attribute, original)

    def patch(owner, name, replacement):
        patched.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, replacement)

    def atomic(original):
        def recorded(self, array, *rest):
            if isinstance(array, _View):  # compare_and_swap works on element 0
                index = (0,) * array.ndim if original.__name__ == "compare_and_swap" else rest[0]
                array = array._atomic_element(index)
            return original(self, array, *rest)
        return recorded

    for name in _ATOMICS:
        if name in kernelapi.FakeCUDAAtomic.__dict__:
            patch(kernelapi.FakeCUDAAtomic, name,
                  atomic(kernelapi.FakeCUDAAtomic.__dict__[name]))
    simulator.shared_recorder, simulator.block_recorder = launch.shared_array, launch.block_done
    try:
        yield
    finally:
        simulator.shared_recorder = simulator.block_recorder = None
        for owner, name, original in reversed(patched):
            setattr(owner, name, original)


def _launch(kernel, griddim, blockdim, args, mode, sharedmem=0):
    """Run `kernel` once on the simulator with recording arrays; returns the _Launch."""
    launch = _Launch(kernel, griddim, blockdim, mode)
    wrapped = [launch.wrap_arg(position, arg) for position, arg in enumerate(args)]
    with _instrumented(launch):
        try:
            with _simulated(kernel, sharedmem) as simulated:
                simulated[launch.griddim, launch.blockdim, 0, sharedmem](*wrapped)
        except OutOfBoundsError as error:
            # The simulator re-raises a copy of the thread's error with "tid=[..] ctaid=[..]:"
            # prefixed; raise the original, which already says all that on one line.
            originals = [e for e in launch.errors if str(error).endswith(str(e))]
            raise (originals[0] if originals else error) from None
    for device, host in launch.device_copies:
        device.copy_to_device(host)
    return launch


def run(kernel, griddim, blockdim, *args, sharedmem=0):
    """Launch `kernel[griddim, blockdim](*args)` on the simulator, checking every index.

    The cheapest instrumented mode: nothing is recorded. Raises OutOfBoundsError (an
    IndexError) with a one-line message naming the block and thread, the array, the index, its
    shape and the kernel line. A negative index counts as out of bounds: NumPy, and Numba's
    compiled kernels too, would silently wrap it to the end of the axis (CUDA C does not), which
    in a kernel is almost always an off-by-one such as ``a[i - 1]`` at ``i = 0``.

    args: NumPy arrays, simulator device arrays, scalars; written arrays are updated in place.
    sharedmem: bytes of dynamic shared memory, as in ``kernel[grid, block, 0, sharedmem]``.
    """
    _launch(kernel, griddim, blockdim, args, _BOUNDS, sharedmem)


# ----------------------------------------------------------------------------------------------
# Counting memory traffic


@dataclass
class ArrayTraffic:
    """Accesses to one array during a launch; each count array has the array's shape.

    For a shared array the counts are summed over all blocks (each block has its own copy).
    """

    name: str
    space: str  # "global" or "shared"
    shape: tuple
    itemsize: int
    loads: np.ndarray
    stores: np.ndarray
    atomics: np.ndarray

    @property
    def bytes_moved(self) -> int:
        """Bytes read plus written, an atomic counting as one read and one write."""
        return int(self.loads.sum() + self.stores.sum() + 2 * self.atomics.sum()) * self.itemsize


def _per_element(counts):
    """'3' when every element has the same count, else 'min..max (mean m)'; '-' for an empty array."""
    if counts.size == 0:
        return "-"
    low, high = int(counts.min()), int(counts.max())
    return str(low) if low == high else f"{low}..{high} (mean {counts.mean():.3g})"


@dataclass
class MemoryReport:
    """Memory traffic of one launch, per element of every global and shared array."""

    kernel: str
    griddim: tuple
    blockdim: tuple
    arrays: dict  # name -> ArrayTraffic, global arguments first, then shared arrays
    barriers: int = 0  # syncthreads() calls the busiest thread passed (the most in any block)
    warp_collectives: int = 0  # shuffles, votes and syncwarps the busiest thread joined

    @property
    def blocks(self) -> int:
        return int(np.prod(self.griddim))

    @property
    def threads(self) -> int:
        return self.blocks * int(np.prod(self.blockdim))

    def loads(self, name) -> np.ndarray:
        """Loads of each element of array `name` (int array, the array's shape)."""
        return self[name].loads

    def stores(self, name) -> np.ndarray:
        """Stores to each element of array `name` (int array, the array's shape)."""
        return self[name].stores

    def atomics(self, name) -> np.ndarray:
        """Atomic operations on each element of array `name` (int array, the array's shape)."""
        return self[name].atomics

    def total(self, kind="loads", space=GLOBAL) -> int:
        """Sum of `kind` ("loads", "stores", "atomics") over all arrays of `space`."""
        return sum(int(getattr(a, kind).sum()) for a in self.arrays.values() if a.space == space)

    @property
    def global_bytes(self) -> int:
        """Bytes moved to and from global memory, every access counted (no caches)."""
        return sum(a.bytes_moved for a in self.arrays.values() if a.space == GLOBAL)

    def __getitem__(self, name) -> ArrayTraffic:
        if name not in self.arrays:
            raise KeyError(f"no array {name!r} in this launch; arrays: {', '.join(self.arrays)}")
        return self.arrays[name]

    def summary(self) -> str:
        """A text table: per array, total and per-element loads, stores and atomics."""
        header = ("array", "space", "shape", "loads", "stores", "atomics",
                  "loads/element", "stores/element")
        rows = [header] + [
            (a.name, a.space, str(a.shape), str(int(a.loads.sum())), str(int(a.stores.sum())),
             str(int(a.atomics.sum())), _per_element(a.loads), _per_element(a.stores))
            for a in self.arrays.values()]
        widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
        lines = [f"{self.kernel}: grid {self.griddim} x block {self.blockdim} = "
                 f"{self.blocks} blocks, {self.threads} threads; "
                 f"global memory {self.global_bytes:,} bytes moved; a thread passes up to "
                 f"{self.barriers} barriers and joins {self.warp_collectives} warp collectives"]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                  for row in rows]
        return "\n".join(lines)

    def __str__(self):
        return self.summary()


def count_memory(kernel, griddim, blockdim, *args, sharedmem=0) -> MemoryReport:
    """Run `kernel` once on the simulator and count every load, store and atomic, per element.

    Global arrays are keyed by the kernel's parameter name, shared arrays by the variable they
    are assigned to (``sA = cuda.shared.array(...)`` -> "sA"), counts summed over blocks.
    args: NumPy arrays, simulator device arrays, scalars; results land in the caller's arrays.
    Out-of-bounds indices raise OutOfBoundsError (see `run`). Example::

        report = count_memory(matmul, (2, 2), (8, 8), A, B, C)
        report.loads("A")   # (M, K) int array: how often each element of A was read
        print(report.summary())
    """
    launch = _launch(kernel, griddim, blockdim, args, _COUNT, sharedmem)
    arrays = {}
    for name, target in launch.targets.items():
        size = int(np.prod(target.shape))
        per_element = {kind: np.bincount(np.asarray(ids, dtype=np.int64), minlength=size)
                       .reshape(target.shape) for kind, ids in target.counts.items()}
        arrays[name] = ArrayTraffic(name, target.space, tuple(target.shape),
                                    target.dtype.itemsize, per_element[LOAD],
                                    per_element[STORE], per_element[ATOMIC])
    return MemoryReport(launch.kernel_name, launch.griddim, launch.blockdim, arrays, launch.barriers,
                        launch.warp_collectives)


# ----------------------------------------------------------------------------------------------
# Finding races


@dataclass
class Race:
    """Two threads touching one element without a barrier (or atomics) between them.

    One Race stands for every element where the same two source lines race; `elements` says
    how many, `index` is the first example. `block_*`/`thread_*` are blockIdx/threadIdx tuples,
    `kind_*` "read", "write" or "atomic", `line_*` "file:line" of the accessing kernel code.
    """

    array: str
    space: str
    index: tuple
    kind_a: str
    block_a: tuple
    thread_a: tuple
    line_a: str
    kind_b: str
    block_b: tuple
    thread_b: tuple
    line_b: str
    elements: int = 1

    def __str__(self):
        def side(kind, block, thread, line):
            filename, _, lineno = line.rpartition(":")
            return f"{kind} by block {block} thread {thread} at {where.describe(filename, int(lineno))}"

        more = f" (and {self.elements - 1} more elements)" if self.elements > 1 else ""
        return (f"race on {self.space} '{self.array}'{list(self.index)}{more}: "
                f"{side(self.kind_a, self.block_a, self.thread_a, self.line_a)} vs "
                f"{side(self.kind_b, self.block_b, self.thread_b, self.line_b)}")


def _conflict(kind_a, kind_b):
    """At least one access writes, and they are not both atomic."""
    return (kind_a != LOAD or kind_b != LOAD) and not (kind_a == ATOMIC and kind_b == ATOMIC)


def _concurrent_pair(accesses_a, accesses_b, space, ordered):
    """Two accesses, one from each set of (who, interval, step), that nothing orders; or None.

    Threads of one block are ordered by a barrier between them (different intervals), and two
    lanes of one warp by a warp collective both joined between the accesses (`ordered`). Shared
    memory is per block, so other blocks never meet; global memory is one, and blocks have no
    barrier at all, so any two blocks meet.
    """
    by_slot = defaultdict(list)  # (block, interval) -> [(who, step)]
    blocks_b = defaultdict(list)  # block -> [who]
    for who, interval, step in accesses_b:
        by_slot[who[0], interval].append((who, step))
        blocks_b[who[0]].append(who)
    for who, interval, step in accesses_a:
        for other, other_step in by_slot[who[0], interval]:
            if other != who and not ordered(who, step, other, other_step):
                return who, other
        if space == GLOBAL:
            for block, others in blocks_b.items():
                if block != who[0]:
                    return who, others[0]
    return None


def _shares_event(events, start, other, stop):
    """Whether events[start:] and other[:stop] (two ascending lists of ids) share one."""
    if start >= len(events) or stop <= 0:
        return False
    first = events[start]
    for event in reversed(other[:stop]):          # the latest first: usually the shared one
        if event < first:
            return False
        position = bisect.bisect_left(events, event, start)
        if position < len(events) and events[position] == event:
            return True
    return False


def _races_of(target, ordered):
    """The races in one array's trace, one Race per (array, pair of source lines)."""
    # element -> (kind, site) -> {(who, interval, step)}: the order of the trace no longer matters.
    elements = defaultdict(lambda: defaultdict(set))
    for element, kind, who, interval, site, step in target.trace:
        elements[element][kind, site].add((who, interval, step))
    found = {}
    for element in sorted(elements):
        groups = sorted(elements[element].items())
        hit = set()
        for i, ((kind_a, site_a), accesses_a) in enumerate(groups):
            for (kind_b, site_b), accesses_b in groups[i:]:
                key = (site_a, site_b)
                if key in hit or not _conflict(kind_a, kind_b):
                    continue
                pair = _concurrent_pair(sorted(accesses_a), sorted(accesses_b), target.space, ordered)
                if pair is None:
                    continue
                hit.add(key)
                if key in found:
                    found[key].elements += 1
                    continue
                sides = [(kind_a, pair[0], site_a), (kind_b, pair[1], site_b)]
                sides.sort(key=lambda s: s[0] == LOAD)  # the writer first
                (ka, (ba, ta), sa), (kb, (bb, tb), sb) = sides
                index = tuple(int(i) for i in np.unravel_index(element, target.shape))
                found[key] = Race(target.name, target.space, index,
                                  ka, ba, ta, f"{sa[0]}:{sa[1]}", kb, bb, tb, f"{sb[0]}:{sb[1]}")
    return list(found.values())


def _races(launch):
    return [race for target in launch.targets.values() for race in _races_of(target, launch.warp_ordered)]


def find_races(kernel, griddim, blockdim, *args, sharedmem=0) -> list:
    """Data races of one launch of `kernel` on the simulator, as a list of Race.

    Every access is recorded with its thread, barrier interval (the k-th ``syncthreads`` a
    thread passes ends its interval k), kind and source line; the decision is made afterwards,
    so it does not depend on the order the simulator ran the threads in. Two accesses by
    different threads to the same element race when at least one writes, they are not both
    atomic, and nothing orders them:

    - shared memory: same block, same interval, and not two lanes of one warp with a warp
      collective (``syncwarp``, a shuffle, a vote) that both joined between the two accesses;
    - global memory: the same within a block, or different blocks (blocks never wait for
      each other), so a write in one block and a read in another also race.

    One Race is returned per (array, pair of source lines), with the first element as example
    and the number of elements affected. Barriers that not every thread reaches raise the
    simulator's ``BarrierError`` before any race is looked for.

    What it cannot see: accesses this launch did not make (other sizes, other data, branches
    a racy read steered elsewhere); two arguments that are the same memory (each name is its
    own array); local arrays. Warp-synchronous code with neither barriers nor warp collectives
    is reported as racy, correctly for GPUs since Volta (lanes of a warp are not in lockstep);
    ``threadfence`` and memory orderings between blocks are not modelled (any two blocks are
    unordered).
    """
    return _races(_launch(kernel, griddim, blockdim, args, _TRACE, sharedmem))


# ----------------------------------------------------------------------------------------------
# Who wrote what


def thread_map(kernel, griddim, blockdim, *args, array="out", by="thread", sharedmem=0):
    """Which thread (``by="thread"``) or block (``by="block"``) last wrote each element.

    Returns an int array with the shape of argument `array` (a parameter name; a shared array's
    name works too), -1 where no thread wrote. Ids are linear and count x fastest: block id =
    bx + gx * (by + gy * bz), thread id = block id * threads per block + the thread's linear
    index in its block; in a 1-D launch that is ``cuda.grid(1)``. Atomics count as writes.
    "Last" is in the simulator's execution order, which for a race-free kernel is the order
    the program imposes. Draw it with ``attention_lib.plotting.plot_thread_map``.
    """
    if by not in ("thread", "block"):
        raise ValueError(f"by must be 'thread' or 'block', got {by!r}")
    launch = _launch(kernel, griddim, blockdim, args, _TRACE, sharedmem)
    if array not in launch.targets:
        raise ValueError(f"array must name an array of {launch.kernel_name}; "
                         f"got {array!r}, arrays: {', '.join(launch.targets)}")
    target = launch.targets[array]
    ids = np.full(int(np.prod(target.shape)), -1, dtype=np.int64)
    for element, kind, who, *_ in target.trace:
        if kind != LOAD:
            ids[element] = launch.global_id(*who, by=by)
    return ids.reshape(target.shape)
