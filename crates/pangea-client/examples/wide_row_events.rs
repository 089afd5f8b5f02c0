//! Algolia's wide-row pattern: one row per user, one column per event
//! (`<kind>:<time>`), and reads that want one kind of event filter on the
//! qualifier prefix. Writes such a row, then reads one kind of event both ways —
//! a server-side `QualifierPrefix` filter, and the whole row filtered here — and
//! reports each way's latency (p50/p99/p999, HDR histograms) and bytes received.
//!
//! ```sh
//! pangea cluster up topology/local-3-regions.toml --placement topology/local-3-regions.placement.toml --data-dir /tmp/pangea
//! cargo run --release -p pangea-client --example wide_row_events -- /tmp/pangea/cluster.toml
//! ```
//!
//! Optional arguments after the cluster file: events in the row (default 2,000),
//! bytes per event (default 100), reads per way (default 2,000).

use bytes::Bytes;
use hdrhistogram::Histogram;
use pangea_client::{
    CellFilter, Client, ClientConfig, Mutation, ReadFilter, ReadOptions, Row, RowMutation,
    WriteOptions,
};
use pangea_topology::cluster::ClusterFile;
use std::time::{Duration, Instant};

/// Event kinds: the read wants `click`, one event in 20.
const KINDS: [&str; 4] = ["view", "view", "hover", "scroll"];

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .ok_or("usage: wide_row_events CLUSTER_FILE [EVENTS] [EVENT_BYTES] [READS]")?;
    let mut number = |default: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(args
            .next()
            .map(|a| a.parse())
            .transpose()?
            .unwrap_or(default))
    };
    let (events, event_bytes, reads) = (number(2_000)?, number(100)?, number(2_000)?);
    let cluster = ClusterFile::load(path.as_ref())?;
    let client = Client::connect(ClientConfig::from_cluster(
        &cluster,
        "us-east-1",
        "frontend",
    )?)
    .await?;

    // The user's row: every 20th event a click, in batches of 500 columns.
    let user = "us/wide-row-example";
    let column = |n: usize| {
        let kind = if n.is_multiple_of(20) {
            "click"
        } else {
            KINDS[n % 4]
        };
        format!("{kind}:{n:08}")
    };
    let mut token = None;
    for start in (0..events).step_by(500) {
        let cells = (start..events.min(start + 500))
            .map(|n| Mutation::SetCell {
                family: "events".into(),
                column: Bytes::from(column(n)),
                value: Bytes::from(vec![b'x'; event_bytes]),
            })
            .collect();
        let m = RowMutation::new("ad_profiles", user, cells, &Default::default())?;
        let opts = WriteOptions {
            deadline: Some(Duration::from_secs(5)),
            ..Default::default()
        };
        let w = client.mutate(m, &opts).await?;
        token = Some(w.value);
    }
    let base = ReadOptions::default()
        .with_consistency(pangea_client::Consistency::Watermark(
            token.ok_or("no events")?,
        ))
        .with_deadline(Duration::from_secs(2));
    let want = (0..events).filter(|n| n.is_multiple_of(20)).count();

    let mut server = base.clone();
    server.filter = ReadFilter {
        families: vec!["events".into()],
        cells: Some(CellFilter::QualifierPrefix(Bytes::from_static(b"click:"))),
        ..Default::default()
    };
    let mut whole = base.clone();
    whole.filter.families = vec!["events".into()];
    println!(
        "row {user}: {events} events of {event_bytes} B, {want} clicks; {reads} reads each way, interleaved"
    );
    let mut ways = [
        Way::new("server-side filter (QualifierPrefix \"click:\")"),
        Way::new("whole row, filtered in the client"),
    ];
    for _ in 0..reads {
        for (i, way) in ways.iter_mut().enumerate() {
            let started = Instant::now();
            let row = if i == 0 {
                client.get("ad_profiles", user, &server).await?.value
            } else {
                client.get("ad_profiles", user, &whole).await?.value
            };
            let received = row.as_ref().map_or(0, prost_len);
            let clicks = clicks_of(row);
            way.latency.record(started.elapsed().as_micros() as u64)?;
            way.bytes = received;
            if clicks != want {
                return Err(format!("{}: {clicks} clicks, want {want}", way.name).into());
            }
        }
    }
    for w in &ways {
        let q = |p: f64| w.latency.value_at_quantile(p) as f64 / 1e3;
        println!(
            "{:<50} p50 {:>7.3} ms  p99 {:>7.3} ms  p999 {:>7.3} ms  {:>8} B a read",
            w.name,
            q(0.5),
            q(0.99),
            q(0.999),
            w.bytes
        );
    }
    let p50 = |w: &Way| w.latency.value_at_quantile(0.5) as f64;
    println!(
        "speed-up at p50: {:.1}x, bytes: {:.1}x fewer",
        p50(&ways[1]) / p50(&ways[0]),
        ways[1].bytes as f64 / ways[0].bytes.max(1) as f64
    );
    Ok(())
}

struct Way {
    name: &'static str,
    latency: Histogram<u64>,
    bytes: usize,
}

impl Way {
    fn new(name: &'static str) -> Way {
        Way {
            name,
            latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("bounds"),
            bytes: 0,
        }
    }
}

/// The click events of a row, counted where the read's answer lands: every cell
/// of a server-filtered row, the `click:` cells of a whole one.
fn clicks_of(row: Option<Row>) -> usize {
    row.iter()
        .flat_map(|r| r.families.iter())
        .flat_map(|f| f.cells.iter())
        .filter(|c| c.column.starts_with(b"click:"))
        .count()
}

fn prost_len(row: &Row) -> usize {
    use pangea_proto::Message as _;
    row.encoded_len()
}
