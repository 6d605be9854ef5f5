"""What one check records while its cases run: the launches it compiles for a GPU, the traced launches
of the current case, and whether its launches must be simulated.

The judge opens a ``Session`` for each check; the launch functions it hands an exercise's run
(``launch.launch``, unless told ``compile=False``) report every launch to it. The first
launch of each kernel that holds the answer's code (the answer itself, or a check's kernel built
around the student's device function) is kept with the argument types of that launch; once every
case is right, ``compiled()`` sends them to the GPU compiler and waits for what it made of them:
an answer compiled before (the same code, the same library) is read from the compiler's store,
and its process is started only for an answer it has not seen. An answer whose cases fail is not
compiled: its verdict is already given. A kernel of the library alone is not
compiled: the kernel report holds it.

In a graded class (``compile_first``) each kernel holding the answer's code is compiled for sm_90
in nopython mode at its first launch, before it runs: code the GPU compiler takes cannot reach a
Python object, so what the simulator then runs is only what a GPU would. A refusal stops the check
there (``not_gpu_code``).
"""

from attention_lib.measure import compiler, shipping, signatures

_current = None


class RefusedByCompiler(Exception):
    """A graded check's answer that the GPU compiler refused before it ran (not_gpu_code)."""


def current():
    """The session of the check being judged, or None outside a check."""
    return _current


class Session:
    """One check's record: open it with ``with Session(gpu_code=...):`` (whether the answer is GPU code)."""

    def __init__(self, gpu_code=True, compile_first=False):
        self.gpu_code = gpu_code
        self.compile_first = compile_first
        self.launches = {}           # id(kernel) -> (kernel, described argument types), first launch
        self.traces = []             # the current case's traced launches (measure.trace.Traced)
        self.simulate = False        # launch every kernel on the simulator (the other configuration)

    def __enter__(self):
        global _current
        self._outer, _current = _current, self
        return self

    def __exit__(self, *exc):
        global _current
        _current = self._outer
        return False

    def launched(self, kernel, args):
        """A launch of `kernel` with `args`: its first one is kept, when it holds the answer's code."""
        if not self.gpu_code or id(kernel) in self.launches or shipping.importable(kernel) is not None:
            return
        self.launches[id(kernel)] = (kernel, [signatures.describe(a) for a in args])
        if self.compile_first:
            self._compile_now(kernel, self.launches[id(kernel)][1])

    @staticmethod
    def _compile_now(kernel, described):
        """Compile before the first run; RefusedByCompiler when the GPU compiler refuses the code (a
        machine with no compiler runs it as the class does, and says so after)."""
        try:
            made = compiler.submit(kernel, described).result()
        except shipping.SourceUnavailable:
            return
        except shipping.Unshippable as error:
            raise RefusedByCompiler(f"the GPU compiler cannot be given this code: {error}") from None
        if made.error:
            raise RefusedByCompiler(f"a GPU's compiler refuses it, so it was not run: {made.error}")

    def compiled(self):
        """[compiler.Compiled, or the message saying why a kernel cannot be sent to the compiler] for
        every kernel kept, in launch order; all are sent before the first answer is awaited."""
        pending = []
        for kernel, args in self.launches.values():
            try:
                pending.append(compiler.submit(kernel, args))
            except shipping.SourceUnavailable as error:       # nothing to say about the answer itself
                pending.append(compiler.Pending(None, compiler.Compiled(unavailable=str(error))))
            except shipping.Unshippable as error:
                pending.append(str(error))
        return [p if isinstance(p, str) else p.result() for p in pending]
