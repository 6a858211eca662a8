"""Long runs, runs in a row and runs at once: what the plugin holds while a run goes on,
what it leaves behind, and what one run does to another on the same machine."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pytest_mailbox.plugin import STORE_NAME

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir() or not hasattr(os, "mkfifo"),
    reason="counts /proc/self/fd and /proc/net/tcp, and meets other runs through FIFOs",
)

#: What these tests' inner runs leave out: plugins that would change them (see conftest.py).
BLOCKED = ("-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry")

#: The app: sends one mail, then waits for the sink to close its end of the connection
#: (smtplib's quit() closes at once), so that no socket of the sink is still open when the
#: test counts them.
SEND_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.fixture
def send(mailbox_server):
    def send(to, subject="Verify your account", token="t0k3n-A7k9Q2x8Zr5w"):
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = subject
        msg.set_content(f"Open https://app.example.test/verify?token={token}")
        smtp = smtplib.SMTP(mailbox_server.host, mailbox_server.port)
        try:
            smtp.send_message(msg)
            smtp.docmd("QUIT")
            assert smtp.sock.recv(1) == b""  # the sink closed its socket
        finally:
            smtp.close()
    return send
"""

#: Counted at the end of every cycle of ten tests (each cycle runs the same kinds of test in
#: the same order, so a run that holds nothing more as it goes counts the same each time).
#: The store's own files are not counted as descriptors: SQLite keeps the descriptor of a
#: connection closed while another holds a lock, and gives it to the next one it opens, so
#: their number moves by one with the timing; the connections are counted instead.
COUNTING_CONFTEST = """
import asyncio
import gc
import json
import os
import sqlite3
import threading

import pytest

from pytest_mailbox import agent, store

store.CHECKPOINT_EVERY = 1  # the checkpointer's thread starts at the first commit
# acall's threads each keep a connection to the store once they have used it; with more
# than one, which of them a call gets is the pool's timing, and a second thread's first
# connection could come in any cycle. With one, the first cycle opens all it ever holds.
agent.ACALL_THREADS = 1
CYCLE = 10


def _sockets():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir had open
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    states = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:  # TCP state, as /proc/net/tcp writes it: 0A is LISTEN
                states[fields[3]] = states.get(fields[3], 0) + 1
    return states


def _descriptors(store_path):
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += not target.startswith(str(store_path))
    return count


def _sessions():
    return [o for o in gc.get_objects() if type(o).__module__ == "pytest_mailbox.sink"
            and type(o).__qualname__ == "_Protocol"]


def _counts(store_path):
    # The socket of the test's last SMTP session is closed (send() saw it), and the sink's
    # loop ends the session's task at its next turns: counted once it has.
    wake = threading.Event()
    for _ in range(1000):  # ten seconds at most: a hang net
        gc.collect()
        if not _sessions():
            break
        wake.wait(0.01)
    objects = gc.get_objects()
    plugin_objects = {}
    for obj in objects:
        if type(obj).__module__.startswith("pytest_mailbox"):
            name = type(obj).__qualname__
            plugin_objects[name] = plugin_objects.get(name, 0) + 1
    return {
        "descriptors": _descriptors(store_path),
        "threads": sorted(t.name for t in threading.enumerate()),
        "tasks": len(os.listdir("/proc/self/task")),
        "sockets": _sockets(),
        "SQLite connections": sum(isinstance(o, sqlite3.Connection) for o in objects),
        "asyncio transports": sum(isinstance(o, asyncio.BaseTransport) for o in objects),
        "open event loops": sum(
            isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed() for o in objects
        ),
        "plugin objects": plugin_objects,
    }


@pytest.fixture(autouse=True)
def counted(request, mailbox_store):
    yield  # torn down after the test's mailbox, which was set up after it
    if request.node.callspec.params["n"] % CYCLE == CYCLE - 1:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        counts = _counts(mailbox_store.path)
        with open(f"counts-{worker}.jsonl", "a") as out:
            out.write(json.dumps(counts) + "\\n")
"""

#: Every kind of test a long suite has, once a cycle: passes, failures, timeouts, the
#: agent's tools, async waits, waits from threads, scripted faults.
CYCLE_SUITE = """
import asyncio
import threading

import pytest

from conftest import CYCLE


@pytest.mark.email_contract(purpose="signup", ttl=60, lease=30, link_domains=["app.example.test"])
@pytest.mark.parametrize("n", range({cycles} * CYCLE))
def test_mail(isolated_mailbox, send, n):
    kind, address = n % CYCLE, isolated_mailbox.address
    if kind == 0:  # a scripted fault (through the sink's writer thread), then the mail
        isolated_mailbox.inject_fault(stage="RCPT")
        with pytest.raises(Exception, match="451"):
            send(address)
        send(address)
        isolated_mailbox.wait_for(subject_contains="Verify").ack()
    elif kind == 1:
        send(address)
        isolated_mailbox.wait_for(subject_contains="Verify").ack()
        pytest.fail("fails after its ack")
    elif kind == 2:
        isolated_mailbox.wait_for(subject_contains="never sent", timeout=0.01)
    elif kind == 3:
        send(address)
        tools = isolated_mailbox.agent_tools()
        fixture_id = tools.call("reserve_mailbox", {{"purpose": "signup", "ttl": 60}})["fixture_id"]
        tools.call("wait_for_message", {{"fixture_id": fixture_id, "kind": "link", "timeout": 10}})
        claim = tools.call("claim_message", {{"fixture_id": fixture_id, "selector": {{}}}})
        assert tools.reveal(claim["message_id"], domain="app.example.test")
        ack = {{"fixture_id": fixture_id, "fence": claim["fence"]}}
        ack["message_id"] = claim["message_id"]
        assert tools.call("ack_message", ack)["status"] == "consumed"
    elif kind == 4:
        send(address)
        isolated_mailbox.wait_for(subject_contains="Verify")
        raise RuntimeError("fails holding its claim")
    elif kind == 5:  # an event loop of its own: the awaited wait, and the agent's acall
        async def main():
            send(address)
            (await isolated_mailbox.wait_for_async(subject_contains="Verify")).ack()
            send(address, subject="Your code")
            tools = isolated_mailbox.agent_tools()
            reserved = await tools.acall("reserve_mailbox", {{"purpose": "signup", "ttl": 60}})
            selector = {{"fixture_id": reserved["fixture_id"], "selector": {{}}}}
            assert (await tools.acall("claim_message", selector))["status"] == "claimed"
        asyncio.run(main())
    elif kind == 6:  # a thread of its own: its connections close those of ended threads
        send(address)
        claimed = []
        waiter = threading.Thread(target=lambda: claimed.append(isolated_mailbox.wait_for()))
        waiter.start()
        waiter.join()
        claimed[0].ack()
    elif kind == 7:
        send(isolated_mailbox.tagged("friend"))
        isolated_mailbox.wait_for(tag="friend").ack()
        isolated_mailbox.expect_none(within=0.01)
    elif kind == 8:
        send(address)  # left unclaimed
    else:
        send(address, token="first-A7k9Q2x8Zr5w")
        send(address, subject="Welcome", token="second-B8m2R4y6Ws3v")
        isolated_mailbox.wait_for(subject_contains="Welcome").ack()
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_long_run_holds_as_much_at_its_end_as_after_its_first_cycle(
    pytester: pytest.Pytester, workers: str
) -> None:
    """Descriptors, threads, sockets, SQLite connections, event loops and their transports,
    and the plugin's own objects, counted in the process that runs the tests at the end of
    each cycle of ten kinds of test: the same at the fifth as at the second (the first
    starts what a run starts once: the sink, its writer thread, the checkpointer)."""
    processes = 1 if workers == "0" else 2
    pytester.makeconftest(SEND_CONFTEST + COUNTING_CONFTEST)
    for name in ("test_one", "test_two")[:processes]:  # a file a worker (--dist loadfile)
        pytester.makepyfile(**{name: CYCLE_SUITE.format(cycles=5)})
    result = pytester.runpytest_subprocess(
        *BLOCKED, "-p", "no:cacheprovider", "-W", "error", "-n", workers, "--dist", "loadfile"
    )
    result.assert_outcomes(passed=35 * processes, failed=15 * processes)
    files = sorted(pytester.path.glob("counts-*.jsonl"))
    assert len(files) == processes
    for file in files:
        counts = [json.loads(line) for line in file.read_text().splitlines()]
        assert len(counts) == 5
        after_warm_up = counts[1]
        assert after_warm_up["sockets"] == {"0A": 1}  # the sink's listener, and nothing else
        for later in counts[2:]:
            assert later == after_warm_up


SMALL_SUITE = """
import json
import os
import select

import pytest


@pytest.mark.email_contract(purpose="signup", ttl=60, lease=30, link_domains=["app.example.test"])
@pytest.mark.parametrize("n", range(3))
def test_mail(isolated_mailbox, send, n):
    send(isolated_mailbox.address)
    isolated_mailbox.wait_for(subject_contains="Verify").ack()


@pytest.mark.email_contract(purpose="signup", ttl=60, lease=30, link_domains=["app.example.test"])
def test_agent(isolated_mailbox, send):
    send(isolated_mailbox.address)
    tools = isolated_mailbox.agent_tools()
    fixture_id = tools.call("reserve_mailbox", {"purpose": "signup", "ttl": 60})["fixture_id"]
    claim = tools.call("claim_message", {"fixture_id": fixture_id, "selector": {}})
    ack = {"fixture_id": fixture_id, "message_id": claim["message_id"], "fence": claim["fence"]}
    assert tools.call("ack_message", ack)["status"] == "consumed"


def test_held(isolated_mailbox, send, mailbox_server, mailbox_store):
    '''Claims its mail, says so on the FIFO ready-<run>, and acks only once the FIFO
    go-<run> says go (it holds its claim meanwhile, as other runs start and end).'''
    fifos = os.environ.get("FIFOS")
    send(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject_contains="Verify")
    if fifos:
        run = os.environ["RUN"]
        go = os.open(os.path.join(fifos, f"go-{run}"), os.O_RDONLY | os.O_NONBLOCK)
        said = {"port": mailbox_server.port, "store": str(mailbox_store.path),
                "address": isolated_mailbox.address, "pid": os.getpid()}
        with open(os.path.join(fifos, f"ready-{run}"), "w") as ready:
            ready.write(json.dumps(said) + "\\n")
        select.select([go], [], [])  # until the runner writes: no timeout (it has one)
        assert os.read(go, 2) == b"go"
        os.close(go)
    msg.ack()
    (seen,) = isolated_mailbox.receipt().messages
    assert seen.consumed_at is not None
"""

#: What one run of SMALL_SUITE says at its end.
SMALL_SUITE_COUNTS = (
    "mailbox: 5 reserved, 5 received, 5 claimed, 5 consumed, 0 expired, 0 claims expired, "
    "0 unrouted"
)


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "conftest.py").write_text(SEND_CONFTEST)
    (root / "test_small.py").write_text(SMALL_SUITE)
    return root


def _environment(tmp: Path, **more: str) -> dict[str, str]:
    """A machine of its own: pytest's default basetemp under ``tmp``, no home to write to."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "XDG_"))}
    env.update(TMPDIR=str(tmp), HOME=str(tmp / "home"), **more)
    return env


def _pytest(project: Path, env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """A pytest run of its own (no --basetemp: pytest's default), in its own process group."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *BLOCKED, "-p", "no:cacheprovider", *args],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _ended(run: subprocess.Popen[str]) -> str:
    try:
        return run.communicate(timeout=180)[0]  # a hang net, never a synchronisation
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        pytest.fail("a run hung:\n" + run.communicate()[0])


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


#: What a run's basetemp holds when it ended, besides its workers' own basetemps.
RUN_FILES = {
    STORE_NAME,
    f"{STORE_NAME}.lock",
    STORE_NAME.replace(".sqlite3", ".agent.sqlite3"),
    STORE_NAME.replace(".sqlite3", ".agent.sqlite3") + ".lock",
}


def test_runs_in_a_row_leave_files_in_pytests_basetemps_only(tmp_path: Path) -> None:
    """Four runs in one project, with pytest's default basetemp: what they leave is in the
    basetemps pytest keeps (three), and nothing else grows: no file in the project, the
    home or the temporary directory beside them, no store log (-wal, -shm) left."""
    project = _project(tmp_path / "project")
    tmp = tmp_path / "tmp"
    (tmp / "home").mkdir(parents=True)
    env = _environment(tmp)
    before = _files(project)
    for workers in ("0", "0", "2", "0"):
        out = _ended(_pytest(project, env, "-n", workers))
        assert "5 passed" in out, out
        assert SMALL_SUITE_COUNTS in out, out
    assert _files(project) == before
    assert not any((tmp / "home").iterdir())
    (user,) = tmp.glob("pytest-of-*")
    assert {p.name for p in tmp.iterdir()} == {"home", user.name}
    kept = sorted(p for p in user.iterdir() if not p.is_symlink())
    assert [p.name for p in kept] == ["pytest-1", "pytest-2", "pytest-3"]
    for basetemp, workers in zip(kept, ("0", "2", "0"), strict=True):
        files = {p.name for p in basetemp.iterdir()}
        assert files == RUN_FILES | ({"popen-gw0", "popen-gw1"} if workers == "2" else set())


@contextmanager
def _fifos(where: Path, runs: int) -> Iterator[Path]:
    where.mkdir()
    for run in range(runs):
        os.mkfifo(where / f"ready-{run}")
        os.mkfifo(where / f"go-{run}")
    yield where


def _ready(fifos: Path, run: int, runs: dict[int, subprocess.Popen[str]]) -> dict[str, Any]:
    """What run ``run`` said once its test_held holds its claim."""
    fd = os.open(fifos / f"ready-{run}", os.O_RDONLY | os.O_NONBLOCK)
    try:
        line = b""
        while not line.endswith(b"\n"):
            if not select.select([fd], [], [], 180)[0]:  # a hang net, not a synchronisation
                for other in runs.values():
                    os.killpg(other.pid, signal.SIGKILL)
                out = "\n".join(f"--- {n}:\n{r.communicate()[0]}" for n, r in runs.items())
                pytest.fail(f"run {run} never held its claim:\n{out}")
            line += os.read(fd, 4096)
    finally:
        os.close(fd)
    said: dict[str, Any] = json.loads(line)
    return said


def _go(fifos: Path, run: int) -> None:
    fd = os.open(fifos / f"go-{run}", os.O_WRONLY | os.O_NONBLOCK)  # its reader is open
    try:
        os.write(fd, b"go")
    finally:
        os.close(fd)


@pytest.mark.parametrize(("workers", "count"), [("0", 4), ("2", 2)])
def test_runs_at_once_on_one_machine_neither_share_nor_touch_each_others(
    tmp_path: Path, workers: str, count: int
) -> None:
    """Runs started together, with pytest's default basetemp (two terminals in a project,
    tox -p, two projects on one CI runner), all hold a claim at once; then they end one
    after the other, each while the later ones still hold theirs. Each has its own sink
    port and store, its end closes and counts only its own mailboxes, and pytest's cleanup
    of old basetemps (it keeps three) removes no store of a run still going."""
    projects = [_project(tmp_path / "project-a"), _project(tmp_path / "project-b")]
    tmp = tmp_path / "tmp"
    (tmp / "home").mkdir(parents=True)
    with _fifos(tmp_path / "fifos", count) as fifos:
        runs = {
            run: _pytest(
                projects[run % 2],
                _environment(tmp, FIFOS=str(fifos), RUN=str(run)),
                "-n",
                workers,
            )
            for run in range(count)
        }
        said = {run: _ready(fifos, run, runs) for run in runs}
        assert len({s["port"] for s in said.values()}) == count
        assert len({s["store"] for s in said.values()}) == count
        outs = {}
        for run, process in runs.items():
            _go(fifos, run)
            outs[run] = _ended(process)
            for later in range(run + 1, count):
                assert Path(said[later]["store"]).exists()
    for run, out in outs.items():
        assert runs[run].returncode == 0, out
        assert SMALL_SUITE_COUNTS in out, out
        assert "another pytest run" not in out, out


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_killed_with_its_workers_leaves_nothing_that_stops_the_next(
    tmp_path: Path, workers: str, fixed_port: int
) -> None:
    """``kill -9`` of a whole run (a CI job cancelled, a terminal closed) while a test holds
    a claim, in fixed-port mode with a receipts file: the next run, at once, takes the same
    port (the killed sink's connections may still be in TIME_WAIT) and the same receipts
    file (its lock died with its holder), and holds only its own receipts. What the killed
    run left (its store and its log) stays in its own basetemp, which pytest removes in
    turn."""
    project = _project(tmp_path / "project")
    tmp = tmp_path / "tmp"
    (tmp / "home").mkdir(parents=True)
    args = ("-n", workers, f"--mailbox-port={fixed_port}", "--mailbox-receipts=receipts.jsonl")
    with _fifos(tmp_path / "fifos", 1) as fifos:
        killed = _pytest(project, _environment(tmp, FIFOS=str(fifos), RUN="0"), *args)
        held = _ready(fifos, 0, {0: killed})
        os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=180)  # a hang net
    left = Path(held["store"]).parent
    assert {p.name for p in left.iterdir()} >= {STORE_NAME, f"{STORE_NAME}-wal"}

    out = _ended(_pytest(project, _environment(tmp), *args))
    assert "5 passed" in out, out
    assert SMALL_SUITE_COUNTS in out, out
    receipts = [json.loads(line) for line in (project / "receipts.jsonl").read_text().splitlines()]
    assert len(receipts) == 5
    assert held["address"] not in {receipt["address"] for receipt in receipts}
