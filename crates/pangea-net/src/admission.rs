//! Which incoming connection attempts a replica takes on (RFC 9000 §8: address
//! validation; the anti-amplification rules are quinn's).
//!
//! A QUIC Initial costs a server a connection's state and a TLS handshake; a flood
//! of them, with no certificate needed, is the cheapest attack on a replica. So:
//! - Once [`AdmissionLimits::retry_above`] handshakes are in flight, an attempt
//!   from an address not yet validated gets a stateless **Retry**: the server keeps
//!   nothing, and only a client that really receives at its address comes back
//!   (with a token), so spoofed or fire-and-forget Initials cost one small packet.
//! - Handshakes in flight and open connections are capped, in total and per source
//!   address; attempts beyond a cap are **refused** (a CONNECTION_REFUSED close,
//!   no state kept).
//! - A handshake must finish within [`HANDSHAKE_TIME_MAX`] (the node enforces it).
//!
//! [`Admission::admit`] decides from the source address and whether it is
//! validated; the guards it hands out give their slot back when dropped, so every
//! path (handshake failed, timed out, connection closed) releases it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Longest a handshake may take before the replica gives up on it.
pub const HANDSHAKE_TIME_MAX: Duration = Duration::from_secs(5);

/// The caps (node settings `handshakes_max`, …; docs/operations.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Handshakes in flight beyond which unvalidated addresses get a Retry.
    pub retry_above: usize,
    /// Handshakes in flight, in total.
    pub handshakes_max: usize,
    /// Handshakes in flight from one source address.
    pub handshakes_per_source_max: usize,
    /// Open connections (handshake done), in total.
    pub connections_max: usize,
    /// Open connections from one source address.
    pub connections_per_source_max: usize,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            retry_above: 64,
            handshakes_max: 512,
            handshakes_per_source_max: 128,
            connections_max: 8_192,
            connections_per_source_max: 1_024,
        }
    }
}

/// What to do with a connection attempt.
#[derive(Debug)]
pub enum Verdict {
    /// Take it on; the guard holds its handshake slot.
    Accept(HandshakeGuard),
    /// Answer with a stateless Retry (address validation).
    Retry,
    /// Refuse it; the reason names the cap (a metrics label).
    Refuse(&'static str),
}

#[derive(Debug, Default)]
struct Counts {
    handshakes: usize,
    connections: usize,
    /// Per source address: (handshakes, connections); entries at (0, 0) removed.
    by_source: HashMap<IpAddr, (usize, usize)>,
}

/// The admission state of one endpoint.
#[derive(Debug)]
pub struct Admission {
    limits: AdmissionLimits,
    counts: Arc<Mutex<Counts>>,
}

impl Admission {
    pub fn new(limits: AdmissionLimits) -> Admission {
        Admission {
            limits,
            counts: Arc::default(),
        }
    }

    pub fn limits(&self) -> AdmissionLimits {
        self.limits
    }

    /// Handshakes and connections in flight now.
    pub fn in_flight(&self) -> (usize, usize) {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        (c.handshakes, c.connections)
    }

    /// Decides on an attempt from `source`; `validated`: the address was proven by
    /// a Retry token; `may_retry`: a Retry can still be sent (not after one).
    pub fn admit(&self, source: IpAddr, validated: bool, may_retry: bool) -> Verdict {
        let l = self.limits;
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if !validated && may_retry && c.handshakes >= l.retry_above {
            return Verdict::Retry;
        }
        let (hs, conns) = c.by_source.get(&source).copied().unwrap_or_default();
        let refused = if c.handshakes >= l.handshakes_max {
            Some("handshakes")
        } else if hs >= l.handshakes_per_source_max {
            Some("handshakes_per_source")
        } else if c.connections >= l.connections_max {
            Some("connections")
        } else if conns >= l.connections_per_source_max {
            Some("connections_per_source")
        } else {
            None
        };
        if let Some(reason) = refused {
            return Verdict::Refuse(reason);
        }
        c.handshakes += 1;
        c.by_source.entry(source).or_default().0 += 1;
        Verdict::Accept(HandshakeGuard {
            counts: self.counts.clone(),
            source,
            done: false,
        })
    }
}

/// A handshake slot: given back on drop, or turned into a connection slot.
#[derive(Debug)]
pub struct HandshakeGuard {
    counts: Arc<Mutex<Counts>>,
    source: IpAddr,
    done: bool,
}

impl HandshakeGuard {
    /// The handshake finished: its slot becomes a connection slot.
    pub fn connected(mut self) -> ConnectionGuard {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.handshakes = c.handshakes.saturating_sub(1);
        c.connections += 1;
        let e = c.by_source.entry(self.source).or_default();
        e.0 = e.0.saturating_sub(1);
        e.1 += 1;
        drop(c);
        self.done = true;
        ConnectionGuard {
            counts: self.counts.clone(),
            source: self.source,
        }
    }
}

impl Drop for HandshakeGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.handshakes = c.handshakes.saturating_sub(1);
        release(&mut c, self.source, |e| e.0 = e.0.saturating_sub(1));
    }
}

/// An open connection's slot, given back on drop.
#[derive(Debug)]
pub struct ConnectionGuard {
    counts: Arc<Mutex<Counts>>,
    source: IpAddr,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.connections = c.connections.saturating_sub(1);
        release(&mut c, self.source, |e| e.1 = e.1.saturating_sub(1));
    }
}

fn release(c: &mut Counts, source: IpAddr, f: impl FnOnce(&mut (usize, usize))) {
    if let Some(e) = c.by_source.get_mut(&source) {
        f(e);
        if *e == (0, 0) {
            c.by_source.remove(&source);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn limits() -> AdmissionLimits {
        AdmissionLimits {
            retry_above: 2,
            handshakes_max: 4,
            handshakes_per_source_max: 3,
            connections_max: 5,
            connections_per_source_max: 2,
        }
    }

    #[test]
    fn retry_once_handshakes_pile_up_then_caps() {
        let a = Admission::new(limits());
        let mut held = Vec::new();
        for _ in 0..2 {
            match a.admit(ip(1), false, true) {
                Verdict::Accept(g) => held.push(g),
                other => panic!("{other:?}"),
            }
        }
        // Two in flight: unvalidated addresses get a Retry (no state kept)...
        assert!(matches!(a.admit(ip(9), false, true), Verdict::Retry));
        assert_eq!(a.in_flight(), (2, 0));
        // ... validated ones are taken on, up to the caps.
        match a.admit(ip(1), true, false) {
            Verdict::Accept(g) => held.push(g),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.admit(ip(1), true, false),
            Verdict::Refuse("handshakes_per_source")
        ));
        match a.admit(ip(2), true, false) {
            Verdict::Accept(g) => held.push(g),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            a.admit(ip(3), true, false),
            Verdict::Refuse("handshakes")
        ));
        // An attempt that cannot be retried any more is judged by the caps.
        assert!(matches!(
            a.admit(ip(3), false, false),
            Verdict::Refuse("handshakes")
        ));
        drop(held);
        assert_eq!(a.in_flight(), (0, 0));
    }

    #[test]
    fn guards_give_their_slots_back_on_every_path() {
        let a = Admission::new(limits());
        let Verdict::Accept(h1) = a.admit(ip(1), true, false) else {
            panic!("accepted")
        };
        let Verdict::Accept(h2) = a.admit(ip(1), true, false) else {
            panic!("accepted")
        };
        let c1 = h1.connected();
        assert_eq!(a.in_flight(), (1, 1));
        drop(h2); // a handshake that failed
        assert_eq!(a.in_flight(), (0, 1));
        let Verdict::Accept(h3) = a.admit(ip(1), true, false) else {
            panic!("accepted")
        };
        let c3 = h3.connected();
        // Two connections from ip(1): its per-source cap.
        assert!(matches!(
            a.admit(ip(1), true, false),
            Verdict::Refuse("connections_per_source")
        ));
        assert!(matches!(a.admit(ip(2), true, false), Verdict::Accept(_)));
        drop((c1, c3));
        assert_eq!(a.in_flight(), (0, 0));
        assert!(a.counts.lock().unwrap().by_source.is_empty());
    }

    #[test]
    fn the_total_connection_cap_holds() {
        let a = Admission::new(AdmissionLimits {
            connections_max: 3,
            connections_per_source_max: 10,
            ..limits()
        });
        let conns: Vec<ConnectionGuard> = (0..3)
            .map(|i| match a.admit(ip(i), true, false) {
                Verdict::Accept(h) => h.connected(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(matches!(
            a.admit(ip(7), true, false),
            Verdict::Refuse("connections")
        ));
        drop(conns);
        assert!(matches!(a.admit(ip(7), true, false), Verdict::Accept(_)));
    }
}
