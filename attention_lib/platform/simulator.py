"""Numba's CUDA simulator, taught what a GPU does that it does not: its threads as greenlets, warp
primitives, barrier checking, and the GPU-only options and intrinsics of the library's kernels.

numba-cuda's simulator starts one operating-system thread per CUDA thread and polls them at every
barrier; it has no warp shuffles, votes or ``syncwarp``; it lets threads reach different barriers
(or leave the kernel while others wait) without a word; and it refuses ``launch_bounds=``,
``cuda.shared.array(..., alignment=)`` and intrinsics. ``install()`` (idempotent; runtime calls it
when the simulator is chosen, the sanitizer when it simulates a kernel beside a GPU) changes that,
so that one kernel source runs on both backends:

- **Threads as greenlets.** Each block's CUDA threads run in one operating-system thread, each up
  to its next barrier or warp primitive, in thread order (``run_block``). Same results as
  numba-cuda's threads, a barrier costs microseconds instead of milliseconds.
- **Warp primitives with CUDA's semantics.** A warp is 32 consecutive linear thread ids.
  ``shfl_sync``, ``shfl_up_sync``, ``shfl_down_sync``, ``shfl_xor_sync``, ``syncwarp``,
  ``ballot_sync``, ``any_sync``, ``all_sync``, ``eq_sync``, ``match_any_sync``,
  ``match_all_sync`` are rendezvous: each lane posts its value and waits until every live lane
  its mask names has reached a call of the same primitive with the same mask, then reads. Source
  lanes follow PTX's ``shfl.sync`` (an index wraps within the warp; ``up``/``down`` past the
  warp's edge, and ``xor`` with a lane mask's low five bits, read the lane's own value).
  ``activemask()`` gives the lanes that reach it together; ``lanemask_lt()`` the lanes below.
- **Barrier checking** (what compute-sanitizer's synccheck reports), as ``BarrierError``: threads
  of a block waiting at different ``syncthreads`` calls, a thread leaving the kernel while others
  wait at a barrier, a warp primitive whose mask names a live lane that never reaches it, a lane
  outside its own mask, and a shuffle reading a lane that has returned or is not in the mask.
  CUDA leaves all of these undefined: a GPU may hang, or go on with wrong values.
- **GPU-only options accepted**: ``cuda.jit(launch_bounds=..., max_registers=..., lineinfo=...)``
  (a launch with more threads than the bounds allow is refused, as a GPU refuses it),
  ``cuda.shared.array(..., alignment=n)``, intrinsics that carry a ``simulator_version``
  (``dynamic_shared.shared_rows``) and dynamic shared memory past 48 KB once the kernel's limit
  is raised (``set_max_dynamic_shared``), as on a GPU.

What the race finder needs is kept on each thread: the barriers it has passed (``barriers``)
and the warp collectives it has joined (``warp_events``), so that two lanes of a warp that meet
at a shuffle or ``syncwarp`` are ordered across it. ``numba_cuda_threads()`` puts numba-cuda's
own threads back for a comparison. Every numba-cuda internal replaced here is listed in
``numba_patches.PATCHED`` with the version it was checked against.
"""

import sys
import threading
import types
from collections import defaultdict, namedtuple
from contextlib import contextmanager

import greenlet
import numpy as np

from attention_lib.platform import where

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
# A kernel may take this much dynamic shared memory before its limit must be raised (a GPU's rule).
DEFAULT_DYNAMIC_LIMIT = 48 * 1024

Dim3 = namedtuple("Dim3", "x y z")           # as the simulator's: .x .y .z, and a tuple


class BarrierError(RuntimeError):
    """A barrier or warp primitive that the threads it names do not all reach: undefined on a GPU.

    The simulator re-creates a thread's exception from its message alone, so the constructor
    takes the message only.
    """


_SKIPPED_FILES = {__file__}     # frames of the simulator itself; the kernelapi's file is added at install


def _caller_site():
    """(file, line) of the kernel or device-function line that called into the simulator."""
    frame = sys._getframe(2)
    while frame.f_code.co_filename in _SKIPPED_FILES:
        frame = frame.f_back
    return frame.f_code.co_filename, frame.f_lineno


def _where(site):
    return where.describe(*site)


def _threads(threads):
    """'thread (3, 0, 0)' or '16 threads, (16, 0, 0) to (31, 0, 0)' (by linear thread id)."""
    threads = sorted(threads, key=lambda t: t.thread_id)
    first = tuple(threads[0].threadIdx)
    if len(threads) == 1:
        return f"thread {first}"
    return f"{len(threads)} threads, {first} to {tuple(threads[-1].threadIdx)}"


def _lanes(lanes):
    """'lanes 0-15, 20' from lane numbers."""
    lanes, runs = sorted(lanes), []
    for lane in lanes:
        if runs and lane == runs[-1][1] + 1:
            runs[-1][1] = lane
        else:
            runs.append([lane, lane])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return ("lane " if len(lanes) == 1 else "lanes ") + text


# What a thread waits for when it hands control back to its block's scheduler.
Barrier = namedtuple("Barrier", "site")
WarpCall = namedtuple("WarpCall", "op mask value arg site")


class SimulatedThread(greenlet.greenlet):
    """One CUDA thread of a simulated block, as a greenlet: it runs until it reaches a barrier,
    a warp primitive or its end, and then hands control back to its block's scheduler.

    Carries what numba-cuda's ``BlockThread`` carries and the simulator reads (``blockIdx``,
    ``threadIdx``, ``thread_id``, ``syncthreads*``, ``exception``), its lane and warp, and for the
    race finder the barriers passed and warp collectives joined.
    """

    def __init__(self, manager, block_index, thread_index, kernel, args):
        super().__init__()
        self._manager = manager                   # its block_state backs syncthreads_count/and/or
        self._kernel, self._args = kernel, args
        self.blockIdx = Dim3(*block_index)
        self.threadIdx = Dim3(*thread_index)
        x, y, _ = manager._block_dim
        self.thread_id = thread_index[0] + x * (thread_index[1] + y * thread_index[2])
        self.warp, self.lane = divmod(self.thread_id, WARP_SIZE)
        self.exception = None
        self.waiting = None                       # a Barrier or a WarpCall while handed back
        self.barriers = 0                         # barriers passed: the race finder's interval
        self.warp_events = []                     # ids of the warp collectives joined, in order

    def run(self):
        try:
            if self._manager._debug:              # as numba-cuda's debug mode: 1/0 raises
                with np.errstate(divide="raise"):
                    self._kernel(*self._args)
            else:
                self._kernel(*self._args)
        except Exception as error:               # the message numba-cuda's threads give
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            self.exception = (type(error)(f"{where}: {error}" if str(error) else where),
                              sys.exc_info()[2])

    def _hand_back(self, waiting):
        self.waiting = waiting
        return self.parent.switch()               # back to the scheduler; it sends the result

    def syncthreads(self):
        self._hand_back(Barrier(_caller_site()))

    def _vote(self, value, combine):
        """Every thread posts a value, all wait, each reads the block's combined answer."""
        state = self._manager.block_state     # numba-cuda's array of block_dim, one per block
        state[tuple(self.threadIdx)] = value
        self._hand_back(Barrier(_caller_site()))
        result = combine(state)
        self._hand_back(Barrier(_caller_site()))   # nobody posts the next vote before all have read
        return result

    def syncthreads_count(self, value):
        return int(self._vote(value, np.count_nonzero))

    def syncthreads_and(self, value):
        return int(self._vote(value, np.all))

    def syncthreads_or(self, value):
        return int(self._vote(value, np.any))

    def warp_call(self, op, mask, value=None, arg=None):
        """Join the warp primitive `op`: post `value`, wait for the lanes `mask` names, read."""
        mask = int(mask) & FULL_MASK
        if op != "activemask" and not mask >> self.lane & 1:
            raise BarrierError(f"{op} by lane {self.lane} of warp {self.warp} with mask {mask:#010x}, "
                               "which leaves the calling lane out: undefined on a GPU")
        return self._hand_back(WarpCall(op, mask, value, arg, _caller_site()))


def _source_lane(op, lane, arg):
    """The lane a shuffle reads, as PTX's shfl.sync picks it (width 32), or `lane` itself."""
    step = int(arg) & (WARP_SIZE - 1)
    if op == "shfl_sync":
        return step
    if op == "shfl_up_sync":
        return lane - step if lane >= step else lane
    if op == "shfl_down_sync":
        return lane + step if lane + step < WARP_SIZE else lane
    return lane ^ step                                    # shfl_xor_sync


def _results(op, group):
    """{lane: result} of one complete warp collective; `group` maps lane -> its WarpCall."""
    if op.startswith("shfl"):
        return {lane: group[_source_lane(op, lane, call.arg)].value for lane, call in group.items()}
    if op in ("syncwarp",):
        return dict.fromkeys(group)
    if op == "activemask":
        return dict.fromkeys(group, sum(1 << lane for lane in group))
    votes = {lane: bool(call.value) for lane, call in group.items()}
    if op == "ballot_sync":
        return dict.fromkeys(group, sum(1 << lane for lane, vote in votes.items() if vote))
    if op in ("all_sync", "any_sync", "eq_sync"):
        answer = {"all_sync": all, "any_sync": any}.get(op, lambda v: len(set(v)) == 1)(votes.values())
        return dict.fromkeys(group, int(answer))
    values = {lane: call.value for lane, call in group.items()}
    if op == "match_any_sync":
        return {lane: sum(1 << other for other, v in values.items() if v == value)
                for lane, value in values.items()}
    same = len(set(values.values())) == 1                 # match_all_sync: (mask, pred)
    return dict.fromkeys(group, (sum(1 << lane for lane in group), 1) if same else (0, 0))


class _Block:
    """The scheduler of one simulated block: runs its threads, meets them at barriers and warp
    primitives, and raises BarrierError where a GPU's behaviour is undefined."""

    def __init__(self, threads):
        self.threads = threads
        self.warps = defaultdict(dict)                    # warp -> {lane: thread}
        for thread in threads:
            self.warps[thread.warp][thread.lane] = thread
        self.events = 0

    def run(self):
        ready = [(thread, ()) for thread in self.threads]    # (thread, what its wait returns)
        while True:
            for thread, sent in ready:
                thread.switch(*sent)
                if thread.exception:
                    raise thread.exception[0].with_traceback(thread.exception[1])
            ready = self._warp_collectives()
            if ready:
                continue
            live = [t for t in self.threads if not t.dead]
            if not live:
                if block_recorder is not None:
                    block_recorder(self.threads)
                return
            self._check_barrier(live)
            for thread in live:
                thread.barriers += 1
            ready = [(thread, ()) for thread in live]

    def _warp_collectives(self):
        """(thread, result) for every lane of every warp collective that all its lanes reached."""
        ready = []
        for warp, lanes in self.warps.items():
            calls = {lane: t.waiting for lane, t in lanes.items()
                     if not t.dead and isinstance(t.waiting, WarpCall)}
            while calls:
                lane, call = next(iter(calls.items()))
                if call.op == "activemask":               # the lanes that reach it together
                    group = {l: c for l, c in calls.items() if c.op == "activemask" and c.site == call.site}
                else:
                    named = [l for l in lanes if call.mask >> l & 1 and not lanes[l].dead]
                    if not all(l in calls and calls[l][:2] == call[:2] for l in named):
                        calls = {l: c for l, c in calls.items() if (c.op, c.mask) != call[:2]}
                        continue                          # waits for lanes not there yet
                    group = {l: calls[l] for l in named}
                    self._check_sources(warp, call, group, lanes)
                for l, result in _results(call.op, group).items():
                    lanes[l].warp_events.append(self.events)
                    lanes[l].waiting = None
                    ready.append((lanes[l], (result,)))
                    del calls[l]
                self.events += 1
        return sorted(ready, key=lambda pair: pair[0].thread_id)

    def _check_sources(self, warp, call, group, lanes):
        if not call.op.startswith("shfl"):
            return
        for lane, own in group.items():
            source = _source_lane(call.op, lane, own.arg)
            if source in group:
                continue
            why = ("is not in the mask" if not call.mask >> source & 1 else
                   "does not exist (the block ends before it)" if source not in lanes else "has returned")
            raise BarrierError(f"{call.op} at {_where(call.site)}: lane {lane} of warp {warp} reads lane "
                               f"{source}, which {why}: the value is undefined on a GPU "
                               f"(block {tuple(lanes[lane].blockIdx)})")

    def _check_barrier(self, live):
        """Every live thread waits at a barrier: the same one, and none has left the kernel."""
        stuck = [t for t in live if isinstance(t.waiting, WarpCall)]
        if stuck:
            self._deadlocked_warp(stuck[0])
        sites = defaultdict(list)
        for thread in live:
            sites[thread.waiting.site].append(thread)
        block = tuple(live[0].blockIdx)
        if len(sites) > 1:
            (site_a, a), (site_b, b) = sorted(sites.items(), key=lambda s: s[1][0].thread_id)[:2]
            raise BarrierError(f"block {block}: {_threads(a)} wait at the barrier at {_where(site_a)}, "
                               f"{_threads(b)} at {_where(site_b)}: different syncthreads() calls in one "
                               "block are undefined on a GPU (a barrier must be reached by every thread "
                               "of the block, so keep it out of branches that differ between threads)")
        returned = [t for t in self.threads if t.dead]
        if returned:
            raise BarrierError(f"block {block}: {_threads(returned)} returned while {_threads(live)} wait at "
                               f"the barrier at {_where(live[0].waiting.site)}: a syncthreads() that not "
                               "every thread of the block reaches is undefined on a GPU (keep every barrier "
                               "out of guards, early returns and loops that differ between threads, and "
                               "guard only the work around it)")

    def _deadlocked_warp(self, thread):
        call, lanes = thread.waiting, self.warps[thread.warp]
        waiting = [l for l, t in lanes.items() if not t.dead and isinstance(t.waiting, WarpCall)
                   and t.waiting[:2] == call[:2]]
        missing = [l for l in lanes if call.mask >> l & 1 and not lanes[l].dead and l not in waiting]
        where = lanes[missing[0]].waiting
        elsewhere = (f"the barrier at {_where(where.site)}" if isinstance(where, Barrier) else
                     f"{where.op} (mask {where.mask:#010x}) at {_where(where.site)}")
        raise BarrierError(f"{call.op} at {_where(call.site)} (mask {call.mask:#010x}, block "
                           f"{tuple(thread.blockIdx)}, warp {thread.warp}): {_lanes(waiting)} wait for "
                           f"{_lanes(missing)}, which wait at {elsewhere}: every live lane a mask names "
                           "must reach the same warp primitive, or a GPU's behaviour is undefined")


def run_block(manager, block_index, *args):
    """``BlockManager.run`` on greenlets: every thread of the block runs to its next barrier or
    warp primitive (or its end), in thread order; complete warp collectives are answered; when
    all wait at one barrier, the next round starts. The first error stops the block."""
    threads = [SimulatedThread(manager, block_index, thread_index, manager._f, args)
               for thread_index in np.ndindex(*manager._block_dim)]
    try:
        _Block(threads).run()
    finally:
        # After an error, unwind the threads still waiting now (GreenletExit), so the device
        # functions they are inside of hand their modules the real `cuda` back.
        for thread in threads:
            if not thread.dead:
                thread.throw()


def current_thread():
    """The simulated CUDA thread running now, else the Python thread (outside a launch)."""
    running = greenlet.getcurrent()
    return running if isinstance(running, SimulatedThread) else threading.current_thread()


def _simulated_thread(what):
    running = greenlet.getcurrent()
    if not isinstance(running, SimulatedThread):
        raise RuntimeError(f"{what} needs the library's simulated threads (not numba-cuda's own)")
    return running


class _ThreadingWithSimulatedThreads:
    """The ``threading`` module as the simulator's kernel API sees it: ``current_thread()``
    is the simulated CUDA thread. The API asks it for threadIdx, blockIdx and barriers."""

    current_thread = staticmethod(current_thread)

    def __getattr__(self, name):
        return getattr(threading, name)


# ---- the warp primitives, as methods of the simulator's `cuda` ----------------------------------

def _warp_method(op, takes_arg):
    if takes_arg:
        def primitive(self, mask, value, arg):
            return _simulated_thread(op).warp_call(op, mask, value, arg)
    else:
        def primitive(self, mask, value):
            return _simulated_thread(op).warp_call(op, mask, value)
    primitive.__name__ = op
    return primitive


def _syncwarp(self, mask=FULL_MASK):
    _simulated_thread("syncwarp").warp_call("syncwarp", mask)


def _activemask(self):
    return _simulated_thread("activemask").warp_call("activemask", 0)


def _lanemask_lt(self):
    return (1 << _simulated_thread("lanemask_lt").lane) - 1


_VOTE_MODES = {0: "all_sync", 1: "any_sync", 2: "eq_sync", 3: "ballot_sync"}
_SHFL_MODES = {0: "shfl_sync", 1: "shfl_up_sync", 2: "shfl_down_sync", 3: "shfl_xor_sync"}


def _vote_sync_intrinsic(self, mask, mode, predicate):
    """numba's (ballot, predicate) intrinsic behind all_sync, any_sync, eq_sync and ballot_sync."""
    thread = _simulated_thread("vote_sync_intrinsic")
    answer = thread.warp_call(_VOTE_MODES[mode], mask, predicate)
    ballot = answer if mode == 3 else None
    return (ballot, bool(answer)) if ballot is not None else (0, bool(answer))


def _shfl_sync_intrinsic(self, mask, mode, value, offset, clamp):
    """numba's (value, in range) intrinsic behind the four shuffles (clamp as numba passes it)."""
    return _simulated_thread("shfl_sync_intrinsic").warp_call(_SHFL_MODES[mode], mask, value, offset), True


WARP_PRIMITIVES = {
    "shfl_sync": _warp_method("shfl_sync", True),
    "shfl_up_sync": _warp_method("shfl_up_sync", True),
    "shfl_down_sync": _warp_method("shfl_down_sync", True),
    "shfl_xor_sync": _warp_method("shfl_xor_sync", True),
    "ballot_sync": _warp_method("ballot_sync", False),
    "any_sync": _warp_method("any_sync", False),
    "all_sync": _warp_method("all_sync", False),
    "eq_sync": _warp_method("eq_sync", False),
    "match_any_sync": _warp_method("match_any_sync", False),
    "match_all_sync": _warp_method("match_all_sync", False),
    "syncwarp": _syncwarp,
    "activemask": _activemask,
    "lanemask_lt": _lanemask_lt,
    "vote_sync_intrinsic": _vote_sync_intrinsic,
    "shfl_sync_intrinsic": _shfl_sync_intrinsic,
}


# ---- element access, shared arrays, launches ----------------------------------------------------

def _element(self, index):
    """``FakeWithinKernelCUDAArray.__getitem__`` without its two intermediate calls: the same
    result (a scalar, or a sub-array wrapped the same way)."""
    item = self.__dict__["_item"]                 # the FakeCUDAArray this one wraps
    value = item._ary[index]
    if type(value) is np.ndarray or type(value) is np.void:
        return type(self)(type(item)(value, stream=item.stream))
    return value


def _set_element(self, index, value):
    self.__dict__["_item"]._ary[index] = value


# The sanitizer's recorders for the launch it runs (None: plain launches). shared_recorder is
# called as recorder(fake_shared, numba_array, shape, dtype, caller_frame) and returns what the
# kernel sees; block_recorder(threads) when a block has finished (each thread's barriers and
# warp_events then hold all it passed and joined).
shared_recorder = block_recorder = None


def _shared_array(self, shape, dtype, alignment=None):
    """``FakeCUDAShared.array`` keyed, as numba-cuda's, by the declaring line (and, unlike numba-cuda's,
    by the call's place in it: ``declaration``), but read from the
    caller's frame instead of a whole ``traceback.extract_stack`` (which checks every source
    file on the stack, at each declaration of each thread), and stored with ``setdefault``,
    atomic under the interpreter lock: numba-cuda's own threads, which can switch between the
    lookup and the store, then also get one array per block (numba-cuda's code gave two threads
    two arrays about once in 300 launches of the fused kernel at a 1 us switch interval).
    ``alignment`` is accepted as a GPU accepts it (a power of two); NumPy's buffers are aligned."""
    if alignment is not None and (alignment <= 0 or alignment & (alignment - 1)):
        raise ValueError(f"alignment must be a power of two, got {alignment}")
    caller = sys._getframe(1)
    dtype = _numpy_dtype(dtype)
    if shared_recorder is not None:
        return shared_recorder(self, _numba_shared_array, shape, dtype, caller)
    if shape == 0:                                # dynamic shared memory: numba-cuda's one buffer
        if not self.__dict__.get("_poisoned"):    # numba-cuda zeroes it; a GPU does not
            self._dynshared.fill(-1)              # bytes 0xFF: NaN as float32 or float64
            self._poisoned = True
        return _numba_shared_array(self, shape, dtype)
    site = declaration(caller)
    shared = self._allocations.get(site)
    if shared is None:
        shared = self._allocations.setdefault(site, garbage(shape, dtype))
    return shared


def declaration(frame):
    """Where a shared array is declared: the file, the line and the call's place in the line's code, so
    that two arrays declared on one line (``a = cuda.shared.array(..); b = cuda.shared.array(..)``) are two
    arrays, as they are on a GPU."""
    return frame.f_code.co_filename, frame.f_lineno, frame.f_lasti


def garbage(shape, dtype):
    """A new shared array as a GPU hands one over: holding whatever was there, never zeros. Floats
    are NaN, so a slot read before any thread wrote it spoils what it reaches (times 0 included);
    integers hold the byte pattern 0xA5, bools True."""
    array = np.empty(shape, dtype)
    poison(array)
    return array


def poison(array):
    """Fill `array` in place with garbage()'s values."""
    if array.dtype.kind in "fc":
        array.fill(np.nan)
    elif array.dtype.kind == "b":
        array.fill(True)
    else:
        array.view(np.uint8).fill(0xA5)


def _numpy_dtype(dtype):
    """A NumPy dtype from what a kernel names (numba's float32, NumPy's, a dtype)."""
    from numba.cuda import types as numba_types
    from numba.cuda.np import numpy_support
    return numpy_support.as_dtype(dtype) if isinstance(dtype, numba_types.Type) else np.dtype(dtype)


def _is_device_dispatcher(value):
    """A compiled (GPU target) device function: swapped for its simulated twin in a launch."""
    return getattr(value, "targetoptions", {}).get("device") and hasattr(value, "py_func")


def _simulation_swaps(fn, found=None, seen=None):
    """[(namespace, name, simulated)]: what `fn`'s code reaches that the simulator must replace,
    through its globals and the module attributes it names (``flash.visible_keys``), and in
    turn through every device function it calls: intrinsics by their ``simulator_version``,
    and (in a process whose kernels compile for a GPU) device functions by simulator ones."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel
    found = [] if found is None else found
    seen = set() if seen is None else seen
    if fn in seen:
        return found
    seen.add(fn)
    names = set(fn.__code__.co_names)
    places = [(fn.__globals__, name) for name in names if name in fn.__globals__]
    for name in names:
        module = fn.__globals__.get(name)
        if isinstance(module, types.ModuleType):
            places += [(vars(module), attr) for attr in names if attr in vars(module)]
    for namespace, name in places:
        value = namespace[name]
        if hasattr(value, "simulator_version"):
            found.append((namespace, name, value.simulator_version))
        elif _is_device_dispatcher(value):
            found.append((namespace, name, FakeCUDAKernel(value.py_func, device=True)))
            _simulation_swaps(value.py_func, found, seen)
        elif isinstance(value, FakeCUDAKernel) and value._device:
            _simulation_swaps(value.fn, found, seen)
    return found


_swaps = {}       # kernel's Python function -> (its _simulation_swaps, what each replaced)


@contextmanager
def simulated_globals(fn):
    """For the length of a launch of `fn`, what its code reaches runs on the simulator."""
    swaps, replaced = _swaps.get(fn, (None, None))
    if swaps is None or any(namespace[name] is not was for (namespace, name, _), was in zip(swaps, replaced)):
        swaps = _simulation_swaps(fn)                     # first launch, or a function was redefined
        _swaps[fn] = swaps, [namespace[name] for namespace, name, _ in swaps]
    originals = [(namespace, name, namespace[name]) for namespace, name, _ in swaps]
    for namespace, name, simulated in swaps:
        namespace[name] = simulated
    try:
        yield
    finally:
        for namespace, name, original in reversed(originals):
            namespace[name] = original


def set_max_dynamic_shared(kernel, nbytes):
    """A simulated kernel's limit of dynamic shared memory, raised as a GPU's driver raises it."""
    kernel.max_dynamic_shared_bytes = nbytes


def _check_launch(kernel):
    """Refuse what a GPU refuses: more threads than launch_bounds allow, more dynamic shared
    memory than the kernel's limit."""
    threads = int(np.prod(kernel.block_dim))
    bounds = getattr(kernel, "launch_bounds", None)
    if bounds and threads > bounds[0]:
        raise ValueError(f"{kernel.fn.__name__}: a block of {threads} threads, more than its "
                         f"launch_bounds allow ({bounds[0]}); a GPU refuses this launch")
    limit = getattr(kernel, "max_dynamic_shared_bytes", DEFAULT_DYNAMIC_LIMIT)
    if kernel.dynshared_size > limit:
        raise ValueError(f"{kernel.fn.__name__}: {kernel.dynshared_size:,} bytes of dynamic shared memory, "
                         f"more than the kernel's limit of {limit:,}; a GPU refuses this launch until the "
                         "limit is raised (dynamic_shared.launch does)")


def _call(self, *args):
    """``FakeCUDAKernel.__call__``. A launch first checks what a GPU would refuse and swaps in
    what its code reaches that has a simulated twin. A device function called inside a launch
    whose module already sees the simulator's ``cuda`` takes a shortcut: the use is counted, as
    numba-cuda's ``swapped_cuda_module`` does, without its two locks and context manager
    (threads are greenlets: nothing runs between the test and the count); whoever leaves last,
    numba-cuda's context or this, gives the module its real ``cuda`` back."""
    from numba.cuda.simulator import kernel, kernelapi
    if not (self._device or kernel._kernel_context):
        _check_launch(self)
        with simulated_globals(self.fn):
            return _numba_call(self, *args)                 # a launch
    users, key = kernelapi._swap_refcount, id(self.fn.__globals__)
    if not users.get(key):
        return _numba_call(self, *args)                     # first use: numba-cuda swaps the module
    users[key] += 1
    try:
        return self.fn(*args)
    finally:
        users[key] -= 1
        if not users[key]:                                  # the last one out restores, as numba-cuda's
            self.fn.__globals__.update(kernelapi._swap_orig.pop(key))
            del users[key]


def _bounds(launch_bounds):
    """launch_bounds as (max threads, min blocks, max cluster), validated as numba-cuda does."""
    bounds = (launch_bounds,) if isinstance(launch_bounds, int) else tuple(launch_bounds)
    if not 1 <= len(bounds) <= 3 or not all(isinstance(b, int) and b > 0 for b in bounds):
        raise ValueError(f"launch_bounds must be 1 to 3 positive ints, got {launch_bounds!r}")
    return bounds


def _jit(func_or_sig=None, device=False, launch_bounds=None, max_registers=None, lineinfo=False,
         **options):
    """``cuda.jit`` of the simulator, taking the GPU's options as well (launch_bounds is enforced
    at launch; max_registers and lineinfo only concern the compiler)."""
    bounds = _bounds(launch_bounds) if launch_bounds is not None else None
    made = _numba_jit(func_or_sig, device=device, **options)

    def with_bounds(kernel):
        kernel.launch_bounds = bounds
        return kernel

    if callable(made) and not hasattr(made, "py_func"):     # jit(...) used as a decorator factory
        return lambda fn: with_bounds(made(fn))
    return with_bounds(made)


_originals = []   # (owner, attribute, numba-cuda's or None, ours, needs_greenlets)
_numba_shared_array = _numba_call = _numba_jit = None


def install():
    """Teach numba-cuda's simulator the GPU features above (idempotent)."""
    if _originals:
        return
    import numba.cuda
    from numba.cuda import simulator
    from numba.cuda.simulator import api, kernel, kernelapi
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray
    global _numba_shared_array, _numba_call, _numba_jit
    _SKIPPED_FILES.add(kernelapi.__file__)
    _numba_shared_array, _numba_call, _numba_jit = (kernelapi.FakeCUDAShared.array,
                                                    kernel.FakeCUDAKernel.__call__, api.jit)
    # needs_greenlets: wrong under numba-cuda's own threads (numba_cuda_threads puts it back).
    replacements = [(kernel.BlockManager, "run", run_block, True),
                    (kernel.FakeCUDAKernel, "__call__", _call, True),
                    (kernelapi, "threading", _ThreadingWithSimulatedThreads(), True),
                    (kernelapi.FakeCUDAShared, "array", _shared_array, False),
                    (FakeWithinKernelCUDAArray, "__getitem__", _element, False),
                    (FakeWithinKernelCUDAArray, "__setitem__", _set_element, False),
                    (api, "jit", _jit, False), (simulator, "jit", _jit, False)]
    if getattr(numba.cuda, "jit", None) is api.jit:        # the simulator is numba.cuda here
        replacements.append((numba.cuda, "jit", _jit, False))
    replacements += [(kernelapi.FakeCUDAModule, name, method, True) for name, method in WARP_PRIMITIVES.items()]
    for owner, name, replacement, needs_greenlets in replacements:
        _originals.append((owner, name, getattr(owner, name, None), replacement, needs_greenlets))
        setattr(owner, name, replacement)


@contextmanager
def numba_cuda_threads(keep_shortcuts=False):
    """numba-cuda's own simulator, as shipped, for the length of a `with` block (to compare the
    two: scripts/simulator_speed.py, tests/test_numba_patches.py). keep_shortcuts: put back only
    what needs greenlets, and keep the shortcuts that are right under both schedulers (the
    shared-array lookup among them, whose atomic store makes numba-cuda's threads race-free).
    Warp primitives and barrier checking need the greenlets, and go for the block's length."""
    restored = [patch for patch in _originals if patch[4] or not keep_shortcuts]
    for owner, name, theirs, _, _ in restored:
        if theirs is None:
            delattr(owner, name)
        else:
            setattr(owner, name, theirs)
    try:
        yield
    finally:
        for owner, name, _, ours, _ in restored:
            setattr(owner, name, ours)
