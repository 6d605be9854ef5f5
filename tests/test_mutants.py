"""Each check is proven by the mutants of its solution (scripts/mutants.py, make mutants): the catalogue
makes every kind of single-point change, a fixed sample of every exercise's mutants is killed or
listed as equivalent (CI runs them all), and the list of equivalents is well formed."""

import ast
import sys
from pathlib import Path

import pytest
import yaml
from numba import cuda

from attention_lib.checks import EXERCISES, check, engine, mutation

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import mutants as runner  # noqa: E402  (scripts/mutants.py)

# Every SAMPLE-th mutant of each exercise (the same ones every time): a few dozen of some 1,300 (CI runs
# them all: make mutants).
SAMPLE = 50


class _Tiny:
    """A stand-in exercise whose solution is `tiny` below."""

    exercise_id = "99_tiny"


def tiny(x, out, n):
    from numba import cuda, float32
    i = cuda.grid(1)
    if i < n:
        acc = float32(0.0)
        out[i, 0] = max(acc, x[i])
    cuda.syncthreads()
    if i < n:
        out[i, 0] = out[i, 0] + x[i]


def test_the_catalogue_makes_each_kind_of_change(monkeypatch):
    exercise = _Tiny()
    exercise.solution = tiny
    changes = [m.change for m in mutation.mutants(exercise)]
    expected = ["< -> <=", "< -> >", "statement deleted: i = cuda.grid(1)", "barrier deleted: cuda.syncthreads()",
                "barrier moved into the end of the if before it", "barrier moved into the start of the if after it",
                "arguments 0 and 1 of max(...) swapped", "float32(0.0) -> float(0.0)", "i -> i + 1", "i -> i - 1",
                "indices 0 and 1 of out[i, 0] swapped",
                "cuda.grid(1) -> cuda.threadIdx.x"]                  # a design slip: the block's place dropped
    assert all(change in changes for change in expected), sorted(set(changes))
    assert len(changes) == len(set(m.source for m in mutation.mutants(exercise)))     # no two the same
    for m in mutation.mutants(exercise):
        ast.parse(m.source)


def test_design_slips_are_mutants_too():
    """Changes of the design, not of a token: the block dropped from an index, a walk started at 0
    instead of the thread's or the block's own start."""
    changes = [m.change for m in mutation.mutants(EXERCISES["04_block_softmax"])]
    assert "cuda.blockIdx.x -> 0" in changes and "range(tid, ...) -> range(0, ...)" in changes, changes


def count(s):
    return 2 * (s + 1) - 3


def test_a_plain_function_that_counts_gets_its_formulas_slips():
    exercise = _Tiny()
    exercise.solution = count
    changes = [m.change for m in mutation.mutants(exercise)]
    assert {"* -> + in 2 * (s + 1)", "+ -> - in s + 1", "- -> + in 2 * (s + 1) - 3", "2 -> 3", "2 -> 1",
            "3 -> 4"} <= set(changes), changes
    kernel = _Tiny()
    kernel.solution = cuda.jit(tiny)
    assert not any(" in " in m.change or m.change == "0 -> 1" for m in mutation.mutants(kernel))


def test_every_exercise_with_a_solution_has_mutants_each_with_a_key_of_its_own():
    for exercise_id, exercise in EXERCISES.items():
        if exercise.solution is None:
            continue
        keys = [m.key for m in mutation.mutants(exercise)]
        assert keys and len(keys) == len(set(keys)), exercise_id     # two "<" on one line: "2nd on the line"



def test_a_solution_copy_is_not_refused_as_given_code():
    assert check("00_scale_add", mutation.solution_copy(EXERCISES["00_scale_add"]), verbose=False).passed


def test_a_fixed_sample_of_every_exercises_mutants_is_killed_or_listed_as_equivalent():
    ids = [e for e, exercise in EXERCISES.items() if exercise.solution is not None]
    results = runner.run(ids, sample=SAMPLE, workers=1, report=lambda line: None)
    table = runner.verdicts(results, runner.load_equivalents())
    assert sum(row["made"] for row in table.values()) >= len(ids)
    problems = [line for row in table.values() for line in row["survived"] + row["listed_but_killed"]]
    problems += [f"every sampled mutant of {e} raised" for e, row in table.items() if row["only_errors"] and row["made"] > 2]
    assert not problems, "\n".join(problems)


def test_the_list_of_equivalents_is_well_formed():
    for path in sorted((ROOT / "tests" / "equivalent_mutants").glob("*.yml")):
        listed = yaml.safe_load(path.read_text()) or {}
        for exercise_id, entries in listed.items():
            assert exercise_id in EXERCISES and exercise_id.startswith(path.stem), (path.name, exercise_id)
            for entry in entries:
                assert set(entry) == {"change", "at", "why"} and len(entry["why"]) > 20, (path.name, entry)


@pytest.mark.parametrize("exercise_id", ["04_row_softmax"])
def test_a_mutant_is_built_at_its_own_file_name_and_judged_like_an_answer(exercise_id):
    exercise = EXERCISES[exercise_id]
    mutant = next(m for m in mutation.mutants(exercise) if m.change.startswith("np.float32(0.0) -> float"))
    answer = mutation.build(exercise, mutant.source, f"<mutant {mutant.mutant_id}>")
    result = check(exercise_id, answer, verbose=False)
    assert result.diagnosis == "float64_arithmetic" and f"<mutant {mutant.mutant_id}>" in result.message
    assert engine._is_kernel(answer)


def test_a_variant_changes_the_solution_and_refuses_a_change_it_cannot_make():
    exercise = EXERCISES["09_lse_merge"]
    planted = mutation.variant(exercise, ("lse[h] = big + math.log(total)", "lse[h] = math.log(total)"))
    assert check("09_lse_merge", planted, verbose=False).diagnosis == "lse_without_max"
    with pytest.raises(ValueError, match=r"^the solution of 09_lse_merge has no 'no such line'$"):
        mutation.variant(exercise, ("no such line", "x"))
