"""The sandbox's runner: a script, not a module. `laminar.tools.sandbox` starts it as
`python -I -S -B runner.py STATUS_FD` in a new session, with an empty environment and the job as JSON on stdin.
It uses the standard library only and never imports Laminar.

Three processes, so that untrusted code is never a child of the caller:

    runner  enters new network, PID and mount namespaces where the machine allows it (as root, or through a user
            namespace), mounts a read-only view of the root with a private tmpfs working directory, and waits;
    init    the first process of the new PID namespace (PID 1 there): mounts that namespace's own /proc, starts
            the code and waits for it. When init dies the kernel kills every process of the namespace, so
            nothing the code started outlives the call;
    code    sets the resource limits, drops to a uid of its own when the runner is root, and execs a fresh
            interpreter on main.py.

Each process writes one JSON line to STATUS_FD: what isolation it achieved, and init the code's exit status or
signal. The status pipe is closed in the code's process before the exec, so the code cannot write to it.
"""

import ctypes
import json
import math
import os
import resource
import signal
import stat
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (syscalls from 424 on are unified)
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1
PR_SET_PDEATHSIG = 1
UID_BASE = 2_000_000_000  # the code runs as UID_BASE + the runner's pid: a uid no other process has
# tried in order, strongest first: as root, then through a user namespace (all an unprivileged process can do)
NAMESPACE_ATTEMPTS = (
    ("network, pid, mount", CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS, False),
    (
        "network, pid, mount in a user namespace",
        CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS,
        True,
    ),
    ("network, mount", CLONE_NEWNET | CLONE_NEWNS, False),
    ("network, mount in a user namespace", CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS, True),
    ("network", CLONE_NEWNET, False),
    ("network in a user namespace", CLONE_NEWUSER | CLONE_NEWNET, True),
)

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    """Raise OSError naming `what` when a libc call failed."""
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def encode(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    result = libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    check(result, f"mount {target}")


def make_read_only(path: str) -> None:
    """Every mount under `path` read-only in this mount namespace (mount_setattr, Linux 5.12 or later)."""
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)  # attr_set, attr_clr, propagation, userns_fd
    result = libc.syscall(
        ctypes.c_long(SYS_MOUNT_SETATTR),
        ctypes.c_int(AT_FDCWD),
        path.encode(),
        ctypes.c_uint(AT_RECURSIVE),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    check(result, f"mount_setattr {path} read-only")


def report(fd: int, **fields) -> None:
    os.write(fd, (json.dumps(fields) + "\n").encode())


def enter_namespaces(status: dict) -> tuple[bool, bool, bool]:
    """(new PID namespace, new mount namespace, in a user namespace); the first attempt the kernel allows."""
    uid, gid = os.getuid(), os.getgid()
    errors = []
    for name, flags, user in NAMESPACE_ATTEMPTS:
        if libc.unshare(ctypes.c_int(flags)) != 0:
            errors.append(f"{name}: {os.strerror(ctypes.get_errno())}")
            continue
        if user:  # map our own uid and gid to root inside, the one mapping an unprivileged process may write
            with open("/proc/self/setgroups", "w") as f:
                f.write("deny")
            with open("/proc/self/uid_map", "w") as f:
                f.write(f"0 {uid} 1")
            with open("/proc/self/gid_map", "w") as f:
                f.write(f"0 {gid} 1")
        status.update(namespaces=name, network=True, user_namespace=user)
        return bool(flags & CLONE_NEWPID), bool(flags & CLONE_NEWNS), user
    status.update(namespaces="", network=False, user_namespace=False, namespace_errors=errors)
    return False, False, False


def mapped(path: str, ident: int) -> bool:
    """Whether `ident` is in this user namespace's uid or gid map (a container may map only some ids)."""
    with open(path) as f:
        for line in f:
            inside, _, count = (int(x) for x in line.split())
            if inside <= ident < inside + count:
                return True
    return False


def pick_uid(status: dict) -> int:
    """A uid of the code's own (its processes cannot signal ours, its rlimits count only its processes), else
    nobody's, else ours."""
    for uid in (UID_BASE + os.getpid(), 65534):
        if mapped("/proc/self/uid_map", uid) and mapped("/proc/self/gid_map", uid):
            if uid == 65534:
                status["uid_note"] = "the code runs as nobody (65534): calls at the same time share that uid"
            return uid
    status["uid_note"] = "neither a fresh uid nor nobody is mapped here: the code runs as the caller's uid"
    return os.getuid()


def reachable_by_others(path: str) -> bool:
    """Whether a process of another uid can reach `path`: every directory above it searchable by others."""
    path = os.path.realpath(path)
    while True:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def prepare_workdir(job: dict, mounts: bool, uid: int, status: dict) -> tuple[str, str, dict]:
    """(the code's directory, the interpreter to exec, extra environment). With a mount namespace: the root
    read-only, a tmpfs of `disk_mb` over the job's directory holding `work/` (the code's) and `python/` (the
    interpreter's installation, bound read-only so that a uid of its own can run it wherever it lives)."""
    top, python, prefix = job["workdir"], os.path.realpath(job["python"]), job["base_prefix"]
    status.update(read_only_root=False, private_workdir=False)
    if mounts:
        try:
            mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here propagates to the caller's mounts
            try:
                make_read_only("/")
                status["read_only_root"] = True
            except OSError as e:  # mount_setattr is Linux 5.12+; the private tmpfs below still holds
                status["mount_error"] = str(e)
            mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV, f"size={job['disk_mb']}m,mode=0755")
            status["private_workdir"] = True
        except OSError as e:
            status["mount_error"] = str(e)
    extra_env = {}
    if status["private_workdir"] and python.startswith(prefix.rstrip("/") + "/"):
        bound = os.path.join(top, "python")
        os.mkdir(bound)
        mount(prefix, bound, None, MS_BIND | MS_REC)
        make_read_only(bound)
        python = os.path.join(bound, os.path.relpath(python, prefix))
        extra_env["LD_LIBRARY_PATH"] = os.path.join(bound, "lib")  # its RUNPATH may name the original place
    work = os.path.join(top, "work")
    os.mkdir(work, 0o700)
    with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
        f.write(job["code"])
    if uid != os.getuid():
        for path in (work, os.path.join(work, "main.py")):
            os.chown(path, uid, uid)
        if not status["private_workdir"]:
            os.chmod(top, 0o711)  # the caller made it 0700; the code's uid must pass through to work/
    return work, python, extra_env


def set_limits(job: dict) -> None:
    cpu = math.ceil(job["cpu_s"])
    for limit, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),  # SIGXCPU at the soft limit, SIGKILL a second later
        (resource.RLIMIT_AS, (job["memory_mb"] << 20,) * 2),
        (resource.RLIMIT_NPROC, (job["max_procs"],) * 2),
        (resource.RLIMIT_NOFILE, (job["max_open_files"],) * 2),
        (resource.RLIMIT_FSIZE, (job["max_file_mb"] << 20,) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(limit, value)


def run_code(job: dict, status_fd: int, work: str, python: str, uid: int, extra_env: dict) -> None:
    """In the code's process: limits, uid, then exec. Never returns."""
    try:
        set_limits(job)
        if uid != os.getuid():
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        # the code dies with init; set after setuid, which clears it
        check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl PDEATHSIG")
        os.chdir(work)
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        report(status_fd, uid=os.getuid())
        os.set_inheritable(status_fd, False)  # closed by the exec
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LC_ALL": "C.UTF-8", **extra_env}
        os.execve(python, [python, "-I", "-S", "-B", "-u", "main.py"], env)
    except BaseException as e:  # a failure of the sandbox, never of the code
        report(status_fd, error=f"starting the code: {e}")
        os._exit(125)


def init(
    job: dict, status_fd: int, pid_namespace: bool, mounts: bool, work: str, python: str, uid: int, env: dict
) -> None:
    """The namespace's first process: its own /proc, then the code; reports how the code ended. Never returns."""
    try:
        if pid_namespace and mounts:
            try:
                mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
                report(status_fd, private_proc=True)
            except OSError as e:
                report(status_fd, private_proc=False, proc_error=str(e))
        child = os.fork()
        if child == 0:
            run_code(job, status_fd, work, python, uid, env)
        _, code_status = os.waitpid(child, 0)
        if os.WIFSIGNALED(code_status):
            report(status_fd, signal=os.WTERMSIG(code_status))
        else:
            report(status_fd, exit=os.waitstatus_to_exitcode(code_status))
        os._exit(0)
    except BaseException as e:
        report(status_fd, error=f"sandbox init: {e}")
        os._exit(125)


def main() -> None:
    status_fd = int(sys.argv[1])
    job = json.loads(sys.stdin.read())
    status: dict = {}
    pid_namespace, mounts, user = enter_namespaces(status)
    status["pid_namespace"] = pid_namespace
    uid = os.getuid()
    if os.geteuid() != 0 or user:
        status["uid_note"] = "the runner is not root: the code runs as the caller's uid"
    else:
        uid = pick_uid(status)
    work, python, env = prepare_workdir(job, mounts, uid, status)
    reachable = reachable_by_others(python) and reachable_by_others(job["base_prefix"])
    if uid != os.getuid() and not status["private_workdir"] and not reachable:
        uid = os.getuid()
        status["uid_note"] = f"{python} is not reachable by another uid: the code runs as the caller's uid"
    status["own_uid"] = uid != os.getuid()
    report(status_fd, **status)
    child = os.fork()
    if child == 0:
        init(job, status_fd, pid_namespace, mounts, work, python, uid, env)
    _, init_status = os.waitpid(child, 0)
    if os.WIFSIGNALED(init_status):  # init was killed (by the code, where it can reach it): so was the code
        report(status_fd, signal=os.WTERMSIG(init_status))


if __name__ == "__main__":
    try:
        main()
    except Exception as e:
        print(f"sandbox runner: {e}", file=sys.stderr)
        sys.exit(125)
