"""The pure parts of the Kafka->Kafka chaos store: the output record's encoding,
the transaction logs, and the aborted-read (G1a) check built on them."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from htmqc.audit import Effect
from htmqc.chaos.kafka_store import (
    AbortedReadCheck,
    TxnLog,
    decode_output,
    encode_output,
    read_txn_logs,
)

#: Keys as the chaos handler has them: bytes decoded as UTF-8 (no lone surrogates).
keys = st.one_of(st.none(), st.text(
    st.characters(blacklist_characters="|", blacklist_categories=("Cs",)), min_size=1
))


@given(
    st.integers(0, 10**9), keys, st.integers(0, 99), st.integers(0, 10**12),
    st.text("0123456789abcdef", min_size=1, max_size=12), st.integers(0, 10**6),
)  # fmt: skip
def test_output_records_round_trip(
    ident: int, key: str | None, part: int, off: int, token: str, txn: int
) -> None:
    effect, got_token, got_txn = decode_output(encode_output(ident, key, part, off, token, txn))
    assert effect == Effect(str(ident), key, part, off, None)
    assert (got_token, got_txn) == (token, txn)


def test_transaction_logs_are_read_back_per_writer(tmp_path: Path) -> None:
    a, b = TxnLog(str(tmp_path)), TxnLog(str(tmp_path))
    for n in (1, 2, 5):
        a.committing(n)
    b.committing(3)
    a.close()
    b.close()
    with (tmp_path / f"{b.token}.txns").open("a") as cut:
        cut.write("4")  # a last line a kill cut before its newline: kept if whole
    assert read_txn_logs(tmp_path) == {a.token: {1, 2, 5}, b.token: {3, 4}}
    TxnLog(None).committing(9)  # no directory: logs nothing
    assert len(list(tmp_path.glob("*.txns"))) == 2


def test_aborted_read_check_flags_only_transactions_that_never_asked_to_commit() -> None:
    check = AbortedReadCheck({"w1": {1, 2}, "w2": {7}}, limit=2)
    effect = Effect("0", "k0", 0, 0, None)
    check.see(effect, "w1", 1, (0, 10))
    check.see(effect, "w2", 7, (0, 11))
    assert check.count == 0
    check.see(Effect("5", "k5", 1, 3, None), "w1", 3, (1, 12))  # w1 never asked to commit 3
    check.see(effect, "w3", 1, (0, 13))  # an unknown writer: no log, so nothing committed
    check.see(effect, "w2", 6, (0, 14))
    assert check.count == 3
    assert check.examples == [
        {"id": "5", "writer": "w1", "txn": 3, "output": [1, 12]},
        {"id": "0", "writer": "w3", "txn": 1, "output": [0, 13]},
    ]
