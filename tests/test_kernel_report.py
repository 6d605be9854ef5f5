"""The kernel report: what ptxas and nvdisasm make of every kernel at GPU block sizes, and the
floors a stage module declares for its fast kernels (``FAST``).

The whole report is built once for the session (about 27 s of CPU time on the 2-core CI
machine, spread over two compile processes; most of it is Numba and ptxas compiling the larger
kernels), or read from the rows stored for this exact library source (``report_cache``, shared
with notebooks 01, 07 and 09); the parsing and occupancy arithmetic are checked on their own
against known inputs.
"""

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from attention_lib.measure import kernel_report, report_cache
from attention_lib.measure.kernel_cases import CASES
from attention_lib.stages import flash, projection

ROW_KEYS = {"signature", "registers", "stack_bytes", "spill_bytes", "shared_bytes", "dynamic_shared_bytes",
            "threads_per_block", "warps_per_sm", "hot_loop"}
LOOP_KEYS = {"ffma", "lds", "local", "ldg", "total", "ffma_fraction"}


@pytest.fixture(scope="session")
def report():
    return kernel_report.report()


NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def report_tables_in_markdown():
    """[(notebook, header)] for every markdown table with a `registers` column: compiler figures typed
    into a notebook's text, header the lower-cased column names."""
    tables = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for block in re.findall(r"(?:^\|.*\|[ \t]*\n?)+", cell.source, re.MULTILINE):
                header = [c.strip().lower() for c in block.strip().splitlines()[0].strip().strip("|").split("|")]
                if "registers" in header:
                    tables.append((path.name, header))
    return tables


def test_no_notebook_types_compiler_figures_in_a_table():
    """Compiler figures are printed from the report (kernel_report.table), never typed into markdown,
    where they would drift from what the compiler says."""
    assert report_tables_in_markdown() == []


def test_a_typed_table_of_compiler_figures_is_found(tmp_path, monkeypatch):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "Kernel 2's figures:\n\n| kernel | registers | stack |\n|---|---|---|\n| v2 | 60 | 1,088 |\n")])
    nbformat.write(notebook, tmp_path / "07_typed.ipynb")
    monkeypatch.setattr(sys.modules[__name__], "NOTEBOOKS", tmp_path)
    assert report_tables_in_markdown() == [("07_typed.ipynb", ["kernel", "registers", "stack"])]


def test_every_kernel_has_a_row_in_the_documented_shape(report):
    assert report["arch"] == "sm_90"
    assert sorted(report["kernels"]) == sorted(CASES)
    for name, row in report["kernels"].items():
        assert set(row) == ROW_KEYS, name
        assert set(row["hot_loop"]) == LOOP_KEYS, name
        assert all(isinstance(row[k], int) for k in ROW_KEYS - {"signature", "hot_loop"}), name
        assert row["registers"] > 0 and row["threads_per_block"] > 0, name
        loop = row["hot_loop"]
        assert loop["total"] >= loop["ffma"] + loop["lds"] + loop["local"] + loop["ldg"], name
        assert loop["ffma_fraction"] == pytest.approx(loop["ffma"] / loop["total"], abs=1e-4), name
    json.dumps(report)                                   # what --json writes


def test_signatures_are_the_launchers_types_as_numba_prints_them(report):
    # flash_attention_kernel_v*(q, k, v, scale, causal, window, group, out, lse): (BH, T, d) float32
    # arrays (k and v (BH_kv, T, d)), window and group int32, lse (BH, T)
    assert report["kernels"]["flash.flash_attention_kernel_v2"]["signature"] == [
        "array(float32, 3d, C)"] * 3 + ["float32", "bool", "int32", "int32", "array(float32, 3d, C)",
                                        "array(float32, 2d, C)"]


def test_block_sizes_and_shared_memory_are_the_gpu_configurations(report):
    row = report["kernels"]["flash.flash_attention_kernel_v2"]
    assert row["threads_per_block"] == flash.BLOCK_Q_GPU        # one thread per query of the tile
    # Static shared memory: the q, k and v tiles of MAX_D float32 each (flash.py's comment).
    assert row["shared_bytes"] == (flash.BLOCK_Q_GPU + 2 * flash.BLOCK_K) * flash.MAX_D * 4
    assert report["kernels"]["softmax.softmax_kernel_v2"]["threads_per_block"] == 128
    # flash v3's grouped kernel declares none: its case's 2 slices take the dynamic bytes its launch asks.
    grouped_name = "flash.flash_attention_kernel_v3_grouped"
    grouped = report["kernels"][grouped_name]
    assert grouped["shared_bytes"] == 0 and grouped["threads_per_block"] == 2 * flash.THREADS_V3
    assert grouped["dynamic_shared_bytes"] == 4 * flash.v3_shared_words(flash.HEAD, 2)
    assert all(row["dynamic_shared_bytes"] == 0 for name, row in report["kernels"].items() if name != grouped_name)


def test_warps_per_sm_follow_from_the_row(report):
    for name, row in report["kernels"].items():
        assert row["warps_per_sm"] == kernel_report.warps_per_sm(
            row["registers"], row["shared_bytes"] + row["dynamic_shared_bytes"], row["threads_per_block"]), name


def test_local_arrays_indexed_at_run_time_are_a_stack_frame(report):
    """Notebook 07's point: flash v1 keeps q and acc in cuda.local.array indexed by range(d_k),
    which ptxas places in local memory; projection v3's scalar accumulators need none."""
    assert report["kernels"]["flash.flash_attention_kernel_v1"]["stack_bytes"] >= 2 * flash.MAX_D * 4
    assert report["kernels"]["projection.projection_kernel_v3"]["stack_bytes"] == 0


def test_a_few_kernels_by_name_give_the_same_rows(report):
    """Compiled afresh, without the stored rows: the cached report is what the compiler says now."""
    name = "projection.projection_kernel_v3"
    fresh = kernel_report.report(names=[name], cache=False)
    assert fresh == {"arch": "sm_90", "kernels": {name: report["kernels"][name]}}


def test_stored_rows_are_found_only_for_the_same_library(tmp_path, monkeypatch):
    rows = {"flash.a": {"registers": 40}, "flash.b": {"registers": 72}}
    store = report_cache.RowCache("sm_90", tmp_path)
    with store.locked():
        assert store.load(list(rows)) == {}
        store.save(rows)
    assert store.load(["flash.a", "flash.b", "flash.c"]) == rows
    assert report_cache.RowCache("sm_80", tmp_path).load(list(rows)) == {}
    monkeypatch.setattr(report_cache, "library_fingerprint", lambda: "an edited library")
    assert store.load(list(rows)) == {}
    (tmp_path / next(p.name for p in tmp_path.glob("flash.a-*.json"))).write_text("{half a row")
    monkeypatch.undo()
    assert store.load(list(rows)) == {"flash.b": rows["flash.b"]}


def test_the_fingerprint_follows_the_library_source():
    files = sorted(report_cache.PACKAGE.rglob("*.py"))
    assert report_cache.PACKAGE / "stages" / "flash.py" in files and len(files) > 30
    assert re.fullmatch(r"[0-9a-f]{64}", report_cache.library_fingerprint())


def test_bad_names_and_architectures_are_refused():
    with pytest.raises(ValueError, match=r"names: no case in kernel_cases.CASES for \['flash.nope'\]"):
        kernel_report.report(names=["flash.nope"])
    with pytest.raises(ValueError, match="arch must name a GPU architecture such as 'sm_90', got '90'"):
        kernel_report.report(arch="90")


def test_declared_floors_hold(report):
    assert kernel_report.floor_violations(report["kernels"]) == []


def test_a_broken_floor_names_the_kernel_and_the_figure(report, monkeypatch):
    monkeypatch.setattr(flash, "FAST", {"flash_attention_kernel_v2": {
        "max_stack_bytes": 0, "min_warps_per_sm": 16, "min_ffma_fraction": 0.5}}, raising=False)
    monkeypatch.setattr(projection, "FAST", {"projection_kernel_v3": {"max_stack_bytes": 0}}, raising=False)
    broken = kernel_report.floor_violations(report["kernels"])
    row = report["kernels"]["flash.flash_attention_kernel_v2"]
    assert broken == [
        f"flash.flash_attention_kernel_v2: stack_bytes {row['stack_bytes']:,} > max_stack_bytes 0",
        f"flash.flash_attention_kernel_v2: warps_per_sm {row['warps_per_sm']:,} < min_warps_per_sm 16",
        f"flash.flash_attention_kernel_v2: hot-loop ffma_fraction {row['hot_loop']['ffma_fraction']:,} "
        "< min_ffma_fraction 0.5",
    ]


def test_a_misspelt_floor_is_refused(monkeypatch):
    monkeypatch.setattr(flash, "FAST", {"flash_attention_kernel_v2": {"max_stack": 0}}, raising=False)
    with pytest.raises(ValueError, match=r"flash.FAST\['flash_attention_kernel_v2'\].*max_stack"):
        kernel_report.declared_floors()


def test_table_has_a_line_per_kernel(report):
    text = kernel_report.table(report)
    lines = text.splitlines()
    assert len(lines) == 1 + len(report["kernels"])
    assert lines[0].split()[:3] == ["kernel", "regs", "stack"]
    v2 = next(line for line in lines if line.startswith("flash.flash_attention_kernel_v2 "))
    row = report["kernels"]["flash.flash_attention_kernel_v2"]
    assert v2.split()[1:8] == [f"{row[k]:,}" for k in ("registers", "stack_bytes", "spill_bytes", "shared_bytes",
                                                      "dynamic_shared_bytes", "threads_per_block", "warps_per_sm")]


# ---- the pieces, on known inputs ----

@pytest.mark.parametrize("registers, shared, threads, warps", [
    (72, 32768, 32, 6),      # shared memory: 228 KB / (32 KB + 1 KB reserved) = 6 blocks of one warp
    (48, 4096, 256, 40),     # registers: 48 x 32 = 1,536 a warp, 10 warps per quarter SM = 5 blocks of 8
    (40, 0, 32, 32),         # blocks: at most 32 per SM, however small
    (64, 0, 256, 32),        # the calculator's 50 % for 64 registers
    (32, 0, 1024, 64),       # full: 2 blocks of 32 warps
    (255, 0, 1024, 0),       # 256 registers x 1,024 threads do not fit in one SM's 65,536
    (33, 0, 128, 48),        # 33 registers count as 40
])
def test_warps_per_sm_as_the_occupancy_calculator(registers, shared, threads, warps):
    assert kernel_report.warps_per_sm(registers, shared, threads) == warps


PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6kernel' for 'sm_90'
ptxas info    : Function properties for _Z6kernel
    1088 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 72 registers, used 1 barriers, 1088 bytes cumulative stack size, 32768 bytes smem, 400 bytes cmem[0]
"""


def test_ptxas_output_is_read():
    assert kernel_report.parse_ptxas(PTXAS) == {
        "registers": 72, "stack_bytes": 1088, "spill_bytes": 8, "shared_bytes": 32768}
    no_shared = PTXAS.replace(", 32768 bytes smem", "")
    assert kernel_report.parse_ptxas(no_shared)["shared_bytes"] == 0


SASS = """
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
.L_x_0:
        /*0010*/                   LDS.128 R8, [R4] ;
        /*0020*/                   FFMA R0, R8, R9, R0 ;
.L_x_1:
        /*0030*/                   LDL R5, [R1] ;
        /*0040*/                   FFMA R0, R5, R5, R0 ;
        /*0050*/                   FFMA R0, R5, R5, R0 ;
        /*0060*/                   FFMA R0, R5, R5, R0 ;
        /*0070*/                   STL [R1], R0 ;
        /*0080*/               @P0 BRA `(.L_x_1) ;
        /*0090*/              @!P1 BRA `(.L_x_0) ;
        /*00a0*/                   EXIT ;
.L_x_2:
        /*00b0*/                   BRA `(.L_x_2);
"""


def _numbered(lines):
    """SASS as nvdisasm prints it, from opcodes and labels: addresses 0x10 apart."""
    out, address = [], 0
    for line in lines:
        if line.endswith(":"):
            out.append(line)
        else:
            out.append(f"        /*{address:04x}*/                   {line} ;")
            address += 16
    return "\n".join(out)


def test_the_hot_loop_is_the_body_with_the_most_ffma_without_its_inner_loops():
    # Inner loop 0x30-0x80: 3 FFMA of 6; the outer loop's own body (0x10, 0x20, 0x90) has 1.
    assert kernel_report.hot_loop(SASS) == {
        "ffma": 3, "lds": 0, "local": 2, "ldg": 0, "total": 6, "ffma_fraction": 0.5}
    outer_heavier = _numbered([
        ".L_x_0:", "LDS.128 R8, [R4]", *["FFMA R0, R8, R9, R0"] * 4,
        ".L_x_1:", "LDL R5, [R1]", *["FFMA R0, R5, R5, R0"] * 3, "@P0 BRA `(.L_x_1)",
        "@!P1 BRA `(.L_x_0)", "EXIT"])
    assert kernel_report.hot_loop(outer_heavier) == {
        "ffma": 4, "lds": 1, "local": 0, "ldg": 0, "total": 6, "ffma_fraction": round(4 / 6, 4)}


def test_code_without_a_loop_is_counted_whole():
    straight = "\n".join(line for line in SASS.splitlines() if "BRA" not in line)
    assert kernel_report.hot_loop(straight) == {
        "ffma": 4, "lds": 1, "local": 2, "ldg": 1, "total": 9, "ffma_fraction": round(4 / 9, 4)}


def test_tools_come_from_the_installed_wheels():
    for name in ("ptxas", "nvdisasm"):
        path = kernel_report.tool(name)
        assert "nvidia" in path and path.endswith(name)
    with pytest.raises(FileNotFoundError, match="compile extra"):
        kernel_report.tool("no-such-tool")


def test_tools_come_from_the_path_where_no_wheel_has_them(tmp_path, monkeypatch):
    # A GPU machine's Python without NVIDIA's compiler wheels, its CUDA toolkit on the PATH.
    monkeypatch.setitem(sys.modules, "nvidia", None)             # `import nvidia` now fails
    for name in ("ptxas", "nvdisasm"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert kernel_report.tool("ptxas") == str(tmp_path / "ptxas")
    assert kernel_report.tool("nvdisasm") == str(tmp_path / "nvdisasm")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError) as missing:
        kernel_report.tool("ptxas")
    message = str(missing.value)
    assert "\n" not in message and message.startswith("ptxas is neither in the installed NVIDIA wheels nor on the PATH")
    assert "pip install -e '.[compile]'" in message and "CUDA toolkit" in message


# ---- one kernel, written as in a notebook ----

NOTEBOOK = '''
import json
import numpy as np
import attention_lib
from numba import cuda
from attention_lib.measure import kernel_report, report_cache
from attention_lib.stages import flash
from attention_lib.stages.flash import visible_keys as visible   # a library device function, renamed
from numba import float32

WIDTH = 4                    # a module constant: the local array's size
SCALE = np.float32(0.5)


@cuda.jit(device=True)
def scaled(x):
    return x * SCALE


@cuda.jit
def visible_scaled(out, t_q, t_k, causal):
    i = cuda.grid(1)
    if i < out.shape[0]:
        acc = cuda.local.array(WIDTH, float32)
        for w in range(WIDTH):                       # constant trip count: acc fits in registers
            acc[w] = scaled(np.float32(w))
        out[i] = flash.visible_keys(i, t_q, t_k, causal) + acc[WIDTH - 1] + 0 * visible(i, t_q, t_k, causal)


out = np.zeros(19, np.float32)
visible_scaled[1, 32](out, 19, 23, True)             # it runs here, on the simulator
assert out[0] == 5 + 1.5 and out[18] == 23 + 1.5, out
row = kernel_report.report_kernel(visible_scaled, ["array(float32, 1d, C)", "int64", "int64", "bool"], 64)
print(json.dumps(row))
'''


def test_report_kernel_compiles_a_notebooks_kernel(tmp_path):
    """A kernel defined in the running program (as in a notebook cell), calling a library
    device function, a device function of its own and module constants."""
    script = tmp_path / "notebook.py"
    script.write_text(textwrap.dedent(NOTEBOOK))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(row) == ROW_KEYS
    assert row["signature"] == ["array(float32, 1d, C)", "int64", "int64", "bool"]
    assert row["threads_per_block"] == 64 and row["stack_bytes"] == 0
    assert row["warps_per_sm"] == kernel_report.warps_per_sm(row["registers"], 0, 64)
