//! Batches of QUIC datagrams the kernel accepts at any path MTU.
//!
//! quinn hands its socket up to ten datagrams of the path's MTU in one transmit,
//! to go out in one `sendmsg` with segmentation offload (GSO). One UDP send carries
//! at most [`UDP_SEND_BYTES_MAX`] bytes, so once path-MTU discovery raises the MTU
//! past 6,550 bytes (a jumbo-frame link, loopback) a full batch is refused with
//! `EMSGSIZE`, and quinn counts its datagrams as lost (quinn-rs/quinn#2201): the
//! congestion window collapses and the black-hole detector drops the MTU back to
//! 1,200 bytes. [`GsoBatches`] splits such a transmit into batches of whole
//! datagrams that fit, each still one `sendmsg`.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

/// The most one UDP send may carry: 65,535 bytes of IPv4 datagram less its 20-byte
/// header and the 8-byte UDP header (IPv6 allows 20 more; this fits both).
pub const UDP_SEND_BYTES_MAX: usize = 65_507;

/// A socket that sends quinn's transmits in batches of at most
/// [`UDP_SEND_BYTES_MAX`] bytes; otherwise the socket it wraps.
pub struct GsoBatches {
    inner: Arc<dyn AsyncUdpSocket>,
}

impl GsoBatches {
    pub fn wrap(inner: Arc<dyn AsyncUdpSocket>) -> Arc<GsoBatches> {
        Arc::new(GsoBatches { inner })
    }
}

impl fmt::Debug for GsoBatches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GsoBatches").finish_non_exhaustive()
    }
}

/// `transmit` cut into transmits of at most `max_bytes` each, whole datagrams.
fn batches<'a>(
    transmit: &Transmit<'a>,
    max_bytes: usize,
) -> impl Iterator<Item = Transmit<'a>> + use<'a> {
    let segment = transmit
        .segment_size
        .filter(|_| transmit.contents.len() > max_bytes);
    // A single datagram (no segment size) is never larger than the MTU.
    let per = segment.map_or(transmit.contents.len(), |s| (max_bytes / s).max(1) * s);
    let base = transmit.clone();
    transmit
        .contents
        .chunks(per.max(1))
        .map(move |contents| Transmit {
            contents,
            segment_size: base.segment_size.filter(|s| contents.len() > *s),
            ..base.clone()
        })
}

impl AsyncUdpSocket for GsoBatches {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        if transmit.contents.len() <= UDP_SEND_BYTES_MAX {
            return self.inner.try_send(transmit);
        }
        for (i, batch) in batches(transmit, UDP_SEND_BYTES_MAX).enumerate() {
            match self.inner.try_send(&batch) {
                Ok(()) => {}
                // Nothing sent yet: quinn waits for the socket and retries it all.
                Err(e) if i == 0 => return Err(e),
                // The first batches went: the rest is loss as far as quinn knows,
                // which it recovers (resending all would repeat the sent ones).
                Err(_) => return Ok(()),
            }
        }
        Ok(())
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

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transmit(contents: &[u8], segment_size: Option<usize>) -> Transmit<'_> {
        Transmit {
            destination: SocketAddr::from(([127, 0, 0, 1], 9)),
            ecn: None,
            contents,
            segment_size,
            src_ip: None,
        }
    }

    /// Ten jumbo datagrams (the last one short) go in batches of seven whole
    /// datagrams at most, in order, each with its segment size unless it is one
    /// datagram; nothing is lost or repeated.
    #[test]
    fn a_batch_over_the_udp_limit_is_cut_at_datagram_boundaries() {
        let contents: Vec<u8> = (0..8_952 * 9 + 100).map(|i| i as u8).collect();
        let t = transmit(&contents, Some(8_952));
        let got: Vec<Transmit<'_>> = batches(&t, UDP_SEND_BYTES_MAX).collect();
        let sizes: Vec<(usize, Option<usize>)> = got
            .iter()
            .map(|b| (b.contents.len(), b.segment_size))
            .collect();
        assert_eq!(
            sizes,
            [(8_952 * 7, Some(8_952)), (8_952 * 2 + 100, Some(8_952))]
        );
        assert!(got.iter().all(|b| b.contents.len() <= UDP_SEND_BYTES_MAX));
        let joined: Vec<u8> = got.iter().flat_map(|b| b.contents.to_vec()).collect();
        assert_eq!(joined, contents);
        // A remainder of one datagram goes without a segment size.
        let contents = vec![7u8; 8_952 * 8];
        let t = transmit(&contents, Some(8_952));
        let sizes: Vec<(usize, Option<usize>)> = batches(&t, UDP_SEND_BYTES_MAX)
            .map(|b| (b.contents.len(), b.segment_size))
            .collect();
        assert_eq!(sizes, [(8_952 * 7, Some(8_952)), (8_952, None)]);
    }

    #[test]
    fn a_batch_within_the_limit_is_left_whole() {
        let contents = vec![1u8; 1_452 * 10];
        let t = transmit(&contents, Some(1_452));
        let got: Vec<Transmit<'_>> = batches(&t, UDP_SEND_BYTES_MAX).collect();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].contents.len(), got[0].segment_size),
            (1_452 * 10, Some(1_452))
        );
        let one = [3u8; 900];
        let t = transmit(&one, None);
        assert_eq!(batches(&t, UDP_SEND_BYTES_MAX).count(), 1);
    }
}
