"""NATS over TLS with credentials: ``--bootstrap tls://USER:PASSWORD@HOST:PORT?ca=FILE``
(and ``cert=``/``key=`` for a server that verifies clients) reaches a secured
``nats-server``; each refusal is one line that names the fix, at once, never a
retry loop; the password never shows in what the run prints."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from htmqc.errors import RuntimeFailure, UsageError
from htmqc.sources.nats import NatsClient, address_of, produce
from htmqc.sources.nats_server import NatsServer, start_nats
from tests.runtime.test_run_broker import finish, htmqc_run
from tests.security.certs import Pki
from tests.services import require_module, require_nats_server
from tests.sources.support import HANDLERS

PASSWORD = "s3cret-nats-pw"


def secured(pki: Pki, *flags: str) -> Iterator[NatsServer]:
    binary = require_nats_server()
    require_module("nats")
    with start_nats(binary=binary, extra=["--tlscert", str(pki.cert), "--tlskey", str(pki.key),
                                          *flags]) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[NatsServer]:
    """TLS (clients not verified) and a user with a password."""
    yield from secured(pki, "--tls", "--user", "alice", "--pass", PASSWORD)


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[NatsServer]:
    """Mutual TLS: a client must present a certificate the CA signed."""
    yield from secured(pki, "--tlsverify", "--tlscacert", str(pki.ca))


def url(server: NatsServer, query: str, userinfo: str = f"alice:{PASSWORD}@") -> str:
    return f"tls://{userinfo}127.0.0.1:{server.port}?{query}"


@pytest.mark.slow
def test_a_run_over_tls_with_a_password_handles_and_commits_everything(
    tls_server: NatsServer, pki: Pki, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    topic, n = topic_name(), 300
    bootstrap = url(tls_server, f"ca={pki.ca}")
    client = NatsClient(bootstrap)
    try:
        produce(bootstrap, topic, n, partitions=2, client=client)
        log, out = tmp_path / "run.log", tmp_path / "out.txt"
        proc = htmqc_run(
            bootstrap, topic, f"{HANDLERS}:log_order", "--source", "nats", "--group", "g",
            "--idle-exit", "2", "--log-level", "DEBUG", log=log,
            env={"HTMQC_TEST_OUT": str(out)},
        )  # fmt: skip
        assert finish(proc, 90) == 0, log.read_text()[-2000:]
        assert sum(client.committed("g", topic, p) or 0 for p in range(2)) == n
    finally:
        client.close()
    assert len(out.read_text().splitlines()) == n
    text = log.read_text()
    assert f"tls://alice:***@127.0.0.1:{tls_server.port}" in text  # shown, masked
    assert PASSWORD not in text


@pytest.mark.slow
def test_mutual_tls_with_the_client_certificate_connects(
    mtls_server: NatsServer, pki: Pki, topic_name: Callable[[], str]
) -> None:
    query = f"ca={pki.ca}&cert={pki.client_cert}&key={pki.client_key}"
    client = NatsClient(url(mtls_server, query, userinfo=""))
    try:
        topic = topic_name()
        client.create_topic(topic, 1)
        assert client.partitions(topic) == 1
    finally:
        client.close()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("server", "query", "userinfo", "said", "hint"),
    [
        ("tls", "ca={ca}", "alice:wrong-pw@", "refused the credentials", "user:password@"),
        ("tls", "ca={ca}", "", "asks for credentials", "user:password@"),
        ("tls", "ca={other}", "alice:" + PASSWORD + "@", "does not trust", "ca="),
        ("tls", "", "alice:" + PASSWORD + "@", "does not trust", "ca="),
        ("mtls", "ca={ca}", "", "refused the TLS handshake", "cert= and key="),
        ("mtls", "ca={ca}&cert={ocert}&key={okey}", "", "refused the TLS handshake", "cert="),
    ],
)
def test_a_refusal_is_one_line_at_once(
    request: pytest.FixtureRequest,
    pki: Pki,
    other_pki: Pki,
    server: str,
    query: str,
    userinfo: str,
    said: str,
    hint: str,
) -> None:
    target: NatsServer = request.getfixturevalue(f"{server}_server")
    query = query.format(
        ca=pki.ca, other=other_pki.ca, ocert=other_pki.client_cert, okey=other_pki.client_key
    )
    started = time.monotonic()
    with pytest.raises(RuntimeFailure) as caught:
        NatsClient(url(target, query, userinfo), connect_seconds=20.0).close()
    assert time.monotonic() - started < 5.0  # not the 20 s a server that is down gets
    line = caught.value.line()
    assert said in line and hint in line and "\n" not in line, line
    assert PASSWORD not in line and "wrong-pw" not in line


@pytest.mark.slow
def test_the_cli_refuses_a_bad_password_in_one_line(
    tls_server: NatsServer, pki: Pki, tmp_path: Path
) -> None:
    bootstrap = url(tls_server, f"ca={pki.ca}", userinfo="alice:wrong-pw-123@")
    log = tmp_path / "run.log"
    proc = htmqc_run(bootstrap, "t", f"{HANDLERS}:log_order", "--source", "nats", "--group", "g",
                     log=log)  # fmt: skip
    assert finish(proc, 60) != 0
    text = log.read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith("htmqc: error: NATS at tls://127.0.0.1:"), text
    assert "refused the credentials" in last and "Traceback" not in text
    assert "wrong-pw-123" not in text


@pytest.mark.parametrize(
    ("bootstrap", "said"),
    [
        ("tls://h:4222?cafile=x.pem", "unknown parameter 'cafile'"),
        ("tls://h:4222?ca=/no/such/ca.pem", "cannot read the CA file /no/such/ca.pem"),
        ("tls://h:4222?cert=/c.pem", "without its key"),
        ("tls://h:4222?ca=", "'ca' is empty"),
        ("tls://h:1?ca=a.pem,tls://h:2?ca=b.pem", "gives 'ca' twice"),
        ("nats://h:4222?creds=/no/such.creds", "cannot read the NATS credentials file"),
        ("http://h:4222", "is not a NATS URL"),
    ],
)
def test_a_bad_address_is_refused_before_connecting(bootstrap: str, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        address_of(bootstrap)
    assert said in caught.value.line()


def test_an_address_keeps_userinfo_and_drops_the_query(pki: Pki) -> None:
    address = address_of(f"tls://alice:pw@127.0.0.1:4222?ca={pki.ca},nats://h2:4223")
    assert address.servers == ("tls://alice:pw@127.0.0.1:4222", "tls://h2:4223")
    assert address.credentials and "tls" in address.options
    plain = address_of("127.0.0.1:4222")
    assert plain.servers == ("nats://127.0.0.1:4222",) and not plain.options
    assert not plain.credentials


@pytest.mark.slow
def test_the_password_is_masked_when_options_are_resolved(
    tls_server: NatsServer, pki: Pki
) -> None:
    from htmqc import secrets
    from htmqc.config import resolve

    try:
        resolve({"bootstrap": url(tls_server, f"ca={pki.ca}"), "topic": "t", "group": "g"}, {})
        assert secrets.scrub(f"failed with {PASSWORD}") == "failed with ***"
    finally:
        secrets.forget_all()
