"""NATS over TLS with credentials: ``--bootstrap tls://USER:PASSWORD@HOST:PORT?ca=FILE``
(and ``cert=``/``key=`` for a server that verifies clients) reaches a secured
``nats-server``, and ``?creds=FILE`` (a user's JWT and NKey seed) a server in operator
mode; each refusal is one line that names the fix, at once, never a
retry loop; the password never shows in what the run prints."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from htmqc.sources.nats import NatsClient, address_of, produce
from htmqc.sources.nats_server import NatsServer, start_nats
from tests.security.certs import Pki
from tests.security.nats_jwt import PREFIX_BYTE_ACCOUNT, Identity, Trust
from tests.services import require_module, require_nats_server
from tests.sources.support import (
    check_cli_refusal,
    check_mutual_tls,
    check_refusal,
    check_secured_run,
)

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
    bootstrap = url(tls_server, f"ca={pki.ca}")
    check_secured_run(
        "nats", bootstrap, NatsClient, produce, topic_name(), tmp_path,
        shown=f"tls://alice:***@127.0.0.1:{tls_server.port}", secret=PASSWORD,
    )  # fmt: skip


@pytest.mark.slow
def test_mutual_tls_with_the_client_certificate_connects(
    mtls_server: NatsServer, pki: Pki, topic_name: Callable[[], str]
) -> None:
    check_mutual_tls(NatsClient, lambda q: url(mtls_server, q, userinfo=""), pki, topic_name())


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
    check_refusal(
        lambda: NatsClient(url(target, query, userinfo), connect_seconds=20.0).close(),
        said, hint, PASSWORD, "wrong-pw",
    )  # fmt: skip


@pytest.mark.slow
def test_the_cli_refuses_a_bad_password_in_one_line(
    tls_server: NatsServer, pki: Pki, tmp_path: Path
) -> None:
    bootstrap = url(tls_server, f"ca={pki.ca}", userinfo="alice:wrong-pw-123@")
    check_cli_refusal("nats", bootstrap, "refused the credentials", "wrong-pw-123", tmp_path)


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


# -- decentralized authentication: a user's .creds file (JWT + NKey seed) -------------------


@pytest.fixture(scope="module")
def jwt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NatsServer, Trust]]:
    """A server in operator mode: it trusts one operator, whose account has JetStream."""
    binary = require_nats_server()
    require_module("nats")
    require_module("nkeys")
    trust = Trust.new(tmp_path_factory.mktemp("nats-jwt"))
    with start_nats(binary=binary, extra=["-c", str(trust.config())]) as server:
        yield server, trust


@pytest.mark.slow
def test_a_run_with_a_creds_file_handles_and_commits_everything(
    jwt_server: tuple[NatsServer, Trust], topic_name: Callable[[], str], tmp_path: Path
) -> None:
    server, trust = jwt_server
    creds, seed = trust.creds("alice")
    check_secured_run(
        "nats", f"nats://127.0.0.1:{server.port}?creds={creds}", NatsClient, produce,
        topic_name(), tmp_path, shown=f"127.0.0.1:{server.port}", secret=seed,
    )  # fmt: skip


@pytest.mark.slow
def test_a_creds_file_the_server_does_not_trust_is_one_line(
    jwt_server: tuple[NatsServer, Trust], tmp_path: Path
) -> None:
    server, trust = jwt_server
    stranger = Identity.new(PREFIX_BYTE_ACCOUNT)  # an account the operator never signed
    creds, seed = trust.creds("mallory", signer=stranger)
    url = f"nats://127.0.0.1:{server.port}"
    check_refusal(lambda: NatsClient(f"{url}?creds={creds}", connect_seconds=20.0).close(),
                  "refused the credentials", "creds=", seed)  # fmt: skip
    check_refusal(lambda: NatsClient(url, connect_seconds=20.0).close(),
                  "asks for credentials", "creds=FILE")  # fmt: skip
    check_cli_refusal("nats", f"{url}?creds={creds}", "refused the credentials", seed, tmp_path)


def test_creds_without_the_nkeys_package_is_refused_before_connecting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    creds = tmp_path / "u.creds"
    creds.write_text("not read before the package is found\n")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "nkeys" else real(name, *a)
    )
    with pytest.raises(UsageError) as caught:
        address_of(f"nats://h:4222?creds={creds}")
    assert "needs the Python package nkeys" in caught.value.line()
    assert "htmqc[nats]" in caught.value.line()
