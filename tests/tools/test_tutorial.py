"""docs/tutorial.md runs as written: its bash and python blocks, in order, in one empty folder
(the HTTP server's port replaced by a free one).  Its first block makes the reader's scratch
folder; here that folder is tmp_path, and nothing is written in the checkout."""

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
    assert len(blocks) >= 9
    setup, blocks = blocks[0][1], blocks[1:]
    assert "mktemp -d" in setup and 'cd "$SCRATCH"' in setup  # the scratch folder is tmp_path
    written = [ROOT / name for name in ("data", "cache", "sheet.png", "server.pid")]
    before = [path.exists() for path in written]
    port = str(_free_port())
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               REPO=str(ROOT), SCRATCH=str(tmp_path))
    out = []
    try:
        for number, (kind, code) in enumerate(blocks, start=1):
            code = code.replace("8731", port)
            # (an old spelling of the API on the page fails, as in the rest of the suite)
            cmd = ["bash", "-eu", "-c", code] if kind == "bash" else \
                [sys.executable, "-W", "error::DeprecationWarning:__main__", "-c", code]
            result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                                    timeout=300)
            assert result.returncode == 0, (number, code, result.stdout[-2000:],
                                            result.stderr[-2000:])
            out.append(result.stdout)
    finally:
        pid = tmp_path / "server.pid"
        if pid.exists():
            subprocess.run(["kill", pid.read_text().strip()], capture_output=True)
    assert (tmp_path / "sheet.png").stat().st_size > 0
    assert any((tmp_path / "cache").rglob("*"))
    # the remote block's two epochs: the first over HTTP, the second from the cache alone
    assert re.search(r"epoch 1: 400 samples, [1-9]\d* HTTP requests", "".join(out))
    assert "epoch 2: 400 samples, 0 HTTP requests" in "".join(out)
    assert not (tmp_path / "server.pid").exists()  # the server was stopped by the page itself
    assert [path.exists() for path in written] == before  # nothing written in the checkout
