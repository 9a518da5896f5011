"""Make raw system calls and print what each returned: run INSIDE a sandbox.

``python3 seccomp_probe.py`` prints one JSON object ``{name: errno}`` (0: the call
succeeded) plus ``"seccomp"``, the mode of /proc/self/status (2: a filter). Each call
runs in a forked child, so one that succeeds (a new user namespace) changes nothing
for the next. Arguments are chosen so that, without the filter, the kernel answers
something other than EPERM where it can (a NULL pointer gives EFAULT): the
difference between the two runs is the filter's doing. Plain ctypes, no compiler;
x86_64 numbers (the only host the suite runs on; checked below).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform

CLONE_NEWUSER = 0x10000000
SIGCHLD = 17
# name: (x86_64 number, arguments)
PROBES: dict[str, tuple[int, tuple[int, ...]]] = {
    "unshare_newuser": (272, (CLONE_NEWUSER,)),
    "clone_newuser": (56, (CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)),
    "clone3": (435, (0, 0)),
    "keyctl": (250, (0, 2**64 - 3, 1)),  # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": (248, (0, 0, 0, 0, 0)),
    "request_key": (249, (0, 0, 0, 0)),
    "perf_event_open": (298, (0, 0, 2**64 - 1, 2**64 - 1, 0)),
    "io_uring_setup": (425, (1, 0)),
    "userfaultfd": (323, (1,)),  # UFFD_USER_MODE_ONLY: allowed unprivileged
    "bpf": (321, (2**32 - 1, 0, 0)),
    "syslog": (103, (10, 0, 0)),  # SYSLOG_ACTION_SIZE_BUFFER
    "kexec_load": (246, (0, 0, 0, 0)),
    "init_module": (175, (0, 0, 0)),
    "mount": (165, (0, 0, 0, 0, 0)),
    "fsopen": (430, (0, 0)),
    "open_by_handle_at": (304, (2**64 - 1, 0, 0)),
    "clock_settime": (227, (0, 0)),
    "swapon": (167, (0, 0)),
    "acct": (163, (0,)),
    # Allowed on purpose (debuggers): must keep working with the filter on.
    "ptrace_traceme": (101, (0, 0, 0, 0)),
    "personality_no_aslr": (135, (0x0040000,)),
}


def _call(number: int, args: tuple[int, ...]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_ulong(a) for a in args))
    if result == 0 and number == 56:
        os._exit(0)  # the clone's child
    return ctypes.get_errno() if result < 0 else 0


def probe(number: int, args: tuple[int, ...]) -> int:
    """errno of the call in a forked child, 0 when it succeeded."""
    pid = os.fork()
    if pid == 0:
        os._exit(_call(number, args))
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def main() -> None:
    """Print the outcome of every probe as JSON."""
    assert platform.machine() == "x86_64", "the probe's syscall numbers are x86_64's"
    out: dict[str, int | str] = {name: probe(*spec) for name, spec in PROBES.items()}
    status = open("/proc/self/status").read()  # noqa: SIM115 - tiny, read once
    out["seccomp"] = next(ln.split()[1] for ln in status.splitlines() if ln.startswith("Seccomp:"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
