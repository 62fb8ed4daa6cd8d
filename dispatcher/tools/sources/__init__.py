"""Tool sources beyond the built-in tools: upstream MCP servers (Django app label `sources`).

An admin registers a server (stdio command or Streamable HTTP URL); its tools appear in
the registry as `SERVER__tool`, each pinned to the fingerprint of its definition. The
registry reads them through `catalog`; workers call them through `upstream`.
"""
