"""A Codex patch's headers read as Codex reads them: the pinned Codex binary applies each
patch in a scratch project (`codex --codex-run-as-apply-patch`, the program Codex runs
for apply_patch), and Harness must either refuse the patch or name exactly the files the
real Codex wrote. The forms are the ones that split differently in Python and Rust (a
line or paragraph separator, NEL, a form feed, a lone carriage return) and their
neighbours."""

from __future__ import annotations

import os
import posixpath
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatcher.tools._paths import lexical_path_violation, lexical_relative
from dispatcher.tools.codex import patch_paths, rust_lines
from tests.support.paths import ROOT

CODEX = (
    ROOT
    / "var/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"
)

SEPARATORS = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\r", "\x1c", "\x1e", "\u200e", "\x7f"]


@pytest.fixture(scope="module")
def codex_binary() -> Path:
    if not CODEX.exists():
        message = f"The patch tests need the pinned Codex binary at {CODEX}: run `make codex`."
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true and " + message)
        pytest.skip(message)
    return CODEX


def codex_applies(binary: Path, patch: str, scratch: Path) -> set[str]:
    """The files the real Codex wrote for `patch` in `scratch/deep/project`, as paths
    relative to that project ('../../x' when it escaped)."""
    project = scratch / "deep" / "project"
    project.mkdir(parents=True)
    subprocess.run(
        [str(binary), "--codex-run-as-apply-patch", patch],
        cwd=project,
        capture_output=True,
        timeout=30,
        check=False,
    )
    return {
        posixpath.relpath(os.path.join(directory, name), project)
        for directory, _, names in os.walk(scratch)
        for name in names
    }


def harness_reads(patch: str) -> set[str] | None:
    """The files Harness says the patch touches (relative to the project), or None when
    it refuses the patch."""
    try:
        paths = patch_paths(patch)
    except ValueError:
        return None
    return {posixpath.normpath(path) for path in paths}


@pytest.mark.parametrize("separator", SEPARATORS)
def test_a_header_holding_a_separator_is_refused_where_codex_would_escape(
    codex_binary: Path, tmp_path: Path, separator: str
) -> None:
    patch = (
        f"*** Begin Patch\n*** Add File: x{separator}/../../escaped.txt\n+pwned\n*** End Patch\n"
    )
    written = codex_applies(codex_binary, patch, tmp_path)
    with pytest.raises(ValueError, match=f"U\\+{ord(separator):04X}"):
        patch_paths(patch)
    if separator in "\u2028\u2029\x85\x0b\x0c\x1c\x1e":  # Python's splitlines splits there
        assert "x" not in written  # so the old reading ('x') was not what Codex did


def test_the_line_separator_case_codex_took_outside_the_project(
    codex_binary: Path, tmp_path: Path
) -> None:
    patch = "*** Begin Patch\n*** Add File: x\u2028/../../escaped.txt\n+pwned\n*** End Patch\n"
    assert codex_applies(codex_binary, patch, tmp_path) == {"../escaped.txt"}
    assert (tmp_path / "deep" / "escaped.txt").read_text() == "pwned\n"
    with pytest.raises(ValueError, match=r"U\+2028 \(LINE SEPARATOR\)"):
        patch_paths(patch)


@pytest.mark.parametrize(
    "patch",
    [
        "*** Begin Patch\r\n*** Add File: a.txt\r\n+a\r\n*** End Patch\r\n",
        "  *** Begin Patch\n\t*** Add File: sub/b.txt \n+b\n*** End Patch  \n",
        "*** Begin Patch\n*** Add File: c.txt\n+*** Add File: not-a-header.txt\n*** End Patch",
        "*** Begin Patch\n*** Add File: d.txt\n+d\n*** Add File: e/../f.txt\n+f\n*** End Patch",
        "*** Begin Patch\n*** Add File: ../up.txt\n+u\n*** End Patch",
    ],
)
def test_harness_names_exactly_the_files_codex_writes(
    codex_binary: Path, tmp_path: Path, patch: str
) -> None:
    assert harness_reads(patch) == codex_applies(codex_binary, patch, tmp_path)


@pytest.mark.heavy
@settings(max_examples=60, deadline=None)
@given(
    name=st.text(
        alphabet=st.sampled_from([*"ab./ ", *SEPARATORS, "\n", "\u3000", "\xa0"]),
        min_size=1,
        max_size=8,
    )
)
def test_harness_never_misses_a_file_codex_writes(
    tmp_path_factory: pytest.TempPathFactory, name: str
) -> None:
    if not CODEX.exists():
        pytest.skip("no pinned Codex binary")
    patch = f"*** Begin Patch\n*** Add File: {name}\n+x\n*** End Patch\n"
    read = harness_reads(patch)
    written = codex_applies(CODEX, patch, tmp_path_factory.mktemp("p"))
    if read is not None:
        assert written <= read


def test_lines_split_only_at_newline_as_rust_splits_them() -> None:
    assert rust_lines("a\u2028b\r\nc\rd\x85e\n") == ["a\u2028b", "c\rd\x85e"]
    assert rust_lines("a\n\n") == ["a", ""] and rust_lines("") == []


@pytest.mark.parametrize("separator", SEPARATORS + ["\x00", "\x1b", "\x9b", "\u202e"])
def test_a_client_path_with_a_control_or_separator_character_is_denied(separator: str) -> None:
    value = f"/home/dev/project/a{separator}b"
    assert lexical_relative(value, "/home/dev/project") is None
    reason = lexical_path_violation(value, "/home/dev/project")
    assert reason is not None and f"U+{ord(separator):04X}" in reason
