"""A payments consumer: JSON events into a database, exactly once.

Each event is a JSON object ``{"id": "p-17", "account": "acct-3", "amount": 250}``
(amount in cents). In the message's sink transaction the handler inserts the
payment (``id`` unique), adds the amount to the account's balance (an upsert)
and appends a ledger line. The consumer's position is stored in the same
transaction, so after any crash every payment is counted once: no balance is
ever short or doubled. An event that is not such an object is a
:class:`htmqc.Permanent` failure: dead-lettered with the reason (into the
sink's ``dead_letters`` table), never retried, never a crash.

Run it (SQLite or PostgreSQL; the tables are created first)::

    python -m examples.payments --bootstrap 127.0.0.1:9092 --topic payments \\
        --group ledger --sink sqlite:///ledger.db
    htmqc produce --bootstrap 127.0.0.1:9092 --topic payments \\
        --from payments.jsonl --key-field account

Keying by account keeps one account's payments in order on one partition.
``--batch`` runs :func:`handle_batch`, which stores a piece of up to 250
payments with three ``executemany`` calls instead of three statements each.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections.abc import Sequence
from contextlib import closing

from htmqc import Consumer, Message, Permanent, SqlTx

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS payments (id TEXT PRIMARY KEY, account TEXT NOT NULL, "
    "amount BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS balances (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger (payment TEXT NOT NULL, account TEXT NOT NULL, "
    'amount BIGINT NOT NULL, "partition" INTEGER NOT NULL, "offset" BIGINT NOT NULL)',
)
_STATEMENTS = (
    "INSERT INTO payments (id, account, amount) VALUES ({p}, {p}, {p})",
    "INSERT INTO balances (account, balance) VALUES ({p}, {p}) "
    "ON CONFLICT (account) DO UPDATE SET balance = balances.balance + excluded.balance",
    'INSERT INTO ledger (payment, account, amount, "partition", "offset") '
    "VALUES ({p}, {p}, {p}, {p}, {p})",
)
#: The statements in each driver's parameter style (sqlite3: ?, psycopg: %s).
SQL = {style: tuple(s.format(p=style) for s in _STATEMENTS) for style in ("?", "%s")}


def parse(value: bytes | None) -> tuple[str, str, int]:
    """``(id, account, amount)`` of an event.

    :raises Permanent: the value is not a payment event (no retry can fix it).
    """
    try:
        event = json.loads(value or b"")
        payment, account, amount = event["id"], event["account"], event["amount"]
    except (ValueError, TypeError, KeyError) as exc:
        raise Permanent(f"not a payment event: {exc!r}") from None
    if not (isinstance(payment, str) and isinstance(account, str) and type(amount) is int):
        raise Permanent("a payment needs a string id and account and an integer amount")
    return payment, account, amount


def handle(msg: Message, tx: SqlTx) -> None:
    """Store one payment in the message's transaction (module docs): ``tx`` is the
    sink's cursor (:class:`htmqc.SqlTx`), ``?`` parameters on SQLite, ``%s`` on PostgreSQL."""
    payment, account, amount = parse(msg.value())
    insert, upsert, append = SQL["?" if type(tx).__module__.startswith("sqlite3") else "%s"]
    tx.execute(insert, (payment, account, amount))
    tx.execute(upsert, (account, amount))
    tx.execute(append, (payment, account, amount, msg.partition(), msg.offset()))


def handle_batch(msgs: list[Message], tx: SqlTx) -> None:
    """The same for a piece of messages at once (``--batch``): three ``executemany``.
    A malformed event fails the piece, which then runs again one message per call,
    so only that event is dead-lettered."""
    events = [(*parse(m.value()), m.partition(), m.offset()) for m in msgs]
    insert, upsert, append = SQL["?" if type(tx).__module__.startswith("sqlite3") else "%s"]
    tx.executemany(insert, [e[:3] for e in events])
    tx.executemany(upsert, [(e[1], e[2]) for e in events])
    tx.executemany(append, events)


def create_tables(sink: str) -> None:
    """The three tables, in the sink's database (``sqlite:///`` or ``postgresql://``)."""
    if sink.startswith("sqlite:///"):
        with closing(sqlite3.connect(sink.removeprefix("sqlite:///").partition("?")[0])) as db:
            for statement in SCHEMA:
                db.execute(statement)
            db.commit()
        return
    import psycopg

    with psycopg.connect(sink.partition("?")[0], autocommit=True) as db:
        for statement in SCHEMA:
            db.execute(statement)


def main(argv: Sequence[str] | None = None) -> int:
    """Create the tables and run the consumer until SIGTERM (or ``--max-messages``)."""
    parser = argparse.ArgumentParser(prog="python -m examples.payments", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--sink", required=True, help="sqlite:///PATH or postgresql://...")
    parser.add_argument("--max-messages", type=int, default=None)
    parser.add_argument("--idle-exit", type=float, default=None,
                        help="stop after SECONDS without a message")
    parser.add_argument("--batch", action="store_true", help="the batch handler")
    args = parser.parse_args(argv)
    create_tables(args.sink)
    consumer = Consumer(handle_batch if args.batch else handle, batch=args.batch,
                        bootstrap=args.bootstrap, topic=args.topic, group=args.group,
                        mode="exactly-once", sink=args.sink, max_messages=args.max_messages,
                        idle_exit=args.idle_exit)
    finished = consumer.run()
    print(f"payments: {finished} messages finished")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
