"""The faults suite's runner: each scripted try runs in a process of its own, forked from the
benchmark (shardpack, torch and the HTTP client already imported, so a try costs milliseconds to
start), under a wall-clock limit.  A SIGBUS, an out-of-memory kill or a hang
then ends that try, not the run: the try's outcome is what it reported, or ``hang`` (no report
within the limit: its process group is killed) or ``crash`` (it died of a signal, or exited,
before reporting).

A try is a function ``fn(work: Path) -> (kind, detail)`` run in the child; ``work`` is an empty
folder of its own, removed afterwards.  The helpers below classify what a reader, a command or a
call did."""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import re
import select
import shutil
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Callable

from shardpack import ShardpackError

KINDS = ("ok", "clear error", "silent", "other exception", "hang", "crash")
BAD = ("silent", "other exception", "hang", "crash")


@dataclasses.dataclass
class Try:
    family: str
    row: str                     # the table row it counts in
    params: dict                 # what varies inside the row (shown for a bad outcome)
    fn: Callable                 # fn(work) -> (kind, detail), run in the child
    timeout: float = 30.0
    kind: str = ""
    detail: str = ""
    seconds: float = 0.0


def _child(fn, work: Path, w: int) -> None:
    """In the forked child: run the try, write its outcome as JSON to ``w``, exit at once (no
    atexit handler, no finaliser of the parent's: its temporary folders are not ours)."""
    code = 0
    try:
        os.setpgid(0, 0)  # killed as a group on a hang: the try's own children too
        log = os.open(work.parent / f"{work.name}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(log, 1)
        os.dup2(log, 2)
        sys.stdout = os.fdopen(1, "w", closefd=False)
        sys.stderr = os.fdopen(2, "w", closefd=False)
        faulthandler.enable(sys.stderr)  # a SIGBUS or SIGSEGV leaves its traceback in the log
        os.chdir(work)
        try:
            kind, detail = fn(work)
        except BaseException as exc:  # noqa: BLE001 - a try that raised: its outcome
            kind, detail = other(exc)
        os.write(w, json.dumps({"kind": kind, "detail": detail}).encode())
    except BaseException:  # noqa: BLE001 - nothing may escape a forked child
        code = 3
    finally:
        os._exit(code)


def run_try(t: Try, scratch: Path) -> Try:
    """Run one try in a forked child under ``t.timeout``; fills in kind, detail and seconds."""
    work = scratch / "try"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    log = scratch / "try.log"
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        _child(t.fn, work, w)
    try:
        os.setpgid(pid, pid)  # (also done by the child: whichever runs first)
    except OSError:
        pass
    os.close(w)
    data, deadline, hung = b"", started + t.timeout, False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            hung = True
            break
        ready, _, _ = select.select([r], [], [], left)
        if ready:
            piece = os.read(r, 1 << 16)
            if not piece:
                break
            data += piece
    os.close(r)
    if hung:
        _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    _kill_group(pid)  # anything the try started and left running
    t.seconds = time.monotonic() - started
    if hung:
        t.kind, t.detail = "hang", f"no outcome after {t.timeout:g} s"
    elif data:
        got = json.loads(data)
        t.kind, t.detail = got["kind"], got["detail"]
    else:
        if os.WIFSIGNALED(status):
            what = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            what = f"exit status {os.WEXITSTATUS(status)} before reporting"
        t.kind, t.detail = "crash", what + _log_tail(log)
    t.detail = tidy(t.detail, work, scratch.parent)
    _unmount_under(work)
    shutil.rmtree(work, ignore_errors=True)
    return t


def tidy(text: str, work: Path, tmp: Path) -> str:
    """A detail as the page shows it: the same from run to run (no temporary folder, pid or
    random suffix)."""
    text = text.replace(str(work), "WORK").replace(str(tmp), "TMP")
    text = re.sub(r"/proc/\d+/", "/proc/PID/", text)
    return re.sub(r"\.tmp-\d+-[0-9a-f]{8}", ".tmp-PID-XXXXXXXX", text)


def fork_all(fns, timeout: float) -> list[tuple[str, str]]:
    """Inside a try: run each ``fn()`` (-> (kind, detail)) in a process of its own, all at once,
    and collect their outcomes: a process that dies of a signal is a crash, one that does not
    end within ``timeout`` a hang (it is killed)."""
    procs = [_fork_one(fn) for fn in fns]
    deadline = time.monotonic() + timeout
    return [_collect(pid, r, deadline, timeout) for pid, r in procs]


def _fork_one(fn) -> tuple[int, int]:
    """Fork a child that runs ``fn`` and writes its outcome as JSON to a pipe: (pid, read end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            try:
                kind, detail = fn()
            except BaseException as exc:  # noqa: BLE001 - its outcome
                kind, detail = other(exc)
            os.write(w, json.dumps({"kind": kind, "detail": detail}).encode())
        except BaseException:  # noqa: BLE001 - nothing may escape a forked child
            code = 3
        finally:
            os._exit(code)
    os.close(w)
    return pid, r


def _collect(pid: int, r: int, deadline: float, timeout: float) -> tuple[str, str]:
    """The outcome of one forked child: what it wrote before ``deadline``, or hang / crash."""
    data, hung = b"", False
    while True:
        left = deadline - time.monotonic()
        ready = select.select([r], [], [], max(left, 0))[0] if left > 0 else []
        if not ready:
            hung = True
            break
        piece = os.read(r, 1 << 16)
        if not piece:
            break
        data += piece
    os.close(r)
    if hung:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if hung:
        return "hang", f"no outcome after {timeout:g} s"
    if data:
        got = json.loads(data)
        return got["kind"], got["detail"]
    if os.WIFSIGNALED(status):
        return "crash", f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return "crash", f"exit status {os.WEXITSTATUS(status)} before reporting"


def worst(outcomes) -> tuple[str, str]:
    """The worst of several outcomes (a try of several processes), in the order crash, hang,
    silent, other exception, clear error, ok."""
    order = ("crash", "hang", "silent", "other exception", "clear error", "ok")
    kind, detail = min(outcomes, key=lambda o: order.index(o[0]))
    count = sum(1 for k, _ in outcomes if k == kind)
    return kind, (f"{count} of {len(outcomes)} processes: {detail}" if len(outcomes) > 1
                  else detail)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _log_tail(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    # faulthandler's "Fatal Python error: Bus error" and the innermost frames
    keep = [ln.strip() for ln in lines if ln.startswith("Fatal") or ln.strip().startswith("File")]
    return ("; " + " | ".join(keep[:4])) if keep else ""


def _unmount_under(work: Path) -> None:
    """Read-only bind mounts a try made under its folder (the cache family's) go before the
    folder is removed, even when the try was killed."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    for line in mounts:
        where = line.split(" ")[1]
        if where.startswith(str(work) + "/"):
            os.system(f"umount -l '{where}' 2>/dev/null")  # noqa: S605 - our own path


# -- classifying what came back (in the child) ------------------------------------------------

def where_raised(exc: BaseException) -> str:
    """The innermost frame of an exception: file:line function."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    f = frames[-1]
    return f" (at {Path(f.filename).name}:{f.lineno} {f.name})"


def other(exc: BaseException) -> tuple[str, str]:
    text = " ".join(str(exc).split())[:300]
    return "other exception", f"{type(exc).__name__}: {text}{where_raised(exc)}"


def clear(exc: BaseException) -> tuple[str, str]:
    """A ShardpackError is a clear error when its message is one line (str() guarantees it)."""
    return "clear error", f"{type(exc).__name__}: {str(exc)[:300]}"


def call(fn, *, accept=(ShardpackError,)) -> tuple[str, str]:
    """Run ``fn()``: ok, a clear error (one of ``accept``, one line) or another exception."""
    try:
        fn()
    except accept as exc:
        text = str(exc)
        if "\n" in text:
            return "other exception", f"{type(exc).__name__} over several lines: {text[:300]!r}"
        return clear(exc)
    except Exception as exc:  # noqa: BLE001 - whatever it raised
        return other(exc)
    return "ok", ""


def read_epochs(epochs, truth: dict) -> tuple[str, str]:
    """``epochs``: an iterable of epochs, each an iterable of (key, bytes), compared sample by
    sample with ``truth``.  A wrong sample, or an epoch ending without error but not holding each
    key once, is silent, whatever happened next."""
    n = 0
    try:
        for n, epoch in enumerate(epochs):
            seen = Counter()
            for key, data in epoch:
                seen[key] += 1
                if truth.get(key) != data:
                    return "silent", f"epoch {n}: wrong bytes for sample {key!r}"
            if seen != Counter(truth.keys()):
                missing = sorted(set(truth) - set(seen))[:3]
                return "silent", (f"epoch {n} ended without error with {sum(seen.values())} "
                                  f"of {len(truth)} samples (missing {missing})")
    except ShardpackError as exc:
        return clear(exc)
    except Exception as exc:  # noqa: BLE001 - whatever a reader raised
        return other(exc)
    return "ok", ""


def cli(*args) -> tuple[str, str, str]:
    """``shardpack ARGS`` in this process (click's CliRunner): (kind, detail, output).  ok is
    exit 0; a clear error is exit 2 with one ``shardpack: error:`` line, or exit 1 with ``BAD``
    lines (verify); anything else, a traceback among it, is another exception."""
    from click.testing import CliRunner

    from shardpack.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    out = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        kind, detail = other(result.exception)
        return kind, detail + where_raised(result.exception), out
    if "Traceback" in out:
        return "other exception", f"traceback in the output: {out[-300:]!r}", out
    lines = out.splitlines()
    errors = [ln for ln in lines if ln.startswith("shardpack: error:")]
    bad = [ln for ln in lines if ln.startswith("BAD ")]
    if result.exit_code == 0:
        return "ok", "", out
    if result.exit_code == 2 and len(errors) == 1:
        return "clear error", errors[0][:300], out
    if result.exit_code == 1 and bad:
        return "clear error", bad[0][:300], out
    return "other exception", f"exit {result.exit_code}: {out[-300:]!r}", out


def summary(tries: list[Try]) -> list[tuple[str, str, Counter]]:
    """(family, row, Counter of kinds) in the order rows first appear."""
    rows: dict[tuple[str, str], Counter] = {}
    for t in tries:
        rows.setdefault((t.family, t.row), Counter())[t.kind] += 1
    return [(f, r, c) for (f, r), c in rows.items()]
