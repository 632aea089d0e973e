"""``python -m benchmarks.child MODULE:FUNCTION ARGS_JSON``: call one function in this fresh
interpreter and print its JSON result on a last line ``RESULT=...`` (benchmarks.common.fresh
reads it). The suites measure in fresh processes so that one measurement's imports, caches and
heap do not carry into the next."""

import importlib
import json
import sys


def main(argv: list[str]) -> None:
    """Run ``argv`` = [MODULE:FUNCTION, ARGS_JSON] and print ``RESULT=<json>``."""
    module, _, name = argv[0].partition(":")
    fn = getattr(importlib.import_module(module), name)
    result = fn(*json.loads(argv[1]))
    print("RESULT=" + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
