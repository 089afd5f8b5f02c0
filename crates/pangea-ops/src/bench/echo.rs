//! The echo floor (`pangea bench-echo`): a bare quinn server that returns each
//! request frame, loaded like a replica, so its figures are what any QUIC service
//! with our framing and TLS reaches on this machine.

use super::{Figures, figures, histogram, machine};
use anyhow::Result;
use bytes::Bytes;
use pangea_proto::v1::{ClientRequest, GetRequest, client_request::Request};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An echo run (the flags of `pangea bench-echo`).
#[derive(Debug, Clone)]
pub struct Options {
    pub value_bytes: usize,
    pub concurrency: usize,
    pub duration: Duration,
    /// Each worker keeps one stream and sends its requests on it one after another
    /// (as pangea-client does); else one stream per request.
    pub reuse_streams: bool,
    /// Threads of the server's runtime and of the client's, each on its own (as a
    /// replica and `pangea bench` run): 1 single-threaded, 0 one per core.
    pub threads: usize,
    /// QUIC connections, workers spread over them.
    pub connections: usize,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub machine: String,
    pub value_bytes: usize,
    pub concurrency: usize,
    pub connections: usize,
    pub streams: &'static str,
    pub echo: Figures,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = &self.echo;
        write!(
            f,
            "echo {} B, concurrency {}, {} streams ({}): {:.0} ops/s  p50 {:.3} ms  p99 {:.3} ms  p999 {:.3} ms",
            self.value_bytes,
            self.concurrency,
            self.streams,
            self.machine,
            e.ops_per_s,
            e.p50_ms,
            e.p99_ms,
            e.p999_ms
        )
    }
}

/// Runs the server on a thread and runtime of its own, loads it, stops it.
pub fn run(o: &Options) -> Result<Report> {
    let connections = o.connections.max(1);
    let dir = tempfile::tempdir()?;
    pangea_net::certs::init_ca(dir.path())?;
    pangea_net::certs::issue_replica(dir.path(), "echo", "local")?;
    pangea_net::certs::issue_client(dir.path(), "bench", "frontend")?;
    let ca = pangea_net::certs::load_ca(dir.path())?;
    let server =
        pangea_net::tls::server_config(&ca, pangea_net::certs::load_replica(dir.path(), "echo")?)?;
    let client =
        pangea_net::tls::client_config(&ca, pangea_net::certs::load_client(dir.path(), "bench")?)?;
    let server_side_client =
        pangea_net::tls::client_config(&ca, pangea_net::certs::load_client(dir.path(), "bench")?)?;
    let server_runtime = pangea_node::config::runtime(o.threads).build()?;
    let server_ep = server_runtime.block_on(async {
        pangea_net::bind_endpoint(
            ([127, 0, 0, 1], 0).into(),
            Some(server),
            server_side_client,
            None,
            None,
        )
    })?;
    let addr = server_ep.local_addr()?;
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server_thread = std::thread::spawn(move || {
        server_runtime.block_on(async move {
            tokio::select! {
                _ = serve(server_ep) => {}
                _ = server_stopped => {}
            }
        });
    });
    let runtime = pangea_node::config::runtime(o.threads).build()?;
    let result = runtime.block_on(async move {
        let ep = pangea_net::bind_endpoint(([127, 0, 0, 1], 0).into(), None, client, None, None)?;
        let mut conns = Vec::with_capacity(connections);
        for _ in 0..connections {
            conns.push(ep.connect(addr, "echo")?.await?);
        }
        let req = ClientRequest {
            deadline_us: 0,
            app_profile: String::new(),
            traceparent: String::new(),
            known_watermarks: 0,
            request: Some(Request::Get(GetRequest {
                table: "t".into(),
                row_key: Bytes::from(vec![b'x'; o.value_bytes]),
                ..Default::default()
            })),
        };
        let hist = Arc::new(Mutex::new(histogram()));
        let stop = Arc::new(AtomicBool::new(false));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..o.concurrency {
            let (conn, req, hist, stop) = (
                conns[i % connections].clone(),
                req.clone(),
                hist.clone(),
                stop.clone(),
            );
            let reuse = o.reuse_streams;
            tasks.spawn(async move {
                let mut kept = None;
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    let (mut send, mut recv) = match kept.take() {
                        Some(s) => s,
                        None => match conn.open_bi().await {
                            Ok(s) => s,
                            Err(_) => return,
                        },
                    };
                    if pangea_net::write_frame(&mut send, &req).await.is_err() {
                        return;
                    }
                    if !reuse {
                        let _ = send.finish();
                    }
                    let answer = pangea_net::read_frame::<ClientRequest>(
                        &mut recv,
                        pangea_net::FRAME_BYTES_MAX,
                    )
                    .await;
                    if let Ok(Some(_)) = answer {
                        let _ = hist
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .record(t0.elapsed().as_micros() as u64);
                    }
                    if reuse {
                        kept = Some((send, recv));
                    }
                }
            });
        }
        tokio::time::sleep(o.duration).await;
        stop.store(true, Ordering::Relaxed);
        while tasks.join_next().await.is_some() {}
        let h = hist.lock().unwrap_or_else(|p| p.into_inner());
        anyhow::Ok(Report {
            machine: machine(),
            value_bytes: o.value_bytes,
            concurrency: o.concurrency,
            connections,
            streams: if o.reuse_streams {
                "reused"
            } else {
                "per-request"
            },
            echo: figures(&h, 0, started.elapsed()),
        })
    });
    let _ = stop_server.send(());
    let _ = server_thread.join();
    result
}

/// Every request frame comes back as its answer, on every stream of every
/// connection.
async fn serve(ep: quinn::Endpoint) {
    while let Some(inc) = ep.accept().await {
        tokio::spawn(async move {
            let Ok(conn) = inc.await else { return };
            while let Ok((mut send, mut recv)) = conn.accept_bi().await {
                tokio::spawn(async move {
                    while let Ok(Some(req)) = pangea_net::read_frame::<ClientRequest>(
                        &mut recv,
                        pangea_net::FRAME_BYTES_MAX,
                    )
                    .await
                    {
                        if pangea_net::write_frame(&mut send, &req).await.is_err() {
                            return;
                        }
                    }
                    let _ = send.finish();
                });
            }
        });
    }
}
