"""The coding-agent tests' fixture: `harness-hook` as pip installs it, from this checkout."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT


@pytest.fixture(scope="session")
def hook_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with `harness-hook` as pip installs the console script (this checkout's)."""
    directory = tmp_path_factory.mktemp("bin")
    script = directory / "harness-hook"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from dispatcher.gateways.hook_command import main\n"
        "sys.exit(main())\n"
    )
    script.chmod(0o755)
    return directory
