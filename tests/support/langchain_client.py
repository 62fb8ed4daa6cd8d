"""LangChain's MCP adapters as an agent uses them, run by tests/mcp/test_runs_live.py in
a virtualenv of its own (`make langchain-client`, var/langchain-client): the adapters
need the MCP SDK's v1 line, Harness runs on v2.

    var/langchain-client/bin/python tests/support/langchain_client.py URL TOKEN STEPS

STEPS is a JSON list of [tool, arguments]: each is called in turn through
`MultiServerMCPClient` with its default, a new MCP session per tool call. Prints a JSON
list of what each call answered (as text).
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient


async def main(url: str, token: str, steps: list[tuple[str, dict[str, Any]]]) -> list[str]:
    client = MultiServerMCPClient(
        {
            "harness": {
                "url": url,
                "transport": "streamable_http",
                "headers": {"Authorization": f"Bearer {token}"},
            }
        }
    )
    tools = {tool.name: tool for tool in await client.get_tools()}
    answers = []
    for name, arguments in steps:
        answers.append(json.dumps(await tools[name].ainvoke(arguments), default=str))
    return answers


if __name__ == "__main__":
    url, token, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    print(json.dumps(asyncio.run(main(url, token, steps))))
