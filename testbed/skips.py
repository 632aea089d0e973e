"""The skip audit: where SHARDPACK_CI_SKIPS=1 (scripts/test.sh sets it), a test skipped for a
reason not on :data:`ALLOWED` fails the run.

A skip hides a missing piece as well as a test that does not apply: CI would stay green with its
S3 tests, its peers or its C extension gone. The allowlist names the reasons a fresh CI machine
(Debian, root, apt and PyPI, scripts/test.sh) legitimately has; any other skip there means the
setup lost something a test needs, and the run says which test and why (docs/design.md, "Tests,
benchmarks and the testbed", lists the decisions).
"""

from __future__ import annotations

import os
import re

import pytest

ENV = "SHARDPACK_CI_SKIPS"
# scripts/test.sh sets it too: CI has rclone (the dev extra) and nginx (setup.sh --with-nginx), so
# a test server that cannot start there is a broken setup, not a test that does not apply.
REQUIRE_SERVERS = "SHARDPACK_REQUIRE_SERVERS"

# (pattern searched in the skip's reason, why CI may have it)
ALLOWED: tuple[tuple[str, str], ...] = (
    (r"needs CUDA", "CI has no GPU"),
    (r"a CUDA device exists|checks the refusal without CUDA",
     "the other side of a CUDA check: skips on a GPU machine"),
    (r"is read-only: writes do not apply|has no folder listing",
     "a storage kind the check does not apply to (parametrized over kinds)"),
    (r"msgpack records carry their own CRC",
     "a shard format the check does not apply to (parametrized over formats)"),
    (r"pack finished before the kill", "a race the test cannot win on a fast machine"),
    (r"needs \d+ GiB free disk", "the machine's disk size"),
    (r"THP is off|no THP settings to read", "the host kernel's huge-page setting"),
    (r"cannot mount a small tmpfs|cannot bind-mount a folder read-only|"
     r"read-only bind mount is still writable",
     "a container without CAP_SYS_ADMIN refuses mounts, also to root"),
    (r"no user xattrs on this file system", "the temporary folder's file system"),
)


def allowed(reason: str) -> str | None:
    """Why CI may skip for ``reason``, or None where it may not."""
    for pattern, why in ALLOWED:
        if re.search(pattern, reason):
            return why
    return None


def skip_or_fail(why: str, require: str) -> None:
    """Skip the test because ``why``; fail it instead where the variable ``require`` is 1 (a
    piece the test script provides, whose absence CI must see)."""
    if os.environ.get(require) == "1":
        pytest.fail(f"{require}=1 but {why}", pytrace=False)
    pytest.skip(why)


def skip_reason(report) -> str:
    """The reason of a skipped test's report (pytest keeps it as (file, line, "Skipped: why"))."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return reason.removeprefix("Skipped: ")


class SkipAudit:
    """The pytest plugin: collects the skips, lists those off the allowlist and fails the run."""

    def __init__(self) -> None:
        self.active = os.environ.get(ENV) == "1"
        self.refused: list[tuple[str, str]] = []
        self.allowed = 0

    def pytest_runtest_logreport(self, report) -> None:
        if not self.active or not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = skip_reason(report)
        if allowed(reason):
            self.allowed += 1
        else:
            self.refused.append((report.nodeid, reason))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.active:
            return
        if self.refused:
            terminalreporter.section(f"skips CI must not have ({ENV}=1)", red=True)
            for nodeid, reason in self.refused:
                terminalreporter.write_line(f"{nodeid}: {reason}")
            terminalreporter.write_line("a fresh CI machine can run these: the setup lost a "
                                        "piece they need (testbed/skips.py has the allowlist)")
        elif self.allowed:
            terminalreporter.write_line(f"{ENV}: {self.allowed} skips, every reason on the "
                                        "allowlist (testbed/skips.py)")

    def pytest_sessionfinish(self, session) -> None:
        if self.active and self.refused and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
