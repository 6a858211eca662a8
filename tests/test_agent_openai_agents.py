"""A real agent framework on the agent surface: the OpenAI Agents SDK's Runner, with its
ScriptedModel standing in for the model (no network), calls the generated definitions as
its FunctionTools in-process, and the tools of the stdio MCP server through its
MCPServerStdio, against the session's sink (see test_agent.py)."""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from agents import Agent, FunctionTool, RunConfig, RunContextWrapper, Runner, function_tool
from agents.mcp import MCPServerStdio
from agents.strict_schema import ensure_strict_json_schema
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from agents.tool_context import ToolContext
from openai.types.chat import ChatCompletionToolUnionParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter, ValidationError
from test_agent import APP, SIGNUP, TOOLS, SignupApp, trail

from pytest_mailbox import Mailbox
from pytest_mailbox.agent import AgentTools
from pytest_mailbox.contract import dump_receipt
from pytest_mailbox.sink import SmtpEndpoint

OFFLINE = RunConfig(tracing_disabled=True)  # the SDK's traces would go to OpenAI's API


@pytest.fixture
def app(mailbox_server: SmtpEndpoint) -> SignupApp:
    return SignupApp(mailbox_server.host, mailbox_server.port)


def function_tools(tools: AgentTools) -> list[FunctionTool]:
    """The toolset as the SDK's FunctionTools, from the generated strict definitions."""

    def bind(name: str) -> Callable[[ToolContext[Any], str], Any]:
        async def run(ctx: ToolContext[Any], arguments: str) -> str:
            # JSON text: the SDK hands the model str() of any other value, a Python repr
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


def outputs(call: ModelCall) -> dict[str, Any]:
    """The latest output of each tool in the conversation so far, by tool name: the
    mailbox tools' answers read back from their JSON text (an MCP tool's is in a text
    part of its content), the harness's text as it is."""
    names: dict[str, str] = {}
    found: dict[str, Any] = {}
    for item in call.input if isinstance(call.input, list) else []:
        entry = item if isinstance(item, dict) else item.model_dump()
        if entry.get("type") == "function_call":
            names[entry["call_id"]] = entry["name"]
        elif entry.get("type") == "function_call_output":
            text = entry["output"]
            if isinstance(text, list):  # an MCP tool's content: its text parts
                text = "".join(part["text"] for part in text)
            found[names[entry["call_id"]]] = json.loads(text) if text.startswith("{") else text
    return found


def signing_up(own: str, address: str) -> Callable[[ModelCall], list[Any]]:
    """A model that signs up, waits for the mail, claims it, has it opened, acks and
    releases, one turn each but the first: sign_up and wait_for_message in one turn, as a
    model calls tools in parallel (the wait must see the mail the other call sends)."""

    def step(call: ModelCall) -> list[Any]:
        got = outputs(call)
        if "wait_for_message" not in got:
            wait = {"fixture_id": own, "kind": "link", "timeout": 10, "tag": None}
            return [
                function_call("sign_up", {"email": address}, call_id="call_1"),
                function_call("wait_for_message", wait, call_id="call_2"),
            ]
        message_id = got["wait_for_message"]["message_id"]
        if "claim_message" not in got:
            selector = {"message_id": message_id, "subject_contains": None, "tag": None}
            claim = {"fixture_id": own, "selector": selector, "lease": None}
            return [function_call("claim_message", claim, call_id="call_3")]
        if "open_verification_link" not in got:
            opened = {"message_id": message_id}
            return [function_call("open_verification_link", opened, call_id="call_4")]
        if "ack_message" not in got:
            fence = got["claim_message"]["fence"]
            ack = {"fixture_id": own, "message_id": message_id, "fence": fence}
            return [function_call("ack_message", ack, call_id="call_5")]
        if "release_mailbox" not in got:
            release = {"fixture_id": own, "reason": "released_success"}
            return [function_call("release_mailbox", release, call_id="call_6")]
        return [assistant_message("Signed up and verified.")]

    return step


def harness(tools: AgentTools, app: SignupApp) -> list[FunctionTool]:
    """The test's own tools: the app's form, and opening the link the model never sees."""

    @function_tool
    def sign_up(email: str) -> str:
        """Fill in the app's sign-up form."""
        app.signup(email)
        return "signed up; check the mailbox"

    @function_tool
    def open_verification_link(message_id: str) -> str:
        """The harness opens the message's link; the model never sees it."""
        return "verified" if app.verify(tools.reveal(message_id, domain=APP)) else "refused"

    return [sign_up, open_verification_link]


SIGNED_UP = [
    ("wait_for_message", ["proposed", "allowed", "executed"], "waiting"),
    ("claim_message", ["proposed", "allowed", "executed"], "claimed"),
    ("ack_message", ["proposed", "allowed", "executed"], "consumed"),
    ("release_mailbox", ["proposed", "allowed", "executed"], "released"),
]


def test_the_sdk_takes_the_openai_definitions_as_strict_without_rewriting_them(
    isolated_mailbox: Mailbox,
) -> None:
    """The SDK's strict check (every property required, closed objects, no `oneOf`)
    accepts every definition as it is: a schema it had to rewrite would offer the model
    another tool than the one the toolset validates against."""
    tools = isolated_mailbox.agent_tools(resend=lambda address: None)
    for definition in tools.definitions("openai"):
        parameters = definition["function"]["parameters"]
        assert ensure_strict_json_schema(copy.deepcopy(parameters)) == parameters
    offered = {t.name: t.params_json_schema for t in function_tools(tools)}
    generated = {d["function"]["name"]: d["function"]["parameters"] for d in tools.definitions()}
    assert offered == generated


def test_a_dict_a_function_tool_returns_reaches_the_model_as_python_s_str_of_it(
    isolated_mailbox: Mailbox,
) -> None:
    """Why the docs' FunctionTools return json.dumps of the answer: the SDK hands the model
    str() of any other value, which is no JSON (``None``, ``True``, single quotes)."""
    tools = isolated_mailbox.agent_tools()
    arguments = {"purpose": isolated_mailbox.purpose, "ttl": 60, "tag": None}

    async def as_dict(ctx: ToolContext[Any], text: str) -> dict[str, Any]:
        return await tools.acall("reserve_mailbox", text, ctx.tool_call_id)

    (definition,) = tools.definitions("openai")[:1]
    raw = FunctionTool(
        name="reserve_mailbox",
        description=definition["function"]["description"],
        params_json_schema=definition["function"]["parameters"],
        on_invoke_tool=as_dict,
    )
    model = ScriptedModel(
        [[function_call("reserve_mailbox", arguments, call_id="call_1")], [assistant_message("")]]
    )
    result = asyncio.run(
        Runner.run(Agent(name="a", model=model, tools=[raw]), "Reserve.", run_config=OFFLINE)
    )

    assert result.final_output == ""
    assert model.last_call is not None  # what the model was given back
    (output,) = [
        item["output"]
        for item in model.last_call.input
        if isinstance(item, dict) and item.get("type") == "function_call_output"
    ]
    assert output.startswith("{'status': 'reserved'")
    with pytest.raises(json.JSONDecodeError):
        json.loads(output)


def test_each_openai_format_is_the_shape_its_api_takes_in_the_openai_sdk(
    isolated_mailbox: Mailbox,
) -> None:
    """Chat Completions nests the function (``{"type", "function": {...}}``), the
    Responses API, which the Agents SDK calls, does not (``{"type", "name", ...}``), and
    each API refuses the other's shape. Only the first was offered: a harness calling
    ``responses.create`` had to take the definitions apart."""
    tools = isolated_mailbox.agent_tools()
    chat, responses = TypeAdapter(ChatCompletionToolUnionParam), TypeAdapter(FunctionToolParam)
    nested = tools.definitions("openai")
    flat = tools.definitions("openai-responses")

    assert [responses.validate_python(d) for d in flat] == flat
    assert [chat.validate_python(d) for d in nested] == nested
    for wrong, adapter in ((nested[0], responses), (flat[0], chat)):
        with pytest.raises(ValidationError, match="Field required"):
            adapter.validate_python(wrong)
    assert flat == [{"type": "function", **d["function"]} for d in nested]
    with pytest.raises(ValueError, match="choose one of: openai, openai-responses, anthropic"):
        tools.definitions("responses")  # type: ignore[arg-type]


@SIGNUP
def test_the_sdk_runner_signs_up_through_the_function_tools(
    isolated_mailbox: Mailbox, app: SignupApp
) -> None:
    tools = isolated_mailbox.agent_tools()
    step = signing_up(isolated_mailbox.mailbox_id, isolated_mailbox.address)
    model = ScriptedModel([ModelStep.respond(step) for _ in range(6)])
    agent = Agent(name="signup", model=model, tools=[*function_tools(tools), *harness(tools, app)])

    result = asyncio.run(Runner.run(agent, "Sign up and verify the address.", run_config=OFFLINE))

    assert result.final_output == "Signed up and verified."
    assert isolated_mailbox.address in app.verified
    assert model.first_call is not None
    assert [t.name for t in model.first_call.tools][:5] == TOOLS.split(", ")
    assert trail(isolated_mailbox) == SIGNED_UP
    receipt = isolated_mailbox.receipt()
    assert [e.tool_call_id for e in receipt.evidence or []] == [f"call_{i}" for i in (2, 3, 5, 6)]
    transcript = json.dumps(result.to_input_list(), default=str)
    app.assert_secret_free(transcript, dump_receipt(receipt))


@SIGNUP
def test_the_sdk_runner_signs_up_through_the_mcp_server_s_tools_kept_strict(
    isolated_mailbox: Mailbox, app: SignupApp
) -> None:
    """The SDK starts the server from mcp_command(), lists its tools and, asked for
    strict schemas, gets them from every tool's inputSchema (a schema it cannot make
    strict it would offer as non-strict, with a log line only); each answer reaches the
    model as the JSON of the answer."""
    tools = isolated_mailbox.agent_tools()
    command = tools.mcp_command()
    step = signing_up(isolated_mailbox.mailbox_id, isolated_mailbox.address)
    model = ScriptedModel([ModelStep.respond(step) for _ in range(6)])

    async def run() -> Any:
        server = MCPServerStdio(
            {"command": command[0], "args": command[1:], "env": dict(os.environ)},
            # above the longest wait the agent may ask for (60 s): the SDK's default is 5 s
            client_session_timeout_seconds=90,
        )
        async with server:
            agent = Agent(
                name="signup",
                model=model,
                tools=harness(tools, app),
                mcp_servers=[server],
                mcp_config={"convert_schemas_to_strict": True},
            )
            listed = await agent.get_all_tools(RunContextWrapper(None))
            strict = {t.name: t.strict_json_schema for t in listed if isinstance(t, FunctionTool)}
            result = await Runner.run(agent, "Sign up and verify the address.", run_config=OFFLINE)
            return strict, result

    strict, result = asyncio.run(run())

    assert strict == dict.fromkeys([*TOOLS.split(", "), "sign_up", "open_verification_link"], True)
    assert result.final_output == "Signed up and verified."
    assert isolated_mailbox.address in app.verified
    assert trail(isolated_mailbox) == SIGNED_UP
    transcript = json.dumps(result.to_input_list(), default=str)
    app.assert_secret_free(transcript, dump_receipt(isolated_mailbox.receipt()))


@SIGNUP
def test_arguments_cut_short_are_answered_as_not_json_and_the_model_sends_them_whole(
    isolated_mailbox: Mailbox, app: SignupApp
) -> None:
    """A reply cut off at the model's token limit leaves a call's arguments cut short;
    the SDK hands them on as they are. The answer said "must be a JSON object" to a call
    that was one, cut short, and did not say what was wrong."""
    tools = isolated_mailbox.agent_tools()
    app.signup(isolated_mailbox.address)
    own = isolated_mailbox.mailbox_id
    whole = json.dumps({"fixture_id": own, "kind": "link", "timeout": 10, "tag": None})
    told: list[dict[str, Any]] = []

    def resend(call: ModelCall) -> list[Any]:
        told.append(outputs(call)["wait_for_message"])
        return [function_call("wait_for_message", whole, call_id="call_2")]

    model = ScriptedModel(
        [
            [function_call("wait_for_message", whole[:40], call_id="call_1")],
            ModelStep.respond(resend),
            [assistant_message("Found it.")],
        ]
    )
    agent = Agent(name="signup", model=model, tools=function_tools(tools))

    result = asyncio.run(Runner.run(agent, "Wait for the sign-up mail.", run_config=OFFLINE))

    assert result.final_output == "Found it."
    assert told == [
        {
            "status": "rejected",
            "reason": "the arguments of wait_for_message are not JSON (Unterminated string "
            "starting at: line 1 column 36 (char 35)): send them whole, as one object",
            "next_action": {"do": "fix_arguments", "tool": "wait_for_message"},
        }
    ]
    assert [(tool, status) for tool, _, status in trail(isolated_mailbox)] == [
        ("wait_for_message", "rejected"),
        ("wait_for_message", "waiting"),
    ]


@pytest.mark.email_contract(purpose="signup", ttl=120, lease=30, link_domains=[APP], max_reads=5)
def test_parallel_waits_leave_the_event_loop_s_own_threads_to_the_sign_up(
    isolated_mailbox: Mailbox, app: SignupApp
) -> None:
    """The SDK runs a sync function tool (the app's sign-up) in the event loop's default
    executor, as asyncio runs getaddrinfo there: os.cpu_count() + 4 threads, 6 on two
    cores. acall's waits ran there too, so a turn of as many waits as it has threads held
    them all, and the sign-up whose mail they waited for ran only once they had given up.
    Here the executor has 2 threads, and the turn 2 waits and the sign-up."""
    tools = isolated_mailbox.agent_tools()
    own = isolated_mailbox.mailbox_id
    wait = {"fixture_id": own, "kind": "link", "timeout": 5, "tag": None}
    model = ScriptedModel(
        [
            [
                function_call("wait_for_message", wait, call_id="call_1"),
                function_call("wait_for_message", wait, call_id="call_2"),
                function_call("sign_up", {"email": isolated_mailbox.address}, call_id="call_3"),
            ],
            [assistant_message("Found it.")],
        ]
    )
    agent = Agent(name="signup", model=model, tools=[*function_tools(tools), *harness(tools, app)])

    async def run() -> Any:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))
        return await Runner.run(agent, "Sign up and wait for the mail.", run_config=OFFLINE)

    result = asyncio.run(run())

    assert result.final_output == "Found it."
    found = [
        json.loads(item.output)
        for item in result.new_items
        if getattr(item, "type", None) == "tool_call_output_item" and item.output.startswith("{")
    ]
    assert [answer["status"] for answer in found] == ["waiting", "waiting"]
    assert all(answer.get("message_id") for answer in found), found
