"""Planning and sending notifications: every change to deliveries.

Who calls what: the approvals receivers enqueue `tasks.notify_ask` after an ask commits
and `tasks.notify_outcome` after it is decided or expires; those plan deliveries here
(one per channel, or per recipient for email and push) and each delivery is sent by its
own task (`deliver`), retried with backoff while it fails. Channels are configured in
`channels`.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from celery import current_app
from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from audit.roles import REVIEWER
from dispatcher.models import ToolCall
from floor.compiled import Compiled
from teams.models import Membership

from .. import links
from ..models import ApprovalRequest
from ..services import people_behind, who_may_fill
from . import messages, senders
from .models import Channel, Delivery, Kind, PushSubscription

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 6


# --- Who hears of an ask ------------------------------------------------------------------


def reviewers(team_id: int) -> Any:
    """Active users who review the team's agents: the team's reviewers and the
    organization's (superusers hold every role), as teams.scope reaches them."""
    team_reviewers = Membership.objects.filter(team_id=team_id, role=REVIEWER).values("user_id")
    return (
        User.objects.filter(is_active=True)
        .filter(Q(is_superuser=True) | Q(groups__name=REVIEWER) | Q(pk__in=team_reviewers))
        .distinct()
    )


def next_tier(escalated_to: int | None) -> Any:
    """Active users of an escalation's next tier: the reviewers of the team it escalated
    to, or (no team) the organization's reviewers."""
    if escalated_to is not None:
        team_reviewers = Membership.objects.filter(team_id=escalated_to, role=REVIEWER)
        people = User.objects.filter(pk__in=team_reviewers.values("user_id"))
    else:
        people = User.objects.filter(Q(is_superuser=True) | Q(groups__name=REVIEWER))
    return User.objects.filter(is_active=True, pk__in=people.values("pk"))


def names_agent(entries: list[str], name: str, team: str) -> bool:
    """Whether a channel's "agents" route names the agent `name` of the team `team`: an
    entry `team/name` names that team's agent of that name, `team/*` every agent of the
    team, and a bare `name` an agent of that name in any team. (An agent's name is unique
    per owner only, and a client signing in chooses its own: a bare name is matched by
    another team's agent of the same name, so a team's channel names its agents with the
    team. A team's name holds no `/`.)"""
    for entry in entries:
        scope, slash, named = entry.partition("/")
        if not slash:
            if entry == name:
                return True
        elif scope == team and named in ("*", name):
            return True
    return False


def matches(channel: Channel, approval: ApprovalRequest) -> bool:
    call = approval.call
    rule = str(call.provenance.get("rule", ""))
    return (
        (
            not channel.match_agents
            or names_agent(channel.match_agents, call.session.agent.name, call.session.team.name)
        )
        and (not channel.match_tools or call.name in channel.match_tools)
        and (not channel.match_rules or rule in channel.match_rules)
    )


def recipients(channel: Channel, approval: ApprovalRequest, tier: bool = False) -> list[User]:
    """The channel's users and members of its groups who review the agent's team (every
    such reviewer when it names none), less the people behind the agent (owner, sponsor,
    the person who started its sessions) when self-approval is forbidden. A reviewer of
    another team is never a recipient, whatever the channel names: they would get a call
    they cannot see and a link that decides nothing. `tier`: the ask escalated, and its
    next tier (`next_tier`) is told. A quorum that names groups asks only the people whose
    approval would fill one of its open places (services.who_may_fill): its groups'
    members for the groups' places, every such reviewer while a place anyone may fill is
    open. When no one of the tier (the agent's team's reviewers, or the next tier) could
    fill one, everyone the channel names of it is told: an ask is never told to no one."""
    if tier:
        everyone = next_tier(approval.escalated_to_id)
    else:
        everyone = reviewers(approval.call.session.team_id)
    if settings.HARNESS_FORBID_SELF_APPROVAL:
        everyone = everyone.exclude(pk__in=list(people_behind(approval.call.session.agent)))
    people = everyone
    named_users = list(channel.users.values_list("pk", flat=True))
    named_groups = list(channel.groups.values_list("pk", flat=True))
    if named_users or named_groups:
        people = people.filter(Q(pk__in=named_users) | Q(groups__pk__in=named_groups)).distinct()
    found = list(people.order_by("username"))
    fill = who_may_fill(approval, [p.pk for p in found])
    if not fill and not who_may_fill(approval, list(everyone.values_list("pk", flat=True))):
        # No one of this tier can fill an open place (a group with no member who may
        # decide, everyone who could has voted): it is still told to them all, who can
        # deny it or see that its groups get members, rather than to no one.
        return found
    return [p for p in found if p.pk in fill]


# --- Channels from the environment ------------------------------------------------------------

ENV_CHANNELS = {
    "HARNESS_WEBHOOK_URL": ("env: webhook", Kind.WEBHOOK),
    "HARNESS_SLACK_WEBHOOK_URL": ("env: slack", Kind.SLACK),
    "HARNESS_NOTIFY_EMAIL": ("env: email", Kind.EMAIL),
}


def _env_config(variable: str) -> dict[str, Any] | None:
    if variable == "HARNESS_WEBHOOK_URL" and settings.HARNESS_WEBHOOK_URL:
        return {"url": settings.HARNESS_WEBHOOK_URL, "secret": settings.HARNESS_WEBHOOK_SECRET}
    if variable == "HARNESS_SLACK_WEBHOOK_URL" and settings.HARNESS_SLACK_WEBHOOK_URL:
        return {"webhook_url": settings.HARNESS_SLACK_WEBHOOK_URL}
    if variable == "HARNESS_NOTIFY_EMAIL" and settings.HARNESS_NOTIFY_EMAIL:
        return {"addresses": list(settings.HARNESS_NOTIFY_EMAIL)}
    return None


def sync_env_channels() -> None:
    """Keep the channels the environment configures in step with it: each sends every
    ask to every reviewer; one whose variable is gone is disabled. Idempotent."""
    for variable, (name, kind) in ENV_CHANNELS.items():
        config = _env_config(variable)
        channel = Channel.objects.filter(source=variable).first()
        if config is None:
            if channel is not None and channel.enabled:
                Channel.objects.filter(pk=channel.pk).update(enabled=False)
            continue
        if channel is None:
            Channel.objects.create(name=name, kind=kind, config=config, source=variable)
        elif channel.config != config or not channel.enabled:
            Channel.objects.filter(pk=channel.pk).update(config=config, enabled=True)


# --- Planning and sending ----------------------------------------------------------------------

PLAN_ASK_TASK = "approvals.tasks.notify_ask"
PLAN_OUTCOME_TASK = "approvals.tasks.notify_outcome"
PLAN_ESCALATION_TASK = "approvals.tasks.notify_escalation"
DELIVER_TASK = "approvals.tasks.deliver"


def _send_task(name: str, argument: Any) -> None:
    """One Celery message, never retried here: a broker that is down costs a notification
    (logged), never the request's time."""
    try:
        current_app.send_task(name, args=(argument,), retry=False)
    except Exception:
        logger.warning("could not enqueue %s(%s)", name, argument, exc_info=True)


def enqueue_ask(approval_id: int) -> None:
    """Inside the ask's transaction: after it commits, plan and send its notifications."""

    def send() -> None:
        if Channel.objects.filter(enabled=True).exists() or any(
            _env_config(variable) for variable in ENV_CHANNELS
        ):
            _send_task(PLAN_ASK_TASK, approval_id)

    transaction.on_commit(send, robust=True)


def enqueue_outcome(call_id: str) -> tuple[int | None, ...] | None:
    """After a call left pending: a second event where the ask was delivered. Returns
    the teams that saw the call (its agent's, and the one its ask escalated to), read in
    the same statement, for the live queues' removal (approvals.live): one read after
    every decision serves both."""
    rows = _OUTCOME_FACTS.tuples(UUID(call_id))
    if not rows:
        return None
    team_id, escalated_to, asked = rows[0]
    if asked:
        _send_task(PLAN_OUTCOME_TASK, call_id)
    return (int(team_id), escalated_to)


# Read after every decision (floor.compiled): the call's team, and whether its ask was
# delivered anywhere.
_OUTCOME_FACTS = Compiled(
    lambda call_id: (
        ToolCall.objects.filter(pk=call_id)
        .annotate(
            asked=Exists(
                Delivery.objects.filter(
                    approval__call_id=OuterRef("pk"), event=Delivery.Event.ASKED
                )
            )
        )
        .order_by()
        .values_list("session__team_id", "approval__escalated_to_id", "asked")[:1]
    )
)


def notify_ask(approval_id: int) -> None:
    for delivery_id in plan_ask(approval_id):
        _send_task(DELIVER_TASK, delivery_id)


def notify_outcome(call_id: str) -> None:
    approval = ApprovalRequest.objects.filter(call_id=UUID(call_id)).first()
    for delivery_id in plan_outcome(approval.pk) if approval is not None else []:
        _send_task(DELIVER_TASK, delivery_id)


def plan_ask(approval_id: int, event: str = Delivery.Event.ASKED) -> list[str]:
    """Create the deliveries of one ask (after its commit), or of its escalation (`event`
    ESCALATED: to the next tier's people, through the same channels); returns their ids
    to send."""
    sync_env_channels()
    approval = _approval(approval_id)
    if approval is None:
        return []
    planned: list[Delivery] = []
    for channel in Channel.objects.filter(enabled=True).prefetch_related("users", "groups"):
        if not matches(channel, approval):
            continue
        planned += _deliveries(channel, approval, event)
    Delivery.objects.bulk_create(planned)
    return [str(d.pk) for d in planned]


def _deliveries(channel: Channel, approval: ApprovalRequest, event: str) -> list[Delivery]:
    ask = {"channel": channel, "approval": approval, "event": event}
    if channel.kind in (Kind.WEBHOOK, Kind.SLACK):
        return [Delivery(**ask)]
    people = recipients(channel, approval, tier=event == Delivery.Event.ESCALATED)
    if channel.kind == Kind.EMAIL:
        out = [Delivery(**ask, recipient=p, address=p.email) for p in people if p.email]
        known = {p.email.lower() for p in people if p.email}
        extra = [a for a in channel.config.get("addresses", []) if a.lower() not in known]
        return out + [Delivery(**ask, address=address) for address in extra]
    subscriptions = PushSubscription.objects.filter(user__in=people)
    return [Delivery(**ask, recipient=s.user, subscription=s) for s in subscriptions]


def notify_escalation(approval_id: int) -> None:
    for delivery_id in plan_ask(approval_id, event=Delivery.Event.ESCALATED):
        _send_task(DELIVER_TASK, delivery_id)


def enqueue_escalation(approval_id: int) -> None:
    """After an escalation committed: plan its notifications to the next tier."""
    _send_task(PLAN_ESCALATION_TASK, approval_id)


def plan_outcome(approval_id: int) -> list[str]:
    """After the call left pending: a second event for every webhook that was told of
    the ask, and an update in place of every Slack bot message."""
    approval = _approval(approval_id)
    if approval is None:
        return []
    asked = Delivery.objects.filter(approval=approval, event=Delivery.Event.ASKED).select_related(
        "channel"
    )
    planned, seen = [], set()
    for delivery in asked:
        channel = delivery.channel
        if channel.pk in seen or not channel.enabled:
            continue
        bot = channel.kind == Kind.SLACK and "bot_token" in channel.config
        if channel.kind == Kind.WEBHOOK or (bot and delivery.external.get("ts")):
            seen.add(channel.pk)
            planned.append(
                Delivery(
                    channel=channel,
                    approval=approval,
                    event=Delivery.Event.DECIDED,
                    external=delivery.external,
                )
            )
    Delivery.objects.bulk_create(planned)
    return [str(d.pk) for d in planned]


def _approval(approval_id: int) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.select_related("call__session__agent__oauth_client")
        .prefetch_related("votes__voter")
        .filter(pk=approval_id)
        .first()
    )


def deliver(delivery_id: str) -> None:
    """Send one delivery and record what happened. Raises senders.DeliveryFailed (after
    recording it) while attempts remain, so the task retries it with backoff."""
    delivery = (
        Delivery.objects.select_related(
            "channel", "approval__call__session__agent", "recipient", "subscription"
        )
        .filter(pk=UUID(delivery_id))
        .first()
    )
    if delivery is None or delivery.state in (Delivery.State.SENT, Delivery.State.GAVE_UP):
        return
    if not delivery.channel.enabled:
        Delivery.objects.filter(pk=delivery.pk).update(
            state=Delivery.State.GAVE_UP, last_error="The channel was disabled."
        )
        return
    if delivery.recipient is not None and not _still_asked(delivery):
        # (planned before the person lost the role, the team, the account or their
        # place: a message now would show them a call they may no longer see)
        Delivery.objects.filter(pk=delivery.pk).update(
            state=Delivery.State.GAVE_UP,
            last_error=(
                f"Not sent: {delivery.recipient.get_username()} no longer reviews this call "
                "(their account, role or team changed, or the quorum no longer needs them)."
            ),
        )
        return
    attempts = delivery.attempts + 1
    try:
        status, external = _send(delivery)
    except senders.DeliveryFailed as failure:
        state = Delivery.State.FAILED if attempts < MAX_ATTEMPTS else Delivery.State.GAVE_UP
        Delivery.objects.filter(pk=delivery.pk).update(
            attempts=attempts,
            state=state,
            last_error=str(failure)[:2000],
            response_status=failure.status,
        )
        logger.warning(
            "notification %s via %s failed (attempt %s): %s",
            delivery.pk,
            delivery.channel.name,
            attempts,
            failure,
        )
        if state == Delivery.State.FAILED:
            raise
        return
    Delivery.objects.filter(pk=delivery.pk).update(
        attempts=attempts,
        state=Delivery.State.SENT,
        sent_at=timezone.now(),
        response_status=status,
        external=external or delivery.external,
    )  # last_error stays: the page shows what failed before it went through


def _still_asked(delivery: Delivery) -> bool:
    """Whether a delivery to a person is still theirs to get: the recipients are worked
    out again at sending, as a webhook's or Slack's are (an email or a push planned
    before a role was removed or an account deactivated is not sent)."""
    tier = delivery.event == Delivery.Event.ESCALATED
    if delivery.event != Delivery.Event.ASKED and not tier:
        return True
    people = recipients(delivery.channel, delivery.approval, tier)
    return any(p.pk == delivery.recipient_id for p in people)


def _send(delivery: Delivery) -> tuple[int | None, dict[str, str] | None]:
    channel, approval = delivery.channel, delivery.approval
    tier = delivery.event == Delivery.Event.ESCALATED
    asked = delivery.event == Delivery.Event.ASKED or tier
    config = channel.config
    if channel.kind == Kind.WEBHOOK:
        people = recipients(channel, approval, tier) if asked else []
        theirs = links_of(approval, people)
        links_list = [{"reviewer": p.get_username(), **theirs[p.pk]} for p in people]
        body = messages.webhook_body(approval, delivery.event, links_list, str(delivery.pk))
        return senders.send_webhook(config["url"], config.get("secret", ""), body), None
    if channel.kind == Kind.SLACK:
        people = recipients(channel, approval, tier) if asked else []
        theirs = links_of(approval, people)
        links_list = [{"reviewer": p.get_username(), **theirs[p.pk]} for p in people]
        # (Slack reads the top-level text as mrkdwn too: what its notifications show)
        text = messages.slack_text(approval) if asked else messages.outcome_text(approval)
        blocks = messages.slack_blocks(approval, links_list, decided=not asked)
        if "bot_token" in config:
            return 200, senders.send_slack_message(
                config, text, blocks, ts=delivery.external.get("ts", "")
            )
        return senders.send_slack_webhook(config["webhook_url"], text, blocks), None
    if channel.kind == Kind.EMAIL:
        person = delivery.recipient
        person_links = links_of(approval, [person])[person.pk] if person is not None else None
        text = messages.email_body(approval, person_links)
        sent = senders.send_email([delivery.address], messages.email_subject(approval), text)
        return sent, None
    subscription = delivery.subscription
    if subscription is None or delivery.recipient is None:
        raise senders.DeliveryFailed("The push subscription was removed.")
    info = {"endpoint": subscription.endpoint, "keys": subscription.keys}
    person = delivery.recipient
    payload = messages.push_payload(approval, links_of(approval, [person])[person.pk])
    return senders.send_push(info, payload), None


def links_of(approval: ApprovalRequest, people: list[User]) -> dict[Any, dict[str, str]]:
    """Each recipient's links, by user id: one-tap links (approvals.links.links_for) for
    whoever's approval would fill a place still open (services.who_may_fill); for anyone
    else, only the call's page and why they cannot approve it. Those others are told only
    when no one of the tier could fill a place (`recipients`' fallback: a group with no
    member who may decide it): an Approve link would be refused when used (403), and a
    one-tap Deny beside it would be a decision they were never asked for."""
    fill = who_may_fill(approval, [p.pk for p in people])
    page = messages.detail_url(approval)
    why = messages.cannot_approve(approval)
    return {
        p.pk: links.links_for(approval, p)
        if p.pk in fill
        else {"open": page, "cannot_approve": why}
        for p in people
    }
