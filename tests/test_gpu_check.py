"""tools/gpu_check.py, where it can run without a GPU: the CPU smoke run (with each image
generator: tools/make_images.py, the synthetic one asked for, the synthetic one as the fallback
where scikit-image is unusable) and the one-line refusal of the GPU run without CUDA.  The GPU
sections run on a CUDA machine only (docs/device.md, "GPU checks")."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "gpu_check.py"
HAS_SKIMAGE = importlib.util.find_spec("skimage") is not None


def _run(*args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def _table(text: str) -> tuple[str, dict[str, str]]:
    """(header line, {check: result}) of the markdown table the script prints."""
    lines = text.strip().splitlines()
    start = lines.index("| check | result |")
    assert lines[start + 1] == "|---|---|"
    rows = {}
    for line in lines[start + 2:]:
        assert line.startswith("| ") and line.endswith(" |"), line
        check, result = line[2:-2].split(" | ", 1)
        rows[check] = result
    return lines[start - 2], rows


def _rate(result: str) -> float:
    match = re.match(r"([\d,]+(?:\.\d+)?) img/s", result)
    assert match, result
    return float(match.group(1).replace(",", ""))


def _smoke(tmp_path, *args: str, env: dict | None = None) -> tuple[str, dict[str, str]]:
    out = tmp_path / "gpu.md"
    proc = _run("--cpu-smoke", "--out", str(out), *args, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, rows = _table(proc.stdout)
    assert out.read_text().strip() == proc.stdout.strip()  # --out holds the printed table
    assert head.startswith("GPU checks on ") and "--cpu-smoke" in head
    loader = [r for c, r in rows.items() if c.startswith("DeviceLoader end to end, CPU decode")]
    assert len(loader) == 1 and _rate(loader[0]) > 10
    assert "epochs" in loader[0] and "stopped" not in loader[0]  # ran past one epoch, in time
    same = next(r for c, r in rows.items() if c.startswith("CPU vs CPU decode, same crops"))
    assert same.startswith("0.00, 0.00, 0 over ")  # same crops: the comparison lines up
    assert _rate(rows["simplejpeg decode alone, full size, 1 thread"]) > 10
    fed = next(r for c, r in rows.items() if "training fed by DeviceLoader" in c)
    assert _rate(fed) > 0 and "x resident; host waited for data" in fed
    assert any("already on the CPU" in c and _rate(r) > 0 for c, r in rows.items())
    return head, rows


@pytest.mark.skipif(not HAS_SKIMAGE, reason="scikit-image (tools/make_images.py's photos)")
def test_cpu_smoke_with_make_images(tmp_path):
    head, _ = _smoke(tmp_path)
    assert "tools/make_images.py photos" in head


def test_cpu_smoke_synthetic(tmp_path):
    head, rows = _smoke(tmp_path, "--synthetic")
    assert "synthetic numpy+Pillow images (--synthetic)" in head
    assert any(c.startswith("generate + pack 300 JPEGs") for c in rows)


def test_synthetic_fallback_without_scikit_image(tmp_path):
    """A scikit-image without its photos (here: an empty package shadowing the real one) makes the
    script fall back to the synthetic images by itself."""
    fake = tmp_path / "fake"
    (fake / "skimage").mkdir(parents=True)
    (fake / "skimage" / "__init__.py").write_text("")
    head, _ = _smoke(tmp_path, "--images", "96", env={"PYTHONPATH": str(fake)})
    assert "synthetic numpy+Pillow images (scikit-image photos missing" in head


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_gpu_run_without_cuda_is_one_line(tmp_path):
    proc = _run("--out", str(tmp_path / "gpu.md"), timeout=60)
    assert proc.returncode != 0
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device"), proc.stderr
    assert "--cpu-smoke" in lines[0]
    assert not (tmp_path / "gpu.md").exists()
