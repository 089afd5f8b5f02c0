"""Rows read back, mutations and filters (docs/protocol.md §3; `data.proto`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .pb import client_pb2, data_pb2


@dataclass(frozen=True)
class Cell:
    """One version of one cell: `timestamp` is an HLC value (Unix ms << 16 |
    counter), `origin` the replica that took the write."""

    column: bytes
    timestamp: int
    origin: str
    value: bytes


@dataclass(frozen=True)
class Family:
    """A family's cells: columns in byte order, newest version first per column."""

    name: str
    cells: list[Cell]


@dataclass(frozen=True)
class Row:
    """A row as a reader sees it: families in name order. A get-many row with no
    families stands for a missing row."""

    key: bytes
    families: list[Family] = field(default_factory=list)

    @staticmethod
    def from_proto(r: data_pb2.Row) -> Row:
        return Row(
            r.key,
            [Family(f.name, [Cell(c.column, c.timestamp, c.origin, c.value) for c in f.cells]) for f in r.families],
        )

    @property
    def exists(self) -> bool:
        return bool(self.families)

    def count(self, family: str, column: bytes | str) -> int | None:
        """A counter cell's sum (8 bytes, big-endian two's complement), or None."""
        v = self.value(family, column)
        return int.from_bytes(v, "big", signed=True) if v is not None and len(v) == 8 else None

    def value(self, family: str, column: bytes | str) -> bytes | None:
        """The newest value of (family, column), or None."""
        col = column.encode() if isinstance(column, str) else column
        for f in self.families:
            if f.name == family:
                for c in f.cells:
                    if c.column == col:
                        return c.value
        return None


@dataclass(frozen=True)
class ScanPage:
    """One page of a scan: pass `resume_key` back as `resume_after` while it is
    not empty (a page may be short, or empty, and still have one)."""

    rows: list[Row]
    resume_key: bytes


@dataclass(frozen=True)
class Change:
    """One committed write of a change stream (§3 "Changes"): (`scope`,
    `origin`, `sequence`) names it; `timestamp` is its HLC time; `mutation` the
    row mutation as logged (`table`, `row_key`, `mutations`)."""

    scope: str
    origin: str
    sequence: int
    timestamp: int
    mutation: data_pb2.RowMutation


@dataclass(frozen=True)
class ChangesPage:
    """A page of a change stream: pass `cursor` back for the next one (save it
    once the changes are handled); `more`: ask again at once."""

    changes: list[Change]
    cursor: bytes
    more: bool


# Mutations (§3 "Mutate"): applied atomically, all or nothing.


@dataclass(frozen=True)
class SetCell:
    family: str
    column: bytes | str
    value: bytes | str

    def to_proto(self) -> data_pb2.Mutation:
        return data_pb2.Mutation(
            set_cell=data_pb2.Mutation.SetCell(family=self.family, column=_b(self.column), value=_b(self.value))
        )


@dataclass(frozen=True)
class DeleteFromColumn:
    """Versions of (family, column) in [start, end) (`end` 0: unbounded); no range:
    every older version."""

    family: str
    column: bytes | str
    start: int | None = None
    end: int = 0

    def to_proto(self) -> data_pb2.Mutation:
        d = data_pb2.Mutation.DeleteFromColumn(family=self.family, column=_b(self.column))
        if self.start is not None:
            d.time_range.CopyFrom(data_pb2.TimeRange(start=self.start, end=self.end))
        return data_pb2.Mutation(delete_from_column=d)


@dataclass(frozen=True)
class DeleteFromFamily:
    family: str

    def to_proto(self) -> data_pb2.Mutation:
        return data_pb2.Mutation(delete_from_family=data_pb2.Mutation.DeleteFromFamily(family=self.family))


@dataclass(frozen=True)
class DeleteFromRow:
    def to_proto(self) -> data_pb2.Mutation:
        return data_pb2.Mutation(delete_from_row=data_pb2.Mutation.DeleteFromRow())


@dataclass(frozen=True)
class Increment:
    """Adds `delta` to a counter cell (a counter family's column): increments from
    every region all count (docs/client.md "Counters"). Read the sum with
    `Row.count`."""

    family: str
    column: bytes | str
    delta: int = 1

    def to_proto(self) -> data_pb2.Mutation:
        return data_pb2.Mutation(
            increment=data_pb2.Mutation.Increment(family=self.family, column=_b(self.column), delta=self.delta)
        )


Mutation = SetCell | DeleteFromColumn | DeleteFromFamily | DeleteFromRow | Increment


def row_filter(
    families: list[str] | None = None,
    columns: list[tuple[str, bytes | str]] | None = None,
    versions: int = 0,
    cells: client_pb2.CellFilter | None = None,
) -> client_pb2.RowFilter:
    """§3 `RowFilter`: `columns` set, only those (family, column) pairs; else every
    column of `families` (all families when empty); `cells` a server-side filter
    tree (built with the functions below) run on every version of those columns;
    then `versions` (0 or 1: the newest) of each column."""
    f = client_pb2.RowFilter(
        families=families or [],
        columns=[client_pb2.ColumnRef(family=f, column=_b(c)) for f, c in (columns or [])],
        versions_per_column=versions,
    )
    if cells is not None:
        f.cells.CopyFrom(cells)
    return f


# Server-side filter trees (docs/client.md "Filters"; `client.proto` CellFilter).


def chain(*filters: client_pb2.CellFilter) -> client_pb2.CellFilter:
    """Each filter on what the previous kept."""
    return client_pb2.CellFilter(chain=client_pb2.CellFilter.Chain(filters=list(filters)))


def interleave(*filters: client_pb2.CellFilter) -> client_pb2.CellFilter:
    """What any filter keeps from the same input, each cell once."""
    return client_pb2.CellFilter(interleave=client_pb2.CellFilter.Interleave(filters=list(filters)))


def family(name: str) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(family=name)


def qualifier_prefix(prefix: bytes | str) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(qualifier_prefix=_b(prefix))


def qualifier_range(r: client_pb2.BytesRange) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(qualifier_range=r)


def qualifier_regex(pattern: str) -> client_pb2.CellFilter:
    """The whole qualifier matches (the `regex` crate's syntax; linear time)."""
    return client_pb2.CellFilter(qualifier_regex=pattern)


def timestamp_range(start_ms: int = 0, end_ms: int = 0) -> client_pb2.CellFilter:
    """Cells whose version's wall time is in [start_ms, end_ms) (end 0: no end)."""
    return client_pb2.CellFilter(
        timestamp_range=client_pb2.CellFilter.TimestampRange(start_ms=start_ms, end_ms=end_ms)
    )


def value_range(r: client_pb2.BytesRange) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(value_range=r)


def latest_per_column(n: int) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(latest_per_column=n)


def cells_per_row_offset(n: int) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(cells_per_row_offset=n)


def cells_per_row_limit(n: int) -> client_pb2.CellFilter:
    return client_pb2.CellFilter(cells_per_row_limit=n)


def key_range(
    start: bytes | str | None = None,
    end: bytes | str | None = None,
    *,
    start_open: bool = False,
    end_closed: bool = False,
) -> client_pb2.BytesRange:
    """A range of keys (or qualifiers, values): from `start` (included unless
    `start_open`) to `end` (excluded unless `end_closed`); None: unbounded."""
    r = client_pb2.BytesRange()
    if start is not None:
        if start_open:
            r.start_open = _b(start)
        else:
            r.start_closed = _b(start)
    if end is not None:
        if end_closed:
            r.end_closed = _b(end)
        else:
            r.end_open = _b(end)
    return r


def _b(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)
