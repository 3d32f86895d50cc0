"""Secret values known to this process, and scrubbing them out of text.

Whatever can carry a secret (librdkafka passwords, sink URL passwords, values of
secret-looking settings) is :func:`remember`-ed when options are resolved;
every text that leaves the process through a channel a user did not write
themselves (log lines, one-line errors, dead-letter headers and rows, traces,
``/state.json``) goes through :func:`scrub` first, which replaces each
remembered value with ``***``. Values shorter than 4 characters are not
remembered (scrubbing them would mangle ordinary text); such secrets are
still never printed on purpose, only not hunted down in free text.
"""

from __future__ import annotations

import threading

MIN_LENGTH = 4
MASK = "***"

_lock = threading.Lock()
_known: tuple[str, ...] = ()


def remember(value: object) -> None:
    """Treat ``str(value)`` as a secret from now on (see module docs)."""
    global _known
    text = str(value)
    if len(text) < MIN_LENGTH:
        return
    with _lock:
        if text not in _known:
            # Longest first, so a secret containing another is masked whole.
            _known = tuple(sorted((*_known, text), key=len, reverse=True))


def forget_all() -> None:
    """Drop every remembered secret (tests)."""
    global _known
    with _lock:
        _known = ()


def scrub(text: str) -> str:
    """``text`` with every remembered secret replaced by ``***``."""
    for secret in _known:
        if secret in text:
            text = text.replace(secret, MASK)
    return text
