"""The reference pages (docs/reference/) are what the code says: regenerated from the click
commands and the docstrings, they must not differ from the files in the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reference_pages_are_current():
    result = subprocess.run([sys.executable, "scripts/make_reference.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_every_command_and_export_is_in_the_reference():
    import shardpack
    from shardpack.cli.main import main

    cli = (ROOT / "docs" / "reference" / "cli.md").read_text()
    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    for name in main.commands:
        assert f"## shardpack {name}\n" in cli, name
    for name in shardpack.__all__:
        assert name == "__version__" or f"## `{name}" in api, name
