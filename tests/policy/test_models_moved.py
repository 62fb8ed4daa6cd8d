"""The policy models moved from the dispatcher app with their tables: a database built
before the move migrates without touching a row, and its profiles and grants still work."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.heavy

BEFORE_THE_MOVE = [("dispatcher", "0003_session_indexes")]


@pytest.mark.django_db(transaction=True)
def test_a_database_from_before_the_move_keeps_its_profiles_and_grants() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("policy", None), *BEFORE_THE_MOVE])  # the schema of the old main
    old = MigrationExecutor(connection).loader.project_state(BEFORE_THE_MOVE).apps
    user = old.get_model("auth", "User").objects.create(username="pre-move")
    old.get_model("dispatcher", "PermissionProfile").objects.create(
        user=user, mode="trusted", allow=["read_file"], version=3
    )
    agent = old.get_model("dispatcher", "Agent").objects.create(
        owner=user, name="old", token_prefix="oldagent", token_hash="0" * 64
    )
    session = old.get_model("dispatcher", "AgentSession").objects.create(
        agent=agent, mode="trusted", workspace="pre-move-workspace"
    )
    old.get_model("dispatcher", "SessionGrant").objects.create(
        session=session, rule="run_command(make)", tool="run_command"
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())

    from django.contrib.auth.models import User

    from dispatcher.policy.models import PermissionProfile, SessionGrant
    from dispatcher.policy.profiles import profile_for

    profile = profile_for(User.objects.get(username="pre-move"))
    assert (profile.mode, profile.allow, profile.version) == ("trusted", ("read_file",), 3)
    assert PermissionProfile._meta.db_table == "dispatcher_permissionprofile"
    grant = SessionGrant.objects.active().get(session_id=session.pk)
    assert grant.rule == "run_command(make)"
