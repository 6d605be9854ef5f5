"""Deep dive 10x's exercise, 10x_ideal_work: the solution passes, each usual mistake gets its name
(floats where the contract asks for counts among them); and what the deep dive builds on it: the work
formulas against the bench's, the launch counts and the lower bounds of the bench's entries."""

import re
from pathlib import Path

import nbformat
import numpy as np
import pytest

from attention_lib.checks import EXERCISES, check
from attention_lib.checks import mutation
from attention_lib.measure import bench, bench_cases, gpus
from attention_lib.stages import registers

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "10x_roofline.ipynb"


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 10x_ideal_work: the FLOPs and ideal bytes of three kernels ---------------------------------

def ideal_work(kernel, s):                                            # the solution
    if kernel == "softmax":
        scores = s.BH * s.T * s.T
        return 5 * scores, 4 * (scores + scores)
    if kernel == "flash":
        pairs = s.BH * s.T * (s.T + 1) // 2
        rows = s.BH * s.T * s.d_k
        return (4 * s.d_k + 5) * pairs, 4 * (4 * rows + s.BH * s.T)
    cached = s.BH * s.T * s.d_k
    return (4 * s.d_k + 5) * s.BH * s.T, 4 * (2 * cached + 2 * s.BH * s.d_k)


def changed(kernel_changed, flops=None, nbytes=None):
    """The solution with one kernel's FLOPs or bytes replaced by a function of the sizes."""
    def answer(kernel, s):
        right = ideal_work(kernel, s)
        if kernel != kernel_changed:
            return right
        return (right[0] if flops is None else flops(s), right[1] if nbytes is None else nbytes(s))
    return answer


WORK_MISTAKES = {
    "bytes_as_elements": (changed("softmax", nbytes=lambda s: 2 * s.BH * s.T * s.T), "each is 4 bytes"),
    "every_access_counted": (changed("softmax", nbytes=lambda s: 4 * 4 * s.BH * s.T * s.T),
                             "every load and store the kernel requests"),
    "arrays_missed": (changed("flash", nbytes=lambda s: 4 * 4 * s.BH * s.T * s.d_k), "leaves out lse, which the "
                      "kernel also writes"),
    "multiply_adds_not_flops": (changed("decode", flops=lambda s: (2 * s.d_k + 5) * s.BH * s.T),
                                "a multiply-add is 2 FLOPs"),
    "softmax_not_counted": (changed("flash", flops=lambda s: 4 * s.d_k * s.BH * s.T * (s.T + 1) // 2),
                            "the two products were counted, not the softmax"),
    "mask_ignored": (changed("flash", flops=lambda s: (4 * s.d_k + 5) * s.BH * s.T * s.T), "every (query, key) pair"),
    "diagonal_missed": (changed("flash", flops=lambda s: (4 * s.d_k + 5) * s.BH * s.T * (s.T - 1) // 2),
                        "query i sees key i too"),
    "visible_scores_only": (changed("softmax", flops=lambda s: 5 * s.BH * s.T * (s.T + 1) // 2),
                            "the masked ones too"),
    "wrong_values": (changed("decode", nbytes=lambda s: 4 * (2 * s.BH * s.T * s.d_k + 3 * s.BH * s.d_k)),
                     "the sanitizer counted 960 (elements: q 10 read, k_cache 110 read"),
    # H where B * H is meant, in the products only: right at B = 1, half at B = 2 (where it was taken for
    # a multiply-add counted as 1 FLOP)
    "batch_left_out": (changed("decode", flops=lambda s: 4 * s.d_k * s.H * s.T + 5 * s.BH * s.T),
                       "at (decode, B 2, H 1, T 16, d_k 3): the batch was left out: H = 1 heads counted where the "
                       "kernel runs B·H = 2"),
}


@pytest.mark.parametrize("answer, says", [
    # every count with H: the FLOPs, then (the FLOPs right) the bytes, once called arrays_missed
    (lambda kernel, s: ideal_work(kernel, bench_cases.BenchSizes(1, s.H, s.T, s.d_k)), "got 1,280 FLOPs"),
    (changed("flash", nbytes=lambda s: 4 * (4 * s.H * s.T * s.d_k + s.H * s.T)),
     "the batch was left out of q, k, v, out, lse"),
    (changed("decode", nbytes=lambda s: 4 * (2 * s.BH * s.T * s.d_k + 2 * s.H * s.d_k)), "left out of q, out"),
])
def test_the_batch_left_out_of_the_heads_is_named(answer, says):
    result = verdict("10x_ideal_work", answer)
    assert (result.passed, result.diagnosis) == (False, "batch_left_out") and says in result.message, result.message


def test_the_heads_written_as_b_times_h_pass():
    """A right answer in another style: B * H written out, the pairs and elements counted per head."""
    def answer(kernel, s):
        heads = s.B * s.H
        if kernel == "softmax":
            return heads * 5 * s.T * s.T, heads * 8 * s.T * s.T
        if kernel == "flash":
            return heads * (4 * s.d_k + 5) * (s.T * (s.T + 1) // 2), heads * 4 * (4 * s.T * s.d_k + s.T)
        return heads * (4 * s.d_k + 5) * s.T, heads * 4 * (2 * s.T * s.d_k + 2 * s.d_k)
    assert verdict("10x_ideal_work", answer).passed


def test_the_ideal_work_solution_passes():
    result = verdict("10x_ideal_work", ideal_work)
    assert result.passed and result.diagnosis == "ok", result
    assert verdict("10x_ideal_work", mutation.solution_copy(EXERCISES["10x_ideal_work"])).passed


@pytest.mark.parametrize("diagnosis", sorted(WORK_MISTAKES))
def test_ideal_work_mistakes_get_their_diagnosis(diagnosis):
    answer, says = WORK_MISTAKES[diagnosis]
    result = verdict("10x_ideal_work", answer)
    assert (result.passed, result.diagnosis) == (False, diagnosis) and says in result.message, result.message


def test_the_check_sizes_are_not_the_ones_the_notebook_runs_the_bench_at_above_the_exercise():
    """Deep dive 10x runs the bench at bench.notebook_sizes() and at sizes it names (BenchSizes(B=..,
    ...)) before 10x_ideal_work's check: the check's cases must be other sizes, so that no figure above
    the exercise can be copied into an answer."""
    from attention_lib.checks import ex10x_ideal_work
    code = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    above = "\n".join(code[:next(i for i, c in enumerate(code) if 'check("10x_ideal_work"' in c)])
    run = {tuple(int(n) for n in found) for found in
           re.findall(r"BenchSizes\(B=(\d+), H=(\d+), T=(\d+), d_k=(\d+)\)", above)}
    printed = bench.notebook_sizes()
    run.add((printed.B, printed.H, printed.T, printed.d_k))
    assert "notebook_sizes()" in above and len(run) >= 2
    assert not run & {(s.B, s.H, s.T, s.d_k) for s in ex10x_ideal_work.SIZES}


@pytest.mark.parametrize("kernel", ["softmax", "flash", "decode"])
def test_floats_are_refused_where_the_contract_asks_for_counts(kernel):
    """Right values, one of them a float (a / where // divides exactly, or a numpy float): refused."""
    as_float = changed(kernel, flops=lambda s: ideal_work(kernel, s)[0] / 1)
    result = verdict("10x_ideal_work", as_float)
    assert (result.passed, result.diagnosis) == (False, "counts_not_integers"), result.message
    assert "flops came back as" in result.message and "a float" in result.message, result.message
    numpy_bytes = changed(kernel, nbytes=lambda s: np.float64(ideal_work(kernel, s)[1]))
    assert verdict("10x_ideal_work", numpy_bytes).diagnosis == "counts_not_integers"
    numpy_ints = changed(kernel, flops=lambda s: np.int64(ideal_work(kernel, s)[0]))
    assert verdict("10x_ideal_work", numpy_ints).passed


def test_every_named_work_mistake_is_planted():
    assert set(EXERCISES["10x_ideal_work"].diagnoses) <= set(WORK_MISTAKES) | {"counts_not_integers"}


def test_a_wrong_return_is_said_in_one_line():
    result = verdict("10x_ideal_work", lambda kernel, s: ideal_work(kernel, s)[0])
    assert result.diagnosis == "raised_error" and "must return the tuple (flops, nbytes)" in result.message


def test_the_library_ideal_work_is_refused_as_given_code():
    assert verdict("10x_ideal_work", registers.ideal_work).diagnosis == "calls_given_code"


@pytest.mark.parametrize("sizes", [bench_cases.BenchSizes(8, 12, 1024, 64), bench_cases.BenchSizes(1, 2, 7, 5)])
def test_the_ideal_work_is_the_benchs_formulas(sizes):
    """The bench's FLOPs and ideal bytes, one rule for both (fused attention's bytes with its lse)."""
    entries = {e.name: e for e in bench_cases.REGISTRY}
    for kernel, entry in (("softmax", "softmax v1"), ("flash", "flash v2"), ("decode", "decode v1")):
        flops, nbytes = registers.ideal_work(kernel, sizes)
        assert (flops, nbytes) == (entries[entry].flops(sizes), entries[entry].ideal_bytes(sizes)), kernel
    with pytest.raises(ValueError, match="kernel must be 'softmax', 'flash' or 'decode', got 'scores'"):
        registers.ideal_work("scores", sizes)


# --- What the deep dive builds on them: the bench's lower bounds ----------------------------------

def test_the_predictions_at_andrea_120m():
    """Deep dive 10x's table: each kernel's bound from its own figures, its launches those a run
    records; the regimes the text names."""
    run = bench.run_bench(bench.BenchSizes(B=1, H=2, T=7, d_k=5), count=False, timed=False, write=False, verbose=False)
    rows = {r["name"]: r for r in bench.predictions(bench.formula_results(), run)}
    assert set(rows) == {k["name"] for k in run["kernels"]}
    h200, recorded = gpus.REFERENCE_GPU, {k["name"]: len(k["launches"]) for k in run["kernels"]}
    for r in rows.values():
        assert r["launches"] == recorded[r["name"]]
        assert r["ideal"] == bench.lower_bound(r["flops"], r["ideal_bytes"], r["launches"], h200)
        assert r["measured_s"] is None
    assert rows["projection v1"]["ideal"][1] == "compute" and rows["projection v1"]["counted"][1] == "memory"
    assert rows["projection v4"]["counted"][1] == "compute"                 # right of the ridge even uncached
    assert rows["softmax v2"]["ideal"][1] == "memory"
    assert rows["decode v1"]["ideal"][1] == rows["decode v2"]["ideal"][1] == "launch"
    assert rows["attention pipeline"]["launches"] == 3
    assert "projection v4" in bench.format_predictions(list(rows.values()))
