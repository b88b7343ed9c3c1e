"""Untrusted Python from model output, each call in a fresh process that cannot hurt the caller.

`run_code(code, limits)` starts `runner.py` (see there for the three processes) in a new session with an empty
environment and a temporary directory of its own, and reads the code's output as it comes. Every way the code
can fail (an exception, a limit, the wall clock, too much output, a signal) comes back as the result's text, a
short message the model can read; `run_code` itself does not raise for anything the code does.

What the machine allows decides how strong the isolation is: `probe_isolation()` says what this machine gives
(network, PID and mount namespaces, a uid of the code's own) and `Isolation.unprotected()` what it does not.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

RUNNER = Path(__file__).with_name("runner.py")
MAX_CODE_BYTES = 1 << 20
READ_CHUNK = 1 << 16
EXCEPTION_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b")  # `ValueError: ...`
DRAIN_S = 1.0  # after the process group is killed, how long to wait for the last bytes of output
REASONS = (
    "ok",
    "exception",  # the code raised; the text ends with the traceback
    "exit_status",  # the code exited with a non-zero status of its own
    "timeout",  # wall-clock limit
    "cpu_limit",
    "memory_limit",
    "output_limit",  # more output than the cap; the process was stopped
    "killed",  # a signal ended it (the hard CPU limit's SIGKILL, or the code's own doing)
    "sandbox_error",  # the sandbox could not start the code
    "bad_call",  # the model's tool call could not be run (see `laminar.tools.registry`)
)


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. CPU and wall time in seconds, sizes in MiB, `output_bytes` for stdout and stderr
    together. `disk_mb` bounds the working directory where a private tmpfs can be mounted for it."""

    cpu_s: float = 10.0
    wall_s: float = 15.0
    memory_mb: int = 1024
    max_procs: int = 16
    max_open_files: int = 64
    max_file_mb: int = 16
    disk_mb: int = 64
    output_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        for name, low in (
            ("cpu_s", 0.1),
            ("wall_s", 0.1),
            ("memory_mb", 64),  # the interpreter alone needs tens of MiB of address space
            ("max_procs", 1),
            ("max_open_files", 8),
            ("max_file_mb", 1),
            ("disk_mb", 1),
            ("output_bytes", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value >= low:
                raise ValueError(f"SandboxLimits.{name}={value!r}: must be a number of at least {low}")


DEFAULT_LIMITS = SandboxLimits()


@dataclass(frozen=True)
class ToolResult:
    """What a tool call gives back: `text` for the model (the output, then an `error: ...` line when it failed),
    `ok`, `reason` (one of `REASONS`), the call's wall time and whether the output was cut at the cap."""

    text: str
    ok: bool
    reason: str
    seconds: float
    truncated: bool = False


@dataclass(frozen=True)
class Isolation:
    """What the sandbox achieves on this machine (each call tries the same steps in the same order)."""

    network: bool  # a new network namespace: no interface but a loopback that is down
    pid_namespace: bool  # the code cannot see or signal a process outside its call
    private_proc: bool  # /proc shows only the call's processes
    read_only_root: bool  # the whole file tree is read-only to the code
    private_workdir: bool  # the working directory is a tmpfs of `disk_mb` that vanishes with the call
    own_uid: bool  # the code runs as a uid of its own, not the caller's
    user_namespace: bool  # the namespaces came through an unprivileged user namespace
    notes: tuple[str, ...] = ()

    def unprotected(self) -> list[str]:
        """Plain sentences: what the sandbox does not protect against here."""
        gaps = []
        if not self.network:
            gaps.append("network: the code can open sockets and reach any address the caller can")
        if not self.pid_namespace:
            gaps.append(
                "processes: the code can signal any process of its uid, and a process it starts and detaches "
                "(setsid, then clearing its parent-death signal) can outlive the call"
            )
        if not self.private_proc:
            gaps.append(
                "/proc: the code can list the machine's processes and read what its uid may read there"
            )
        if not self.read_only_root:
            gaps.append(
                "files: the code can write wherever its uid may write"
                + (" (world-writable directories such as /tmp and /dev/shm)" if self.own_uid else "")
            )
        if not self.own_uid:
            gaps.append("uid: the code runs as the caller's uid and can read the caller's files")
            if os.geteuid() == 0 and not self.user_namespace:
                gaps.append("fork bombs: max_procs does not bind root; only the wall-clock limit ends one")
        if not self.private_workdir:
            gaps.append("disk: only each file's size is bounded (max_file_mb), not their number")
        gaps.append("the kernel: a kernel exploit, or side channels (timing, caches), are out of scope")
        return gaps


def run_code(code: str, limits: SandboxLimits = DEFAULT_LIMITS) -> ToolResult:
    """Run `code` in a fresh sandboxed interpreter (standard library only); its output, or why it failed."""
    return _run(code, limits)[0]


@functools.cache
def probe_isolation() -> Isolation:
    """Run an empty program once and report what isolation the sandbox got on this machine."""
    result, status = _run("", DEFAULT_LIMITS)
    if not result.ok:
        return Isolation(
            False, False, False, False, False, False, False, (f"the probe failed: {result.text}",)
        )
    notes = tuple(
        str(status[key])
        for key in ("namespace_errors", "mount_error", "proc_error", "uid_note")
        if key in status
    )
    return Isolation(
        network=bool(status.get("network")),
        pid_namespace=bool(status.get("pid_namespace")),
        private_proc=bool(status.get("private_proc")),
        read_only_root=bool(status.get("read_only_root")),
        private_workdir=bool(status.get("private_workdir")),
        own_uid=bool(status.get("own_uid")),
        user_namespace=bool(status.get("user_namespace")),
        notes=notes,
    )


class SandboxPool:
    """Runs calls on a few threads, off the decode loop; each call is its own process, so they run in parallel."""

    def __init__(self, limits: SandboxLimits = DEFAULT_LIMITS, workers: int = 4) -> None:
        if workers < 1:
            raise ValueError(f"SandboxPool workers={workers}: must be at least 1")
        self.limits = limits
        self._pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tool")

    def submit(self, code: str) -> cf.Future[ToolResult]:
        return self._pool.submit(run_code, code, self.limits)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _run(code: str, limits: SandboxLimits) -> tuple[ToolResult, dict]:
    start = time.monotonic()
    if len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
        text = f"error: the code is {len(code)} characters; at most {MAX_CODE_BYTES} bytes are accepted"
        return ToolResult(text, False, "sandbox_error", 0.0), {}
    workdir = tempfile.mkdtemp(prefix="laminar-tool-")
    try:
        output, ended, status, returncode = _execute(code, limits, workdir, start)
    except OSError as e:  # the runner could not be started at all
        return ToolResult(f"error: the sandbox could not start: {e}", False, "sandbox_error", 0.0), {}
    finally:
        _remove_tree(workdir)
    seconds = time.monotonic() - start
    truncated = ended == "output"
    # the call's directory is a random name the model need not see: tracebacks read `File "main.py"`
    text = output.decode("utf-8", "replace").replace(workdir + "/work/", "").replace(workdir, "")
    reason, note = _outcome(text, ended, status, returncode, limits)
    if note:
        text += ("\n" if text and not text.endswith("\n") else "") + note
    return ToolResult(text, reason == "ok", reason, seconds, truncated), status


def _execute(code: str, limits: SandboxLimits, workdir: str, start: float) -> tuple[bytes, str, dict, int]:
    """(output up to the cap, how it ended: exited | timeout | output, the runner's status, its return code)."""
    job = {
        "code": code,
        "workdir": workdir,
        "python": sys.executable,
        "base_prefix": sys.base_prefix,
        **{name: getattr(limits, name) for name in limits.__dataclass_fields__},
    }
    status_r, status_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", str(RUNNER), str(status_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={},
            cwd="/",
            start_new_session=True,  # its own process group: killpg ends it, and the code cannot reach ours
            pass_fds=(status_w,),
        )
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    runner_fd = os.pidfd_open(proc.pid)  # readable once the runner exits; the pid stays ours until we reap it
    try:
        try:
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the runner died first; its output and return code say why
        output, status_bytes, ended = _collect(proc, runner_fd, status_r, limits, start + limits.wall_s)
    finally:
        _kill_group(proc.pid)  # before the runner is reaped, so its pid (the group's id) cannot be reused
        os.close(runner_fd)
        os.close(status_r)
        proc.stdout.close()
        try:
            returncode = proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            log.warning("sandbox runner %d did not exit 5 s after SIGKILL", proc.pid)
            returncode = -signal.SIGKILL
    status: dict = {}
    for line in status_bytes.decode("utf-8", "replace").splitlines():
        try:
            status.update(json.loads(line))
        except ValueError:
            status["error"] = f"unreadable status line {line!r:.200}"
    return output, ended, status, returncode


def _collect(
    proc: subprocess.Popen, runner_fd: int, status_fd: int, limits: SandboxLimits, deadline: float
) -> tuple[bytes, bytes, str]:
    """Read output and status until the runner exits, the deadline passes or the output passes the cap."""
    out_fd = proc.stdout.fileno()
    output, status = bytearray(), bytearray()
    poller = select.poll()
    for fd in (out_fd, status_fd, runner_fd):
        poller.register(fd, select.POLLIN)
    open_fds = {out_fd, status_fd, runner_fd}
    ended = ""
    while out_fd in open_fds or status_fd in open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if ended:
                break  # the drain after the end ran out: a detached process holds the pipe
            _kill_group(proc.pid)
            ended, deadline = "timeout", time.monotonic() + DRAIN_S
            continue
        for fd, _ in poller.poll(remaining * 1000):
            if fd == runner_fd:
                # the runner is done: anything left in its group is a straggler; read what is already written
                poller.unregister(fd)
                open_fds.discard(fd)
                _kill_group(proc.pid)
                if not ended:
                    ended, deadline = "exited", time.monotonic() + DRAIN_S
                continue
            chunk = os.read(fd, READ_CHUNK)
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
            elif fd == status_fd:
                status += chunk
            elif len(output) <= limits.output_bytes:
                output += chunk
                if len(output) > limits.output_bytes and not ended:
                    _kill_group(proc.pid)
                    ended, deadline = "output", time.monotonic() + DRAIN_S
    return bytes(output[: limits.output_bytes]), bytes(status), ended or "exited"


def _outcome(text: str, ended: str, status: dict, returncode: int, limits: SandboxLimits) -> tuple[str, str]:
    """(reason, the note to append to the output) from how the call ended."""
    if ended == "timeout":
        return "timeout", f"error: timed out after {limits.wall_s:g} s"
    if ended == "output":
        return "output_limit", f"[output truncated at {limits.output_bytes} bytes; the process was stopped]"
    if "error" in status:
        return "sandbox_error", f"error: the sandbox failed: {status['error']}"
    sig = status.get("signal")
    if sig is None and "exit" not in status and returncode != 0:
        if returncode > 0:  # the runner itself failed; its message is in the output
            return "sandbox_error", f"error: the sandbox runner exited with status {returncode}"
        sig = -returncode
    if sig is not None:
        if sig == signal.SIGXCPU:
            return "cpu_limit", f"error: CPU time limit of {limits.cpu_s:g} s exceeded"
        return "killed", f"error: killed by {_signal_name(sig)}"
    if "exit" not in status:
        return "sandbox_error", "error: the sandbox did not report how the code ended"
    code = status["exit"]
    if code == 0:
        return "ok", ""
    last = text.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError"):
        return "memory_limit", f"error: out of memory (the limit is {limits.memory_mb} MB)"
    if code == 1 and ("Traceback (most recent call last)" in text or EXCEPTION_LINE.match(last)):
        return "exception", ""  # the traceback (or a SyntaxError's report) says it
    return "exit_status", f"error: exited with status {code}"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the whole group has exited


def _remove_tree(path: str) -> None:
    """Remove the call's directory even where the code took permissions away from its own files."""

    def allow_and_retry(func: Callable[[str], object], failed: str, _exc: object) -> None:
        os.chmod(os.path.dirname(failed), 0o700)
        func(failed)

    try:
        shutil.rmtree(path, onerror=allow_and_retry)
    except OSError as e:
        log.warning("could not remove the sandbox directory %s: %s", path, e)
