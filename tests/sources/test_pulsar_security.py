"""Pulsar with token authentication: ``--bootstrap pulsar://HOST:PORT?admin-port=N&token-file=PATH``
reaches a broker that wants a token on its binary protocol and its admin API; a
refused or missing token is one line, at once; the token never shows. (No TLS yet.)"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from htmqc.errors import UsageError
from htmqc.sources.pulsar import PulsarClient, endpoint_of, produce
from htmqc.sources.pulsar_server import PulsarServer, hs256_token, start_pulsar, token_auth
from tests.services import require_pulsar
from tests.sources.support import check_cli_refusal, check_refusal, check_secured_run

pytestmark = pytest.mark.slow

SECRET = b"htmqc-test-token-secret-32-bytes"


@pytest.fixture(scope="module")
def token_broker() -> Iterator[PulsarServer]:
    """A broker that wants a token signed with :data:`SECRET` from every client."""
    require_pulsar()
    settings, admin = token_auth(SECRET)
    with start_pulsar(settings=settings, token=admin) as server:
        yield server


def token_file(tmp_path: Path, secret: bytes = SECRET, role: str = "app") -> tuple[Path, str]:
    token = hs256_token(secret, role)
    path = tmp_path / f"{role}.token"
    path.write_text(token + "\n")
    return path, token


def test_a_run_with_a_token_handles_and_commits_everything(
    token_broker: PulsarServer, topic_name: Callable[[], str], tmp_path: Path
) -> None:
    path, token = token_file(tmp_path)
    bootstrap = f"{token_broker.bootstrap}&token-file={path}"
    check_secured_run(
        "pulsar", bootstrap, PulsarClient, produce, topic_name(), tmp_path,
        shown=f"token-file={path}", secret=token,
    )  # fmt: skip


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
    ],
)
def test_a_bad_address_is_refused_before_connecting(tmp_path: Path, query: str, said: str) -> None:
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(UsageError) as caught:
        endpoint_of(f"pulsar://h:6650?{query.format(empty=empty)}")
    assert said in caught.value.line()


def test_the_token_is_read_and_masked(tmp_path: Path) -> None:
    from htmqc import secrets

    path, token = token_file(tmp_path)
    try:
        endpoint = endpoint_of(f"pulsar://h:6650?token-file={path}")
        assert endpoint.token == token and token not in repr(endpoint)
        assert secrets.scrub(f"x {token} y") == "x *** y"
    finally:
        secrets.forget_all()
