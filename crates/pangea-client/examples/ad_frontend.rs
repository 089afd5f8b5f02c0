//! An ad frontend in miniature: look up a user's profile, boost the segments an ad
//! event touched, and write the profile back; count the ad's impression against
//! its campaign's frequency cap (an increment that merges with the other
//! regions', not a rewrite of the profile) — then read both back from another
//! region with the writes' tokens (read-your-writes across regions).
//!
//! ```sh
//! pangea cluster up topology/local-3-regions.toml --placement topology/local-3-regions.placement.toml --data-dir /tmp/pangea --emulate-wan
//! cargo run -p pangea-client --example ad_frontend -- /tmp/pangea/cluster.toml
//! ```

use pangea_client::{
    AdProfile, Client, ClientConfig, Consistency, ReadOptions, Segment, WriteOptions,
};
use pangea_topology::cluster::ClusterFile;
use std::fmt::Write;
use std::time::Duration;

#[allow(dead_code)] // unused when the tests compile this file as a module
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: ad_frontend CLUSTER_FILE")?;
    print!("{}", run(path.as_ref()).await?);
    Ok(())
}

/// The frontend's work; returns what it prints (the tests check it).
pub(crate) async fn run(path: &std::path::Path) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::new();
    let cluster = ClusterFile::load(path)?;
    let frontend = Client::connect(ClientConfig::from_cluster(
        &cluster,
        "us-east-1",
        "frontend",
    )?)
    .await?;
    let user = "us/frontend-example";

    // 1. Look the profile up (eventual: the nearest replica answers).
    let found = frontend.get_profile(user, &ReadOptions::default()).await?;
    let mut profile = found.value.unwrap_or_else(|| AdProfile {
        user_id: user.into(),
        ..Default::default()
    });
    writeln!(
        out,
        "read {user} from {} ({}, {:?}): {} segments",
        found.replica,
        found.reason,
        found.latency,
        profile.segments.len()
    )?;

    // 2. An ad event: the user clicked a red-shoe ad. Boost the segments it touched.
    for (name, boost) in [("color:Red", 3), ("category:Shoes", 5)] {
        match profile.segments.iter_mut().find(|s| s.name == name) {
            Some(s) => s.score += boost,
            None => profile.segments.push(Segment {
                name: name.into(),
                score: boost,
            }),
        }
    }
    profile.segments.sort_by(|a, b| a.name.cmp(&b.name));
    profile.update_time_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;

    // 3. Write it back; keep the token with the user's session.
    let written = frontend
        .put_profile(user, &profile, &WriteOptions::default())
        .await?;
    writeln!(
        out,
        "wrote {user} at {} in {:?}",
        written.replica, written.latency
    )?;

    // 3b. The ad was shown: count it against its campaign's frequency cap, if the
    // cap allows another. An increment: frontends in every region count into the
    // same counter at once and none is lost (docs/client.md, Counters).
    const CAMPAIGN: &str = "camp-17";
    const CAP: i64 = 1_000;
    let shown = frontend
        .impressions(user, CAMPAIGN, &ReadOptions::default())
        .await?
        .value;
    let counted = if shown < CAP {
        Some(
            frontend
                .count_impression(user, CAMPAIGN, &WriteOptions::default())
                .await?,
        )
    } else {
        None
    };
    writeln!(
        out,
        "impressions of {CAMPAIGN} in the window: {shown} of {CAP} before this one"
    )?;

    // 4. The user's next request lands in Europe: read-your-writes with the token.
    let europe = Client::connect(ClientConfig::from_cluster(
        &cluster,
        "eu-west-1",
        "frontend",
    )?)
    .await?;
    // A fresh client's first read may need a handshake with the token's origin
    // across the ocean (the fallback race): a deadline of a few round trips.
    let opts = ReadOptions::default()
        .with_consistency(Consistency::Watermark(written.value))
        .with_deadline(Duration::from_secs(2));
    let seen = europe.get_profile(user, &opts).await?;
    let red = seen
        .value
        .as_ref()
        .and_then(|p| p.segments.iter().find(|s| s.name == "color:Red"))
        .map(|s| s.score);
    writeln!(
        out,
        "read back in eu-west-1 from {} ({}): color:Red = {red:?}",
        seen.replica, seen.reason
    )?;
    if let Some(counted) = counted {
        let opts = ReadOptions::default()
            .with_consistency(Consistency::Watermark(counted.value))
            .with_deadline(Duration::from_secs(2));
        let now = europe.impressions(user, CAMPAIGN, &opts).await?;
        writeln!(
            out,
            "impressions of {CAMPAIGN} seen in eu-west-1: {} (was {shown})",
            now.value
        )?;
    }
    Ok(out)
}
