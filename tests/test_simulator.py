"""The simulator as the library teaches it: warp primitives with CUDA's semantics, barrier checking
(compute-sanitizer's synccheck), and the GPU-only options one kernel source uses on both backends.

Every kernel here is compiled for sm_75 and sm_90 by the compile check too (tests/test_compile.py
compiles the library's; these use only primitives that numba-cuda compiles)."""

import attention_lib
import numpy as np
import pytest
from attention_lib.measure import sanitizer
from attention_lib.platform.simulator import BarrierError
from numba import cuda, float32, int32

pytestmark = pytest.mark.skipif(not attention_lib.ON_SIMULATOR, reason="the simulator's own behaviour")
FULL = 0xFFFFFFFF


@cuda.jit
def butterfly_sum(x, out):
    i = cuda.grid(1)
    y = x[i]
    for w in (16, 8, 4, 2, 1):
        y += cuda.shfl_xor_sync(FULL, y, w)
    out[i] = y


@cuda.jit
def shifts(x, out):
    i = cuda.grid(1)
    out[0, i] = cuda.shfl_down_sync(FULL, x[i], 3)
    out[1, i] = cuda.shfl_up_sync(FULL, x[i], 3)
    out[2, i] = cuda.shfl_sync(FULL, x[i], 37)        # lane 37 is lane 5: an index wraps in the warp
    out[3, i] = cuda.shfl_xor_sync(FULL, x[i], 33)    # only the lane mask's low five bits count


def test_shuffles_read_the_lane_ptx_names():
    x = np.arange(64, dtype=np.float32) * 1.5 + 0.25
    sums = np.zeros(64, np.float32)
    butterfly_sum[1, 64](x, sums)
    assert np.array_equal(sums, np.repeat([x[:32].sum(), x[32:].sum()], 32))     # per warp
    out = np.zeros((4, 64), np.float32)
    shifts[2, 32](x, out)
    lane = np.arange(64) % 32
    base = np.arange(64) - lane
    assert np.array_equal(out[0], x[np.where(lane + 3 < 32, np.arange(64) + 3, np.arange(64))])
    assert np.array_equal(out[1], x[np.where(lane >= 3, np.arange(64) - 3, np.arange(64))])
    assert np.array_equal(out[2], x[base + 5])
    assert np.array_equal(out[3], x[base + (lane ^ 1)])


@cuda.jit
def votes(x, out):
    i = cuda.grid(1)
    p = x[i] > 0
    out[0, i] = cuda.ballot_sync(FULL, p)
    out[1, i] = cuda.any_sync(FULL, p)
    out[2, i] = cuda.all_sync(FULL, p)
    out[3, i] = cuda.eq_sync(FULL, p)
    out[4, i] = cuda.match_any_sync(FULL, int32(x[i]))
    out[5, i] = cuda.lanemask_lt()


def test_votes_and_matches_combine_the_lanes_of_the_mask():
    x = np.where(np.arange(32) % 3 == 0, 1.0, -1.0).astype(np.float32)
    out = np.zeros((6, 32), np.int64)
    votes[1, 32](x, out)
    positive = sum(1 << lane for lane in range(32) if x[lane] > 0)
    assert (out[0] == positive).all() and (out[1] == 1).all() and (out[2] == 0).all() and (out[3] == 0).all()
    negative = (1 << 32) - 1 - positive
    assert (out[4] == np.where(x > 0, positive, negative)).all()
    assert (out[5] == (1 << np.arange(32)) - 1).all()


@cuda.jit
def active_in_branch(out):
    lane = cuda.threadIdx.x
    if lane % 4 == 1:
        out[lane] = cuda.activemask()       # the lanes that reach it together: this branch's
    else:
        out[lane] = -1


def test_activemask_gives_the_lanes_that_reach_it_together():
    out = np.zeros(32, np.int64)
    active_in_branch[1, 32](out)
    expected = sum(1 << lane for lane in range(1, 32, 4))
    assert (out[1::4] == expected).all() and (out[0::4] == -1).all()


@cuda.jit
def neighbours(x, out, sync):
    """Each lane writes its value to shared memory, then reads its neighbour's."""
    tile = cuda.shared.array(32, float32)
    lane = cuda.threadIdx.x
    tile[lane] = x[lane]
    if sync:
        cuda.syncwarp()                      # the warp's lanes meet: the writes are done
    out[lane] = tile[(lane + 1) % 32]


def test_syncwarp_orders_the_lanes_of_a_warp_for_the_race_finder():
    x = np.arange(32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    assert sanitizer.find_races(neighbours, 1, 32, x, out, True) == []
    assert np.array_equal(out, np.roll(x, -1))
    races = sanitizer.find_races(neighbours, 1, 32, x, out, False)
    assert [r.array for r in races] == ["tile"] and races[0].space == "shared"


@cuda.jit
def half_warp_then_barrier(x, out):
    lane = cuda.threadIdx.x
    y = x[lane]
    if lane < 16:
        y += cuda.shfl_xor_sync(FULL, y, 1)      # names all 32 lanes; only 16 come
    cuda.syncthreads()
    out[lane] = y


@cuda.jit
def leaves_itself_out(x, out):
    lane = cuda.threadIdx.x
    out[lane] = cuda.shfl_xor_sync(0x0000FFFF, x[lane], 1)


@cuda.jit
def reads_a_returned_lane(x, out):
    lane = cuda.threadIdx.x
    if lane >= 30:
        return
    out[lane] = cuda.shfl_down_sync(FULL, x[lane], 1)     # lane 29 reads lane 30, gone


@cuda.jit
def past_the_block(x, out):
    i = cuda.threadIdx.x
    out[i] = cuda.shfl_xor_sync(FULL, x[i], 16)           # warp 1 of a 48-thread block has 16 lanes


@pytest.mark.parametrize("kernel, threads, message", [
    (half_warp_then_barrier, 32,
     r"shfl_xor_sync at test_simulator.py:\d+ \(mask 0xffffffff, block \(0, 0, 0\), warp 0\): lanes 0-15 wait "
     r"for lanes 16-31, which wait at the barrier at test_simulator.py:\d+"),
    (leaves_itself_out, 32, r"shfl_xor_sync by lane 16 of warp 0 with mask 0x0000ffff, which leaves the calling lane out"),
    (reads_a_returned_lane, 32, r"lane 29 of warp 0 reads lane 30, which has returned: the value is undefined"),
    (past_the_block, 48, r"lane 0 of warp 1 reads lane 16, which does not exist"),
], ids=["divergent-shuffle", "mask-without-itself", "returned-lane", "missing-lane"])
def test_a_warp_primitive_its_lanes_do_not_all_meet_is_reported(kernel, threads, message):
    x, out = np.ones(threads, np.float32), np.zeros(threads, np.float32)
    with pytest.raises(BarrierError, match=message):
        kernel[1, threads](x, out)
    with pytest.raises(BarrierError, match=message):       # and by the sanitizer, in every mode
        sanitizer.find_races(kernel, 1, threads, x, out)


@cuda.jit
def tree_sum_with_barrier_in_branch(x, out):
    """The classic mistake: the tree's barrier inside `if tid < stride`."""
    partial = cuda.shared.array(32, float32)
    tid = cuda.threadIdx.x
    partial[tid] = x[tid]
    cuda.syncthreads()
    stride = 16
    while stride > 0:
        if tid < stride:
            partial[tid] += partial[tid + stride]
            cuda.syncthreads()
        stride //= 2
    if tid == 0:
        out[0] = partial[0]


@cuda.jit
def returns_before_the_barrier(x, out):
    i = cuda.threadIdx.x
    if i >= 20:
        return
    tile = cuda.shared.array(32, float32)
    tile[i] = x[i]
    cuda.syncthreads()
    out[i] = tile[19 - i]


@cuda.jit
def two_barriers(x, out):
    i = cuda.threadIdx.x
    if i % 2 == 0:
        cuda.syncthreads()
    else:
        cuda.syncthreads()
    out[i] = x[i]


@pytest.mark.parametrize("kernel, message", [
    (tree_sum_with_barrier_in_branch,
     r"block \(0, 0, 0\): 16 threads, \(16, 0, 0\) to \(31, 0, 0\) returned while 16 threads, \(0, 0, 0\) to "
     r"\(15, 0, 0\) wait at the barrier at test_simulator.py:\d+: a syncthreads\(\) that not every thread"),
    (returns_before_the_barrier, r"12 threads, \(20, 0, 0\) to \(31, 0, 0\) returned while 20 threads"),
    (two_barriers, r"16 threads, \(0, 0, 0\) to \(30, 0, 0\) wait at the barrier at test_simulator.py:(\d+), "
                   r"16 threads, \(1, 0, 0\) to \(31, 0, 0\) at test_simulator.py:(?!\1)\d+: different syncthreads"),
], ids=["barrier-in-tree-branch", "return-before-barrier", "two-barrier-calls"])
def test_a_barrier_not_every_thread_reaches_is_reported(kernel, message):
    x, out = np.ones(32, np.float32), np.zeros(32, np.float32)
    with pytest.raises(BarrierError, match=message):
        kernel[1, 32](x, out)


@cuda.jit(launch_bounds=(64, 2))
def bounded_copy(x, out):
    tile = cuda.shared.array(64, float32, alignment=16)
    i = cuda.threadIdx.x
    tile[i] = x[i]
    out[i] = tile[i]


def test_the_gpus_launch_bounds_and_alignment_are_accepted_and_held():
    x, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    bounded_copy[1, 64](x, out)
    assert np.array_equal(out, x)
    with pytest.raises(ValueError, match=r"a block of 128 threads, more than its launch_bounds allow \(64\)"):
        bounded_copy[1, 128](np.zeros(128, np.float32), np.zeros(128, np.float32))
