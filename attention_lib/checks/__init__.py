"""Exercise checking: ``check(exercise_id, answer)`` and the registry of every exercise.

The engine (running cases, diagnosing, the verdict) is in ``engine``; each notebook's
exercises are in ``exNN_<topic>.py`` and are registered when this package is imported.
"""

from attention_lib.checks.engine import EXERCISES, CheckResult, Exercise, check  # noqa: F401
from attention_lib.checks import ex00_basics  # noqa: F401  (registers its exercises)
