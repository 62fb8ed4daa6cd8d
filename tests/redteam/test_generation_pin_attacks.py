"""Red team of commit 4117278: the upstream tools' generation read with the repeat count
(admission._repeat_counts, catalog.pin). A change of servers committed before a message
applies to it; one committed during a message, from the next one on; the pin is per
thread and per message; team scoping holds; repeat counts stay right; no SQL injection
or 500 through names, arguments or session ids."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import close_old_connections, connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dispatcher import admission, agents, execution
from dispatcher.gateways import mcp
from dispatcher.gateways.mcp_http import authenticate
from dispatcher.models import Status, ToolCall
from dispatcher.proposals import ProposedCall, canonical_json
from dispatcher.tools.sources import catalog
from dispatcher.tools.sources import services as sources
from tests.mcp.conftest import http_upstream, trusted_upstream  # noqa: F401
from tests.support.factories import AgentFixture, make_agent, submit_one
from tests.teams.world import make_team

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.heavy]


def gateway_submit(session: Any, proposal: ProposedCall, *, preloaded: bool = False) -> ToolCall:
    """The gateway's sequence for one tools/call (mcp._admit_and_run) without its thread
    hops: admitted (and claimed) on this thread, an inline call's body awaited on a loop,
    its result written on this thread."""
    call, pending = mcp.admit(session, proposal, preloaded=preloaded, on_loop=True)
    if pending is None:
        return call
    outcome, seconds = asyncio.run(execution.run_body_async(*pending))
    return mcp.finish(call, pending, outcome, seconds, None)


def proposed(tool_use_id: str, name: str, arguments: Any) -> ProposedCall:
    return ProposedCall(tool_use_id, name, canonical_json(arguments), arguments)


def mcp_session(fx: AgentFixture) -> Any:
    session = agents.join_run(agent=fx.agent, client=mcp.CLIENT, title="MCP", idle=0)[0]
    _, loaded = authenticate(fx.token, session.external_id)
    assert loaded is not None
    return loaded


def post(client: Client, url: str, body: Any, fx: AgentFixture) -> Any:
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", headers=fx.headers)


def api_session(client: Client, fx: AgentFixture) -> str:
    response = post(client, "/api/v1/sessions", {"title": "rt"}, fx)
    assert response.status_code == 201, response.content
    return str(response.json()["id"])


def stored(session_id: str, tool_use_id: str) -> ToolCall:
    return ToolCall.objects.get(session_id=session_id, tool_use_id=tool_use_id)


# --- 1. a change committed before a message applies to it ----------------------------------


def test_a_removed_server_is_no_tool_of_the_next_api_message(trusted_upstream: str) -> None:  # noqa: F811
    fx, client = make_agent(mode="trusted"), Client()
    sid = api_session(client, fx)
    name = f"{trusted_upstream}__echo"
    first = post(client, f"/api/v1/sessions/{sid}/calls", {"calls": [{"id": "a1", "name": name, "arguments": {"text": "x"}}]}, fx)  # fmt: skip
    assert first.status_code in (200, 202), first.content
    assert stored(sid, "a1").status not in (Status.REJECTED, Status.DENIED)
    call_command("remove_mcp_server", trusted_upstream, stdout=StringIO())
    second = post(client, f"/api/v1/sessions/{sid}/calls", {"calls": [{"id": "a2", "name": name, "arguments": {"text": "x"}}]}, fx)  # fmt: skip
    assert second.status_code in (200, 202), second.content
    call = stored(sid, "a2")
    assert call.status == Status.REJECTED, (call.status, call.content)
    assert "does not exist" in call.content


def test_a_removed_server_is_not_run_inline_by_the_next_gateway_message(
    trusted_upstream: str,  # noqa: F811
) -> None:
    fx = make_agent(mode="trusted")
    session = mcp_session(fx)
    name = f"{trusted_upstream}__echo"
    call = gateway_submit(session, proposed("mcp:0", name, {"text": "warm"}), preloaded=True)
    assert call.status == Status.COMPLETED and call.content == "echo: warm"
    call_command("remove_mcp_server", trusted_upstream, stdout=StringIO())
    session = authenticate(fx.token, session.external_id)[1]
    call = gateway_submit(session, proposed("mcp:1", name, {"text": "gone"}), preloaded=True)
    assert call.status == Status.REJECTED, (call.status, call.content)
    assert "echo: gone" not in (call.content or "")


def test_a_change_during_a_message_applies_from_the_next_one(
    trusted_upstream: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server is removed (committed) just after the message's one read: the message
    sees the list as of that read, the next message sees the removal."""
    fx = make_agent(mode="trusted")
    session = mcp_session(fx)
    name = f"{trusted_upstream}__echo"
    real = admission._repeat_counts
    removed: list[bool] = []

    def then_remove(*args: Any) -> Any:
        counts = real(*args)
        if not removed:
            removed.append(True)
            sources.remove_server(name=trusted_upstream, actor="test")
        return counts

    monkeypatch.setattr(admission, "_repeat_counts", then_remove)
    during = gateway_submit(session, proposed("mcp:0", name, {"text": "during"}), preloaded=True)
    assert removed and during.status != Status.REJECTED, (during.status, during.content)
    after = gateway_submit(session, proposed("mcp:1", name, {"text": "after"}), preloaded=True)
    assert after.status == Status.REJECTED, (after.status, after.content)


# --- 5. the pin is per thread and per message ----------------------------------------------


def test_the_pin_does_not_outlive_its_message_on_a_reused_orm_thread(
    trusted_upstream: str,  # noqa: F811
) -> None:
    """Two messages on one reused thread (as mcp.orm_threads reuses them), the server
    removed between: the second sees the removal; no pin is left on the thread."""
    fx = make_agent(mode="trusted")
    session = mcp_session(fx)
    name = f"{trusted_upstream}__echo"
    pool = ThreadPoolExecutor(1)
    threads: list[int] = []

    def one(tool_use_id: str, text: str) -> tuple[str, str, Any]:
        try:
            threads.append(threading.get_ident())
            call = gateway_submit(
                session, proposed(tool_use_id, name, {"text": text}), preloaded=True
            )
            return str(call.status), call.content or "", getattr(catalog._pinned, "value", None)
        finally:
            close_old_connections()

    try:
        status, content, left = pool.submit(one, "mcp:0", "a").result(60)
        assert (status, content, left) == (Status.COMPLETED, "echo: a", None)
        sources.remove_server(name=trusted_upstream, actor="test")
        status, content, left = pool.submit(one, "mcp:1", "b").result(60)
        assert status == Status.REJECTED and left is None, (status, content)
        assert len(set(threads)) == 1
    finally:
        pool.shutdown()


def test_pin_outside_one_generation_is_ignored_and_an_error_unpins() -> None:
    catalog.pin(123)
    assert getattr(catalog._pinned, "value", None) is None
    with pytest.raises(RuntimeError), catalog.one_generation():
        catalog.pin(7)
        assert catalog.generation() == 7
        raise RuntimeError
    assert getattr(catalog._pinned, "value", None) is None
    with catalog.one_generation():
        catalog.pin(None)  # no row: generation 0
        catalog.pin(9)  # the first value is kept
        assert catalog.generation() == 0


def test_a_failed_admission_leaves_no_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(admission, "_write", fail)
    with pytest.raises(RuntimeError):
        submit_one(session, "read_file", {"path": "a"})
    assert getattr(catalog._pinned, "value", None) is None


# --- 2. team scoping -------------------------------------------------------------------------


def test_another_teams_server_is_not_resolved_even_with_a_warm_pinned_cache(client: Client) -> None:
    pay, infra = make_team("pay"), make_team("infra")
    # The cache built by team infra's message at this generation; then team pay's.
    own = submit_one(infra.session, infra.tool.exposed_name, {"text": "hi"}, tool_use_id="i1")
    assert own.status != Status.REJECTED, own.content
    sid = str(pay.session.pk)
    body = {"calls": [{"id": "p1", "name": infra.tool.exposed_name, "arguments": {"text": "hi"}}]}
    response = post(client, f"/api/v1/sessions/{sid}/calls", body, pay.agent)
    assert response.status_code in (200, 202), response.content
    call = stored(sid, "p1")
    assert call.status == Status.REJECTED and "does not exist" in call.content
    assert infra.tool.exposed_name not in call.content.split("Available tools:")[1]
    # The MCP gateway's lane: the same.
    fx = pay.agent
    loaded = mcp_session(fx)
    gw = gateway_submit(loaded, proposed("mcp:9", infra.tool.exposed_name, {"text": "x"}), preloaded=True)  # fmt: skip
    assert gw.status == Status.REJECTED and "does not exist" in gw.content


# --- 3. repeat counts ------------------------------------------------------------------------

ODD_NAMES = [
    "nope",
    "it's",
    'a"b',
    "x'); DROP TABLE dispatcher_toolcall; --",
    "%s",
    "%(x)s",
    "été_工具_🔧",
    "n" * 200,
    "a__b",
]


def test_repeat_counts_many_digests_and_odd_names_in_one_message(
    client: Client, agent: AgentFixture
) -> None:
    sid = api_session(client, agent)
    url = f"/api/v1/sessions/{sid}/calls"
    first = [
        {"id": f"f{i}", "name": name, "arguments": {"k": i, "q": "'\"%s;--é🔧" * 50}}
        for i, name in enumerate(ODD_NAMES)
    ]
    response = post(client, url, {"calls": first}, agent)
    assert response.status_code in (200, 202), response.content
    # 64 calls: every odd name again (2), and 55 new distinct digests, one of them twice.
    second = [
        {"id": f"s{i}", "name": name, "arguments": {"k": i, "q": "'\"%s;--é🔧" * 50}}
        for i, name in enumerate(ODD_NAMES)
    ]
    second += [{"id": f"n{i}", "name": "nope", "arguments": {"n": i}} for i in range(54)]
    second.append({"id": "n0b", "name": "nope", "arguments": {"n": 0}})
    assert len(second) == 64
    response = post(client, url, {"calls": second}, agent)
    assert response.status_code in (200, 202), response.content
    counts = dict(
        ToolCall.objects.filter(session_id=sid).values_list("tool_use_id", "repeat_count")
    )
    for i in range(len(ODD_NAMES)):
        assert (counts[f"f{i}"], counts[f"s{i}"]) == (1, 2), ODD_NAMES[i]
    assert counts["n0"] == 1 and counts["n0b"] == 2
    assert all(counts[f"n{i}"] == 1 for i in range(1, 54))
    # The same arguments under another name is another count; another session none.
    other = api_session(client, agent)
    post(client, f"/api/v1/sessions/{other}/calls", {"calls": [first[0] | {"id": "o"}]}, agent)
    assert stored(other, "o").repeat_count == 1


def test_excluded_tools_count_one_and_a_message_of_them_only_still_sees_changes(
    client: Client, agent: AgentFixture, settings: Any
) -> None:
    settings.HARNESS_REPEAT_EXCLUDED_TOOLS = ["nope"]
    sid = api_session(client, agent)
    url = f"/api/v1/sessions/{sid}/calls"
    calls = [{"id": f"e{i}", "name": "nope", "arguments": {"x": 1}} for i in range(3)]
    calls.append({"id": "m", "name": "other", "arguments": {"x": 1}})
    post(client, url, {"calls": calls}, agent)
    post(client, url, {"calls": [{"id": "m2", "name": "other", "arguments": {"x": 1}}]}, agent)
    counts = dict(
        ToolCall.objects.filter(session_id=sid).values_list("tool_use_id", "repeat_count")
    )
    assert counts == {"e0": 1, "e1": 1, "e2": 1, "m": 1, "m2": 2}


def test_the_same_message_twice_and_concurrently_counts_each_call_once(agent: AgentFixture) -> None:
    session = agents.start_session(agent=agent.agent)
    message = [proposed("c1", "nope", {"x": 1}), proposed("c2", "nope", {"x": 1})]
    first = admission.submit_calls(session=session, dialect="native", proposed=message)
    # Resubmitted with one new call: the IntegrityError path (look_up) counts it on top.
    again = admission.submit_calls(
        session=session, dialect="native", proposed=[*message, proposed("c3", "nope", {"x": 1})]
    )
    assert [c.pk for c in again[:2]] == [c.pk for c in first]
    counts = dict(
        ToolCall.objects.filter(session=session).values_list("tool_use_id", "repeat_count")
    )
    assert counts == {"c1": 1, "c2": 2, "c3": 3}
    # Concurrently: one call per id, whichever request wins.
    message = [proposed(f"k{i}", "nope", {"y": 1}) for i in range(3)]
    barrier = threading.Barrier(4)

    def go() -> list[str]:
        try:
            barrier.wait(10)
            calls = admission.submit_calls(session=session, dialect="native", proposed=message)
            return [str(c.pk) for c in calls]
        finally:
            close_old_connections()

    with ThreadPoolExecutor(4) as pool:
        results = [f.result(60) for f in [pool.submit(go) for _ in range(4)]]
    assert all(r == results[0] for r in results)
    rows = ToolCall.objects.filter(session=session, tool_use_id__startswith="k")
    assert sorted(r.repeat_count for r in rows) == [1, 2, 3]


def test_one_statement_reads_counts_and_generation_even_with_many_digests(
    agent: AgentFixture,
) -> None:
    session = agents.start_session(agent=agent.agent)
    submit_one(session, "nope", {"warm": 1}, tool_use_id="w0")
    message = [proposed(f"g{i}", "nope", {"i": i}) for i in range(40)]
    with CaptureQueriesContext(connection) as queries:
        admission.submit_calls(session=session, dialect="native", proposed=message)
    sql = [q["sql"] for q in queries.captured_queries]
    assert sum('"sources_generation"' in s for s in sql) == 1, sql


# --- 4. no injection, no 500 -----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/sessions/not-a-uuid/calls",
        "/api/v1/sessions/00000000-0000-0000-0000-000000000000/calls",
        "/api/v1/sessions/%27%20OR%201%3D1--/calls",
    ],
)
def test_bad_session_ids_are_clear_errors(client: Client, agent: AgentFixture, path: str) -> None:
    body = {"calls": [{"id": "x", "name": "nope", "arguments": {}}]}
    response = post(client, path, body, agent)
    assert response.status_code in (400, 404, 422), (response.status_code, response.content)


@pytest.mark.parametrize(
    "name, arguments",
    [
        ("nul\u0000name", {"x": 1}),
        ("nope", {"x": "nul\u0000value"}),
        ("nope", {"nul\u0000key": 1}),
        ("", {"x": 1}),
        ("x" * 5000, {"x": 1}),
        ("nope", {"x": "\ud800"}),
    ],
)
def test_odd_names_and_arguments_get_an_answer_not_a_500(
    client: Client, agent: AgentFixture, name: str, arguments: Any
) -> None:
    sid = api_session(client, agent)
    body = json.dumps({"calls": [{"id": "z", "name": name, "arguments": arguments}]})
    response = post(client, f"/api/v1/sessions/{sid}/calls", body, agent)
    assert response.status_code < 500, (response.status_code, response.content[:300])


# --- the sources tables unreadable: built-in tools still admitted ----------------------------


def test_built_in_tools_are_admitted_when_the_sources_tables_cannot_be_read(
    client: Client, agent: AgentFixture
) -> None:
    """catalog.generation() reads "no upstream tools" when the sources tables cannot be
    read (a DatabaseError): a call of a built-in tool never depended on them. The repeat
    count's statement now reads the generation too, so it must not turn that into a 500
    for every message."""
    sid = api_session(client, agent)
    url = f"/api/v1/sessions/{sid}/calls"
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {quote('sources_generation')} RENAME TO {quote('rt_gone')}")
    try:
        body = {"calls": [{"id": "b1", "name": "read_file", "arguments": {"path": "a.txt"}}]}
        response = post(client, url, body, agent)
        assert response.status_code < 500, (response.status_code, response.content[:300])
        assert stored(sid, "b1").status not in (Status.REJECTED, Status.DENIED)
    finally:
        close_old_connections()
        with connection.cursor() as cursor:
            cursor.execute(
                f"ALTER TABLE {quote('rt_gone')} RENAME TO {quote('sources_generation')}"
            )


def test_a_prepared_repeat_statement_still_reads_each_messages_generation(
    trusted_upstream: str,  # noqa: F811
) -> None:
    """The statement of two digests, run past psycopg's prepare threshold on one
    connection: the removal committed before the seventh message applies to it."""
    fx = make_agent(mode="trusted")
    session = agents.start_session(agent=fx.agent)
    name = f"{trusted_upstream}__echo"
    for i in range(7):
        if i == 6:
            call_command("remove_mcp_server", trusted_upstream, stdout=StringIO())
        message = [proposed(f"u{i}", name, {"text": "t"}), proposed(f"v{i}", "nope", {"i": 1})]
        upstream, _ = admission.submit_calls(session=session, dialect="native", proposed=message)
        rejected = upstream.status == Status.REJECTED
        assert rejected == (i == 6), (i, upstream.status, upstream.content)
    counts = ToolCall.objects.filter(session=session).values_list("tool_use_id", "repeat_count")
    assert dict(counts) == {
        **{f"u{i}": i + 1 for i in range(7)},
        **{f"v{i}": i + 1 for i in range(7)},
    }
