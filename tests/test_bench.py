"""The performance harness (attention_lib.measure.bench, bench_cases, traffic, notebook 10) on the simulator.

On the simulator the harness cannot time anything; it checks results and counts. These tests
run it at tiny, awkward sizes (T 7, d_k 5: no size a multiple of a tile) and check what it
reports: the JSON schema, results checked against the reference, counts equal to the formulas,
the roofline PNG, the GPU limits table, and that times are refused rather than made up. The GPU
path (amortised timing, PyTorch's pinned SDPA backends, the profiler's kernel names, wrong
results never timed) runs with a fake clock and a fake PyTorch, since the real ones need a GPU.
"""

import json
import subprocess
import sys
import types

import numpy as np
import pytest
from attention_lib.measure import bench, bench_cases, gpus
from attention_lib import reference
from attention_lib.platform import runtime
from attention_lib.stages import projection
from numba import cuda

TINY = bench.BenchSizes(B=1, H=2, T=7, d_k=5)      # d_model 10; every tile partly used
KERNEL_KEYS = {"name", "module", "notebook", "what", "launches", "blocks", "threads", "flops",
               "ideal_bytes", "intensity", "check", "time", "flop_per_s", "bytes_per_s", "counted", "formula",
               "formula_matches", "baselines", "notes"}
COUNTED_KEYS = {"global_loads", "global_stores", "global_atomics", "global_bytes", "shared_loads",
                "shared_stores", "intensity"}


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    """The whole registry at TINY, written to a temporary folder (about 10 s on the simulator)."""
    out = tmp_path_factory.mktemp("bench")
    return bench.run_bench(TINY, out_dir=out, count=True, timed=False, verbose=False), out


def test_every_registry_entry_runs_or_is_skipped_because_its_module_is_missing(tiny_results):
    results, _ = tiny_results
    assert results["failed"] == []
    names = [k["name"] for k in results["kernels"]] + [s["name"] for s in results["skipped"]]
    assert sorted(names) == sorted(e.name for e in bench.REGISTRY)
    assert all(s["reason"].endswith("does not exist") or " has no version " in s["reason"]
               for s in results["skipped"])
    assert {"projection v1", "projection v2", "projection v3"} <= {k["name"] for k in results["kernels"]}


def test_the_json_file_has_the_schema(tiny_results):
    results, out = tiny_results
    saved = json.loads((out / f"bench-{runtime.BACKEND}.json").read_text())
    assert saved["schema"] == bench.SCHEMA and saved["backend"] == runtime.BACKEND
    assert {"gpu", "limits", "date", "versions", "sizes", "timing", "kernels", "skipped", "failed",
            "targets", "notes", "files"} <= set(saved)
    assert saved["timing"] is None and (saved["gpu"] is None) == runtime.ON_SIMULATOR
    assert saved["sizes"] == {"B": 1, "H": 2, "T": 7, "d_k": 5, "d_model": 10}
    assert {"python", "numpy", "numba", "numba-cuda"} <= set(saved["versions"])
    assert saved["date"][:4].isdigit() and "T" in saved["date"]
    for kernel in saved["kernels"]:
        assert set(kernel) == KERNEL_KEYS, kernel["name"]
        assert set(kernel["counted"]) == COUNTED_KEYS, kernel["name"]
        assert kernel["launches"] and all({"kernel", "grid", "block", "dynamic_shared_bytes"} == set(l)
                                          for l in kernel["launches"])
        assert kernel["check"]["ok"] is True and kernel["check"]["max_abs_error"] <= kernel["check"]["tolerance"]
    assert bench.load_results(out / f"bench-{runtime.BACKEND}.json")["kernels"] == saved["kernels"]


def test_counts_equal_the_formulas_at_awkward_sizes(tiny_results):
    results, _ = tiny_results
    with_formula = [k for k in results["kernels"] if k["formula"] is not None]
    assert {"projection v1", "projection v2", "projection v3", "projection v4", "scores v2", "softmax v2",
            "softmax v3", "weighted_sum v1", "flash v2", "flash v3"} <= {k["name"] for k in with_formula}
    for k in with_formula:
        assert k["formula_matches"] is True, (k["name"], k["formula"], k["counted"])
    by_name = {k["name"]: k for k in results["kernels"]}
    v1, v2, v3 = (by_name[f"projection v{v}"] for v in (1, 2, 3))
    # rows 7, d_model 10, d_out 30: v1 reads x d_out times and w T times; v2 ceil(30/16) = 2
    # and 1; v3 ceil(30/32) = 1 and 1; all store each output once.
    assert v1["counted"]["global_loads"] == 7 * 10 * 30 + 10 * 30 * 7
    assert v2["counted"]["global_loads"] == 7 * 10 * 2 + 10 * 30
    assert v3["counted"]["global_loads"] == 7 * 10 + 10 * 30
    assert v1["flops"] == v2["flops"] == v3["flops"] == projection.flops(7, 10, 30)
    assert v3["threads"] == v2["threads"] // 2          # one 32 x 32 block against two 16 x 16
    # shared loads per multiply-add (d_model 10: one step of TILE = 16 along k, padding included)
    assert v2["counted"]["shared_loads"] / (v2["threads"] * projection.TILE) == 2
    assert v3["counted"]["shared_loads"] / (v3["threads"] * projection.TILE * 4) == 1
    # intensity = FLOPs / bytes: ideal for all three, counted rising from v1 to v3
    assert v1["intensity"] == v1["flops"] / v1["ideal_bytes"]
    assert v1["counted"]["intensity"] < v2["counted"]["intensity"] < v3["counted"]["intensity"]
    assert by_name["attention pipeline"]["launches"][0]["kernel"] == "causal_scores_kernel"
    assert len(by_name["attention pipeline"]["launches"]) == 3


ON_SIMULATOR_ONLY = pytest.mark.skipif(not runtime.ON_SIMULATOR, reason="what the simulator does instead of timing")


@ON_SIMULATOR_ONLY
def test_times_are_marked_unavailable_on_the_simulator(tiny_results):
    results, _ = tiny_results
    for k in results["kernels"]:
        assert k["time"] is None and k["flop_per_s"] is None and k["bytes_per_s"] is None
        assert bench.SIMULATOR_NO_TIMES in k["notes"]
    for target in results["targets"].values():
        assert target["ratio"] is None and target["met"] is None
    assert "times need a GPU" in bench.format_targets(results)


@ON_SIMULATOR_ONLY
def test_timing_is_refused_on_the_simulator():
    assert runtime.ON_SIMULATOR
    assert cuda.event().elapsed_time(cuda.event()) == -1       # the simulator's events record no time
    with pytest.raises(bench.TimingUnavailable, match="times need a GPU"):
        bench.NumbaClock()
    with pytest.raises(bench.TimingUnavailable, match="elapsed_time returns -1"):
        bench.time_launches([])
    with pytest.raises(bench.TimingUnavailable, match="times need a GPU"):
        bench.run_bench(TINY, only=["projection v3"], timed=True, write=False, verbose=False)


def test_the_roofline_png_is_written(tiny_results):
    results, out = tiny_results
    png = out / f"roofline-{runtime.BACKEND}.png"
    assert results["files"]["png"] == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("name, expected", [
    ("NVIDIA H200", "NVIDIA H200"),
    ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
    ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
    ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB"),
    ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB"),
    ("Tesla T4", "NVIDIA T4"),
    ("NVIDIA L4", "NVIDIA L4"),
    ("NVIDIA L40S", None),                 # not an L4: a different GPU, not in the table
    ("NVIDIA GeForce RTX 4090", None),
    (None, None),
])
def test_gpu_limits_lookup(name, expected):
    limits = bench.gpu_limits(name)
    assert (limits.name if limits else None) == expected


def test_h200_limits_and_ridge():
    h200 = bench.gpu_limits("NVIDIA H200")
    assert (h200.fp32_flop_per_s, h200.bytes_per_s) == (67e12, 4.8e12)
    assert round(h200.ridge, 1) == 14.0 and h200.tensor_flop_per_s == 989e12
    assert h200.attainable(1.0) == 4.8e12 and h200.attainable(100.0) == 67e12
    assert bench.REFERENCE_GPU is gpus.KNOWN_GPUS[0][1] and bench.device_name() is None


class FakeClock:
    """Stands in for CUDA events: each stop() returns the next of `times` (seconds)."""

    def __init__(self, times):
        self.times, self.starts = list(times), 0

    def start(self):
        self.starts += 1

    def stop(self):
        return self.times.pop(0)


class LaunchCostClock:
    """A GPU model: work() queues a kernel of `kernel_s`; Python needs `launch_s` per launch.

    Between two events the GPU can start the first kernel only once Python has queued it; after
    that, while a kernel runs longer than a launch takes, the next is queued in time. So one
    sample of n runs lasts launch_s + kernel_s + (n - 1) * max(kernel_s, launch_s).
    """

    def __init__(self, kernel_s, launch_s):
        self.kernel_s, self.launch_s, self.runs = kernel_s, launch_s, 0

    def work(self):
        self.runs += 1

    def start(self):
        self.runs = 0

    def stop(self):
        return self.launch_s + self.kernel_s + (self.runs - 1) * max(self.kernel_s, self.launch_s)


def test_measure_skips_the_warmup_and_reports_median_and_iqr():
    clock = FakeClock([9.0, 9.0, 7.0] + [1.0, 2.0, 3.0, 4.0, 100.0])
    timing = bench.measure(lambda: None, clock, warmup=2, repeats=5, max_seconds=1e9)
    assert timing["runs"] == 5 and clock.starts == 8 and timing["inner"] == 1 and timing["single_s"] == 7.0
    assert timing["median_s"] == 3.0 and (timing["q1_s"], timing["q3_s"]) == (2.0, 4.0)
    assert timing["iqr_s"] == 2.0 and (timing["min_s"], timing["max_s"]) == (1.0, 100.0)


def test_measure_stops_at_max_seconds_after_five_runs():
    clock = FakeClock([0.5] * 100)
    assert bench.measure(lambda: None, clock, warmup=0, repeats=50, max_seconds=1.0)["runs"] == 5


def test_back_to_back_launches_amortise_the_launch_overhead():
    # A 20 us kernel whose launch costs 30 us of Python: one launch between two events reads 50 us.
    clock = LaunchCostClock(kernel_s=20e-6, launch_s=30e-6)
    timing = bench.measure(clock.work, clock, warmup=1, repeats=5, max_seconds=1e9)
    assert timing["single_s"] == pytest.approx(50e-6)
    assert timing["inner"] == 100                                  # ceil(5 ms / 50 us)
    assert timing["median_s"] == pytest.approx(30e-6 + 20e-6 / 100)  # launch-bound: Python's pace
    slow = LaunchCostClock(kernel_s=2e-3, launch_s=30e-6)         # a 2 ms kernel hides its launches
    timing = bench.measure(slow.work, slow, warmup=1, repeats=5, max_seconds=1e9)
    assert timing["inner"] == 3 and timing["median_s"] == pytest.approx(2e-3 + 30e-6 / 3)
    assert bench.measure(slow.work, slow, warmup=0, repeats=5, max_seconds=1e9, inner=1)["median_s"] == \
        pytest.approx(2.03e-3)


def test_compare_accepts_rounding_and_refuses_the_rest():
    want = np.array([[1.0, -np.inf], [100.0, 0.0]])
    assert bench.compare(want + 1e-6, want, 1e-5)["ok"] is True
    assert bench.compare(want * (1 + 5e-6), want, 1e-5)["ok"] is True          # relative at 100
    assert bench.compare(want + [[0, 0], [0, 1e-3]], want, 1e-5)["ok"] is False
    assert bench.compare(np.where(np.isinf(want), 0.0, want), want, 1e-5)["ok"] is False   # -inf lost
    assert bench.compare(np.full_like(want, np.nan), want, 1e-5)["ok"] is False
    assert bench.compare(want[:1], want, 1e-5) == {"ok": False, "max_abs_error": None, "tolerance": 1e-5,
                                                  "error": "shape (1, 2), expected (2, 2)"}


def test_a_wrong_result_is_listed_as_failed_and_never_timed(monkeypatch, tmp_path):
    (good,) = [e for e in bench.REGISTRY if e.name == "projection v2"]
    off_by_one = bench_cases.Entry(**{**good.__dict__, "name": "projection v2 (wrong reference)",
                                      "reference": lambda i, s: reference.project(i["x"], i["w"]) + 1})
    monkeypatch.setattr(bench, "REGISTRY", [good, off_by_one])
    clock = FakeClock([0.006] * 20)
    results = bench.run_bench(TINY, count=False, clock=clock, libraries={}, warmup=1, repeats=5,
                              write=False, verbose=False)
    assert [k["name"] for k in results["kernels"]] == ["projection v2"]
    (failed,) = results["failed"]
    assert failed["name"] == "projection v2 (wrong reference)"
    assert failed["error"].startswith("WrongResult: output differs from the reference: max error 1.0")
    assert clock.times == [0.006] * (20 - 7)                    # only the good entry took samples


def test_rates_and_targets_with_a_fake_clock(tmp_path):
    # The GPU path's arithmetic, with a clock that says every replay took 6 ms.
    results = bench.run_bench(TINY, only=["projection v3"], out_dir=tmp_path, warmup=1, repeats=3,
                              count=False, clock=FakeClock([0.006] * 10), libraries={}, verbose=False)
    (k,) = results["kernels"]
    assert k["time"]["median_s"] == 0.006 and k["time"]["inner"] == 1 and k["counted"] is None
    assert k["flop_per_s"] == k["flops"] / 0.006 and k["bytes_per_s"] == k["ideal_bytes"] / 0.006
    assert "Benching" not in bench.format_table(results) and "projection v3" in bench.format_table(results)
    kernels = [{"name": "flash v2", "time": {"median_s": 1.0}, "baselines": {"torch_math": {"ratio": 1.25},
                                                                          "torch_efficient": {"ratio": 0.4}}},
               {"name": "attention pipeline", "time": {"median_s": 3.0}, "baselines": {}},
               {"name": "projection v2", "time": {"median_s": 1.0}, "baselines": {"torch": {"ratio": 0.3}}},
               {"name": "projection v3", "time": {"median_s": 1.0}, "baselines": {"torch": {"ratio": 0.6}}}]
    targets = bench.targets(kernels, bench.BenchSizes.of(runtime.ANDREA_120M), bench.REFERENCE_GPU)
    assert targets["flash_vs_sdpa_math"]["ratio"] == 1.25 and targets["flash_vs_sdpa_math"]["met"] is True
    assert targets["flash_vs_sdpa_efficient"]["ratio"] == 0.4 and targets["flash_vs_sdpa_efficient"]["met"] is None
    assert targets["flash_vs_pipeline"]["ratio"] == 3.0 and targets["flash_vs_pipeline"]["met"] is True
    assert targets["projection_vs_matmul"]["ratio"] == 0.6 and targets["projection_vs_matmul"]["met"] is True
    assert targets["projection_vs_matmul"]["at_course_sizes"] is True
    text = bench.format_targets({"backend": runtime.GPU, "targets": targets})
    assert "MATH backend (SGEMM + softmax): 1.25x, target >= 1x: met" in text
    assert "(3xTF32 tensor cores): 0.40x, reported" in text


# --- A fake PyTorch: enough of its surface for the SDPA and matmul baselines, on NumPy -------

class FakeTensor(np.ndarray):
    def cuda(self):
        return self

    def cpu(self):
        return self

    def numpy(self):
        return np.asarray(self)


class FakeTorch:
    """Records which SDPA backend each call ran under; each call "takes" 9 ms on its events."""

    def __init__(self):
        self.now, self.calls, self.active = 0.0, [], None
        torch = self
        self.version = types.SimpleNamespace(cuda="13.0")
        self.autograd = types.SimpleNamespace(DeviceType=types.SimpleNamespace(CUDA="cuda"))

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing, "timing events must be asked for"

            def record(self):
                self.at = torch.now

            def synchronize(self):
                pass

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        self.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)
        self.nn = types.SimpleNamespace(functional=types.SimpleNamespace(scaled_dot_product_attention=self._sdpa),
                                        attention=types.ModuleType("torch.nn.attention"))
        self.nn.attention.SDPBackend = types.SimpleNamespace(MATH="MATH", EFFICIENT_ATTENTION="EFFICIENT_ATTENTION")
        self.nn.attention.sdpa_kernel = self._sdpa_kernel
        self.profiler = types.ModuleType("torch.profiler")
        self.profiler.ProfilerActivity = types.SimpleNamespace(CUDA="cuda")
        self.profiler.profile = self._profile

    def from_numpy(self, a):
        return a.view(FakeTensor)

    def _sdpa(self, q, k, v, is_causal=False):
        self.now += 9e-3
        self.calls.append(self.active)
        return reference.attention(q, k, v, causal=is_causal).astype(np.float32).view(FakeTensor)

    def _sdpa_kernel(self, backend):
        torch = self

        class Pinned:
            def __enter__(self):
                torch.active = backend

            def __exit__(self, *exc):
                torch.active = None
        return Pinned()

    def _profile(self, activities):
        torch = self

        class Profile:
            def __enter__(self):
                self.first = len(torch.calls)
                return self

            def __exit__(self, *exc):
                pass

            def events(self):
                names = {"MATH": "sm80_xmma_gemm_f32f32", "EFFICIENT_ATTENTION": "fmha_cutlassF_f32_aligned_64x64_rf_sm80"}
                return [types.SimpleNamespace(name="aten::scaled_dot_product_attention", device_type="cpu")] + [
                    types.SimpleNamespace(name=names[b], device_type="cuda") for b in torch.calls[self.first:]]
        return Profile()


@pytest.fixture
def fake_torch(monkeypatch):
    torch = FakeTorch()
    for name, module in (("torch", torch), ("torch.nn", torch.nn), ("torch.nn.attention", torch.nn.attention),
                         ("torch.profiler", torch.profiler)):
        monkeypatch.setitem(sys.modules, name, module)
    return torch


def test_sdpa_runs_pinned_to_each_backend_checked_timed_and_named(fake_torch):
    results = bench.run_bench(TINY, only=["flash v2", "attention pipeline"], count=False, warmup=1, repeats=5,
                              clock=FakeClock([0.006] * 40), libraries={"torch": fake_torch}, write=False,
                              verbose=False)
    assert results["failed"] == []
    flash = {k["name"]: k for k in results["kernels"]}["flash v2"]
    assert set(flash["baselines"]) == {"torch_math", "torch_efficient"}
    assert set(fake_torch.calls) == {"MATH", "EFFICIENT_ATTENTION"}          # never the default choice
    math_peer, efficient = flash["baselines"]["torch_math"], flash["baselines"]["torch_efficient"]
    assert math_peer["check"]["ok"] and efficient["check"]["ok"]
    assert math_peer["median_s"] == pytest.approx(9e-3) and math_peer["ratio"] == pytest.approx(1.5)
    assert efficient["cuda_kernels"] == ["fmha_cutlassF_f32_aligned_64x64_rf_sm80"]
    assert math_peer["cuda_kernels"] == ["sm80_xmma_gemm_f32f32"]
    assert results["targets"]["flash_vs_sdpa_math"]["ratio"] == pytest.approx(1.5)
    assert results["targets"]["flash_vs_pipeline"]["ratio"] == pytest.approx(1.0)
    assert results["versions"]["torch_cuda"] == "13.0" and "3xTF32" in results["timing"]["sdpa_backends"]
    table = bench.format_table(results)
    assert "vs torch_math" in table and "torch_efficient ran: fmha_cutlassF_f32_aligned_64x64_rf_sm80" in table


def test_a_baseline_with_a_wrong_result_is_flagged(fake_torch, monkeypatch):
    monkeypatch.setattr(fake_torch.nn.functional, "scaled_dot_product_attention",
                        lambda q, k, v, is_causal=False: fake_torch._sdpa(q, k, v, is_causal=not is_causal))
    results = bench.run_bench(TINY, only=["flash v2"], count=False, warmup=0, repeats=5,
                              clock=FakeClock([0.006] * 20), libraries={"torch": fake_torch}, write=False,
                              verbose=False)
    (flash,) = results["kernels"]
    assert flash["check"]["ok"] is True and flash["baselines"]["torch_math"]["check"]["ok"] is False


def test_the_gpu_path_imports_nothing_it_does_not_have(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)               # as if PyTorch were not installed
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert bench_cases.baseline_libraries() == {}
    out = capsys.readouterr().out
    assert "note: no PyTorch comparison" in out and "note: no CuPy comparison" in out
    # A fresh Python in which PyTorch and CuPy cannot be imported imports the whole harness.
    blocked = "import sys; sys.modules['torch'] = sys.modules['cupy'] = None; "
    imports = "import attention_lib.measure.bench, attention_lib.measure.bench_cases, attention_lib.measure.traffic, attention_lib.plotting"
    subprocess.run([sys.executable, "-c", blocked + imports], check=True)


def test_a_missing_module_is_skipped_with_a_note(monkeypatch, tmp_path, capsys):
    ghost = bench_cases.Entry("ghost v1", "no_such_stage", "10", "nothing", None, lambda s: 1, lambda s: 1)
    monkeypatch.setattr(bench, "REGISTRY", [ghost])
    results = bench.run_bench(TINY, out_dir=tmp_path)
    assert results["kernels"] == [] and results["skipped"] == [
        {"name": "ghost v1", "reason": "attention_lib.stages.no_such_stage does not exist"}]
    assert "ghost v1             skipped: attention_lib.stages.no_such_stage does not exist" in capsys.readouterr().out


def test_recording_launches_records_every_launch_and_restores_the_kernel_class(rng):
    from attention_lib.stages import basics
    cls = type(basics.add_kernel)
    before = cls.__getitem__
    x = rng.standard_normal(70)
    with bench.recording_launches() as launches:
        got = basics.add(x, x)
    assert cls.__getitem__ is before
    assert np.allclose(got, 2 * x)                               # the launch still ran
    (launch,) = launches
    assert launch.name == "add_kernel" and launch.blocks == 2 and launch.threads == 128
    basics.add(x, x)                                             # outside: nothing recorded
    assert len(launches) == 1


def test_formula_results_at_andrea_120m():
    results = bench.formula_results(only=["projection", "flash v2", "softmax v1", "decode v2"])
    by_name = {k["name"]: k for k in results["kernels"]}
    v1, v3 = by_name["projection v1"], by_name["projection v3"]
    # x (8192, 768) @ W_qkv (768, 2304): 2 * 8192 * 768 * 2304 FLOPs over x, W_qkv and out once
    assert v1["flops"] == 28_991_029_248
    assert v1["ideal_bytes"] == 4 * (8192 * 768 + 768 * 2304 + 8192 * 2304)
    assert round(v1["intensity"]) == 269                        # far right of an H200's ridge (14)
    assert v3["counted"]["global_loads"] == 8192 * 768 * 72 + 768 * 2304 * 256
    assert by_name["softmax v1"]["intensity"] == 5 / 8          # memory-bound
    # flash v2 at the GPU's 32-query blocks on either backend: each head reads q once, k and v
    # up to each block's last visible key, writes out once; 1024 / 32 = 32 blocks per head.
    keys = sum(min(1024, q0 + 32) for q0 in range(0, 1024, 32))
    assert by_name["flash v2"]["counted"]["global_loads"] == 96 * 64 * (1024 + 2 * keys)
    # decode v2 with the GPU's chunks of 32 keys: every filled position's thread reads its query
    # head's q, every key and value is read once; the merge reads each LSE_c twice and o_c once per
    # chunk and component (32 chunks).
    assert by_name["decode v2"]["counted"]["global_loads"] == 3 * 96 * 1024 * 64 + 3 * 96 * 64 * 32
    # One FLOP rule: a multiply-add 2, the softmax 5 per score. Causal attention does 4 d_k + 5 per
    # visible pair (1024 * 1025 / 2 a head), decoding as much per cached key; flash also writes the lse.
    assert by_name["flash v2"]["flops"] == (4 * 64 + 5) * 96 * (1024 * 1025 // 2)
    assert by_name["flash v2"]["ideal_bytes"] == 4 * (4 * 96 * 1024 * 64 + 96 * 1024)
    assert by_name["decode v2"]["flops"] == (4 * 64 + 5) * 96 * 1024
    assert results["notes"] == ["by formula, with the GPU's tile sizes"]
    assert "projection v3" in bench.format_table(results)


@ON_SIMULATOR_ONLY
def test_cli_lists_and_runs(tmp_path, capsys):
    assert bench.main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(e.name in listing for e in bench.REGISTRY)
    assert bench.main(["--only", "projection v3", "--batch", "1", "--heads", "1", "--T", "7", "--d-k", "5",
                       "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[1/1] projection v3" in out and "= formula" in out and "times need a GPU" in out
    assert (tmp_path / "bench-simulator.json").exists() and (tmp_path / "roofline-simulator.png").exists()
    with pytest.raises(ValueError, match=r"^only must name registry entries"):
        bench.run_bench(TINY, only=["nothing like it"], write=False, verbose=False)
