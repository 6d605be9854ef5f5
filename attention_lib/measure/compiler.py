"""What a GPU's compiler makes of one kernel, from any process: PTX, its float64 instructions, and
ptxas's registers and stack frame.

Numba compiles for a GPU only in a process where the simulator is off, so the kernel is shipped
(``shipping``) to a worker process started on the first request that is not answered from the store
and kept (about 1 s of CPU to start; a small kernel then compiles in about 0.2 s). A request is
written at once and its answer read when it is needed. Answers are kept on disk, keyed by the
request and by the library's and the compiler's versions: compiling the same answer again costs
nothing, not even the worker's start.

- ``submit(kernel, arg_types, arch="sm_90") -> Pending``; ``Pending.result() -> Compiled``.
- ``Compiled``: ``error`` (the compiler's own message in one line, or None), ``unavailable`` (no
  CUDA compiler here: why, and how to install one), ``float64`` (the float64 instructions of the
  PTX, each with the source line it comes from), ``registers``, ``stack_bytes``.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from attention_lib.measure import shipping, signatures

DEFAULT_ARCH = "sm_90"
_MARK = "@@compiled@@ "


@dataclass
class Float64:
    """One float64 instruction of the PTX and the source line it was compiled from."""

    instruction: str
    filename: str
    line: int


@dataclass
class Compiled:
    """What the compiler made of one kernel."""

    error: str = None                 # the compiler refused it: its message, in one line
    unavailable: str = None           # no compiler here: why, in one line
    float64: list = field(default_factory=list)
    registers: int = None
    stack_bytes: int = None
    spill_bytes: int = None

    @property
    def ok(self):
        return self.error is None and self.unavailable is None

    @classmethod
    def from_json(cls, data):
        data = dict(data)
        data["float64"] = [Float64(**f) for f in data.get("float64", [])]
        return cls(**data)


# ---- the worker's side ----------------------------------------------------------------------

_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')


def float64_instructions(ptx):
    """[Float64] of every instruction in `ptx` that computes or moves a float64 (``.f64``), each with
    the source line of the closest ``.loc`` before it (PTX compiled with lineinfo)."""
    files = {}
    for line in ptx.splitlines():
        found = _FILE.match(line)
        if found:
            files[found.group(1)] = found.group(2)
    where, found_f64 = (None, 0), []
    for line in ptx.splitlines():
        loc = _LOC.match(line)
        if loc:
            where = (loc.group(1), int(loc.group(2)))
            continue
        text = line.strip()
        if ".f64" in text and not text.startswith((".reg", ".local", ".shared", ".param", "//")):
            opcode = text.split()[0]
            found_f64.append(Float64(opcode, files.get(where[0], "?"), where[1]))
    return found_f64


def _first_line(error):
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    # Numba's typing errors start with a generic line and name the culprit further down.
    detail = next((line for line in lines if not line.startswith(("Failed in", "During:", "File", "^"))), None)
    return f"{type(error).__name__}: {detail or (lines[0] if lines else '')}"


def _compile_one(job):
    from numba import cuda
    from attention_lib.measure import kernel_report
    from attention_lib.platform import numba_patches
    cc = kernel_report._compute_capability(job["arch"])
    numba_patches.compile_for(cc)
    try:
        kernel = shipping.rebuild(job["shipped"])
        signature = tuple(signatures.numba_type(a) for a in job["args"])
        bounds = getattr(kernel, "targetoptions", {}).get("launch_bounds")
        ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=cc, lineinfo=True, launch_bounds=bounds)
    except Exception as error:   # the compiler's refusal, whatever its class, is the answer
        return {"error": _first_line(error)}
    answer = {"float64": [vars(f) for f in float64_instructions(ptx)]}
    try:
        import tempfile
        with tempfile.TemporaryDirectory() as workdir:
            source, cubin = Path(workdir, "kernel.ptx"), Path(workdir, "kernel.cubin")
            source.write_text(ptx)
            done = subprocess.run([kernel_report.tool("ptxas"), f"-arch={job['arch']}", "-O3", "-v", str(source),
                                   "-o", str(cubin)], capture_output=True, text=True)
        if done.returncode != 0:
            said = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
            errors = [line for line in said if "error" in line.lower()]
            return {"error": f"ptxas: {(errors or said or ['failed'])[0]}"}
        figures = kernel_report.parse_ptxas(done.stdout + done.stderr)
        answer.update(registers=figures["registers"], stack_bytes=figures["stack_bytes"],
                      spill_bytes=figures["spill_bytes"])
    except FileNotFoundError:    # no ptxas: the PTX's answers stand, the figures are unknown
        pass
    return answer


def _toolkit_problem():
    """Why nothing can be compiled here (one line), or None: a one-line kernel is tried."""
    from numba import cuda
    from numba.cuda import types
    from attention_lib.platform import numba_patches
    numba_patches.compile_for((9, 0))

    def probe(out):
        out[0] = 1.0
    try:
        cuda.compile_ptx(probe, (types.float32[::1],), cc=(9, 0))
    except Exception as error:
        return (f"{_first_line(error)}; install the CUDA compiler with the compile extra: "
                "pip install -e '.[compile]' in the course folder")
    return None


def serve():
    """The worker: one JSON request a line on stdin, one answer a line on stdout."""
    problem = _toolkit_problem()
    for line in sys.stdin:
        request = json.loads(line)
        answer = {"unavailable": problem} if problem else _compile_one(request["job"])
        sys.stdout.write(_MARK + json.dumps({"id": request["id"], "answer": answer}) + "\n")
        sys.stdout.flush()


_BOOT = ("import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '0'\n"
         "os.environ['ATTENTION_LIB_SHAPES'] = 'auto'\n"
         "from numba import cuda  # before attention_lib: the real CUDA target, GPU shapes\n"
         "from attention_lib.measure.compiler import serve; serve()\n")


# ---- the asking side ------------------------------------------------------------------------

class _Worker:
    """One compiling process, started on the first request, answering requests in order."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM")}
        env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.DEVNULL, text=True, env=env)
        self.answers, self.next_id = {}, 0
        self.lock = threading.Lock()

    def send(self, job):
        with self.lock:
            self.next_id += 1
            self.process.stdin.write(json.dumps({"id": self.next_id, "job": job}) + "\n")
            self.process.stdin.flush()
            return self.next_id

    def receive(self, request_id):
        with self.lock:
            while request_id not in self.answers:
                line = self.process.stdout.readline()
                if not line:
                    raise RuntimeError("the compiling process stopped")
                if line.startswith(_MARK):
                    message = json.loads(line[len(_MARK):])
                    self.answers[message["id"]] = message["answer"]
            return self.answers.pop(request_id)


_worker = None


def _the_worker():
    global _worker
    if _worker is None or _worker.process.poll() is not None:
        _worker = _Worker()
    return _worker


def _store():
    from attention_lib.measure import report_cache
    return report_cache.cache_folder().parent / "compiled"


def _key(job):
    from attention_lib.measure import report_cache
    text = json.dumps(job, sort_keys=True) + report_cache.library_fingerprint()
    return hashlib.sha256(text.encode()).hexdigest()[:40]


_remembered = {}


class Pending:
    """A request on its way: result() waits for the answer (at once when it was known), its float64
    instructions placed in the files the shipped functions came from (`files`, in shipping order)."""

    def __init__(self, key, answer=None, request_id=None, files=()):
        self.key, self.answer, self.request_id, self.files = key, answer, request_id, list(files)

    def result(self):
        if self.answer is None:
            try:
                self.answer = Compiled.from_json(_the_worker().receive(self.request_id))
            except RuntimeError as error:
                return Compiled(unavailable=f"the GPU compiler's process failed ({error})")
            if self.answer.unavailable is None:
                _remember(self.key, self.answer)
        placed = [Float64(f.instruction, self._file(f.filename), f.line) for f in self.answer.float64]
        return replace(self.answer, float64=placed)

    def _file(self, name):
        found = _SHIPPED_FILE.search(name)          # the PTX may put a folder before it
        return self.files[int(found.group(1))] if found and int(found.group(1)) < len(self.files) else name


# A shipped function's file name in a request: the request, and so the store's key, is its code and
# not where it was typed (a notebook cell's file is named after its kernel's process), so the same
# code compiled in another kernel, or after a restart, is found in the store.
_SHIPPED_FILE = re.compile(r"<shipped function (\d+)>")


def _remember(key, compiled):
    _remembered[key] = compiled
    try:
        folder = _store()
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{key}.{os.getpid()}.tmp"
        partial.write_text(json.dumps({**vars(compiled), "float64": [vars(f) for f in compiled.float64]}))
        os.replace(partial, folder / f"{key}.json")
    except OSError:                       # a read-only home: remembered in this process only
        pass


def submit(kernel, arg_types, arch=DEFAULT_ARCH):
    """Start compiling `kernel` (a kernel whose code, and what it reaches, can be shipped) for the
    argument types `arg_types` (signatures' words, or example values); returns a Pending.
    shipping.Unshippable when something the kernel uses cannot be sent."""
    args = [a if isinstance(a, dict) else signatures.describe(a) for a in arg_types]
    shipped = shipping.ship(kernel)
    files = [entry["filename"] for entry in shipped["functions"]]
    for position, entry in enumerate(shipped["functions"]):
        entry["filename"] = f"<shipped function {position}>"
    job = {"shipped": shipped, "args": args, "arch": arch}
    key = _key(job)
    if key in _remembered:
        return Pending(key, _remembered[key], files=files)
    try:
        compiled = Compiled.from_json(json.loads((_store() / f"{key}.json").read_text()))
        _remembered[key] = compiled
        return Pending(key, compiled, files=files)
    except (OSError, ValueError, TypeError):
        pass
    return Pending(key, request_id=_the_worker().send(job), files=files)


def compile_kernel(kernel, arg_types, arch=DEFAULT_ARCH):
    """submit(...).result(): what the compiler makes of `kernel`, waiting for it."""
    return submit(kernel, arg_types, arch).result()
