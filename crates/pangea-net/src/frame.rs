//! Length-prefixed protobuf frames over QUIC streams.
//!
//! A frame is a 4-byte big-endian body length, then the body: one prost message.
//! Protobuf messages do not delimit themselves, so the prefix is what lets several
//! messages share a stream (replication) and what lets a reader refuse a huge
//! message *before* buffering it.
//!
//! Every reader takes its limit as a parameter ([`FRAME_BYTES_MAX`] is the default
//! for replication and client traffic); the announced length is compared with the
//! limit before any body buffer is allocated, so a hostile or buggy peer cannot make
//! us allocate more than `limit` bytes per stream by lying in a header. Readers of
//! untrusted peers also read within a [`FrameBudget`] ([`read_frame_within`]), so
//! many streams each announcing a large frame cannot pin more than the budget.
//!
//! [`decode_frame`] and [`encode_frame`] are pure (no I/O) so fuzzers and property
//! tests can drive them; like mini-redis's `Frame::check`, decoding returns
//! `Ok(None)` for an incomplete buffer without allocating anything.

use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
use pangea_proto::prost::Message;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// Default largest frame body: 17 MiB — a maximal 16 MiB atomic row mutation
/// (`pangea_core::Limits`) plus room for its envelope (scope, origin, keys).
pub const FRAME_BYTES_MAX: usize = 17 * 1024 * 1024;

/// Bytes of the length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;

/// Encodes `msg` as one frame (prefix and body) in a single buffer.
///
/// Fails only if the body would not fit the 4-byte prefix (over 4 GiB), which no
/// reader would accept anyway. Callers wanting to respect a peer's smaller limit
/// check `msg.encoded_len()` themselves.
pub fn encode_frame<M: Message>(msg: &M) -> Result<Bytes> {
    let mut buf = frame_buffer(msg.encoded_len(), 0)?;
    // prost fails only when the buffer cannot grow, which BytesMut always can;
    // reported rather than assumed.
    msg.encode(&mut buf)?;
    Ok(buf.freeze())
}

/// A buffer holding the length prefix of a `body_bytes` frame, with room for the
/// body but its last `held_bytes` (a piece sent apart from the buffer).
fn frame_buffer(body_bytes: usize, held_bytes: usize) -> Result<BytesMut> {
    debug_assert!(held_bytes <= body_bytes);
    let prefix = u32::try_from(body_bytes).map_err(|_| Error::FrameTooLarge {
        size_bytes: body_bytes as u64,
        limit_bytes: u32::MAX as usize,
    })?;
    let mut buf = BytesMut::with_capacity(FRAME_HEADER_BYTES + body_bytes - held_bytes);
    buf.put_u32(prefix);
    Ok(buf)
}

/// A frame whose body is `head`'s encoding followed by `rest`'s. Protobuf merges
/// the fields of concatenated encodings, so this is the frame of the one message
/// holding the fields of both, when they set no field in common: a part encoded
/// before (`head`) is joined to the rest without being decoded again.
pub fn encode_frame_pair<A: Message, B: Message>(head: &A, rest: &B) -> Result<Bytes> {
    let mut buf = frame_buffer(head.encoded_len() + rest.encoded_len(), 0)?;
    head.encode(&mut buf)?;
    rest.encode(&mut buf)?;
    Ok(buf.freeze())
}

/// A frame of `head` followed by one `bytes` field holding `tail`, nested in
/// length-delimited fields: `nest` lists the field numbers from the outermost
/// (`[11, 1]` puts `tail` in field 1 of a message that is field 11 of the body).
/// Returns the frame in two pieces, so that `tail` (a cached encoded row, up to
/// megabytes) goes to the stream without being copied. Wire-identical to encoding
/// the whole message when `head` holds only fields numbered below `nest[0]`.
pub fn encode_frame_nesting<M: Message>(head: &M, nest: &[u32], tail: Bytes) -> Result<[Bytes; 2]> {
    use pangea_proto::prost::encoding::{
        WireType, encode_key, encode_varint, encoded_len_varint, key_len,
    };
    // The length of each level's contents, innermost first.
    let mut lengths = Vec::with_capacity(nest.len());
    let mut inner = tail.len();
    for field in nest.iter().rev() {
        lengths.push(inner);
        inner += key_len(*field) + encoded_len_varint(inner as u64);
    }
    let mut buf = frame_buffer(head.encoded_len() + inner, tail.len())?;
    head.encode(&mut buf)?;
    for (field, len) in nest.iter().zip(lengths.iter().rev()) {
        encode_key(*field, WireType::LengthDelimited, &mut buf);
        encode_varint(*len as u64, &mut buf);
    }
    Ok([buf.freeze(), tail])
}

/// Writes the two pieces of [`encode_frame_nesting`] as one frame.
pub async fn write_frame_pieces(
    send: &mut quinn::SendStream,
    mut pieces: [Bytes; 2],
) -> Result<()> {
    send.write_all_chunks(&mut pieces).await?;
    Ok(())
}

/// Decodes one frame from the front of `buf`.
///
/// - `Ok(None)`: `buf` holds only part of a frame (read more and retry); nothing
///   was allocated.
/// - `Ok(Some((msg, consumed_bytes)))`: a frame was decoded; drop `consumed_bytes`
///   from the front of `buf`.
/// - `Err(FrameTooLarge)`: the prefix announces more than `limit_bytes` (known as
///   soon as the 4 prefix bytes are in, before the body arrives).
/// - `Err(FrameDecode)`: the body is not a valid `M`.
pub fn decode_frame<M: Message + Default>(
    buf: &[u8],
    limit_bytes: usize,
) -> Result<Option<(M, usize)>> {
    let Some(header) = buf.first_chunk::<FRAME_HEADER_BYTES>() else {
        return Ok(None);
    };
    let body_bytes = body_length(*header, limit_bytes)?;
    let Some(body) = buf.get(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + body_bytes) else {
        return Ok(None);
    };
    let msg = M::decode(body)?;
    Ok(Some((msg, FRAME_HEADER_BYTES + body_bytes)))
}

/// Checks an announced length against the limit.
fn body_length(header: [u8; FRAME_HEADER_BYTES], limit_bytes: usize) -> Result<usize> {
    let announced = u32::from_be_bytes(header);
    match usize::try_from(announced) {
        Ok(len) if len <= limit_bytes => Ok(len),
        _ => Err(Error::FrameTooLarge {
            size_bytes: u64::from(announced),
            limit_bytes,
        }),
    }
}

/// Writes `msg` as one frame. Does not finish the stream: several frames may follow.
pub async fn write_frame<M: Message>(send: &mut quinn::SendStream, msg: &M) -> Result<()> {
    // Handed to quinn as it is: no copy into the stream's send buffer.
    send.write_chunk(encode_frame(msg)?).await?;
    Ok(())
}

/// Writes `head` and `rest` as one frame ([`encode_frame_pair`]).
pub async fn write_frame_pair<A: Message, B: Message>(
    send: &mut quinn::SendStream,
    head: &A,
    rest: &B,
) -> Result<()> {
    send.write_chunk(encode_frame_pair(head, rest)?).await?;
    Ok(())
}

/// Reads one frame of at most `limit_bytes` body bytes.
///
/// `Ok(None)` when the stream finished cleanly at a frame boundary; a stream that
/// finishes inside a frame is [`Error::FrameTruncated`]. On [`Error::FrameTooLarge`]
/// the body is left unread: the caller should drop or stop the stream, since its
/// position is no longer at a frame boundary.
pub async fn read_frame<M: Message + Default>(
    recv: &mut quinn::RecvStream,
    limit_bytes: usize,
) -> Result<Option<M>> {
    // The prefix first, then no more than the body it announces (and checks
    // against the limit before anything is allocated for it).
    read_pieces(recv, limit_bytes, FRAME_HEADER_BYTES).await
}

/// A frame's length prefix; `None` when the stream finished cleanly before it.
async fn read_header(recv: &mut quinn::RecvStream) -> Result<Option<[u8; FRAME_HEADER_BYTES]>> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    match recv.read_exact(&mut header).await {
        Ok(()) => Ok(Some(header)),
        Err(quinn::ReadExactError::FinishedEarly(0)) => Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(received_bytes)) => Err(Error::FrameTruncated {
            expected_bytes: FRAME_HEADER_BYTES,
            received_bytes,
        }),
        Err(quinn::ReadExactError::ReadError(e)) => Err(e.into()),
    }
}

/// A frame's body of `body_bytes` (already checked against the limit), decoded.
async fn read_body<M: Message + Default>(
    recv: &mut quinn::RecvStream,
    body_bytes: usize,
) -> Result<M> {
    // quinn hands out what it received as `Bytes`: a body that came in one piece
    // is decoded from it as it is; a longer one is gathered once (not zeroed first
    // and then copied into, as a read into a buffer would).
    let mut body = BytesMut::new();
    while body.len() < body_bytes {
        let Some(chunk) = recv.read_chunk(body_bytes - body.len(), true).await? else {
            return Err(Error::FrameTruncated {
                expected_bytes: body_bytes,
                received_bytes: body.len(),
            });
        };
        if body.is_empty() && chunk.bytes.len() == body_bytes {
            return Ok(M::decode(chunk.bytes)?);
        }
        if body.is_empty() {
            body.reserve(body_bytes);
        }
        body.extend_from_slice(&chunk.bytes);
    }
    // From `Bytes`, prost hands out the `bytes` fields (values, keys) as slices of
    // this buffer instead of copying each one.
    Ok(M::decode(body.freeze())?)
}

/// Reads the one frame a stream carries before its reader writes to it again:
/// an answer (a replica sends nothing on a stream after answering a request
/// until the next one). As [`read_frame`], but in one read of the stream, not
/// one for the prefix and one for the body, when the frame came in one piece
/// (most answers of a few KiB): each read takes the connection's lock and walks
/// its reassembly buffer, a share of a small read's client CPU. A piece that
/// holds bytes past the frame is [`Error::FrameTrailing`].
pub async fn read_answer<M: Message + Default>(
    recv: &mut quinn::RecvStream,
    limit_bytes: usize,
) -> Result<Option<M>> {
    read_pieces(recv, limit_bytes, usize::MAX).await
}

/// A frame from the pieces `recv` hands out, the first of at most `first_bytes`
/// and each after it of no more than the frame's rest ([`Gather`]).
async fn read_pieces<M: Message + Default>(
    recv: &mut quinn::RecvStream,
    limit_bytes: usize,
    first_bytes: usize,
) -> Result<Option<M>> {
    let mut gather = Gather::new(limit_bytes);
    let mut want = first_bytes;
    loop {
        let Some(chunk) = recv.read_chunk(want, true).await? else {
            return match gather.received_bytes() {
                0 => Ok(None),
                _ => Err(gather.truncated()),
            };
        };
        match gather.push(chunk.bytes)? {
            // From `Bytes`, prost hands out the `bytes` fields (values, keys) as
            // slices of the piece or of the gathered buffer, uncopied.
            Gathered::Whole(body) => return Ok(Some(M::decode(body)?)),
            Gathered::More(n) => want = n,
        }
    }
}

/// Where [`Gather::push`] leaves a frame.
#[derive(Debug, PartialEq)]
enum Gathered {
    /// The frame's body, whole.
    Whole(Bytes),
    /// Up to this many more bytes are the frame's (then [`Gather::push`] again).
    More(usize),
}

/// A frame put together from the pieces a stream hands out ([`read_answer`]).
#[derive(Debug)]
struct Gather {
    limit_bytes: usize,
    /// The prefix, or as much of it as is in.
    header: [u8; FRAME_HEADER_BYTES],
    header_bytes: usize,
    /// The body's announced length, once the prefix is in and checked.
    body_bytes: Option<usize>,
    body: BytesMut,
}

impl Gather {
    fn new(limit_bytes: usize) -> Gather {
        Gather {
            limit_bytes,
            header: [0; FRAME_HEADER_BYTES],
            header_bytes: 0,
            body_bytes: None,
            body: BytesMut::new(),
        }
    }

    fn received_bytes(&self) -> usize {
        self.header_bytes + self.body.len()
    }

    /// The stream ended before the frame did.
    fn truncated(&self) -> Error {
        match self.body_bytes {
            Some(body_bytes) => Error::FrameTruncated {
                expected_bytes: body_bytes,
                received_bytes: self.body.len(),
            },
            None => Error::FrameTruncated {
                expected_bytes: FRAME_HEADER_BYTES,
                received_bytes: self.header_bytes,
            },
        }
    }

    fn push(&mut self, mut piece: Bytes) -> Result<Gathered> {
        if self.body_bytes.is_none() {
            let n = (FRAME_HEADER_BYTES - self.header_bytes).min(piece.len());
            self.header[self.header_bytes..self.header_bytes + n].copy_from_slice(&piece[..n]);
            self.header_bytes += n;
            piece.advance(n);
            if self.header_bytes < FRAME_HEADER_BYTES {
                return Ok(Gathered::More(FRAME_HEADER_BYTES - self.header_bytes));
            }
            // The limit check happens here, before any allocation for the body.
            let body_bytes = body_length(self.header, self.limit_bytes)?;
            self.body_bytes = Some(body_bytes);
        }
        let body_bytes = self.body_bytes.unwrap_or_default();
        let left = body_bytes - self.body.len();
        if piece.len() > left {
            return Err(Error::FrameTrailing {
                frame_bytes: FRAME_HEADER_BYTES + body_bytes,
                extra_bytes: piece.len() - left,
            });
        }
        if self.body.is_empty() {
            // The whole body in one piece: decoded from it, uncopied.
            if piece.len() == body_bytes {
                return Ok(Gathered::Whole(piece));
            }
            // Gathered once, as `read_frame` does.
            if !piece.is_empty() {
                self.body.reserve(body_bytes);
            }
        }
        self.body.extend_from_slice(&piece);
        if self.body.len() == body_bytes {
            Ok(Gathered::Whole(std::mem::take(&mut self.body).freeze()))
        } else {
            Ok(Gathered::More(body_bytes - self.body.len()))
        }
    }
}

/// Memory for frames being read, before they are complete: one budget per
/// connection and one shared by the whole process. A reader takes a frame's
/// announced size from both before it allocates the body and gives it back once the
/// frame is read (or abandoned), so peers that announce large frames and send them
/// slowly, on many streams, pin at most the budget (not streams × frame limit).
#[derive(Debug, Clone)]
pub struct FrameBudget {
    connection: Arc<Semaphore>,
    connection_bytes: usize,
    process: Arc<Semaphore>,
    process_bytes: usize,
}

/// The share of a [`FrameBudget`] one frame holds while it is read.
#[derive(Debug)]
pub struct BudgetPermit {
    _connection: OwnedSemaphorePermit,
    _process: OwnedSemaphorePermit,
}

impl FrameBudget {
    /// The budget shared by every connection of a process (`bytes` in all).
    pub fn process(bytes: usize) -> Arc<Semaphore> {
        Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS)))
    }

    /// The budget of one new connection: `connection_bytes` of its own, within the
    /// process's `process` (created with `process_bytes`).
    pub fn new(
        process: Arc<Semaphore>,
        process_bytes: usize,
        connection_bytes: usize,
    ) -> FrameBudget {
        FrameBudget {
            connection: Arc::new(Semaphore::new(connection_bytes.min(Semaphore::MAX_PERMITS))),
            connection_bytes,
            process,
            process_bytes,
        }
    }

    /// Takes `bytes` from both budgets at once, or fails naming the one that is
    /// short (nothing is taken then).
    pub fn take(&self, bytes: usize) -> Result<BudgetPermit> {
        let over = |scope, sem: &Semaphore, budget: usize| Error::OverBudget {
            size_bytes: bytes,
            scope,
            held_bytes: budget.saturating_sub(sem.available_permits()),
            budget_bytes: budget,
        };
        let n = u32::try_from(bytes).unwrap_or(u32::MAX);
        let connection = self
            .connection
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| over("connection", &self.connection, self.connection_bytes))?;
        let process = self
            .process
            .clone()
            .try_acquire_many_owned(n)
            .map_err(|_| over("replica", &self.process, self.process_bytes))?;
        Ok(BudgetPermit {
            _connection: connection,
            _process: process,
        })
    }
}

/// [`read_frame`] within a [`FrameBudget`]: the body's announced size is taken from
/// the budget before anything is allocated for it (over budget: an error, the
/// stream is no longer at a frame boundary), and the body must arrive within
/// `body_time_max` of its header.
pub async fn read_frame_within<M: Message + Default>(
    recv: &mut quinn::RecvStream,
    limit_bytes: usize,
    budget: &FrameBudget,
    body_time_max: Duration,
) -> Result<Option<M>> {
    let Some(header) = read_header(recv).await? else {
        return Ok(None);
    };
    let body_bytes = body_length(header, limit_bytes)?;
    let _permit = budget.take(body_bytes)?;
    match tokio::time::timeout(body_time_max, read_body(recv, body_bytes)).await {
        Ok(frame) => frame.map(Some),
        Err(_) => Err(Error::FrameTimeout {
            expected_bytes: body_bytes,
            after_ms: body_time_max.as_millis() as u64,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pangea_proto::v1::{
        ClientRequest, GetRequest, Hello, ReplicationFrame, client_request, replication_frame,
    };
    use proptest::prelude::*;

    /// A frame handed out in any pieces is gathered whole, its body uncopied when
    /// it came in one piece; a piece past its end is an error, and so is a
    /// prefix over the limit, before anything is allocated.
    #[test]
    fn answers_are_gathered_from_any_pieces() {
        let frame = encode_frame(&ClientRequest {
            app_profile: "serving".into(),
            request: Some(client_request::Request::Get(GetRequest {
                table: "profiles".into(),
                row_key: vec![7u8; 300].into(),
                ..Default::default()
            })),
            ..Default::default()
        })
        .unwrap();
        let body = frame.slice(FRAME_HEADER_BYTES..);
        // Every split into two pieces, and one byte at a time.
        for cut in 0..=frame.len() {
            let mut g = Gather::new(FRAME_BYTES_MAX);
            let mut got = g.push(frame.slice(..cut)).unwrap();
            if cut < frame.len() {
                assert_eq!(
                    got,
                    Gathered::More(if cut < FRAME_HEADER_BYTES {
                        FRAME_HEADER_BYTES - cut
                    } else {
                        frame.len() - cut
                    })
                );
                got = g.push(frame.slice(cut..)).unwrap();
            }
            assert_eq!(got, Gathered::Whole(body.clone()), "cut at {cut}");
        }
        let mut g = Gather::new(FRAME_BYTES_MAX);
        let mut last = None;
        for i in 0..frame.len() {
            last = Some(g.push(frame.slice(i..i + 1)).unwrap());
        }
        assert_eq!(last, Some(Gathered::Whole(body.clone())));

        // One piece holding the frame and more.
        let mut more = BytesMut::from(&frame[..]);
        more.extend_from_slice(b"xy");
        match Gather::new(FRAME_BYTES_MAX).push(more.freeze()) {
            Err(Error::FrameTrailing {
                frame_bytes,
                extra_bytes,
            }) => assert_eq!((frame_bytes, extra_bytes), (frame.len(), 2)),
            other => panic!("expected FrameTrailing, got {other:?}"),
        }
        // A prefix announcing more than the limit.
        match Gather::new(100).push(frame.clone()) {
            Err(Error::FrameTooLarge { limit_bytes, .. }) => assert_eq!(limit_bytes, 100),
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        // The stream ends inside the prefix, then inside the body.
        let mut g = Gather::new(FRAME_BYTES_MAX);
        g.push(frame.slice(..2)).unwrap();
        assert!(matches!(
            g.truncated(),
            Error::FrameTruncated {
                expected_bytes: 4,
                received_bytes: 2
            }
        ));
        g.push(frame.slice(2..10)).unwrap();
        match g.truncated() {
            Error::FrameTruncated {
                expected_bytes,
                received_bytes,
            } => {
                assert_eq!((expected_bytes, received_bytes), (body.len(), 6))
            }
            other => panic!("expected FrameTruncated, got {other:?}"),
        }
        // An empty body.
        assert_eq!(
            Gather::new(FRAME_BYTES_MAX)
                .push(Bytes::from_static(&[0, 0, 0, 0]))
                .unwrap(),
            Gathered::Whole(Bytes::new())
        );
    }

    /// A get's answer written as `served_by` and the encoded row uncopied is the
    /// frame of the whole `ClientResponse`, byte for byte: rows of every length
    /// class of a varint, and no row.
    #[test]
    fn a_frame_nesting_a_tail_is_the_frame_of_the_whole_message() {
        use pangea_proto::v1::{ClientResponseEncodedGet, GetResponseEncoded, ServedByEncoded};
        let served_by = Some(ServedByEncoded {
            replica: "us-east1-a".into(),
            region: "us-east1".into(),
            watermarks: None,
            deployment: 0x5eed,
            watermarks_digest: 0,
        });
        for len in [0usize, 1, 127, 128, 16_383, 16_384, 2_097_152] {
            let row = Bytes::from(vec![0xabu8; len]);
            let whole = ClientResponseEncodedGet {
                served_by: served_by.clone(),
                get: Some(GetResponseEncoded {
                    row: Some(row.clone()),
                }),
            };
            let head = ClientResponseEncodedGet {
                served_by: served_by.clone(),
                get: None,
            };
            let [a, b] = encode_frame_nesting(&head, &[11, 1], row).unwrap();
            assert_eq!(
                [a, b].concat(),
                encode_frame(&whole).unwrap(),
                "row of {len} bytes"
            );
        }
        let empty = ClientResponseEncodedGet {
            served_by: served_by.clone(),
            get: Some(GetResponseEncoded { row: None }),
        };
        let head = ClientResponseEncodedGet {
            served_by,
            get: None,
        };
        let [a, b] = encode_frame_nesting(&head, &[11], Bytes::new()).unwrap();
        assert_eq!([a, b].concat(), encode_frame(&empty).unwrap());
    }

    /// A response written as its `served_by`, encoded apart, and the rest is the
    /// frame of the whole response.
    #[test]
    fn a_frame_of_two_parts_is_the_frame_of_the_message_holding_both() {
        use pangea_proto::v1::{
            ClientResponse, ClientResponseEncodedGet, Error as WireError, ServedBy,
            ServedByEncoded, client_response,
        };
        let watermarks = pangea_proto::v1::ScopeWatermarks {
            scope: "global".into(),
            low_watermark: 9,
            ..Default::default()
        };
        for sent in [Some(watermarks), None] {
            let head = ClientResponseEncodedGet {
                served_by: Some(ServedByEncoded {
                    replica: "us-east1-a".into(),
                    region: "us-east1".into(),
                    watermarks: sent.as_ref().map(|w| w.encode_to_vec().into()),
                    deployment: 0x5eed,
                    watermarks_digest: 77,
                }),
                get: None,
            };
            let error = Some(client_response::Response::Error(WireError {
                code: 4,
                message: "not covered".into(),
                token: Bytes::new(),
            }));
            let rest = ClientResponse {
                served_by: None,
                response: error.clone(),
            };
            let whole = ClientResponse {
                served_by: Some(ServedBy {
                    replica: "us-east1-a".into(),
                    region: "us-east1".into(),
                    watermarks: sent,
                    deployment: 0x5eed,
                    watermarks_digest: 77,
                }),
                response: error,
            };
            let frame = encode_frame_pair(&head, &rest).unwrap();
            assert_eq!(frame, encode_frame(&whole).unwrap());
        }
    }

    fn hello() -> ReplicationFrame {
        ReplicationFrame {
            frame: Some(replication_frame::Frame::Hello(Hello {
                replica_id: "us-east1-a".into(),
                region: "us-east1".into(),
                protocol_version: 1,
            })),
        }
    }

    #[test]
    fn budgets_are_taken_whole_from_both_and_given_back() {
        let process = FrameBudget::process(100);
        let a = FrameBudget::new(process.clone(), 100, 60);
        let b = FrameBudget::new(process.clone(), 100, 60);
        let held = a.take(50).expect("within both");
        // The connection's own budget is short.
        assert!(matches!(
            a.take(20),
            Err(Error::OverBudget {
                scope: "connection",
                held_bytes: 50,
                budget_bytes: 60,
                ..
            })
        ));
        // Another connection fits its own, not the process's.
        assert!(matches!(
            b.take(60),
            Err(Error::OverBudget {
                scope: "replica",
                held_bytes: 50,
                budget_bytes: 100,
                ..
            })
        ));
        // A refused take held nothing: the connection budget is whole again.
        let b_held = b.take(50).expect("fits both now");
        drop(held);
        drop(b_held);
        assert_eq!(process.available_permits(), 100);
        assert!(a.take(60).is_ok());
    }

    #[test]
    fn encode_then_decode() -> Result<()> {
        let frame = encode_frame(&hello())?;
        let Some((decoded, used)) = decode_frame::<ReplicationFrame>(&frame, FRAME_BYTES_MAX)?
        else {
            panic!("a whole frame decoded as incomplete");
        };
        assert_eq!(decoded, hello());
        assert_eq!(used, frame.len());
        Ok(())
    }

    #[test]
    fn every_proper_prefix_is_incomplete() -> Result<()> {
        let frame = encode_frame(&hello())?;
        for cut in 0..frame.len() {
            assert!(decode_frame::<ReplicationFrame>(&frame[..cut], FRAME_BYTES_MAX)?.is_none());
        }
        Ok(())
    }

    #[test]
    fn oversized_prefix_is_refused_before_the_body_arrives() {
        // Only the 4-byte prefix: announced 1 GiB, limit 1 KiB.
        let header = (1u32 << 30).to_be_bytes();
        match decode_frame::<ReplicationFrame>(&header, 1024) {
            Err(Error::FrameTooLarge {
                size_bytes,
                limit_bytes,
            }) => {
                assert_eq!(size_bytes, 1 << 30);
                assert_eq!(limit_bytes, 1024);
            }
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
    }

    #[test]
    fn a_4_gib_prefix_is_refused_at_the_production_limit() {
        // The largest length a prefix can announce, and one byte over the default
        // limit, with no body: refused from the 4 prefix bytes alone.
        for announced in [u32::MAX, FRAME_BYTES_MAX as u32 + 1] {
            match decode_frame::<ClientRequest>(&announced.to_be_bytes(), FRAME_BYTES_MAX) {
                Err(Error::FrameTooLarge {
                    size_bytes,
                    limit_bytes,
                }) => {
                    assert_eq!(size_bytes, u64::from(announced));
                    assert_eq!(limit_bytes, FRAME_BYTES_MAX);
                }
                other => panic!("expected FrameTooLarge, got {other:?}"),
            }
        }
        // At the limit, a prefix alone is only an incomplete frame.
        let header = (FRAME_BYTES_MAX as u32).to_be_bytes();
        assert!(matches!(
            decode_frame::<ReplicationFrame>(&header, FRAME_BYTES_MAX),
            Ok(None)
        ));
    }

    #[test]
    fn limit_is_inclusive() -> Result<()> {
        let frame = encode_frame(&hello())?;
        let body = frame.len() - FRAME_HEADER_BYTES;
        assert!(decode_frame::<ReplicationFrame>(&frame, body)?.is_some());
        assert!(decode_frame::<ReplicationFrame>(&frame, body - 1).is_err());
        Ok(())
    }

    #[test]
    fn garbage_body_is_a_decode_error() {
        // Field 1, wire type 2 (length-delimited), length 100, but no bytes follow.
        let buf = [0, 0, 0, 2, 0x0a, 100];
        assert!(matches!(
            decode_frame::<ReplicationFrame>(&buf, FRAME_BYTES_MAX),
            Err(Error::FrameDecode(_))
        ));
    }

    fn arb_replication_frame() -> impl Strategy<Value = ReplicationFrame> {
        prop_oneof![
            Just(ReplicationFrame { frame: None }),
            (".{0,40}", ".{0,20}", any::<u32>()).prop_map(|(replica_id, region, v)| {
                ReplicationFrame {
                    frame: Some(replication_frame::Frame::Hello(Hello {
                        replica_id,
                        region,
                        protocol_version: v,
                    })),
                }
            }),
            (".{0,20}", ".{0,20}", any::<u64>(), any::<u64>()).prop_map(|(scope, origin, a, b)| {
                ReplicationFrame {
                    frame: Some(replication_frame::Frame::GapRequest(
                        pangea_proto::v1::GapRequest {
                            scope,
                            origin,
                            from_sequence: a,
                            to_sequence: b,
                        },
                    )),
                }
            }),
        ]
    }

    fn arb_client_request() -> impl Strategy<Value = ClientRequest> {
        (
            any::<u64>(),
            "[a-z_]{0,16}",
            ".{0,16}",
            proptest::collection::vec(any::<u8>(), 0..256),
        )
            .prop_map(|(deadline_us, app_profile, table, row_key)| ClientRequest {
                deadline_us,
                app_profile,
                traceparent: String::new(),
                known_watermarks: 0,
                request: Some(client_request::Request::Get(GetRequest {
                    table,
                    row_key: row_key.into(),
                    filter: None,
                    consistency: None,
                })),
            })
    }

    proptest! {
        #[test]
        fn decode_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..512),
                               limit in 0usize..1024) {
            let _ = decode_frame::<ReplicationFrame>(&buf, limit);
            let _ = decode_frame::<ClientRequest>(&buf, limit);
        }

        #[test]
        fn decode_never_panics_on_plausible_headers(
            len in 0u32..600,
            body in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            let mut buf = len.to_be_bytes().to_vec();
            buf.extend_from_slice(&body);
            let _ = decode_frame::<ReplicationFrame>(&buf, FRAME_BYTES_MAX);
            let _ = decode_frame::<ClientRequest>(&buf, FRAME_BYTES_MAX);
        }

        #[test]
        fn replication_frames_round_trip(msg in arb_replication_frame(),
                                         tail in proptest::collection::vec(any::<u8>(), 0..8)) {
            let mut buf = encode_frame(&msg)?.to_vec();
            let frame_len = buf.len();
            // Bytes of a following frame must not be consumed.
            buf.extend_from_slice(&tail);
            let decoded = decode_frame::<ReplicationFrame>(&buf, FRAME_BYTES_MAX)?;
            prop_assert_eq!(decoded, Some((msg, frame_len)));
        }

        /// Any bytes in any pieces: `Gather` never panics, never asks for more
        /// than the frame's rest, and ends with exactly the bytes a frame
        /// prefix announces or an error.
        #[test]
        fn gathering_any_pieces_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..600),
            cuts in proptest::collection::vec(0usize..600, 0..6),
            limit in 0usize..1024,
        ) {
            let bytes = Bytes::from(bytes);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
            cuts.push(0);
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut g = Gather::new(limit);
            for w in cuts.windows(2) {
                match g.push(bytes.slice(w[0]..w[1])) {
                    Ok(Gathered::Whole(body)) => {
                        prop_assert_eq!(body.len(), u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize);
                        prop_assert_eq!(&body[..], &bytes[4..4 + body.len()]);
                        break;
                    }
                    Ok(Gathered::More(n)) => prop_assert!(n > 0),
                    Err(_) => break,
                }
            }
        }

        #[test]
        fn client_requests_round_trip(msg in arb_client_request()) {
            let buf = encode_frame(&msg)?;
            let decoded = decode_frame::<ClientRequest>(&buf, FRAME_BYTES_MAX)?;
            prop_assert_eq!(decoded, Some((msg, buf.len())));
        }
    }
}
