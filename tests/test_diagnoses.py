"""Every named diagnosis is real: recognised by its exercise, planted in a test, and documented.

Per-exercise planted-mistake tests live in test_exercises_NN.py (and beside some stages' tests);
this file checks the whole set.
"""

import re
from pathlib import Path

import pytest
from attention_lib.checks import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
ENGINE_CODES = {"ok", "not_implemented", "not_a_kernel", "out_of_bounds", "race", "divergent_barrier",
                "calls_given_code", "raised_error", "wrong_shape", "wrong_values", "stale_tile", "timeout",
                "not_gpu_code", "float64_arithmetic"}
# The codes of the limits an exercise declares (checks/limits.py), named by the engine.
LIMIT_CODES = {"no_reuse", "uncoalesced", "serial_reduction", "serial_copy", "local_memory", "stale_tile",
               "extra_barriers"}
# The codes the course promises (classroom issue): each must be recognised somewhere.
PROMISED = {"missing_scale", "scaled_by_d_k", "transposed", "mask_includes_diagonal", "mask_wrong_side",
            "mask_not_applied", "unstable_softmax", "softmax_wrong_axis", "heads_interleaved",
            "online_softmax_no_rescale", "out_of_bounds", "race", "wrong_shape", "not_implemented",
            "wrong_values"}
TEST_SOURCES = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))


def test_every_promised_code_is_recognised():
    named = set().union(*(e.diagnoses for e in EXERCISES.values()))
    assert PROMISED <= ENGINE_CODES | named, sorted(PROMISED - ENGINE_CODES - named)


@pytest.mark.parametrize("exercise_id", sorted(EXERCISES))
def test_each_named_code_is_returned_by_its_exercise_and_planted_in_a_test(exercise_id):
    exercise = EXERCISES[exercise_id]
    module_source = Path(exercise.run.__code__.co_filename).read_text()
    for code in exercise.diagnoses:
        assert code not in ENGINE_CODES, f"{code} is the engine's own"
        assert f'"{code}"' in module_source, f"{exercise_id} declares {code} but never returns it"
        assert re.search(rf'"{code}"', TEST_SOURCES), f"no test plants a mistake diagnosed {code}"
    for limit in exercise.limits:
        assert limit.code in LIMIT_CODES | set(exercise.diagnoses), f"{exercise_id}: limit code {limit.code}"
        assert re.search(rf'"{limit.code}"', TEST_SOURCES), f"no test plants a mistake diagnosed {limit.code}"


def test_the_instructors_guide_lists_every_exercise_and_code():
    guide = (ROOT / "INSTRUCTORS.md").read_text()
    for exercise in EXERCISES.values():
        assert exercise.exercise_id in guide
        for code in exercise.diagnoses:
            assert code in guide, f"INSTRUCTORS.md does not mention {code}"
    for code in ENGINE_CODES | LIMIT_CODES:
        assert code in guide, f"INSTRUCTORS.md does not mention {code}"


def test_the_engine_lists_the_codes_it_gives_itself():
    from attention_lib.checks import engine
    assert set(engine.ENGINE_CODES) == ENGINE_CODES and len(engine.ENGINE_CODES) == len(ENGINE_CODES)
