//! WAN emulation in the socket layer, without root.
//!
//! The machines we run local clusters on have no kernel netem, so a replica
//! process can instead wrap its UDP socket in a [`WanSocket`]: every outgoing
//! datagram is looked up in the shared rules ([`WanControl`]) by destination
//! address, then dropped (partition, seeded random loss, queue full), sent at once
//! (no delay configured and nothing queued for that destination), or queued until
//! its release time and sent by one background task per socket.
//!
//! Properties, and why:
//!
//! - **Delay is applied by the sender.** Each direction's one-way delay is set on
//!   the sending side's control, so a link's RTT is the sum of both directions'
//!   settings; receiving is untouched. This keeps the wrapper stateless on the
//!   receive path, which quinn polls hot.
//! - **Jitter never reorders a destination's datagrams.** A datagram's release time
//!   is `max(previous release to that destination, now + delay + jitter)`: real
//!   links mostly keep order, and reordering would make QUIC's loss detection
//!   declare packets lost that are merely late, muddling what a test measures.
//!   Datagrams to *different* destinations are independent.
//! - **Seeded.** Loss and jitter draws come from a splitmix64 seeded by the caller,
//!   so a given sequence of sends replays. (Which datagrams quinn sends still
//!   depends on real timing, so whole runs are not bit-for-bit reproducible;
//!   the simulator is the tool for that.)
//! - **Released on time, whatever the process is doing.** A thread of its own
//!   per socket releases queued datagrams, sleeping until the earliest release
//!   time or a new datagram (no busy loop). Not a tokio task: tokio's timers
//!   tick in whole milliseconds (`tokio::time::sleep` "operates at millisecond
//!   granularity"), which turned a 0.5 ms one-way delay into 1–2 ms, and fire
//!   only when the runtime's thread gets to them, so a busy replica delayed its
//!   own packets further — an emulated network slower and noisier under load
//!   than the one it stands for. The thread's sleeps are accurate to the
//!   kernel's timer slack (50 µs by default).
//! - **Bounded.** At most [`WAN_QUEUE_BYTES_MAX`] bytes wait in the queue; beyond it
//!   datagrams are tail-dropped, like a router's full buffer.
//! - **An internet path MTU on delayed links.** A datagram over
//!   [`WAN_PATH_PAYLOAD_MAX`] bytes (a 1,500-byte Ethernet frame less IPv4 and UDP
//!   headers) to a destination with a delay is dropped, as a WAN path drops a
//!   too-big packet with "don't fragment" set: path-MTU discovery stops there, as
//!   it would between regions, while links without a delay (same region,
//!   loopback) carry jumbo packets.
//! - **Rules change at runtime.** [`WanControl`] is a cheap clone of an
//!   `Arc<Mutex<..>>`; a drill flips a partition on and off while traffic flows.
//!   A partition also drops datagrams already queued for that destination when
//!   their release time comes, as a cut cable drops what is in flight.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use quinn::udp::{EcnCodepoint, RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use std::sync::Condvar;
use std::time::Instant;

use crate::error::{Error, Result};
use pangea_core::rng::Rng;

/// Most bytes of datagrams waiting for their release time, per socket: 64 MiB.
/// At 25 ms one-way delay that holds ~20 Gbit/s of traffic in flight, far more
/// than a loopback test sends; it exists so a runaway sender cannot eat memory.
pub const WAN_QUEUE_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The largest datagram a link with a delay carries: 1,500 − 20 − 8 bytes.
pub const WAN_PATH_PAYLOAD_MAX: usize = 1_472;

/// Emulated conditions of the path toward one destination (one direction).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkRule {
    /// Fixed one-way delay added to every datagram.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `[0, jitter]` per datagram (never reorders).
    pub jitter: Duration,
    /// Probability in `[0, 1]` that a datagram is dropped; values outside are
    /// clamped, NaN counts as 0.
    pub loss: f64,
    /// Drop everything (a partition).
    pub partitioned: bool,
}

impl LinkRule {
    /// Only a one-way delay.
    pub fn delay(delay: Duration) -> Self {
        Self {
            delay,
            ..Self::default()
        }
    }

    /// Whether sends under this rule can bypass the queue.
    fn is_transparent(&self) -> bool {
        self.delay.is_zero() && self.jitter.is_zero()
    }

    fn loss_probability(&self) -> f64 {
        if self.loss.is_nan() {
            0.0
        } else {
            self.loss.clamp(0.0, 1.0)
        }
    }
}

/// Counters of what the emulator did, summed over every socket sharing a control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WanStats {
    /// Datagrams handed to the real socket (at once or after a delay).
    pub sent: u64,
    /// Datagrams that went through the delay queue.
    pub delayed: u64,
    /// Dropped by random loss.
    pub dropped_loss: u64,
    /// Dropped by a partition (at send or at release time).
    pub dropped_partition: u64,
    /// Dropped because the queue held [`WAN_QUEUE_BYTES_MAX`] bytes.
    pub dropped_queue_full: u64,
    /// Dropped as larger than a delayed link carries ([`WAN_PATH_PAYLOAD_MAX`]):
    /// path-MTU discovery's probes.
    pub dropped_too_big: u64,
}

#[derive(Debug, Default)]
struct Counters {
    sent: AtomicU64,
    delayed: AtomicU64,
    dropped_loss: AtomicU64,
    dropped_too_big: AtomicU64,
    dropped_partition: AtomicU64,
    dropped_queue_full: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[derive(Debug, Default)]
struct Rules {
    /// Applies to destinations without their own rule.
    default: LinkRule,
    /// Per destination. A BTreeMap so that a dump of the rules is in a stable order.
    links: BTreeMap<SocketAddr, LinkRule>,
}

/// The shared, runtime-changeable rules of one or more emulated sockets.
///
/// Cloning is cheap and every clone edits the same rules.
#[derive(Debug, Clone, Default)]
pub struct WanControl {
    rules: Arc<Mutex<Rules>>,
    counters: Arc<Counters>,
}

impl WanControl {
    /// No delay, no loss, no partition toward anyone.
    pub fn new() -> Self {
        Self::default()
    }

    fn rules(&self) -> MutexGuard<'_, Rules> {
        // The rules are plain values that every writer leaves consistent, so a
        // panic elsewhere while holding the lock cannot corrupt them.
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the rule for destinations without their own.
    pub fn set_default(&self, rule: LinkRule) {
        self.rules().default = rule;
    }

    /// Sets the rule toward `dest`.
    pub fn set_link(&self, dest: SocketAddr, rule: LinkRule) {
        self.rules().links.insert(dest, rule);
    }

    /// Removes `dest`'s own rule: the default applies again.
    pub fn clear_link(&self, dest: SocketAddr) {
        self.rules().links.remove(&dest);
    }

    /// Sets only the one-way delay toward `dest`, keeping its other settings.
    pub fn set_delay(&self, dest: SocketAddr, delay: Duration) {
        self.edit_link(dest, |rule| rule.delay = delay);
    }

    /// Drops everything sent to `dest` from now on (and what is queued for it).
    pub fn partition(&self, dest: SocketAddr) {
        self.edit_link(dest, |rule| rule.partitioned = true);
    }

    /// Ends a partition toward `dest`.
    pub fn heal(&self, dest: SocketAddr) {
        self.edit_link(dest, |rule| rule.partitioned = false);
    }

    fn edit_link(&self, dest: SocketAddr, edit: impl FnOnce(&mut LinkRule)) {
        let mut rules = self.rules();
        let default = rules.default;
        edit(rules.links.entry(dest).or_insert(default));
    }

    /// The rule that applies to `dest` now.
    pub fn rule_for(&self, dest: SocketAddr) -> LinkRule {
        let rules = self.rules();
        rules.links.get(&dest).copied().unwrap_or(rules.default)
    }

    /// What the emulator has done so far.
    pub fn stats(&self) -> WanStats {
        let c = &self.counters;
        WanStats {
            sent: c.sent.load(Ordering::Relaxed),
            delayed: c.delayed.load(Ordering::Relaxed),
            dropped_loss: c.dropped_loss.load(Ordering::Relaxed),
            dropped_partition: c.dropped_partition.load(Ordering::Relaxed),
            dropped_queue_full: c.dropped_queue_full.load(Ordering::Relaxed),
            dropped_too_big: c.dropped_too_big.load(Ordering::Relaxed),
        }
    }
}

/// How to emulate the WAN for one socket: its rules and the seed of its draws.
/// Turned into a socket by [`WanEmulator::wrap`] (which
/// [`crate::endpoint::bind_endpoint`] calls).
#[derive(Debug, Clone)]
pub struct WanEmulator {
    control: WanControl,
    seed: u64,
}

impl WanEmulator {
    /// An emulator following `control`, drawing loss and jitter from `seed`.
    pub fn new(control: WanControl, seed: u64) -> Self {
        Self { control, seed }
    }

    /// The rules this emulator follows.
    pub fn control(&self) -> &WanControl {
        &self.control
    }

    /// Wraps a real socket and starts its sender thread, which ends when the
    /// returned socket is dropped.
    pub fn wrap(self, inner: Arc<dyn AsyncUdpSocket>) -> Result<Arc<WanSocket>> {
        let shared = Arc::new(Shared {
            control: self.control,
            state: Mutex::new(SendState {
                rng: Rng::new(self.seed),
                queue: BinaryHeap::new(),
                pending: HashMap::new(),
                queued_bytes: 0,
                next_seq: 0,
            }),
            wake: Condvar::new(),
            closed: AtomicBool::new(false),
        });
        let (s, i) = (shared.clone(), inner.clone());
        std::thread::Builder::new()
            .name("pangea-wan".into())
            .spawn(move || run_sender(&s, &*i))
            .map_err(|source| Error::Thread {
                what: "WAN emulator sender",
                source,
            })?;
        Ok(Arc::new(WanSocket { inner, shared }))
    }
}

/// A UDP socket that delays, drops and partitions outgoing datagrams per
/// destination according to a [`WanControl`]. Implements quinn's
/// [`AsyncUdpSocket`], so an endpoint runs over it unchanged.
pub struct WanSocket {
    /// The real socket: receives directly, sends directly or from the sender thread.
    inner: Arc<dyn AsyncUdpSocket>,
    /// State shared with the sender thread.
    shared: Arc<Shared>,
}

impl fmt::Debug for WanSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WanSocket")
            .field("local_addr", &self.inner.local_addr().ok())
            .field("queued_bytes", &self.shared.state().queued_bytes)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Shared {
    control: WanControl,
    state: Mutex<SendState>,
    /// Wakes the sender thread (waiting on `state`): a datagram was queued, or
    /// the socket closed.
    wake: Condvar,
    /// Set, under the `state` lock, when the [`WanSocket`] is dropped; the sender
    /// thread then exits.
    closed: AtomicBool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, SendState> {
        // Every critical section leaves the state consistent before any call that
        // could panic, so a poisoned lock still guards valid data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct SendState {
    /// Loss and jitter draws.
    rng: Rng,
    /// Delayed datagrams by (release time, sequence). Because each destination's
    /// release times never decrease and the sequence breaks ties in send order,
    /// popping this one heap yields every destination's datagrams in FIFO order.
    queue: BinaryHeap<Reverse<Queued>>,
    /// Per destination with datagrams queued or being sent: how many, and the
    /// latest release time. Entries are removed at zero, so the map stays as small
    /// as the set of destinations with traffic in flight.
    pending: HashMap<SocketAddr, Pending>,
    /// Sum of queued datagram sizes, bounded by [`WAN_QUEUE_BYTES_MAX`].
    queued_bytes: usize,
    /// Tie-breaker for equal release times: the send order.
    next_seq: u64,
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    count: usize,
    last_release: Instant,
}

#[derive(Debug)]
struct Queued {
    release_at: Instant,
    seq: u64,
    destination: SocketAddr,
    ecn: Option<EcnCodepoint>,
    src_ip: Option<IpAddr>,
    segment_size: Option<usize>,
    contents: Vec<u8>,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.release_at, self.seq) == (other.release_at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.release_at, self.seq).cmp(&(other.release_at, other.seq))
    }
}

/// What `try_send` decided for one datagram.
enum Verdict {
    Drop,
    SendNow,
    Queued,
}

impl WanSocket {
    fn decide(&self, transmit: &Transmit<'_>) -> Verdict {
        let rule = self.shared.control.rule_for(transmit.destination);
        let counters = &self.shared.control.counters;
        if rule.partitioned {
            bump(&counters.dropped_partition);
            return Verdict::Drop;
        }
        if !rule.is_transparent() && transmit.contents.len() > WAN_PATH_PAYLOAD_MAX {
            bump(&counters.dropped_too_big);
            return Verdict::Drop;
        }
        let mut state = self.shared.state();
        let loss = rule.loss_probability();
        if loss > 0.0 && state.rng.next_f64() < loss {
            bump(&counters.dropped_loss);
            return Verdict::Drop;
        }
        let pending = state.pending.get(&transmit.destination).copied();
        if rule.is_transparent() && pending.is_none() {
            // Nothing queued toward this destination: sending now keeps order.
            return Verdict::SendNow;
        }
        if state.queued_bytes + transmit.contents.len() > WAN_QUEUE_BYTES_MAX {
            bump(&counters.dropped_queue_full);
            return Verdict::Drop;
        }
        let jitter_ns = u64::try_from(rule.jitter.as_nanos()).unwrap_or(u64::MAX);
        let jitter = Duration::from_nanos(state.rng.next_u64_inclusive(jitter_ns));
        let now = Instant::now();
        let target = now
            .checked_add(rule.delay.saturating_add(jitter))
            .unwrap_or(now);
        let release_at = pending.map_or(target, |p| p.last_release.max(target));
        state.pending.insert(
            transmit.destination,
            Pending {
                count: pending.map_or(0, |p| p.count) + 1,
                last_release: release_at,
            },
        );
        let seq = state.next_seq;
        state.next_seq += 1;
        state.queued_bytes += transmit.contents.len();
        state.queue.push(Reverse(Queued {
            release_at,
            seq,
            destination: transmit.destination,
            ecn: transmit.ecn,
            src_ip: transmit.src_ip,
            segment_size: transmit.segment_size,
            contents: transmit.contents.to_vec(),
        }));
        bump(&counters.delayed);
        Verdict::Queued
    }
}

impl AsyncUdpSocket for WanSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        // Only immediate sends can block, and they go to the real socket.
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        match self.decide(transmit) {
            // A dropped datagram is "sent" as far as quinn knows: that is loss.
            Verdict::Drop => Ok(()),
            Verdict::SendNow => {
                self.inner.try_send(transmit)?;
                bump(&self.shared.control.counters.sent);
                Ok(())
            }
            Verdict::Queued => {
                self.shared.wake.notify_one();
                Ok(())
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// One datagram per transmit (no GSO batches), so that loss and delay apply
    /// per datagram as on a real link. Loopback clusters do not need GSO's speed.
    fn max_transmit_segments(&self) -> usize {
        1
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

impl Drop for WanSocket {
    fn drop(&mut self) {
        // Under the lock, so the sender cannot miss it between its check and its
        // wait.
        let state = self.shared.state();
        self.shared.closed.store(true, Ordering::Release);
        drop(state);
        self.shared.wake.notify_one();
    }
}

/// The sender thread: releases queued datagrams at their release times.
fn run_sender(shared: &Shared, inner: &dyn AsyncUdpSocket) {
    let mut state = shared.state();
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        match state.queue.peek().map(|q| q.0.release_at) {
            None => {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            // A newly queued datagram to another destination may be due
            // earlier, so a wake-up also ends the wait.
            Some(at) if at > now => {
                state = shared
                    .wake
                    .wait_timeout(state, at - now)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
            Some(_) => {
                let Some(Reverse(datagram)) = state.queue.pop() else {
                    continue;
                };
                drop(state);
                release(shared, inner, &datagram);
                state = shared.state();
                state.queued_bytes = state.queued_bytes.saturating_sub(datagram.contents.len());
                // Counted down only after the send, so an immediate send to the
                // same destination cannot overtake this one.
                if let Some(p) = state.pending.get_mut(&datagram.destination) {
                    p.count = p.count.saturating_sub(1);
                    if p.count == 0 {
                        state.pending.remove(&datagram.destination);
                    }
                }
            }
        }
    }
}

/// How long a release retries a full socket buffer before dropping the datagram
/// (as loss, which QUIC recovers from): 20,000 × 50 µs = 1 s.
const SEND_RETRIES_MAX: u32 = 20_000;

/// Sends one due datagram (unless a partition began meanwhile).
fn release(shared: &Shared, inner: &dyn AsyncUdpSocket, datagram: &Queued) {
    let counters = &shared.control.counters;
    if shared.control.rule_for(datagram.destination).partitioned {
        bump(&counters.dropped_partition);
        return;
    }
    let transmit = Transmit {
        destination: datagram.destination,
        ecn: datagram.ecn,
        contents: &datagram.contents,
        segment_size: datagram.segment_size,
        src_ip: datagram.src_ip,
    };
    for _ in 0..SEND_RETRIES_MAX {
        match inner.try_send(&transmit) {
            Ok(()) => {
                bump(&counters.sent);
                return;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(50));
            }
            Err(e) => {
                // quinn treats send errors as loss too; so do we.
                tracing::debug!(error = %e, dest = %datagram.destination, "WAN emulator: send failed");
                return;
            }
        }
    }
    tracing::debug!(dest = %datagram.destination, "WAN emulator: socket full for 1 s, datagram dropped");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn rules_default_and_per_link() {
        let control = WanControl::new();
        control.set_default(LinkRule::delay(Duration::from_millis(5)));
        control.set_delay(addr(1), Duration::from_millis(30));
        control.partition(addr(2));
        assert_eq!(control.rule_for(addr(1)).delay, Duration::from_millis(30));
        assert!(!control.rule_for(addr(1)).partitioned);
        // partition() starts from the default and changes only the partition flag.
        assert_eq!(control.rule_for(addr(2)).delay, Duration::from_millis(5));
        assert!(control.rule_for(addr(2)).partitioned);
        control.heal(addr(2));
        assert!(!control.rule_for(addr(2)).partitioned);
        control.clear_link(addr(1));
        assert_eq!(control.rule_for(addr(1)).delay, Duration::from_millis(5));
        // Clones share the rules.
        let clone = control.clone();
        clone.partition(addr(3));
        assert!(control.rule_for(addr(3)).partitioned);
    }

    #[test]
    fn loss_is_clamped() {
        let rule = |loss| LinkRule {
            loss,
            ..LinkRule::default()
        };
        assert_eq!(rule(f64::NAN).loss_probability(), 0.0);
        assert_eq!(rule(-1.0).loss_probability(), 0.0);
        assert_eq!(rule(2.0).loss_probability(), 1.0);
    }
}
