"""The seccomp filter of every local sandbox: the system calls no benchmark task needs.

Modelled on the deny side of Docker's default profile (moby/profiles
``seccomp/default.json``: what an unprivileged container cannot call), written the
other way round: everything is allowed but the calls in ``DENIED``, which fail with
EPERM (``clone3`` with ENOSYS, as in Docker, so that libc falls back to ``clone``,
whose flags a filter can read). A call is never killed: a task sees an ordinary error.

Most of these already fail for lack of a capability (the sandbox's root holds Docker's
set only); the filter keeps the kernel code behind them out of reach too, and it is
the only guard for the calls a capability does not gate: new user namespaces (inside
one, every capability comes back and mount, bpf and friends with it), kernel
keyrings (not namespaced), io_uring, userfaultfd, perf events and the kernel log.

Kept allowed, on purpose: ``ptrace``, ``process_vm_readv/writev``, ``kcmp``,
``pidfd_getfd`` (gdb, strace; since Linux 4.8 the filter is checked again after a
tracer changes a call, so tracing cannot lift it); ``personality`` (gdb turns
address randomisation off for its inferior; mapping page zero still takes
CAP_SYS_RAWIO); ``setns`` (the sandbox's own entry joins namespaces with it after
the filter is in place, and it needs CAP_SYS_ADMIN over the target, which no sandbox
process holds); ``adjtimex``/``clock_adjtime`` (read the clock's state; setting it
needs CAP_SYS_TIME), ``name_to_handle_at`` and ``chroot``, as Docker allows them.

The program is built once per process with libseccomp (through ``pyseccomp``, plain
ctypes) for every ABI the host runs (x86_64 with i386 and x32, or aarch64 with arm):
a filter that only knew the native numbers would let ``int 0x80`` through.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import platform
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from services.localenv.errors import LocalEnvironmentError

CLONE_NEWUSER = 0x10000000


@dataclass(frozen=True, slots=True)
class Denied:
    """One refused system call: why, and with which error."""

    names: tuple[str, ...]
    reason: str
    errno: int = errno.EPERM
    clone_flag: int | None = None
    """Refuse only when the flags argument (the first) holds this bit."""


DENIED: tuple[Denied, ...] = (
    Denied(
        ("unshare", "clone"),
        "a new user namespace gives back every capability inside it (mount, bpf, ...)",
        clone_flag=CLONE_NEWUSER,
    ),
    Denied(("clone3",), "its flags are in memory a filter cannot read", errno.ENOSYS),
    Denied(("keyctl", "add_key", "request_key"), "kernel keyrings are not namespaced"),
    Denied(
        (
            "kexec_load",
            "kexec_file_load",
            "init_module",
            "finit_module",
            "delete_module",
            "create_module",
            "get_kernel_syms",
            "query_module",
            "reboot",
        ),
        "loading kernel code or rebooting the host",
    ),
    Denied(("bpf", "perf_event_open"), "kernel attack surface; host-wide tracing"),
    Denied(("userfaultfd",), "stalls kernel reads at will, a building block of exploits"),
    Denied(("io_uring_setup", "io_uring_enter", "io_uring_register"), "kernel attack surface"),
    Denied(("syslog",), "the host's kernel log"),
    Denied(
        (
            "mount",
            "umount",
            "umount2",
            "pivot_root",
            "mount_setattr",
            "move_mount",
            "open_tree",
            "fsopen",
            "fsconfig",
            "fsmount",
            "fspick",
        ),
        "the sandbox's mounts are fixed by the host",
    ),
    Denied(("open_by_handle_at",), "opens host files by handle, past every mount"),
    Denied(
        ("settimeofday", "clock_settime", "clock_settime64", "stime"),
        "the host's clock",
    ),
    Denied(
        (
            "acct",
            "swapon",
            "swapoff",
            "quotactl",
            "quotactl_fd",
            "nfsservctl",
            "lookup_dcookie",
            "iopl",
            "ioperm",
            "vm86",
            "vm86old",
            "uselib",
            "_sysctl",
            "sysfs",
            "ustat",
        ),
        "host-wide settings, raw hardware access or obsolete interfaces",
    ),
)


def denied_names() -> list[str]:
    """Every refused system call name, in ``DENIED`` order."""
    return [name for d in DENIED for name in d.names]


@functools.cache
def filter_program() -> bytes:
    """The compiled classic BPF program (``struct sock_filter`` array), built once."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:  # libseccomp.so.2 missing
        raise LocalEnvironmentError(
            f"cannot build the sandbox's seccomp filter ({exc}): apt-get install "
            "libseccomp2 (or run `make setup`)"
        ) from exc
    flt = sc.SyscallFilter(sc.ALLOW)
    machine = platform.machine()
    extra = {"x86_64": (sc.Arch.X86, sc.Arch.X32), "aarch64": (sc.Arch.ARM,)}
    for arch in extra.get(machine, ()):
        flt.add_arch(arch)
    # A call from an ABI the filter does not list is refused, not let through.
    flt.set_attr(sc.Attr.ACT_BADARCH, sc.ERRNO(errno.ENOSYS))
    for rule in DENIED:
        for name in rule.names:
            if rule.clone_flag is None:
                flt.add_rule(sc.ERRNO(rule.errno), name)
            else:
                flag = sc.Arg(0, sc.MASKED_EQ, rule.clone_flag, rule.clone_flag)
                flt.add_rule(sc.ERRNO(rule.errno), name, flag)
    with tempfile.TemporaryFile() as out:
        flt.export_bpf(out)
        out.seek(0)
        return out.read()


def program_memfd() -> int:
    """A memfd holding the program, read once by bubblewrap's ``--seccomp FD``."""
    fd = os.memfd_create("trialbus-seccomp", 0)
    os.write(fd, filter_program())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _Installer:
    """Puts the filter on the calling process (see ``installer``)."""

    def __init__(self) -> None:
        program = filter_program()
        # Kept as attributes: the kernel reads them at the prctl call, in the child.
        self._buf = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // 8, ctypes.cast(self._buf, ctypes.c_void_p))
        self._prog_addr = ctypes.addressof(self._prog)
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        prctl.argtypes = (ctypes.c_int, *(ctypes.c_ulong,) * 4)
        prctl.restype = ctypes.c_int
        self._prctl = prctl

    def __call__(self) -> None:
        prctl = self._prctl
        if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._prog_addr, 0, 0) == 0:
            return
        # EACCES: no CAP_SYS_ADMIN here (a runner that is not root, or a root without
        # it); the kernel then takes a filter only under no_new_privs.
        if (
            ctypes.get_errno() == errno.EACCES
            and prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            and prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, self._prog_addr, 0, 0) == 0
        ):
            return
        raise OSError(ctypes.get_errno(), "the sandbox's seccomp filter failed to load")


@functools.cache
def installer() -> Callable[[], None]:
    """A ``preexec_fn`` that puts the filter on the forked child before its exec.

    Commands enter a running sandbox with ``nsenter``, so they do not descend from
    bubblewrap's process and would not inherit its filter. Everything the child calls
    is prepared here, once, in the parent: after the fork it only makes prctl calls.
    As root the filter goes on without no_new_privs, so setuid programs inside (sudo)
    keep working, as in Docker; without CAP_SYS_ADMIN (a runner that is not root) the
    kernel wants no_new_privs first, and it is set.
    """
    return _Installer()
