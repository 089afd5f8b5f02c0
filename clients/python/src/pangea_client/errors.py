"""Errors (docs/protocol.md §4). One class per wire code, plus the client's own:
`Lost` (a request's connection failed before its answer), `Ambiguous` (a write
that may or may not have been applied) and `ConfigError` (a cluster file or
certificate that cannot be used).

Every error names what went wrong and, when a replica said so, which replica.
"""

from __future__ import annotations

from typing import ClassVar


class PangeaError(Exception):
    """Base of every error this client raises.

    `code` is the wire code (`pangea.v1.Error.Code`, §4) the error stands for, or
    None for the client's own; `replica` the replica that said so, if one did.
    """

    code: ClassVar[int | None] = None
    #: Whether another replica might succeed (the Rust client's `is_retryable`).
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, replica: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.replica = replica

    @property
    def code_name(self) -> str:
        return _NAMES.get(self.code, "CLIENT") if self.code is not None else "CLIENT"

    def __str__(self) -> str:
        at = f" (replica {self.replica})" if self.replica else ""
        return f"{self.code_name}: {self.message}{at}"


class InvalidArgument(PangeaError):
    """A malformed request or a broken limit; the message names which (code 1)."""

    code = 1


class NotFound(PangeaError):
    """Unknown table or family (code 2)."""

    code = 2


class DeadlineExceeded(PangeaError):
    """No acceptable answer within the deadline (code 3)."""

    code = 3
    retryable = True


class NotCovered(PangeaError):
    """A watermark read no replica asked had caught up with (code 4): never a
    stale value instead."""

    code = 4
    retryable = True


class TooStale(PangeaError):
    """A bounded-staleness read every replica asked lagged beyond (code 5)."""

    code = 5
    retryable = True


class PolicyForbids(PangeaError):
    """Authorization, the app profile or the row's placement policy forbids it (code
    6); also a plan with no eligible replica (fail closed)."""

    code = 6


class Unavailable(PangeaError):
    """The replica could not take the request, or could not be reached (code 7)."""

    code = 7
    retryable = True


class Internal(PangeaError):
    """A bug, or an answer this client cannot make sense of (code 8)."""

    code = 8


class NotReplicated(PangeaError):
    """A write that waited for other regions missed its deadline (code 9). It is
    durable at its origin and replicating: keep `token`, do not write it again."""

    code = 9

    def __init__(self, message: str, *, replica: str | None = None, token: bytes = b"") -> None:
        super().__init__(message, replica=replica)
        self.token = token


class CursorExpired(PangeaError):
    """A change stream's cursor is behind what the replica's log still holds
    (code 10): another replica may hold more; else start again from now."""

    code = 10
    retryable = True


class Lost(PangeaError):
    """The request went out but its connection or stream failed before an answer
    (§4: counts as UNAVAILABLE; a read asks the next replica)."""

    code = 7
    retryable = True


class Ambiguous(PangeaError):
    """A write sent to `replica` whose fate is unknown (no answer in its budget, or
    its connection was lost after it went out). Sending it elsewhere could apply it
    twice, so the client did not (`resend_if_unknown=True` allows it)."""


class ConfigError(PangeaError):
    """A cluster file, topology, placement or certificate that cannot be used."""


_NAMES = {
    0: "CODE_UNSPECIFIED",
    1: "INVALID_ARGUMENT",
    2: "NOT_FOUND",
    3: "DEADLINE_EXCEEDED",
    4: "NOT_COVERED",
    5: "TOO_STALE",
    6: "POLICY_FORBIDS",
    7: "UNAVAILABLE",
    8: "INTERNAL",
    9: "NOT_REPLICATED",
    10: "CURSOR_EXPIRED",
}

_BY_CODE: dict[int, type[PangeaError]] = {
    1: InvalidArgument,
    2: NotFound,
    3: DeadlineExceeded,
    4: NotCovered,
    5: TooStale,
    6: PolicyForbids,
    7: Unavailable,
    8: Internal,
    10: CursorExpired,
}


def from_wire(code: int, message: str, token: bytes, replica: str) -> PangeaError:
    """The error a replica's `pangea.v1.Error` stands for (§4). An unknown code, and
    CODE_UNSPECIFIED, are INTERNAL."""
    if code == 9:
        return NotReplicated(message, replica=replica, token=token)
    cls = _BY_CODE.get(code)
    if cls is None:
        return Internal(f"error code {code} ({_NAMES.get(code, 'unknown')}): {message}", replica=replica)
    return cls(message, replica=replica)
