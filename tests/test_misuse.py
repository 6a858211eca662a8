"""Misuse from the user's side: bad settings, an exposed sink, and secrets at DEBUG level."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_mailbox import EmailContract, MailSink, Store
from pytest_mailbox.settings import OPTIONS, Option, Settings

#: One invalid value per setting, and what the refusal must say it allows.
BAD: dict[str, tuple[str, str]] = {
    "domain": ("not a domain", "a domain name"),
    "allowed_domains": (
        "ex!ample.test",
        "domain names separated by commas or spaces, or a TOML list of them",
    ),
    "host": ("mail.example.test", "an IP address, or localhost"),
    "port": ("65536", "an integer 0..65535"),
    "max_message_size": ("10MB", "an integer 1024..1073741824"),
    "max_recipients": ("0", "an integer 1..10000"),
    "idle_timeout": ("0", "seconds 0.1..3600"),
    "data_policy": ("strict", "'flag' or 'refuse'"),
    "ttl_max": ("0", "an integer 1..86400"),
    "receipts": (
        ".",
        "a path to a new file, or to a receipts file to overwrite (not a directory, device, pipe "
        "or other file)",
    ),
    "ttl": ("0", "whole seconds, 1..mailbox_ttl_max"),
    "lease": ("inf", "seconds > 0, at most ttl"),
    "timeout": ("nan", "seconds > 0"),
    "max_reads": ("1001", "an integer 1..1000"),
    "max_resends": ("-1", "an integer 0..1000"),
    "mode": ("fast", "'live' or 'dry-run'"),
    "link_domains": (
        "localhost:8000",
        "host names separated by commas or spaces, or a TOML list of them",
    ),
}
#: Checked by the contract (not the option's parser), so the message comes from there.
CONTRACT_CHECKED = {"purpose": ("Sign Up", "is invalid: String should match")}


def test_every_setting_has_a_misuse_case() -> None:
    assert set(BAD) | set(CONTRACT_CHECKED) == {o.name for o in OPTIONS}


@pytest.mark.parametrize("source", ["cli", "ini", "env"])
@pytest.mark.parametrize("option", OPTIONS, ids=[o.name for o in OPTIONS])
def test_bad_value_is_refused_naming_the_setting_and_what_it_allows(
    option: Option, source: str
) -> None:
    name = option.name
    value, allowed = BAD.get(name) or CONTRACT_CHECKED[name]
    given = {name: value}
    where = {"cli": option.flag, "ini": f"ini {option.ini}", "env": option.env}[source]

    with pytest.raises(ValueError, match="is invalid") as refused:
        Settings.resolve(
            cli=given if source == "cli" else {},
            ini=given if source == "ini" else {},
            env={option.env: value} if source == "env" else {},
        )

    if name in BAD:
        assert str(refused.value) == f"{where}={value!r} is invalid; allowed: {allowed}"
    else:  # the contract's message, naming where the value came from
        assert f"settings: {name}={value!r} ({where}) {allowed}" in str(refused.value)


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [
        ("port", "\uff12\uff15", "an integer 0..65535"),  # full-width digits: not 25
        ("max_message_size", "1_048_576", "an integer 1024..1073741824"),
        ("idle_timeout", "3\u0660", "seconds 0.1..3600"),  # an Arabic-Indic zero
        ("timeout", "1_0", "seconds > 0"),
    ],
)
def test_a_number_is_written_as_a_config_file_writes_it(
    option: str, value: str, allowed: str
) -> None:
    with pytest.raises(ValueError, match="is invalid") as refused:
        Settings.resolve(cli={option: value}, ini={}, env={})

    flag = "--mailbox-" + option.replace("_", "-")
    assert str(refused.value) == f"{flag}={value!r} is invalid; allowed: {allowed}"


@pytest.mark.parametrize("kind", ["device", "pipe"])
def test_receipts_to_a_device_or_a_pipe_is_a_usage_error_not_a_crash_or_a_hang(
    pytester: pytest.Pytester, kind: str
) -> None:
    # /dev/null cannot be emptied (an INTERNALERROR at collection); opening a pipe for
    # writing waits for a reader that never comes.
    target = "/dev/null"
    if kind == "pipe":
        target = str(pytester.path / "receipts.pipe")
        os.mkfifo(target)
    pytester.makepyfile("def test_nothing(email_contract):\n    pass\n")

    result = pytester.runpytest(f"--mailbox-receipts={target}")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"*pytest-mailbox: --mailbox-receipts={target!r} is invalid; allowed: a path to a "
            "new file, or to a receipts file to overwrite (not a directory, device, pipe or "
            "other file)"
        ]
    )


def test_help_still_shows_with_a_bad_setting_and_names_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--help`` is how one finds what a setting allows: a bad one does not hide it."""
    monkeypatch.setenv("PYTEST_MAILBOX_TTL_MAX", "abc")
    pytester.makeini("[pytest]\nfilterwarnings = error\n")

    result = pytester.runpytest("--help")

    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*--mailbox-ttl-max=TTL_MAX*"])
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-mailbox: PYTEST_MAILBOX_TTL_MAX='abc' is invalid; allowed: an integer*"]
    )
    # Anything else is still refused.
    assert pytester.runpytest("--co").ret == pytest.ExitCode.USAGE_ERROR


def test_help_says_what_each_option_allows_and_no_empty_default(
    pytester: pytest.Pytester,
) -> None:
    """configuration.md: ``pytest --help`` is where one reads what each setting allows. The
    options' own lines said it nowhere (only the ini keys', further down), and an option
    with no default said ``default ''`` beside its help's ``(default: the domain)``."""
    result = pytester.runpytest("--help")

    assert result.ret == pytest.ExitCode.OK
    text = "".join(result.stdout.str().split())  # as wrapped at any width, hyphens too
    for option in OPTIONS:
        default = f"; default {option.default!r}" if option.default else ""
        line = (
            f"{option.flag}={option.name.upper()} {option.help} (allowed: {option.allowed}; "
            f"ini {option.ini}, env {option.env}{default})"
        )
        assert "".join(line.split()) in text, option.flag
    assert "default''" not in text


def test_unknown_mailbox_ini_key_and_env_variable_are_refused() -> None:
    with pytest.raises(
        ValueError, match=r"^unknown ini key 'mailbox_ttll'; pytest-mailbox knows: "
    ):
        Settings.resolve(cli={}, ini={}, env={}, ini_keys=["mailbox_ttl", "mailbox_ttll"])
    with pytest.raises(ValueError, match="PYTEST_MAILBOX_TTLL") as refused:
        Settings.resolve(cli={}, ini={}, env={"PYTEST_MAILBOX_TTLL": "5", "PYTEST_ADDOPTS": ""})
    assert str(refused.value).startswith(
        "unknown environment variable 'PYTEST_MAILBOX_TTLL'; pytest-mailbox knows: "
        "PYTEST_MAILBOX_ALLOWED_DOMAINS, PYTEST_MAILBOX_DATA_POLICY, "
    )
    Settings.resolve(cli={}, ini={}, env={}, ini_keys=["mailbox_ttl", "addopts", "markers"])


MARKER_MISUSE = {
    "ttl=True": "email_contract: ttl=True is invalid: Input should be a number, "
    "not a bool (allowed: whole seconds, 1..mailbox_ttl_max)",
    "lease=float('inf')": "email_contract: lease=inf is invalid: Input should be a finite number "
    "(allowed: seconds > 0, at most ttl)",
    "timeout='soon'": "email_contract: timeout='soon' is invalid: Input should be a valid number*",
    # It said "Input should be a valid tuple": the docs write a list, and the fix is one.
    "link_domains='app.example.test'": "email_contract: link_domains='app.example.test' is "
    "invalid: a list of host names, not one string: link_domains=[[]'app.example.test'] "
    "(allowed: a list of host names*",
    # written as mailbox_link_domains takes it: the list to write has a name an item
    "link_domains='app.example.test, cdn.example.test'": "email_contract: link_domains="
    "'app.example.test, cdn.example.test' is invalid: a list of host names, not one string: "
    "link_domains=[[]'app.example.test', 'cdn.example.test'] (allowed: a list of host names*",
    "link_domains=['https://app.example.test/x']": "email_contract: link_domains=*"
    "'https://app.example.test/x' is not a host name (no scheme, port or path) (allowed: a "
    "list of host names*",
    "max_reads=1.5": "email_contract: max_reads=1.5 is invalid: Input should be a valid integer*",
    "purpose=5": "email_contract: purpose=5 is invalid: Input should be a valid string*",
    "run_header='X Run'": "email_contract: run_header='X Run' is invalid: String should match*",
    "max_reads=5000": "email_contract: max_reads=5000 is invalid: Input should be less than "
    "or equal to 1000 (allowed: an integer 1..1000)",
    "max_resends=-1": "email_contract: max_resends=-1 is invalid: Input should be greater than "
    "or equal to 0 (allowed: an integer 0..1000)",
}


def test_bad_marker_arguments_fail_at_setup_naming_field_and_allowed_values(
    pytester: pytest.Pytester,
) -> None:
    tests = "\n".join(
        f"@pytest.mark.email_contract({args})\n"
        f"def test_{n}(isolated_mailbox):\n    raise AssertionError('never runs')\n"
        for n, args in enumerate(MARKER_MISUSE)
    )
    pytester.makepyfile(f"import pytest\n\n{tests}")

    result = pytester.runpytest()

    result.assert_outcomes(errors=len(MARKER_MISUSE))
    for expected in MARKER_MISUSE.values():
        result.stdout.fnmatch_lines([expected])
    result.stdout.no_fnmatch_line("*never runs*")


# -- binding ----------------------------------------------------------------------------------

EXPOSED = (
    "*pytest-mailbox: the SMTP sink is set to listen on 0.0.0.0 (mailbox_host), not on "
    "loopback: other machines can connect and send mail into this run.*"
)


def test_non_loopback_host_under_w_error_stops_the_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_it(): pass")

    result = pytester.runpytest("-W", "error", "--mailbox-host=0.0.0.0")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: " + EXPOSED])


@pytest.mark.parametrize("workers", ["0", "2"])
def test_non_loopback_host_warns_once(pytester: pytest.Pytester, workers: str) -> None:
    pytester.makepyfile("def test_it(): pass\ndef test_other(): pass")

    result = pytester.runpytest("-n", workers, "--mailbox-host=0.0.0.0", "-W", "default")

    # One warning in all: the workers, which read the same setting, say nothing.
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*ExposedSinkWarning: " + EXPOSED.lstrip("*")])
    assert sum("ExposedSinkWarning:" in line for line in result.outlines) == 1


def test_non_loopback_host_can_be_acknowledged(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_it(): pass")

    result = pytester.runpytest(
        "-W", "error", "-W", "ignore::pytest_mailbox.ExposedSinkWarning", "--mailbox-host=0.0.0.0"
    )

    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*ExposedSinkWarning*")


def test_an_ipv6_host_this_machine_cannot_listen_on_is_named_as_a_url_names_it(
    pytester: pytest.Pytester,
) -> None:
    # It said "cannot listen on 2001:db8::1:0": which colon began the port?
    pytester.makepyfile("def test_a(isolated_mailbox): pass")

    result = pytester.runpytest(
        "--mailbox-host=2001:db8::1",  # the documentation prefix: no machine's own address
        "-W", "ignore::pytest_mailbox.ExposedSinkWarning",
    )  # fmt: skip

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["ERROR: pytest-mailbox cannot listen on [[]2001:db8::1]:0: *; --mailbox-host / *"]
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_host_this_machine_cannot_listen_on_stops_the_run_before_any_test(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makepyfile("def test_a(isolated_mailbox): pass\ndef test_b(isolated_mailbox): pass")

    result = pytester.runpytest(
        "-n", workers, "--mailbox-host=192.0.2.1",  # TEST-NET-1: no machine's own address
        "-W", "ignore::pytest_mailbox.ExposedSinkWarning",
    )  # fmt: skip

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            "ERROR: pytest-mailbox cannot listen on 192.0.2.1:0: *; --mailbox-host / "
            "mailbox_host must be an address of this machine *"
        ]
    )
    assert sum("cannot listen" in line for line in result.errlines + result.outlines) == 1
    result.stdout.no_fnmatch_line("*test_a*")
    assert "Traceback" not in "\n".join(result.errlines + result.outlines)
    # A run that only lists (an IDE's discovery, on a machine of its own) is left alone.
    listed = pytester.runpytest(
        "-n", workers, "--mailbox-host=192.0.2.1", "--collect-only", "-q",
        "-W", "ignore::pytest_mailbox.ExposedSinkWarning",
    )  # fmt: skip
    assert listed.ret == pytest.ExitCode.OK


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_loopback_hosts_do_not_warn(pytester: pytest.Pytester, host: str) -> None:
    pytester.makepyfile(
        f"""
        def test_it(mailbox_server):
            assert mailbox_server.host == {host!r}
        """
    )

    result = pytester.runpytest("-W", "error", f"--mailbox-host={host}")

    result.assert_outcomes(passed=1)


# -- the options reach the sink ---------------------------------------------------------------

RAW_CLIENT = """
import socket

import pytest


class Raw:
    def __init__(self, server):
        self.sock = socket.create_connection((server.host, server.port), timeout=10)
        self.file = self.sock.makefile("rb")
        self.banner = self.reply()

    def reply(self):
        lines = []
        while True:
            line = self.file.readline()
            lines.append(line)
            if not line or line[3:4] != b"-":
                return b"".join(lines)

    def cmd(self, line):
        self.sock.sendall(line + b"\\r\\n")
        return self.reply()

    def close(self):
        self.file.close()
        self.sock.close()


@pytest.fixture
def raw(mailbox_server):
    client = Raw(mailbox_server)
    yield client
    client.close()
"""


def test_limits_and_policies_reach_the_sink(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(RAW_CLIENT)
    pytester.makepyfile(
        """
        def test_limits(isolated_mailbox, raw):
            assert raw.cmd(b"EHLO x").startswith(b"250")
            assert raw.cmd(b"MAIL FROM:<a@example.test>").startswith(b"250")
            replies = [raw.cmd(b"RCPT TO:<u%d@mailbox.test>" % i)[:3] for i in range(3)]
            assert replies == [b"250", b"250", b"452"]
            assert raw.cmd(b"DATA").startswith(b"354")
            raw.sock.sendall(b"Subject: bare\\nX: y\\r\\n\\r\\nhi\\r\\n.\\r\\n")
            assert raw.reply().startswith(b"554 5.6.0 Message refused: bare LF in DATA")
            assert raw.file.read() == (
                b"421 4.4.2 pytest-mailbox.test Error: timeout exceeded\\r\\n"
            )
        """
    )

    result = pytester.runpytest(
        "--mailbox-max-recipients=2", "--mailbox-data-policy=refuse", "--mailbox-idle-timeout=3"
    )

    result.assert_outcomes(passed=1)


#: Bad values for the arguments of MailSink that are settings too.
SINK_BAD = {
    "host": ("", "mail.example.test"),  # "" bound every interface, as smtp://:port
    "port": (-1, 70000, "25"),
    "max_recipients": (0, -1, "x"),  # 0 refused every RCPT, "x" failed there with 451
    "idle_timeout": (0, -1, float("nan"), "x"),  # dropped every connection, or failed in it
}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param(name, value, id=f"{name}={value!r}")
        for name, values in SINK_BAD.items()
        for value in values
    ],
)
def test_the_sink_refuses_what_its_option_refuses(store: Store, name: str, value: object) -> None:
    with pytest.raises(ValueError, match="is invalid") as refused:
        MailSink(store, domains=["mailbox.test"], **{name: value})

    assert str(refused.value) == f"{name}={value!r} is invalid; allowed: {BAD[name][1]}"


@pytest.mark.parametrize(
    "domains", ["mailbox.test", ["a b"], ["x@mailbox.test"], [5], None, [], ()]
)
def test_the_sink_refuses_domains_that_are_not_a_list_of_domain_names(
    store: Store, domains: object
) -> None:
    # A bare string was taken for its characters, and no domain was taken at all: the sink
    # refused every recipient.
    with pytest.raises(ValueError, match="is invalid") as refused:
        MailSink(store, domains=domains)  # type: ignore[arg-type]

    assert str(refused.value) == (
        f"domains={domains!r} is invalid; allowed: a non-empty list of domain names, "
        "such as ['mailbox.test']"
    )
    sink = MailSink(store, domains=("Bücher.Test.", "mailbox.test"), host="::1", idle_timeout=1)
    assert sink.domains == {"xn--bcher-kva.test", "mailbox.test"}


# -- secrets ----------------------------------------------------------------------------------

CODE = "482913"
TOKEN = "Zq8vT4nW2xKp9LmR"

SECRET_CONFTEST = f"""
import logging
from pathlib import Path

import pytest

CODE = {CODE!r}
TOKEN = {TOKEN!r}
LOG = Path(__file__).parent / "all.log"
REPLIES = Path(__file__).parent / "replies.log"


def pytest_configure(config):
    # DEBUG on every logger, into a file nobody filters (besides pytest's own capture).
    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    handler = logging.FileHandler(LOG, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    root.addHandler(handler)


@pytest.fixture
def send(mailbox_server):
    import socket

    def send(to):
        sock = socket.create_connection((mailbox_server.host, mailbox_server.port), timeout=10)
        file = sock.makefile("rb")
        replies = [file.readline()]

        def cmd(data):
            sock.sendall(data)
            while True:
                line = file.readline()
                replies.append(line)
                if not line or line[3:4] != b"-":
                    return line

        cmd(b"EHLO app.example.test\\r\\n")
        cmd(b"MAIL FROM:<noreply@app.example.test>\\r\\n")
        cmd(f"RCPT TO:<{{to}}>\\r\\n".encode())
        cmd(b"DATA\\r\\n")
        body = (
            f"From: noreply@app.example.test\\r\\nTo: {{to}}\\r\\n"
            f"Subject: Your code is {{CODE}}\\r\\n\\r\\n"
            f"Code {{CODE}}. Link https://app.example.test/verify?token={{TOKEN}}\\r\\n.\\r\\n"
        )
        assert cmd(body.encode()).startswith(b"250")
        # A confused client: the secrets as a command of their own, and as a VRFY argument.
        cmd(f"{{CODE}} {{TOKEN}}\\r\\n".encode())
        cmd(f"VRFY <{{CODE}}@@{{TOKEN}}>\\r\\n".encode())
        cmd(b"QUIT\\r\\n")
        sock.close()
        with REPLIES.open("ab") as out:
            out.write(b"".join(replies))

    return send
"""

SECRET_TESTS = """
import logging


def test_extracts(isolated_mailbox, send):
    send(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject_contains="Your code")
    logging.getLogger("app").debug("verifying %s", isolated_mailbox.address)
    assert msg.code(pattern=r"Code (\\d{6})") == CODE
    assert msg.link(domain="app.example.test").endswith(TOKEN)
    msg.ack()


def test_fails_after_extracting(isolated_mailbox, send):
    send(isolated_mailbox.address)
    msg = isolated_mailbox.wait_for(subject_contains="Your code")
    msg.code(pattern=r"Code (\\d{6})")
    msg.link(domain="app.example.test")
    raise AssertionError("the app rejected the verification")
""".replace("CODE", repr(CODE)).replace("TOKEN", repr(TOKEN))


@pytest.mark.parametrize("workers", ["0", "2"])
def test_no_secret_reaches_logs_replies_or_reports_at_debug(
    pytester: pytest.Pytester, workers: str
) -> None:
    pytester.makeconftest(SECRET_CONFTEST)
    pytester.makepyfile(test_secrets=SECRET_TESTS)

    result = pytester.runpytest(
        "-n", workers, "-rA", "--log-level=DEBUG", "-o", "log_cli=true",
        "--log-cli-level=DEBUG", "--junitxml=junit.xml", "--mailbox-receipts=receipts.jsonl",
    )  # fmt: skip

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*the app rejected the verification*", "*- mailbox -*"])
    logged = (pytester.path / "all.log").read_text()
    replies = (pytester.path / "replies.log").read_text()
    # The places searched are not empty: the sink logged at DEBUG, the client kept replies.
    assert "mail.log INFO" in logged
    assert "sent an unrecognised command" in logged
    assert replies.count("250 2.0.0 Message accepted") == 2
    assert "500 5.5.1 Error: command not recognized" in replies
    assert "502 5.5.1 Could not VRFY that address" in replies
    outputs = {
        "terminal": "\n".join(result.outlines + result.errlines),
        "root logger at DEBUG": logged,
        "SMTP replies": replies,
        "junit": (pytester.path / "junit.xml").read_text(),
        "jsonl": (pytester.path / "receipts.jsonl").read_text(),
    }
    for name, text in outputs.items():
        assert CODE not in text, name
        assert TOKEN not in text, name
        assert TOKEN.lower() not in text.lower(), name


# -- defaults that give way, -o on the command line, TOML lists ------------------------------

LIMIT = "a claim cannot outlive its mailbox, lower lease or raise ttl"


def test_option_defaults_are_the_contract_defaults() -> None:
    # The settings pass the contract only what was given; the table must show its defaults.
    for name in _CONTRACT_DEFAULTS:
        option = next(o for o in OPTIONS if o.name == name)
        assert option.parse(option.default) == EmailContract.model_fields[name].default, name


_CONTRACT_DEFAULTS = ("purpose", "ttl", "lease", "timeout", "max_reads", "max_resends", "mode")


def test_a_lease_nobody_gave_is_at_most_the_ttl() -> None:
    assert EmailContract().lease == 60
    assert EmailContract(ttl=30).lease == 30
    assert EmailContract(ttl=30, lease=10).lease == 10
    # Still a default: overlaid with a longer ttl, the contract leases for the minute again.
    short = EmailContract(ttl=30)
    assert EmailContract(**{**short.model_dump(exclude_unset=True), "ttl": 120}).lease == 60
    with pytest.raises(ValueError, match=f"^email_contract: lease=60 exceeds ttl=30; {LIMIT}$"):
        EmailContract(ttl=30, lease=60).check_limits(ttl_max=3600)

    settings = Settings.resolve(cli={}, ini={"ttl": "20"}, env={})
    assert (settings.contract.ttl, settings.contract.lease) == (20, 20)


def test_a_ttl_nobody_gave_is_at_most_ttl_max() -> None:
    settings = Settings.resolve(cli={}, ini={"ttl_max": "20"}, env={})
    assert (settings.contract.ttl, settings.contract.lease) == (20, 20)
    assert Settings.resolve(cli={}, ini={"ttl_max": "1000"}, env={}).contract.ttl == 300

    with pytest.raises(ValueError, match="exceeds") as refused:
        Settings.resolve(cli={}, ini={"ttl_max": "20"}, env={"PYTEST_MAILBOX_LEASE": "25"})
    assert str(refused.value) == (  # raising ttl alone would meet ttl_max: both, it says
        "settings: lease=25 (PYTEST_MAILBOX_LEASE) exceeds ttl=20 (default, capped at "
        "mailbox_ttl_max); a claim cannot outlive its mailbox, lower lease, or raise "
        "mailbox_ttl_max (the ini key, --mailbox-ttl-max or PYTEST_MAILBOX_TTL_MAX) and "
        "raise ttl"
    )
    # ttl below its maximum, the lease above it: raising ttl alone cannot do either
    with pytest.raises(ValueError, match="lower lease, or raise mailbox_ttl_max"):
        EmailContract(ttl=600, lease=4000).check_limits(ttl_max=3600)
    with pytest.raises(ValueError, match="a claim cannot outlive its mailbox, lower lease or"):
        EmailContract(ttl=600, lease=900).check_limits(ttl_max=3600)  # ttl=900 would do
    with pytest.raises(ValueError, match=r"^settings: ttl=300 \(ini mailbox_ttl\) exceeds "):
        Settings.resolve(cli={}, ini={"ttl_max": "20", "ttl": "300"}, env={})


def test_marker_ttl_below_the_default_lease_takes_a_shorter_lease(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nmailbox_ttl = 20\nmailbox_ttl_max = 600\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.email_contract(ttl=30)
        def test_marker(email_contract, isolated_mailbox):
            assert (email_contract.ttl, email_contract.lease) == (30, 30)

        def test_ini(email_contract):
            assert (email_contract.ttl, email_contract.lease) == (20, 20)

        @pytest.mark.email_contract(ttl=120)
        def test_longer(email_contract):
            assert email_contract.lease == 60
        """
    )

    pytester.runpytest("-n", "0").assert_outcomes(passed=3)


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        ([], {}, "lease=60 (ini mailbox_lease) exceeds ttl=30 (marker)"),
        (["-o", "mailbox_lease=45"], {}, "lease=45 (-o mailbox_lease) exceeds ttl=30 (marker)"),
        (["--mailbox-lease=45"], {}, "lease=45 (--mailbox-lease) exceeds ttl=30 (marker)"),
        (
            [],
            {"PYTEST_MAILBOX_LEASE": "45"},
            "lease=45 (PYTEST_MAILBOX_LEASE) exceeds ttl=30 (marker)",
        ),
    ],
)
def test_a_lease_given_above_the_marker_ttl_names_where_it_came_from(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: list[str],
    env: dict[str, str],
    expected: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makeini("[pytest]\nmailbox_lease = 60\n")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.email_contract(ttl=30)
        def test_short(email_contract):
            raise AssertionError("never runs")

        @pytest.mark.email_contract(ttl=10, lease=20)
        def test_both(email_contract):
            raise AssertionError("never runs")

        @pytest.mark.email_contract(lease=700)
        def test_default_ttl(email_contract):
            raise AssertionError("never runs")
        """
    )

    result = pytester.runpytest("-n", "0", *args)

    result.assert_outcomes(errors=3)
    result.stdout.fnmatch_lines_random(
        [
            f"email_contract: {expected}; {LIMIT}",
            f"email_contract: lease=20 (marker) exceeds ttl=10 (marker); {LIMIT}",
            f"email_contract: lease=700 (marker) exceeds ttl=300 (default); {LIMIT}",
        ]
    )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_override_ini_ranks_with_the_command_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: str
) -> None:
    monkeypatch.setenv("PYTEST_MAILBOX_TIMEOUT", "3")
    pytester.makeini("[pytest]\nmailbox_timeout = 5\n")
    pytester.makepyfile(
        """
        import os

        def test_it(email_contract):
            assert email_contract.timeout == float(os.environ["EXPECTED"])
        """
    )
    for expected, args in [
        ("3", []),
        ("7", ["-o", "mailbox_timeout=7"]),
        ("7", ["--override-ini=mailbox_timeout=7"]),
        ("8", ["-o", "mailbox_timeout=7", "-o", "mailbox_timeout=8"]),  # the last, as pytest
        ("9", ["-o", "mailbox_timeout=7", "--mailbox-timeout=9"]),
    ]:
        monkeypatch.setenv("EXPECTED", expected)
        pytester.runpytest("-n", workers, *args).assert_outcomes(passed=1)

    result = pytester.runpytest("-n", workers, "-o", "mailbox_timeout=-7")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*pytest-mailbox: -o mailbox_timeout='-7' is invalid; allowed: seconds > 0"]
    )


def test_relative_receipts_path_from_o_is_taken_from_the_ini_directory(tmp_path: Path) -> None:
    def receipts(**given: Any) -> Path | None:
        return Settings.resolve(
            **{"cli": {}, "ini": {}, "env": {}, **given}, ini_dir=tmp_path
        ).receipts

    assert receipts(override_ini=["mailbox_receipts=r.jsonl"]) == tmp_path / "r.jsonl"
    assert receipts(ini={"receipts": "r.jsonl"}) == tmp_path / "r.jsonl"
    assert receipts(env={"PYTEST_MAILBOX_RECEIPTS": "r.jsonl"}) == Path("r.jsonl")
    assert receipts(cli={"receipts": "r.jsonl"}) == Path("r.jsonl")


#: pytest 9 reads a native ``[tool.pytest]`` table; pytest 8 knows ``ini_options`` only.
TOML_TABLES = [
    "tool.pytest.ini_options",
    *(["tool.pytest"] if pytest.version_tuple >= (9,) else []),
]


@pytest.mark.parametrize("table", TOML_TABLES)
def test_settings_of_several_values_take_a_toml_list(pytester: pytest.Pytester, table: str) -> None:
    pytester.makepyprojecttoml(
        f"""
        [{table}]
        mailbox_link_domains = ["a.example.test", "B.example.test"]
        mailbox_allowed_domains = ["mailbox.test", "other.test"]
        """
    )
    pytester.makepyfile(
        """
        def test_it(email_contract, mailbox_server):
            assert email_contract.link_domains == ("a.example.test", "b.example.test")
            assert mailbox_server.domains == {"mailbox.test", "other.test"}
        """
    )

    pytester.runpytest("-n", "0", "-W", "error").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (
            'mailbox_link_domains = ["a.example.test", 3]',
            'ini mailbox_link_domains=["a.example.test", 3] is invalid: item 1 is 3, not a '
            "string; allowed: host names separated by commas or spaces, or a TOML list of them",
        ),
        (
            'mailbox_allowed_domains = ["ok.test", "ex!ample.test"]',
            'ini mailbox_allowed_domains=["ok.test", "ex!ample.test"] is invalid; allowed: '
            "domain names separated by commas or spaces, or a TOML list of them",
        ),
        (
            "mailbox_ttl = [60]",
            "ini mailbox_ttl=[60] is invalid; allowed: whole seconds, 1..mailbox_ttl_max",
        ),
    ],
)
@pytest.mark.parametrize("table", TOML_TABLES)
def test_bad_toml_list_is_refused_naming_the_setting(
    pytester: pytest.Pytester, table: str, toml: str, expected: str
) -> None:
    pytester.makepyprojecttoml(f"[{table}]\n{toml}\n")
    pytester.makepyfile("def test_it(): pass")

    result = pytester.runpytest("-n", "0")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-mailbox: {expected}"])


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="pytest 8 has no [tool.pytest] table")
@pytest.mark.parametrize(
    ("toml", "shown"),
    [
        ("mailbox_link_domains = true", "ini mailbox_link_domains=true"),
        ("mailbox_ttl = 1979-05-27", "ini mailbox_ttl=1979-05-27"),
        ("mailbox_timeout = false", "ini mailbox_timeout=false"),
        ("mailbox_ttl = 0", "ini mailbox_ttl=0"),
        ("mailbox_lease = inf", "ini mailbox_lease=inf"),
        ('mailbox_receipts = {"a b" = 1.5}', 'ini mailbox_receipts={"a b" = 1.5}'),
        ("mailbox_receipts = {path = 'r.jsonl'}", 'ini mailbox_receipts={path = "r.jsonl"}'),
    ],
)
def test_a_toml_value_of_another_kind_is_refused_saying_what_the_setting_allows(
    pytester: pytest.Pytester, toml: str, shown: str
) -> None:
    pytester.makepyprojecttoml(f"[tool.pytest]\n{toml}\n")
    pytester.makepyfile("def test_it(): pass")

    result = pytester.runpytest("-n", "0")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    option = next(o for o in OPTIONS if toml.startswith(o.ini + " "))
    result.stderr.fnmatch_lines(
        [f"ERROR: pytest-mailbox: {shown} is invalid; allowed: {option.allowed}"]
    )


def test_a_lease_of_exactly_ttl_max_is_told_to_raise_ttl_alone() -> None:
    """A ttl up to ttl_max holds a lease of ttl_max: raising ttl is enough, and the
    message does not send the user to mailbox_ttl_max."""
    with pytest.raises(ValueError, match="exceeds") as refused:
        EmailContract(ttl=600, lease=3600).check_limits(ttl_max=3600)
    assert str(refused.value).endswith(f"; {LIMIT}")


@pytest.mark.parametrize(
    ("option", "lowest", "highest", "below", "above"),
    [
        ("port", "0", "65535", "-1", "65536"),
        ("max_message_size", "1024", "1073741824", "1023", "1073741825"),
        ("max_recipients", "1", "10000", "0", "10001"),
        ("idle_timeout", "0.1", "3600", "0.09", "3600.5"),
        ("ttl_max", "1", "86400", "0", "86401"),
        ("max_reads", "1", "1000", "0", "1001"),
        ("max_resends", "0", "1000", "-1", "1001"),
        ("timeout", "0.001", "1e9", "0", None),
        ("lease", "0.001", None, "0", None),
        ("domain", "a" * 63 + ".test", None, None, "a" * 64 + ".test"),
    ],
)
def test_a_setting_takes_the_ends_of_its_range_and_refuses_one_past_them(
    option: str, lowest: str, highest: str | None, below: str | None, above: str | None
) -> None:
    for value in (lowest, highest):
        if value is not None:
            Settings.resolve(cli={option: value}, ini={}, env={})
    allowed = next(o.allowed for o in OPTIONS if o.name == option)
    flag = "--mailbox-" + option.replace("_", "-")
    for value in (below, above):
        if value is not None:
            with pytest.raises(ValueError, match="is invalid") as refused:
                Settings.resolve(cli={option: value}, ini={}, env={})
            assert str(refused.value) == f"{flag}={value!r} is invalid; allowed: {allowed}"


def test_an_empty_value_is_no_value_given() -> None:
    settings = Settings.resolve(
        cli={"ttl": "", "domain": None},
        ini={"ttl": "42", "link_domains": []},
        env={"PYTEST_MAILBOX_TTL": "", "PYTEST_MAILBOX_DOMAIN": ""},
    )

    assert (settings.contract.ttl, settings.sources["ttl"]) == (42, "ini mailbox_ttl")
    assert (settings.domain, settings.sources["domain"]) == ("mailbox.test", "default")
    assert settings.sources["link_domains"] == "default"


def test_a_ttl_max_of_the_default_ttl_caps_nothing() -> None:
    settings = Settings.resolve(cli={}, ini={"ttl_max": "300"}, env={})

    assert settings.contract.ttl == 300
    assert settings.sources["ttl"] == "default"
    assert settings.contract_given == {}


_KEPT_QUOTES = "its quotes would be part of the value (only pyproject.toml reads quotes; an ini "
_KEPT_QUOTES += "file, -o, an option and a variable keep them)"


@pytest.mark.parametrize(
    ("files", "args", "env", "expected"),
    [
        (  # it wrote its receipts to a file named "r.jsonl", quotes and all
            {"pytest.ini": '[pytest]\nmailbox_receipts = "r.jsonl"\n'},
            [],
            {},
            f"ini mailbox_receipts='\"r.jsonl\"' is invalid: {_KEPT_QUOTES}; "
            "write mailbox_receipts = r.jsonl",
        ),
        (  # refused saying it allows 'dry-run', as it was written
            {"setup.cfg": "[tool:pytest]\nmailbox_mode = 'dry-run'\n"},
            [],
            {},
            f"ini mailbox_mode=\"'dry-run'\" is invalid: {_KEPT_QUOTES}; "
            "write mailbox_mode = dry-run",
        ),
        (
            {"tox.ini": '[pytest]\nmailbox_link_domains = ["a.test", "b.test"]\n'},
            [],
            {},
            'ini mailbox_link_domains=\'[[]"a.test", "b.test"]\' is invalid: a list in brackets '
            "is TOML, which only pyproject.toml reads; write "
            "mailbox_link_domains = a.test, b.test",
        ),
        (
            {},
            ["-o", "mailbox_allowed_domains=['a.test']"],
            {},
            "-o mailbox_allowed_domains=\"[[]'a.test']\" is invalid: a list in brackets is TOML, "
            "which only pyproject.toml reads; write -o mailbox_allowed_domains=a.test",
        ),
        (  # two quoted names, not one name in quotes
            {"pytest.ini": '[pytest]\nmailbox_allowed_domains = "a.test", "b.test"\n'},
            [],
            {},
            f'ini mailbox_allowed_domains=\'"a.test", "b.test"\' is invalid: {_KEPT_QUOTES}; '
            "write mailbox_allowed_domains = a.test, b.test",
        ),
        (  # as a docker --env-file or a CI's YAML may hand it over
            {},
            [],
            {"PYTEST_MAILBOX_TTL": '"120"'},
            f"PYTEST_MAILBOX_TTL='\"120\"' is invalid: {_KEPT_QUOTES}; "
            "write PYTEST_MAILBOX_TTL=120",
        ),
        (
            {},
            ["--mailbox-receipts='r.jsonl'"],
            {},
            f"--mailbox-receipts=\"'r.jsonl'\" is invalid: {_KEPT_QUOTES}; "
            "write --mailbox-receipts=r.jsonl",
        ),
    ],
    ids=["pytest.ini", "setup.cfg", "tox.ini", "-o", "quoted names", "env", "option"],
)
def test_a_value_written_as_toml_where_it_is_taken_as_written_is_refused_saying_how_to_write_it(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str],
    args: list[str],
    env: dict[str, str],
    expected: str,
) -> None:
    for name, text in files.items():
        pytester.path.joinpath(name).write_text(text, encoding="utf-8")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile("def test_it(isolated_mailbox): pass")

    result = pytester.runpytest("-n", "0", *args)

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-mailbox: {expected}"])
    assert sorted(p.name for p in pytester.path.iterdir() if "jsonl" in p.name) == []


@pytest.mark.parametrize(
    ("name", "text", "shown"),
    [
        # pytest hands [tool.pytest.ini_options]'s true over as "True": a file of that name
        ("pyproject.toml", "[tool.pytest.ini_options]\nmailbox_receipts = true\n", "'True'"),
        ("pytest.ini", "[pytest]\nmailbox_receipts = yes\n", "'yes'"),
        ("tox.ini", "[pytest]\nmailbox_receipts = 1\n", "'1'"),
    ],
    ids=["ini_options-true", "pytest.ini-yes", "tox.ini-1"],
)
def test_a_receipts_switch_is_refused_asking_for_a_file(
    pytester: pytest.Pytester, name: str, text: str, shown: str
) -> None:
    pytester.path.joinpath(name).write_text(text, encoding="utf-8")
    pytester.makepyfile("def test_it(isolated_mailbox): pass")
    before = sorted(pytester.path.iterdir())

    result = pytester.runpytest("-n", "0")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        [
            f"ERROR: pytest-mailbox: ini mailbox_receipts={shown} is invalid: mailbox_receipts "
            "is the file to write the receipts to, not a switch; write "
            "mailbox_receipts = receipts.jsonl, or give none to write no file"
        ]
    )
    assert sorted(pytester.path.iterdir()) == before


@pytest.mark.parametrize("value", [1, 0])
def test_a_receipts_switch_written_as_a_toml_number_is_refused_too(value: int) -> None:
    """pytest 9's native ``[tool.pytest]`` table hands a TOML number over as it is:
    ``mailbox_receipts = 1`` named a file ``1``, where the same line in an ini file is
    refused as a switch."""
    with pytest.raises(ValueError, match="is the file to write the receipts to, not a switch"):
        Settings.resolve(cli={}, ini={"receipts": value}, env={})


@pytest.mark.skipif(pytest.version_tuple < (9,), reason="pytest 8 has no [tool.pytest] table")
def test_a_receipts_switch_written_as_a_toml_number_is_fixed_as_toml_writes_a_path(
    pytester: pytest.Pytester,
) -> None:
    """The fix for ``mailbox_receipts = 1`` in ``[tool.pytest]`` is a TOML string: the
    unquoted ``mailbox_receipts = receipts.jsonl`` it gave is no TOML, and pytest refuses
    the file; nor is the number shown as the string ``'1'``."""
    pytester.makepyprojecttoml("[tool.pytest]\nmailbox_receipts = 1\n")
    pytester.makepyfile("def test_one():\n    pass\n")

    result = pytester.runpytest_subprocess()

    result.stderr.fnmatch_lines(
        ['*mailbox_receipts=1 is invalid: *; write mailbox_receipts = "receipts.jsonl", or *']
    )


@pytest.mark.parametrize(
    ("cli", "ini", "env", "expected"),
    [
        (  # a shell splits --mailbox-link-domains=a.test, b.test in two: b.test a path
            {"link_domains": "['a.test', 'b.test']"},
            {},
            {},
            "write --mailbox-link-domains=a.test,b.test",
        ),
        (
            {},
            {},
            {"PYTEST_MAILBOX_ALLOWED_DOMAINS": '"a.test" "b.test"'},
            "write PYTEST_MAILBOX_ALLOWED_DOMAINS=a.test,b.test",
        ),
        (
            {},
            {"allowed_domains": '"a.test", "b.test"'},
            {},
            "write mailbox_allowed_domains = a.test, b.test",
        ),
    ],
    ids=["option", "env", "ini"],
)
def test_the_names_to_write_are_one_word_where_a_shell_would_split_them(
    cli: dict[str, str], ini: dict[str, str], env: dict[str, str], expected: str
) -> None:
    with pytest.raises(ValueError, match="is invalid") as refused:
        Settings.resolve(cli=cli, ini=ini, env=env)

    assert str(refused.value).endswith(expected)


def test_a_quote_inside_a_name_is_no_quoting_to_take_off() -> None:
    # It said "write --mailbox-allowed-domains=o'brien.test", the value refused, as the fix.
    with pytest.raises(ValueError, match="is invalid") as refused:
        Settings.resolve(cli={"allowed_domains": "a.test, o'brien.test"}, ini={}, env={})

    allowed = next(o.allowed for o in OPTIONS if o.name == "allowed_domains")
    assert str(refused.value) == (
        f'--mailbox-allowed-domains="a.test, o\'brien.test" is invalid; allowed: {allowed}'
    )
