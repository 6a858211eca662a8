"""An app in a process a test forks (``multiprocessing``'s fork, an app server) inherits the
sink's sockets: it must not keep the sink's port or its clients' connections."""

from __future__ import annotations

import contextlib
import os
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_mailbox import MailSink, Store


@contextlib.contextmanager
def forked_child() -> Iterator[None]:
    """A child forked here, past its fork handlers when this enters, alive until it exits:
    an app server that outlives what the test started before it."""
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a fork with threads
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, which only waits
        os.close(ready_r)
        os.close(hold_w)
        os.write(ready_w, b"x")
        os.read(hold_r, 1)
        os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        assert os.read(ready_r, 1) == b"x"  # the child runs, past the fork handlers
        yield
    finally:
        os.close(ready_r)
        os.close(hold_w)
        os.waitpid(pid, 0)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_the_sink_serves_lets_go_of_its_port(tmp_path: Path) -> None:
    """The child held the listener: after the sink stopped, a client's connection was
    taken into its queue and never got a banner, and fixed-port mode's next session got
    "the port is already in use by another program"."""
    with Store(tmp_path / "store.sqlite3") as store:
        sink = MailSink(store, domains=["mailbox.test"]).start()
        host, port = sink.host, sink.port
        try:
            with forked_child():
                sink.stop()

                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((host, port), timeout=30).close()
                with socket.socket() as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind((host, port))  # free for the next session's sink
        finally:
            sink.stop()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_child_forked_while_a_client_is_connected_lets_go_of_its_connection(
    tmp_path: Path,
) -> None:
    """The child held the connection of a client in session when it was forked: the sink,
    stopping, hung up on it, and the client never saw the connection end (no FIN left the
    host while the child had the socket open), waiting on it until its own timeout."""
    with Store(tmp_path / "store.sqlite3") as store:
        sink = MailSink(store, domains=["mailbox.test"]).start()
        try:
            with socket.create_connection((sink.host, sink.port), timeout=30) as client:
                reader = client.makefile("rb")
                assert reader.readline().startswith(b"220")
                client.sendall(b"EHLO app.example.test\r\n")
                line = reader.readline()
                while line[3:4] == b"-":  # the session is set up: its transport is the sink's
                    line = reader.readline()
                assert line.startswith(b"250 ")
                with forked_child():
                    sink.stop()

                    assert reader.read() == b""  # the end of the connection, not a timeout
                reader.close()
        finally:
            sink.stop()
