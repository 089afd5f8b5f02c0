//! Redis GET through the same harness as [`super::load`] (`pangea bench-redis`) — the same
//! runtime, the same closed loop, the same clock points and HDR histogram — so the
//! Redis baseline of docs/benchmarks.md is measured exactly as Pangea is.
//!
//! Why not only redis-benchmark: it starts a request's clock when the request is
//! written to the socket and stops it when the reply is parsed, so the time a reply
//! waits for its client's turn in the event loop, and the time before the next
//! request is written, are left out; its mean latency comes out well below what
//! Little's law gives from its own throughput and concurrency (0.17 ms against
//! 32 / 101,600 ops/s = 0.31 ms here). `pangea bench` times the whole call, as a
//! frontend sees it. Both are reported; ratios are taken like for like.
//!
//! The client is the least RESP a GET benchmark needs (SET to load, GET, bulk-string
//! and simple replies); one TCP connection per worker, as redis-benchmark -c has.

use super::{Figures, draws, figures, histogram, machine};
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A Redis run (the flags of `pangea bench-redis`).
#[derive(Debug, Clone)]
pub struct Options {
    /// The Redis server.
    pub address: SocketAddr,
    pub value_bytes: usize,
    pub concurrency: usize,
    pub duration: Duration,
    /// Distinct keys SET first and then read.
    pub keys: usize,
    /// Threads of the load generator, as [`super::load::Options::threads`].
    pub threads: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub address: String,
    pub value_bytes: usize,
    pub concurrency: usize,
    pub threads: usize,
    pub redis: Figures,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = &self.redis;
        write!(
            f,
            "redis GET {} B, concurrency {} ({}): {:.0} ops/s  p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms  errors {}",
            self.value_bytes,
            self.concurrency,
            self.machine,
            r.ops_per_s,
            r.p50_ms,
            r.p99_ms,
            r.p999_ms,
            r.errors
        )
    }
}

/// A reply, as far as a GET benchmark cares.
#[derive(Debug, PartialEq)]
enum Reply {
    /// `+OK`, an integer, or nil.
    Other,
    /// A bulk string of this many bytes (in `Resp::value`).
    Bulk(usize),
    /// `-ERR ...`: the connection stays usable.
    Error(String),
}

/// One connection speaking just enough RESP.
struct Resp {
    stream: BufReader<TcpStream>,
    line: String,
    value: Vec<u8>,
}

impl Resp {
    async fn connect(address: SocketAddr) -> Result<Resp> {
        let stream = TcpStream::connect(address)
            .await
            .with_context(|| format!("redis at {address}"))?;
        stream.set_nodelay(true)?;
        Ok(Resp {
            stream: BufReader::new(stream),
            line: String::new(),
            value: Vec::new(),
        })
    }

    /// Sends one command (an array of bulk strings).
    async fn send(&mut self, args: &[&[u8]]) -> Result<()> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.stream.get_mut().write_all(&out).await?;
        Ok(())
    }

    /// Reads one reply; a bulk string lands in `self.value`. An `Err` is a broken
    /// connection or a reply this client does not understand.
    async fn reply(&mut self) -> Result<Reply> {
        self.line.clear();
        if self.stream.read_line(&mut self.line).await? == 0 {
            bail!("redis closed the connection");
        }
        let line = self.line.trim_end();
        match line.as_bytes().first() {
            Some(b'+' | b':') => Ok(Reply::Other),
            Some(b'-') => Ok(Reply::Error(line.to_owned())),
            Some(b'$') if line == "$-1" => Ok(Reply::Other),
            Some(b'$') => {
                let n: usize = line[1..]
                    .parse()
                    .with_context(|| format!("redis bulk length {line:?}"))?;
                self.value.resize(n + 2, 0);
                self.stream.read_exact(&mut self.value).await?;
                anyhow::ensure!(
                    self.value.ends_with(b"\r\n"),
                    "redis bulk string of {n} bytes not ended by CRLF"
                );
                Ok(Reply::Bulk(n))
            }
            _ => bail!("unexpected redis reply {line:?}"),
        }
    }
}

/// SETs the keys, then GETs them from `o.concurrency` connections for `o.duration`.
pub fn run(o: &Options) -> Result<Report> {
    let runtime = pangea_node::config::runtime(o.threads).build()?;
    runtime.block_on(async move {
        let keys: Arc<Vec<String>> =
            Arc::new((0..o.keys).map(|i| format!("bench/{i:08}")).collect());
        let value = vec![b'x'; o.value_bytes];
        let mut load = Resp::connect(o.address).await?;
        for k in keys.iter() {
            load.send(&[b"SET", k.as_bytes(), &value]).await?;
            if let Reply::Error(e) = load.reply().await? {
                bail!("redis refused SET {k}: {e}");
            }
        }
        let hist = Arc::new(Mutex::new(histogram()));
        let errors = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut conns = Vec::with_capacity(o.concurrency);
        for _ in 0..o.concurrency {
            conns.push(Resp::connect(o.address).await?);
        }
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for (t, mut conn) in conns.into_iter().enumerate() {
            let (keys, hist, errors, stop) =
                (keys.clone(), hist.clone(), errors.clone(), stop.clone());
            let value_bytes = o.value_bytes;
            tasks.spawn(async move {
                let mut draws = draws(t);
                while !stop.load(Ordering::Relaxed) {
                    let key = &keys[(draws.next_u64() % keys.len() as u64) as usize];
                    let t0 = Instant::now();
                    let answered = async {
                        conn.send(&[b"GET", key.as_bytes()]).await?;
                        conn.reply().await
                    };
                    match answered.await {
                        Ok(Reply::Bulk(n)) if n == value_bytes => {
                            let _ = hist
                                .lock()
                                .unwrap_or_else(|p| p.into_inner())
                                .record(t0.elapsed().as_micros() as u64);
                        }
                        Ok(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
            });
        }
        tokio::time::sleep(o.duration).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let h = hist.lock().unwrap_or_else(|p| p.into_inner());
        Ok(Report {
            machine: machine(),
            address: o.address.to_string(),
            value_bytes: o.value_bytes,
            concurrency: o.concurrency,
            threads: o.threads,
            redis: figures(&h, errors.load(Ordering::Relaxed), started.elapsed()),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// Replies a fake server sends, whatever the commands: RESP's reply kinds.
    const REPLIES: &[u8] = b"+OK\r\n$5\r\nhello\r\n$-1\r\n:7\r\n-ERR wrong type\r\n?what\r\n";

    #[tokio::test]
    async fn replies_are_parsed_and_errors_named() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut command = [0u8; 64];
            let _ = s.read(&mut command).await;
            s.write_all(REPLIES).await.expect("write");
            // Hold the connection open until the client is done.
            let _ = s.read(&mut command).await;
        });
        let mut conn = Resp::connect(address).await.expect("connect");
        conn.send(&[b"GET", b"k"]).await.expect("send");
        assert_eq!(conn.reply().await.expect("+OK"), Reply::Other);
        assert_eq!(conn.reply().await.expect("bulk"), Reply::Bulk(5));
        assert_eq!(&conn.value[..5], b"hello");
        assert_eq!(conn.reply().await.expect("nil"), Reply::Other);
        assert_eq!(conn.reply().await.expect("integer"), Reply::Other);
        let e = conn.reply().await.expect("error reply");
        assert_eq!(e, Reply::Error("-ERR wrong type".into()));
        let e = conn.reply().await.expect_err("unknown reply");
        assert!(e.to_string().contains("?what"), "{e}");
        drop(conn);
        server.await.expect("server");
    }
}
