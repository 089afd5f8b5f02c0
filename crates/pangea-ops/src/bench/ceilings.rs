//! This machine's ceilings for one core (`pangea bench-ceilings`): what the
//! serving path's per-byte and per-datagram work can reach at most, so that a
//! serving figure can be read as a fraction of its limit (docs/benchmarks.md,
//! "Ceilings").
//!
//! - **AEAD**: AES-128-GCM and ChaCha20-Poly1305 seals with ring (the provider
//!   rustls and quinn use here), in place, at the QUIC packet sizes the
//!   transport sends: 1,200 bytes (quinn's initial MTU), 1,452 (its path-MTU
//!   discovery's default upper bound) and 8,952 (a jumbo-frame path);
//! - **memcpy**: copying 1 KiB and 100 KiB values;
//! - **UDP over loopback**: one thread sends datagrams of those sizes through
//!   `quinn-udp` (as quinn does: GSO when the kernel has it, so one `sendmsg`
//!   carries up to `max_gso_segments` datagrams), another receives them (GRO
//!   when the kernel has it). Each side's rate is counted against its own
//!   thread's CPU time: the datagrams one core can send, or receive, a second.
//!
//! Every figure is bytes (or datagrams) over the CPU time of the thread that did
//! the work, so a second core busy elsewhere does not flatter it.

use anyhow::{Context, Result};
use quinn::udp::{RecvMeta, Transmit, UdpSocketState};
use ring::aead::{AES_128_GCM, Aad, CHACHA20_POLY1305, LessSafeKey, Nonce, UnboundKey};
use serde::Serialize;
use std::hint::black_box;
use std::io::IoSliceMut;
use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// QUIC packet sizes the transport sends.
pub const PACKET_SIZES: [usize; 3] = [1_200, 1_452, 8_952];
/// Value sizes of the serving benchmarks.
pub const VALUE_SIZES: [usize; 2] = [1_024, 102_400];

#[derive(Debug, Clone)]
pub struct Options {
    /// How long each figure is measured for.
    pub each: Duration,
}

/// One ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    pub what: String,
    pub size: usize,
    /// Items (seals, copies, datagrams) per second of the working thread's CPU.
    pub per_cpu_s: f64,
    /// Bytes per second of the working thread's CPU.
    pub bytes_per_cpu_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub rates: Vec<Rate>,
    /// Datagrams `quinn-udp` may put in one send (1: no GSO).
    pub max_gso_segments: usize,
    /// Datagrams the kernel may hand over in one receive (1: no GRO).
    pub gro_segments: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "ceilings for one core (per second of the working thread's CPU); \
             GSO up to {} datagrams a send, GRO up to {} a receive",
            self.max_gso_segments, self.gro_segments
        )?;
        writeln!(
            f,
            "{:<34} {:>7} {:>14} {:>12}",
            "work", "bytes", "items/s", "MB/s"
        )?;
        for r in &self.rates {
            writeln!(
                f,
                "{:<34} {:>7} {:>14.0} {:>12.0}",
                r.what,
                r.size,
                r.per_cpu_s,
                r.bytes_per_cpu_s / 1e6
            )?;
        }
        Ok(())
    }
}

/// Measures every ceiling, one after another.
pub fn run(o: &Options) -> Result<Report> {
    let mut rates = Vec::new();
    for (name, alg) in [
        ("seal AES-128-GCM", &AES_128_GCM),
        ("seal ChaCha20-Poly1305", &CHACHA20_POLY1305),
    ] {
        for size in PACKET_SIZES {
            rates.push(seal(name, alg, size, o.each)?);
        }
    }
    for size in VALUE_SIZES {
        rates.push(copy(size, o.each));
    }
    let probe = UdpSocket::bind("127.0.0.1:0")?;
    let state = UdpSocketState::new((&probe).into())?;
    let (max_gso_segments, gro_segments) = (state.max_gso_segments(), state.gro_segments());
    for size in PACKET_SIZES {
        rates.extend(udp(size, o.each)?);
    }
    Ok(Report {
        rates,
        max_gso_segments,
        gro_segments,
    })
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(Duration::ZERO, Duration::from)
}

/// Runs `step` (which does `items` items of `bytes` bytes) until `each` has
/// passed; the rate over this thread's CPU time.
fn rate(what: String, size: usize, each: Duration, mut step: impl FnMut() -> u64) -> Rate {
    let (start, cpu0) = (Instant::now(), thread_cpu());
    let mut items = 0u64;
    while start.elapsed() < each {
        for _ in 0..64 {
            items += step();
        }
    }
    let cpu = (thread_cpu() - cpu0).as_secs_f64().max(1e-9);
    Rate {
        what,
        size,
        per_cpu_s: items as f64 / cpu,
        bytes_per_cpu_s: (items * size as u64) as f64 / cpu,
    }
}

fn seal(
    name: &str,
    alg: &'static ring::aead::Algorithm,
    size: usize,
    each: Duration,
) -> Result<Rate> {
    let key = vec![7u8; alg.key_len()];
    let key = LessSafeKey::new(UnboundKey::new(alg, &key).map_err(|_| anyhow::anyhow!("key"))?);
    let mut packet = vec![0x5au8; size];
    let mut n = 0u64;
    Ok(rate(name.to_owned(), size, each, || {
        n += 1;
        let mut nonce = [0u8; 12];
        nonce[4..].copy_from_slice(&n.to_be_bytes());
        // A QUIC packet: its header authenticated, its payload sealed.
        let (header, payload) = packet.split_at_mut(20.min(size));
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&header[..]),
                payload,
            )
            .expect("a packet is far below the limit");
        let _ = black_box(tag);
        1
    }))
}

fn copy(size: usize, each: Duration) -> Rate {
    let from = vec![0x5au8; size];
    let mut to = vec![0u8; size];
    rate(
        format!("memcpy of a {} KiB value", size / 1024),
        size,
        each,
        || {
            to.copy_from_slice(black_box(&from));
            black_box(&mut to);
            1
        },
    )
}

/// Datagrams of `size` over loopback: the sender's rate (per its CPU) and the
/// receiver's (per its own), with GSO and GRO as quinn-udp uses them.
fn udp(size: usize, each: Duration) -> Result<Vec<Rate>> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let to = rx.local_addr()?;
    rx.set_read_timeout(Some(Duration::from_millis(100)))?;
    let rx_state = UdpSocketState::new((&rx).into())?;
    let tx_state = UdpSocketState::new((&tx).into())?;
    // Room for bursts: a receiver a little behind drops rather than blocks.
    let _ = rx_state.set_recv_buffer_size((&rx).into(), 8 << 20);
    let _ = tx_state.set_send_buffer_size((&tx).into(), 8 << 20);
    let stop = Arc::new(AtomicBool::new(false));
    let receiver = {
        let stop = stop.clone();
        std::thread::spawn(move || -> (u64, u64, Duration) {
            let mut buf = vec![0u8; 64 * 1024];
            let (mut datagrams, mut bytes) = (0u64, 0u64);
            let cpu0 = thread_cpu();
            while !stop.load(Ordering::Relaxed) {
                let mut meta = [RecvMeta::default()];
                let mut bufs = [IoSliceMut::new(&mut buf)];
                if let Ok(n) = rx_state.recv((&rx).into(), &mut bufs, &mut meta)
                    && n > 0
                {
                    let m = &meta[0];
                    bytes += m.len as u64;
                    datagrams += (m.len as u64).div_ceil(m.stride.max(1) as u64);
                }
            }
            (datagrams, bytes, thread_cpu() - cpu0)
        })
    };
    // A send carries at most 64 KiB however many segments GSO allows.
    let segments = tx_state.max_gso_segments().min(65_000 / size).max(1);
    let burst = vec![0x5au8; size * segments];
    let (start, cpu0) = (Instant::now(), thread_cpu());
    let mut sent = 0u64;
    while start.elapsed() < each {
        let t = Transmit {
            destination: to,
            ecn: None,
            contents: &burst,
            segment_size: (segments > 1).then_some(size),
            src_ip: None,
        };
        // `try_send`: `send` logs and swallows errors quinn recovers from.
        match tx_state.try_send((&tx).into(), &t) {
            Ok(()) => sent += segments as u64,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(e) => return Err(e).context("sending over loopback"),
        }
    }
    let tx_cpu = (thread_cpu() - cpu0).as_secs_f64().max(1e-9);
    std::thread::sleep(Duration::from_millis(50));
    stop.store(true, Ordering::Relaxed);
    let (received, rx_bytes, rx_cpu) = receiver
        .join()
        .map_err(|_| anyhow::anyhow!("the receiving thread panicked"))?;
    let rx_cpu = rx_cpu.as_secs_f64().max(1e-9);
    Ok(vec![
        Rate {
            what: format!("UDP send, {segments} a sendmsg"),
            size,
            per_cpu_s: sent as f64 / tx_cpu,
            bytes_per_cpu_s: (sent * size as u64) as f64 / tx_cpu,
        },
        Rate {
            what: "UDP receive".into(),
            size,
            per_cpu_s: received as f64 / rx_cpu,
            bytes_per_cpu_s: rx_bytes as f64 / rx_cpu,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ceiling comes out as a positive rate, UDP's both ways.
    #[test]
    fn every_ceiling_is_measured() {
        let r = run(&Options {
            each: Duration::from_millis(30),
        })
        .unwrap();
        assert_eq!(r.rates.len(), 2 * 3 + 2 + 2 * 3);
        for rate in &r.rates {
            assert!(
                rate.per_cpu_s > 0.0 && rate.bytes_per_cpu_s > 0.0,
                "{rate:?}"
            );
        }
        assert!(r.max_gso_segments >= 1);
    }
}
