//! The congestion controller: quinn's CUBIC, with an initial window of ten packets
//! of the path's own size.
//!
//! quinn sizes CUBIC's initial window in bytes once, at the connection's start,
//! from its smallest packet: 12,000 bytes. Path-MTU discovery then raises a
//! loopback or jumbo-frame path's packets to [`crate::tls::MTU_UPPER_BOUND`]
//! (8,952 bytes), and the window stays 12,000 bytes: a packet and a third. A cold
//! 100 KiB read then takes several round trips of slow start, and a receiver that
//! acknowledges only every few packets ([`crate::tls::ACK_ELICITING_THRESHOLD`])
//! holds each of those round trips until its delayed-ACK timer fires.
//!
//! TCP counts its initial window in segments, ten of them (RFC 6928) whatever the
//! segment size. [`TenPackets`] does the same: until its first loss, while CUBIC is
//! still in slow start and its window is the initial one plus every byte
//! acknowledged since, a new packet size swaps the initial part for ten packets of
//! that size and keeps the bytes acknowledged (the handshake's, typically: path-MTU
//! discovery starts once the handshake is done). A WAN path that stays at 1,452
//! bytes starts from 14,520 bytes, RFC 9002's 14,720 within a packet; a path that
//! carries jumbo packets from 89,520.

use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

use quinn::congestion::{Controller, ControllerFactory, ControllerMetrics, Cubic, CubicConfig};
use quinn_proto::RttEstimator;

/// Packets in the initial congestion window (RFC 6928's ten segments).
pub const INITIAL_WINDOW_PACKETS: u64 = 10;

/// The initial congestion window for packets of `mtu` bytes.
pub fn initial_window(mtu: u16) -> u64 {
    INITIAL_WINDOW_PACKETS * u64::from(mtu)
}

/// Builds [`TenPackets`] controllers (a `TransportConfig`'s
/// `congestion_controller_factory`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TenPacketsFactory;

impl ControllerFactory for TenPacketsFactory {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(TenPackets::new(now, current_mtu))
    }
}

/// CUBIC whose initial window follows the packet size until its first loss.
#[derive(Debug, Clone)]
pub struct TenPackets {
    cubic: Cubic,
    /// The initial window of the packet size the controller was last built for.
    initial: u64,
    /// Whether a loss (or congestion mark) has reached the controller: from then
    /// on CUBIC has left slow start and the window is its own.
    lost: bool,
    created: Instant,
}

impl TenPackets {
    pub fn new(now: Instant, mtu: u16) -> TenPackets {
        TenPackets {
            cubic: cubic(now, initial_window(mtu), mtu),
            initial: initial_window(mtu),
            lost: false,
            created: now,
        }
    }
}

fn cubic(now: Instant, window: u64, mtu: u16) -> Cubic {
    let mut config = CubicConfig::default();
    config.initial_window(window);
    Cubic::new(Arc::new(config), now, mtu)
}

impl Controller for TenPackets {
    fn on_sent(&mut self, now: Instant, bytes: u64, last_packet_number: u64) {
        self.cubic.on_sent(now, bytes, last_packet_number);
    }

    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.cubic.on_ack(now, sent, bytes, app_limited, rtt);
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        app_limited: bool,
        largest_packet_num_acked: Option<u64>,
    ) {
        self.cubic
            .on_end_acks(now, in_flight, app_limited, largest_packet_num_acked);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.lost = true;
        self.cubic
            .on_congestion_event(now, sent, is_persistent_congestion, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        if self.lost {
            self.cubic.on_mtu_update(new_mtu);
            return;
        }
        // Before any loss CUBIC is in slow start (its threshold is unset) and its
        // whole state is its window: the initial one plus the bytes acknowledged.
        // A fresh one from ten packets of the new size plus those bytes is the
        // controller this connection would have had with that size from the start.
        let acknowledged = self.cubic.window().saturating_sub(self.initial);
        self.initial = initial_window(new_mtu);
        self.cubic = cubic(self.created, self.initial + acknowledged, new_mtu);
    }

    fn window(&self) -> u64 {
        self.cubic.window()
    }

    fn metrics(&self) -> ControllerMetrics {
        self.cubic.metrics()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_window_is_ten_packets_of_the_path() {
        let now = Instant::now();
        let mut c = TenPackets::new(now, 1200);
        assert_eq!(c.window(), 12_000, "quinn's first packets are 1,200 bytes");
        c.on_mtu_update(1452);
        assert_eq!(c.window(), 14_520);
        c.on_mtu_update(8952);
        assert_eq!(c.window(), 89_520, "a jumbo path: ten jumbo packets");
        assert_eq!(c.initial_window(), 89_520);
    }

    #[test]
    fn after_a_loss_a_new_packet_size_is_cubics_to_weigh() {
        let now = Instant::now();
        let mut c = TenPackets::new(now, 1200);
        c.on_congestion_event(now, now, false, 1200);
        let after_loss = c.window();
        assert!(after_loss < 12_000, "CUBIC backs off: {after_loss}");
        c.on_mtu_update(8952);
        assert_eq!(
            c.window(),
            after_loss.max(2 * 8952),
            "after a loss the window is CUBIC's"
        );
    }
}
