//! Connections to replicas (a few per replica, reused, re-established when lost),
//! and requests on streams that are reused too.
//!
//! Calls to one replica spread over [`ClientConfig::connections_per_replica`]
//! connections (2 by default), each task keeping to one of them (`slot_of`). A QUIC connection is driven by one task on each side,
//! which handles every datagram that is in before the requests it carries are served,
//! so the requests in flight on one connection move in waves: the client sends a
//! batch, the replica answers the batch, the client sends the next. With two, one
//! connection's wave is served while the other's answers travel back, and neither
//! side sits as idle between waves (1 KiB gets with 8–32 in flight: +15–20 %; flat at
//! 50; docs/benchmarks.md, "Serving"); three or more did not help.
//!
//! A request is one frame on a bidirectional stream, its answer one frame back. A
//! stream whose answer has been read whole is parked on its connection and carries
//! the next request to that replica (the replica serves a stream's requests one
//! after another): opening and closing a QUIC stream per request costs both sides
//! stream state, flow-control frames and a task, a sizeable share of a 1 KiB read.
//! A stream is parked only after a complete answer, so the next request never
//! meets the tail of an earlier one; a call abandoned midway (a hedge that lost, a
//! deadline) drops its stream, which finishes its sending side and stops its
//! receiving side (quinn 0.11), so the replica's answer fails to write and the
//! stream ends.

use crate::{ClientConfig, Error};
use dashmap::DashMap;
use pangea_net::reload::{LiveTls, RELOAD_INTERVAL_DEFAULT, TlsFiles, spawn_poller};
use pangea_net::{FRAME_BYTES_MAX, PeerIdentity, handshake, read_answer, tls, write_frame_pair};
use pangea_proto::v1 as pb;
use pangea_topology::ReplicaId;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Idle streams kept per connection at most: half of what a replica lets one
/// connection have open ([`pangea_net::tls::BIDI_STREAMS_MAX`]), so parked streams
/// never keep a busy client from opening new ones.
const IDLE_STREAMS_MAX: usize = pangea_net::tls::BIDI_STREAMS_MAX as usize / 2;

type Stream = (quinn::SendStream, quinn::RecvStream);

/// A request's head and body ([`Transport::call_noting`]).
type Parts<'a> = (&'a pb::ClientRequest, &'a pb::ClientRequest);

/// One connection attempt, awaited by every call that needs it.
type Dial = Arc<tokio::sync::OnceCell<Result<Arc<Link>, Error>>>;

/// A connection to one replica and its idle streams.
struct Link {
    connection: quinn::Connection,
    idle: Mutex<Vec<Stream>>,
    /// The replica has answered a request on it: the handshake was accepted.
    answered: std::sync::atomic::AtomicBool,
}

impl Link {
    fn answered(&self) {
        self.answered
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn take_idle(&self) -> Option<Stream> {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
    }

    fn park(&self, stream: Stream) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < IDLE_STREAMS_MAX {
            idle.push(stream);
        }
    }
}

/// Delays traffic to `replica` at `addr` by the topology's round trip from `region`.
fn emulate_rtt(
    control: &pangea_net::wan::WanControl,
    d: &pangea_topology::Deployment,
    region: &pangea_topology::RegionId,
    replica: &ReplicaId,
    addr: SocketAddr,
) {
    let rtt_ms = pangea_core::read::estimated_rtt_ms(d, region, replica);
    if rtt_ms.is_finite() {
        control.set_delay(addr, Duration::from_micros((rtt_ms * 1_000.0) as u64));
    }
}

pub(crate) struct Transport {
    endpoint: quinn::Endpoint,
    /// Where each replica listens: the client's configuration's, then those of
    /// replicas a newer deployment adds ([`Transport::learn_addresses`]).
    addresses: DashMap<ReplicaId, SocketAddr>,
    /// With an emulated WAN, the delay control and the client's region (new
    /// replicas get their round trip too).
    emulated: Option<(pangea_net::wan::WanControl, pangea_topology::RegionId)>,
    /// By replica and slot (`0..per_replica`).
    connections: DashMap<(ReplicaId, usize), Arc<Link>>,
    /// The handshake under way for a slot with no live connection: every call
    /// that finds the slot empty meanwhile waits for this one attempt and shares
    /// its outcome, so a frontend starting with hundreds of calls in flight (or
    /// finding its replica restarted) opens one connection per slot, not one per
    /// call — a herd the replica's per-source handshake limit would refuse.
    dialing: DashMap<(ReplicaId, usize), Dial>,
    per_replica: usize,
    /// The slot of the next call (round robin over every replica's slots).
    next_slot: std::sync::atomic::AtomicUsize,
    /// The client certificate, trust bundle and CRL: re-read when they change
    /// (polled every 30 s), so new connections present a re-issued certificate and
    /// refuse revoked replicas without restarting the frontend. Held here because
    /// the poller stops once it is dropped.
    _tls: std::sync::Arc<LiveTls>,
}

impl Transport {
    pub(crate) fn new(config: &ClientConfig) -> Result<Transport, Error> {
        // The certificate must hold the configured credential's identity (checked
        // again on every reload): a wrong one is a configuration error, not an
        // outage to retry.
        let files = TlsFiles::for_credential(&config.certs, &config.credential)?;
        let live = LiveTls::load(files).map_err(|e| match e {
            pangea_net::Error::WrongIdentity { .. }
            | pangea_net::Error::ReplicaCertificateAsCredential { .. } => {
                Error::InvalidInput(format!("client credential {}: {e}", config.credential))
            }
            other => other.into(),
        })?;
        let client = live.client_config()?;
        spawn_poller(&live, RELOAD_INTERVAL_DEFAULT, |_| {})?;
        let control = (config.emulate_wan || config.wan.is_some())
            .then(|| config.wan.clone().unwrap_or_default());
        // Replicas do not delay answers to clients: this side carries the whole
        // round trip from the client's region.
        let emulated = control
            .clone()
            .filter(|_| config.emulate_wan)
            .map(|c| (c, config.region.clone()));
        if let Some((c, region)) = &emulated {
            for (r, addr) in &config.addresses {
                emulate_rtt(c, &config.deployment, region, r, *addr);
            }
        }
        let wan = control.map(|c| pangea_net::wan::WanEmulator::new(c, 1));
        let bind: SocketAddr = ([127, 0, 0, 1], 0).into();
        let any = config.addresses.values().any(|a| !a.ip().is_loopback());
        let bind = if any {
            SocketAddr::from(([0, 0, 0, 0], 0))
        } else {
            bind
        };
        let endpoint = pangea_net::bind_endpoint(bind, None, client, wan, None)?;
        Ok(Transport {
            endpoint,
            addresses: config.addresses.clone().into_iter().collect(),
            emulated,
            connections: DashMap::new(),
            dialing: DashMap::new(),
            per_replica: config.connections_per_replica.max(1),
            next_slot: std::sync::atomic::AtomicUsize::new(0),
            _tls: live,
        })
    }

    /// The live connection of `slot` to `replica`, made if there is none: by one
    /// handshake that every call arriving meanwhile shares ([`Transport::dialing`]).
    async fn link(&self, replica: &ReplicaId, slot: usize) -> Result<Arc<Link>, Error> {
        let at = (replica.clone(), slot);
        if let Some(l) = self.live(&at) {
            return Ok(l);
        }
        let dial = self.dialing.entry(at.clone()).or_default().clone();
        // Cancel-safe: if the call driving the handshake is dropped (a hedge that
        // lost), the next waiter starts it again.
        let outcome = dial
            .get_or_init(|| async {
                // A call that found the slot empty may get here after an earlier
                // attempt connected and was retired.
                if let Some(l) = self.live(&at) {
                    return Ok(l);
                }
                let link = self.connect(replica).await?;
                self.connections.insert(at.clone(), link.clone());
                Ok(link)
            })
            .await
            .clone();
        // This attempt is over: the next call that finds the slot empty (this
        // connection lost, or the handshake failed) dials afresh.
        self.dialing.remove_if(&at, |_, d| Arc::ptr_eq(d, &dial));
        outcome
    }

    /// The cached connection at `at`, unless it has closed.
    fn live(&self, at: &(ReplicaId, usize)) -> Option<Arc<Link>> {
        self.connections
            .get(at)
            .map(|l| l.clone())
            .filter(|l| l.connection.close_reason().is_none())
    }

    /// A new connection to `replica`, checked to be that replica's.
    async fn connect(&self, replica: &ReplicaId) -> Result<Arc<Link>, Error> {
        let addr = *self
            .addresses
            .get(replica)
            .ok_or_else(|| Error::Unavailable(format!("no address for replica {replica}")))?;
        let connecting = self
            .endpoint
            .connect(addr, tls::server_name(replica.as_str()))
            .map_err(|e| Error::Unavailable(format!("replica {replica} at {addr}: {e}")))?;
        let c = connecting.await.map_err(|e| {
            Error::Unavailable(handshake::describe(
                &format!("replica {replica} at {addr}"),
                &e,
            ))
        })?;
        match pangea_net::peer_identity(&c)? {
            PeerIdentity::Replica { id, .. } if id == replica.as_str() => {}
            other => {
                return Err(Error::Unavailable(format!(
                    "{addr} presented {other}, expected replica {replica}"
                )));
            }
        }
        Ok(Arc::new(Link {
            connection: c,
            idle: Mutex::new(Vec::new()),
            answered: Default::default(),
        }))
    }

    /// Adds the addresses of replicas a newer deployment names (its topology's
    /// `address` fields); those known already stay.
    pub(crate) fn learn_addresses(&self, d: &pangea_topology::Deployment) {
        for r in d.topology.replicas.values() {
            if self.addresses.contains_key(&r.id) {
                continue;
            }
            let Some(addr) = r.address.as_deref().and_then(|a| a.parse().ok()) else {
                continue;
            };
            if let Some((c, region)) = &self.emulated {
                emulate_rtt(c, d, region, &r.id, addr);
            }
            self.addresses.insert(r.id.clone(), addr);
        }
    }

    /// Drops the cached connections to a replica (it looks dead); the next call
    /// connects afresh.
    pub(crate) fn forget(&self, replica: &ReplicaId) {
        for slot in 0..self.per_replica {
            if let Some((_, l)) = self.connections.remove(&(replica.clone(), slot)) {
                l.connection.close(0u32.into(), b"replica unresponsive");
            }
        }
    }

    /// Uncaches `link` unless another call has replaced it with a fresh one.
    fn drop_link(&self, at: &(ReplicaId, usize), link: &Arc<Link>) {
        self.connections.remove_if(at, |_, l| Arc::ptr_eq(l, link));
    }

    /// One request, one response.
    pub(crate) async fn call(
        &self,
        replica: &ReplicaId,
        req: &pb::ClientRequest,
    ) -> Result<pb::ClientResponse, Error> {
        let nothing = pb::ClientRequest::default();
        self.call_noting(replica, req, &nothing, &Sent::default())
            .await
    }

    /// [`Transport::call`], setting `sent` as the request starts out: a caller
    /// that stops waiting before then knows the replica never saw it. The
    /// request is `head` and `body` sent one after the other as one message
    /// (protobuf merges concatenated messages; neither sets a field of the
    /// other's): an attempt's own fields and the part every attempt of its call
    /// shares, which is not copied per attempt.
    pub(crate) async fn call_noting(
        &self,
        replica: &ReplicaId,
        head: &pb::ClientRequest,
        body: &pb::ClientRequest,
        sent: &Sent,
    ) -> Result<pb::ClientResponse, Error> {
        let req = (head, body);
        let slot = slot_of(tokio::task::try_id(), self.per_replica, &self.next_slot);
        let at = (replica.clone(), slot);
        let cached = self.live(&at);
        // A write is sent again only if it certainly did not arrive: sent twice it
        // would be applied twice.
        let resend_lost = !matches!(
            head.request.as_ref().or(body.request.as_ref()),
            Some(
                pb::client_request::Request::Mutate(_) | pb::client_request::Request::MutateRows(_)
            )
        );
        match (self.call_once(&at, cached.clone(), req, sent).await, cached) {
            // A cached connection can be dead without knowing it yet (its process was
            // killed and restarted): once it is known dead, forget it and try a fresh
            // one. Only that connection: the replica's others may be fine (calls in
            // flight on them go on), and a fresh one another call just made stays. A
            // connection still up (one stream refused) is kept.
            (Err(e @ (Error::Unavailable(_) | Error::Lost { .. })), Some(link))
                if link.connection.close_reason().is_some()
                    && (resend_lost || matches!(e, Error::Unavailable(_))) =>
            {
                self.drop_link(&at, &link);
                link.connection.close(0u32.into(), b"replica unresponsive");
                self.call_once(&at, None, req, sent).await
            }
            (other, _) => other,
        }
    }

    /// One call on connection slot `at`: on `cached` (the slot's live
    /// connection, looked up by the caller) or, without one, on the slot's
    /// connection, dialled if need be.
    async fn call_once(
        &self,
        at: &(ReplicaId, usize),
        cached: Option<Arc<Link>>,
        (head, body): Parts<'_>,
        sent: &Sent,
    ) -> Result<pb::ClientResponse, Error> {
        let replica = &at.0;
        // Only a call that had to wait for a connection, or that is a second try,
        // can have spent enough of its budget to tell the replica less (no clock
        // read otherwise).
        // Straight out on a cached connection's idle stream, the request leaves
        // as its attempt was made: no clock read for it.
        let at_once = cached.is_some();
        let (link, rebudgeted) = match cached {
            Some(link) => (link, None),
            None => {
                let link = self.link(replica, at.1).await?;
                (link, sent.rebudgeted(head, replica)?)
            }
        };
        let req = (rebudgeted.as_ref().unwrap_or(head), body);
        if let Some(stream) = link.take_idle() {
            match exchange(stream, req, sent, at_once).await {
                Ok((resp, stream)) => {
                    link.answered();
                    if let Some(stream) = stream {
                        link.park(stream);
                    }
                    return Ok(resp);
                }
                // The replica ended this idle stream before reading the request (it
                // does so after a request it could not parse, or when shutting
                // down): if the connection is still up, the request goes on a
                // fresh stream below.
                Err(Failed::Unsent(_)) if link.connection.close_reason().is_none() => {}
                Err(e) => {
                    self.drop_link(at, &link);
                    return Err(refused(&link, replica).unwrap_or_else(|| e.into_error(replica)));
                }
            }
        }
        let stream = match link.connection.open_bi().await {
            Ok(s) => s,
            Err(e) => {
                self.drop_link(at, &link);
                return Err(refused(&link, replica)
                    .unwrap_or_else(|| Failed::Unsent(e.to_string()).into_error(replica)));
            }
        };
        match exchange(stream, req, sent, false).await {
            Ok((resp, stream)) => {
                link.answered();
                if let Some(stream) = stream {
                    link.park(stream);
                }
                Ok(resp)
            }
            Err(e) => {
                if link.connection.close_reason().is_some() {
                    self.drop_link(at, &link);
                }
                Err(refused(&link, replica).unwrap_or_else(|| e.into_error(replica)))
            }
        }
    }
}

/// The error of a call on a connection the handshake refused. With TLS 1.3 the
/// client's side of the handshake ends before the replica checks the client's
/// certificate, so a refused certificate shows first as a failed stream: the
/// connection's close reason says why (`pangea_net::handshake`). Nothing was
/// served on such a connection, so the request was not applied.
fn refused(link: &Link, replica: &ReplicaId) -> Option<Error> {
    if link.answered.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    let reason = link.connection.close_reason()?;
    match handshake::Refusal::of(&reason)? {
        (handshake::Refusal::Other(_), _) | (_, handshake::By::Us) => return None,
        _ => {}
    }
    Some(Error::Unavailable(handshake::describe(
        &format!("replica {replica}"),
        &reason,
    )))
}

/// When a call's request last started out on a stream, set by the transport (a
/// call that waits longer than its budget learns whether the replica can have
/// seen it; a probe times the round trip from there, not from the handshake).
/// It also holds the instant the request's `deadline_us` counts to, when the
/// caller gives one: a request that had to wait for a new connection's handshake
/// is sent with the budget left then, not the one it was built with.
#[derive(Debug, Default)]
pub(crate) struct Sent {
    at: Mutex<Option<std::time::Instant>>,
    deadline_at: Option<std::time::Instant>,
    /// When the attempt was made, if the caller read the clock then.
    asked_at: Option<std::time::Instant>,
}

impl Sent {
    /// For a request whose budget ends at `deadline_at`, made at `asked_at`.
    pub(crate) fn until(deadline_at: std::time::Instant, asked_at: std::time::Instant) -> Sent {
        Sent {
            at: Mutex::default(),
            deadline_at: Some(deadline_at),
            asked_at: Some(asked_at),
        }
    }

    /// The request starts out now; `at_once`: as its attempt was made (it
    /// waited for no connection or stream), so that instant is when.
    fn mark(&self, at_once: bool) {
        let at = match self.asked_at {
            Some(asked_at) if at_once => asked_at,
            _ => std::time::Instant::now(),
        };
        *self.at.lock().unwrap_or_else(PoisonError::into_inner) = Some(at);
    }

    /// The request certainly did not reach the replica after all.
    fn clear(&self) {
        *self.at.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// When the request last went out; `None` while it has not.
    pub(crate) fn at(&self) -> Option<std::time::Instant> {
        *self.at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `req` with the budget left now, if it is at least a millisecond less than
    /// `req` says (the replica counts the budget from when the request arrives).
    /// A request with less than [`MIN_BUDGET`] left is not sent: the replica
    /// could only time it out, which for a write would leave it unknown whether
    /// it was applied, where unsent it certainly was not and the caller may try
    /// another replica.
    fn rebudgeted(
        &self,
        req: &pb::ClientRequest,
        replica: &ReplicaId,
    ) -> Result<Option<pb::ClientRequest>, Error> {
        let Some(deadline_at) = self.deadline_at else {
            return Ok(None);
        };
        if req.deadline_us == 0 {
            return Ok(None);
        }
        let left = deadline_at.saturating_duration_since(std::time::Instant::now());
        if left < MIN_BUDGET {
            return Err(Error::Unavailable(format!(
                "replica {replica}: not sent, {left:?} of its budget left after connecting \
                 (less than {MIN_BUDGET:?})"
            )));
        }
        let left_us = left.as_micros() as u64;
        if req.deadline_us.saturating_sub(left_us) < 1_000 {
            return Ok(None);
        }
        Ok(Some(pb::ClientRequest {
            deadline_us: left_us,
            ..req.clone()
        }))
    }
}

/// The least budget a request that had to wait for a connection is still sent
/// with.
const MIN_BUDGET: Duration = Duration::from_millis(1);

/// How an exchange failed: whether the replica can have acted on the request.
enum Failed {
    /// It cannot: the request was not sent whole, or the replica ended the stream
    /// without reading it (it answers every request it reads, errors included).
    Unsent(String),
    /// The request went out and no answer came back.
    Unanswered(String),
}

impl Failed {
    fn into_error(self, replica: &ReplicaId) -> Error {
        match self {
            Failed::Unsent(e) => Error::Unavailable(format!("replica {replica}: {e}")),
            Failed::Unanswered(detail) => Error::Lost {
                replica: replica.to_string(),
                detail,
            },
        }
    }
}

/// Sends `req` on `stream` and reads its answer; gives the stream back for reuse
/// (`None`: the replica refused the frame and stopped the stream, which is not
/// reused).
async fn exchange(
    (mut send, mut recv): Stream,
    (head, body): Parts<'_>,
    sent: &Sent,
    at_once: bool,
) -> Result<(pb::ClientResponse, Option<Stream>), Failed> {
    sent.mark(at_once);
    if let Err(e) = write_frame_pair(&mut send, head, body).await {
        // A replica that refuses a frame (a full frame budget, a frame too large)
        // answers why, then stops the stream: the answer says what to do. On a
        // dead connection the read fails at once.
        return match read_answer::<pb::ClientResponse>(&mut recv, FRAME_BYTES_MAX).await {
            Ok(Some(r)) => Ok((r, None)),
            _ => {
                sent.clear();
                Err(Failed::Unsent(e.to_string()))
            }
        };
    }
    match read_answer::<pb::ClientResponse>(&mut recv, FRAME_BYTES_MAX).await {
        Ok(Some(r)) => Ok((r, Some((send, recv)))),
        Ok(None) => {
            sent.clear();
            Err(Failed::Unsent(
                "closed the stream without reading the request".to_owned(),
            ))
        }
        Err(e) => Err(Failed::Unanswered(e.to_string())),
    }
}

/// Which of a replica's `per_replica` connections a call takes: the calling task's
/// own (its task number modulo the count), else, outside a task, the next in turn.
///
/// A worker that keeps one task keeps to one connection, so the requests its
/// answers prompt go back out on the connection those answers came in on, and a
/// wave of answers becomes one wave of requests in one datagram. Taking the next
/// connection in turn instead split every wave over both connections: at 32 gets
/// in flight, 0.145 `sendmsg` per get against 0.063, and 10–12 % more client CPU
/// per get (docs/benchmarks.md, step 8). Tasks spawned one after another get
/// consecutive numbers, so they spread evenly. The cost: the concurrent calls of
/// one task (a `join_all` of many gets) share one connection to a replica, as
/// every call does with a single connection per server.
fn slot_of(
    task: Option<tokio::task::Id>,
    per_replica: usize,
    next: &std::sync::atomic::AtomicUsize,
) -> usize {
    match task {
        Some(id) => (task_number(id) % per_replica as u64) as usize,
        None => next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % per_replica,
    }
}

/// A task's number: tokio shows it only through `Display` and `Hash`, and its
/// derived `Hash` writes the number as one `u64`.
fn task_number(id: tokio::task::Id) -> u64 {
    struct Number(u64);
    impl std::hash::Hasher for Number {
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(*b);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
        fn finish(&self) -> u64 {
            self.0
        }
    }
    let mut number = Number(0);
    std::hash::Hash::hash(&id, &mut number);
    number.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_keeps_to_one_connection_and_tasks_spread_over_them() {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut slots = Vec::new();
        for _ in 0..8 {
            let handle = tokio::spawn(async {
                let next = std::sync::atomic::AtomicUsize::new(0);
                let first = slot_of(tokio::task::try_id(), 2, &next);
                // Every call of the task takes the same connection.
                assert!((0..5).all(|_| slot_of(tokio::task::try_id(), 2, &next) == first));
                first
            });
            slots.push(handle.await.expect("task"));
        }
        // Tasks spawned one after another alternate between the two.
        assert!(slots.windows(2).all(|w| w[0] != w[1]), "{slots:?}");
        // Outside a task (`block_on`), calls take the connections in turn.
        assert_eq!(
            (0..4).map(|_| slot_of(None, 2, &next)).collect::<Vec<_>>(),
            vec![0, 1, 0, 1]
        );
        assert_eq!(slot_of(tokio::task::try_id(), 1, &next), 0);
    }
    use pangea_net::{Credential, certs};
    use pangea_topology::cluster::ClusterFile;
    use std::path::Path;

    /// A client configuration for the one-replica topology of the repository, with
    /// certificates in `dir`.
    fn config(dir: &Path) -> anyhow::Result<ClientConfig> {
        let topology =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology/single-replica.toml");
        let file = dir.join("cluster.toml");
        std::fs::write(
            &file,
            format!(
                "name = \"single-replica\"\ntopology = {:?}\ncerts = {:?}\n",
                topology.display().to_string(),
                dir.display().to_string()
            ),
        )?;
        let cluster = ClusterFile::load(&file).map_err(anyhow::Error::msg)?;
        Ok(ClientConfig::from_cluster(&cluster, "local-1", "frontend")?)
    }

    /// A request that waited for a connection goes out with the budget left, and
    /// not at all once less than [`MIN_BUDGET`] is left: the replica could only
    /// time it out, and a write timed out there may or may not have been applied.
    #[test]
    fn a_request_that_waited_is_sent_with_its_budget_left_or_not_at_all() {
        let replica = ReplicaId::from("use1-a");
        let now = std::time::Instant::now();
        let head = pb::ClientRequest {
            deadline_us: 500_000,
            ..Default::default()
        };
        // Built just now: sent as it is.
        let fresh = Sent::until(now + Duration::from_millis(500), now);
        assert!(matches!(fresh.rebudgeted(&head, &replica), Ok(None)));
        // 200 ms of it spent connecting: the replica is told what is left.
        let waited = Sent::until(now + Duration::from_millis(300), now);
        let told = waited
            .rebudgeted(&head, &replica)
            .map(|r| r.map(|r| r.deadline_us));
        assert!(
            matches!(told, Ok(Some(us)) if us <= 300_000 && us > 200_000),
            "{told:?}"
        );
        // All of it spent: not sent, and the error says so.
        let spent = Sent::until(now, now);
        match spent.rebudgeted(&head, &replica) {
            Err(Error::Unavailable(e)) => assert!(e.contains("not sent"), "{e}"),
            other => panic!("a spent budget was sent: {other:?}"),
        }
        // A request without a deadline, or without one to count to, is unchanged.
        let none = pb::ClientRequest::default();
        assert!(matches!(spent.rebudgeted(&none, &replica), Ok(None)));
        assert!(matches!(
            Sent::default().rebudgeted(&head, &replica),
            Ok(None)
        ));
    }

    /// A request sent as an attempt's head and its call's shared body is, to the
    /// replica, the whole request: the same message once decoded.
    #[test]
    fn a_request_in_head_and_body_decodes_whole() -> anyhow::Result<()> {
        let request = pb::client_request::Request::Get(pb::GetRequest {
            table: "profiles".into(),
            row_key: bytes::Bytes::from_static(b"user:42"),
            ..Default::default()
        });
        let body = pb::ClientRequest {
            app_profile: "serving".into(),
            request: Some(request.clone()),
            ..Default::default()
        };
        let head = pb::ClientRequest {
            deadline_us: 20_000,
            traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
            known_watermarks: 0x5eed,
            ..Default::default()
        };
        let frame = pangea_net::frame::encode_frame_pair(&head, &body)?;
        let Some((got, read)) =
            pangea_net::decode_frame::<pb::ClientRequest>(&frame, FRAME_BYTES_MAX)?
        else {
            anyhow::bail!("the frame did not decode whole");
        };
        assert_eq!(read, frame.len());
        let whole = pb::ClientRequest {
            deadline_us: head.deadline_us,
            app_profile: body.app_profile,
            traceparent: head.traceparent.clone(),
            known_watermarks: head.known_watermarks,
            request: Some(request),
        };
        assert_eq!(got, whole);
        // Its fields in another order, no byte more on the wire.
        assert_eq!(frame.len(), pangea_net::encode_frame(&whole)?.len());
        Ok(())
    }

    #[tokio::test]
    async fn the_credential_must_hold_its_own_identity() -> anyhow::Result<()> {
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        certs::init_ca(d)?;
        certs::issue_replica(d, "solo", "local-1")?;
        certs::issue_client(d, "client-frontend", "frontend")?;
        certs::issue_operator(d, "alice")?;
        let config = config(d)?;
        assert_eq!(
            config.credential,
            Credential::Client("client-frontend".into())
        );

        // The default client credential and an operator's load as themselves.
        let t = Transport::new(&config)?;
        assert_eq!(t._tls.identity().name(), "client-frontend");
        let operator = config
            .clone()
            .with_credential(Credential::Operator("alice".into()));
        let t = Transport::new(&operator)?;
        assert_eq!(
            t._tls.identity(),
            PeerIdentity::Operator {
                name: "alice".into()
            }
        );

        // Another identity's certificate is a configuration error, not an outage.
        let copy = |from: &Path, to: &Path| -> std::io::Result<()> {
            std::fs::copy(from, to)?;
            std::fs::copy(from.with_extension("key"), to.with_extension("key"))?;
            Ok(())
        };
        copy(
            &certs::client_cert_path(d, "client-frontend"),
            &certs::operator_cert_path(d, "alice"),
        )?;
        match Transport::new(&operator) {
            Err(Error::InvalidInput(m)) => {
                assert!(
                    m.contains("holds the identity of client client-frontend"),
                    "{m}"
                );
            }
            Err(e) => anyhow::bail!("expected InvalidInput, got {e:?}"),
            Ok(_) => anyhow::bail!("an operator credential loaded a client certificate"),
        }
        copy(
            &certs::replica_cert_path(d, "solo"),
            &certs::client_cert_path(d, "client-frontend"),
        )?;
        match Transport::new(&config) {
            Err(Error::InvalidInput(m)) => assert!(m.contains("is a replica certificate"), "{m}"),
            Err(e) => anyhow::bail!("expected InvalidInput, got {e:?}"),
            Ok(_) => anyhow::bail!("a client credential loaded a replica certificate"),
        }
        Ok(())
    }
}
