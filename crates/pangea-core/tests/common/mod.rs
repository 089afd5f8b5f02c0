//! What the replica scenario tests share: the local three-region deployment, time
//! passed in from a fixed origin, and an in-memory replica.

#![allow(dead_code, unreachable_pub)]

use pangea_core::MemStorage;
use pangea_core::ReplicaId;
use pangea_core::replica::{Config, Now, Replica};
use pangea_topology::Deployment;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// `topology/local-3-regions.toml` with its placement (`global`, `eu-resident`).
pub fn deployment() -> Arc<Deployment> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    Arc::new(
        Deployment::load(
            &root.join("local-3-regions.toml"),
            Some(&root.join("local-3-regions.placement.toml")),
        )
        .unwrap(),
    )
}

/// Wall-clock origin of the tests' time.
pub const T0: u64 = 1_700_000_000_000;

/// `ms` milliseconds after the start.
pub fn at(ms: u64) -> Now {
    Now {
        mono_us: ms * 1_000,
        wall_ms: T0 + ms,
    }
}

/// Replica `id` of `d` on an empty in-memory store, started at time 0.
pub fn replica(d: &Arc<Deployment>, id: &str) -> Replica<MemStorage> {
    Replica::new(
        id.into(),
        d.clone(),
        Config::default(),
        MemStorage::new(),
        7,
        at(0),
    )
    .unwrap()
}

/// Delivers every frame the replicas send, flushing each first, until none is in
/// flight (a lossless, instant network).
pub fn pump(replicas: &mut BTreeMap<String, Replica<MemStorage>>, now: Now) {
    loop {
        let mut moved = false;
        let ids: Vec<String> = replicas.keys().cloned().collect();
        for id in &ids {
            let r = replicas.get_mut(id).unwrap();
            r.flush(now).unwrap();
            let out: Vec<_> = std::iter::from_fn(|| r.poll_transmit()).collect();
            for t in out {
                replicas.get_mut(id).unwrap().handle_sent(&t.to, t.bytes);
                if let Some(to) = replicas.get_mut(t.to.as_str()) {
                    to.handle_frame(now, &ReplicaId::from(id.as_str()), t.frame)
                        .unwrap();
                    moved = true;
                }
            }
        }
        if !moved {
            return;
        }
    }
}
