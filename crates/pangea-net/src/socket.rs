//! The UDP socket under quinn: quinn's own tokio socket, except that a read which
//! drains the socket ends the wake-up without one more system call.
//!
//! quinn's endpoint reads its socket until a read would block, and tokio's
//! socket forgets a readiness only when a read fails with `EAGAIN`: every wake-up
//! ends with a `recvmmsg` that returns nothing. A `recvmmsg` that returns fewer
//! datagrams than it had room for has emptied the receive queue (the kernel stops
//! a batch early only when the queue is empty or on an error it reports next),
//! so [`DrainingSocket`] forgets the readiness then. It is safe for the reason the
//! `EAGAIN` rule is: tokio registers sockets edge-triggered, so a datagram that
//! arrives after the read raises a new readiness event, and tokio drops a
//! readiness only if no newer event has been seen since it was polled
//! (`AsyncFdReadyGuard::clear_ready`). A client at 32 requests in flight made two
//! `recvmmsg` calls per wake-up, 0.14 per 1 KiB get; this halves them.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use quinn::udp::{BATCH_SIZE, RecvMeta, Transmit, UdpSocketState};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// A UDP socket for quinn on the tokio reactor (see the module docs).
pub struct DrainingSocket {
    io: AsyncFd<std::net::UdpSocket>,
    state: UdpSocketState,
}

impl DrainingSocket {
    /// Wraps a bound, non-blocking socket; must run inside a tokio runtime.
    pub fn new(socket: std::net::UdpSocket) -> io::Result<Arc<DrainingSocket>> {
        let state = UdpSocketState::new((&socket).into())?;
        // Deprecated in tokio 1.53.3 as unsound for a `T` whose `as_raw_fd` could
        // change or close under the reactor; a `std::net::UdpSocket` owns its
        // descriptor for its whole life, and the workspace forbids the `unsafe`
        // `register_with_interest` that replaces it.
        #[allow(deprecated)]
        let io = AsyncFd::with_interest(socket, Interest::READABLE | Interest::WRITABLE)?;
        Ok(Arc::new(DrainingSocket { io, state }))
    }
}

impl fmt::Debug for DrainingSocket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DrainingSocket")
            .field("socket", self.io.get_ref())
            .finish_non_exhaustive()
    }
}

/// Waits until the socket may take a send.
struct Writable(Arc<DrainingSocket>);

impl fmt::Debug for Writable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Writable").finish()
    }
}

impl UdpPoller for Writable {
    fn poll_writable(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The guard is dropped without clearing: the readiness stands until a
        // send finds the socket full (`try_send`'s `try_io` clears it then).
        self.0.io.poll_write_ready(cx).map_ok(|_guard| ())
    }
}

impl AsyncUdpSocket for DrainingSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        Box::pin(Writable(self))
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.io.try_io(Interest::WRITABLE, |socket| {
            self.state.send(socket.into(), transmit)
        })
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        // What one read can return at most (quinn-udp reads at most BATCH_SIZE).
        let room = bufs.len().min(meta.len()).min(BATCH_SIZE);
        loop {
            let mut guard = ready!(self.io.poll_read_ready(cx))?;
            match guard.try_io(|io| self.state.recv(io.get_ref().into(), bufs, meta)) {
                Ok(Ok(datagrams)) => {
                    if datagrams < room {
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(datagrams));
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                // `EAGAIN`: the readiness is cleared; wait for the next one.
                Err(_would_block) => continue,
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.io.get_ref().local_addr()
    }

    fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    fn max_transmit_segments(&self) -> usize {
        self.state.max_gso_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.state.gro_segments()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn bound() -> std::net::UdpSocket {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        s.set_nonblocking(true).expect("non-blocking");
        s
    }

    /// Reads one batch (waiting for it), returning the datagrams' first bytes.
    async fn read_batch(socket: &DrainingSocket) -> Vec<u8> {
        let mut storage = vec![[0u8; 64]; BATCH_SIZE];
        let mut meta = vec![RecvMeta::default(); BATCH_SIZE];
        let mut bufs: Vec<IoSliceMut<'_>> =
            storage.iter_mut().map(|b| IoSliceMut::new(b)).collect();
        let n = std::future::poll_fn(|cx| socket.poll_recv(cx, &mut bufs, &mut meta))
            .await
            .expect("recv");
        (0..n).map(|i| bufs[i][0]).collect()
    }

    #[tokio::test]
    async fn a_datagram_after_a_draining_read_still_wakes_the_reader() {
        let socket = DrainingSocket::new(bound()).expect("socket");
        let to = socket.local_addr().expect("addr");
        let sender = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind sender");

        for round in 0..50u8 {
            // A short batch: the read drains the queue and forgets the readiness.
            for i in 0..3 {
                sender.send_to(&[round, i], to).expect("send");
            }
            let mut got = Vec::new();
            while got.len() < 3 {
                got.extend(
                    tokio::time::timeout(Duration::from_secs(5), read_batch(&socket))
                        .await
                        .expect("the batch is read"),
                );
            }
            assert_eq!(got, vec![round; 3]);
            // The next datagram comes while the reader already waits: its edge
            // wakes it, though no read ever returned `EAGAIN`.
            let reader = tokio::spawn({
                let socket = socket.clone();
                async move { read_batch(&socket).await }
            });
            tokio::time::sleep(Duration::from_millis(1)).await;
            sender.send_to(&[round, 9], to).expect("send");
            let late = tokio::time::timeout(Duration::from_secs(5), reader)
                .await
                .expect("a datagram after a draining read wakes its reader")
                .expect("reader task");
            assert_eq!(late, vec![round]);
        }
    }
}
