"""A memory-lean index of the produced ids: id -> row number.

Ids that are decimal strings in one consistent format (all zero-padded to one
width, or all canonical without leading zeros) are stored as integers in an
``array('q')``; if they also fill a compact range, lookup is ``row_of[id - lo]``
with no hashing at all (about 8 bytes per id). Any other ids fall back to a
``dict`` from the string. Per-row columns (key code, partition, offset) are
arrays too, so 10M produced messages cost a few hundred MB at most rather than
gigabytes of objects.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

from htmqc.audit.model import Produced

_NONE = -1
_DENSE_SLACK = 2  # dense table allowed up to this many slots per produced id


class ProducedIndex:
    """Rows of produced messages, looked up by id (see module docs).

    A repeated produced id keeps its first row and is counted in ``repeated``;
    ``records`` counts every produced record given.
    """

    def __init__(self, produced: Iterable[Produced]) -> None:
        self.keys: list[str] = []
        self._key_codes: dict[str, int] = {}
        self.key_code = array("i")
        self.partition = array("i")
        self.offset = array("q")
        self.repeated = 0
        self.records = 0
        self._ints = array("q")
        self._strs: dict[str, int] | None = None
        self._width: int | None = None
        self._canonical = True
        self._same_width = True
        for rec in produced:
            self._add(rec)
        self.size = len(self.key_code)
        self._row_of: array[int] | dict[int, int] | None = None
        self._lo = 0
        if self._strs is None:
            self._build_int_lookup()

    # -- building ---------------------------------------------------------------------

    def _add(self, rec: Produced) -> None:
        self.records += 1
        ident = str(rec.id)
        if self._strs is None and not self._fits_int_format(ident):
            self._switch_to_strings()
        if self._strs is not None:
            if ident in self._strs:
                self.repeated += 1
                return
            self._strs[ident] = len(self.key_code)
        else:
            self._ints.append(int(ident))
        key = rec.key
        if key is None:
            code = _NONE
        else:
            code = self._key_codes.get(key, _NONE)
            if code == _NONE:
                code = self._key_codes[key] = len(self.keys)
                self.keys.append(key)
        self.key_code.append(code)
        self.partition.append(_NONE if rec.partition is None else int(rec.partition))
        self.offset.append(_NONE if rec.offset is None else int(rec.offset))

    def _fits_int_format(self, ident: str) -> bool:
        if not (ident.isascii() and ident.isdigit()) or len(ident) > 18:
            return False
        if self._width is None:
            self._width = len(ident)
        if self._same_width and len(ident) != self._width:
            self._same_width = False
        if self._canonical and len(ident) > 1 and ident[0] == "0":
            self._canonical = False
        return self._same_width or self._canonical

    def _switch_to_strings(self) -> None:
        self._strs = {}
        for row, n in enumerate(self._ints):
            self._strs.setdefault(self._format(n), row)
        self._ints = array("q")

    def _format(self, n: int) -> str:
        return f"{n:0{self._width}d}" if self._same_width and self._width else str(n)

    def _build_int_lookup(self) -> None:
        ints = self._ints
        if not ints:
            self._row_of = {}
            return
        lo, hi = min(ints), max(ints)
        span = hi - lo + 1
        if span <= _DENSE_SLACK * len(ints) + 16:
            row_of = array("q", [_NONE]) * span
            for row, n in enumerate(ints):
                slot = n - lo
                if row_of[slot] == _NONE:
                    row_of[slot] = row
            self._row_of, self._lo = row_of, lo
        else:
            sparse: dict[int, int] = {}
            for row, n in enumerate(ints):
                sparse.setdefault(n, row)
            self._row_of = sparse
        self.repeated = len(ints) - self._distinct()
        if self.repeated:
            self._mark_primary_rows()

    def _distinct(self) -> int:
        row_of = self._row_of
        if isinstance(row_of, dict):
            return len(row_of)
        assert row_of is not None
        return len(row_of) - row_of.count(_NONE)

    def _mark_primary_rows(self) -> None:
        # Rows of repeated ids carry no lookup entry; mark the others so reports skip them.
        primary = bytearray(self.size)
        row_of = self._row_of
        assert row_of is not None
        for row in row_of.values() if isinstance(row_of, dict) else row_of:
            if row != _NONE:
                primary[row] = 1
        self.primary = primary

    # -- queries ----------------------------------------------------------------------

    primary: bytearray | None = None  # None: every row is the first of its id
    _names: list[str] | None = None

    def row(self, ident: str) -> int:
        """The row of ``ident``, or -1 if it was never produced."""
        strs = self._strs
        if strs is not None:
            return strs.get(ident, _NONE)
        if not (ident.isascii() and ident.isdigit()):
            return _NONE
        if self._same_width:
            if len(ident) != self._width:
                return _NONE
        elif len(ident) > 1 and ident[0] == "0":
            return _NONE
        n = int(ident)
        row_of = self._row_of
        if isinstance(row_of, dict):
            return row_of.get(n, _NONE)
        assert row_of is not None
        slot = n - self._lo
        return row_of[slot] if 0 <= slot < len(row_of) else _NONE

    def ident(self, row: int) -> str:
        """The id of ``row`` as it was produced."""
        if self._strs is None:
            return self._format(self._ints[row])
        if self._names is None:
            names = [""] * self.size
            for ident, r in self._strs.items():
                names[r] = ident
            self._names = names
        return self._names[row]

    def key(self, row: int) -> str | None:
        code = self.key_code[row]
        return None if code == _NONE else self.keys[code]

    def opt_partition(self, row: int) -> int | None:
        p = self.partition[row]
        return None if p == _NONE else p

    def opt_offset(self, row: int) -> int | None:
        o = self.offset[row]
        return None if o == _NONE else o
