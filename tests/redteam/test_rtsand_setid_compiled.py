"""Red team of the sandbox (rtsand): a C program an agent compiles in its workspace makes
no set-user-ID or set-group-ID file by the ways Python does not take.

Held when tried (a guard, not a fix): chmod through /proc/self/fd/N, a mode or open flags
with bits above the 32 the kernel reads (the filter compares the bits it must), the
x32 system call table (0x40000000 | nr: libseccomp's filter kills the process, SIGSYS),
fchmod of a memfd (fexecve of a set-ID memfd would need it), io_uring. Compiled with the
sandbox's own gcc through run_command, in the real sandbox."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispatcher.tools.base import ExecutionContext
from dispatcher.tools.run_command import TOOL as RUN_COMMAND

PROGRAM = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
static void said(const char *what, long result) {
  printf("%s %s\n", what, result < 0 ? strerror(errno) : "done");
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  if (argc > 1) {  /* the x32 table: chmod is 90 there too */
    said("x32", syscall(0x40000000 | 90, "plain", 04755));
    return 0;
  }
  close(open("plain", O_CREAT | O_WRONLY, 0755));
  int fd = open("plain", O_RDONLY);
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  said("chmod-proc", chmod(path, 04755));
  said("chmod-high", syscall(SYS_chmod, "plain", 0xffffffff00000000UL | 02755));
  said("open-high", syscall(SYS_openat, AT_FDCWD, "high", 0x100000000UL | O_CREAT | O_WRONLY, 04755));
  said("creat", syscall(SYS_creat, "created", 0x700000000UL | 06755));
  int memfd = memfd_create("x", 0);
  said("memfd", fchmod(memfd, 04755));
  said("io_uring", syscall(SYS_io_uring_setup, 4, NULL));
  struct stat info;
  stat("plain", &info);
  printf("plain %o\n", info.st_mode & 07777);
  return 0;
}
"""


def _run(workspace: Path, *argv: str) -> str:
    ctx = ExecutionContext(workspace=workspace, call_id="rtsand", timeout=60, output_limit=20_000)
    return str(RUN_COMMAND.execute(ctx, {"argv": list(argv)}))


def test_a_compiled_program_makes_no_set_id_file(sandboxed_workspace: Path) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed on this host")
    (sandboxed_workspace / "setid.c").write_text(PROGRAM)
    built = _run(sandboxed_workspace, "gcc", "-o", "setid", "setid.c")
    assert built.startswith("exit code 0"), built
    out = _run(sandboxed_workspace, "./setid")
    assert out.startswith("exit code 0"), out
    for what in ("chmod-proc", "chmod-high", "open-high", "creat", "memfd", "io_uring"):
        assert f"{what} Operation not permitted" in out, out
    assert "plain 755" in out, out
    assert not (sandboxed_workspace / "high").exists()
    assert not (sandboxed_workspace / "created").exists()
    x32 = _run(sandboxed_workspace, "./setid", "x32")
    assert "killed by SIGSYS" in x32 and "x32 done" not in x32, x32
    assert (sandboxed_workspace / "plain").stat().st_mode & 0o7777 == 0o755
