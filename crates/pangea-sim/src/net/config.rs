//! Knobs of the WAN model and of runtime link overrides.

use crate::error::NetError;
use serde::Serialize;

/// Upper limit on [`NetConfig::retransmissions_max`]. With a loss override of 1 every
/// message loops this many times on the send path, so the cap keeps a bad setting
/// from stalling a run; 64 timeouts is also minutes of delay, far past any deadline.
pub const RETRANSMISSIONS_LIMIT: u32 = 64;

/// How the network turns a topology into delays. Plain data with documented defaults
/// (STYLE: config at the edge; drill files fill this in).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NetConfig {
    /// Jitter per message, drawn uniformly from `[0, jitter_fraction × one-way
    /// latency]`. Default 0.05: cloud WAN latencies sit within a few percent of their
    /// median most of the time. Zero makes every delay exact (handy in tests).
    pub jitter_fraction: f64,
    /// Retransmission timeout `rto = max(rto_rtt_factor × rtt, rto_min_ms)`, added
    /// once per lost transmission. Default factor 1.5: QUIC (RFC 9002) declares a
    /// packet lost after 9/8 of an RTT once later packets are acknowledged, and
    /// after a probe timeout of about RTT + 25 ms (max_ack_delay) at the tail of a
    /// burst; 1.5 × RTT sits between the two on WAN links.
    pub rto_rtt_factor: f64,
    /// Floor of the retransmission timeout. Default 10 ms: on sub-millisecond
    /// intra-region round trips, QUIC's timer granularity and ack delay dominate.
    pub rto_min_ms: f64,
    /// At most this many retransmissions of one message (≤ [`RETRANSMISSIONS_LIMIT`]).
    /// Losses are drawn per transmission; after this many the message goes through,
    /// since QUIC on a live connection never gives up on data. Default 10: with any
    /// realistic loss rate the cap is never reached.
    pub retransmissions_max: u32,
    /// Bandwidth shared by the traffic of each region with itself; `None` (default)
    /// means no limit: intra-region links are fast enough that WAN links dominate.
    pub intra_region_bandwidth_mbps: Option<f64>,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            jitter_fraction: 0.05,
            rto_rtt_factor: 1.5,
            rto_min_ms: 10.0,
            retransmissions_max: 10,
            intra_region_bandwidth_mbps: None,
        }
    }
}

impl NetConfig {
    /// The defaults without jitter: every delay is exactly computable.
    pub fn without_jitter() -> Self {
        NetConfig {
            jitter_fraction: 0.0,
            ..NetConfig::default()
        }
    }

    pub(crate) fn validate(&self) -> Result<(), NetError> {
        check_non_negative("jitter_fraction", self.jitter_fraction)?;
        check_non_negative("rto_rtt_factor", self.rto_rtt_factor)?;
        check_non_negative("rto_min_ms", self.rto_min_ms)?;
        if self.retransmissions_max > RETRANSMISSIONS_LIMIT {
            return Err(NetError::InvalidValue {
                field: "retransmissions_max",
                value: f64::from(self.retransmissions_max),
                expected: "at most RETRANSMISSIONS_LIMIT (64)",
            });
        }
        if let Some(bw) = self.intra_region_bandwidth_mbps {
            check_positive("intra_region_bandwidth_mbps", bw)?;
        }
        Ok(())
    }
}

/// A runtime change to the link between two regions (both directions), replacing
/// what the topology file says until [`crate::net::Network::restore_link`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LinkOverride {
    /// Added to the one-way latency of every message between the two regions (a
    /// congested or rerouted path). Also lengthens the retransmission timeout,
    /// which follows the round trip.
    pub extra_latency_ms: f64,
    /// Replaces the file's loss probability, in `[0, 1]`; `None` keeps it.
    pub loss: Option<f64>,
    /// Replaces the file's bandwidth; `None` keeps it (which may be no limit).
    pub bandwidth_mbps: Option<f64>,
}

impl LinkOverride {
    pub(crate) fn validate(&self) -> Result<(), NetError> {
        check_non_negative("extra_latency_ms", self.extra_latency_ms)?;
        if let Some(loss) = self.loss
            && !(0.0..=1.0).contains(&loss)
        {
            return Err(NetError::InvalidValue {
                field: "loss",
                value: loss,
                expected: "a probability in [0, 1]",
            });
        }
        if let Some(bw) = self.bandwidth_mbps {
            check_positive("bandwidth_mbps", bw)?;
        }
        Ok(())
    }
}

fn check_non_negative(field: &'static str, value: f64) -> Result<(), NetError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(NetError::InvalidValue {
            field,
            value,
            expected: "a finite number ≥ 0",
        })
    }
}

fn check_positive(field: &'static str, value: f64) -> Result<(), NetError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(NetError::InvalidValue {
            field,
            value,
            expected: "a finite number > 0",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        NetConfig::default().validate().unwrap();
        NetConfig::without_jitter().validate().unwrap();
        let bad = NetConfig {
            jitter_fraction: -0.1,
            ..NetConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(NetError::InvalidValue {
                field: "jitter_fraction",
                ..
            })
        ));
        let bad = NetConfig {
            retransmissions_max: 65,
            ..NetConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = LinkOverride {
            loss: Some(1.5),
            ..LinkOverride::default()
        };
        assert!(bad.validate().is_err());
        let bad = LinkOverride {
            bandwidth_mbps: Some(0.0),
            ..LinkOverride::default()
        };
        assert!(bad.validate().is_err());
        let bad = LinkOverride {
            extra_latency_ms: f64::NAN,
            ..LinkOverride::default()
        };
        assert!(bad.validate().is_err());
    }
}
