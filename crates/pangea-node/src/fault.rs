//! Runtime fault injection for drills on real processes (`pangea cluster nemesis`).
//!
//! Only a replica started with `fault_injection` (`pangea start --fault-injection`,
//! `pangea cluster up --fault-injection`) has a [`FaultControl`]; every other replica
//! answers the admin endpoint's `/fault` routes with 403. It acts on two things the
//! replica already owns:
//!
//! - **Links**, through the WAN-emulation layer of its QUIC socket
//!   ([`pangea_net::wan`]): toward a peer, drop everything (a partition) or drop a
//!   fraction of datagrams (loss). Rules apply to *outgoing* datagrams, so a
//!   two-way partition between regions A and B is set on the replicas of both.
//!   Healing restores each link's base rule (the topology's delay when the replica
//!   emulates the WAN, none otherwise).
//! - **The clock**: an offset added to the wall clock the hybrid logical clock reads
//!   ([`crate::clock::Clock`]), as if the host's time source were that far off.
//! - **The disk**: the free space the replica reads of its data directory forced to
//!   0, so it behaves as on a full disk ([`crate::disk`]: writes refused, replicated
//!   entries held back, reads served) without filling a real one.
//!
//! The routes (see `admin.rs`), with parameters in the query string:
//!
//! - `GET /fault`: the current rules, the clock offset and the WAN counters.
//! - `POST /fault/link?peers=ID,ID&partitioned=true&loss=0.3`: sets the rule toward
//!   each peer to its base rule with the given partition flag and loss (each
//!   optional; absent means off).
//! - `POST /fault/clock?offset_ms=N`: sets the clock offset (ms, may be negative).
//! - `POST /fault/disk?full=true|false`: the disk reads as full, or as it is.
//! - `POST /fault/heal`: every link back to its base rule, clock offset 0, the disk
//!   as it is.
//!
//! Peers are the other replicas (and processes) of the topology in force: one
//! added by a live topology change (`topology apply`, a resize) gets its
//! healthy rule when the replica reloads ([`Links::learn`]), and can be targeted
//! from then on.

use crate::clock::Clock;
use crate::disk::Disk;
use pangea_net::wan::{LinkRule, WanControl};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

/// Largest clock offset a drill may inject: a day. Beyond it the wall clock plus
/// offset could leave the range the hybrid clock encodes.
pub const CLOCK_OFFSET_MS_MAX: i64 = 86_400_000;

/// Why a fault request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultError {
    /// This replica was started without fault injection.
    Disabled,
    /// A parameter is missing, unknown or malformed; the message names it.
    BadRequest(String),
}

/// The emulated links of a replica's QUIC socket: each peer's address and the
/// rule it has when healthy (the topology's delay when the replica emulates the
/// WAN, none otherwise).
#[derive(Debug)]
pub struct Links {
    wan: WanControl,
    emulate_wan: bool,
    base: Mutex<BTreeMap<String, (SocketAddr, LinkRule)>>,
}

impl Links {
    pub fn new(wan: WanControl, emulate_wan: bool) -> Links {
        Links {
            wan,
            emulate_wan,
            base: Mutex::new(BTreeMap::new()),
        }
    }

    /// Sets the healthy rule toward every replica of `d` (but `me`) this one has
    /// no rule for yet: at start, and after a reload that adds replicas or
    /// processes. Known peers keep their rule (a fault in force stays).
    pub fn learn(&self, d: &pangea_topology::Deployment, me: &pangea_topology::ReplicaId) {
        let mut base = self.base();
        for r in d.topology.replicas.values().filter(|r| r.id != *me) {
            if base.contains_key(r.id.as_str()) {
                continue;
            }
            let Some(addr) = r.address.as_deref().and_then(|a| a.parse().ok()) else {
                continue;
            };
            let rtt_ms = if self.emulate_wan {
                d.topology.rtt_ms(me, &r.id).unwrap_or(0.0)
            } else {
                0.0
            };
            let rule = LinkRule::delay(std::time::Duration::from_micros((rtt_ms * 500.0) as u64));
            self.wan.set_link(addr, rule);
            base.insert(r.id.to_string(), (addr, rule));
        }
    }

    /// The emulator's control, which the socket's [`pangea_net::wan::WanEmulator`]
    /// reads.
    pub fn control(&self) -> &WanControl {
        &self.wan
    }

    fn base(&self) -> MutexGuard<'_, BTreeMap<String, (SocketAddr, LinkRule)>> {
        self.base.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The faults one replica can inject into itself.
#[derive(Debug)]
pub struct FaultControl {
    links: Arc<Links>,
    wan: WanControl,
    clock: Arc<Clock>,
    disk: Arc<Disk>,
}

impl FaultControl {
    pub fn new(links: Arc<Links>, clock: Arc<Clock>, disk: Arc<Disk>) -> Self {
        Self {
            wan: links.wan.clone(),
            links,
            clock,
            disk,
        }
    }

    /// Runs one route: `action` is the path after `/fault` ("", "/link", "/clock",
    /// "/heal"), `query` the raw query string.
    pub fn handle(&self, action: &str, query: &str) -> Result<serde_json::Value, FaultError> {
        let params = parse_query(query)?;
        let allowed: &[&str] = match action {
            "" | "/heal" => &[],
            "/link" => &["peers", "partitioned", "loss"],
            "/clock" => &["offset_ms"],
            "/disk" => &["full"],
            other => return Err(bad(format!("unknown fault route /fault{other}"))),
        };
        if let Some(k) = params.keys().find(|k| !allowed.contains(k)) {
            return Err(bad(format!(
                "unknown parameter {k:?} for /fault{action} (expected one of {allowed:?})"
            )));
        }
        match action {
            "/link" => self.set_links(&params)?,
            "/clock" => {
                let offset: i64 = parse(&params, "offset_ms")?
                    .ok_or_else(|| bad("offset_ms is required".into()))?;
                if offset.abs() > CLOCK_OFFSET_MS_MAX {
                    return Err(bad(format!(
                        "offset_ms {offset} is beyond ±{CLOCK_OFFSET_MS_MAX}"
                    )));
                }
                tracing::warn!(offset_ms = offset, "fault injection: clock offset set");
                self.clock.set_offset_ms(offset);
            }
            "/disk" => {
                let full: bool =
                    parse(&params, "full")?.ok_or_else(|| bad("full is required".into()))?;
                tracing::warn!(full, "fault injection: disk reads as full");
                self.disk.force_full(full);
            }
            "/heal" => {
                for (addr, rule) in self.links.base().values() {
                    self.wan.set_link(*addr, *rule);
                }
                self.clock.set_offset_ms(0);
                self.disk.force_full(false);
                tracing::warn!("fault injection: healed (links, clock, disk)");
            }
            _ => {}
        }
        Ok(self.state())
    }

    fn set_links(&self, params: &BTreeMap<&str, &str>) -> Result<(), FaultError> {
        let peers = params
            .get("peers")
            .ok_or_else(|| bad("peers is required (comma-separated replica ids)".into()))?;
        let partitioned: bool = parse(params, "partitioned")?.unwrap_or(false);
        let loss: f64 = parse(params, "loss")?.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&loss) {
            return Err(bad(format!("loss {loss} is outside [0, 1]")));
        }
        // Every id checked before any rule changes: a typo changes nothing.
        let mut targets = Vec::new();
        let known = self.links.base();
        for id in peers.split(',').filter(|s| !s.is_empty()) {
            let (addr, base) = known
                .get(id)
                .ok_or_else(|| bad(format!("peers: {id:?} is not a peer of this replica")))?;
            targets.push((id, *addr, *base));
        }
        drop(known);
        for (id, addr, base) in targets {
            tracing::warn!(peer = id, partitioned, loss, "fault injection: link rule");
            self.wan.set_link(
                addr,
                LinkRule {
                    partitioned,
                    loss,
                    ..base
                },
            );
        }
        Ok(())
    }

    /// The rules in force, for `GET /fault` and every answer.
    pub fn state(&self) -> serde_json::Value {
        let links: serde_json::Map<String, serde_json::Value> = self
            .links
            .base()
            .iter()
            .map(|(id, (addr, _))| {
                let r = self.wan.rule_for(*addr);
                let v = serde_json::json!({
                    "delay_ms": r.delay.as_secs_f64() * 1e3,
                    "loss": r.loss,
                    "partitioned": r.partitioned,
                });
                (id.clone(), v)
            })
            .collect();
        let stats = self.wan.stats();
        serde_json::json!({
            "clock_offset_ms": self.clock.offset_ms(),
            "disk_full": self.disk.forced_full(),
            "links": links,
            "wan": {
                "sent": stats.sent,
                "dropped_partition": stats.dropped_partition,
                "dropped_loss": stats.dropped_loss,
                "dropped_queue_full": stats.dropped_queue_full,
                "dropped_too_big": stats.dropped_too_big,
            },
        })
    }
}

fn bad(message: String) -> FaultError {
    FaultError::BadRequest(message)
}

/// `a=1&b=x` into a map; keys and values are plain (ids, numbers, booleans), so no
/// percent-decoding: a `%` is refused rather than misread.
fn parse_query(query: &str) -> Result<BTreeMap<&str, &str>, FaultError> {
    let mut out = BTreeMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if pair.contains('%') {
            return Err(bad(format!(
                "parameter {k:?}: percent-encoding is not accepted"
            )));
        }
        if out.insert(k, v).is_some() {
            return Err(bad(format!("parameter {k:?} is given twice")));
        }
    }
    Ok(out)
}

fn parse<T: std::str::FromStr>(
    params: &BTreeMap<&str, &str>,
    key: &str,
) -> Result<Option<T>, FaultError>
where
    T::Err: std::fmt::Display,
{
    params
        .get(key)
        .map(|v| {
            v.parse()
                .map_err(|e| bad(format!("parameter {key}={v:?}: {e}")))
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn control() -> (FaultControl, SocketAddr) {
        let wan = WanControl::new();
        let addr: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let base = LinkRule::delay(Duration::from_millis(40));
        wan.set_link(addr, base);
        let links = Links::new(wan, true);
        links.base().insert("euw1-a".to_string(), (addr, base));
        (
            FaultControl::new(
                Arc::new(links),
                Arc::new(Clock::default()),
                Arc::new(Disk::new(64 << 20)),
            ),
            addr,
        )
    }

    #[test]
    fn a_partition_keeps_the_base_delay_and_heal_restores_the_link_and_the_clock() {
        let (f, addr) = control();
        f.handle("/link", "peers=euw1-a&partitioned=true&loss=0.25")
            .unwrap();
        let r = f.wan.rule_for(addr);
        assert!(r.partitioned);
        assert_eq!(r.loss, 0.25);
        assert_eq!(r.delay, Duration::from_millis(40));
        f.handle("/clock", "offset_ms=-700").unwrap();
        assert_eq!(f.clock.offset_ms(), -700);
        let state = f.handle("/heal", "").unwrap();
        assert_eq!(
            f.wan.rule_for(addr),
            LinkRule::delay(Duration::from_millis(40))
        );
        assert_eq!(f.clock.offset_ms(), 0);
        assert_eq!(state["links"]["euw1-a"]["partitioned"], false);
    }

    #[test]
    fn the_disk_reads_full_until_healed() {
        let (f, _) = control();
        let state = f.handle("/disk", "full=true").unwrap();
        assert_eq!(state["disk_full"], true);
        // However much is free, the replica sees a full disk.
        assert!(f.disk.observe(1 << 40).is_some());
        assert!(f.disk.holding());
        f.handle("/heal", "").unwrap();
        assert!(!f.disk.forced_full());
        assert!(f.disk.observe(1 << 40).is_some());
        assert!(!f.disk.holding());
        assert!(matches!(
            f.handle("/disk", "full=maybe"),
            Err(FaultError::BadRequest(_))
        ));
    }

    #[test]
    fn bad_requests_name_the_parameter_and_change_nothing() {
        let (f, addr) = control();
        let before = f.wan.rule_for(addr);
        for (action, query, needle) in [
            ("/link", "peers=euw1-a,nope&partitioned=true", "\"nope\""),
            ("/link", "peers=euw1-a&loss=1.5", "loss 1.5"),
            (
                "/link",
                "peers=euw1-a&partitioned=yes",
                "partitioned=\"yes\"",
            ),
            ("/link", "partitioned=true", "peers is required"),
            ("/clock", "offset_ms=x", "offset_ms=\"x\""),
            ("/clock", "offset_ms=99999999999", "beyond"),
            ("/clock", "offset_ms=1&offset_ms=2", "twice"),
            ("/clock", "skew=1", "unknown parameter \"skew\""),
            ("/link", "peers=euw1%2Da", "percent"),
            ("/reboot", "", "unknown fault route"),
        ] {
            match f.handle(action, query) {
                Err(FaultError::BadRequest(m)) => {
                    assert!(m.contains(needle), "{action}?{query}: {m}")
                }
                other => panic!("{action}?{query}: {other:?}"),
            }
        }
        assert_eq!(f.wan.rule_for(addr), before);
        assert_eq!(f.clock.offset_ms(), 0);
    }
}
