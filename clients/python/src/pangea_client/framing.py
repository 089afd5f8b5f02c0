"""Frames on a stream (docs/protocol.md §2, "Frames").

Every message is one frame: a 4-byte big-endian length of the body, then the body,
one encoded protobuf message (`ClientRequest` out, `ClientResponse` back).
"""

from __future__ import annotations

import struct

#: The largest frame body either side accepts, inclusive (§2: 17 MiB,
#: `FRAME_BYTES_MAX` in `net/frame.rs`).
FRAME_BYTES_MAX = 17 * 1024 * 1024

_LENGTH = struct.Struct(">I")


class FrameError(Exception):
    """A frame that breaks §2: too large, or cut short by the end of its stream."""


def encode_frame(body: bytes) -> bytes:
    """`body` behind its length prefix. Refuses a body above `FRAME_BYTES_MAX`."""
    if len(body) > FRAME_BYTES_MAX:
        raise FrameError(
            f"request of {len(body)} bytes is above the frame limit of {FRAME_BYTES_MAX} bytes"
        )
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Reassembles frames from a stream's data as it arrives, in any pieces."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def pending(self) -> int:
        """Bytes held that do not yet make a whole frame."""
        return len(self._buf)

    def next_frame(self) -> bytes | None:
        """The next whole frame's body, or None until one has arrived.

        Raises FrameError once the announced length is above the limit (§2: checked
        against the prefix, before any of the body is read).
        """
        if len(self._buf) < 4:
            return None
        (n,) = _LENGTH.unpack_from(self._buf)
        if n > FRAME_BYTES_MAX:
            raise FrameError(
                f"frame of {n} bytes announced, above the limit of {FRAME_BYTES_MAX} bytes"
            )
        if len(self._buf) < 4 + n:
            return None
        body = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return body
