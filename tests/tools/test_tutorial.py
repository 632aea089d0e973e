"""docs/tutorial.md runs as written: its bash and python blocks, in order, in one empty folder
(the HTTP server's port replaced by a free one)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "tutorial.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_the_tutorial_runs_as_written(tmp_path):
    blocks = re.findall(r"```(bash|python)\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 8
    port = str(_free_port())
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    try:
        for number, (kind, code) in enumerate(blocks):
            code = code.replace("8731", port)
            cmd = ["bash", "-eu", "-c", code] if kind == "bash" else \
                [sys.executable, "-c", code]
            result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                                    timeout=300)
            assert result.returncode == 0, (number, code, result.stdout[-2000:],
                                            result.stderr[-2000:])
    finally:
        pid = tmp_path / "server.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)
    assert (tmp_path / "sheet.png").stat().st_size > 0
    assert any((tmp_path / "cache").rglob("*"))
