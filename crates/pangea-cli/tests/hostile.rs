//! Hostile traffic (issue 31): from an authenticated client, frames announced large
//! and sent slowly on many streams pin at most the replica's frame budgets
//! (docs/operations.md, `frame_budget_*`), refused streams are told why, and an
//! ordinary 8 MiB write from another connection goes through meanwhile; from
//! anyone, a flood of QUIC Initials gets stateless Retries past the first
//! handshakes, and memory and serving hold.

mod common;

use anyhow::{Context, Result, ensure};
use bytes::Bytes;
use common::{Cluster, RawClient, US};
use pangea_net::{Credential, certs, tls};
use pangea_proto::v1 as pb;
use std::time::{Duration, Instant};

const ANNOUNCED: u32 = 16 << 20;
const SENT: usize = 15 << 20;
const MIB: u64 = 1 << 20;

/// Resident memory of process `pid`, from /proc.
fn rss_bytes(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kb * 1024)
}

/// Opens `streams` request streams on `conn`, each announcing a 16 MiB frame and
/// sending 15 MiB of it, never the rest. Returns, per stream, whether the replica
/// refused it (and said why before stopping it).
async fn pin(conn: quinn::Connection, streams: usize) -> Result<Vec<bool>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..streams {
        let conn = conn.clone();
        tasks.spawn(async move {
            let (mut send, mut recv) = conn.open_bi().await?;
            send.write_all(&ANNOUNCED.to_be_bytes()).await?;
            // As much of the body as goes out in a few seconds (a writer whose
            // stream the replica stopped may not be woken while it waits for
            // connection credit, so the loop is bounded in time).
            let chunk = vec![0x5a; 1 << 20];
            let _ = tokio::time::timeout(Duration::from_secs(4), async {
                let mut sent = 0;
                while sent < SENT {
                    if send.write_all(&chunk).await.is_err() {
                        break; // stopped by the replica
                    }
                    sent += chunk.len();
                }
            })
            .await;
            // A refused stream gets an answer naming the budget; an accepted one
            // gets nothing while its frame is incomplete.
            let answer = tokio::time::timeout(
                Duration::from_secs(2),
                pangea_net::read_frame::<pb::ClientResponse>(
                    &mut recv,
                    pangea_net::FRAME_BYTES_MAX,
                ),
            )
            .await;
            let refused = match answer {
                Ok(Ok(Some(resp))) => match resp.response {
                    Some(pb::client_response::Response::Error(e)) => {
                        ensure!(e.message.contains("budget"), "{}", e.message);
                        true
                    }
                    other => anyhow::bail!("an incomplete frame was answered: {other:?}"),
                },
                _ => false,
            };
            // Hold the stream (and what the replica buffered for it) open.
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(send);
            anyhow::Ok(refused)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r??);
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_frames_stay_within_the_budgets() -> Result<()> {
    let c = Cluster::up(false)?;
    let at = "use1-a";
    let pid = c.pid(at)?;
    let addr = c.addr(at)?;
    let ca = certs::load_ca(&c.file.certs)?;
    let attacker = || -> Result<RawClient> {
        let own =
            certs::load_credential(&c.file.certs, &Credential::Client("client-frontend".into()))?;
        RawClient::new(tls::client_config(&ca, own)?)
    };
    let fe = c.client(US, "frontend").await?;
    let baseline = rss_bytes(pid)?;
    // Watch the replica's memory while the attacks run.
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let watching = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(rss) = rss_bytes(pid) {
                    peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // 1. One connection, 80 streams (the reported attack): at most the connection
    // budget (64 MiB, four 16 MiB frames) is read; the rest are refused.
    let conn = attacker()?.connect(addr, at).await?;
    let attack = tokio::spawn(pin(conn.clone(), 80));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Meanwhile an ordinary 8 MiB write from another connection goes through.
    let started = Instant::now();
    let big = common::profile_set("us/big", vec![7u8; 8 << 20])?;
    fe.mutate(
        big,
        &pangea_client::WriteOptions {
            deadline: Some(Duration::from_secs(10)),
            ..Default::default()
        },
    )
    .await
    .context("an 8 MiB write during the attack")?;
    eprintln!("8 MiB write during the attack: {:?}", started.elapsed());
    let refused = attack.await??;
    let accepted = refused.iter().filter(|r| !**r).count();
    ensure!(
        accepted <= 4,
        "{accepted} frames of 16 MiB read on one connection"
    );
    ensure!(refused.len() - accepted >= 76, "refusals: {refused:?}");
    let one = peak.load(std::sync::atomic::Ordering::Relaxed);
    drop(conn);

    // 2. Six connections of 20 streams: the replica-wide budget (256 MiB) holds.
    let mut attacks = Vec::new();
    for _ in 0..6 {
        let conn = attacker()?.connect(addr, at).await?;
        attacks.push(tokio::spawn(pin(conn, 20)));
    }
    let mut accepted = 0;
    for a in attacks {
        accepted += a.await??.iter().filter(|r| !**r).count();
    }
    ensure!(
        accepted <= 16,
        "{accepted} frames of 16 MiB read on six connections"
    );
    watching.abort();
    let all = peak.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!(
        "replica RSS: baseline {} MiB, peak {} MiB with one attacking connection, {} MiB with six",
        baseline / MIB,
        one / MIB,
        all / MIB
    );
    // The budget plus room for QUIC's receive windows and the 8 MiB write.
    ensure!(
        one <= baseline + 64 * MIB + 96 * MIB,
        "one connection: {} MiB",
        one / MIB
    );
    ensure!(
        all <= baseline + 256 * MIB + 96 * MIB,
        "six connections: {} MiB",
        all / MIB
    );
    // Still serving.
    let r = fe
        .get(
            "ad_profiles",
            Bytes::from_static(b"us/big"),
            &pangea_client::ReadOptions::default().with_deadline(Duration::from_secs(2)),
        )
        .await?;
    ensure!(r.value.is_some());
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}

/// `n` distinct QUIC Initial datagrams a client would send to `to`, made without a
/// socket (quinn-proto): a flood needs no certificate, and never answers.
fn initials(
    to: std::net::SocketAddr,
    config: quinn::ClientConfig,
    n: usize,
) -> Result<Vec<Vec<u8>>> {
    let mut ep = quinn_proto::Endpoint::new(
        std::sync::Arc::new(quinn_proto::EndpointConfig::default()),
        None,
        false,
        None,
    );
    let now = Instant::now();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let (_, mut conn) = ep.connect(now, config.clone(), to, "use1-a")?;
        let mut buf = Vec::new();
        let t = conn.poll_transmit(now, 1, &mut buf).context("no Initial")?;
        buf.truncate(t.size);
        out.push(buf);
    }
    Ok(out)
}

fn metric(c: &Cluster, id: &str, series: &str) -> Result<f64> {
    let (_, text) = c.admin_get(id, "/metrics")?;
    Ok(common::metric(&text, series))
}

/// 20,000 Initials from one source port, then 20,000 from 200 ports: past the first
/// handshakes the replica answers with stateless Retries, its memory stays within
/// 64 MiB of where it was, and gets (on open connections, and from new processes)
/// are served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshake_floods_are_retried_and_memory_stays_bounded() -> Result<()> {
    let c = Cluster::up(false)?;
    let at = "use1-a";
    let (pid, addr) = (c.pid(at)?, c.addr(at)?);
    let ca = certs::load_ca(&c.file.certs)?;
    let own = certs::load_credential(&c.file.certs, &Credential::Client("client-frontend".into()))?;
    let made = Instant::now();
    let flood = initials(addr, tls::client_config(&ca, own)?, 40_000)?;
    eprintln!("made {} Initials in {:?}", flood.len(), made.elapsed());
    let fe = c.client(US, "frontend").await?;
    let key = "us/flooded";
    fe.mutate(
        common::profile_set(key, &b"v"[..])?,
        &pangea_client::WriteOptions::default(),
    )
    .await?;
    let baseline = rss_bytes(pid)?;
    let retried_before = metric(
        &c,
        at,
        "pangea_connection_attempts_total{outcome=\"retried\"}",
    )?;

    // Reads on an open connection, all through the floods.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (fe, stop) = (fe.clone(), stop.clone());
        tokio::spawn(async move {
            let mut h = hdrhistogram::Histogram::<u64>::new(3)?;
            let mut failed = Vec::new();
            let opts =
                pangea_client::ReadOptions::default().with_deadline(Duration::from_millis(500));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                match fe
                    .get("ad_profiles", Bytes::from_static(b"us/flooded"), &opts)
                    .await
                {
                    Ok(r) if r.value.is_some() => h.record(t.elapsed().as_micros() as u64)?,
                    Ok(r) => failed.push(format!("no row from {}", r.replica)),
                    Err(e) => failed.push(format!("{e} after {:?}", t.elapsed())),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok((h, failed))
        })
    };
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let watching = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(rss) = rss_bytes(pid) {
                    peak.fetch_max(rss, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let (one_port, many_ports) = flood.split_at(20_000);
    let sent = Instant::now();
    let flooding = tokio::task::spawn_blocking({
        let (one_port, many_ports) = (one_port.to_vec(), many_ports.to_vec());
        move || -> Result<()> {
            // About 8,000 a second (the reported flood was 3,300 a second): faster
            // and the kernel drops most at the replica's socket, which is no test
            // of the replica.
            let pace = |i: usize| {
                if i % 400 == 399 {
                    std::thread::sleep(Duration::from_millis(50));
                }
            };
            let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
            for (i, d) in one_port.iter().enumerate() {
                let _ = s.send_to(d, addr);
                pace(i);
            }
            for (j, chunk) in many_ports.chunks(100).enumerate() {
                let s = std::net::UdpSocket::bind("127.0.0.1:0")?;
                for (i, d) in chunk.iter().enumerate() {
                    let _ = s.send_to(d, addr);
                    pace(j * 100 + i);
                }
            }
            Ok(())
        }
    });
    // New processes connect during the flood (a Retry costs them one round trip).
    let cluster = c.cluster_path();
    let cluster = cluster.to_str().context("path")?.to_owned();
    let mut cli_ok = 0;
    for _ in 0..3 {
        let out = common::pangea(
            &["get", "--cluster", &cluster, "--region", US, key],
            Duration::from_secs(20),
        )?;
        ensure!(
            out.status.success(),
            "pangea get during the flood: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        cli_ok += 1;
    }
    flooding.await??;
    eprintln!("sent 40,000 Initials in {:?}", sent.elapsed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (h, failed) = reader.await??;
    watching.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let retried = metric(
        &c,
        at,
        "pangea_connection_attempts_total{outcome=\"retried\"}",
    )? - retried_before;
    eprintln!(
        "RSS {} -> peak {} MiB; {retried} retried; {} gets on an open connection during the floods: \
         p50 {} µs, p99 {} µs, p999 {} µs, max {} µs, {} failed; {cli_ok} pangea get ok",
        baseline / MIB,
        peak / MIB,
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
        failed.len()
    );
    let (_, text) = c.admin_get(at, "/metrics")?;
    let attempts: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("pangea_connection_attempts_total"))
        .collect();
    eprintln!("{attempts:#?}");
    ensure!(
        failed.is_empty(),
        "{} gets failed during the floods: {failed:?}",
        failed.len()
    );
    ensure!(
        retried >= 30_000.0,
        "only {retried} of 40,000 Initials were retried"
    );
    ensure!(
        peak <= baseline + 64 * MIB,
        "RSS {} -> {} MiB",
        baseline / MIB,
        peak / MIB
    );
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}

/// A frontend that starts with 400 calls in flight opens one connection per slot
/// (two per replica), not one per call: the calls that find a slot empty share one
/// handshake. A herd of handshakes from one process would meet the replica's
/// per-source limit (128), and the calls past it would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_starting_with_hundreds_of_calls_opens_one_connection_per_slot() -> Result<()> {
    let c = Cluster::up(false)?;
    let writer = c.client(US, "frontend").await?;
    writer
        .mutate(
            common::profile_set("us/herd", &b"v"[..])?,
            &pangea_client::WriteOptions::default(),
        )
        .await?;
    let accepted = |c: &Cluster| -> Result<f64> {
        let mut sum = 0.0;
        for id in c.ids() {
            sum += metric(
                c,
                &id,
                "pangea_connection_attempts_total{outcome=\"accepted\"}",
            )?;
        }
        Ok(sum)
    };
    let before = accepted(&c)?;
    let fe = c.client(US, "frontend").await?;
    let opts = pangea_client::ReadOptions::default().with_deadline(Duration::from_secs(5));
    let calls: Vec<_> = (0..400)
        .map(|_| {
            let (fe, opts) = (fe.clone(), opts.clone());
            tokio::spawn(async move {
                fe.get("ad_profiles", Bytes::from_static(b"us/herd"), &opts)
                    .await
            })
        })
        .collect();
    let mut failed = Vec::new();
    for call in calls {
        match call.await? {
            Ok(r) if r.value.is_some() => {}
            Ok(r) => failed.push(format!("no row from {}", r.replica)),
            Err(e) => failed.push(e.to_string()),
        }
    }
    let opened = accepted(&c)? - before;
    eprintln!(
        "400 calls from a fresh client: {opened} connections accepted, {} failed",
        failed.len()
    );
    ensure!(
        failed.is_empty(),
        "{} of 400 gets failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let slots = 2 * c.ids().len();
    ensure!(
        opened <= slots as f64,
        "400 calls from a fresh client opened {opened} connections; at most {slots} (2 per replica)"
    );
    c.down(common::CLEANUP_GRACE_MS)?;
    Ok(())
}

/// A client certificate for `pangea://client/<name>?app_profile=frontend`, signed by
/// the CA of `ca_dir`, valid from January 1st of one year to January 1st of
/// another, written where the
/// client library looks for `Credential::Client(name)` in `into_dir`.
fn client_cert(
    ca_dir: &std::path::Path,
    into_dir: &std::path::Path,
    name: &str,
    (from, to): (i32, i32),
) -> Result<()> {
    let ca_pem = std::fs::read_to_string(certs::ca_cert_path(ca_dir))?;
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(certs::ca_key_path(ca_dir))?)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key)?;
    let mut params = rcgen::CertificateParams::default();
    params.subject_alt_names = vec![rcgen::SanType::URI(
        format!("pangea://client/{name}?app_profile=frontend").try_into()?,
    )];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.not_before = rcgen::date_time_ymd(from, 1, 1);
    params.not_after = rcgen::date_time_ymd(to, 1, 1);
    let key = rcgen::KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let path = certs::client_cert_path(into_dir, name);
    std::fs::create_dir_all(path.parent().context("parent")?)?;
    std::fs::write(&path, cert.pem())?;
    std::fs::write(path.with_extension("key"), key.serialize_pem())?;
    Ok(())
}

/// **Handshake errors name their cause on both sides.** A client without a
/// certificate, with the wrong ALPN, with a certificate of another CA, or with an
/// expired one, is refused by the replica's TLS with an alert the client reads
/// back (`pangea_net::handshake::Refusal`), not a bare "connection lost" or a
/// short read; the replica counts each by reason
/// (`pangea_handshakes_refused_total{reason}`) and logs it. The client library
/// reports the same refusal as its error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_handshakes_say_why_on_both_sides() -> Result<()> {
    use pangea_net::handshake::{By, Refusal};
    let cluster = Cluster::up_with(
        "topology/single-replica.toml",
        "topology/single-replica.placement.toml",
        false,
    )?;
    let dir = &cluster.file.certs;
    let ca = certs::load_ca(dir)?;
    let addr: std::net::SocketAddr = cluster.replica("solo")?.address.parse()?;
    let own = || certs::load_client(dir, "client-frontend");

    // Another CA's client, and one of ours that expired a year ago.
    let foreign_ca = tempfile::tempdir()?;
    certs::init_ca(foreign_ca.path())?;
    client_cert(foreign_ca.path(), dir, "foreign", (2024, 2124))?;
    client_cert(dir, dir, "expired", (2020, 2021))?;

    let no_cert = {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone())?;
        let mut c = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = vec![tls::ALPN_PANGEA_V1.to_vec()];
        c
    };
    let wrong_alpn = {
        let mut c = tls::client_crypto(&ca, own()?)?;
        c.alpn_protocols = vec![b"h3".to_vec()];
        c
    };
    let cases = [
        ("no certificate", no_cert, Refusal::NoCertificate),
        ("wrong ALPN", wrong_alpn, Refusal::WrongAlpn),
        (
            "another CA's certificate",
            tls::client_crypto(&ca, certs::load_client(dir, "foreign")?)?,
            Refusal::UnknownCa,
        ),
        (
            "an expired certificate",
            tls::client_crypto(&ca, certs::load_client(dir, "expired")?)?,
            Refusal::Expired,
        ),
    ];
    tokio::time::timeout(Duration::from_secs(60), async {
        for (what, crypto, want) in cases {
            let raw = RawClient::new(tls::quic_client(crypto)?)?;
            // With TLS 1.3 the client may finish its side before the replica
            // refuses: then the first request fails, and the connection says why.
            let ended = match raw.connect(addr, "solo").await {
                Err(e) => e
                    .downcast::<quinn::ConnectionError>()
                    .with_context(|| format!("{what}: not a connection error"))?,
                Ok(conn) => {
                    let req = common::request(
                        "frontend",
                        1_000_000,
                        pb::client_request::Request::Watermarks(pb::WatermarkRequest::default()),
                    );
                    let answered = common::call(&conn, &req).await;
                    ensure!(answered.is_err(), "{what}: a request was answered");
                    conn.closed().await
                }
            };
            let refusal = Refusal::of(&ended);
            let said = pangea_net::handshake::describe("replica solo", &ended);
            println!("{what}: {said}");
            ensure!(refusal == Some((want, By::Peer)), "{what}: {ended:?}");
            ensure!(said.contains("refused the TLS handshake"), "{said}");
        }
        // The replica counted each by its reason.
        let (_, text) = cluster.admin_get("solo", "/metrics")?;
        for reason in ["no_certificate", "wrong_alpn", "unknown_ca", "expired"] {
            let n = common::metric(
                &text,
                &format!("pangea_handshakes_refused_total{{reason=\"{reason}\"}}"),
            );
            ensure!(n >= 1.0, "{reason}: counted {n}");
        }
        // And logged why (at most once a second: the cases above came faster).
        let log = std::fs::read_to_string(cluster.dir.path().join("logs").join("solo.log"))?;
        ensure!(
            log.contains("handshake refused")
                && log.contains("no client certificate was presented"),
            "the replica's log does not say why: {}",
            log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
        );
        // The client library says the same.
        let mut config =
            pangea_client::ClientConfig::from_cluster(&cluster.file, "local-1", "frontend")?;
        config.credential = Credential::Client("expired".into());
        let client = pangea_client::Client::connect(config).await?;
        let e = client
            .get("ad_profiles", "k", &pangea_client::ReadOptions::default())
            .await
            .expect_err("an expired certificate was served");
        println!("client library: {e}");
        ensure!(
            e.to_string()
                .contains("refused the TLS handshake: the certificate is expired"),
            "{e}"
        );
        anyhow::Ok(())
    })
    .await
    .context("handshake test timed out")??;
    cluster.down(2_000)?;
    Ok(())
}
