"""Pulsar with TLS and token authentication: ``--bootstrap
pulsar+ssl://HOST:PORT?admin-port=N&ca=FILE&cert=FILE&key=FILE&token-file=PATH``
reaches a broker that wants a client certificate on its TLS ports and a token
everywhere (binary protocol and admin API); a refused or missing token, an
untrusted broker certificate and a missing client certificate are each one line,
at once; the token never shows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from htmqc.sources.pulsar import PulsarClient, endpoint_of, produce
from htmqc.sources.pulsar_server import PulsarServer, hs256_token, start_pulsar, token_auth
from htmqc.sources.tls import ServerTls
from tests.security.certs import Pki
from tests.services import require_pulsar
from tests.sources.support import check_cli_refusal, check_refusal, check_secured_run

pytestmark = pytest.mark.slow

SECRET = b"htmqc-test-token-secret-32-bytes"


@pytest.fixture(scope="module")
def token_broker(pki: Pki) -> Iterator[PulsarServer]:
    """A broker that wants a token signed with :data:`SECRET` from every client,
    with TLS ports beside the plain ones that want a certificate ``pki`` signed."""
    require_pulsar()
    settings, admin = token_auth(SECRET)
    tls = ServerTls(pki.ca, pki.cert, pki.key, verify_clients=True)
    with start_pulsar(settings=settings, token=admin, tls=tls) as server:
        yield server


def client_files(pki: Pki) -> str:
    return f"ca={pki.ca}&cert={pki.client_cert}&key={pki.client_key}"


def token_file(tmp_path: Path, secret: bytes = SECRET, role: str = "app") -> tuple[Path, str]:
    token = hs256_token(secret, role)
    path = tmp_path / f"{role}.token"
    path.write_text(token + "\n")
    return path, token


def test_a_run_over_tls_with_a_token_handles_and_commits_everything(
    token_broker: PulsarServer, pki: Pki, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    path, token = token_file(tmp_path)
    bootstrap = token_broker.tls_bootstrap(f"{client_files(pki)}&token-file={path}")
    check_secured_run(
        "pulsar", bootstrap, PulsarClient, produce, topic_name(), tmp_path,
        shown=f"pulsar+ssl://127.0.0.1:{token_broker.tls_broker_port}", secret=token,
    )  # fmt: skip


def test_a_token_on_the_plain_port_is_enough(
    token_broker: PulsarServer, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    client = PulsarClient(f"{token_broker.bootstrap}&token-file={token_file(tmp_path)[0]}")
    try:
        topic = topic_name()
        client.create_topic(topic, 2)
        assert client.partitions(topic) == 2
    finally:
        client.close()


@pytest.mark.parametrize(
    ("files", "said", "hint"),
    [
        ("ca={other}", "presented a certificate this client does not trust", "ca="),
        ("ca={ca}", "refused the TLS handshake", "cert= and key="),
        ("ca={ca}&cert={ocert}&key={okey}", "refused the TLS handshake", "cert= and key="),
    ],
)
def test_a_tls_refusal_is_one_line_at_once(
    token_broker: PulsarServer, pki: Pki, other_pki: Pki, tmp_path: Path, files: str, said: str,
    hint: str,
) -> None:  # fmt: skip
    files = files.format(
        ca=pki.ca, other=other_pki.ca, ocert=other_pki.client_cert, okey=other_pki.client_key
    )
    query = f"{files}&token-file={token_file(tmp_path)[0]}"
    check_refusal(lambda: PulsarClient(token_broker.tls_bootstrap(query), 20.0).close(), said, hint)


@pytest.mark.parametrize(("signed_with", "said"), [(b"x" * 32, "refused the token"),
                                                   (None, "asks for a token")])  # fmt: skip
def test_a_refusal_is_one_line_at_once(
    token_broker: PulsarServer, tmp_path: Path, signed_with: bytes | None, said: str
) -> None:
    query = ""
    if signed_with is not None:
        query = f"&token-file={token_file(tmp_path, signed_with)[0]}"
    check_refusal(
        lambda: PulsarClient(token_broker.bootstrap + query, 20.0).close(), said, "token-file="
    )


def test_the_cli_refuses_a_bad_token_in_one_line(token_broker: PulsarServer,
                                                 tmp_path: Path) -> None:  # fmt: skip
    path, token = token_file(tmp_path, b"y" * 32)
    bootstrap = f"{token_broker.bootstrap}&token-file={path}"
    check_cli_refusal("pulsar", bootstrap, "refused the token", token, tmp_path)


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("token-file=/no/such.token", "cannot read the Pulsar token file /no/such.token"),
        ("token=abc", "unknown parameter 'token'"),
        ("token-file={empty}", "is empty"),
        ("ca=/c.pem", "to a plain pulsar:// URL"),
    ],
)
def test_a_bad_address_is_refused_before_connecting(tmp_path: Path, query: str, said: str) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(UsageError) as caught:
        endpoint_of(f"pulsar://h:6650?{query.format(empty=empty)}")
    assert said in caught.value.line()


def test_tls_ports_default_to_pulsars() -> None:
    endpoint = endpoint_of("pulsar+ssl://h")
    assert (endpoint.service_url, endpoint.admin_url) == ("pulsar+ssl://h:6651", "https://h:8443")
    assert endpoint.tls is not None and endpoint.tls.check_hostname
    assert endpoint_of("pulsar://h").tls is None


def test_the_token_is_read_and_masked(tmp_path: Path) -> None:
    from htmqc import secrets

    path, token = token_file(tmp_path)
    try:
        endpoint = endpoint_of(f"pulsar://h:6650?token-file={path}")
        assert endpoint.token == token and token not in repr(endpoint)
        assert secrets.scrub(f"x {token} y") == "x *** y"
    finally:
        secrets.forget_all()
