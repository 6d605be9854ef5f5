"""A verdict as the grader reads it: a record displayed with the verdict, signed during a grading run.

nbgrader scores a test cell from what the cell leaves behind (no error, nothing on stderr), which an
answer cell can arrange without a right answer (swallowing stderr, redefining ``check``). So a check
cell also displays its verdict as data of its own type (``MIME``): the exercise, the diagnosis and
whether it passed. During a grading run, ``make grade`` puts a fresh key in ``KEY_VARIABLE`` for the
notebooks it executes; this module takes the key out of the environment when it is imported (before
any answer cell runs) and signs each record with it (HMAC-SHA256), so a record a check did not make
fails ``verify`` with that run's key. Outside a grading run the record carries no signature.

- ``record(exercise_id, diagnosis, passed) -> dict``; ``verify(data, key) -> bool``.
"""

import hashlib
import hmac
import json
import os

MIME = "application/vnd.attention-lib.verdict+json"
KEY_VARIABLE = "ATTENTION_LIB_GRADING_KEY"
_key = os.environ.pop(KEY_VARIABLE, None)


def _signature(key, data):
    text = json.dumps({k: data[k] for k in ("exercise_id", "diagnosis", "passed")}, sort_keys=True)
    return hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()


def record(exercise_id, diagnosis, passed):
    """The record of one verdict, signed when this process was started by a grading run."""
    data = {"exercise_id": exercise_id, "diagnosis": diagnosis, "passed": bool(passed)}
    if _key:
        data["signature"] = _signature(_key, data)
    return data


def verify(data, key):
    """Whether `data` (a record read back from a notebook) was made by a check under `key`."""
    try:
        return hmac.compare_digest(str(data["signature"]), _signature(key, data))
    except (KeyError, TypeError):
        return False
