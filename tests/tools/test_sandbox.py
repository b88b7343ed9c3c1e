"""The sandbox contains hostile code: each attack ends the call with a readable error, and the caller lives on.

What the sandbox can guarantee depends on the machine (`probe_isolation`); a test of a protection the machine
does not give is skipped with the probe's own words, never passed silently."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from laminar.tools.sandbox import SandboxLimits, SandboxPool, probe_isolation, run_code

# wall_s well above what starting the sandboxed interpreter takes on a loaded machine (the tests of the wall
# clock limit give their own)
LIMITS = SandboxLimits(cpu_s=1, wall_s=20, memory_mb=256, max_procs=8)
ISOLATION = probe_isolation()
REPO = Path(__file__).resolve().parents[2]
UID_BASE = 2_000_000_000  # runner.py's first uid of the code's own


def needs(*features: str):
    missing = [f for f in features if not getattr(ISOLATION, f)]
    reason = (
        f"this machine gives no {', '.join(missing)} isolation ({'; '.join(ISOLATION.notes) or 'see probe'})"
    )
    return pytest.mark.skipif(bool(missing), reason=reason)


def run_as_separate_caller(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `code` in the sandbox from a fresh caller process (CALLER in the code becomes that caller's pid), so
    that an attack on the caller can be seen to fail without risking the test process."""
    caller = textwrap.dedent(
        f"""
        import json, os
        from laminar.tools.sandbox import SandboxLimits, run_code
        code = {code!r}.replace("CALLER", str(os.getpid()))
        r = run_code(code, SandboxLimits(cpu_s=1, wall_s=20))
        with open("/proc/self/environ", "rb") as f:
            own_environ = f.read().decode(errors="replace")
        print(json.dumps({{"text": r.text, "reason": r.reason, "own_environ": own_environ}}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-c", caller], capture_output=True, text=True, env=env, timeout=30)


def test_normal_code_returns_what_it_prints():
    r = run_code("print('hello'); print(6 * 7)", LIMITS)
    assert r.ok and r.reason == "ok" and r.text == "hello\n42\n" and not r.truncated


def test_an_exception_returns_its_traceback():
    r = run_code("def f():\n    return 1 / 0\nprint('before')\nf()", LIMITS)
    assert not r.ok and r.reason == "exception"
    assert r.text.startswith("before\nTraceback (most recent call last):")
    assert 'File "main.py", line 4' in r.text and r.text.rstrip().endswith(
        "ZeroDivisionError: division by zero"
    )


def test_a_non_zero_exit_status_is_reported():
    r = run_code("import sys; print('partial'); sys.exit(3)", LIMITS)
    assert r.reason == "exit_status" and r.text == "partial\nerror: exited with status 3"


def test_an_infinite_loop_is_stopped_by_the_cpu_limit():
    # a wall clock far past the CPU limit: on a busy machine the loop gets a fraction of a core
    r = run_code("while True: pass", SandboxLimits(cpu_s=1, wall_s=30, memory_mb=256, max_procs=8))
    assert r.reason == "cpu_limit" and r.text == "error: CPU time limit of 1 s exceeded"


def test_a_sleeping_process_is_stopped_by_the_wall_clock():
    r = run_code("import time\nprint('started', flush=True)\ntime.sleep(60)", SandboxLimits(wall_s=1))
    assert r.reason == "timeout" and r.text == "started\nerror: timed out after 1 s"
    assert r.seconds < 5


def test_a_fork_bomb_is_contained():
    r = run_code("import os\nwhile True:\n    os.fork()", LIMITS)
    assert not r.ok and r.reason in ("exception", "timeout", "killed")
    assert "BlockingIOError" in r.text or "error:" in r.text
    if ISOLATION.own_uid:  # every process of the call's uid is gone once the call returns
        left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _uid_of(p) >= UID_BASE]
        assert left == []


def _uid_of(proc_dir: Path) -> int:
    try:
        status = (proc_dir / "status").read_text()
    except OSError:  # the process ended while we looked
        return -1
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))


def test_a_10_gb_allocation_fails_with_a_memory_error():
    r = run_code("b = bytearray(10**10)\nprint('never')", LIMITS)
    assert r.reason == "memory_limit" and "MemoryError" in r.text and "never" not in r.text
    assert r.text.endswith("error: out of memory (the limit is 256 MB)")


@pytest.mark.parametrize(
    ("code", "unit"), [("print('x' * 10**8)", "x"), ("while True:\n    print('a line')", "a line\n")]
)
def test_100_mb_of_output_is_cut_at_the_cap(code, unit):
    r = run_code(code, SandboxLimits(wall_s=5, output_bytes=4096))
    assert r.reason == "output_limit" and r.truncated and not r.ok
    body, note = r.text.rsplit("\n", 1)
    assert 0 < len(body.encode()) <= 4096 and (unit * 4096).startswith(body)
    assert note == "[output truncated at 4096 bytes; the process was stopped]"


def test_stdin_is_empty_and_a_big_file_is_refused():
    r = run_code("input()", LIMITS)
    assert r.reason == "exception" and "EOFError" in r.text
    r = run_code("open('big', 'wb').write(b'0' * (2 << 20))", SandboxLimits(max_file_mb=1))
    assert r.reason == "exception" and "File too large" in r.text


def test_files_of_one_call_are_gone_before_the_next_and_the_directory_is_removed(monkeypatch):
    # a temporary folder of this test's own (open to the sandbox's user, as /tmp is): other processes'
    # sandboxes (a parallel test run) never show in it
    own = Path(tempfile.mkdtemp(prefix="laminar-sandbox-test-"))
    own.chmod(0o755)
    monkeypatch.setattr(tempfile, "tempdir", str(own))
    try:
        assert run_code(
            "open('left.txt', 'w').write('x'); print(sorted(__import__('os').listdir('.')))", LIMITS
        ).ok
        r = run_code("import os; print(os.path.exists('left.txt'))", LIMITS)
        assert r.text == "False\n"
        assert not list(own.iterdir())
    finally:
        shutil.rmtree(own, ignore_errors=True)


@pytest.mark.skipif(
    not (ISOLATION.read_only_root or ISOLATION.own_uid),
    reason=f"the code runs as the caller's uid with a writable root here: {'; '.join(ISOLATION.notes)}",
)
def test_the_code_cannot_write_outside_its_directory(tmp_path):
    outside = tmp_path / "escape.txt"
    code = f"""
for path in [{str(outside)!r}, '/tmp/laminar-escape-test.txt']:
    try:
        open(path, 'w').write('escaped')
        print('wrote', path)
    except OSError as e:
        print(type(e).__name__)
"""
    try:
        r = run_code(code, LIMITS)
        assert r.ok and not outside.exists()
        if ISOLATION.read_only_root:  # world-writable directories are read-only too
            assert "wrote" not in r.text and not Path("/tmp/laminar-escape-test.txt").exists()
    finally:
        Path("/tmp/laminar-escape-test.txt").unlink(missing_ok=True)


@needs("network")
def test_the_code_cannot_open_a_network_connection():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        port = server.getsockname()[1]
        code = (
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')"
        )
        r = run_code(code, LIMITS)
        assert r.reason == "exception" and "connected" not in r.text and "OSError" in r.text
        with pytest.raises(TimeoutError):
            server.accept()


def test_the_code_does_not_see_the_callers_environment(monkeypatch):
    monkeypatch.setenv("LAMINAR_SECRET", "hunter2-in-os-environ")
    r = run_code("import os; print(sorted(os.environ))", LIMITS)
    assert r.ok and "LAMINAR_SECRET" not in r.text and "hunter2" not in r.text


@pytest.mark.skipif(
    not (ISOLATION.private_proc or ISOLATION.own_uid),
    reason=f"the code shares the caller's uid and /proc here, so it can read /proc/<caller>/environ: "
    f"{'; '.join(ISOLATION.notes)}",
)
def test_the_code_cannot_read_the_callers_environment_through_proc():
    # the caller is a fresh process started with the secret in its environment, where /proc/PID/environ shows it
    code = """
import os
found = []
for pid in ['CALLER', str(os.getppid())] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        if b'hunter2' in open(f'/proc/{pid}/environ', 'rb').read():
            found.append(pid)
    except OSError:
        pass
print('found', found)
"""
    done = run_as_separate_caller(code, env={"LAMINAR_SECRET": "hunter2-at-exec"})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert "hunter2-at-exec" in result["own_environ"]  # there to be found, by anyone allowed to read it
    assert result["text"] == "found []\n" and result["reason"] == "ok"


def test_the_caller_survives_the_code_killing_its_parent_and_its_group():
    code = """
import os
try:
    os.kill(os.getppid(), 9)
except OSError as e:
    print('kill parent:', type(e).__name__)
print('after the parent', flush=True)
os.killpg(os.getpgrp(), 9)
print('after the group')
"""
    done = run_as_separate_caller(code)
    assert done.returncode == 0, done.stderr  # the caller lived to print the result
    result = json.loads(done.stdout)
    assert "after the group" not in result["text"] and result["reason"] == "killed"
    r = run_code(code, LIMITS)  # and so does this test process
    assert r.reason == "killed" and r.text.endswith("error: killed by SIGKILL")


@pytest.mark.skipif(
    not (ISOLATION.pid_namespace or ISOLATION.own_uid),
    reason=f"the code shares the caller's uid and PID namespace here: {'; '.join(ISOLATION.notes)}",
)
def test_the_code_cannot_signal_the_caller_by_its_pid():
    code = """
import os
for name, target in [('caller', CALLER), ('everyone', -1)]:
    try:
        os.kill(target, 9)
        print(name, 'signalled')
    except OSError as e:
        print(name, type(e).__name__)
"""
    done = run_as_separate_caller(code)
    assert done.returncode == 0, done.stderr
    text = json.loads(done.stdout)["text"]
    assert "caller signalled" not in text


def test_calls_in_parallel_through_the_pool_all_complete():
    with SandboxPool(LIMITS, workers=4) as pool:
        futures = [pool.submit(f"import time\ntime.sleep(0.3)\nprint({i} * {i})") for i in range(4)]
        results = [f.result(timeout=30) for f in futures]
    assert [r.text for r in results] == ["0\n", "1\n", "4\n", "9\n"] and all(r.ok for r in results)


def test_limits_are_checked():
    with pytest.raises(ValueError, match=r"SandboxLimits.memory_mb=8: must be a number of at least 64"):
        SandboxLimits(memory_mb=8)
    with pytest.raises(ValueError, match="SandboxPool workers=0"):
        SandboxPool(LIMITS, workers=0)


def test_the_probe_names_what_is_not_protected():
    gaps = ISOLATION.unprotected()
    assert any("kernel" in gap for gap in gaps)
    assert ("network" in " ".join(gaps)) == (not ISOLATION.network)
