"""``06_split_heads`` (notebook 06, warm-up): a kernel with split_heads_kernel's signature ``(x, out)``
that copies x (B, T, n_head * d_k) into out (B, n_head, T, d_k), out[b, h, t, c] = x[b, t, h * d_k + c],
one thread an element on the library's grid (``multihead.head_grid``: x along c, y along t, z along
b * n_head + h). Its solution is ``multihead.split_heads_kernel``; its cases, limits and named mistakes
are declared in the Exercise below.
"""

import re
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks import cases as sizes
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, plain_launch, read_output
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostLoads, NoSerialCopy
from attention_lib.platform.runtime import ANDREA_120M, ANDREA_SIMULATOR
from attention_lib.stages import multihead

# The head widths a student sees printed, ANDREA-sim's 16 and ANDREA-120M's 64: the numbers a head width
# written into the kernel takes (the probe of _written_width launches the answer at each).
MODEL_HEAD_WIDTHS = tuple(sorted({ANDREA_SIMULATOR.d_k, ANDREA_120M.d_k}))


class Case(NamedTuple):
    """One size tried: x (B, T, n_head * d_k) split into n_head heads of width d_k."""

    B: int
    T: int
    n_head: int
    d_k: int

    def __str__(self):
        return f"(B {self.B}, T {self.T}, n_head {self.n_head}, d_k {self.d_k})"


def guarded_input(array, guard):
    """A device copy of `array` followed by `guard` zeros, and the view of its first array.size
    entries: an unguarded read just past the end stays inside the allocation on a GPU."""
    full = cuda.to_device(np.concatenate([array.ravel(), np.zeros(guard, np.float32)]))
    return full[:array.size].reshape(array.shape)


_OUT_OF_BOUNDS = re.compile(r"out-of-bounds (read|write) (\w+)\[([-\d, ]*)\].*?block \((\d+), (\d+), (\d+)\) "
                            r"thread \((\d+), (\d+), (\d+)\)")


def _out_of_bounds(error):
    """(kind, array, index, block, thread) of the sanitizer's out-of-bounds message, or None."""
    found = _OUT_OF_BOUNDS.search(str(error))
    if found is None:
        return None
    numbers = [tuple(int(x) for x in found.group(3).split(",") if x.strip())]
    numbers += [tuple(int(found.group(g)) for g in group) for group in ((4, 5, 6), (7, 8, 9))]
    return (found.group(1), found.group(2), *numbers)


def _other_axes(B, T, n_head, d_k):
    """(length, what) of the axes of x and out other than d_k: where a head width read from the wrong
    axis comes from."""
    axes = [(T, "T, the length of out's position axis"), (n_head, "n_head, the length of out's head axis"),
            (B, "B, the length of the batch axis"), (n_head * d_k, "d_model, the length of x's last axis")]
    return [(length, what) for length, what in axes if length != d_k]


def _head_width_message(h, width, what, d_k):
    return (f"it took head {h}'s columns of x from column {h} * {width} = {h * width} on, a head width of {width}: "
            f"{what}. A head is d_k = {d_k} columns wide, the length of out's last axis")


def _number_message(width, d_k, what=None):
    """The verdict's words for a head width written as the number `width` at head width d_k."""
    model = ANDREA_SIMULATOR.name if width == ANDREA_SIMULATOR.d_k else ANDREA_120M.name
    return (f"{what or f'a head width of {width} written as a number'}. A head is d_k = out.shape[3] columns wide: "
            f"{d_k} in this case, {width} only at {model}'s size. Read d_k from out's shape, in the column of x "
            "and in the guard")


def _width_named(width, B, T, n_head, d_k):
    """(code, what) for a head width that is not d_k: wrong_head_width when it is another axis's length,
    head_width_written_as_number otherwise."""
    what = next((what for length, what in _other_axes(B, T, n_head, d_k) if length == width), None)
    return ("wrong_head_width", what) if what is not None else ("head_width_written_as_number", None)


def _layer_out_of_range(error, case):
    """Diagnosed when the out-of-bounds access came from a thread whose own position (grid x, grid y)
    lies inside the output: wrong_head_width when it read x in its own sequence and row at the column
    h * w + c of a head width w that is another axis's length (d_k read from the wrong axis),
    head_width_written_as_number when w is a model's head width (16 or 64) that is no axis's length,
    else grid_layer_order (only what it decoded from the grid layer z can have left the array). None
    otherwise (a missing guard, or a guard on a number: the engine's, or _written_width's)."""
    parsed = _out_of_bounds(error)
    if parsed is None:
        return None
    kind, array, index, block, thread = parsed
    B, T, n_head, d_k = case
    x, y = block[0] * 16 + thread[0], block[1] * 16 + thread[1]
    if not (x < d_k and y < T):
        return None
    b, h = divmod(block[2], n_head)
    if kind == "read" and array == "x" and len(index) == 3 and index[:2] == (b, y) and h > 0:
        thread = (f"the thread at grid x {x}, y {y} of grid layer z {block[2]} (sequence {b}, head {h}) read "
                  f"x{list(index)}, past x's {n_head * d_k} columns: ")
        for width, what in _other_axes(B, T, n_head, d_k):
            if index[2] == h * width + x:
                return Diagnosed("wrong_head_width", thread + _head_width_message(h, width, what, d_k))
        for width in MODEL_HEAD_WIDTHS:
            if index[2] == h * width + x:
                return Diagnosed("head_width_written_as_number", (
                    thread + f"head {h}'s columns started at {h} * {width} = {h * width}, "
                    + _number_message(width, d_k)))
    return Diagnosed("grid_layer_order", (
        f"the thread at grid x {x}, y {y} of grid layer z {block[2]} lies inside the output, yet it "
        f"{'read' if kind == 'read' else 'wrote'} {array}{list(index)}, outside {array}: the sequence or the head "
        "it decoded from z is out of range; the launch numbers the layers z = b * n_head + h, b < B, h < n_head"))


def _split_once(kernel, case, rng, launch, **options):
    """(got, expected, x) of one launch at `case`, on x and out with guard zones behind them."""
    B, T, n_head, d_k = case
    d_model = n_head * d_k
    x = rng.standard_normal((B, T, d_model)).astype(np.float32)
    tx, ty = multihead.BLOCK
    # Guard zones behind the input and the output: an unguarded thread of the last block reaches
    # fewer than ty rows (of d_model in x, of d_k in out) plus tx columns past the end. On a GPU
    # the reads stay inside the allocation and the writes are caught; on the simulator the index
    # is caught first.
    d_x = guarded_input(x, ty * (d_model + 1) + tx)               # (B, T, d_model)
    full, out = output_array((B, n_head, T, d_k), guard=ty * (d_k + 1) + tx)
    grid, block = multihead.head_grid(B * n_head, T, d_k)
    launch(kernel, grid, block, d_x, out, **options)
    return read_output(full, out), reference.split_heads(x, n_head), x


def _written_width(kernel, case):
    """Diagnosed head_width_written_as_number when the answer, which went out of bounds or raised at
    `case`, copies every value right at a head width of the models' (16 or 64; T 7 and 2 heads, so that
    both the guard and the second head's columns count): a head width written as a number fits that d_k
    only. None otherwise."""
    if case.d_k in MODEL_HEAD_WIDTHS:
        return None
    for width in MODEL_HEAD_WIDTHS:
        try:
            got, expected, _ = _split_once(kernel, Case(1, 7, 2, width), np.random.default_rng(width),
                                           plain_launch, compile=False)
        except Exception:  # the probe's own failure: no evidence either way
            continue
        if np.array_equal(got, expected):
            return Diagnosed("head_width_written_as_number", (
                f"a thread went out of bounds or raised here, yet at d_k {width} (T 7, 2 heads) every value is "
                "right: " + _number_message(width, case.d_k, (
                    f"the number {width} stands where d_k belongs, in the guard or in the column of x (or a size "
                    f"that is {width} there only, such as the block's width)"))))
    return None


def _run_split(kernel, case, rng, launch):
    # Which layer copies which (sequence, head) does not matter: out is indexed by both, so any
    # one-to-one reading of z is right; only a reading that leaves the arrays is named.
    try:
        got, expected, x = _split_once(kernel, case, rng, launch)
    except IndexError as error:
        raise _layer_out_of_range(error, case) or _written_width(kernel, case) or error from None
    except ZeroDivisionError as error:          # e.g. n_head computed as d_model // 16 at d_k 1
        raise _written_width(kernel, case) or error from None
    return got, expected, x, case.n_head


def _diagnose_split(got, expected, x, n_head):
    """Name the interleaved split, a head width read from another axis, and one written as a model's
    number (what a GPU, which checks no index, gives: _read_flat); None for any other mistake (the
    engine shows where)."""
    B, T, d_model = x.shape
    d_k = d_model // n_head
    interleaved = x.reshape(B, T, d_k, n_head).transpose(0, 3, 1, 2)   # head h: columns h, h + n_head, ...
    if np.array_equal(got, interleaved):
        return "heads_interleaved", (
            f"head h got columns h, h + {n_head}, h + {2 * n_head}, ... (every n_head-th column); "
            f"a head is a contiguous block: head h holds the h-th run of d_k = {d_k} columns "
            "(the model axis is (n_head, d_k), not (d_k, n_head))")
    for width, what in _other_axes(B, T, n_head, d_k):
        columns = np.arange(n_head)[:, None] * width + np.arange(d_k)       # head h's columns at that width
        if n_head > 1 and columns.max() < d_model and np.array_equal(got, x[:, :, columns].transpose(0, 2, 1, 3)):
            return "wrong_head_width", f"the heads' columns came out of place: {_head_width_message(1, width, what, d_k)}"
    for width in (*MODEL_HEAD_WIDTHS, *(length for length, _ in _other_axes(B, T, n_head, d_k))):
        if n_head > 1 and width != d_k and np.array_equal(got, _read_flat(x, n_head, width)):
            code, what = _width_named(width, B, T, n_head, d_k)
            if code == "wrong_head_width":
                return code, f"the heads' columns came out of place: {_head_width_message(1, width, what, d_k)}"
            return code, (f"head 1's columns of x started at column {width}, not {d_k}: "
                          + _number_message(width, d_k))
    return None


def _read_flat(x, n_head, width):
    """What a GPU's out holds when each thread reads x[b, t, h * width + c] unchecked: x's elements in
    memory order, the row's end crossed into the next row, zeros past x (guarded_input's guard zone)."""
    B, T, d_model = x.shape
    d_k = d_model // n_head
    flat = np.concatenate([x.ravel(), np.zeros(x.size + n_head * width + d_k, np.float32)])
    b, h, t, c = np.indices((B, n_head, T, d_k))
    return flat[(b * T + t) * d_model + h * width + c]


def _split_cases():
    """One element; then T and d_k around the 16 x 16 block (a partial block down and across, one
    exactly full, two across), several heads (an interleaved split differs), a batch of 2; last, the
    model's head width, 64, in a few positions."""
    tile = multihead.BLOCK[0]
    t_short, t_full, t_over = sizes.around(tile)
    return [Case(1, 1, 1, 1), Case(1, 7, 3, 5), Case(2, t_over, 4, 6), Case(1, t_full, 2, t_over + 3),
            Case(2, t_short, 3, t_full), Case(1, 3, 2, 64)]


register(Exercise(
    exercise_id="06_split_heads",
    kind="kernel",
    run=_run_split,
    cases=_split_cases(),
    hint=("one thread per output element: the grid's x and y cover a head's components and positions, its "
          "z axis every (sequence, head) pair; head h owns the h-th run of d_k consecutive columns of x"),
    more_hints=("the plan: the thread's component and position come from the grid's x and y, its sequence and "
                "head from the layer number (a quotient and a remainder by the head count); its column of x "
                "is the head's first column plus its component; threads of the edge blocks that fall past "
                "the output do nothing. Where answers go wrong: a head's columns taken one every n_head (the "
                "wrong reshape order), a head width read from another axis of out than its last, and a layer split "
                "into a sequence and a head that leave their ranges",),
    rtol=0.0,   # a split moves values, it computes none: every entry must be exact
    atol=0.0,
    diagnose=_diagnose_split,
    diagnoses=("heads_interleaved", "grid_layer_order", "wrong_head_width", "head_width_written_as_number"),
    # Each element of x is copied once, and the 16 threads of a block row (half a warp) read 16
    # consecutive floats: a warp's load of two rows touches at most 4 segments of 128 bytes (each
    # row may straddle a boundary, as a head's columns start anywhere).
    limits=(MostLoads("x", 1, why="a copy reads each element once"), NoSerialCopy("x"),
            NoSerialCopy("out", access="store"), Coalesced("x", 4)),
    solution=multihead.split_heads_kernel,
    forbidden=(multihead.split_heads, multihead.launch_heads),
))
