"""The agent tools of one run as an MCP server over stdio (``pytest-mailbox[mcp]``).

``python -m pytest_mailbox.mcp_server --store PATH --mailbox-id ID --fence N --ttl-max S``
serves the tools that the run's test made with ``isolated_mailbox.agent_tools()`` (whose
``mcp_command()`` is this command line), under the same policy, budgets and evidence
journal. Every answer is a result with ``structuredContent``; refusals such as
``policy_denied`` or ``budget_exceeded`` are ordinary results, never ``isError``, so the
agent can read their ``next_action``. When the client closes stdin, a ``wait_for_message``
in progress is cut short, so the server exits at once rather than when the wait would end,
and only once every request it read has been answered. SIGINT and SIGTERM stop it the same
way (exit status 128 + the signal's number), and so does a client that stops reading stdout
(exit status 0, one line on stderr). A wait that the client cancels stops at once.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import json
import os
import re
import secrets
import select
import signal
import sqlite3
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import closing, contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from pytest_mailbox.agent import ACALL_THREADS, AgentTools
from pytest_mailbox.errors import StoreError
from pytest_mailbox.store import Store

if TYPE_CHECKING:
    import anyio
    from anyio.from_thread import BlockingPortal
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.shared._stream_protocols import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage
    from mcp.types import CallToolRequestParams, CallToolResult, ListToolsResult

__all__ = ["TOOL_CALL_ID_META", "build_server", "main", "serve"]

_MISSING = "the MCP server needs the mcp extra: pip install 'pytest-mailbox[mcp]'"
#: The most tool calls that run at once, each in a worker thread; more wait their turn.
#: As many as an in-process toolset's ``acall`` runs at once.
_CALL_THREADS = ACALL_THREADS
#: The key of a call's ``_meta`` under which a client may name the model's own id for the
#: call (``call_…``, ``toolu_…``): the evidence then keeps it after the server's, so an
#: entry can be found in the model's transcript, as an in-process call's can.
TOOL_CALL_ID_META = "pytest-mailbox/tool_call_id"


def build_server(tools: AgentTools) -> Server[Any]:
    """A low-level MCP server that lists ``tools`` and answers their calls."""
    return _build_server(tools, lambda request_id: threading.Event())


def _build_server(tools: AgentTools, cancelled: Callable[[object], threading.Event]) -> Server[Any]:
    """``build_server``, where ``cancelled(request_id)`` is the flag that the client's
    cancellation of that request sets (``_Unanswered.cancelled``)."""
    import anyio.to_thread  # noqa: PLC0415 - the mcp extra is optional
    from mcp import types  # noqa: PLC0415
    from mcp.server.lowlevel import Server  # noqa: PLC0415

    listed = [
        types.Tool(
            name=d["name"],
            title=d["title"],
            description=d["description"],
            input_schema=d["inputSchema"],
            output_schema=d["outputSchema"],
        )
        for d in tools.definitions("mcp")
    ]

    async def list_tools(ctx: ServerRequestContext[Any], params: object) -> ListToolsResult:
        return types.ListToolsResult(tools=listed)

    # Request ids start over in every session: this server's own prefix keeps the journal's
    # tool_call_ids apart across sessions (a restarted server, a second agent), while a
    # request keeps one id within its session.
    prefix = f"mcp-{secrets.token_hex(6)}-"

    # A wait blocks: each call runs in a thread so the session keeps answering pings. Not
    # in anyio's default threads, which also read stdin and write stdout: 40 calls that
    # block at once (waits, a store another process holds locked) took them all, and
    # until one returned nothing was read (a ping, a cancellation, stdin's end) or written.
    calls = anyio.CapacityLimiter(_CALL_THREADS)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> CallToolResult:
        # A wait that its client cancelled stops at once: the SDK cancels this task, but
        # the thread is not told (it runs on until it returns, holding one of the 40).
        flag = cancelled(ctx.request_id)
        answer, late = await anyio.to_thread.run_sync(
            tools._call,
            params.name,
            params.arguments or {},
            f"{prefix}{ctx.request_id}{_model_s(params.meta)}",
            flag,
            limiter=calls,
        )
        if flag.is_set():  # the SDK sends no answer: the evidence says so, if the call did not
            with anyio.CancelScope(shield=True):  # this task is cancelled by now
                await anyio.to_thread.run_sync(late, limiter=calls)
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(answer))], structured_content=answer
        )

    return Server(
        "pytest-mailbox",
        version=_release(),
        title="pytest-mailbox agent tools",
        instructions=(
            "Mailbox tools for one test run. Answers never contain a message body, link "
            "token or code; the test harness reads those itself. Follow next_action."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _release() -> str:
    """The installed pytest-mailbox's version, for the ``serverInfo`` a client shows (the
    SDK puts in none of its own); "" from a source tree that was never installed."""
    try:
        return importlib.metadata.version("pytest-mailbox")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - never installed
        return ""


def _model_s(meta: object) -> str:
    """``/`` and the model's id for a call, which its client gave in ``_meta`` (a text), else
    nothing; the evidence masks it as any tool_call_id."""
    named = meta.get(TOOL_CALL_ID_META) if isinstance(meta, dict) else None
    return f"/{named}" if isinstance(named, str) and named else ""


_T = TypeVar("_T")
_S = TypeVar("_S", bound="_ClosedOnExit")


class _ClosedOnExit:
    """A stream wrapper as an async context manager: closed (``aclose``) on leaving it."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self: _S) -> _S:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Unanswered:
    """The requests read from the client that are neither answered nor cancelled by it.

    The SDK takes the end of stdin for a client that is gone, and cancels the requests in
    progress, answers included. But a client may close stdin as soon as it has written its
    last request (``printf … | python -m pytest_mailbox.mcp_server``, or a client that
    shuts down, as MCP's stdio transport says, by closing stdin first): its calls ran, a
    claim or an ack was made, and their answers were lost. So the end of stdin is passed
    on only once each request read has been answered.

    It also keeps, per request read and not answered, the flag that the client's
    cancellation of it sets, which its tool call is given (``cancelled``).
    """

    def __init__(self) -> None:
        import anyio  # noqa: PLC0415

        # A count per id: "7" and 7 are two requests to answer, though one id to the SDK.
        self._ids: Counter[object] = Counter()
        self._changed = anyio.Event()
        # One per id, as the SDK keeps one request in progress per id: the latest read.
        self._cancels: dict[object, threading.Event] = {}

    @staticmethod
    def _key(request_id: object) -> object:
        from mcp.shared.dispatcher import coerce_request_id  # noqa: PLC0415

        # As the SDK correlates them: "7" and 7 are one id; true is none (not 1).
        if not isinstance(request_id, (int, str)) or isinstance(request_id, bool):
            return None
        return coerce_request_id(request_id)

    def read(self, item: object) -> None:
        from mcp import types  # noqa: PLC0415

        message = getattr(item, "message", None)
        if isinstance(message, types.JSONRPCRequest):
            key = self._key(message.id)
            self._ids[key] += 1
            self._cancels[key] = threading.Event()
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"  # never answered (MCP's rule)
        ):
            key = self._key((message.params or {}).get("requestId"))
            self._done(key)
            if (flag := self._cancels.pop(key, None)) is not None:
                flag.set()

    def cancelled(self, request_id: object) -> threading.Event:
        """The flag that the cancellation of request ``request_id`` sets; set already if
        the cancellation was read first."""
        flag = self._cancels.get(self._key(request_id))
        if flag is None:
            flag = threading.Event()
            flag.set()
        return flag

    def written(self, item: object) -> None:
        from mcp import types  # noqa: PLC0415

        message = getattr(item, "message", None)
        if isinstance(message, (types.JSONRPCResponse, types.JSONRPCError)):
            key = self._key(message.id)
            self._done(key)
            self._cancels.pop(key, None)

    def _done(self, key: object) -> None:
        if self._ids[key] > 0:
            self._ids[key] -= 1
            self._changed.set()
        if self._ids[key] <= 0:
            del self._ids[key]

    async def drained(self) -> None:
        import anyio  # noqa: PLC0415

        while self._ids:
            self._changed = anyio.Event()
            await self._changed.wait()


class _Answering(_ClosedOnExit, Generic[_T]):
    """A write stream that tells ``unanswered`` of each answer once it is written."""

    def __init__(self, stream: WriteStream[_T], unanswered: _Unanswered) -> None:
        self._stream = stream
        self._unanswered = unanswered

    async def send(self, item: _T, /) -> None:
        try:
            await self._stream.send(item)
        finally:  # written, or never will be (the client went away): not waited for
            self._unanswered.written(item)

    async def aclose(self) -> None:
        await self._stream.aclose()


#: A JSON string, or a bracket: the tokens that ``_request_id`` steps through; or a quote
#: that opens a string the line never closes (cut off): the rest of the line is in it.
_JSON_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]|"')
_KEY = re.compile(r"\s*:")
#: An id as MCP has them: an integer or a string.
_ID = re.compile(r'\s*:\s*(?:(-?[0-9]{1,18})(?![0-9.eE])|("[^"\\]*(?:\\.[^"\\]*)*"))')


def _request_id(line: str) -> int | str | None:
    """The id of the request on ``line``, a line that is no JSON the SDK reads; None if it
    names no method or no id. Its top-level keys are found without parsing the rest: what
    the SDK could not read (a number of 5,000 digits, arguments 300 levels deep) may be
    too much for Python's json as well."""
    depth, found, method = 0, None, False
    for token in _JSON_TOKEN.finditer(line):
        text = token.group()
        if text == '"':  # no key after it; and a search from each quote in it takes O(n²)
            break
        if text in ("[", "{"):
            depth += 1
        elif text in ("]", "}"):
            depth -= 1
        elif depth == 1 and text == '"method"' and _KEY.match(line, token.end()):
            method = True
        elif depth == 1 and text == '"id"' and (value := _ID.match(line, token.end())):
            number, string = value.groups()
            with suppress(ValueError):  # UnicodeEncodeError: no UTF-8 to answer it in
                candidate = int(number) if number is not None else json.loads(string)
                if isinstance(candidate, str):
                    candidate.encode()
                found = candidate
    return found if method and isinstance(found, (int, str)) else None


def _unread(exc: Exception) -> tuple[int | str, int, str] | None:
    """For a line the SDK could not read as a message: the id of the request on it, the
    JSON-RPC error code and the message to answer it with; None if it is no request.

    The SDK drops such a line, and a request on it was never answered: its client waited
    for ever (or for its own timeout), though the agent's next call would have been read.
    """
    from mcp import types  # noqa: PLC0415
    from pydantic import ValidationError  # noqa: PLC0415

    if not isinstance(exc, ValidationError):
        return None
    for error in exc.errors(include_url=False):
        given = error.get("input")
        if error["type"] == "json_invalid" and isinstance(given, (str, bytes)):
            text = given.decode(errors="replace") if isinstance(given, bytes) else given
            found = _request_id(text)
            code, message = types.PARSE_ERROR, f"Parse error: {error['msg']}"
        elif len(error["loc"]) == 2 and isinstance(given, dict) and "method" in given:
            # JSON, but no message MCP has (params that are not an object, say): the
            # input of a field missing from the whole message is the message.
            found = given.get("id")
            code, message = types.INVALID_REQUEST, "Invalid Request: not an MCP request"
        else:
            continue
        if isinstance(found, (int, str)) and not isinstance(found, bool):
            return found, code, message
        return None
    return None


class _Watched(_ClosedOnExit, Generic[_T]):
    """A read stream that calls ``ended`` once it has nothing more to give (the client
    closed stdin): the calls in progress are cut short, and the end is passed on once
    each request read has been answered (``unanswered``). A line the SDK could not read
    goes to ``refused``, which answers a request on it and says so."""

    def __init__(
        self,
        stream: ReadStream[_T],
        ended: Callable[[], None],
        unanswered: _Unanswered,
        refused: Callable[[Exception], Awaitable[bool]],
    ) -> None:
        self._stream = stream
        self._ended = ended
        self._unanswered = unanswered
        self._refused = refused

    @property
    def last_context(self) -> object:
        return getattr(self._stream, "last_context", None)

    async def receive(self) -> _T:
        import anyio  # noqa: PLC0415

        while True:
            try:
                item = await self._stream.receive()
            except anyio.EndOfStream:
                self._ended()
                await self._unanswered.drained()
                raise
            except anyio.ClosedResourceError:
                self._ended()
                raise
            if not (isinstance(item, Exception) and await self._refused(item)):
                self._unanswered.read(item)
                return item

    async def aclose(self) -> None:
        self._ended()
        await self._stream.aclose()

    def __aiter__(self) -> _Watched[_T]:
        return self

    async def __anext__(self) -> _T:
        import anyio  # noqa: PLC0415

        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None


class _Unblocked(io.RawIOBase):
    """``fd``'s bytes, read only once it has some, and none once ``stop()`` is called: a
    stopped server's thread reads no more of stdin, which is the caller's again (``serve``
    called from a program that reads stdin once it returns). Where ``poll`` is missing
    (Windows), a plain read, which a stop does not end."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._poll = getattr(select, "poll", lambda: None)()
        self._wake, self._waker = os.pipe() if self._poll is not None else (-1, -1)
        if self._poll is not None:
            self._poll.register(fd, select.POLLIN)
            self._poll.register(self._wake, select.POLLIN)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._poll is not None:
            while not (ready := dict(self._poll.poll())):  # pragma: no cover - no timeout
                pass
            if self._wake in ready:  # stopped: as if stdin had ended, none of it read
                return 0
        data = os.read(self._fd, len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def stop(self) -> None:
        if self._poll is not None and self._waker >= 0:
            os.write(self._waker, b"\0")

    @property
    def stoppable(self) -> bool:
        return self._poll is not None

    def release(self) -> None:
        """Once its reader has ended: the waking pipe's descriptors closed."""
        for fd in (self._wake, self._waker):
            if fd >= 0:
                os.close(fd)
        self._wake = self._waker = -1


class _Lines:
    """stdin's lines, for ``stdio_server``: read in a daemon thread of their own.

    The SDK reads stdin in one of anyio's worker threads, which a stopping server waits
    for: after a signal it stayed up until stdin's next line, which might never come.
    ``stop()`` ends the lines at once, and the thread's reading (``_Unblocked``): it reads
    no line after it, and ``join()`` waits for it to end. Decoded as the SDK decodes them
    (UTF-8, errors replaced).
    """

    def __init__(self, fd: int, portal: BlockingPortal) -> None:
        import anyio  # noqa: PLC0415

        self._send, self._receive = anyio.create_memory_object_stream[str](0)
        self._portal = portal
        self._scope = anyio.CancelScope()
        self._stopped = False
        self._raw = _Unblocked(fd)
        text = io.TextIOWrapper(io.BufferedReader(self._raw), encoding="utf-8", errors="replace")
        self._thread = threading.Thread(
            target=self._pump, args=(text,), name="mcp stdin", daemon=True
        )
        self._thread.start()

    def _pump(self, text: io.TextIOWrapper) -> None:
        with suppress(Exception):  # the server stopped reading, or its event loop ended
            try:
                for line in text:
                    self._portal.call(self._send.send, line)
            finally:  # the end of stdin (or a read that failed): the client is gone
                self._portal.call(self._send.aclose)

    def __aiter__(self) -> _Lines:
        return self

    async def __anext__(self) -> str:
        import anyio  # noqa: PLC0415

        with anyio.CancelScope() as self._scope:
            if not self._stopped:
                with suppress(anyio.EndOfStream):
                    return await self._receive.receive()
        raise StopAsyncIteration

    def stop(self) -> None:
        """No more lines: as if stdin had ended."""
        if not self._stopped:
            self._raw.stop()
        self._stopped = True
        self._scope.cancel()

    def close(self) -> None:
        self.stop()
        self._receive.close()

    def join(self) -> bool:
        """Once the server's portal has stopped: wait for the thread to end; whether it
        did (False where a stop does not end its read: it may still be in one)."""
        if not self._raw.stoppable:  # pragma: no cover - Windows
            return False
        self._thread.join()
        self._raw.release()
        return True


class _Written:
    """stdout, for ``stdio_server``: each answer written whole to ``fd``. Once a write fails
    (the client closed its end: a broken pipe), ``failed`` is told, once, and later answers
    are dropped, where the SDK raised the error out of the server."""

    def __init__(self, fd: int, failed: Callable[[OSError], None]) -> None:
        self._fd = fd
        self._failed = failed
        self._lost = False

    async def write(self, text: str) -> None:
        import anyio.to_thread  # noqa: PLC0415

        if self._lost:
            return
        try:
            await anyio.to_thread.run_sync(self._write, text.encode())
        except OSError as exc:
            self._lost = True
            self._failed(exc)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self._fd, view) :]
            except BlockingIOError:  # a stdout left non-blocking: wait until it takes more
                _writable(self._fd)

    async def flush(self) -> None:
        """Nothing to flush: each answer went to the file whole."""


def _writable(fd: int) -> None:
    """Once ``fd`` can take more (or its reader is gone: the next write says so)."""
    if hasattr(select, "poll"):
        ready = select.poll()
        ready.register(fd, select.POLLOUT)
        ready.poll()
    else:  # pragma: no cover - Windows
        select.select([], [fd], [])


def _stray_output() -> int:
    """Where stray prints go while the server answers on stdout: stderr (none if closed)."""
    return os.open(os.devnull, os.O_WRONLY) if sys.__stderr__ is None else os.dup(2)


@contextmanager
def _claimed(fd: int, diversion: Callable[[], int]) -> Iterator[int]:
    """A duplicate of ``fd`` for the wire, while ``fd`` itself points to ``diversion()``, as
    the SDK's ``stdio_server`` claims them: a stray read of stdin gets its end, a stray
    print goes to stderr, not into the answers. Restored on leaving; the duplicate is left
    open, for the caller to close once nothing reads or writes it (``_Lines.join``)."""
    wire = os.dup(fd)
    diverted = diversion()
    os.dup2(diverted, fd)
    os.close(diverted)
    try:
        yield wire
    finally:
        os.dup2(wire, fd)


async def _on_signals(stop: Callable[[int], None]) -> None:
    """On SIGINT or SIGTERM, ``stop(signum)``; on a second one, exit at once (calls still in
    progress are left ``unfinished`` in the evidence, as a kill leaves them). A signal the
    server was started with ignored stays ignored (a client that keeps Ctrl-C to itself).
    The handlers found are put back on leaving: asyncio leaves SIGTERM's at its default (a
    kill) and SIGINT's at KeyboardInterrupt, whatever the process that called ``serve`` had
    (a test's, coverage's)."""
    import anyio  # noqa: PLC0415

    wanted = [s for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) != signal.SIG_IGN]
    found = [(signum, signal.getsignal(signum)) for signum in wanted]
    try:
        signals = anyio.open_signal_receiver(*wanted)
        received = signals.__enter__()
    except (NotImplementedError, RuntimeError, ValueError):  # Windows; not the main thread
        return
    try:
        stopped = False
        async for signum in received:
            if stopped:  # pragma: no cover - the process ends here, its coverage unsaved
                os._exit(128 + signum)
            stopped = True
            stop(signum)
    finally:
        signals.__exit__(None, None, None)
        for signum, handler in found:  # after the receiver let go of them
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(signum, handler)


async def serve(tools: AgentTools) -> int:
    """Serve ``tools`` on stdin/stdout; return the exit status. The server stops when the
    client closes stdin (0), stops reading stdout (0, and one line on stderr), or on SIGINT
    or SIGTERM (128 + its number): each way, a wait in progress is cut short, and every
    request read is answered before it returns (if the client still reads)."""
    import anyio.to_thread  # noqa: PLC0415
    from anyio.from_thread import BlockingPortal  # noqa: PLC0415
    from mcp.server.stdio import stdio_server  # noqa: PLC0415

    if (closed := _closed_stdio()) is not None:
        raise RuntimeError(closed)
    unanswered = _Unanswered()
    server = _build_server(tools, unanswered.cancelled)
    status, ended = 0, False
    try:
        with (
            _claimed(0, lambda: os.open(os.devnull, os.O_RDONLY)) as stdin,
            _claimed(1, _stray_output) as stdout,
        ):
            async with BlockingPortal() as portal, anyio.create_task_group() as signals:
                lines = _Lines(stdin, portal)

                def stop() -> None:  # as if stdin had ended: the calls are cut short
                    tools.close()
                    lines.stop()

                def signalled(signum: int) -> None:
                    nonlocal status
                    status = 128 + signum
                    stop()

                def failed(exc: OSError) -> None:
                    why = (
                        "the client closed stdout (broken pipe)"
                        if isinstance(exc, BrokenPipeError)
                        else f"writing to stdout failed ({exc.strerror or exc})"
                    )
                    with suppress(AttributeError, OSError, ValueError):  # no stderr either
                        sys.stderr.write(
                            f"pytest_mailbox.mcp_server: {why}: answers not yet written are "
                            "lost; exiting\n"
                        )
                        sys.stderr.flush()
                    stop()

                signals.start_soon(_on_signals, signalled)
                written = _Written(stdout, failed)
                try:
                    async with stdio_server(
                        cast("anyio.AsyncFile[str]", lines), cast("anyio.AsyncFile[str]", written)
                    ) as (read, write):
                        await _run(server, tools, read, write, unanswered)
                finally:
                    signals.cancel_scope.cancel()
                    lines.close()
                    await portal.stop(cancel_remaining=True)
                    with anyio.CancelScope(shield=True):  # no read of stdin left behind
                        ended = await anyio.to_thread.run_sync(lines.join)
        os.close(stdout)
        if ended:
            os.close(stdin)
    finally:
        tools.close()
    return status


async def _run(
    server: Server[Any],
    tools: AgentTools,
    read: ReadStream[SessionMessage | Exception],
    write: WriteStream[SessionMessage],
    unanswered: _Unanswered,
) -> None:
    """Run ``server`` on the streams, every request read answered before it returns."""
    import anyio  # noqa: PLC0415
    from mcp import types  # noqa: PLC0415
    from mcp.shared.message import SessionMessage as Message  # noqa: PLC0415

    answering = _Answering(write, unanswered)

    async def refused(exc: Exception) -> bool:
        unread = _unread(exc)
        if unread is None:
            return False
        request_id, code, message = unread
        error = types.ErrorData(code=code, message=message)
        answer = types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await answering.send(Message(answer))
        return True

    # stdin closed: cut short a wait
    watched = _Watched(read, tools.close, unanswered, refused)
    await server.run(watched, answering, server.create_initialization_options())


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, bind to the run's mailbox, serve until stdin closes (or a
    signal, or a client that stops reading): the exit status (``serve``)."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_mailbox.mcp_server",
        description="Serve one run's pytest-mailbox agent tools over MCP stdio.",
    )
    parser.add_argument("--store", type=Path, required=True, help="The run's store file")
    parser.add_argument("--mailbox-id", required=True, help="The run's mailbox_id")
    parser.add_argument("--fence", type=int, required=True, help="The mailbox's fence")
    parser.add_argument(
        "--ttl-max",
        type=int,
        help="The toolset's agent_tools(ttl_max=) (default: the contract's ttl)",
    )
    args = parser.parse_args(argv)
    if sys.__stderr__ is None:
        try:
            os.fstat(2)
        except OSError:  # closed: the next file opened (the store) would take fd 2, and a
            os.open(os.devnull, os.O_WRONLY)  # write to stderr would land in it
    try:
        # Both: anyio also comes with httpx, starlette or fastapi, where mcp is missing.
        import anyio  # noqa: PLC0415
        import mcp.server.stdio  # noqa: F401, PLC0415
    except ImportError:
        parser.error(_MISSING)
    if not args.store.is_file():
        found = "a directory, not a store file" if args.store.is_dir() else "no such file"
        parser.error(f"--store {args.store}: {found}")
    if not _is_store(args.store):  # Store() would make one of any SQLite file (the journal)
        parser.error(
            f"--store {args.store}: not a pytest-mailbox store; pass the file that "
            "mcp_command() names (pytest-mailbox.sqlite3 in the run's base temp)"
        )
    try:
        store = Store(args.store)
    except StoreError as exc:  # a store, but it failed: the message says how
        parser.error(str(exc))
    try:
        tools = AgentTools.attach(store, args.mailbox_id, args.fence, args.ttl_max)
    except ValueError as exc:  # ContractError too: a --ttl-max out of range
        store.close()
        parser.error(str(exc))
    if (closed := _closed_stdio()) is not None:
        store.close()
        parser.error(closed)
    try:
        return anyio.run(serve, tools)
    except KeyboardInterrupt:  # Ctrl-C before it served, or once it was done
        return 128 + signal.SIGINT
    finally:
        store.close()


def _closed_stdio() -> str | None:
    """Why the server cannot talk over stdio: stdin or stdout was closed when the process
    started (``<&-``); else None. Their descriptors may be another file's by now (the
    store's), which the server must not read, write or divert."""
    for name, stream in (("stdin", sys.__stdin__), ("stdout", sys.__stdout__)):
        if stream is None:
            return (
                f"{name} is closed: the MCP server reads requests from stdin and writes "
                "answers to stdout; start it with both open (an MCP client's pipes)"
            )
    return None


def _is_store(path: Path) -> bool:
    """Whether ``path`` holds a pytest-mailbox store, read without writing to it."""
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as conn:
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error:  # not SQLite at all
        return False
    return {"mailboxes", "keys"} <= tables


if __name__ == "__main__":
    sys.exit(main())
