"""QUIC connections to replicas, and requests on their streams (docs/protocol.md §1,
§2).

- QUIC version 1, ALPN `pangea/1`, TLS 1.3 with a client certificate (mutual TLS),
  the cluster's CA as the only trust anchor (§1 "QUIC and TLS").
- The TLS server name is the replica id when it is a valid DNS name, else
  `localhost` (§1 "Verifying the replica"); after the handshake the replica's
  `pangea://replica/<id>?region=…` identity is checked as well.
- One connection per replica, made on first use and again after it is lost.
- A request is one frame on a bidirectional stream and its answer one frame back
  (§2 "Streams"). A stream whose answer was read whole is parked and carries the
  next request to that replica; a request abandoned midway (a lost hedge, a
  deadline) resets its stream, which is not reused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509

from .errors import ConfigError, Lost, Unavailable
from .framing import FrameError, FrameReader, encode_frame

#: §1: offered and required on both sides.
ALPN = "pangea/1"
#: §1 "Connection parameters".
IDLE_TIMEOUT_S = 10.0
STREAM_WINDOW = 2 * 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024
#: §1 "Admission": a handshake must finish within 5 s.
HANDSHAKE_TIMEOUT_S = 5.0
#: Parked streams per connection at most (half the 256 a replica allows, §2).
IDLE_STREAMS_MAX = 128

#: TLS alerts a failed handshake reports (QUIC CRYPTO_ERROR = 0x100 + alert).
_TLS_ALERTS = {
    40: "handshake_failure",
    42: "bad_certificate",
    43: "unsupported_certificate",
    44: "certificate_revoked",
    45: "certificate_expired",
    46: "certificate_unknown",
    48: "unknown_ca",
    51: "decrypt_error",
    80: "internal_error",
    116: "certificate_required",
    120: "no_application_protocol",
}

#: §1 "QUIC application close codes".
_CLOSE_CODES = {
    2: "no usable identity in the certificate",
    3: "the replica is shutting down",
    4: "the certificate is revoked",
    5: "the certificate no longer verifies",
    6: "wrong role for this stream kind",
}


@dataclass(frozen=True)
class Credential:
    """The certificate a client presents: `clients/<name>`, `loaders/<name>` or
    `operators/<name>` of the cluster's certs directory (§1 "Identities")."""

    kind: str  # "client", "loader" or "operator"
    name: str

    _DIRS = {"client": "clients", "loader": "loaders", "operator": "operators"}

    def __post_init__(self) -> None:
        if self.kind not in self._DIRS:
            raise ConfigError(
                f"credential kind {self.kind!r}: expected client, loader or operator "
                "(replica certificates do not make requests)"
            )

    def files(self, certs: Path) -> tuple[Path, Path]:
        """The certificate and key files (`<dir>/<name>.pem`, `.key`)."""
        base = certs / self._DIRS[self.kind] / self.name
        return base.with_suffix(".pem"), base.with_suffix(".key")

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def server_name(replica_id: str) -> str:
    """The TLS server name to dial `replica_id` with (§1): the id itself when it is
    a valid DNS name, else `localhost`."""
    rid = replica_id
    ok = (
        rid.lower() != "localhost"
        and "_" not in rid
        and 0 < len(rid) <= 253
        and all(_LABEL.match(label) for label in rid.split("."))
        and not rid.split(".")[-1].isdigit()
    )
    return rid if ok else "localhost"


def identity_uri(cert: x509.Certificate) -> str | None:
    """The single `pangea://` URI among the certificate's subject alternative
    names (§1 "Identities"), or None when there is none or more than one."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith("pangea://")]
    return uris[0] if len(uris) == 1 else None


def check_credential(certs: Path, credential: Credential) -> tuple[Path, Path, Path]:
    """The (CA bundle, certificate, key) files of `credential`, checked: present,
    and the certificate holds the credential's identity (kind and name)."""
    ca = certs / "ca.pem"
    cert, key = credential.files(certs)
    for what, path in (("trust bundle", ca), (f"certificate of {credential}", cert), (f"key of {credential}", key)):
        if not path.is_file():
            raise ConfigError(f"{what}: {path} not found (certs directory {certs})")
    try:
        leaf = x509.load_pem_x509_certificate(cert.read_bytes())
    except ValueError as e:
        raise ConfigError(f"certificate of {credential}: {cert} is not a PEM certificate: {e}") from None
    uri = identity_uri(leaf)
    want = f"pangea://{credential.kind}/{credential.name}"
    if uri is None or not (uri == want or uri.startswith(want + "?")):
        raise ConfigError(
            f"certificate {cert} holds identity {uri!r}, not the {credential.kind} {credential.name!r} asked for"
        )
    return ca, cert, key


def _close_reason(code: int, reason: str) -> str:
    if 0x100 <= code <= 0x1FF:
        alert = code - 0x100
        return f"TLS alert {alert} ({_TLS_ALERTS.get(alert, 'unknown')}){': ' + reason if reason else ''}"
    meaning = _CLOSE_CODES.get(code)
    return f"closed with code {code}{' (' + meaning + ')' if meaning else ''}{': ' + reason if reason else ''}"


class _Unread(Unavailable):
    """The replica finished the stream without reading the request (§2): it was
    not acted on, and may be sent again."""


class _Stream:
    """One bidirectional stream: its frames as they arrive, and the waiter of the
    request it carries."""

    __slots__ = ("id", "reader", "waiter", "ended", "broken", "stopped")

    def __init__(self, sid: int) -> None:
        self.id = sid
        self.reader = FrameReader()
        self.waiter: asyncio.Future[bytes] | None = None
        self.ended = False  # the replica finished its side
        self.broken: str | None = None  # reset or malformed
        # The replica stopped reading our side (STOP_SENDING): its answer may still
        # come (§2: a refused frame is answered, then stopped), but the stream takes
        # no further request.
        self.stopped = False

    def deliver(self) -> None:
        w = self.waiter
        if w is None or w.done():
            return
        try:
            body = self.reader.next_frame()
        except FrameError as e:
            self.broken = str(e)
            w.set_exception(Lost(f"stream {self.id}: {e}"))
            return
        if body is not None:
            self.waiter = None
            w.set_result(body)
        elif self.broken:
            w.set_exception(Lost(f"stream {self.id}: {self.broken}"))
        elif self.ended and self.reader.pending():
            w.set_exception(Lost(f"stream {self.id}: the replica ended the stream inside a frame"))
        elif self.ended:
            # §2: a replica answers every request it reads; finishing the stream
            # without an answer means it never read this one (not sent).
            w.set_exception(_Unread(f"stream {self.id}: the replica finished the stream without reading the request"))


class Link(QuicConnectionProtocol):
    """A QUIC connection to one replica (aioquic protocol) and its streams."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 (aioquic's signature)
        super().__init__(*args, **kwargs)
        self.replica = ""
        self.streams: dict[int, _Stream] = {}
        self.idle: list[_Stream] = []
        self.closed_because: str | None = None
        self.handshake_done = False

    # aioquic's callback, on the event loop.
    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived):
            s = self.streams.get(event.stream_id)
            if s is None:
                return  # an abandoned stream's late answer
            s.reader.feed(event.data)
            if event.end_stream:
                s.ended = True
            s.deliver()
        elif isinstance(event, events.StreamReset):
            s = self.streams.get(event.stream_id)
            if s is not None:
                s.broken = f"reset by the replica (code {event.error_code})"
                s.deliver()
        elif isinstance(event, events.StopSendingReceived):
            s = self.streams.get(event.stream_id)
            if s is not None:
                s.stopped = True
        elif isinstance(event, events.HandshakeCompleted):
            self.handshake_done = True
        elif isinstance(event, events.ConnectionTerminated):
            self.closed_because = _close_reason(event.error_code, event.reason_phrase)
            for s in self.streams.values():
                if s.waiter is not None and not s.waiter.done():
                    s.waiter.set_exception(
                        Lost(f"connection to replica {self.replica} {self.closed_because}", replica=self.replica)
                    )
            self.streams.clear()
            self.idle.clear()

    @property
    def usable(self) -> bool:
        return self.closed_because is None

    async def exchange(self, request: bytes, on_sent: Callable[[], None] | None) -> bytes:
        """Sends one request frame and returns the answer frame's body. Cancelling
        it abandons the stream (§2: not reused). A parked stream the replica had
        finished is not an error: the request goes again on a new stream."""
        frame = encode_frame(request)
        try:
            return await self._exchange(frame, on_sent, reuse=True)
        except _Unread:
            return await self._exchange(frame, on_sent, reuse=False)

    async def _exchange(self, frame: bytes, on_sent: Callable[[], None] | None, reuse: bool) -> bytes:
        if self.closed_because is not None:
            raise Unavailable(f"connection to replica {self.replica} {self.closed_because}", replica=self.replica)
        stream = None
        while reuse and self.idle:
            s = self.idle.pop()
            if not s.ended and s.broken is None and not s.stopped and s.id in self.streams:
                stream = s
                break
            self.streams.pop(s.id, None)
        if stream is None:
            sid = self._quic.get_next_available_stream_id()
            stream = _Stream(sid)
            self.streams[sid] = stream
        waiter = asyncio.get_running_loop().create_future()
        stream.waiter = waiter
        self._quic.send_stream_data(stream.id, frame, end_stream=False)
        # Sent at the end of this turn of the event loop, with every other request
        # written in it: fewer, fuller datagrams (aioquic's own batching).
        self._transmit_soon()
        if on_sent is not None:
            on_sent()
        try:
            body = await waiter
        except BaseException:
            self._abandon(stream)
            raise
        if stream.ended or stream.stopped or len(self.idle) >= IDLE_STREAMS_MAX or stream.reader.pending():
            self._finish(stream)
        else:
            self.idle.append(stream)
        return body

    async def exchange_bytes(self, data: bytes) -> bytes:
        """Writes `data` as it is (a frame or not) on a new stream, finishes the
        sending side, and returns the body of the first frame answered (the
        conformance vectors' exchanges, conformance/README.md). Raises Lost when the
        stream ends or breaks without one."""
        if self.closed_because is not None:
            raise Unavailable(f"connection to replica {self.replica} {self.closed_because}", replica=self.replica)
        sid = self._quic.get_next_available_stream_id()
        stream = _Stream(sid)
        self.streams[sid] = stream
        stream.waiter = asyncio.get_running_loop().create_future()
        self._quic.send_stream_data(sid, data, end_stream=True)
        self.transmit()
        try:
            return await stream.waiter
        except _Unread as e:
            raise Lost(str(e), replica=self.replica) from None
        finally:
            # Our side is finished; the replica's ends after its answer.
            self.streams.pop(sid, None)

    def _abandon(self, stream: _Stream) -> None:
        """Stops both directions of a stream whose answer is no longer wanted."""
        self.streams.pop(stream.id, None)
        if self.closed_because is not None:
            return
        try:
            self._quic.reset_stream(stream.id, 0)
        except Exception:  # noqa: BLE001 (already finished or reset)
            pass
        try:
            self._quic.stop_stream(stream.id, 0)
        except Exception:  # noqa: BLE001
            pass
        self.transmit()

    def _finish(self, stream: _Stream) -> None:
        """Ends a stream at a frame boundary (§2: the replica finishes its side)."""
        self.streams.pop(stream.id, None)
        if self.closed_because is None and not stream.broken:
            try:
                self._quic.send_stream_data(stream.id, b"", end_stream=True)
                self.transmit()
            except Exception:  # noqa: BLE001
                pass


class Transport:
    """Connections to every replica of a cluster, by replica id."""

    def __init__(self, certs: Path, credential: Credential, addresses: dict[str, str]) -> None:
        ca, cert, key = check_credential(certs, credential)
        self.credential = credential
        self._ca, self._cert, self._key = str(ca), str(cert), str(key)
        self.addresses: dict[str, tuple[str, int]] = {}
        for rid, addr in addresses.items():
            self.addresses[rid] = parse_address(rid, addr)
        self._links: dict[str, Link] = {}
        self._connecting: dict[str, asyncio.Task[Link]] = {}
        self._sockets: dict[str, asyncio.DatagramTransport] = {}

    def learn(self, replica: str, address: str) -> None:
        """Adds a replica's address (one a newer deployment names)."""
        if replica not in self.addresses:
            self.addresses[replica] = parse_address(replica, address)

    def _configuration(self, replica: str) -> QuicConfiguration:
        c = QuicConfiguration(
            is_client=True,
            alpn_protocols=[ALPN],
            idle_timeout=IDLE_TIMEOUT_S,
            max_stream_data=STREAM_WINDOW,
            max_data=CONNECTION_WINDOW,
            server_name=server_name(replica),
            verify_mode=ssl.CERT_REQUIRED,
        )
        c.load_verify_locations(cafile=self._ca)
        c.load_cert_chain(self._cert, self._key)
        return c

    async def _connect(self, replica: str) -> Link:
        host, port = self.addresses[replica]
        loop = asyncio.get_running_loop()
        ip = ipaddress.ip_address(host)
        family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.bind(("::" if family == socket.AF_INET6 else ("127.0.0.1" if ip.is_loopback else "0.0.0.0"), 0))
        from aioquic.quic.connection import QuicConnection

        quic = QuicConnection(configuration=self._configuration(replica))
        transport, link = await loop.create_datagram_endpoint(lambda: Link(quic), sock=sock)
        assert isinstance(link, Link)
        link.replica = replica
        where = f"replica {replica} at {host}:{port}"
        try:
            link.connect((host, port))
            await asyncio.wait_for(link.wait_connected(), HANDSHAKE_TIMEOUT_S)
        except asyncio.TimeoutError:
            transport.close()
            raise Unavailable(f"{where}: no handshake within {HANDSHAKE_TIMEOUT_S:.0f} s", replica=replica) from None
        except ConnectionError:
            transport.close()
            raise Unavailable(
                f"{where}: handshake failed: {link.closed_because or 'connection closed'}", replica=replica
            ) from None
        # §1: the identity is the URI SAN, checked whatever the server name was.
        peer = getattr(quic.tls, "_peer_certificate", None)  # aioquic keeps it there
        uri = identity_uri(peer) if peer is not None else None
        if uri is None or not re.fullmatch(rf"pangea://replica/{re.escape(replica)}\?region=[A-Za-z0-9_.-]+", uri):
            link.close(error_code=0, reason_phrase="unexpected peer")
            transport.close()
            raise Unavailable(f"{where} presented identity {uri!r}, expected replica {replica}", replica=replica)
        self._links[replica] = link
        old = self._sockets.pop(replica, None)
        if old is not None:
            old.close()
        self._sockets[replica] = transport
        return link

    async def link(self, replica: str) -> Link:
        """The connection to `replica`, made now if there is none (concurrent callers
        share one attempt)."""
        link = self._links.get(replica)
        if link is not None and link.usable:
            return link
        if replica not in self.addresses:
            raise Unavailable(f"no address for replica {replica}", replica=replica)
        task = self._connecting.get(replica)
        if task is None:
            task = asyncio.ensure_future(self._connect(replica))
            self._connecting[replica] = task
            task.add_done_callback(lambda _t: self._connecting.pop(replica, None))
        return await asyncio.shield(task)

    async def call(self, replica: str, request: bytes, on_sent: Callable[[], None] | None = None) -> bytes:
        """Sends `request` (an encoded `ClientRequest`) to `replica`; returns the
        encoded `ClientResponse`. Raises Unavailable when nothing could be sent, Lost
        when the connection or stream failed after the request went out."""
        link = await self.link(replica)
        return await link.exchange(request, on_sent)

    def forget(self, replica: str) -> None:
        """Drops the connection to a replica that looks gone; the next call connects
        afresh."""
        link = self._links.pop(replica, None)
        if link is not None:
            link.close(error_code=0, reason_phrase="replica unresponsive")
        sock = self._sockets.pop(replica, None)
        if sock is not None:
            asyncio.get_running_loop().call_later(0.1, sock.close)

    async def close(self) -> None:
        for task in list(self._connecting.values()):
            task.cancel()
        for link in self._links.values():
            link.close()
        for link in self._links.values():
            try:
                await asyncio.wait_for(link.wait_closed(), 0.5)
            except (asyncio.TimeoutError, ConnectionError):
                pass
        for sock in self._sockets.values():
            sock.close()
        self._links.clear()
        self._sockets.clear()


def parse_address(replica: str, address: str) -> tuple[str, int]:
    """An `IP:port` socket address (§1 "Addresses and ports": no host names)."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        p = int(port)
        if not sep or not 0 < p < 65536:
            raise ValueError
    except ValueError:
        raise ConfigError(f"replica {replica}: address {address!r} is not IP:port") from None
    return host, p
