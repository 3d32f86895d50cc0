"""RabbitMQ Streams over TLS: ``--bootstrap
rabbitmq-stream+tls://USER:PASSWORD@HOST:PORT?amqp-port=N&ca=FILE`` (and
``cert=``/``key=`` for a node that verifies clients) reaches a node's TLS stream
listener, and the lease's AMQP connection its TLS listener; each refusal is one
line that names the fix, at once (a refused login used to be retried until
``--connect-seconds`` ran out and reported as a timeout); the password never shows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from htmqc.sources.rabbitmq import RabbitStreamClient, endpoint_of, produce
from htmqc.sources.rabbitmq_server import RabbitServer, start_rabbitmq
from htmqc.sources.tls import ServerTls
from tests.security.certs import Pki
from tests.services import require_module, require_rabbitmq_server
from tests.sources.support import (
    check_cli_refusal,
    check_mutual_tls,
    check_refusal,
    check_secured_run,
)

pytestmark = pytest.mark.slow


def node(pki: Pki, *, verify_clients: bool) -> Iterator[RabbitServer]:
    binary = require_rabbitmq_server()
    require_module("rstream")
    require_module("pika")
    tls = ServerTls(pki.ca, pki.cert, pki.key, verify_clients=verify_clients)
    with start_rabbitmq(binary=binary, tls=tls) as server:
        yield server


@pytest.fixture(scope="module")
def tls_node(pki: Pki) -> Iterator[RabbitServer]:
    """TLS listeners (clients not verified) beside the plain ones."""
    yield from node(pki, verify_clients=False)


@pytest.fixture(scope="module")
def mtls_node(pki: Pki) -> Iterator[RabbitServer]:
    """TLS listeners that want a client certificate the CA signed."""
    yield from node(pki, verify_clients=True)


def with_password(url: str, password: str = "guest") -> str:
    return url.replace("://", f"://guest:{password}@", 1)


def test_a_run_over_tls_handles_and_commits_everything(
    tls_node: RabbitServer, pki: Pki, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    """The stream connections and the lease's AMQP connection all go over TLS."""
    bootstrap = with_password(tls_node.tls_url(f"ca={pki.ca}"))
    check_secured_run(
        "rabbitmq-stream", bootstrap, RabbitStreamClient, produce, topic_name(), tmp_path,
        shown=f"rabbitmq-stream+tls://***:***@127.0.0.1:{tls_node.tls_stream_port}",
        secret="guest",  # the node's only user: its name is its password, both masked
    )  # fmt: skip


def test_mutual_tls_with_the_client_certificate_connects(
    mtls_node: RabbitServer, pki: Pki, topic_name: Callable[[], str]
) -> None:
    check_mutual_tls(RabbitStreamClient, mtls_node.tls_url, pki, topic_name())


@pytest.mark.parametrize(
    ("which", "query", "password", "said", "hint"),
    [
        ("tls", "ca={ca}", "wrong-pw", "refused the login", "USER:PASSWORD@"),
        ("plain", "", "wrong-pw", "refused the login", "USER:PASSWORD@"),
        ("tls", "ca={other}", "guest", "does not trust", "ca="),
        ("mtls", "ca={ca}", "guest", "refused the TLS handshake", "cert= and key="),
        ("mtls", "ca={ca}&cert={ocert}&key={okey}", "guest", "refused the TLS handshake", "cert="),
    ],
)
def test_a_refusal_is_one_line_at_once(
    request: pytest.FixtureRequest,
    pki: Pki,
    other_pki: Pki,
    which: str,
    query: str,
    password: str,
    said: str,
    hint: str,
) -> None:
    target: RabbitServer = request.getfixturevalue("mtls_node" if which == "mtls" else "tls_node")
    query = query.format(
        ca=pki.ca, other=other_pki.ca, ocert=other_pki.client_cert, okey=other_pki.client_key
    )
    url = target.url if which == "plain" else target.tls_url(query)
    check_refusal(
        lambda: RabbitStreamClient(with_password(url, password), 20.0).close(),
        said, hint, "wrong-pw",
    )  # fmt: skip


def test_the_cli_refuses_a_bad_password_in_one_line(tls_node: RabbitServer, pki: Pki,
                                                     tmp_path: Path) -> None:  # fmt: skip
    bootstrap = with_password(tls_node.tls_url(f"ca={pki.ca}"), "wrong-pw-456")
    check_cli_refusal(
        "rabbitmq-stream", bootstrap, "refused the login", "wrong-pw-456", tmp_path
    )


@pytest.mark.parametrize(
    ("bootstrap", "said"),
    [
        ("rabbitmq-stream://h:5552?ca=/c.pem", "to a plain rabbitmq-stream:// URL"),
        ("rabbitmq-stream+tls://h?cafile=x", "unknown parameter 'cafile'"),
        ("rabbitmq-stream+tls://h?ca=/no/such.pem", "cannot read the CA file /no/such.pem"),
        ("rabbitmq-stream+tls://h?key=/k.pem", "without its key"),
        ("rabbitmq-stream+tls://h?amqp-port=x", "has a bad port"),
    ],
)
def test_a_bad_address_is_refused_before_connecting(bootstrap: str, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        endpoint_of(bootstrap)
    assert said in caught.value.line()


def test_tls_ports_default_to_rabbitmqs() -> None:
    ep = endpoint_of("rabbitmq-stream+tls://alice:pw@h/vh")
    assert (ep.port, ep.amqp_port, ep.user, ep.password, ep.vhost) == (5551, 5671, "alice", "pw",
                                                                        "vh")  # fmt: skip
    assert ep.tls is not None and ep.tls.check_hostname
    assert endpoint_of("rabbitmq-stream://h").tls is None
