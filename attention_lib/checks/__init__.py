"""Exercise checking: ``check(exercise_id, answer)``, ``hint(exercise_id, level)`` and the registry.

The engine (running cases, diagnosing, the verdict) is in ``engine``; each notebook's
exercises are in ``exNN_<topic>.py`` beside it, every one of which is imported (and so
registers its exercises) when this package is imported. Not here: the kernels an exercise's
solution becomes (``stages``, the one source of truth) and the tools a check calls (``measure``).
"""

import importlib
import pkgutil

from attention_lib.checks.engine import EXERCISES, Exercise, check, hint, reveal  # noqa: F401
from attention_lib.checks.result import CheckResult  # noqa: F401

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("ex")):
    importlib.import_module(f"{__name__}.{_module}")
