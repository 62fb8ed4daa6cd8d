"""The demo, in a room of its own: `manage.py run_demo` (a whole Harness on the embedded
default with a scripted agent), `manage.py demo_agent` (the agent alone, against a running
Harness), and the small MCP server the demo registers. Nothing else imports it."""
