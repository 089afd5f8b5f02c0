"""Location metadata: `_location` entries that override the placement file's
prefix rules at run time (docs/protocol.md §8)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .deployment import GLOBAL, Deployment
from .pb import data_pb2

#: §8: the most entries a client holds (the Rust client's `LOCATION_ENTRIES_MAX`).
LOCATION_ENTRIES_MAX = 1_000_000
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _valid_name(s: str) -> bool:
    return bool(_NAME.match(s)) and s.strip(".") != ""


@dataclass(frozen=True)
class LocationEntry:
    table: str
    prefix: bytes
    policy: str
    home_region: str | None
    migrating_to: str | None

    @staticmethod
    def parse(key: bytes, e: data_pb2.LocationEntry, d: Deployment) -> LocationEntry | None:
        """The entry of `_location` row `key`, or None when it is not in force under
        deployment `d` (§8: the checks a client makes; a failing entry counts as
        removed)."""
        nul = key.find(b"\0")
        if nul < 0:
            return None
        try:
            table = key[:nul].decode()
        except UnicodeDecodeError:
            return None
        if not _valid_name(table) or table.startswith("_") or table not in d.tables:
            return None
        if not _valid_name(e.policy) or e.policy not in d.policies:
            return None
        if e.migrating_to and (e.migrating_to not in d.policies or e.migrating_to == e.policy):
            return None
        if e.home_region and e.home_region not in d.policies[e.policy]:
            return None
        if not e.job_id:
            return None
        return LocationEntry(table, key[nul + 1 :], e.policy, e.home_region or None, e.migrating_to or None)


class Location:
    """The entries in force, by table and prefix; a row's entry is its table's
    longest matching prefix."""

    def __init__(self) -> None:
        self._tables: dict[str, dict[bytes, LocationEntry]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def set(self, table: str, prefix: bytes, entry: LocationEntry | None) -> None:
        """Puts `entry` in force for (table, prefix); None removes it."""
        m = self._tables.setdefault(table, {})
        had = prefix in m
        if entry is None:
            if had:
                del m[prefix]
                self._count -= 1
        else:
            m[prefix] = entry
            self._count += 0 if had else 1

    def contains(self, table: str, prefix: bytes) -> bool:
        return prefix in self._tables.get(table, {})

    def lookup(self, table: str, key: bytes) -> LocationEntry | None:
        m = self._tables.get(table)
        if not m:
            return None
        for n in range(len(key), -1, -1):
            e = m.get(key[:n])
            if e is not None:
                return e
        return None

    def scope_of(self, d: Deployment, table: str, key: bytes) -> str:
        """A row's policy: `global` for system tables, else its entry's, else the
        placement file's (§8)."""
        if table.startswith("_"):
            return GLOBAL
        e = self.lookup(table, key)
        return e.policy if e is not None else d.policy_of(table, key)

    def home_of(self, d: Deployment, table: str, key: bytes) -> str | None:
        e = self.lookup(table, key)
        return e.home_region if e is not None else d.home_of(table, key)

    def migrating_to(self, table: str, key: bytes) -> str | None:
        e = self.lookup(table, key)
        return e.migrating_to if e is not None else None
