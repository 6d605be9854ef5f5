"""The two launches a check runs an answer at: the simulator's block sizes and constants, and a GPU's.

A stage module whose launch differs between the two declares ``SHAPE_CONSTANTS = {name: (simulator
value, GPU value)}`` (softmax's rows of 32 or 128 threads, flash's query blocks of 16 or 32, ...),
and its constants take the values of the process's configuration. An answer written against one
value (a hard-coded 32 where THREADS_PER_ROW belongs) would pass the checks of that configuration
and fail on the other machine; so a check whose exercise sets ``both_shapes`` runs every case at
both. The other configuration is made for the length of its cases by giving every constant of
every stage module its other value, where it is defined, where another module of the library
imported it, and where the answer's own code (and the functions it calls) reads it. Its launches
are simulated (on a GPU too: a compiled kernel would keep the values it was compiled with).

- ``configurations(exercise)``: the names of the configurations to run, the process's own first.
- ``configured(name, answer)``: a context in which the library and the answer see `name`'s values.
- ``describe(name)``: the configuration in words, for a verdict ("with a GPU's launch: ...").
"""

import importlib
import pkgutil
import sys
from contextlib import contextmanager

from attention_lib.checks import answer_code
from attention_lib.platform import runtime

SIMULATOR, GPU = "simulator", "GPU"


def native():
    """The configuration this process's modules were imported with."""
    return SIMULATOR if runtime.SIMULATOR_SHAPES else GPU


def stage_constants():
    """{module: {name: (simulator value, GPU value)}} of every stage module that declares any."""
    from attention_lib import stages
    found = {}
    for info in pkgutil.iter_modules(stages.__path__):
        module = importlib.import_module(f"attention_lib.stages.{info.name}")
        if getattr(module, "SHAPE_CONSTANTS", None):
            found[module] = module.SHAPE_CONSTANTS
    return found


def configurations(exercise):
    """The configurations a check of `exercise` runs: the native one, then the other when the
    exercise depends on a shape constant (``both_shapes``)."""
    other = GPU if native() == SIMULATOR else SIMULATOR
    return [native(), other] if exercise.both_shapes else [native()]


def describe(name):
    """'a GPU's launch (softmax.THREADS_PER_ROW 128, ...)' or "the simulator's launch (...)"."""
    index = 0 if name == SIMULATOR else 1
    values = ", ".join(f"{module.__name__.rsplit('.', 1)[-1]}.{constant} {pair[index]}"
                       for module, constants in stage_constants().items() for constant, pair in constants.items()
                       if not isinstance(pair[index], tuple))
    return f"{'the simulator' if name == SIMULATOR else 'a GPU'}'s launch ({values})"


@contextmanager
def configured(name, answer):
    """For the length of the block, the library and the answer see the constants of configuration
    `name` (SIMULATOR or GPU); everything is put back afterwards, also on an error."""
    if name == native():
        yield
        return
    index = 0 if name == SIMULATOR else 1
    namespaces = [vars(m) for n, m in sorted(sys.modules.items()) if n.startswith("attention_lib") and m is not None]
    for function in answer_code.functions_reached(answer):
        if not any(function.__globals__ is namespace for namespace in namespaces):
            namespaces.append(function.__globals__)
    plan = {}                                           # name -> (value now, value in `name`)
    for module, constants in stage_constants().items():
        for constant, pair in constants.items():
            step = (vars(module)[constant], pair[index])
            if plan.setdefault(constant, step) != step:
                raise ValueError(f"SHAPE_CONSTANTS: {constant} has two different pairs of values in the stages")
    changed = []                                        # (namespace, name, old value)
    for constant, (old, new) in plan.items():
        for namespace in namespaces:
            value = namespace.get(constant)
            if type(value) is type(old) and value == old:
                changed.append((namespace, constant, old))
                namespace[constant] = new
    try:
        yield
    finally:
        for namespace, constant, old in reversed(changed):
            namespace[constant] = old
