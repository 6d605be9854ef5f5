"""The limits an exercise's kernel must meet besides right values, each measured and named when broken.

An exercise states its limits in its text and declares them in ``Exercise.limits``; once a case's
values are right, the judge measures each on that case's traced launches (``measure.trace``) or on
what the GPU compiler made of the answer (``measure.compiler``), and the first one broken is the
verdict, with what was measured and the limit beside it:

- ``MostLoads(array, most)``: every element of a global array read at most `most` times (reuse
  through shared memory or registers); ``no_reuse``.
- ``Coalesced(array, most, access)``: at every load (or store) site of the array, a warp's access
  touches at most `most` 128-byte segments on average (neighbouring threads, neighbouring
  addresses); ``uncoalesced``.
- ``NoSerialCopy(array, access)``: every block moves the array with all its warps' lanes side by
  side, never an element an instruction in a few lanes' loop (which touches one segment at a time,
  so coalescing alone cannot see it); ``serial_copy``.
- ``MostAccessesPerThread(array, most, access)``: no thread loads (or stores) more than `most`
  elements of the array, the contract's share of one thread; ``serial_copy``.
- ``SharedLoadsPerThread(most)``: no thread reads shared memory more than `most` times (a tree
  reduction reads about 2 log2(n) slots a thread, a serial loop in one thread about n);
  ``serial_reduction``.
- ``NoSharedAtomics(why)``: no thread makes an atomic operation on a shared array (a block's atomics
  on one slot take turns: a serial reduction the race finder lets through); ``serial_reduction``.
- ``MostWarpCollectives(most, why)``: no lane joins more than `most` warp collectives (shuffles,
  votes, syncwarps): a merge in rounds, not one lane taking the others in one by one;
  ``serial_reduction``.
- ``MostBarriers(most, why)``: no thread passes more than `most` barriers (a tiled loop's steps, each
  with its two barriers; a step more makes the whole block wait once more); ``extra_barriers``.
- ``MostBarriersPerBlock(most, why)``: no thread passes more barriers than `most(case, block)`, its
  own block's limit (the steps over the tiles that block's rows see, not the launch's busiest
  block's); ``extra_barriers``.
- ``NoUnwrittenReads(why)``: no thread reads a shared slot its block never wrote, even where the
  values come out right (``stale_tile``).
- ``RefilledTiles()``: every step of a tiled loop writes every slot of its tiles that it reads
  (``stale_tile``).
- ``SharedBanks(reads, stores, arrays)``: a warp's read of a shared array puts at most `reads`
  different words in one bank, its store at most `stores`; ``bank_conflict``.
- ``StoredOnce(array)``: no thread stores an element of a global array twice (a result summed in
  main memory instead of a register); ``output_rewritten``.
- ``NoLocalMemory()``: ptxas reports a stack frame of 0 bytes (no local memory); ``local_memory``.

A limit's ``broken(traces, case, compiled)`` returns None when it holds, else its message, or a
``(code, message)`` pair when one limit tells several mistakes apart; it changes nothing.
`most` is a number or a function of the case (and of the configuration's constants, which are
in place while it is called). ``float32`` arithmetic and compiling at all are not limits an
exercise declares: the judge checks them for every answer that runs on a GPU.
"""

from dataclasses import dataclass
from typing import Callable, Union

from attention_lib.measure import sanitizer
from attention_lib.platform import where


def _value(most, case):
    return most(case) if callable(most) else most


def _traces_with(traces, array):
    return [t for t in traces if array in t.arrays()]


@dataclass
class MostLoads:
    """Every element of global array `array` read at most `most` times."""

    array: str
    most: Union[int, Callable]
    why: str = "copy it into shared memory (or a register) once and reuse it from there"
    code: str = "no_reuse"

    def broken(self, traces, case, compiled):
        limit = _value(self.most, case)
        reads = max((int(t.loads(self.array).max(initial=0)) for t in _traces_with(traces, self.array)), default=0)
        if reads > limit:
            return (f"the values are right, but an element of {self.array} was read up to {reads} times from "
                    f"global memory, where the limit is {limit}: {self.why}")
        return None


def _kind(access):
    return {"load": sanitizer.LOAD, "store": sanitizer.STORE}[access]


@dataclass
class Coalesced:
    """A warp's load (access="store": store) of `array` touches at most `most` 128-byte segments, at
    every site."""

    array: str
    most: Union[float, Callable] = 2
    code: str = "uncoalesced"
    access: str = "load"
    why: str = "neighbouring threads of a warp (consecutive threadIdx.x) should {verb} neighbouring addresses"

    def broken(self, traces, case, compiled):
        limit = _value(self.most, case)
        for traced in _traces_with(traces, self.array):
            segments, filename, line = traced.worst_warp_load(self.array, kind=_kind(self.access))
            if segments > limit:
                verb = "read" if self.access == "load" else "write"
                return (f"the values are right, but a warp's {self.access} of {self.array} at "
                        f"{where.describe_with_code(filename, line)} touched {segments:.1f} segments of 128 "
                        f"bytes on average, where the limit is {limit:g}: {self.why.format(verb=verb)}")
        return None


@dataclass
class NoSerialCopy:
    """Every block loads (access="store": stores) `array` with all its warps' lanes side by side: no warp
    takes more than twice its share of the block's accesses, 32 lanes side by side in every warp."""

    array: str
    access: str = "load"
    code: str = "serial_copy"

    def broken(self, traces, case, compiled):
        for traced in _traces_with(traces, self.array):
            serial = traced.serial_warp(self.array, kind=_kind(self.access))
            if serial is None:
                continue
            instructions, share, filename, line = serial
            if instructions > 2 * share:
                verb = "load" if self.access == "load" else "store"
                return (f"the values are right, but one warp made {instructions} {verb} instructions of "
                        f"{self.array} (at {where.describe_with_code(filename, line)}), where its block's "
                        f"{verb}s spread over all its warps, 32 lanes side by side, take {share} a warp: a few "
                        "lanes copy in a loop while the others wait. Give every thread its own elements")
        return None


@dataclass
class MostAccessesPerThread:
    """No thread loads (access="store": stores) more than `most` elements of `array`: the contract's share
    of one thread (a row, an element), where a warp's lanes may legitimately stand idle."""

    array: str
    most: Union[int, Callable]
    access: str = "load"
    code: str = "serial_copy"
    why: str = "give every thread its own share, as the contract says"

    def broken(self, traces, case, compiled):
        limit = _value(self.most, case)
        for traced in _traces_with(traces, self.array):
            made, block, thread = traced.most_accesses_by_a_thread(self.array, kind=_kind(self.access))
            if made > limit:
                verb = "loads" if self.access == "load" else "stores"
                return (f"the values are right, but thread {thread} of block {block} made {made} {verb} of "
                        f"{self.array}, where the limit is {limit}: {self.why}")
        return None


@dataclass
class SharedLoadsPerThread:
    """No thread reads shared memory more than `most` times."""

    most: Union[int, Callable]
    code: str = "serial_reduction"
    why: str = "split the work over the threads, round after round, instead of leaving it to a few"

    def broken(self, traces, case, compiled):
        limit = _value(self.most, case)
        reads = max((t.shared_loads_per_thread() for t in traces), default=0)
        if reads > limit:
            return (f"the values are right, but one thread read shared memory {reads} times, where the limit "
                    f"is {limit}: {self.why}")
        return None


@dataclass
class NoSharedAtomics:
    """No thread makes an atomic operation on a shared array; `why` (a text, or a function of the case)
    says what a tree does instead."""

    why: Union[str, Callable] = ""
    code: str = "serial_reduction"

    def broken(self, traces, case, compiled):
        for traced in traces:
            for name in traced.arrays(sanitizer.SHARED):
                made, block, thread = traced.most_accesses_by_a_thread(name, kind=sanitizer.ATOMIC)
                if made:
                    why = _value(self.why, case)
                    return (f"the values are right, but thread {thread} of block {block} made {made} atomic "
                            f"operation{'s' if made > 1 else ''} on {name}, where the limit is 0"
                            f"{': ' + why if why else ''}")
        return None


@dataclass
class MostWarpCollectives:
    """No lane joins more than `most` warp collectives (shuffles, votes, syncwarps)."""

    most: Union[int, Callable]
    why: Union[str, Callable] = ""
    code: str = "serial_reduction"

    def broken(self, traces, case, compiled):
        limit = _value(self.most, case)
        joined = max((t.launch.warp_collectives for t in traces), default=0)
        if joined > limit:
            why = _value(self.why, case)
            return (f"the values are right, but a lane joined {joined} warp collectives (shuffles and syncwarps), "
                    f"where the limit is {limit}{': ' + why if why else ''}")
        return None


@dataclass
class MostBarriers:
    """No thread passes more than `most` barriers; `why` (a text, or a function of the case giving one)
    says what the limit counts."""

    most: Union[int, Callable]
    why: Union[str, Callable] = ""
    code: str = "extra_barriers"

    def broken(self, traces, case, compiled):
        limit = _value(self.most, case)
        passed = max((t.barriers for t in traces), default=0)
        if passed > limit:
            why = _value(self.why, case)
            return (f"the values are right, but a thread passed {passed} barriers, where the limit is {limit}"
                    f"{': ' + why if why else ''}")
        return None


@dataclass
class MostBarriersPerBlock:
    """No thread passes more than `most(case, block)` barriers, `block` its blockIdx (x, y, z); `why`
    (a text, or a function of the case) says what the limit counts."""

    most: Callable
    why: Union[str, Callable] = ""
    code: str = "extra_barriers"

    def broken(self, traces, case, compiled):
        for traced in traces:
            for block, passed in sorted(traced.barriers_by_block.items()):
                limit = self.most(case, block)
                if passed > limit:
                    why = _value(self.why, case)
                    return (f"the values are right, but a thread of block {block} passed {passed} barriers, where "
                            f"that block's limit is {limit}{': ' + why if why else ''}")
        return None


@dataclass
class NoUnwrittenReads:
    """No thread reads a shared slot that no thread of its block wrote, even where the values come out
    right (a read whose garbage the arithmetic happened to discard)."""

    why: str = "read only the slots your block wrote"
    code: str = "stale_tile"

    def broken(self, traces, case, compiled):
        for traced in traces:
            read = traced.unwritten_read()
            if read is not None:
                return f"the values are right, but {read}: on a GPU that slot holds whatever the memory held; {self.why}"
        return None


@dataclass
class RefilledTiles:
    """Every step writes every slot it reads of its shared tiles."""

    code: str = "stale_tile"

    def broken(self, traces, case, compiled):
        for traced in traces:
            stale = traced.stale_read()
            if stale is not None:
                return (f"{stale}: it holds an old number (on a GPU, at the first step, whatever the memory "
                        "held). Every step must write every slot of its tiles that it reads, a 0 where the "
                        "element lies past an edge")
        return None


@dataclass
class SharedBanks:
    """A warp's read of a shared array puts at most `reads` different 4-byte words in one bank (word
    mod 32), its store at most `stores`: n words of one bank take n rounds. `arrays`: the shared arrays
    counted, each with the accesses counted ("load", "store"); all of them, both ways, by default."""

    reads: int = 1
    stores: int = 2
    arrays: tuple = ()
    why: str = "choose the tile's layout so that the words a warp touches at once fall in different banks"
    code: str = "bank_conflict"

    def _counted(self, traced):
        if self.arrays:
            return [(name, access) for name, accesses in self.arrays for access in accesses
                    if name in traced.arrays(sanitizer.SHARED)]
        return [(name, access) for name in traced.arrays(sanitizer.SHARED) for access in ("load", "store")]

    def broken(self, traces, case, compiled):
        for traced in traces:
            for name, access in self._counted(traced):
                limit = self.reads if access == "load" else self.stores
                ways, filename, line = traced.worst_bank_ways(name, kind=_kind(access))
                if ways > limit:
                    verb = "read" if access == "load" else "store"
                    return (f"the values are right, but a warp's {verb} of {name} at "
                            f"{where.describe_with_code(filename, line)} puts {ways} different words in one bank "
                            f"of shared memory ({ways} rounds instead of 1), where the limit is {limit}: {self.why}")
        return None


@dataclass
class StoredOnce:
    """No thread stores an element of global array `array` more than once: a result is summed in a
    register and stored when it is done, never summed in main memory."""

    array: str
    why: str = "add up each result in a register and store it once, when its sum is done"
    code: str = "output_rewritten"

    def broken(self, traces, case, compiled):
        for traced in _traces_with(traces, self.array):
            again = traced.stored_twice(self.array)
            if again is not None:
                (block, thread), index, times, stores, filename, line = again
                return (f"the values are right, but thread {thread} of block {block} stored {self.array}[{index}] "
                        f"{times} times, the second at {where.describe_with_code(filename, line)} ({stores} stores "
                        f"of {self.array} in all by that thread; each element once): {self.why}")
        return None


@dataclass
class NoLocalMemory:
    """ptxas gives the kernel a stack frame of 0 bytes."""

    code: str = "local_memory"
    compiled_limit = True

    def broken(self, traces, case, compiled):
        if compiled is None or compiled.stack_bytes is None or compiled.stack_bytes == 0:
            return None
        return (f"the values are right, but ptxas gives the kernel a {compiled.stack_bytes}-byte stack frame "
                f"({compiled.registers} registers): an array it indexes with a number known only at run time "
                "lives in local memory (device DRAM)")
