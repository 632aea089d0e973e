"""Fuzz the region JPEG decoder under AddressSanitizer and UndefinedBehaviorSanitizer.

    python scripts/fuzz_jpegcrop.py [--cases N] [--seed S] [--work DIR]

Builds shardpack/images/libjpegcrop.c with -fsanitize=address,undefined into DIR (a temporary
folder by default), then decodes N cases from testbed.jpegfuzz (the hostile corpus's JPEGs and
mutants of every layout, random boxes and scales), each with decode and decode_many, in a child
process with the sanitizer runtime preloaded.  Any memory error aborts the child (exit 1, the
report on stderr); only ValueError and NotImplementedError may come out of a decode.
Exit 3: the sanitizer build is not possible here.
"""

from __future__ import annotations

import argparse
import collections
import os
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "shardpack" / "images" / "libjpegcrop.c"


def build(work: Path) -> Path:
    """The sanitizer build of the extension in ``work``; exits 3 when it cannot be made."""
    target = work / ("libjpegcrop" + sysconfig.get_config_var("EXT_SUFFIX"))
    command = ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
               "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
               f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-ljpeg", "-o", str(target)]
    made = subprocess.run(command, capture_output=True, text=True)
    if made.returncode != 0:
        print(made.stderr[-2000:])
        print("cannot build the sanitizer build here (gcc, libjpeg62-turbo-dev, Python headers)")
        sys.exit(3)
    return target


def child(work: Path, cases: int, seed: int) -> None:
    """Decode the cases with the sanitizer build (run with the runtime preloaded)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "libjpegcrop", work / ("libjpegcrop" + sysconfig.get_config_var("EXT_SUFFIX")))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from testbed import jpegfuzz

    outcomes, start = collections.Counter(), time.perf_counter()
    for data, scale, y0, y1, x0, x1 in jpegfuzz.cases(cases, seed):
        # the batch call too, into a buffer of exactly the box (malloc'd: red zones around it)
        box = bytearray((y1 - y0) * (x1 - x0) * 3)
        many = module.decode_many([data], struct.pack("6q", scale, y0, y1, x0, x1, 0), box)
        try:
            raw, rows, cols, skew = module.decode(data, scale, y0, y1, x0, x1)
        except (ValueError, NotImplementedError) as exc:
            outcomes[f"{type(exc).__name__}: {str(exc)[:50]}"] += 1
            assert many[0] != 0
            continue
        assert rows == y1 - y0 and len(raw) == rows * cols * 3 and skew + x1 - x0 <= cols
        width = (x1 - x0) * 3
        assert many[0] != 0 or all(box[r * width:(r + 1) * width] == raw[
            (r * cols + skew) * 3:(r * cols + skew) * 3 + width] for r in range(rows))
        outcomes["decoded"] += 1
    print(f"{cases} cases in {time.perf_counter() - start:.0f} s, no sanitizer report")
    for what, count in outcomes.most_common(12):
        print(f"{count:8d}  {what}")


def main() -> None:
    """Parse the arguments; build, then run the child with the sanitizer runtime preloaded."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.work, args.cases, args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="fuzz-jpegcrop-"))
    build(work)
    runtime = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    # PYTHONMALLOC=malloc: the output rows come from malloc with red zones around them, not from
    # pymalloc's arenas, so a row written past the box is caught even inside the (uninstrumented)
    # system libjpeg's stores.
    env = dict(os.environ, LD_PRELOAD=runtime, ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               PYTHONPATH=str(ROOT), PYTHONMALLOC="malloc")
    run = subprocess.run([sys.executable, __file__, "--child", "--work", str(work),
                          "--cases", str(args.cases), "--seed", str(args.seed)], env=env)
    sys.exit(0 if run.returncode == 0 else 1)


if __name__ == "__main__":
    main()
