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


Mutation = SetCell | DeleteFromColumn | DeleteFromFamily | DeleteFromRow


def row_filter(
    families: list[str] | None = None,
    columns: list[tuple[str, bytes | str]] | None = None,
    versions: int = 0,
) -> client_pb2.RowFilter:
    """§3 `RowFilter`: `columns` set, only those (family, column) pairs; else every
    column of `families` (all families when empty); `versions` 0 or 1 the newest."""
    return client_pb2.RowFilter(
        families=families or [],
        columns=[client_pb2.ColumnRef(family=f, column=_b(c)) for f, c in (columns or [])],
        versions_per_column=versions,
    )


def _b(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else bytes(x)
