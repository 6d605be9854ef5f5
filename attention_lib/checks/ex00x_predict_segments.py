"""``00x_predict_segments`` (deep dive 00x): a function ``(stride)`` giving the pair (segments, sectors)
of 128-byte segments and 32-byte sectors one warp's load moves when lane l reads float32 element
stride * l, predicted before the sanitizer counts them (the library's
``basics.warp_load_footprint``). Its cases and named mistakes are declared in the Exercise below.
"""

import numpy as np

from attention_lib.stages import basics
from attention_lib.stages.basics import WARP_SIZE
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.result import Diagnosed


def _footprints(stride, segment, sector):
    """(segments, sectors) of lane l reading element l * stride, with segments and sectors of the
    given sizes in the same unit as the addresses."""
    addresses = np.arange(WARP_SIZE) * stride
    return len(set(addresses // segment)), len(set(addresses // sector))


def _span(stride):
    """Every segment and sector from the first address to the last, touched or not."""
    last = (WARP_SIZE - 1) * stride * basics.FLOAT32_BYTES
    return last // basics.SEGMENT_BYTES + 1, last // basics.SECTOR_BYTES + 1


def _run_footprint(warp_load_footprint, stride, rng, launch):
    got = warp_load_footprint(stride)
    expected = basics.warp_load_footprint(stride)
    try:
        got = tuple(int(g) if float(g).is_integer() else float(g) for g in got)
    except (TypeError, ValueError):
        raise Diagnosed("wrong_shape", f"the answer is {got!r}, expected a pair (segments, sectors)")
    if len(got) == 2 and got != expected:
        in_elements = _footprints(stride, basics.SEGMENT_BYTES, basics.SECTOR_BYTES)
        if got == expected[::-1]:
            raise Diagnosed("pair_swapped", (
                f"the answer is {got}, expected {expected}: the pair is (segments, sectors), and a 128-byte "
                "segment holds four 32-byte sectors, so sectors are never fewer"))
        if got == in_elements:
            raise Diagnosed("elements_not_bytes", (
                f"the answer is {got}, expected {expected}: segments and sectors are counted in bytes, and "
                "a float32 takes 4 of them (a segment holds 32 float32, a sector 8)"))
        if got == _span(stride):
            raise Diagnosed("span_counted", (
                f"the answer is {got}, expected {expected}: it counts every segment from the first address "
                "to the last, but only those a lane reads are moved (32 lanes touch at most 32)"))
        raise Diagnosed("wrong_values", f"the answer (segments, sectors) is {got}, expected {expected}")
    return np.asarray(got, np.float64), np.asarray(expected, np.float64)


register(Exercise(
    exercise_id="00x_predict_segments",
    kind="function",
    run=_run_footprint,
    # Neighbours; one number for all (a broadcast); 2, 3, 8: a few lanes a sector or a segment;
    # 16, 31, 32, 33: about one segment a lane; 64, 100: lanes far apart.
    cases=[1, 0, 2, 3, 8, 16, 31, 32, 33, 64, 100],
    describe_case=lambda s: f"stride {s} (lane l reads float32 element {s} * l)",
    hint=("write down the byte address each of the 32 lanes reads, and see which 128-byte segment and "
          "which 32-byte sector it falls in: the warp's load moves each one touched, once"),
    more_hints=("where answers go wrong: addresses are in bytes (a float32 takes 4), several lanes that "
                "fall in one segment share it, and segments between the lanes that no lane reads are not "
                "moved",),
    rtol=0.0,
    atol=0.0,
    diagnoses=("pair_swapped", "elements_not_bytes", "span_counted"),
    solution=basics.warp_load_footprint,
))
