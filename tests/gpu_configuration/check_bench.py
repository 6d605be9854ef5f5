"""The bench as on a GPU: every entry's launches recorded, its result checked against the
reference, then replayed and "timed" on the fake clock (fake_device.EVENT_MS per interval)."""

import json

import fake_device
from attention_lib.measure import bench


def test_every_entry_is_checked_and_timed(tmp_path):
    sizes = bench.BenchSizes(1, 1, 9, 4)                  # tiny: the plumbing, not the speed
    results = bench.run_bench(sizes, out_dir=tmp_path, warmup=1, repeats=5, max_seconds=0.1, verbose=False)
    assert results["backend"] == "gpu" and results["gpu"] == fake_device.DEVICE_NAME
    assert results["limits"] is None                       # a stand-in's name gives no roofs
    assert results["failed"] == [] and results["skipped"] == [], (results["failed"], results["skipped"])
    assert {k["name"] for k in results["kernels"]} == {e.name for e in bench.REGISTRY}
    for kernel in results["kernels"]:
        assert kernel["check"]["ok"], kernel["name"]
        assert kernel["time"]["median_s"] == fake_device.EVENT_MS / 1e3 / kernel["time"]["inner"]
        assert kernel["counted"] is None                  # on a GPU the sanitizer does not count the sweep
    saved = json.loads((tmp_path / "bench-gpu.json").read_text())
    assert [k["name"] for k in saved["kernels"]] == [k["name"] for k in results["kernels"]]
