"""One launch on the simulator with every access recorded, and what a check measures from it.

``Traced(kernel, griddim, blockdim, *args)`` runs the kernel once under the sanitizer's trace
(every load and store with its thread, its barrier interval and its source line) and answers the
questions a check asks of a kernel's structure, each from that one run:

- ``races()``: the data races (sanitizer.Race), empty when none;
- ``loads(name)``: how often each element of an array was read (reuse);
- ``warp_segments(name)``, ``worst_warp_load(name)``: the 128-byte segments a warp's load (or, with
  ``kind=sanitizer.STORE``, store) touches (coalescing): on average, and at the site that touches
  the most;
- ``worst_bank_ways(name)``: the most different 4-byte words of one shared-memory bank that one
  warp's access puts (bank conflicts: n words of one bank take n rounds, one word read by many
  lanes is broadcast), at the site where it is worst;
- ``stored_twice(name)``: the first thread that stored an element of an array twice;
- ``serial_warp(name)``: the warp that took the most instructions to move an array beside its share
  of its block's accesses spread over all the block's warps (a copy by one lane, or one warp, in a
  loop takes many times its share; every lane of every warp side by side, its share);
- ``shared_loads_per_thread()``: the most shared-memory reads one thread made (a tree reduction
  reads about 2 log2(n) slots a thread, a serial loop in one thread n);
- ``barriers``: the most barriers a thread passed; ``barriers_by_block``: the same, block by block;
- ``unwritten_read()``: the first read of a shared slot that no thread of its block had written
  (on a GPU it holds whatever the memory held);
- ``stale_read()``: in a kernel that refills its tiles every step, the first read of a slot that
  was not written again since an earlier step read it.
"""

from dataclasses import dataclass

import numpy as np

from attention_lib.measure import sanitizer
from attention_lib.platform import where


@dataclass
class SharedRead:
    """A read of a shared slot that did not hold a value written for it."""

    array: str
    index: tuple
    block: tuple
    thread: tuple
    filename: str
    line: int
    never_written: bool

    def __str__(self):
        when = "which no thread of its block had written" if self.never_written else \
            "which no thread wrote again after an earlier step read it"
        return (f"thread {self.thread} of block {self.block} read {self.array}{list(self.index)} at "
                f"{where.describe_with_code(self.filename, self.line)}, {when}")


class Traced:
    """One launch on the simulator with every access recorded (see the module's docstring).

    args: NumPy arrays (outputs are written in place), simulator or GPU device arrays, scalars. An
    out-of-bounds index raises the sanitizer's IndexError, a divergent barrier the simulator's
    BarrierError.
    """

    def __init__(self, kernel, griddim, blockdim, *args, sharedmem=0):
        self.launch = sanitizer._launch(kernel, griddim, blockdim, args, sanitizer._TRACE, sharedmem)

    def races(self):
        """The races found, as sanitizer.Race objects (empty when none)."""
        return sanitizer._races(self.launch)

    @property
    def barriers(self):
        """The most barriers one thread passed."""
        return self.launch.barriers

    @property
    def barriers_by_block(self):
        """{blockIdx (x, y, z): the most barriers a thread of that block passed}: a limit that
        depends on the block (the tiles its own rows see) is compared block by block."""
        return dict(self.launch.barriers_by_block)

    def arrays(self, space=None):
        """The names of the recorded arrays (of `space`, "global" or "shared", if given)."""
        return [name for name, target in self.launch.targets.items() if space is None or target.space == space]

    def loads(self, name):
        """Loads of each element of array `name`, an int array of its shape."""
        target = self.launch.targets[name]
        elements = [element for element, kind, *_ in target.trace if kind == sanitizer.LOAD]
        size = int(np.prod(target.shape))
        return np.bincount(np.asarray(elements, dtype=np.int64), minlength=size).reshape(target.shape)

    def _warp_requests(self, name, kind=sanitizer.LOAD):
        """{(warp, barrier interval, site, n): [elements]} of the accesses of `kind` to array `name`:
        the n-th access each lane of a warp makes at one source line in one barrier interval is one
        instruction of the warp (a loop's iterations are separate instructions, as the warp runs them
        in step). Each lane's element is listed once per access."""
        target = self.launch.targets[name]
        requests, made = {}, {}
        for element, access, (block, thread), interval, site, _ in target.trace:
            if access == kind:
                warp = self.launch.global_id(block, thread) // 32
                n = made[block, thread, interval, site] = made.get((block, thread, interval, site), -1) + 1
                requests.setdefault((warp, interval, site, n), []).append(element)
        return requests

    def _segments(self, name, elements, segment_bytes):
        itemsize = self.launch.targets[name].dtype.itemsize
        return len({element * itemsize // segment_bytes for element in elements})

    def warp_segments(self, name, segment_bytes=128, kind=sanitizer.LOAD):
        """Mean number of `segment_bytes` segments of array `name` that one warp's load (or store:
        kind=sanitizer.STORE) touches.

        The n-th accesses of the lanes of one warp (32 consecutive threads, x fastest) at one source
        line in one barrier interval are taken as one instruction; on a GPU each segment it touches
        is a separate memory transaction. 32 float32 side by side: 1 segment; one per row: up to 32.
        """
        requests = self._warp_requests(name, kind)
        return float(np.mean([self._segments(name, e, segment_bytes) for e in requests.values()])) \
            if requests else 0.0

    def worst_warp_load(self, name, segment_bytes=128, kind=sanitizer.LOAD):
        """(mean segments per warp access, filename, line) of the site of array `name` whose warp
        loads (or stores: kind=sanitizer.STORE) touch the most segments on average; (0.0, None, None)
        when it is never accessed so."""
        by_site = {}
        for (_, _, site, _), elements in self._warp_requests(name, kind).items():
            by_site.setdefault(site, []).append(self._segments(name, elements, segment_bytes))
        if not by_site:
            return 0.0, None, None
        site, counts = max(by_site.items(), key=lambda item: np.mean(item[1]))
        return float(np.mean(counts)), site[0], site[1]

    def worst_bank_ways(self, name, kind=sanitizer.LOAD, banks=32):
        """(ways, filename, line) of the warp access to shared array `name` (loads, or stores:
        kind=sanitizer.STORE) that puts the most different 4-byte words in one of the `banks` banks
        (word mod banks): a warp takes that many rounds to serve it. (0, None, None) when the array
        is never accessed so."""
        itemsize = self.launch.targets[name].dtype.itemsize
        worst = (0, None, None)
        for (_, _, site, _), elements in self._warp_requests(name, kind).items():
            per_bank = {}
            for word in {element * itemsize // 4 for element in elements}:
                per_bank.setdefault(word % banks, set()).add(word)
            ways = max(len(words) for words in per_bank.values())
            if ways > worst[0]:
                worst = (ways, site[0], site[1])
        return worst

    def serial_warp(self, name, kind=sanitizer.LOAD):
        """(instructions, share, filename, line) of the warp that took the most instructions to access
        array `name` (loads, or stores: kind=sanitizer.STORE) beside its share: in each barrier interval,
        ceil(its block's accesses / (32 x the block's warps)), the instructions the block's accesses
        would take spread over all its warps, 32 lanes side by side; summed over the intervals. The
        warp returned has the largest ratio of instructions to share in the launch; the site is the one
        where it made the most instructions. A copy by one thread (or one warp of the block) in a loop
        takes about 32 (or warps) times its share. None when `name` is never accessed so."""
        warps_per_block = -(-self.launch.threads_per_block // 32)
        per_warp, per_interval = {}, {}
        for (warp, interval, site, _), elements in self._warp_requests(name, kind).items():
            block = warp // warps_per_block
            instructions, intervals, sites = per_warp.setdefault(warp, [0, set(), {}])
            per_warp[warp][0] += 1
            intervals.add(interval)
            sites[site] = sites.get(site, 0) + 1
            per_interval[block, interval] = per_interval.get((block, interval), 0) + len(elements)
        if not per_warp:
            return None

        def share(warp):
            block = warp // warps_per_block
            return sum(-(-per_interval[block, interval] // (32 * warps_per_block)) for interval in per_warp[warp][1])
        worst = max(per_warp, key=lambda warp: per_warp[warp][0] / share(warp))
        instructions, _, sites = per_warp[worst]
        site = max(sites, key=sites.get)
        return instructions, share(worst), site[0], site[1]

    def stored_twice(self, name):
        """The first thread that stored an element of array `name` a second time:
        ((block, thread), index as text, its stores of that element, its stores of the array,
        filename, line of the second store); None when every thread stored each element at most once."""
        target = self.launch.targets[name]
        stores, per_thread, again = {}, {}, None
        for element, access, who, _, site, _ in target.trace:
            if access == sanitizer.STORE:
                stores[who, element] = stores.get((who, element), 0) + 1
                per_thread[who] = per_thread.get(who, 0) + 1
                if stores[who, element] == 2 and again is None:
                    again = (who, element, site)
        if again is None:
            return None
        who, element, site = again
        index = ", ".join(str(int(i)) for i in np.unravel_index(element, target.shape))
        return who, index, stores[who, element], per_thread[who], site[0], site[1]

    def most_accesses_by_a_thread(self, name, kind=sanitizer.LOAD):
        """(accesses, block, thread) of the thread that made the most accesses of `kind` to array `name`;
        (0, None, None) when none was made."""
        counts = {}
        for _, access, who, *_ in self.launch.targets[name].trace:
            if access == kind:
                counts[who] = counts.get(who, 0) + 1
        if not counts:
            return 0, None, None
        (block, thread), most = max(counts.items(), key=lambda item: item[1])
        return most, block, thread

    def shared_loads_per_thread(self):
        """The most reads of shared memory one thread made, over every shared array."""
        counts = {}
        for name in self.arrays(sanitizer.SHARED):
            for _, kind, who, *_ in self.launch.targets[name].trace:
                if kind == sanitizer.LOAD:
                    counts[who] = counts.get(who, 0) + 1
        return max(counts.values(), default=0)

    def _shared_reads(self, refilled):
        """The first SharedRead of a slot holding no value written for it, or None. refilled: also
        a slot read again, in a later interval, without a write since its last read."""
        for name in self.arrays(sanitizer.SHARED):
            target = self.launch.targets[name]
            last_write, last_read = {}, {}              # (block, element) -> barrier interval
            for element, kind, (block, thread), interval, site, _ in target.trace:
                slot = (block, element)
                if kind != sanitizer.LOAD:
                    last_write[slot] = interval
                    continue
                written, read = last_write.get(slot), last_read.get(slot)
                stale = refilled and written is not None and read is not None and written < read < interval
                if written is None or stale:
                    index = tuple(int(i) for i in np.unravel_index(element, target.shape))
                    return SharedRead(name, index, block, thread, site[0], site[1], written is None)
                last_read[slot] = interval
        return None

    def unwritten_read(self):
        """The first read of a shared slot that no thread of its block had written, or None."""
        return self._shared_reads(refilled=False)

    def stale_read(self):
        """In a kernel whose every step refills its tiles: the first read of a slot that no thread
        wrote in that step (an unwritten slot, or one last written before an earlier step read
        it), or None. Not for kernels that load a tile once and read it over many steps."""
        return self._shared_reads(refilled=True)
