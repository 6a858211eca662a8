"""docs/agents.md, with the OpenAI Agents SDK: the toolset as its FunctionTools, or the MCP
server through its MCPServerStdio. The SDK's ScriptedModel stands in for the model: it
calls the tools as a model's reply would, with no network."""

from __future__ import annotations

import asyncio
import json
import smtplib
from email.message import EmailMessage

import pytest
from agents import Agent, FunctionTool, Model, RunConfig, Runner, RunResult
from agents.mcp import MCPServerStdio
from agents.testing import ScriptedModel, assistant_message, function_call

from pytest_mailbox import Mailbox, MailSink
from pytest_mailbox.agent import AgentTools
from pytest_mailbox.mcp_server import TOOL_CALL_ID_META

APP = "app.example.test"
OFFLINE = RunConfig(tracing_disabled=True)  # the SDK sends its traces to OpenAI otherwise


def send_signup_mail(server: MailSink, address: str) -> None:
    """What the app under test does: a real mail with a verification link."""
    mail = EmailMessage()
    mail["From"], mail["To"], mail["Subject"] = f"noreply@{APP}", address, "Verify"
    mail.set_content(f"Open https://{APP}/verify?token=Zq8rTbX2kLmN to finish.\n")
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.send_message(mail)


def scripted(mailbox: Mailbox) -> ScriptedModel:
    """A model that waits for the mail, claims it and says so: one tool call a turn."""
    own = mailbox.mailbox_id
    wait = {"fixture_id": own, "kind": "link", "timeout": 10, "tag": None}
    selector = {"message_id": None, "subject_contains": "Verify", "tag": None}
    claim = {"fixture_id": own, "selector": selector, "lease": None}
    return ScriptedModel(
        [
            [function_call("wait_for_message", wait, call_id="call_1")],
            [function_call("claim_message", claim, call_id="call_2")],
            [assistant_message("Claimed the verification mail.")],
        ]
    )


def openai_agents_tools(tools: AgentTools) -> list[FunctionTool]:
    """The toolset as the SDK's FunctionTools, each schema kept strict."""

    def bind(name):
        async def run(ctx, arguments):
            # JSON text: the SDK gives the model str() of a dict, a Python repr
            return json.dumps(await tools.acall(name, arguments, ctx.tool_call_id))

        return run

    return [
        FunctionTool(
            name=d["function"]["name"],
            description=d["function"]["description"],
            params_json_schema=d["function"]["parameters"],
            on_invoke_tool=bind(d["function"]["name"]),
            strict_json_schema=True,
        )
        for d in tools.definitions("openai")
    ]


async def run_over_mcp(tools: AgentTools, model: Model) -> RunResult:
    """The agent with the run's tools from the MCP server that mcp_command() starts."""
    command = tools.mcp_command()
    server = MCPServerStdio(
        {"command": command[0], "args": command[1:]},
        client_session_timeout_seconds=90,  # longer than any wait: the default is 5 s
        # the model's id of each call, for the evidence (else the server's id alone)
        tool_meta_resolver=lambda meta: {TOOL_CALL_ID_META: meta.run_context.tool_call_id},
    )
    async with server:
        agent = Agent(
            name="signup",
            model=model,
            mcp_servers=[server],
            mcp_config={"convert_schemas_to_strict": True},
        )
        return await Runner.run(agent, "Verify the sign-up mail.", run_config=OFFLINE)


@pytest.mark.email_contract(purpose="signup", link_domains=[APP])
def test_an_openai_agents_agent_claims_the_mail_through_function_tools(
    isolated_mailbox: Mailbox, mailbox_server: MailSink
) -> None:
    tools = isolated_mailbox.agent_tools()
    model = scripted(isolated_mailbox)
    send_signup_mail(mailbox_server, isolated_mailbox.address)

    agent = Agent(name="signup", model=model, tools=openai_agents_tools(tools))
    result = asyncio.run(Runner.run(agent, "Verify the sign-up mail.", run_config=OFFLINE))

    assert result.final_output == "Claimed the verification mail."
    claimed = json.loads(result.new_items[-2].output)  # the claim's answer, as the model read it
    assert claimed["status"] == "claimed"
    link = tools.reveal(claimed["message_id"], domain=APP)  # the test reveals the link
    assert link == f"https://{APP}/verify?token=Zq8rTbX2kLmN"
    assert [e.tool_call_id for e in isolated_mailbox.receipt().evidence or []] == [
        "call_1",
        "call_2",
    ]


@pytest.mark.email_contract(purpose="signup", link_domains=[APP])
def test_an_openai_agents_agent_claims_the_mail_through_the_mcp_server(
    isolated_mailbox: Mailbox, mailbox_server: MailSink
) -> None:
    tools = isolated_mailbox.agent_tools()
    model = scripted(isolated_mailbox)
    send_signup_mail(mailbox_server, isolated_mailbox.address)

    result = asyncio.run(run_over_mcp(tools, model))

    assert result.final_output == "Claimed the verification mail."
    wait, claim = tools.evidence()
    assert claim.status == "claimed"
    # the server's id of each call, then the model's
    assert [e.tool_call_id.split("/")[1] for e in (wait, claim)] == ["call_1", "call_2"]
