//! Read routing, the client's side of [`super`]: which replicas to ask for a read,
//! in which order, and which to race as fallbacks.

use super::{Consistency, Reason, staleness_ms};
use crate::hlc::Timestamp;
use crate::ids::{RegionId, ReplicaId, ScopeId};
use crate::location::Location;
use crate::token::Token;
use pangea_topology::shard::GroupId;
use pangea_topology::{AppProfile, Deployment, Priority, Replica, Role, Routing};
use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub replica: ReplicaId,
    pub reason: Reason,
    /// Measured round trip, or the topology's estimate.
    pub rtt_ms: f64,
}

/// Whom to ask for one read.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadPlan {
    /// The row's scope (placement policy).
    pub scope: ScopeId,
    /// Ask the first; fail over (or hedge) to the next, in order.
    pub primary: Vec<Candidate>,
    /// Watermark reads: if the first answer is "not covered", ask all of these at
    /// once (the origin and replicas last known to cover the token); the first
    /// covered answer wins.
    pub fallback: Vec<Candidate>,
}

/// Why no replica may serve a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// The row's placement policy and the app profile leave no replica (fail closed).
    NoEligibleReplica { scope: ScopeId, profile: String },
    /// More eligible replicas than a read's order can rank.
    TooManyReplicas {
        scope: ScopeId,
        replicas: usize,
        limit: usize,
    },
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::NoEligibleReplica { scope, profile } => {
                write!(
                    f,
                    "no replica allowed by placement policy {scope:?} is usable by app profile {profile:?}"
                )
            }
            RouteError::TooManyReplicas {
                scope,
                replicas,
                limit,
            } => write!(
                f,
                "placement policy {scope:?} has {replicas} eligible replicas; a read ranks at most {limit}"
            ),
        }
    }
}

impl std::error::Error for RouteError {}

/// What a client knows about replicas.
pub trait PeerView {
    /// Measured round trip (EWMA), if any.
    fn rtt_ms(&self, replica: &ReplicaId) -> Option<f64>;
    /// Known to be failing right now.
    fn is_down(&self, replica: &ReplicaId) -> bool;
    /// Whether `replica`'s last-known watermarks cover `token` (false if unknown).
    fn covers(&self, replica: &ReplicaId, token: &Token) -> bool;
    /// `replica`'s freshness in `scope` as the client judges it now: its last
    /// answer's ([`ScopeWatermarks::freshness`](crate::watermark::ScopeWatermarks::freshness))
    /// carried forward by [`freshness_now`](super::freshness_now), if any
    /// answer said: bounded reads go where it is within their bound.
    fn freshness(&self, replica: &ReplicaId, scope: &ScopeId) -> Option<Timestamp>;

    /// [`PeerView::rtt_ms`] of the replica at position `rank` of the deployment's
    /// replicas in id order (`Topology::replicas`): a view that keeps its replicas
    /// by that position answers without looking the name up.
    fn rtt_ms_ranked(&self, rank: usize, replica: &ReplicaId) -> Option<f64> {
        let _ = rank;
        self.rtt_ms(replica)
    }

    /// [`PeerView::is_down`], by position as in [`PeerView::rtt_ms_ranked`].
    fn is_down_ranked(&self, rank: usize, replica: &ReplicaId) -> bool {
        let _ = rank;
        self.is_down(replica)
    }

    /// [`PeerView::covers`], by position as in [`PeerView::rtt_ms_ranked`].
    fn covers_ranked(&self, rank: usize, replica: &ReplicaId, token: &Token) -> bool {
        let _ = rank;
        self.covers(replica, token)
    }

    /// [`PeerView::freshness`], by position as in [`PeerView::rtt_ms_ranked`].
    fn freshness_ranked(
        &self,
        rank: usize,
        replica: &ReplicaId,
        scope: &ScopeId,
    ) -> Option<Timestamp> {
        let _ = rank;
        self.freshness(replica, scope)
    }
}

/// One replica a client may route a scope's reads to, with what planning needs
/// from the topology looked up once.
#[derive(Debug, Clone)]
struct Route {
    id: ReplicaId,
    region: RegionId,
    weight: f64,
    /// Position in the deployment's replicas in id order.
    rank: usize,
    /// Position among the scope's eligible replicas in id order: equal round trips
    /// keep this order in a read's plan.
    by_id: usize,
    /// The topology's round-trip estimate from the client's region.
    est_rtt_ms: f64,
    /// The least round trip a measurement may give this route when ordering: the
    /// topology's estimate for a replica of another region, none (0) in the
    /// client's own. A measurement can only make another region look farther than
    /// the topology says, never nearer, so on a cluster whose regions share one
    /// machine or network (a local cluster without WAN emulation, where every
    /// round trip measures alike) a client still reads in its own region first.
    rtt_floor_ms: f64,
}

/// What [`plan_read_at`] works out from the deployment on every call, worked out
/// once: per scope, the replicas a client of one region and app profile may use,
/// with their topology round-trip estimates, nearest first. Build one per
/// (deployment, client region, app profile) and plan with [`plan_read_routed`];
/// the plans are the same.
#[derive(Debug, Clone)]
pub struct RouteTable {
    client_region: RegionId,
    profile: String,
    /// By scope. A scope's routes are its policy's, whatever its shard group,
    /// unless replicas run many processes: then they are the processes hosting
    /// its group. Scopes with the same routes share them.
    scopes: std::collections::BTreeMap<ScopeId, Arc<[Route]>>,
}

impl RouteTable {
    pub fn new(d: &Deployment, profile: &AppProfile, client_region: &RegionId) -> RouteTable {
        let layout = d.process_layout();
        let system = d.system_scope();
        // By (policy, hosting class; none for the system scope, on every process).
        type Class<'a> = (&'a str, Option<Vec<u32>>);
        let mut shared: std::collections::BTreeMap<Class<'_>, Arc<[Route]>> =
            std::collections::BTreeMap::new();
        let mut scopes = std::collections::BTreeMap::new();
        for s in d.scopes() {
            let class = (s != system || !layout.is_split())
                .then(|| layout.class(s.group().unwrap_or(GroupId(0))));
            let routes = shared
                .entry((s.policy(), class))
                .or_insert_with(|| routes_of(d, profile, client_region, s).into());
            scopes.insert(s.clone(), routes.clone());
        }
        RouteTable {
            client_region: client_region.clone(),
            profile: profile.name.clone(),
            scopes,
        }
    }
}

/// Every replica an app profile may use for some row (of a replica of many
/// processes, each process): what a frontend probes for round trips and
/// watermarks.
pub fn usable<'a>(
    d: &'a Deployment,
    profile: &AppProfile,
    client_region: &RegionId,
) -> Vec<&'a ReplicaId> {
    let mut out: Vec<&ReplicaId> = Vec::new();
    let scopes: Box<dyn Iterator<Item = &ScopeId>> = if d.process_layout().is_split() {
        Box::new(d.scopes())
    } else {
        Box::new(d.policies())
    };
    for scope in scopes {
        for r in eligible(d, profile, client_region, scope) {
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// [`eligible_replicas`] as routes, by the topology's round trip from the
/// client's region (then by id). A read's order is mostly that order, so sorting
/// a read's candidates starts from nearly sorted keys ([`sort_nearly_sorted`]).
fn routes_of(
    d: &Deployment,
    profile: &AppProfile,
    client_region: &RegionId,
    scope: &ScopeId,
) -> Vec<Route> {
    let eligible = eligible_replicas(d, profile, client_region, scope);
    // Both walk `Topology::replicas` in order, so ranks only grow.
    let mut ranks = d.topology.replicas.values().enumerate();
    let mut routes: Vec<Route> = eligible
        .into_iter()
        .enumerate()
        .map(|(by_id, r)| Route {
            id: r.id.clone(),
            region: r.region.clone(),
            weight: r.weight,
            rank: ranks
                .find(|(_, x)| x.id == r.id)
                .map_or(usize::MAX, |(i, _)| i),
            by_id,
            est_rtt_ms: estimated_rtt_to(d, client_region, r),
            rtt_floor_ms: if &r.region == client_region {
                0.0
            } else {
                estimated_rtt_to(d, client_region, r)
            },
        })
        .collect();
    // Stable: equal estimates stay in id order.
    routes.sort_by(|a, b| a.est_rtt_ms.total_cmp(&b.est_rtt_ms));
    routes
}

/// Replicas an app profile may use for rows of `scope`: inside the scope's policy,
/// storing rows, of the profile's priority class, and within its routing rule.
pub fn eligible<'a>(
    d: &'a Deployment,
    profile: &AppProfile,
    client_region: &RegionId,
    scope: &ScopeId,
) -> Vec<&'a ReplicaId> {
    eligible_replicas(d, profile, client_region, scope)
        .into_iter()
        .map(|r| &r.id)
        .collect()
}

/// [`eligible`], as the topology's replica entries (in id order).
fn eligible_replicas<'a>(
    d: &'a Deployment,
    profile: &AppProfile,
    client_region: &RegionId,
    scope: &ScopeId,
) -> Vec<&'a Replica> {
    // `Deployment::allowed` for each replica, with the policy looked up once.
    let Some(policy) = d.placement.policy(scope) else {
        return Vec::new();
    };
    d.topology
        .replicas
        .values()
        .filter(|r| r.role.stores_rows() && !r.draining && policy.regions.contains(&r.region))
        .filter(|r| d.serves(r, scope))
        .filter(|r| match profile.priority {
            Priority::Serving => r.role == Role::Serving,
            Priority::Batch => r.role == Role::Batch,
        })
        .filter(|r| match &profile.routing {
            Routing::Nearest => true,
            Routing::Pinned(list) => list.contains(&r.of),
            Routing::RegionLocal => &r.region == client_region,
        })
        .collect()
}

/// The topology's round-trip estimate from a client in `region` to `replica`.
pub fn estimated_rtt_ms(d: &Deployment, region: &RegionId, replica: &ReplicaId) -> f64 {
    match d.topology.replica(replica.as_str()) {
        Some(r) => estimated_rtt_to(d, region, r),
        None => f64::INFINITY,
    }
}

fn estimated_rtt_to(d: &Deployment, region: &RegionId, r: &Replica) -> f64 {
    if &r.region == region {
        d.topology.regions[&r.region].intra_rtt_ms
    } else {
        d.topology
            .region_rtt_ms(region, &r.region)
            .unwrap_or(f64::INFINITY)
    }
}

/// One read to route: who asks, for which row, how fresh.
#[derive(Debug, Clone, Copy)]
pub struct ReadRequest<'a> {
    pub client_region: &'a RegionId,
    pub profile: &'a AppProfile,
    pub table: &'a str,
    pub key: &'a [u8],
    pub consistency: &'a Consistency,
    /// The call's deadline (`None`: none). A bounded-staleness read puts a
    /// replica it believes fresh first only if its round trip fits in it:
    /// one that cannot answer in time would spend the call on a sure miss
    /// while a nearer replica may well be fresh by now (what the caller knows
    /// of freshness is as old as the last answer).
    pub deadline: Option<std::time::Duration>,
}

/// Plans one read. See the module documentation; docs/consistency.md explains it
/// for frontend authors.
pub fn plan_read(
    d: &Deployment,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadPlan, RouteError> {
    plan_read_at(d, &Location::default(), req, view, now_ms)
}

/// [`plan_read`] with location metadata: a row's effective policy and home region
/// come from its `_location` entry when it has one.
pub fn plan_read_at(
    d: &Deployment,
    location: &Location,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadPlan, RouteError> {
    let scope = location.scope_of(d, req.table, req.key);
    let routes = routes_of(d, req.profile, req.client_region, &scope).into();
    order_routes(d, routes, scope, location, req, view, now_ms).map(ReadOrder::into_plan)
}

/// [`plan_read_at`] with the deployment's routes worked out beforehand: `routes`
/// must be built from `d` for the request's client region and app profile.
pub fn plan_read_routed(
    d: &Deployment,
    routes: &RouteTable,
    location: &Location,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadPlan, RouteError> {
    order_read_routed(d, routes, location, req, view, now_ms).map(ReadOrder::into_plan)
}

/// [`plan_read_routed`] without building the candidates: a [`ReadOrder`] builds
/// each primary candidate as it is taken, so a read answered by its first
/// replica builds one instead of one per eligible replica.
pub fn order_read_routed(
    d: &Deployment,
    routes: &RouteTable,
    location: &Location,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadOrder, RouteError> {
    let scope = location.scope_of(d, req.table, req.key);
    order_read_routed_in(d, routes, scope, location, req, view, now_ms)
}

/// [`order_read_routed`] for a row whose scope the caller worked out already: it
/// must be `location.scope_of(d, req.table, req.key)` (debug builds check).
pub fn order_read_routed_in(
    d: &Deployment,
    routes: &RouteTable,
    scope: ScopeId,
    location: &Location,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadOrder, RouteError> {
    debug_check_routed(d, routes, &scope, location, req);
    let eligible = match routes.scopes.get(&scope) {
        Some(r) => r.clone(),
        // A scope the deployment does not list (no such policy): worked out now.
        None => routes_of(d, req.profile, req.client_region, &scope).into(),
    };
    order_routes(d, eligible, scope, location, req, view, now_ms)
}

/// A frontend's read orders kept between reads: for each scope's routes and
/// home region it has read with, every route's order key and the
/// keys sorted. A read then re-keys only the replicas its view changed for
/// (about one: the last answer's round trip) instead of keying and sorting every
/// eligible replica. [`order_read_cached`] gives the order [`order_read_routed_in`]
/// gives, on one condition: the caller calls [`OrderCache::invalidate`] for a
/// replica whenever anything its view says of it changes (its round trip,
/// whether it is down, including a down mark running out). Debug builds check
/// every cached order against a fresh one.
#[derive(Debug, Default)]
pub struct OrderCache {
    entries: Vec<CachedOrder>,
}

#[derive(Debug)]
struct CachedOrder {
    /// The routes the keys are for (compared by address: a new route table is a
    /// new entry).
    routes: Arc<[Route]>,
    home: Option<RegionId>,
    /// Each route's key, by route position.
    keys: Vec<u128>,
    /// The same keys, sorted.
    sorted: Vec<u128>,
    /// The route position of each rank ([`Route::rank`]), `u32::MAX` for none.
    position: Vec<u32>,
    /// Route positions to key again, as a bit set.
    stale: Vec<u64>,
}

/// Entries an [`OrderCache`] keeps before it starts over (route tables replaced
/// by placement changes leave theirs behind).
const ORDER_CACHE_ENTRIES_MAX: usize = 64;

impl OrderCache {
    pub fn new() -> OrderCache {
        OrderCache::default()
    }

    /// What the view says of the replica at `rank` (its position in the
    /// deployment's replicas in id order) changed.
    pub fn invalidate(&mut self, rank: usize) {
        for e in &mut self.entries {
            if let Some(&i) = e.position.get(rank)
                && i != u32::MAX
            {
                e.stale[i as usize / 64] |= 1 << (i % 64);
            }
        }
    }

    /// The sorted keys of `routes` with `home` first, brought up to date.
    fn sorted(
        &mut self,
        routes: &Arc<[Route]>,
        home: Option<&RegionId>,
        view: &dyn PeerView,
    ) -> &[u128] {
        let found = self
            .entries
            .iter()
            .position(|e| Arc::ptr_eq(&e.routes, routes) && e.home.as_ref() == home);
        let i = match found {
            Some(i) => i,
            None => {
                if self.entries.len() >= ORDER_CACHE_ENTRIES_MAX {
                    self.entries.clear();
                }
                self.entries
                    .push(CachedOrder::new(routes.clone(), home.cloned(), view));
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[i];
        e.refresh(view);
        &e.sorted
    }
}

impl CachedOrder {
    fn new(routes: Arc<[Route]>, home: Option<RegionId>, view: &dyn PeerView) -> CachedOrder {
        let keys = route_keys(&routes, home.as_ref(), view);
        let mut sorted = keys.clone();
        sort_nearly_sorted(&mut sorted);
        let ranks = routes.iter().map(|r| r.rank).filter(|&r| r != usize::MAX);
        let mut position = vec![u32::MAX; ranks.max().map_or(0, |m| m + 1)];
        for (i, r) in routes.iter().enumerate() {
            if let Some(p) = position.get_mut(r.rank) {
                *p = i as u32;
            }
        }
        CachedOrder {
            stale: vec![0; routes.len().div_ceil(64)],
            routes,
            home,
            keys,
            sorted,
            position,
        }
    }

    /// Keys the stale routes again and moves each to its new place.
    fn refresh(&mut self, view: &dyn PeerView) {
        for w in 0..self.stale.len() {
            while self.stale[w] != 0 {
                let i = w * 64 + self.stale[w].trailing_zeros() as usize;
                self.stale[w] &= self.stale[w] - 1;
                let key = route_key(i, &self.routes[i], self.home.as_ref(), view);
                let old = std::mem::replace(&mut self.keys[i], key);
                if key != old {
                    // Keys are unique (the route's position is in them).
                    if let Ok(at) = self.sorted.binary_search(&old) {
                        self.sorted.remove(at);
                    }
                    let at = self.sorted.binary_search(&key).unwrap_or_else(|at| at);
                    self.sorted.insert(at, key);
                }
            }
        }
    }
}

/// [`order_read_routed_in`] with the routes' keys kept in `cache` between reads
/// (see [`OrderCache`]): the same order.
#[allow(clippy::too_many_arguments)]
pub fn order_read_cached(
    d: &Deployment,
    routes: &RouteTable,
    cache: &mut OrderCache,
    scope: ScopeId,
    location: &Location,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadOrder, RouteError> {
    let Some(eligible) = routes.scopes.get(&scope) else {
        return order_read_routed_in(d, routes, scope, location, req, view, now_ms);
    };
    debug_check_routed(d, routes, &scope, location, req);
    check_routes(eligible, &scope, req)?;
    let home = read_home(d, eligible, location, req);
    let sorted = cache.sorted(eligible, home.as_ref(), view);
    #[cfg(debug_assertions)]
    {
        let fresh = sorted_route_keys(eligible, home.as_ref(), view);
        assert_eq!(
            sorted, fresh,
            "an order cache missed an invalidation: cached keys differ from the view's"
        );
    }
    order_sorted(
        d,
        eligible.clone(),
        home.as_ref(),
        sorted,
        scope,
        req,
        view,
        now_ms,
    )
}

/// What a caller of the routed planners promises (checked in debug builds): a
/// route table of the request's region and profile, and the row's own scope.
fn debug_check_routed(
    d: &Deployment,
    routes: &RouteTable,
    scope: &ScopeId,
    location: &Location,
    req: &ReadRequest<'_>,
) {
    debug_assert!(
        routes.client_region == *req.client_region && routes.profile == req.profile.name,
        "a route table of another region or profile"
    );
    debug_assert_eq!(*scope, location.scope_of(d, req.table, req.key));
}

/// A [`ReadPlan`] whose primary candidates are built as they are taken.
#[derive(Debug, Clone)]
pub struct ReadOrder {
    /// The row's scope (placement policy).
    pub scope: ScopeId,
    /// [`ReadPlan::primary`], in order.
    pub primary: Candidates,
    /// [`ReadPlan::fallback`].
    pub fallback: Vec<Candidate>,
}

impl ReadOrder {
    /// The plan with every candidate built.
    pub fn into_plan(self) -> ReadPlan {
        ReadPlan {
            scope: self.scope,
            primary: self.primary.collect(),
            fallback: self.fallback,
        }
    }
}

/// Candidates in order, each built (its replica id cloned) only when taken.
#[derive(Debug, Clone)]
pub struct Candidates {
    routes: Arc<[Route]>,
    /// Not yet taken, in reverse order (the next is last).
    picks: Vec<Pick>,
    /// Taken after `picks`: order keys, in reverse order, of candidates whose
    /// reason is [`Reason::Home`] in `home`'s replicas and [`Reason::Nearest`]
    /// elsewhere (an eventual read's order, made into picks only when taken).
    keys: Vec<u128>,
    home: Option<RegionId>,
}

/// One candidate before it is built: a position in the routes.
#[derive(Debug, Clone, Copy)]
struct Pick {
    route: usize,
    reason: Reason,
    rtt_ms: f64,
}

impl Candidates {
    /// No candidate at all.
    pub fn empty() -> Candidates {
        Candidates {
            routes: Arc::new([]),
            picks: Vec::new(),
            keys: Vec::new(),
            home: None,
        }
    }

    /// Candidates not yet taken.
    pub fn len(&self) -> usize {
        self.picks.len() + self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.picks.is_empty() && self.keys.is_empty()
    }

    /// Keeps only the next `n`.
    pub fn truncate(&mut self, n: usize) {
        let keys = n.saturating_sub(self.picks.len());
        self.keys.drain(..self.keys.len().saturating_sub(keys));
        self.picks.drain(..self.picks.len().saturating_sub(n));
    }
}

impl Iterator for Candidates {
    type Item = Candidate;

    fn next(&mut self) -> Option<Candidate> {
        let p = match self.picks.pop() {
            Some(p) => p,
            None => {
                let (rtt_ms, route) = order_key_parts(self.keys.pop()?);
                Pick {
                    route,
                    reason: base_reason(&self.routes[route], self.home.as_ref()),
                    rtt_ms,
                }
            }
        };
        Some(Candidate {
            replica: self.routes[p.route].id.clone(),
            reason: p.reason,
            rtt_ms: p.rtt_ms,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len(), Some(self.len()))
    }
}

impl ExactSizeIterator for Candidates {}

/// Positions ([`Route::by_id`] and the route's own) an [`order_key`] holds.
const ORDER_KEY_POSITIONS: usize = 1 << 31;

/// A route's place in a read's order as one integer, ordered as the tuple
/// (`down`, `away`, `rtt_ms` by [`f64::total_cmp`], `by_id`) is: `false` before
/// `true`, then the round trip, then the position in id order. The route's
/// position rides in the low bits (below `by_id`, which is unique per route, so
/// it never decides). Both positions are below [`ORDER_KEY_POSITIONS`].
fn order_key(down: bool, away: bool, rtt_ms: f64, by_id: usize, route: usize) -> u128 {
    // `total_cmp`'s order on the bits: negatives flipped whole, positives above them.
    let bits = rtt_ms.to_bits();
    let rtt = if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    };
    debug_assert!(by_id < ORDER_KEY_POSITIONS && route < ORDER_KEY_POSITIONS);
    (u128::from(down) << 127)
        | (u128::from(away) << 126)
        | (u128::from(rtt) << 62)
        | ((by_id as u128) << 31)
        | route as u128
}

/// The round trip and the route of an [`order_key`].
fn order_key_parts(key: u128) -> (f64, usize) {
    let rtt = (key >> 62) as u64;
    let bits = if rtt >> 63 == 1 {
        rtt & !(1 << 63)
    } else {
        !rtt
    };
    (
        f64::from_bits(bits),
        (key as usize) & (ORDER_KEY_POSITIONS - 1),
    )
}

/// Insertion sort: a read's keys come nearly sorted (the routes are in the
/// topology's round-trip order, which the measured round trips mostly keep), and
/// then it moves each key a step or two, where `sort_unstable`'s small-slice
/// sorting network costs the same on any input (3.5 % of the simulator's
/// instructions).
fn sort_nearly_sorted(keys: &mut [u128]) {
    for i in 1..keys.len() {
        let k = keys[i];
        let mut j = i;
        while j > 0 && keys[j - 1] > k {
            keys[j] = keys[j - 1];
            j -= 1;
        }
        keys[j] = k;
    }
}

/// The order, given the scope's eligible replicas in id order.
fn order_routes(
    d: &Deployment,
    eligible: Arc<[Route]>,
    scope: ScopeId,
    location: &Location,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadOrder, RouteError> {
    check_routes(&eligible, &scope, req)?;
    let home = read_home(d, &eligible, location, req);
    let ordered = sorted_route_keys(&eligible, home.as_ref(), view);
    order_sorted(
        d,
        eligible,
        home.as_ref(),
        &ordered,
        scope,
        req,
        view,
        now_ms,
    )
}

/// Whether a read may be ordered over `eligible` at all.
fn check_routes(
    eligible: &[Route],
    scope: &ScopeId,
    req: &ReadRequest<'_>,
) -> Result<(), RouteError> {
    if eligible.is_empty() {
        return Err(RouteError::NoEligibleReplica {
            scope: scope.clone(),
            profile: req.profile.name.clone(),
        });
    }
    if eligible.len() > ORDER_KEY_POSITIONS {
        return Err(RouteError::TooManyReplicas {
            scope: scope.clone(),
            replicas: eligible.len(),
            limit: ORDER_KEY_POSITIONS,
        });
    }
    Ok(())
}

/// The region whose replicas go first for this read, if any.
///
/// A row's home region directs reads only when the caller's own region cannot
/// serve the row (its policy keeps the row elsewhere): then the home region's
/// replicas go first, the policy's other regions after. A row the caller's
/// region holds is read there — the 20 ms budget does not survive an ocean.
fn read_home(
    d: &Deployment,
    eligible: &[Route],
    location: &Location,
    req: &ReadRequest<'_>,
) -> Option<RegionId> {
    if eligible.iter().any(|r| r.region == *req.client_region) {
        None
    } else {
        location.home_of(d, req.table, req.key)
    }
}

/// The order key of the `i`-th route: healthy before failing; then the home
/// region (when it applies); then by round trip; then by id (the routes' order),
/// so equal inputs give equal plans. Each route's place in that order is one
/// integer, so sorting compares integers rather than four fields.
fn route_key(i: usize, r: &Route, home: Option<&RegionId>, view: &dyn PeerView) -> u128 {
    order_key(
        view.is_down_ranked(r.rank, &r.id),
        home.is_some_and(|h| r.region != *h),
        view.rtt_ms_ranked(r.rank, &r.id)
            .map_or(r.est_rtt_ms, |m| m.max(r.rtt_floor_ms)),
        r.by_id,
        i,
    )
}

/// Every route's [`route_key`], by route position.
fn route_keys(eligible: &[Route], home: Option<&RegionId>, view: &dyn PeerView) -> Vec<u128> {
    eligible
        .iter()
        .enumerate()
        .map(|(i, r)| route_key(i, r, home, view))
        .collect()
}

/// Every route's [`route_key`], sorted: a read's order before its consistency
/// mode's changes.
fn sorted_route_keys(
    eligible: &[Route],
    home: Option<&RegionId>,
    view: &dyn PeerView,
) -> Vec<u128> {
    let mut keys = route_keys(eligible, home, view);
    sort_nearly_sorted(&mut keys);
    keys
}

/// The order from the routes' sorted keys: the consistency mode's changes to it
/// (the rendezvous replica first, the fallbacks, the fresh replicas first).
#[allow(clippy::too_many_arguments)]
fn order_sorted(
    d: &Deployment,
    eligible: Arc<[Route]>,
    home: Option<&RegionId>,
    ordered: &[u128],
    scope: ScopeId,
    req: &ReadRequest<'_>,
    view: &dyn PeerView,
    now_ms: u64,
) -> Result<ReadOrder, RouteError> {
    let ReadRequest {
        client_region,
        key,
        consistency,
        deadline,
        ..
    } = *req;
    let in_region = |r: &Route, region: &RegionId| &r.region == region;
    if let Consistency::Eventual = consistency {
        // The order as it is: picks made as they are taken.
        return Ok(ReadOrder {
            scope,
            primary: Candidates {
                routes: eligible,
                picks: Vec::new(),
                keys: ordered.iter().rev().copied().collect(),
                home: home.cloned(),
            },
            fallback: Vec::new(),
        });
    }
    let mut primary: Vec<Pick> = ordered
        .iter()
        .map(|&key| {
            let (rtt_ms, route) = order_key_parts(key);
            Pick {
                route,
                reason: base_reason(&eligible[route], home),
                rtt_ms,
            }
        })
        .collect();
    let id = |p: &Pick| &eligible[p.route].id;
    let build = |p: &Pick, reason: Reason| Candidate {
        replica: id(p).clone(),
        reason,
        rtt_ms: p.rtt_ms,
    };
    let mut fallback = Vec::new();
    match consistency {
        Consistency::Eventual => {} // ordered above, without picks
        Consistency::RowAffinity => {
            // The rendezvous replica of the caller's region (else the home region,
            // else the nearest region with an eligible replica) goes first.
            let region_has = |region: &RegionId| eligible.iter().any(|r| in_region(r, region));
            let region = if region_has(client_region) {
                Some(client_region.clone())
            } else if let Some(h) = home.filter(|h| region_has(h)) {
                Some(h.clone())
            } else {
                primary
                    .first()
                    .and_then(|p| d.topology.region_of(id(p).as_str()).cloned())
            };
            if let Some(region) = region {
                let candidates: Vec<(&ReplicaId, f64)> = eligible
                    .iter()
                    .filter(|r| in_region(r, &region))
                    .map(|r| (&r.id, r.weight))
                    .collect();
                if let Some(winner) = pangea_topology::affinity::rendezvous(&candidates, key)
                    && !view.is_down(winner)
                    && let Some(i) = primary.iter().position(|p| id(p) == winner)
                {
                    let mut p = primary.remove(i);
                    p.reason = Reason::Affinity;
                    primary.insert(0, p);
                }
            }
        }
        Consistency::Watermark(token) => {
            for p in &primary {
                let r = &eligible[p.route];
                if r.id == token.origin {
                    fallback.push(build(p, Reason::OriginFallback));
                } else if view.covers_ranked(r.rank, &r.id, token)
                    && !view.is_down_ranked(r.rank, &r.id)
                {
                    fallback.push(build(p, Reason::Covered));
                }
            }
            // The origin first among the fallbacks: it always covers its own writes.
            fallback.sort_by_key(|c| c.reason != Reason::OriginFallback);
        }
        Consistency::BoundedStaleness { .. } | Consistency::AsOf { .. } => {
            let max_ms = &consistency.staleness_bound_ms(now_ms).unwrap_or(u64::MAX);
            let in_time = |rtt_ms: f64| deadline.is_none_or(|d| rtt_ms < d.as_secs_f64() * 1e3);
            // Each replica looked at once: a live view may change between two
            // looks, and a sort must not see a key change under it.
            for p in primary.iter_mut() {
                let r = &eligible[p.route];
                if in_time(p.rtt_ms)
                    && view
                        .freshness_ranked(r.rank, &r.id, &scope)
                        .is_some_and(|low| staleness_ms(low, now_ms) <= *max_ms)
                {
                    p.reason = Reason::Fresh;
                }
            }
            // Stable: keeps the health/home/RTT order within each group.
            primary.sort_by_cached_key(|p| {
                let r = &eligible[p.route];
                p.reason != Reason::Fresh || view.is_down_ranked(r.rank, &r.id)
            });
        }
    }
    // Taken from the back.
    primary.reverse();
    Ok(ReadOrder {
        scope,
        primary: Candidates {
            routes: eligible,
            picks: primary,
            keys: Vec::new(),
            home: None,
        },
        fallback,
    })
}

/// Why a route is in a read's order before any consistency mode's changes.
fn base_reason(r: &Route, home: Option<&RegionId>) -> Reason {
    if home.is_some_and(|h| r.region == *h) {
        Reason::Home
    } else {
        Reason::Nearest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_rtt() -> impl Strategy<Value = f64> {
        prop_oneof![
            0.0..500.0f64,
            any::<f64>(),
            Just(0.0),
            Just(-0.0),
            Just(f64::INFINITY),
            Just(f64::NAN),
        ]
    }

    proptest! {
        /// An order key sorts as its tuple does, and gives back its round trip and
        /// route bit for bit.
        #[test]
        fn order_keys_sort_as_their_tuples(
            a in (any::<bool>(), any::<bool>(), any_rtt(), any_position(), any_position()),
            b in (any::<bool>(), any::<bool>(), any_rtt(), any_position(), any_position()),
        ) {
            let ka = order_key(a.0, a.1, a.2, a.3, a.4);
            let kb = order_key(b.0, b.1, b.2, b.3, b.4);
            let tuples = (a.0, a.1)
                .cmp(&(b.0, b.1))
                .then(a.2.total_cmp(&b.2))
                .then(a.3.cmp(&b.3))
                .then(a.4.cmp(&b.4));
            prop_assert_eq!(ka.cmp(&kb), tuples);
            let (rtt, route) = order_key_parts(ka);
            prop_assert_eq!(rtt.to_bits(), a.2.to_bits());
            prop_assert_eq!(route, a.4);
        }

        /// The insertion sort sorts any keys, not only nearly sorted ones.
        #[test]
        fn nearly_sorted_sort_sorts(
            mut keys in proptest::collection::vec(
                prop_oneof![0u128..8, any::<u128>()],
                0..40,
            ),
        ) {
            let mut want = keys.clone();
            want.sort_unstable();
            sort_nearly_sorted(&mut keys);
            prop_assert_eq!(keys, want);
        }
    }

    fn any_position() -> impl Strategy<Value = usize> {
        prop_oneof![0..64usize, Just(ORDER_KEY_POSITIONS - 1)]
    }
}
