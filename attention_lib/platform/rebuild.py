"""One way to compile a function again with other globals: the kernel a stage builds around a part
(kernel 3 with a student's device function in place of its own), a kernel at other compile-time
sizes, a check's probe around an answer.

``rebuilt(function, replaced, base=None, device=False, **options)`` is ``cuda.jit(**options)`` of
`function`'s code (a Python function, or a kernel's or device function's ``py_func``) whose globals
are `base` (its own by default) with the names in `replaced` bound anew. It is cached on the code,
the namespace and the names bound, so one answer at one size is compiled once however often a check
asks for it.
"""

import types
from collections import OrderedDict

from numba import cuda

CACHED = 256
_built = OrderedDict()


def _key(value):
    try:
        hash(value)
        return ("value", type(value), value)
    except TypeError:
        return ("object", id(value))


def rebuilt(function, replaced=None, base=None, name=None, device=False, **options):
    """`function` compiled by cuda.jit(device=device, **options) with globals `base` (default: its
    own) updated by `replaced`; named `name` (default: its own), its closure kept."""
    code = getattr(function, "py_func", function)
    replaced = dict(replaced or {})
    namespace = code.__globals__ if base is None else base
    key = (code.__code__, id(namespace), tuple(id(cell) for cell in code.__closure__ or ()),
           _key(code.__defaults__), name, device, tuple(sorted(options.items())),
           tuple(sorted((k, _key(v)) for k, v in replaced.items())))
    if key in _built:
        _built.move_to_end(key)
        return _built[key][0]
    names = {**namespace, **replaced}
    rebound = types.FunctionType(code.__code__, names, name or code.__name__, code.__defaults__, code.__closure__)
    kernel = cuda.jit(device=True, **options)(rebound) if device else cuda.jit(**options)(rebound)
    _built[key] = (kernel, namespace, replaced, code)       # kept alive: their ids are in the key
    if len(_built) > CACHED:
        _built.popitem(last=False)
    return kernel
