//! Planning with a [`RouteTable`] worked out beforehand gives the same plans as
//! planning from the deployment on every call, whether the view answers by name or
//! by position; and plans keep their documented order (health, home region, round
//! trip, then replica id). Orders kept in an [`OrderCache`] between reads are the
//! same as orders made afresh, as long as every change to the view is reported.

use pangea_core::read::{
    Consistency, OrderCache, PeerView, ReadRequest, Reason, RouteTable, order_read_cached,
    order_read_routed, plan_read_at, plan_read_routed,
};
use pangea_core::{ReplicaId, ScopeId, Timestamp, Token, location::Location};
use pangea_topology::{Deployment, RegionId};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::LazyLock;

const T0: u64 = 1_700_000_000_000;

static DEPLOYMENT: LazyLock<Deployment> = LazyLock::new(|| {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../topology");
    Deployment::load(
        &root.join("four-continents.toml"),
        Some(&root.join("placement.toml")),
    )
    .unwrap()
});

/// What a client knows, per replica in id order; answers by name through `rank`.
#[derive(Debug)]
struct View {
    rank: BTreeMap<ReplicaId, usize>,
    rtt: Vec<Option<f64>>,
    down: Vec<bool>,
    covers: Vec<bool>,
    low_ms: Vec<Option<u64>>,
    /// Answer the `_ranked` methods by position (as the simulator does) or through
    /// the names (as the default methods do).
    by_rank: bool,
}

impl PeerView for View {
    fn rtt_ms(&self, r: &ReplicaId) -> Option<f64> {
        self.rtt[self.rank[r]]
    }
    fn is_down(&self, r: &ReplicaId) -> bool {
        self.down[self.rank[r]]
    }
    fn covers(&self, r: &ReplicaId, _: &Token) -> bool {
        self.covers[self.rank[r]]
    }
    fn freshness(&self, r: &ReplicaId, _: &ScopeId) -> Option<Timestamp> {
        self.low_ms[self.rank[r]].map(|ms| Timestamp::new(ms, 0))
    }
    fn rtt_ms_ranked(&self, rank: usize, r: &ReplicaId) -> Option<f64> {
        if self.by_rank {
            self.rtt[rank]
        } else {
            self.rtt_ms(r)
        }
    }
    fn is_down_ranked(&self, rank: usize, r: &ReplicaId) -> bool {
        if self.by_rank {
            self.down[rank]
        } else {
            self.is_down(r)
        }
    }
    fn covers_ranked(&self, rank: usize, r: &ReplicaId, t: &Token) -> bool {
        if self.by_rank {
            self.covers[rank]
        } else {
            self.covers(r, t)
        }
    }
    fn freshness_ranked(&self, rank: usize, r: &ReplicaId, s: &ScopeId) -> Option<Timestamp> {
        if self.by_rank {
            self.low_ms[rank].map(|ms| Timestamp::new(ms, 0))
        } else {
            self.freshness(r, s)
        }
    }
}

/// Each replica's position in the deployment's replicas in id order.
fn ranks() -> BTreeMap<ReplicaId, usize> {
    DEPLOYMENT
        .topology
        .replicas
        .keys()
        .cloned()
        .enumerate()
        .map(|(i, id)| (id, i))
        .collect()
}

fn view() -> impl Strategy<Value = View> {
    let n = DEPLOYMENT.topology.replicas.len();
    // Few distinct round trips, so that ties (broken by id) are common.
    let rtt = prop::option::of(prop::sample::select(vec![1.0, 5.0, 80.0]));
    (
        prop::collection::vec(rtt, n),
        prop::collection::vec(prop::bool::weighted(0.2), n),
        prop::collection::vec(any::<bool>(), n),
        prop::collection::vec(prop::option::of(T0 - 5_000..T0), n),
        any::<bool>(),
    )
        .prop_map(|(rtt, down, covers, low_ms, by_rank)| View {
            rank: ranks(),
            rtt,
            down,
            covers,
            low_ms,
            by_rank,
        })
}

fn consistency() -> impl Strategy<Value = Consistency> {
    let origins: Vec<ReplicaId> = DEPLOYMENT.topology.replicas.keys().cloned().collect();
    prop_oneof![
        Just(Consistency::Eventual),
        Just(Consistency::RowAffinity),
        (prop::sample::select(origins), 1u64..100).prop_map(|(origin, sequence)| {
            Consistency::Watermark(Token {
                scope: ScopeId::global(),
                origin,
                sequence,
                timestamp: Timestamp::new(T0, 0),
            })
        }),
        (0u64..3_000).prop_map(|max_ms| Consistency::BoundedStaleness { max_ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn routed_plans_equal_plans_from_the_deployment(
        view in view(),
        consistency in consistency(),
        region in prop::sample::select(DEPLOYMENT.topology.regions.keys().cloned().collect::<Vec<RegionId>>()),
        profile in prop::sample::select(DEPLOYMENT.topology.app_profiles.keys().cloned().collect::<Vec<String>>()),
        prefix in prop::sample::select(vec!["eu/", "us/", "apac/", "x/", ""]),
        user in 0u32..1_000,
    ) {
        let d = &*DEPLOYMENT;
        let profile = &d.topology.app_profiles[&profile];
        let key = format!("{prefix}{user}");
        let req = ReadRequest {
            client_region: &region,
            profile,
            table: "ad_profiles",
            key: key.as_bytes(),
            consistency: &consistency,
            deadline: None,
        };
        let location = Location::default();
        let routes = RouteTable::new(d, profile, &region);
        let routed = plan_read_routed(d, &routes, &location, &req, &view, T0);
        let direct = plan_read_at(d, &location, &req, &view, T0);
        prop_assert_eq!(&routed, &direct);
        // The order builds the plan's candidates one at a time, and keeps a prefix.
        if let (Ok(order), Ok(plan)) = (
            order_read_routed(d, &routes, &location, &req, &view, T0),
            &routed,
        ) {
            let n = plan.primary.len().min(3);
            let mut head = order.primary.clone();
            head.truncate(3);
            prop_assert_eq!(head.len(), n);
            prop_assert_eq!(head.collect::<Vec<_>>(), plan.primary[..n].to_vec());
            prop_assert_eq!(order.into_plan(), plan.clone());
        }
        // Eventual plans keep the documented order; among equals, by replica id.
        if let (Consistency::Eventual, Ok(plan)) = (&consistency, routed) {
            for w in plan.primary.windows(2) {
                let key = |c: &pangea_core::read::Candidate| {
                    (view.is_down(&c.replica), c.reason != Reason::Home, c.rtt_ms)
                };
                let (a, b) = (key(&w[0]), key(&w[1]));
                prop_assert!(a.0 <= b.0);
                if a.0 == b.0 {
                    prop_assert!(a.1 <= b.1);
                    if a.1 == b.1 {
                        prop_assert!(a.2 <= b.2);
                        if a.2 == b.2 {
                            prop_assert!(w[0].replica < w[1].replica, "ties break by id");
                        }
                    }
                }
            }
        }
    }
}

/// One step of a frontend's life: its view of one replica changes (reported to
/// the cache), or it plans a read.
#[derive(Debug, Clone)]
enum Step {
    Rtt(usize, Option<f64>),
    Down(usize, bool),
    Read(Consistency, &'static str, u32),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let n = DEPLOYMENT.topology.replicas.len();
    let rtt = prop::option::of(prop::sample::select(vec![1.0, 5.0, 80.0, 140.0]));
    let step = prop_oneof![
        1 => (0..n, rtt).prop_map(|(r, ms)| Step::Rtt(r, ms)),
        1 => (0..n, prop::bool::weighted(0.3)).prop_map(|(r, d)| Step::Down(r, d)),
        3 => (
            consistency(),
            prop::sample::select(vec!["eu/", "us/", "apac/", "x/"]),
            0u32..50
        )
            .prop_map(|(c, p, u)| Step::Read(c, p, u)),
    ];
    prop::collection::vec(step, 1..60)
}

fn read<'a>(
    region: &'a RegionId,
    profile: &'a pangea_topology::AppProfile,
    key: &'a str,
    consistency: &'a Consistency,
) -> ReadRequest<'a> {
    ReadRequest {
        client_region: region,
        profile,
        table: "ad_profiles",
        key: key.as_bytes(),
        consistency,
        deadline: None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Through any sequence of reported changes, a cached order is the order
    /// planned afresh, candidate for candidate (and prefix for prefix).
    #[test]
    fn cached_orders_equal_fresh_ones(
        mut view in view(),
        steps in steps(),
        region in prop::sample::select(DEPLOYMENT.topology.regions.keys().cloned().collect::<Vec<RegionId>>()),
    ) {
        let d = &*DEPLOYMENT;
        let profile = &d.topology.app_profiles["frontend"];
        let routes = RouteTable::new(d, profile, &region);
        let location = Location::default();
        let mut cache = OrderCache::new();
        for step in steps {
            match step {
                Step::Rtt(r, ms) => {
                    view.rtt[r] = ms;
                    cache.invalidate(r);
                }
                Step::Down(r, down) => {
                    view.down[r] = down;
                    cache.invalidate(r);
                }
                Step::Read(consistency, prefix, user) => {
                    let key = format!("{prefix}{user}");
                    let req = read(&region, profile, &key, &consistency);
                    let scope = location.scope_of(d, req.table, req.key);
                    let fresh = plan_read_routed(d, &routes, &location, &req, &view, T0);
                    let cached =
                        order_read_cached(d, &routes, &mut cache, scope, &location, &req, &view, T0);
                    match (cached, fresh) {
                        (Ok(order), Ok(plan)) => {
                            let mut head = order.primary.clone();
                            head.truncate(2);
                            let n = plan.primary.len().min(2);
                            prop_assert_eq!(head.collect::<Vec<_>>(), plan.primary[..n].to_vec());
                            prop_assert_eq!(order.into_plan(), plan);
                        }
                        (cached, fresh) => prop_assert_eq!(cached.err(), fresh.err()),
                    }
                }
            }
        }
    }
}

/// The cache's debug check is what keeps a caller honest: a change the cache is
/// not told of fails the next read that sees it.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "missed an invalidation")]
fn an_unreported_change_fails_the_debug_check() {
    let d = &*DEPLOYMENT;
    let profile = &d.topology.app_profiles["frontend"];
    let region = RegionId::new("us-east-1");
    let routes = RouteTable::new(d, profile, &region);
    let location = Location::default();
    let n = d.topology.replicas.len();
    let mut view = View {
        rank: ranks(),
        rtt: vec![None; n],
        down: vec![false; n],
        covers: vec![false; n],
        low_ms: vec![None; n],
        by_rank: true,
    };
    let mut cache = OrderCache::new();
    let consistency = Consistency::Eventual;
    let req = read(&region, profile, "us/1", &consistency);
    let order = |cache: &mut OrderCache, view: &View| {
        let scope = location.scope_of(d, req.table, req.key);
        order_read_cached(d, &routes, cache, scope, &location, &req, view, T0)
    };
    let first = order(&mut cache, &view).unwrap().primary.next().unwrap();
    // The nearest replica is now far away, and nobody says so.
    let rank = view.rank[&first.replica];
    view.rtt[rank] = Some(10_000.0);
    let _ = order(&mut cache, &view);
}

/// A view in which every replica has answered in `ms`, none is down.
fn measured_alike(ms: f64) -> View {
    let n = DEPLOYMENT.topology.replicas.len();
    View {
        rank: ranks(),
        rtt: vec![Some(ms); n],
        down: vec![false; n],
        covers: vec![false; n],
        low_ms: vec![None; n],
        by_rank: true,
    }
}

/// Measured round trips never bring another region nearer than the topology says:
/// with every replica measured alike (a local cluster without WAN emulation), an
/// eventual read goes first to the client's own region, whichever it is; a
/// replica of another region measured slower than the topology says is ordered by
/// its measurement.
#[test]
fn measurements_never_bring_another_region_nearer_than_the_topology() {
    let d = &*DEPLOYMENT;
    let profile = &d.topology.app_profiles["frontend"];
    let location = Location::default();
    let ranks = ranks();
    let region_of = |r: &ReplicaId| d.topology.replicas[r.as_str()].region.clone();
    for region in d.topology.regions.keys() {
        let has_own = d
            .topology
            .replicas
            .values()
            .any(|r| &r.region == region && r.role.stores_rows());
        if !has_own {
            continue;
        }
        // Every replica answers in 0.2 ms, those of the client's region too.
        let view = measured_alike(0.2);
        let consistency = Consistency::Eventual;
        let req = read(region, profile, "x/1", &consistency);
        let plan = plan_read_at(d, &location, &req, &view, T0).unwrap();
        assert_eq!(
            region_of(&plan.primary[0].replica),
            *region,
            "from {region}: {:?}",
            plan.primary
        );
        // Beyond the client's region, the topology's order (its estimates are the
        // floor every 0.2 ms measurement is raised to).
        let away: Vec<f64> = plan
            .primary
            .iter()
            .filter(|c| region_of(&c.replica) != *region)
            .map(|c| c.rtt_ms)
            .collect();
        assert!(away.is_sorted_by(|a, b| a <= b), "from {region}: {away:?}");
        assert!(away.iter().all(|ms| *ms > 0.2), "from {region}: {away:?}");
    }
    // A measurement above the estimate counts as measured.
    let region = RegionId::new("us-east-1");
    let req = read(&region, profile, "x/1", &Consistency::Eventual);
    let mut view = measured_alike(0.2);
    let plan = plan_read_at(d, &location, &req, &view, T0).unwrap();
    let far = plan
        .primary
        .iter()
        .find(|c| region_of(&c.replica) != region)
        .unwrap()
        .clone();
    view.rtt[ranks[&far.replica]] = Some(far.rtt_ms + 500.0);
    let plan = plan_read_at(d, &location, &req, &view, T0).unwrap();
    let again = plan
        .primary
        .iter()
        .find(|c| c.replica == far.replica)
        .unwrap();
    assert_eq!(again.rtt_ms, far.rtt_ms + 500.0);
}
