"""A real agent framework on the agent surface: pydantic-ai's FunctionModel and TestModel
call the generated tool definitions, against the session's sink (see test_agent.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai needs Python 3.11 or newer")

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from test_agent import APP, SIGNUP, TOOLS, SignupApp, trail, untouched

from pytest_mailbox import Mailbox
from pytest_mailbox.contract import dump_receipt
from pytest_mailbox.sink import SmtpEndpoint
from pytest_mailbox.store import Store


@pytest.fixture
def app(mailbox_server: SmtpEndpoint) -> SignupApp:
    return SignupApp(mailbox_server.host, mailbox_server.port)


def _pydantic_ai_tools(
    tools: Any, harness: dict[str, Callable[..., Any]] | None = None
) -> list[Tool[None]]:
    """pydantic-ai tools from the generated (OpenAI strict) definitions, plus harness tools."""

    def bind(name: str) -> Callable[..., dict[str, Any]]:
        def run(ctx: RunContext[None], **arguments: Any) -> dict[str, Any]:
            answer: dict[str, Any] = tools.call(name, arguments, ctx.tool_call_id)
            return answer

        return run

    found = [
        Tool.from_schema(
            bind(d["function"]["name"]),
            name=d["function"]["name"],
            description=d["function"]["description"],
            json_schema=d["function"]["parameters"],
            takes_ctx=True,
        )
        for d in tools.definitions("openai")
    ]
    return found + [Tool(function) for function in (harness or {}).values()]


def _returns(messages: list[ModelMessage]) -> dict[str, Any]:
    """The latest return of each tool in the conversation so far."""
    return {
        part.tool_name: part.content
        for message in messages
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }


@SIGNUP
def test_pydantic_ai_function_model_signs_up_through_the_definitions(
    isolated_mailbox: Mailbox, app: SignupApp
) -> None:
    tools = isolated_mailbox.agent_tools()

    def sign_up(email: str) -> str:
        """Fill in the app's sign-up form."""
        app.signup(email)
        return "signed up; check the mailbox"

    def open_verification_link(message_id: str) -> dict[str, bool]:
        """The harness opens the message's link; the model never sees it."""
        return {"verified": app.verify(tools.reveal(message_id, domain=APP))}

    seen: list[list[str]] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        seen.append([t.name for t in info.function_tools])
        got = _returns(messages)
        fid = got.get("reserve_mailbox", {}).get("fixture_id")
        message_id = got.get("wait_for_message", {}).get("message_id")
        step: tuple[str, dict[str, Any]] | None = None
        if "wait_for_message" not in got:
            step = ("wait_for_message", {"fixture_id": "my mailbox", "kind": "link", "timeout": 9})
        if "wait_for_message" in got and fid is None:
            step = ("reserve_mailbox", {"purpose": "signup", "ttl": 60})
        elif fid and "sign_up" not in got:
            step = ("sign_up", {"email": got["reserve_mailbox"]["address"]})
        elif "sign_up" in got and message_id is None:
            step = ("wait_for_message", {"fixture_id": fid, "kind": "link", "timeout": 10})
        elif message_id and "claim_message" not in got:
            selector = {"message_id": message_id, "subject_contains": None}
            step = ("claim_message", {"fixture_id": fid, "selector": selector, "lease": None})
        elif "claim_message" in got and "open_verification_link" not in got:
            step = ("open_verification_link", {"message_id": message_id})
        elif "open_verification_link" in got and "ack_message" not in got:
            fence = got["claim_message"]["fence"]
            ack = {"fixture_id": fid, "message_id": message_id, "fence": fence}
            step = ("ack_message", ack)
        elif "ack_message" in got and "release_mailbox" not in got:
            step = ("release_mailbox", {"fixture_id": fid, "reason": "released_success"})
        if step is None:
            return ModelResponse(parts=[TextPart("Signed up and verified.")])
        return ModelResponse(parts=[ToolCallPart(step[0], step[1], tool_call_id=f"p{len(seen)}")])

    harness = {"sign_up": sign_up, "open_verification_link": open_verification_link}
    agent = Agent(FunctionModel(model), tools=_pydantic_ai_tools(tools, harness))
    result = asyncio.run(agent.run("Sign up with a fresh mailbox and verify the address."))

    assert result.output == "Signed up and verified."
    assert isolated_mailbox.address in app.verified
    assert seen[0] == [*TOOLS.split(", "), "sign_up", "open_verification_link"]
    assert trail(isolated_mailbox) == [
        ("wait_for_message", ["proposed", "rejected"], "rejected"),
        ("reserve_mailbox", ["proposed", "allowed", "executed"], "reserved"),
        ("wait_for_message", ["proposed", "allowed", "executed"], "waiting"),
        ("claim_message", ["proposed", "allowed", "executed"], "claimed"),
        ("ack_message", ["proposed", "allowed", "executed"], "consumed"),
        ("release_mailbox", ["proposed", "allowed", "executed"], "released"),
    ]
    receipt = isolated_mailbox.receipt()
    assert [e.tool_call_id for e in receipt.evidence or []] == ["p1", "p2", "p4", "p5", "p7", "p8"]
    app.assert_secret_free(json.dumps(result.all_messages_json().decode()), dump_receipt(receipt))


@SIGNUP
def test_pydantic_ai_test_model_calls_every_tool_and_nothing_runs(
    isolated_mailbox: Mailbox, mailbox_store: Store
) -> None:
    tools = isolated_mailbox.agent_tools()
    before = untouched(mailbox_store, isolated_mailbox)
    agent = Agent(TestModel(), tools=_pydantic_ai_tools(tools))
    result = asyncio.run(agent.run("Do whatever you like with the mailbox."))
    answers = json.loads(result.output)
    assert sorted(answers) == sorted(TOOLS.split(", "))
    # placeholders are not this run's ids: every call refused before the adapter
    assert {a["status"] for a in answers.values()} <= {"rejected", "policy_denied"}
    assert untouched(mailbox_store, isolated_mailbox) == before
    assert {tuple(steps) for _, steps, _ in trail(isolated_mailbox)} == {("proposed", "rejected")}


@pytest.mark.email_contract(purpose="signup", ttl=120, lease=30, link_domains=[APP], max_reads=5)
def test_pydantic_ai_agent_tells_the_friends_invitation_from_the_copy_by_tag(
    isolated_mailbox: Mailbox, mailbox_store: Store, app: SignupApp
) -> None:
    tools = isolated_mailbox.agent_tools()
    own = isolated_mailbox.mailbox_id
    friend = isolated_mailbox.tagged("friend")
    app.signup(friend)  # one subject for both: only the address tells them apart
    app.signup(isolated_mailbox.address)
    (friends,) = [m.message_id for m in mailbox_store.messages(own) if m.tag == "friend"]

    def open_invitation(message_id: str) -> dict[str, bool]:
        """The harness opens the invitation's link; the model never sees it."""
        return {"opened": app.verify(tools.reveal(message_id, domain=APP))}

    offered: dict[str, Any] = {}

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        offered.update({t.name: t.parameters_json_schema for t in info.function_tools})
        got = _returns(messages)
        step: tuple[str, dict[str, Any]] | None = None
        if "wait_for_message" not in got:
            wait = {"fixture_id": own, "kind": "link", "timeout": 5, "tag": "friend"}
            step = ("wait_for_message", wait)
        elif "claim_message" not in got:
            selector = {"message_id": None, "subject_contains": None, "tag": "friend"}
            step = ("claim_message", {"fixture_id": own, "selector": selector, "lease": None})
        elif "open_invitation" not in got:
            step = ("open_invitation", {"message_id": got["claim_message"]["message_id"]})
        if step is None:
            return ModelResponse(parts=[TextPart("Opened the invitation.")])
        return ModelResponse(parts=[ToolCallPart(step[0], step[1])])

    agent = Agent(
        FunctionModel(model), tools=_pydantic_ai_tools(tools, {"open_invitation": open_invitation})
    )
    result = asyncio.run(agent.run("Open the invitation sent to the friend."))

    assert result.output == "Opened the invitation."
    assert "tag" in offered["wait_for_message"]["properties"]
    assert "tag" in offered["claim_message"]["properties"]["selector"]["properties"]
    assert app.verified == {friend}
    assert [(tool, status) for tool, _, status in trail(isolated_mailbox)] == [
        ("wait_for_message", "waiting"),
        ("claim_message", "claimed"),
    ]
    claimed = _returns(result.all_messages())["claim_message"]
    assert (claimed["status"], claimed["message_id"]) == ("claimed", friends)
    wait, claim = (e.arguments for e in tools.evidence())
    assert (wait["tag"], claim["selector"]["tag"]) == ("friend", "friend")
    app.assert_secret_free(json.dumps(result.all_messages_json().decode()))
