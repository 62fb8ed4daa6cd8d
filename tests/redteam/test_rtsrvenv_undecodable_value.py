"""Red team of a server's environment (rtsrvenv): a value that is not text is refused.

`add_mcp_server --env KEY=VALUE` takes its value from the command line, where Python
decodes a byte that is not UTF-8 as a lone surrogate. The sandbox writes the server's
environment as UTF-8 text (the script its shell evaluates), so such a value could not be
written: the registration started the launch and failed with the encoder's own error
("UnicodeEncodeError: 'utf-8' codec can't encode character '\\udcff' ..."). Now it is
refused before anything starts, naming the variable, as a NUL character is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from dispatcher.tools.sources.models import McpServer


@pytest.mark.django_db
def test_a_value_that_is_not_utf8_is_refused_by_name(sandboxed_workspace: Path) -> None:
    value = os.fsdecode(b"secret-\xff")  # what argv gives for that byte
    with pytest.raises(CommandError) as refused:
        call_command(
            "add_mcp_server", "undecodable", "--command", "/usr/bin/true", "--env", f"KEY={value}"
        )
    message = str(refused.value)
    assert "Variable KEY holds something that is not UTF-8 text" in message, message
    assert "UnicodeEncodeError" not in message
    assert not McpServer.objects.filter(name="undecodable").exists()
