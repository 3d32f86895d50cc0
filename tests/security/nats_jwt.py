"""NATS decentralized authentication for tests, without ``nsc``: an operator, an
account with JetStream and users, as NKeys and signed JWTs (the ``ed25519-nkey``
JWTs ``nats-server`` checks), a user's ``.creds`` file and a server configuration
that trusts the operator (``resolver: MEMORY`` with the account preloaded).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from nkeys import PREFIX_BYTE_ACCOUNT

__all__ = ["PREFIX_BYTE_ACCOUNT", "Identity", "Trust", "jwt"]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass(frozen=True)
class Identity:
    """An NKey pair: its public key (``O...``, ``A...``, ``U...``) and seed (``S...``)."""

    public: str
    seed: str

    @classmethod
    def new(cls, prefix: int) -> Identity:
        pair = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))
        return cls(pair.public_key.decode(), pair.seed.decode())

    def sign(self, payload: bytes) -> bytes:
        return bytes(nkeys.from_seed(bytearray(self.seed.encode())).sign(payload))


def jwt(issuer: Identity, subject: str, name: str, nats: dict[str, Any]) -> str:
    """A NATS JWT (version 2) of ``subject``, signed by ``issuer``."""
    claims: dict[str, Any] = {
        "iat": int(time.time()), "iss": issuer.public, "name": name, "sub": subject,
        "nats": {**nats, "version": 2},
    }  # fmt: skip
    claims["jti"] = base64.b32encode(
        hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    ).decode().rstrip("=")
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    return f"{head}.{body}.{_b64(issuer.sign(f'{head}.{body}'.encode()))}"


UNLIMITED = {
    "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
    "conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1,
    "consumer": -1,
}  # fmt: skip


@dataclass(frozen=True)
class Trust:
    """An operator and one account with JetStream: the server configuration
    (:meth:`config`) and users' ``.creds`` files (:meth:`creds`)."""

    operator: Identity
    account: Identity
    system: Identity
    folder: Path

    @classmethod
    def new(cls, folder: Path) -> Trust:
        folder.mkdir(parents=True, exist_ok=True)
        account = nkeys.PREFIX_BYTE_ACCOUNT
        return cls(
            Identity.new(nkeys.PREFIX_BYTE_OPERATOR), Identity.new(account),
            Identity.new(account), folder,
        )  # fmt: skip

    def config(self) -> Path:
        """A ``nats-server -c`` file trusting the operator, the accounts preloaded
        (JetStream needs a system account)."""
        operator = jwt(self.operator, self.operator.public, "op", {
            "type": "operator", "system_account": self.system.public,
        })  # fmt: skip
        system = jwt(self.operator, self.system.public, "SYS", {"type": "account"})
        account = jwt(self.operator, self.account.public, "htmqc", {
            "type": "account", "limits": UNLIMITED,
            "default_permissions": {"pub": {}, "sub": {}},
        })  # fmt: skip
        (self.folder / "operator.jwt").write_text(operator)
        path = self.folder / "server.conf"
        path.write_text(
            f'operator: "{self.folder / "operator.jwt"}"\n'
            "resolver: MEMORY\n"
            f"system_account: {self.system.public}\n"
            f'resolver_preload: {{ {self.account.public}: "{account}", '
            f'{self.system.public}: "{system}" }}\n'
        )
        return path

    def creds(self, name: str, signer: Identity | None = None) -> tuple[Path, str]:
        """A user's ``.creds`` file (its JWT signed by ``signer``, default the
        account) and the user's seed (the secret in it)."""
        user = Identity.new(nkeys.PREFIX_BYTE_USER)
        token = jwt(signer or self.account, user.public, name, {
            "type": "user", "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
        })  # fmt: skip
        path = self.folder / f"{name}.creds"
        path.write_text(
            f"-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{user.seed}\n------END USER NKEY SEED------\n"
        )
        return path, user.seed
