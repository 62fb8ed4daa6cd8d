"""The seccomp filter of the sandbox: the system calls no tool needs, refused.

Built with libseccomp (through `pyseccomp`, a ctypes binding with the API of libseccomp's
own Python module, on the system's libseccomp.so.2), exported as BPF and handed to
bubblewrap's `--seccomp FD`, which loads it in the sandbox right before the program
starts (after its own setup, so bwrap's mounts are not affected).

Everything not listed is allowed: the namespaces, the read-only system, the uid and the
limits already bound the program; the filter takes away the kernel interfaces through
which a program reaches past them (other processes' memory, keyrings, BPF, mounts and
namespaces, modules, the clock, the terminal's input queue and line discipline, the
core dump limit, sockets of any family but
the network's: Unix, vsock, AF_ALG, AF_TIPC ..., and netlink but for routes and socket
diagnostics), and
the set-user-ID and set-group-ID bits, which would let anyone on the host who runs a file
the program made become the program's uid. A refused call fails with EPERM, except
`clone3` and `openat2`, which fail with ENOSYS so that libc falls back to `clone` and
`openat`, whose arguments the filter can read. System calls of another architecture (32-bit x86 on
x86_64) kill the process (libseccomp's default for a foreign architecture), so no call
slips through a second table.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import tempfile
from pathlib import Path

import pyseccomp as seccomp

# Refused with EPERM whatever their arguments. What each reaches, in docs/security.md.
REFUSED = (
    # other processes: their memory, descriptors and state
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    # the kernel's keyrings
    "keyctl",
    "add_key",
    "request_key",
    # programs loaded into the kernel, and its performance and fault interfaces
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # mounts and namespaces
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "name_to_handle_at",
    "open_by_handle_at",
    "fanotify_init",
    "quotactl",
    "quotactl_fd",
    # the kernel itself: replacing it, its modules, its log, its swap, power
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "syslog",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "vhangup",
    "iopl",
    "ioperm",
    "uselib",
    "lookup_dcookie",
    # the clock
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    # memory placement of the whole machine
    "move_pages",
    "migrate_pages",
    "mbind",
    "set_mempolicy",
)
# clone with any of these flags (a new namespace) is refused; clone3 carries its flags in
# memory the filter cannot read, so it is refused as a whole (ENOSYS: libc falls back).
NAMESPACE_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# ioctls refused on any descriptor: pushing input into a terminal (TIOCSTI), the Linux
# console's own commands (TIOCLINUX, which can paste the selection as input too), and
# changing a terminal's line discipline (TIOCSETD): the sandbox's /dev has ptys
# (/dev/ptmx), and attaching a discipline (N_HDLC, N_GSM0710, N_NULL ...) to one ran
# kernel code no tool needs, loaded on demand as a module where the kernel autoloads them
# (dev.tty.ldisc_autoload, 1 by default): as AF_TIPC's socket() did.
REFUSED_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C, "TIOCSETD": 0x5423}
# The core dump limit is the launcher's (prlimit --core=1) and the program's to keep: a
# crash with core_pattern a pipe (`|/usr/share/apport/apport ...`, systemd-coredump: the
# default of Ubuntu and of systemd hosts) starts that helper as root in the host's own
# namespaces, to read the crashing process's memory and /proc, whatever RLIMIT_CORE says
# (the kernel ignores it for a pipe), except 1: a limit of one byte aborts the dump for a
# pipe and is below the smallest core file otherwise. A program could lower it to 0 again
# (lowering a limit needs no privilege), so changing it is refused: setrlimit and
# prlimit64 naming RLIMIT_CORE with a new value (reading it stays allowed).
RLIMIT_CORE = 4
# personality(2): the plain Linux personalities (PER_LINUX, PER_LINUX32, UNAME26) are
# allowed; every value above them sets a flag that weakens the process
# (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, ...). The query (0xffffffff) is
# refused too: libseccomp compares an argument once per rule, so "above, but not the
# query" cannot be said, and refusing a query costs a program nothing it needs.
PERSONALITY_SAFE_MAX = 0x0020008  # PER_LINUX32 | UNAME26
# The set-user-ID and set-group-ID bits: a file the program made with either runs, for
# anyone on the host who can reach the workspace, as the program's host uid (the sandbox
# user, owner of every workspace; or Harness's own uid when Harness is not root, owner of
# its data directory and keys). The workspace is bound nosuid only inside the sandbox.
# Refused wherever a mode is given: chmod and its kin, mknod, and open/openat/creat when
# they create a file (O_CREAT, or O_TMPFILE's own bit).
SET_ID_BITS = (0o4000, 0o2000)  # S_ISUID, S_ISGID
CREATING_FLAGS = (0o100, 0o20000000)  # O_CREAT, __O_TMPFILE
MODE_ARGUMENT = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "mknod": 1, "mknodat": 2}
OPEN_ARGUMENTS = {"open": (1, 2), "openat": (2, 3)}  # (flags, mode)
AF_UNIX = 1
AF_VSOCK = 40
# socket(AF_UNIX) is refused (as Claude Code's sandbox runtime does): with the network
# allowed, abstract sockets of the host's network namespace are reachable, and a socket
# file left in a writable path could lead to a host service. socketpair() stays allowed
# for streams (pipes between a program's own processes), not for datagrams: a datagram
# socket of a pair still sends to any address it names (sendto, or connect again), so
# socketpair(AF_UNIX, SOCK_DGRAM) and sendto("\0name") reached the host's abstract
# datagram sockets with the network allowed. (AF_UNIX takes SOCK_RAW as SOCK_DGRAM.)
SOCK_TYPE_MASK = 0xF  # the type without SOCK_NONBLOCK and SOCK_CLOEXEC
DATAGRAM_TYPES = (2, 3)  # SOCK_DGRAM, SOCK_RAW
# socket(AF_VSOCK) is refused too: vsock is not network-namespaced, so --unshare-net does
# not stop it, and in a virtual machine it reaches the hypervisor's services (CID 2) and
# any vsock service of the host itself (CID 1, vsock_loopback).
# Every other family but the network's own (AF_INET, AF_INET6, and AF_NETLINK, which
# glibc's getaddrinfo and `ip` use; all three of the sandbox's network namespace) is
# refused too, for socket and socketpair alike: no tool needs them, and each is kernel
# code an unprivileged program otherwise reaches, most loaded on demand by the first
# socket() (AF_ALG's crypto, AF_TIPC, AF_RDS, AF_CAN, AF_BLUETOOTH, AF_XDP, AF_PACKET,
# ...). The kernel refuses a family of AF_MAX (46 in Linux 6.x) or more by itself, and
# reads only the low 32 bits: every value below FAMILY_BOUND is compared on those.
AF_INET = 2
AF_INET6 = 10
AF_NETLINK = 16
NETWORK_FAMILIES = (AF_INET, AF_INET6, AF_NETLINK)
FAMILY_BOUND = 64
# Of netlink, only NETLINK_ROUTE (getaddrinfo, getifaddrs, `ip`) and NETLINK_SOCK_DIAG
# (`ss`; it reads /proc/net without) are allowed. Every other protocol was a sandboxed
# program's too: NETLINK_USERSOCK lets any uid send to another process's socket of its
# network namespace, so with the network allowed (the host's namespace) a program talked
# to any host process listening on one, the channel socket(AF_UNIX) is refused for; and
# the rest is kernel code no tool needs (NETLINK_GENERIC loads a module by family name on
# request, NETLINK_KOBJECT_UEVENT shows the host's device events, NETLINK_AUDIT,
# NETLINK_NETFILTER, NETLINK_XFRM, NETLINK_CONNECTOR answer a program without the
# capabilities they check, but parse what it sends first). The kernel refuses a protocol
# of MAX_LINKS (32) or more itself, and reads the low 32 bits of it.
NETLINK_ALLOWED = (0, 4)  # NETLINK_ROUTE, NETLINK_SOCK_DIAG
NETLINK_BOUND = 32
# Of the Internet families' protocols, those the kernel loads as modules on demand and no
# tool needs are refused too, whatever the socket's type: SCTP, DCCP, L2TP over IP and
# SMC (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) loaded sctp.ko, kernel code an
# unprivileged program otherwise reaches, as AF_TIPC's). TCP, UDP, ICMP, MPTCP stay.
INET_REFUSED_PROTOCOLS = (33, 115, 132, 256)  # DCCP, L2TP, SCTP, SMC


def build() -> seccomp.SyscallFilter:
    """The filter (native architecture only; see the module docstring)."""
    refuse = seccomp.ERRNO(errno.EPERM)
    allowed = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in REFUSED:
        allowed.add_rule(refuse, name)
    allowed.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    # openat2 carries its mode in memory the filter cannot read: ENOSYS, libc uses openat
    allowed.add_rule(seccomp.ERRNO(errno.ENOSYS), "openat2")
    for bit in SET_ID_BITS:
        for name, position in MODE_ARGUMENT.items():
            allowed.add_rule(refuse, name, seccomp.Arg(position, seccomp.MASKED_EQ, bit, bit))
        allowed.add_rule(refuse, "creat", seccomp.Arg(1, seccomp.MASKED_EQ, bit, bit))
        for name, (flags, mode) in OPEN_ARGUMENTS.items():
            for flag in CREATING_FLAGS:
                allowed.add_rule(
                    refuse,
                    name,
                    seccomp.Arg(flags, seccomp.MASKED_EQ, flag, flag),
                    seccomp.Arg(mode, seccomp.MASKED_EQ, bit, bit),
                )
    for flag in NAMESPACE_FLAGS.values():
        allowed.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for request in REFUSED_IOCTLS.values():
        # the request is an unsigned int: compare its low 32 bits only
        allowed.add_rule(refuse, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    allowed.add_rule(refuse, "personality", seccomp.Arg(0, seccomp.GT, PERSONALITY_SAFE_MAX))
    # (the resource is an int: its low 32 bits, as the kernel reads it)
    core = seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, RLIMIT_CORE)
    allowed.add_rule(refuse, "setrlimit", core)
    core = seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, RLIMIT_CORE)
    allowed.add_rule(refuse, "prlimit64", core, seccomp.Arg(2, seccomp.NE, 0))
    # the family is an int: compare its low 32 bits only (the kernel ignores the rest, so
    # an equality on all 64 bits let socket(0x100000001, ...) make an AF_UNIX socket)
    # (AF_UNIX and AF_VSOCK among them; socketpair of AF_UNIX alone, for streams)
    for family in range(FAMILY_BOUND):
        if family not in NETWORK_FAMILIES:
            low = seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, family)
            allowed.add_rule(refuse, "socket", low)
        if family != AF_UNIX:
            low = seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, family)
            allowed.add_rule(refuse, "socketpair", low)
    for protocol in range(NETLINK_BOUND):
        if protocol not in NETLINK_ALLOWED:
            allowed.add_rule(
                refuse,
                "socket",
                seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, AF_NETLINK),
                seccomp.Arg(2, seccomp.MASKED_EQ, 0xFFFFFFFF, protocol),
            )
    for family in (AF_INET, AF_INET6):
        for protocol in INET_REFUSED_PROTOCOLS:
            allowed.add_rule(
                refuse,
                "socket",
                seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, family),
                seccomp.Arg(2, seccomp.MASKED_EQ, 0xFFFFFFFF, protocol),
            )
    # a datagram pair: each end may still send to (sendto) or connect to any named socket
    for kind in DATAGRAM_TYPES:
        allowed.add_rule(
            refuse,
            "socketpair",
            seccomp.Arg(0, seccomp.MASKED_EQ, 0xFFFFFFFF, AF_UNIX),
            seccomp.Arg(1, seccomp.MASKED_EQ, SOCK_TYPE_MASK, kind),
        )
    return allowed


def bpf_file() -> Path:
    """A file holding the filter as BPF, in Harness's data directory (`seccomp/`, mode
    0700: Harness's own, hidden from programs as the rest of it is), named by its
    content's digest: written once, atomically (a rename), and shared by every process
    that builds the same filter; the launcher opens it as bwrap's `--seccomp` FD. (A
    temporary directory per process, removed at exit, stayed behind for every process
    that ended without running exit handlers: each Celery pool process, any killed one.)

    Raises OSError when libseccomp cannot build or export it, or the file cannot be
    written (the start-up probe reports it as a sandbox that cannot run)."""
    from django.conf import settings

    return _bpf_file(Path(settings.DATA_DIR))


@functools.cache
def _bpf_file(data_dir: Path) -> Path:
    with tempfile.TemporaryFile() as out:
        build().export_bpf(out)
        out.seek(0)
        data = out.read()
    directory = data_dir / "seccomp"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"filter-{hashlib.sha256(data).hexdigest()[:32]}.bpf"
    try:
        if path.read_bytes() == data:
            return path
    except FileNotFoundError:
        pass
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=".filter-")
    try:
        with os.fdopen(fd, "wb") as written:
            written.write(data)
            os.fchmod(written.fileno(), 0o400)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return path
