"""What the compiler makes of every kernel, without a GPU: the kernel report.

    python -m attention_lib.measure.kernel_report [--arch sm_90] [--json PATH]

For each kernel of the library, with the argument types and block size its launcher uses at
GPU shapes (``ATTENTION_LIB_SHAPES=gpu``, recorded by ``signatures``): PTX from Numba (in a
process with the simulator off), ``ptxas -v`` for registers, stack frame (local memory), spills
and static shared memory, ``nvdisasm`` for the SASS of the hot loop, and the resident warps per
SM those figures allow on an H200 (with the dynamic shared memory the launch asks for, which
ptxas does not see). ptxas and nvdisasm come from NVIDIA's pip wheels (the
``compile`` extra) where they are installed, so the PTX meets the assembler of its own NVVM;
else from the PATH (a CUDA toolkit's, whose NVVM and ptxas also come together).

- ``report(arch, names) -> {"arch", "kernels": {name: row}}``: every kernel, or those named (the
  JSON written by --json); rows of an unchanged library come from ``report_cache``.
- ``report_kernel(kernel, arg_types, threads_per_block) -> row``: one kernel, e.g. a notebook's.
- ``table(rows) -> str``: rows as a text table, for notebooks (an HTML table when displayed in Jupyter).
- ``floor_violations(kernels)``: what breaks the ``FAST`` floors the stage modules declare.
"""

import argparse
import glob
import html
import importlib
import inspect
import json
import math
import os
import pkgutil
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types as pytypes
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attention_lib.measure import signatures

DEFAULT_ARCH = "sm_90"
FLOOR_KEYS = ("max_stack_bytes", "min_warps_per_sm", "min_ffma_fraction")


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds, for the occupancy arithmetic."""

    name: str
    registers: int = 65536
    shared_bytes: int = 228 * 1024
    reserved_shared_per_block: int = 1024
    warps: int = 64
    blocks: int = 32
    sub_partitions: int = 4          # each owns a quarter of the register file
    register_unit: int = 256         # registers are allocated per warp in units of 256
    thread_register_step: int = 8    # a thread's count, rounded up to a multiple of 8


H200 = SMLimits("H200")
# A T4 (Turing, compute capability 7.5): half the warp and block slots, 64 KB of shared memory, none
# reserved per block (the CUDA C++ Programming Guide's table of compute capabilities).
T4 = SMLimits("T4", shared_bytes=64 * 1024, reserved_shared_per_block=0, warps=32, blocks=16)


def warps_per_sm(registers, shared_bytes, threads_per_block, sm=H200):
    """Resident warps per SM for blocks of `threads_per_block` threads using `registers` per
    thread and `shared_bytes` of shared memory, as NVIDIA's occupancy calculator counts them:
    the fewest blocks allowed by registers, shared memory (no limit for a block that takes none),
    warp slots and block slots (04x_warps_per_sm's solution)."""
    warps_per_block = math.ceil(threads_per_block / 32)
    per_thread = math.ceil(max(registers, 1) / sm.thread_register_step) * sm.thread_register_step
    per_warp = math.ceil(per_thread * 32 / sm.register_unit) * sm.register_unit
    warps_by_registers = (sm.registers // sm.sub_partitions // per_warp) * sm.sub_partitions
    shared_per_block = shared_bytes + sm.reserved_shared_per_block
    blocks = min(warps_by_registers // warps_per_block,
                 sm.shared_bytes // shared_per_block if shared_per_block else sm.blocks,
                 sm.warps // warps_per_block,
                 sm.blocks)
    return blocks * warps_per_block


# ---- the tools: from the installed wheels, else from the PATH ----

def tool(name):
    """Path of `name` (ptxas, nvdisasm): inside NVIDIA's installed pip wheels (the ``compile``,
    ``gpu`` and ``gpu-cu12`` extras bring them, pinned to the NVVM that writes the PTX), else on
    the PATH (a system-wide CUDA toolkit, as on GPU machines whose Python has no NVIDIA compiler
    wheels: its NVVM and ptxas come together too). A FileNotFoundError in one line names what to
    install when neither has it."""
    try:
        import nvidia
        roots = list(nvidia.__path__)
    except ImportError:
        roots = []
    for root in roots:
        for found in sorted(glob.glob(os.path.join(root, "*", "bin", name))):
            if os.access(found, os.X_OK):
                return found
    on_path = shutil.which(name)
    if on_path:
        return on_path
    raise FileNotFoundError(f"{name} is neither in the installed NVIDIA wheels nor on the PATH: install the compile "
                            "extra (pip install -e '.[compile]'; gpu-cu12 for a CUDA 12 driver) or a CUDA toolkit")


# ---- what ptxas and nvdisasm say ----

def parse_ptxas(text):
    """registers, stack_bytes, spill_bytes (spill stores), shared_bytes of the entry function
    in the output of ``ptxas -v``."""
    entry = re.search(r"Compiling entry function '([^']+)'", text)
    if entry is None:
        raise ValueError(f"no entry function in the ptxas output:\n{text}")
    after = text[entry.end():]
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", after)
    used = re.search(r"Used (\d+) registers", after)
    shared = re.search(r"(\d+) bytes smem", after.split("Compiling entry function")[0])
    return {"registers": int(used.group(1)), "stack_bytes": int(frame.group(1)),
            "spill_bytes": int(frame.group(2)), "shared_bytes": int(shared.group(1)) if shared else 0}


_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)(.*?);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def sass_instructions(sass):
    """[(address, opcode, branch target address or None)] of one function's SASS (nvdisasm -c)."""
    labels, pending, rows = {}, [], []
    for line in sass.splitlines():
        label = _LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        found = _INSTRUCTION.match(line)
        if not found:
            continue
        address = int(found.group(1), 16)
        for name in pending:
            labels[name] = address
        pending = []
        target = _TARGET.search(found.group(3))
        rows.append((address, found.group(2), target.group(1) if target else None))
    return [(a, op, labels.get(t) if t else None) for a, op, t in rows]


def instruction_mix(opcodes):
    """Counts of FFMA, shared loads, local loads and stores, global loads and all instructions."""
    base = [op.split(".")[0] for op in opcodes]
    ffma = base.count("FFMA")
    mix = {"ffma": ffma, "lds": base.count("LDS"), "local": base.count("LDL") + base.count("STL"),
           "ldg": base.count("LDG"), "total": len(base)}
    mix["ffma_fraction"] = round(ffma / len(base), 4) if base else 0.0
    return mix


def hot_loop(sass):
    """The instruction mix of the loop body with the most FFMA.

    A loop is a backward branch: the instructions from its target to the branch. Its body is
    what runs once per iteration at that level, the instructions of loops nested inside left
    out. Ties go to the larger body; code without a loop is counted whole.
    """
    rows = sass_instructions(sass)
    ends = {}
    for address, opcode, target in rows:
        if opcode.split(".")[0] == "BRA" and target is not None and target < address:
            ends[target] = max(ends.get(target, address), address)   # one loop per header
    loops = sorted(ends.items())
    if not loops:
        return instruction_mix([op for _, op, _ in rows])
    best = None
    for start, end in loops:
        inner = [(s, e) for s, e in loops if start <= s and e <= end and (s, e) != (start, end)]
        body = [op for a, op, _ in rows
                if start <= a <= end and not any(s <= a <= e for s, e in inner)]
        mix = instruction_mix(body)
        if best is None or (mix["ffma"], mix["total"]) > (best["ffma"], best["total"]):
            best = mix
    return best


# ---- compiling, in worker processes with the simulator off ----

def _assemble(ptx, arch, workdir, stem):
    """ptxas -v and nvdisasm on one kernel's PTX -> (ptxas's report, the SASS)."""
    source, cubin = Path(workdir, f"{stem}.ptx"), Path(workdir, f"{stem}.cubin")
    source.write_text(ptx)
    done = subprocess.run([tool("ptxas"), f"-arch={arch}", "-O3", "-v", str(source), "-o", str(cubin)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ptxas failed on {stem}: {done.stderr.strip()}")
    sass = subprocess.run([tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True, check=True)
    return done.stdout + done.stderr, sass.stdout


def _kernel_for(job):
    """The kernel a job names: a library kernel, or one rebuilt from a notebook's source."""
    if "module" in job:
        return getattr(importlib.import_module(job["module"]), job["kernel"])
    namespace = {"__name__": "attention_lib_notebook_kernel"}
    for name, (kind, *what) in job["globals"].items():
        if kind == "module":
            namespace[name] = importlib.import_module(what[0])
        elif kind == "attribute":
            namespace[name] = getattr(importlib.import_module(what[0]), what[1])
        elif kind == "numpy":
            namespace[name] = np.dtype(what[0]).type(what[1])
        else:
            namespace[name] = what[0]
    for source in job["sources"]:             # device functions first, the kernel last
        exec(compile(source, f"<notebook cell: {job['name']}>", "exec"), namespace)
    return namespace[job["kernel"]]


def _compute_capability(arch):
    """(9, 0) for "sm_90"."""
    found = re.fullmatch(r"sm_(\d+)(\d)", arch)
    if not found:
        raise ValueError(f"arch must name a GPU architecture such as 'sm_90', got {arch!r}")
    return int(found.group(1)), int(found.group(2))


def _row(job, arch):
    from numba import cuda
    from attention_lib.platform import numba_patches
    cc = _compute_capability(arch)
    numba_patches.compile_for(cc)
    kernel = _kernel_for(job)
    signature = tuple(signatures.numba_type(a) for a in job["args"])
    # The launch bounds the kernel's own dispatcher compiles it with: they cap its registers.
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=cc,
                              launch_bounds=getattr(kernel, "targetoptions", {}).get("launch_bounds"))
    with tempfile.TemporaryDirectory() as workdir:
        ptxas, sass = _assemble(ptx, arch, workdir, job["name"].replace(".", "_"))
    row = {"signature": [str(t) for t in signature], **parse_ptxas(ptxas),
           "dynamic_shared_bytes": job.get("dynamic_shared_bytes", 0), "threads_per_block": job["threads_per_block"]}
    row["warps_per_sm"] = warps_per_sm(row["registers"], row["shared_bytes"] + row["dynamic_shared_bytes"],
                                       row["threads_per_block"])
    row["hot_loop"] = hot_loop(sass)
    return row


def _worker():
    """Entry of a compile process: jobs as JSON on stdin, {name: row} as JSON on the last line."""
    request = json.loads(sys.stdin.read())
    rows = {job["name"]: _row(job, request["arch"]) for job in request["jobs"]}
    print("\n" + json.dumps(rows))


_WORKER = ("import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '0'\n"
           "from numba import cuda  # before attention_lib: the real CUDA target, GPU shapes\n"
           "from attention_lib.measure.kernel_report import _worker; _worker()\n")


def _compile(jobs, arch, processes=None):
    """Rows for `jobs`, compiled in up to `processes` worker processes (default: one per core)."""
    processes = max(1, min(processes or os.cpu_count() or 1, len(jobs)))
    shares = [jobs[i::processes] for i in range(processes)]
    env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])

    def run(share):
        done = subprocess.run([sys.executable, "-c", _WORKER], input=json.dumps({"arch": arch, "jobs": share}),
                              env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"compiling {[j['name'] for j in share]} failed:\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    rows = {}
    with ThreadPoolExecutor(processes) as pool:
        for part in pool.map(run, shares):
            rows.update(part)
    return rows


# ---- the library's kernels ----

def _library_launches(names=None):
    """signatures.recorded_launches(names) at GPU shapes: here if this process has them, else in
    a simulator process with ATTENTION_LIB_SHAPES=gpu."""
    from attention_lib.platform import runtime
    if not runtime.SIMULATOR_SHAPES:
        return signatures.recorded_launches(names)
    env = dict(os.environ, **{runtime.SHAPES_VARIABLE: "gpu", runtime.BACKEND_VARIABLE: runtime.SIMULATOR})
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")])
    program = ("import json, sys; from attention_lib.measure import signatures\n"
               "print('\\n' + json.dumps(signatures.recorded_launches(json.loads(sys.argv[1]))))\n")
    done = subprocess.run([sys.executable, "-c", program, json.dumps(names)], env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"recording the launches at GPU shapes failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(arch=DEFAULT_ARCH, names=None, processes=None, cache=True):
    """{"arch": arch, "kernels": {"module.kernel": row}} for every kernel of kernel_cases.CASES,
    or for those in `names` (e.g. ["projection.projection_kernel_v3"], for a notebook).

    cache: reuse rows computed from this very source (``report_cache``); False compiles afresh.
    """
    from attention_lib.measure import report_cache
    from attention_lib.measure.kernel_cases import CASES
    _compute_capability(arch)
    signatures.check_names(names)
    wanted = sorted(CASES if names is None else names)
    store = report_cache.RowCache(arch) if cache else report_cache.NoCache()
    with store.locked():                 # a second process waits, then finds the rows stored
        rows = store.load(wanted)
        missing = [name for name in wanted if name not in rows]
        if missing:
            jobs = [{"name": name, "module": f"attention_lib.stages.{name.split('.')[0]}",
                     "kernel": name.split(".")[1], "args": launch["args"],
                     "threads_per_block": launch["threads_per_block"],
                     "dynamic_shared_bytes": launch["dynamic_shared_bytes"]}
                    for name, launch in _library_launches(missing).items()]
            rows.update(store.save(_compile(jobs, arch, processes)))
    return {"arch": arch, "kernels": dict(sorted(rows.items()))}


# ---- one kernel, e.g. written in a notebook ----

def _described(arg_type):
    """A signature entry (numba type, its printed name, or an example value) in signatures' words."""
    if isinstance(arg_type, str) or type(arg_type).__module__.startswith("numba"):
        text = str(arg_type)
        array = re.fullmatch(r"array\((\w+), (\d)d, ([CFA])\)", text)
        if array:
            return {"dtype": array.group(1), "ndim": int(array.group(2)), "layout": array.group(3)}
        return {"scalar": "boolean" if text == "bool" else text}
    return signatures.describe(arg_type)


def _names(code):
    """Every global name a code object (and the code nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, pytypes.CodeType):
            names |= _names(const)
    return names


def _shipped(fn, globals_out, sources, seen):
    """Collect what recompiling `fn` in another process needs: its source (after the sources
    of the notebook's device functions it calls) and its globals, as importable references."""
    source = textwrap.dedent(inspect.getsource(fn))
    for name in sorted(_names(compile(source, "<cell>", "exec"))):
        if name in seen or name not in fn.__globals__:
            continue
        value = fn.__globals__[name]
        seen.add(name)
        if isinstance(value, pytypes.ModuleType):
            globals_out[name] = ("module", value.__name__)
        elif hasattr(value, "py_func") and value.py_func.__module__ == fn.__module__ and fn.__module__ == "__main__":
            _shipped(value.py_func, globals_out, sources, seen)          # the notebook's own device function
        elif isinstance(value, np.generic):
            globals_out[name] = ("numpy", value.dtype.str, value.item())
        elif isinstance(value, (bool, int, float, str, type(None))) or (
                isinstance(value, tuple) and all(isinstance(v, (bool, int, float)) for v in value)):
            globals_out[name] = ("value", value)
        elif type(value).__module__.startswith("numba.core.types"):   # float32, int32, ...
            globals_out[name] = ("attribute", "numba.types", str(value))
        else:
            inner = getattr(value, "py_func", value)
            owner, own_name = getattr(inner, "__module__", None), getattr(inner, "__name__", name)
            if not owner or owner == "__main__" or getattr(importlib.import_module(owner), own_name, None) is not value:
                raise TypeError(f"{fn.__name__} uses {name!r} ({type(value).__name__}), which can't be sent to "
                                "the compiler: use constants, modules, or functions of importable modules")
            globals_out[name] = ("attribute", owner, own_name)
    sources.append(source)


def report_kernel(kernel, arg_types, threads_per_block, arch=DEFAULT_ARCH):
    """The report's row for one kernel, e.g. one written in a notebook cell.

    kernel: a @cuda.jit kernel (on the simulator too: it is recompiled from its source in a
    process with the simulator off, with the constants, modules, library functions and
    notebook device functions it uses); arg_types: one entry per argument, a numba type
    (``numba.float32[:, ::1]``), the way numba prints one (``"array(float32, 2d, C)"``) or an
    example value (a NumPy array, ``np.float32(1)``); threads_per_block: an int or a tuple.
    """
    _compute_capability(arch)
    fn = kernel.py_func
    job = {"name": f"{fn.__module__}.{fn.__name__}", "kernel": fn.__name__,
           "args": [_described(a) for a in arg_types],
           "threads_per_block": signatures.threads_in(threads_per_block)}
    if fn.__module__ != "__main__" and getattr(importlib.import_module(fn.__module__), fn.__name__, None) is kernel:
        job["module"] = fn.__module__
    else:
        job["globals"], job["sources"] = {}, []
        _shipped(fn, job["globals"], job["sources"], {fn.__name__})
    return _compile([job], arch, processes=1)[job["name"]]


# ---- the table and the floors ----

COLUMNS = [("registers", "regs"), ("stack_bytes", "stack B"), ("spill_bytes", "spill B"),
           ("shared_bytes", "smem B"), ("dynamic_shared_bytes", "dyn smem B"), ("threads_per_block", "threads"),
           ("warps_per_sm", "warps/SM")]
LOOP_COLUMNS = [("ffma", "FFMA"), ("lds", "LDS"), ("local", "LDL+STL"), ("ldg", "LDG"), ("total", "instr")]


class Table(str):
    """A text table, one line per kernel (what print shows), that a Jupyter front end displays as an
    HTML table instead: the text's lines are wider than a notebook's output area, which wraps each
    of them onto two lines, where the HTML table's cells wrap inside their columns."""

    def __new__(cls, header, lines):
        widths = [max(len(r[i]) for r in [header] + lines) for i in range(len(header))]

        def line(cells):                 # names left-aligned, figures right-aligned
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
        table = super().__new__(cls, "\n".join(line(cells) for cells in [header] + lines))
        table.header, table.lines = header, lines
        return table

    def _repr_pretty_(self, printer, cycle):
        """IPython's text/plain: the table's text, not its quoted repr."""
        printer.text(str(self))

    def _repr_html_(self):
        def name(text):                  # a kernel's name may break after its module
            return "<code>" + html.escape(text).replace(".", ".<wbr>", 1) + "</code>"
        head = "".join(f"<th style=\"text-align: {'left' if i == 0 else 'right'}\">{html.escape(h)}</th>"
                       for i, h in enumerate(self.header))
        body = "".join("<tr>" + f"<td style=\"text-align: left\">{name(cells[0])}</td>"
                       + "".join(f"<td style=\"text-align: right\">{html.escape(c)}</td>" for c in cells[1:]) + "</tr>"
                       for cells in self.lines)
        return (f'<table class="attention-lib-kernel-report" style="font-size: 0.85em">'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def table(rows):
    """rows ({name: row}, or a report) as a text table, one line per kernel; displayed as the cell's
    value in Jupyter, it shows as an HTML table that fits the output area."""
    rows = rows.get("kernels", rows)
    header = ["kernel"] + [h for _, h in COLUMNS] + [f"loop {h}" for _, h in LOOP_COLUMNS] + ["FFMA share"]
    lines = [[name] + [f"{row[k]:,}" for k, _ in COLUMNS]
             + [f"{row['hot_loop'][k]:,}" for k, _ in LOOP_COLUMNS] + [f"{row['hot_loop']['ffma_fraction']:.2f}"]
             for name, row in rows.items()]
    return Table(header, lines)


def declared_floors():
    """{"module.kernel": floors} from every stage module's module-level FAST dictionary."""
    from attention_lib import stages
    floors = {}
    for info in pkgutil.iter_modules(stages.__path__):
        module = importlib.import_module(f"attention_lib.stages.{info.name}")
        for kernel, wanted in getattr(module, "FAST", {}).items():
            unknown = sorted(set(wanted) - set(FLOOR_KEYS))
            if unknown or not hasattr(module, kernel):
                raise ValueError(f"{info.name}.FAST[{kernel!r}]: unknown floors {unknown} or no such kernel; "
                                 f"floors are {FLOOR_KEYS}")
            floors[f"{info.name}.{kernel}"] = wanted
    return floors


def floor_violations(kernels, floors=None):
    """One line per declared floor a kernel breaks: 'flash.x: stack_bytes 1,088 > max_stack_bytes 0'."""
    floors = declared_floors() if floors is None else floors
    broken = []
    for name, wanted in sorted(floors.items()):
        if name not in kernels:
            broken.append(f"{name}: declared FAST but not in the report")
            continue
        row = kernels[name]
        checks = {"max_stack_bytes": ("stack_bytes", row["stack_bytes"], ">"),
                  "min_warps_per_sm": ("warps_per_sm", row["warps_per_sm"], "<"),
                  "min_ffma_fraction": ("hot-loop ffma_fraction", row["hot_loop"]["ffma_fraction"], "<")}
        for key, limit in wanted.items():
            figure, value, bad = checks[key]
            if (value > limit) if bad == ">" else (value < limit):
                broken.append(f"{name}: {figure} {value:,} {bad} {key} {limit:,}")
    return broken


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attention_lib.measure.kernel_report", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", default=DEFAULT_ARCH, help="GPU architecture for ptxas (default sm_90)")
    parser.add_argument("--json", type=Path, help="also write the report as JSON here")
    parser.add_argument("--no-cache", action="store_true", help="compile every kernel again, ignoring stored rows")
    options = parser.parse_args(argv)
    result = report(options.arch, cache=not options.no_cache)
    print(f"{options.arch}, GPU block sizes; warps per SM on an {H200.name}")
    print(table(result))
    if options.json:
        options.json.write_text(json.dumps(result, indent=1) + "\n")
    broken = floor_violations(result["kernels"])
    for line in broken:
        print("BELOW ITS FLOOR:", line)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
