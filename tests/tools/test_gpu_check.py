"""scripts/gpu_check.py, where it can run without a GPU: the CPU smoke run of every section
(DeviceLoader's host-clock timing, a stand-in decoder; the sweep with a simulated step), the sweep
row's checks on CUDA-shaped figures, each image generator, sections that fail
alone (--inject-failure), the idle share taken from ``DeviceLoader.idle()`` (made-up figures, and
a real loader over batches slower than the step), and the one-line refusal of the GPU run without
CUDA.  The GPU run itself needs a CUDA machine (docs/device.md, "GPU checks")."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import shardpack

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"
HAS_SKIMAGE = importlib.util.find_spec("skimage") is not None


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", mod)  # (its dataclasses look their module up)
    spec.loader.exec_module(mod)
    return mod


gc_mod = _module()


def _run(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def _tables(text: str) -> tuple[str, dict[str, tuple[str, str]], list[dict]]:
    """(header line, {section: (check, result)}, feed rows as dicts) of what the script prints."""
    lines = text.strip().splitlines()
    start = lines.index("| section | check | result |")
    assert lines[start + 1] == "|---|---|---|"
    rows, i = {}, start + 2
    while i < len(lines) and lines[i].startswith("| "):
        section, check, result = lines[i][2:-2].split(" | ", 2)
        assert section not in rows, section
        rows[section] = (check, result)
        i += 1
    feeds = []
    if "| " + " | ".join(gc_mod.FEED_COLUMNS) + " |" in lines:
        head = lines.index("| " + " | ".join(gc_mod.FEED_COLUMNS) + " |")
        for line in lines[head + 2:]:
            if not line.startswith("| "):
                break
            feeds.append(dict(zip(gc_mod.FEED_COLUMNS, line[2:-2].split(" | "), strict=True)))
    return lines[start - 2], rows, feeds


def _smoke(tmp_path, *args: str, env: dict | None = None, ok: bool = True):
    out, js = tmp_path / "gpu.md", tmp_path / "gpu.json"
    t0 = time.perf_counter()
    proc = _run("--cpu-smoke", "--out", str(out), "--json", str(js), *args, env=env)
    took = time.perf_counter() - t0
    if ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
    else:
        assert proc.returncode == 1, proc.stderr[-4000:]
    assert out.read_text().strip() == proc.stdout.strip()  # --out holds the printed tables
    head, rows, feeds = _tables(proc.stdout)
    assert "CPU smoke run (host-clock timing, stand-in decoder)" in head and "--cpu-smoke" in head
    return head, rows, feeds, json.loads(js.read_text()), proc, took


def test_cpu_smoke_runs_every_section(tmp_path):
    head, rows, feeds, data, proc, took = _smoke(tmp_path, "--synthetic")
    loaders = [f"loader.{f}.{w}" for w in (2, 4, 12) for f in ("cpu", "gpu")]
    assert list(rows) == ["data", "decode", "nvjpeg", "model", *loaders, "errors", "sweep",
                          "transfer", "tests"]
    assert not any(r.startswith(("FAILED", "skipped")) for _, r in rows.values()), rows
    assert took < 90
    assert rows["decode"][1].startswith("PASS: mean abs diff ")
    assert "status 3 BAD_JPEG" in rows["errors"][1] and "with a C++ backtrace" in rows["errors"][1]
    assert rows["tests"][1].endswith("(smoke: collected, not run)")
    assert "4 tests collected" in rows["tests"][1]
    # the fed runs: the ceiling, then CPU and GPU decode at each worker count
    assert [(f["feed"], f["workers"]) for f in feeds] == [("ceiling", "-")] + [
        (name, str(w)) for w in (2, 4, 12) for name in ("CPU decode", "GPU decode")]
    # every figure from DeviceLoader.idle(), the ceiling's too, labelled with its timing
    assert "from DeviceLoader.idle() (host timing" in proc.stdout
    assert "GPU idle" in rows["model"][1] and "(host timing)" in rows["model"][1]
    for f in data["feeds"]:
        assert f["rate"] > 0 and 0 <= f["idle"] <= 1 and f["steady_steps"] > 0, f
        assert f["timing"] == "host" and f["idle_s"] + f["busy_s"] > 0, f
        assert len(f["window_rates"]) == (3 if f["feed"] == "ceiling" else 2)
        if f["feed"] != "ceiling":  # an epoch start, timed apart from the steady windows
            assert f["epoch_start_ms"] is not None and f["epoch_start_ms"] >= 0, f
            assert f["cpu_fallbacks"] == 0 and f["bad"] == 0 and f["x_ceiling"] > 0
            assert f["steps"] == 10  # one epoch (then the next one's first batch, not stepped)
            assert f["loader_idle"]["epoch_starts"] == 2 and f["loader_idle"]["timing"] == "host"
    assert len(data["answer"]) == 4 and data["answer"][0].startswith("* 2 workers: GPU idle ")
    assert data["failed"] == [] and data["smoke"] is True
    # the sweep: bench --sweep in a process of its own, its table and figures in the JSON report
    check, result = rows["sweep"]
    assert check.startswith("shardpack bench --sweep, a simulated 30 ms step, batch 16, 2 workers")
    assert result.startswith("use: ") and "start (your options) " in result, result
    assert "pinned memory and GPU decode not measured (no CUDA)" in result
    sweep = next(r for r in data["rows"] if r["section"] == "sweep")
    assert sweep["status"] == "ok" and "start (your options)" in sweep["table"]
    assert sweep["sweep"]["configurations"][0]["samples_per_s"] > 0
    assert {"pin", "decode on GPU"} <= {n["lever"] for n in sweep["sweep"]["not_measured"]}


@pytest.mark.skipif(not HAS_SKIMAGE, reason="scikit-image (scripts/make_images.py's photos)")
def test_cpu_smoke_with_make_images(tmp_path):
    head, rows, *_ = _smoke(tmp_path, "--sections", "data,decode")
    assert "scripts/make_images.py photos" in head and list(rows) == ["data", "decode"]
    assert rows["decode"][1].startswith("PASS")


def test_synthetic_fallback_without_scikit_image(tmp_path):
    """A scikit-image without its photos (here: an empty package shadowing the real one) makes the
    script fall back to the synthetic images by itself."""
    fake = tmp_path / "fake"
    (fake / "skimage").mkdir(parents=True)
    (fake / "skimage" / "__init__.py").write_text("")
    head, rows, *_ = _smoke(tmp_path, "--images", "96", "--sections", "data",
                            env={"PYTHONPATH": str(fake)})
    assert "synthetic numpy+Pillow images (scikit-image photos missing" in head
    assert rows["data"][0].startswith("generate + pack 96 JPEGs")


def test_a_failed_section_is_one_row_and_the_others_still_run(tmp_path):
    """--inject-failure raises inside the named sections: each is a FAILED row with its one-line
    cause, the later sections run (the loader builds the model the model section did not), and
    the exit code is 1."""
    _, rows, feeds, data, proc, _ = _smoke(
        tmp_path, "--synthetic", "--workers", "2", "--sections",
        "data,model,loader,errors,transfer", "--inject-failure", "model",
        "--inject-failure", "loader.gpu.2", ok=False)
    assert list(rows) == ["data", "model", "loader.cpu.2", "loader.gpu.2", "errors", "transfer"]
    assert rows["model"][1] == ("FAILED: InjectedFailure: injected failure in model "
                                "(--inject-failure model)")
    assert rows["loader.gpu.2"][1].startswith("FAILED: InjectedFailure: injected failure in "
                                              "loader.gpu.2")
    for ok in ("data", "loader.cpu.2", "errors", "transfer"):
        assert not rows[ok][1].startswith("FAILED"), rows[ok]
    assert [f["feed"] for f in feeds] == ["CPU decode", "GPU decode"]
    assert feeds[1]["images/s"].startswith("FAILED: InjectedFailure")
    assert data["failed"] == ["model", "loader.gpu.2"]
    assert "2 section(s) failed: model, loader.gpu.2" in proc.stderr


def test_without_data_the_sections_that_need_it_fail_alone(tmp_path):
    _, rows, _, data, _, _ = _smoke(tmp_path, "--workers", "2", "--sections",
                                    "data,decode,model,loader", "--inject-failure", "data",
                                    ok=False)
    assert rows["data"][1].startswith("FAILED: InjectedFailure")
    for name in ("decode", "loader.cpu.2", "loader.gpu.2"):
        assert rows[name][1] == ("FAILED: Unavailable: needs the data section's result, which "
                                 "it did not make"), rows[name]
    assert not rows["model"][1].startswith("FAILED")  # the ceiling needs no data
    assert data["failed"] == ["data", "decode", "loader.cpu.2", "loader.gpu.2"]


def test_unknown_section_is_refused():
    proc = _run("--cpu-smoke", "--inject-failure", "decoder", timeout=60)
    assert proc.returncode == 2 and "unknown section(s) decoder" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_run_without_cuda_is_one_line(tmp_path):
    proc = _run("--out", str(tmp_path / "gpu.md"), timeout=60)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device"), proc.stderr
    assert "--cpu-smoke" in lines[0]
    assert not (tmp_path / "gpu.md").exists()


# -- the measurement's arithmetic ------------------------------------------------------------------

@pytest.mark.parametrize(("epoch_len", "warmup", "windows"),
                         [(48, 14, 4), (48, 4, 4), (10, 2, 2), (17, 5, 3), (6, 5, 4), (4, 4, 2)])
def test_steady_windows_cover_the_rest_of_one_epoch_and_never_cross_it(epoch_len, warmup,
                                                                        windows):
    plan = gc_mod.plan_windows(epoch_len, warmup, windows)
    positions = [p for w in plan for p in w]
    assert positions == list(range(warmup, epoch_len))
    assert len(plan) <= windows and all(len(w) for w in plan)
    sizes = [len(w) for w in plan]
    assert len(set(sizes[:-1])) <= 1 and sizes[-1:] <= sizes[:1]  # equal, the last no longer


class _Scripted(shardpack.DeviceLoader):
    """A DeviceLoader whose ``idle()`` hands out made-up running totals, one set a call."""

    def __init__(self, batches, totals):
        super().__init__(batches)
        self.totals = list(totals)

    def idle(self) -> dict:
        idle, busy, start, starts = self.totals.pop(0)
        return {"timing": "scripted", "idle_s": idle, "busy_s": busy, "idle_fraction": None,
                "start_idle_s": start, "epoch_starts": starts, "host_wait_s": 0.0}


def _batches(count, images=4):
    """Tuples (images, labels): DeviceLoader hands them over as they are."""
    return [(torch.zeros(images, 3, 8, 8), torch.zeros(images, dtype=torch.int64))
            for _ in range(count)]


def _train(dl, epoch_len, warmup, windows, step=lambda x, y: None):
    cpu = torch.device("cpu")
    return gc_mod.train_run(SimpleNamespace(device=cpu), step, dl, warmup=warmup,
                            epoch_len=epoch_len, windows=windows,
                            deadline=time.perf_counter() + 60, mem=gc_mod.Memory(cpu))


def test_idle_share_windows_and_the_epoch_start_are_device_loader_idle():
    """An epoch of 6 steps of 4 images, 2 warm-up steps, 2 windows: idle() is read at the
    windows' edges (positions 2 and 4), at the epoch's end, and at the next epoch's first
    batch; every figure is what those reads said, and nothing else."""
    dl = _Scripted(_batches(6), [(0.5, 0.5, 0.1, 1),     # pos 2 (warm-up before it)
                                 (1.5, 3.5, 0.1, 1),     # pos 4: window 1 idled 1 s of 4
                                 (3.5, 5.5, 0.1, 1),     # end: window 2 idled 2 s of 4
                                 (3.5, 5.5, 0.35, 2)])   # the next epoch's first batch
    r = _train(dl, epoch_len=6, warmup=2, windows=2)
    assert dl.totals == [] and r["timing"] == "scripted"
    assert r["window_idle"] == pytest.approx([0.25, 0.5])
    assert r["idle"] == pytest.approx(3 / 8) and (r["idle_s"], r["busy_s"]) == (3.0, 5.0)
    assert r["window_rates"] == pytest.approx([2.0, 2.0]) and r["rate"] == pytest.approx(2.0)
    assert r["steady_steps"] == 4 and r["steps"] == 6
    assert r["epoch_start_ms"] == pytest.approx(250)
    assert r["epoch_start_share"] == pytest.approx(0.25 / (8 / 4 * 6))


class _Slow:
    """Batches made in ``every`` seconds each, an epoch's first in ``first``: the loader's
    producer thread makes them, so the step waits ``every`` minus its own time."""

    def __init__(self, count, every, first):
        self.batches, self.every, self.first = _batches(count), every, first

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            time.sleep(self.first if i == 0 else self.every)
            yield batch


def test_idle_share_of_a_real_loader_over_batches_slower_than_the_step():
    """Batches every 30 ms, a 10 ms step: the device idles ~2/3 of the steady time, on the
    host's clock (``timing`` "host"); the epoch start (a 200 ms first batch) counts apart."""
    dl = shardpack.DeviceLoader(_Slow(9, every=0.03, first=0.2))
    r = _train(dl, epoch_len=9, warmup=3, windows=2, step=lambda x, y: time.sleep(0.01))
    assert r["timing"] == "host" and len(r["window_idle"]) == 2
    assert 0.4 < r["idle"] < 0.9, r
    assert 40 < r["rate"] < 150, r  # 4 images a batch, at most one batch per 30 ms
    assert 180 < r["epoch_start_ms"] < 1000, r


def test_budget_gives_each_section_its_share_of_what_is_left():
    budget = gc_mod.Budget(100, [("a", 0.5), ("b", 0.25), ("c", 0.25)])
    now = time.perf_counter()
    assert budget.deadline("a") - now == pytest.approx(50, abs=1)
    assert budget.deadline("b") - now == pytest.approx(50, abs=1)  # half of the 100 s left
    assert budget.deadline("c", need=500) is None  # skipped: not enough time left


def _figures(*configs, not_measured=()) -> dict:
    """``bench --sweep --json``'s figures, as far as the sweep row reads them."""
    out = []
    for name, lever, decode, error in configs:
        entry = dict(name=name, lever=lever, config=dict(decode=decode), error=error)
        if error is None:
            entry.update(samples_per_s=1000.0, wait_fraction=0.02, timing="cuda-events")
        out.append(entry)
    return dict(configurations=out, not_measured=[dict(lever=n, why=w) for n, w in not_measured],
                bound=dict(kind="the training step (data keeps up)"), elapsed_s=41.0,
                recommendation=dict(name=configs[0][0], code="ds = ..."))


def test_sweep_row_on_cuda_needs_pinned_memory_and_gpu_decode_measured():
    start = ("start (your options)", "start", "cpu", None)
    pin, gpu = ("pinned off", "pin", "cpu", None), ("decode on GPU", "decode", "gpu", None)
    row = gc_mod.sweep_result(_figures(start, pin, gpu), cuda=True)
    assert row.startswith("use: start (your options); the start bound by the training step")
    assert "decode on GPU 1,000/s wait 2.0%" in row and "cuda-events timing" in row
    assert "pinned off and decode on GPU measured" in row
    late = [("decode on GPU", "no time left in the 30 s budget (give a larger --budget)")]
    with pytest.raises(AssertionError, match=r"not measured on CUDA: decode on GPU \(no time"):
        gc_mod.sweep_result(_figures(start, pin, not_measured=late), cuda=True)
    broken = ("decode on GPU", "decode", "gpu", "RuntimeError: nvJPEG failed")
    with pytest.raises(AssertionError, match="1 configuration.s. failed: decode on GPU: Runt"):
        gc_mod.sweep_result(_figures(start, pin, broken), cuda=True)
    with pytest.raises(AssertionError, match="measured without CUDA"):
        gc_mod.sweep_result(_figures(start, gpu), cuda=False)


def test_cause_is_one_line_without_the_cpp_backtrace():
    exc = RuntimeError("Error while decoding JPEG images: Failed to decode batch: 5\n"
                       "Exception raised from decode_images at x.cpp:1 (most recent call first):\n"
                       "frame #0: c10::Error::Error(...) | 0x1")
    assert gc_mod.cause(exc) == ("RuntimeError: Error while decoding JPEG images: Failed to "
                                 "decode batch: 5")
