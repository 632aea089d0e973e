"""The optional C extensions (setup.py builds them where a compiler and the headers are there):
one way to load any of them, so each has the same off switch and the same fallback."""

from __future__ import annotations

import importlib
import os


def optional_extension(module: str, env: str):
    """The extension ``module``, or None: not built, a library it links is missing, or turned off
    by the environment variable ``env`` set to ``"0"`` (benchmarks compare both paths).  Callers
    cache the answer (it is asked on hot paths).

    Args:
        module: the extension's module name.
        env: the environment variable that turns it off.
    """
    if os.environ.get(env, "1") == "0":
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None
