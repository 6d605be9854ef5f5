"""The prepared GPU run (scripts/gpu_check.sh, make gpu-check) and what it relies on, without a GPU.

The script runs here end to end with --simulate: every step on the simulator at small sizes,
the bundle's install path exercised with a bundle of one tiny wheel, the notebooks' runner on
small notebooks of its own (notebooks 07 and 09 themselves are executed by nbval in `make
test`). A second run, beside the first, proves what a time budget or a failure leaves: pytest's
JUnit XML after SIGINT, a notebook's executed copy up to the cell that was stopped, the next
notebook still run. Then --dry-run (the steps, the test list, under 8 minutes), the interpreter
it refuses, the bundle's closure, the bench's JSON lines and shared references, and the launch
recorder's stream and dynamic shared memory.
"""

import base64
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook
from numba import cuda, float32

from attention_lib import reference
from attention_lib.measure import bench, bench_cases, recording
from attention_lib.platform import runtime

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
UNDER_EIGHT_MINUTES = 480


def _module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _environment(**variables):
    """This environment without pytest's own variables (the check runs a pytest of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GPU_CHECK_"))}
    return {**env, "PYTHON": sys.executable, **variables}


def _wheel(folder, name, version, module_source):
    """A pure-Python wheel of one module, made by hand (what pip needs: METADATA, WHEEL, RECORD)."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}.py": module_source,
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}.dist-info/RECORD"] = "\n".join(record + [f"{dist}.dist-info/RECORD,,"]) + "\n"
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for inside, text in files.items():
            wheel.writestr(inside, text)
    return path


def _notebook(path, *sources):
    nbformat.write(new_notebook(cells=[new_code_cell(s) for s in sources]), path)
    return path


def _run(arguments, env, **kwargs):
    return subprocess.Popen(["bash", str(SCRIPT), *arguments], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


# Seconds the two steps that outlast their budgets get (see `runs`).
STOP_BUDGET = 30


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs of gpu_check.sh --simulate, side by side (one mostly waits on its budgets):
    "whole", every step with a bundle; "stopped", a test file and notebooks that fail or
    outlast their budgets. {name: (exit status, output, folder, scratch)}."""
    scratch = tmp_path_factory.mktemp("gpu-check")
    bundle = scratch / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    _wheel(bundle / "wheels", "gpu-check-probe", "1.0", 'WHERE = "from the bundle"\n')
    (bundle / "requirements.txt").write_text("# a bundle of one wheel\ngpu-check-probe==1.0\n")
    whole_notebook = _notebook(scratch / "ok_banner.ipynb", "import attention_lib\nprint(attention_lib.banner())",
                               "import sys, gpu_check_probe\nprint(sys.executable)\nprint(gpu_check_probe.WHERE)")
    slow_tests = scratch / "test_outlasts_its_budget.py"
    slow_tests.write_text("import time\n\ndef test_quick():\n    pass\n\ndef test_slow():\n    time.sleep(600)\n")
    stopped_notebooks = [_notebook(scratch / "raises_error.ipynb", "print('before')", "raise ValueError('planted')"),
                         _notebook(scratch / "sleeps_long.ipynb", "print('first')", "import time\ntime.sleep(600)"),
                         _notebook(scratch / "after_both.ipynb", "print(6 * 7)")]
    # The two budgets that run out are far above what reaching the sleep takes (pytest collecting and
    # running test_quick, a kernel running the first cell: a few seconds, some ten on a machine busy
    # with other work), so the stop always finds them there: the verdict does not depend on the load.
    # The "whole" run beside this one takes about as long.
    stopped = _run(["--simulate", "--out", str(scratch / "stopped"),
                    "--only", "unit-tests,notebook-raises,notebook-sleeps,notebook-after",
                    "--budget", f"unit-tests={STOP_BUDGET}", "--budget", f"notebook-sleeps={STOP_BUDGET}"],
                   # pytest's exit after SIGINT (its report written) took over the 5 s grace on a loaded
                   # 2-core machine: the test gives it 30, for the exit status to be the budget's.
                   _environment(GPU_CHECK_TESTS=str(slow_tests), GPU_CHECK_GRACE="30",
                                GPU_CHECK_NOTEBOOKS=" ".join(str(p) for p in stopped_notebooks)))
    # The budgets are the GPU machine's; here, on two cores busy with other tests (and the kernel
    # report compiled from nothing when no earlier test stored its rows), steps may take longer.
    roomy = [part for step in ("install", "environment", "kernel-report") for part in ("--budget", f"{step}=150")]
    whole = _run(["--simulate", "--bundle", str(bundle), "--out", str(scratch / "whole"), *roomy],
                 _environment(GPU_CHECK_NOTEBOOKS=str(whole_notebook), GPU_CHECK_TESTS="tests/test_reference.py"))
    found = {}
    for name, process in (("whole", whole), ("stopped", stopped)):
        output, _ = process.communicate(timeout=300)
        found[name] = (process.returncode, output, scratch / name, scratch)
    return found


def _summary(folder):
    return json.loads((folder / "summary.json").read_text())


def test_the_simulated_run_passes_every_step_and_says_so(runs):
    status, output, folder, _ = runs["whole"]
    assert status == 0, output
    summary = _summary(folder)
    assert [s["step"] for s in summary["steps"]] == ["install", "environment", "unit-tests", "kernel-report",
                                                     "notebook-ok", "bench"]
    assert all(s["ok"] and s["exit_status"] == 0 and not s["over_budget"] for s in summary["steps"]), summary["steps"]
    assert all(0 <= s["seconds"] <= s["budget_s"] for s in summary["steps"])
    assert summary["all_ok"] is True and summary["mode"] == "simulate" and summary["backend"] == "simulator"
    assert summary["interpreter"] == sys.executable
    assert summary["gpu"].startswith("not asked: --simulate")                      # no nvidia-smi here
    assert summary["problems"] == [] and summary["numba_patches"]["missing"] == []
    assert summary["imports"]["nbclient"] == summary["imports"]["greenlet"] == "ok"
    assert "(0 step(s) not ok)" in output.splitlines()[-1]
    assert (folder / "interpreter.txt").read_text().split() == [sys.executable, "%d.%d" % sys.version_info[:2],
                                                               "simulate"]


def test_the_bundle_is_installed_beside_the_interpreters_packages_and_seen_by_every_step(runs):
    _, _, folder, scratch = runs["whole"]
    assert "Successfully installed gpu-check-probe-1.0" in (folder / "install.log").read_text()
    seen = json.loads((folder / "environment.json").read_text())["bundle"]
    assert seen["gpu-check-probe"]["version"] == "1.0"
    location = Path(seen["gpu-check-probe"]["location"])
    assert location.name == "site" and not location.is_relative_to(ROOT) and not location.is_relative_to(scratch)
    assert not location.exists()                                 # the run's scratch folder is removed
    executed = nbformat.read(folder / "notebooks" / "ok_banner.ipynb", as_version=4)   # the kernel saw it too
    printed = "".join(o.get("text", "") for cell in executed.cells for o in cell.outputs)
    assert printed.startswith("Kernels run on Numba's CUDA simulator")
    assert f"{sys.executable}\nfrom the bundle\n" in printed


def test_the_simulated_run_writes_the_tests_xml_the_kernel_report_and_the_bench_lines(runs):
    _, _, folder, _ = runs["whole"]
    suite = ElementTree.parse(folder / "unit-tests.xml").getroot().find("testsuite")
    assert int(suite.get("tests")) >= 10 and suite.get("failures") == suite.get("errors") == "0"
    assert {c.get("classname") for c in suite.iter("testcase")} == {"tests.test_reference"}
    report = json.loads((folder / "kernel_report.json").read_text())
    assert report["arch"] == "sm_90" and "flash.flash_attention_kernel_v3" in report["kernels"]
    lines = [json.loads(line) for line in (folder / "bench" / "bench-simulator.jsonl").read_text().splitlines()]
    assert lines[0]["kind"] == "start" and lines[0]["sizes"] == {"B": 1, "H": 2, "T": 16, "d_k": 8, "d_model": 16}
    assert lines[-1]["kind"] == "end" and set(lines[-1]["files"]) == {"json", "png", "jsonl"}
    entries = lines[1:-1]
    assert [e["name"] for e in entries] == [e.name for e in bench.REGISTRY]
    assert all(e["kind"] == "kernel" and e["check"]["ok"] and e["formula_matches"] is not False for e in entries)
    assert json.loads((folder / "bench" / "bench-simulator.json").read_text())["kernels"] == [
        {k: v for k, v in e.items() if k != "kind"} for e in entries]
    files = _summary(folder)["files"]
    assert {"environment.json", "unit-tests.xml", "kernel_report.json", "notebooks/ok_banner.ipynb",
            "bench/bench-simulator.jsonl", "bench/roofline-simulator.png", "steps.tsv"} <= set(files)
    assert {f"{step}.log" for step in ("install", "environment", "unit-tests", "kernel-report", "notebook-ok",
                                      "bench")} <= set(files)


def test_a_step_out_of_time_still_writes_its_report_and_the_next_steps_run(runs):
    status, output, folder, _ = runs["stopped"]
    assert status == 1, output
    steps = {s["step"]: s for s in _summary(folder)["steps"]}
    assert list(steps) == ["unit-tests", "notebook-raises", "notebook-sleeps", "notebook-after"]
    assert steps["unit-tests"]["exit_status"] == 124 and steps["unit-tests"]["over_budget"] is True
    cases = {c.get("name") for c in ElementTree.parse(folder / "unit-tests.xml").getroot().iter("testcase")}
    assert "test_quick" in cases                                 # pytest wrote its report after SIGINT
    assert steps["notebook-raises"]["exit_status"] == 1 and not steps["notebook-raises"]["over_budget"]
    assert "FAILED: ValueError: planted" in (folder / "notebook-raises.log").read_text()
    raised = nbformat.read(folder / "notebooks" / "raises_error.ipynb", as_version=4)
    assert raised.cells[0].outputs[0]["text"] == "before\n" and raised.cells[1].outputs[0]["ename"] == "ValueError"
    assert steps["notebook-sleeps"]["exit_status"] == 124 and steps["notebook-sleeps"]["over_budget"] is True
    assert "STOPPED" in (folder / "notebook-sleeps.log").read_text()
    slept = nbformat.read(folder / "notebooks" / "sleeps_long.ipynb", as_version=4)
    assert slept.cells[0].outputs[0]["text"] == "first\n"       # the copy holds the cells run before the stop
    assert steps["notebook-after"]["ok"] is True                 # run after a failure and a stop
    after = nbformat.read(folder / "notebooks" / "after_both.ipynb", as_version=4)
    assert after.cells[0].outputs[0]["text"] == "42\n"
    assert re.search(rf"^unit-tests\s+\d+s of\s+{STOP_BUDGET}s  out of time", output, re.M)


# --- What it plans: --dry-run, the interpreter, make gpu-check ------------------------------

def _dry_run(*arguments, **variables):
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", *arguments], cwd=ROOT, capture_output=True, text=True,
                          env=_environment(**variables), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _make_unit_tests():
    planned = subprocess.run(["make", "-n", "-C", str(ROOT), "unit", "VENV=/nonexistent"], capture_output=True,
                             text=True, timeout=60, env=_environment(PATH="/usr/bin:/bin")).stdout
    line = next(line for line in planned.splitlines() if " -m pytest " in line)
    return [word for word in line.split() if word.startswith("tests/")]


def test_the_dry_run_lists_every_step_within_eight_minutes_on_the_gpu_machines_python():
    header, tests, *steps, total = _dry_run()
    assert header == f"mode gpu, interpreter {sys.executable} (Python {'%d.%d' % sys.version_info[:2]}), notebooks: 07 08 10"
    names = [line.split()[0] for line in steps]
    assert names == ["install", "environment", "unit-tests", "kernel-report", "notebook-07", "notebook-08", "notebook-10", "bench"]
    budgets = [int(line.split()[1].rstrip("s")) for line in steps]
    grace = int(re.search(r"with (\d+)s to stop each step", total).group(1))
    assert sum(budgets) + grace * len(budgets) < UNDER_EIGHT_MINUTES
    whole = sum(budgets) + grace * len(budgets)
    assert total == f"total budget: {whole}s with {grace}s to stop each step (under 8 minutes: yes)"
    listed = tests.split(": ", 1)[1].split()
    assert tests.startswith("tests (8 workers)")
    assert listed[:len(_make_unit_tests())] == _make_unit_tests()                  # make unit's list first
    assert {"tests/test_flash.py", "tests/test_gqa.py", "tests/test_kv_cache.py", "tests/test_backward.py"} <= set(listed)
    assert all((ROOT / f).is_file() for f in listed)
    commands = "\n".join(steps)
    assert re.search(r"pip install --no-index --find-links \S+ --no-deps --target", commands)
    assert all(f in commands for f in ("07_fused_attention.ipynb", "08_flashattention2.ipynb", "10_performance.ipynb"))
    assert "-u -m attention_lib.measure.bench --batch 8 --heads 12 --T 1024 --d-k 64" in commands
    assert "attention_lib.measure.kernel_report" in commands and "--junitxml=" in commands


def test_the_simulated_dry_run_uses_small_sizes_and_the_notebook_list_is_one_variable():
    header, tests, *steps, _ = _dry_run("--simulate", GPU_CHECK_NOTEBOOKS="00 03")
    assert header.startswith("mode simulate") and header.endswith("notebooks: 00 03")
    assert [line.split()[0] for line in steps if line.startswith("notebook-")] == ["notebook-00", "notebook-03"]
    assert "--batch 1 --heads 2 --T 16 --d-k 8" in "\n".join(steps) and "pip install" not in "\n".join(steps)


def test_a_budget_can_be_changed_and_a_wrong_one_is_refused_in_one_line():
    *_, total = _dry_run("--budget", "bench=300")
    assert total.endswith("(under 8 minutes: NO)")
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--budget", "benchmark=3"], cwd=ROOT,
                          capture_output=True, text=True, env=_environment())
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1
    assert done.stderr.startswith("gpu_check.sh: --budget benchmark=3 must be STEP=SECONDS (at least 1) with a step "
                                  "of: install")


@pytest.mark.parametrize("prints, says", [("/usr/bin/python3.10 3.10", "is Python 3.10; the course needs 3.11 to 3.13"),
                                          (None, "does not run; set PYTHON to the GPU machine's python3")])
def test_an_interpreter_outside_3_11_to_3_13_is_refused_in_one_line(tmp_path, prints, says):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho '{prints}'\n" if prints else "#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          env=_environment(PYTHON=str(fake)))
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and says in done.stderr
    assert not (tmp_path / "run").exists()


def test_the_gpu_check_refuses_to_run_without_a_gpu(tmp_path):
    fake_bin = tmp_path / "bin"                                 # an nvidia-smi that finds no GPU
    fake_bin.mkdir()
    (fake_bin / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n")
    (fake_bin / "nvidia-smi").chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "run")], capture_output=True, text=True,
                          env={"PATH": f"{fake_bin}:/usr/bin:/bin", "PYTHON": sys.executable})
    assert done.returncode == 1 and "no NVIDIA GPU here" in done.stderr
    assert not (tmp_path / "run").exists()


def test_make_gpu_check_runs_the_script_with_the_python_it_names(tmp_path):
    planned = subprocess.run(["make", "-n", "-C", str(ROOT), "gpu-check", "PYTHON=/opt/some/python3",
                              "GPU_CHECK_FLAGS=--dry-run"], capture_output=True, text=True, timeout=60).stdout
    assert "/opt/some/python3 -c 'import sys; print(sys.executable)'" in planned
    assert re.search(r'PYTHON="/opt/some/python3" UNIT_TESTS="tests/test_reference\.py [^"]*" '
                     r'bash scripts/gpu_check\.sh --dry-run', planned)
    bundle = subprocess.run(["make", "-n", "-C", str(ROOT), "gpu-bundle", f"VENV={tmp_path / 'venv'}"],
                            capture_output=True, text=True, timeout=60).stdout
    assert "scripts/gpu_bundle.py gpu-bundle" in bundle
    assert "gpu-bundle/" in (ROOT / ".gitignore").read_text().splitlines()


def test_the_summary_lists_steps_and_files(tmp_path):
    (tmp_path / "steps.tsv").write_text("environment\t0\t2\t20\nbench\t124\t130\t130\n")
    (tmp_path / "environment.json").write_text(json.dumps({"mode": "gpu", "gpu": "NVIDIA H200", "versions": {}}))
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "bench-gpu.json").write_text("{}")
    summary = _module("gpu_check_environment").summary(tmp_path)
    assert summary["gpu"] == "NVIDIA H200"
    assert summary["steps"][1] == {"step": "bench", "exit_status": 124, "seconds": 130, "budget_s": 130,
                                   "ok": False, "over_budget": True}
    assert summary["all_ok"] is False and summary["total_budget_s"] == 150
    assert summary["files"] == ["bench/bench-gpu.json", "environment.json", "steps.tsv"]


def test_a_missing_package_is_named_in_one_line_each(tmp_path):
    # An interpreter whose nbclient and ipykernel are gone, as on the GPU machine without the bundle.
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    for module in ("nbclient", "ipykernel"):
        (blocked / f"{module}.py").write_text(f"raise ImportError(\"No module named '{module}'\")\n")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_check_environment.py"), "--preflight",
                           "--mode", "simulate", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env=_environment(PYTHONPATH=f"{blocked}{os.pathsep}{ROOT}", ATTENTION_LIB_BACKEND="simulator"))
    assert done.returncode == 1
    missing = [line for line in done.stdout.splitlines() if line.startswith("missing: ")]
    assert [line.split()[1] for line in missing] == ["nbclient", "ipykernel"]
    assert "for executing the notebooks" in missing[0] and "No module named 'nbclient'" in missing[0]
    record = json.loads((tmp_path / "environment.json").read_text())
    assert record["problems"] == missing and record["imports"]["nbformat"] == "ok"


# --- The bundle: what pip resolves for the GPU machine, less what its image holds -------------

def test_the_bundle_keeps_what_the_image_lacks_and_drops_what_only_its_packages_need():
    bundle = _module("gpu_bundle")
    resolved = {"nbclient": ("0.11.0", ["jupyter-client>=6", "traitlets>=5"]),
                "jupyter-client": ("8.10.0", ["python-dateutil>=2.8", "tornado>=6", "colorama; sys_platform == 'win32'",
                                              "importlib-metadata>=4; python_version < '3.10'"]),
                "traitlets": ("5.16.1", ["pytest; extra == 'test'"]),
                "tornado": ("6.6.1", []), "python-dateutil": ("4.0.0", ["tzdata"]), "tzdata": ("2026.6", []),
                "colorama": ("0.4.6", []), "importlib-metadata": ("8.0.0", [])}
    pins = bundle.closure(["nbclient>=0.10"], resolved, bundle.target_environment("3.12"),
                          image={"python-dateutil"})
    assert pins == {"nbclient": "0.11.0", "jupyter-client": "8.10.0", "traitlets": "5.16.1", "tornado": "6.6.1"}


def test_the_bundle_asks_for_the_courses_own_ranges_and_leaves_out_the_images_packages():
    bundle = _module("gpu_bundle")
    asked = bundle.course_requirements()
    assert [a.split(">")[0] for a in asked] == ["greenlet", "nbformat", "nbclient", "ipykernel"]
    assert "greenlet>=3.1,<4" in asked                           # pyproject.toml's range
    assert {"numpy", "numba", "numba-cuda", "pytest", "pytest-xdist", "torch", "matplotlib"} <= bundle.IMAGE_HAS
    assert not {"greenlet", "nbformat", "nbclient", "ipykernel"} & bundle.IMAGE_HAS


# --- The bench as the GPU run uses it ---------------------------------------------------------

TINY = bench.BenchSizes(B=1, H=2, T=7, d_k=5)


def test_the_bench_writes_each_entry_as_it_finishes(tmp_path, monkeypatch):
    finished = bench.bench_entry

    def stop_at_the_third(entry, *args, **kwargs):              # as a time budget's SIGINT would
        if entry.name == "scores v1":
            raise KeyboardInterrupt
        return finished(entry, *args, **kwargs)
    monkeypatch.setattr(bench, "bench_entry", stop_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        bench.run_bench(TINY, only=["projection v1", "projection v2", "scores"], out_dir=tmp_path,
                        count=True, timed=False, verbose=False)
    lines = [json.loads(line) for line in (tmp_path / f"bench-{runtime.BACKEND}.jsonl").read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["start", "kernel", "kernel"]
    assert [line["name"] for line in lines[1:]] == ["projection v1", "projection v2"]
    assert lines[0]["sizes"]["T"] == 7 and lines[1]["check"]["ok"] is True
    assert not (tmp_path / f"bench-{runtime.BACKEND}.json").exists()   # the whole file comes at the end only


def test_shared_references_are_the_references_computed_once():
    inputs = bench_cases.Inputs(bench.BenchSizes(B=2, H=3, T=9, d_k=4))
    q, k, v = inputs.get("q", "k", "v").values()
    by_name = {e.name: e for e in bench.REGISTRY}
    scores = inputs.reference(by_name["scores v1"], {})
    assert scores is inputs.reference(by_name["scores v2"], {})                    # one array, not a copy
    np.testing.assert_array_equal(scores, reference.scores(q, k))
    np.testing.assert_array_equal(inputs.reference(by_name["mask v2"], {}), reference.apply_causal_mask(scores))
    attention = inputs.reference(by_name["flash v3"], {})
    assert attention is inputs.reference(by_name["attention pipeline"], {})
    np.testing.assert_allclose(attention, reference.attention(q, k, v), rtol=1e-14, atol=0)
    masked = inputs.get("masked")["masked"]
    np.testing.assert_array_equal(masked, reference.apply_causal_mask(reference.scores(q, k)).astype(np.float32))
    np.testing.assert_array_equal(inputs.get("a")["a"], reference.softmax(masked).astype(np.float32))
    np.testing.assert_array_equal(inputs.reference(by_name["softmax v2"], {}), reference.softmax(masked))
    with pytest.raises(KeyError, match="no shared reference called 'nothing'"):
        inputs.shared("nothing")


@pytest.mark.parametrize("nbytes", [1, 300, 1 << 30])
def test_references_by_slices_equal_the_whole(nbytes):
    x = np.random.default_rng(3).standard_normal((5, 6, 4)).astype(np.float32)
    whole = reference.softmax(reference.apply_causal_mask(reference.scores(x, x)))
    sliced = bench_cases.by_slices(lambda a: reference.softmax(reference.apply_causal_mask(reference.scores(a, a))), x,
                                   nbytes=nbytes)
    assert sliced.dtype == np.float64 and sliced.shape == whole.shape
    np.testing.assert_array_equal(sliced, whole)


def _compare_in_one_pass(got, want, tol):
    """The comparison's definition on whole arrays (bench.compare computes it in steps)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    both_inf = np.isinf(want) & (got == want)
    with np.errstate(invalid="ignore"):
        error = np.where(both_inf, 0.0, np.abs(got - want))
    bound = np.where(np.isfinite(want), tol * (1 + np.abs(np.where(np.isfinite(want), want, 0))), 0.0)
    worst = float(np.nanmax(error)) if np.isfinite(error).any() else float("inf")
    return {"ok": bool(np.all(error <= bound)) and not np.isnan(got).any(), "max_abs_error": worst, "tolerance": tol}


def test_the_comparison_in_steps_is_the_comparison_in_one_pass(monkeypatch):
    monkeypatch.setattr(bench, "COMPARE_STEP", 7)              # steps end inside every case below
    rng = np.random.default_rng(7)
    for _ in range(400):
        size = int(rng.integers(0, 40))
        want = rng.standard_normal(size)
        got = (want + rng.standard_normal(size) * 10.0 ** rng.integers(-9, 0)).astype(np.float32)
        for j, kind in zip(rng.integers(0, max(size, 1), 3), rng.integers(0, 8, 3)):
            if size:
                want[j], got[j] = [(-np.inf, -np.inf), (-np.inf, 0.0), (want[j], np.nan), (want[j], np.inf),
                                   (np.nan, got[j]), (np.inf, np.inf), (np.inf, -np.inf), (want[j], got[j])][kind]
        if size and rng.integers(5) == 0:
            got[:] = np.nan
        with np.errstate(invalid="ignore"):
            assert bench.compare(got, want, 1e-5) == _compare_in_one_pass(got, want, 1e-5), (got, want)


# --- The launch recorder: a replay keeps each launch's whole configuration -------------------

@cuda.jit
def _rotate_through_dynamic_shared(out):
    """Each thread puts its index in dynamic shared memory and reads its neighbour's: a launch
    needs blockDim.x floats of it."""
    buffer = cuda.shared.array(0, float32)
    t = cuda.threadIdx.x
    buffer[t] = t
    cuda.syncthreads()                          # every index written before any is read
    out[t] = buffer[(t + 1) % cuda.blockDim.x]


@pytest.mark.skipif(not runtime.ON_SIMULATOR, reason="checks the simulator's replay of two configurations")
def test_a_replay_keeps_each_launchs_stream_and_dynamic_shared_memory():
    wide, narrow = cuda.to_device(np.zeros(32, np.float32)), cuda.to_device(np.zeros(16, np.float32))
    with recording.recording_launches() as launches:
        _rotate_through_dynamic_shared[1, 32, 0, 32 * 4](wide)
        _rotate_through_dynamic_shared[1, 16, 0, 16 * 4](narrow)
    assert [(l.stream, l.sharedmem) for l in launches] == [(0, 128), (0, 64)]
    assert launches[0].config == (1, 32, 0, 128)
    wide[:], narrow[:] = 0, 0
    recording.replay(launches)()
    np.testing.assert_array_equal(wide.copy_to_host(), (np.arange(32) + 1) % 32)
    np.testing.assert_array_equal(narrow.copy_to_host(), (np.arange(16) + 1) % 16)


def test_a_launch_without_stream_or_shared_memory_is_recorded_with_cudas_defaults():
    launch = recording.Launch.of("kernel", (4, 64), ())
    assert (launch.stream, launch.sharedmem, launch.config) == (0, 0, (4, 64, 0, 0))
    assert recording.Launch.of("kernel", (4, 64, "stream"), ()).config == (4, 64, "stream", 0)
