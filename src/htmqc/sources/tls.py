"""TLS and credentials of a non-Kafka source, read from its ``--bootstrap`` URL.

A source's URL carries what a secured server needs, as query parameters that
name files (never secrets) and userinfo that holds the secret::

    tls://alice:s3cret@nats.example:4222?ca=/etc/htmqc/ca.pem
    tls://nats.example:4222?ca=ca.pem&cert=client.pem&key=client.key

``ca``: the PEM file of the certificate authority that signed the server's
certificate (default: the system's trusted authorities); ``cert`` and ``key``:
a client certificate and its unencrypted PEM key, for servers that verify
clients (mutual TLS). The password in the userinfo is remembered as a secret
when the options are resolved (:func:`htmqc.config.url_passwords`), so it is
masked in logs and errors; to keep it off the command line (``ps``), give the
URL in ``HTMQC_BOOTSTRAP`` or in ``--config``'s ``[run]`` table.

:func:`query_of` refuses a parameter a source does not know, and
:func:`client_context` a file it cannot read, each in one line naming the fix;
:func:`tls_refusal` tells a handshake that no retry can cure (the sources then
stop at once, with :data:`TLS_REFUSALS`' fix).
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl

from htmqc.errors import UsageError


@dataclass(frozen=True)
class ServerTls:
    """TLS listeners of a private test server (:mod:`htmqc.sources.rabbitmq_server`,
    :mod:`htmqc.sources.pulsar_server`): PEM files of the CA, the server's
    certificate and key; ``verify_clients``: a client must present a certificate
    the CA signed."""

    ca: Path
    cert: Path
    key: Path
    verify_clients: bool = False


#: The query parameters :func:`client_context` reads.
TLS_PARAMS = ("ca", "cert", "key")


def query_of(query: str, known: Iterable[str], where: str) -> dict[str, str]:
    """A URL's query as a dict, every key in ``known`` and given once.

    :raises UsageError: an unknown or repeated parameter, or one without a value.
    """
    allowed = tuple(known)
    out: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in allowed:
            raise UsageError(
                f"--bootstrap {where!r} has the unknown parameter {key!r}",
                f"use {', '.join(allowed)}",
            )
        if key in out and out[key] != value:
            raise UsageError(
                f"--bootstrap gives {key!r} twice ({out[key]!r} and {value!r})",
                f"give {key} once",
            )
        if not value:
            raise UsageError(f"--bootstrap's {key!r} is empty", f"pass {key}=FILE")
        out[key] = value
    return out


def client_context(params: Mapping[str, str]) -> ssl.SSLContext:
    """A client TLS context that verifies the server (hostname included) against
    ``params["ca"]`` (else the system's authorities) and presents
    ``params["cert"]``/``params["key"]`` when given.

    :raises UsageError: ``key`` without ``cert`` (or the reverse), or a file
        that cannot be read or is not what it should be.
    """
    ca, cert, key = params.get("ca"), params.get("cert"), params.get("key")
    if (cert is None) != (key is None):
        raise UsageError(
            "--bootstrap gives a client certificate without its key (or the reverse)",
            "pass both cert=FILE and key=FILE, or neither",
        )
    try:
        context = ssl.create_default_context(cafile=ca)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(
            f"cannot read the CA file {ca}: {_reason(exc)}",
            "pass ca= the PEM file of the authority that signed the server's certificate",
        ) from None
    if cert is not None:
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(
                f"cannot load the client certificate {cert} with key {key}: {_reason(exc)}",
                "pass cert= and key= as PEM files (the key unencrypted)",
            ) from None
    return context


#: Why a server refused this client's TLS for good, and the fix.
TLS_REFUSALS = {
    "presented a certificate this client does not trust": (
        "pass ca= the PEM file of the authority that signed the server's certificate"
    ),
    "refused the TLS handshake": (
        "check that the server speaks TLS on that port and, if it verifies clients, pass "
        "cert= and key="
    ),
}


def tls_refusal(exc: BaseException) -> str:
    """The key of :data:`TLS_REFUSALS` that ``exc`` is, or ``""`` (not a TLS
    refusal: another try may cure it)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "presented a certificate this client does not trust"
    if isinstance(exc, ssl.SSLError):
        return "refused the TLS handshake"
    return ""


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
