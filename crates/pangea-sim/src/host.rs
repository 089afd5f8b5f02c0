//! A replica's host as a queue: a number of cores that client requests, replication
//! applies and snapshot work wait for, one at a time each (first come, first served:
//! an M/G/k server), and a disk whose fsyncs group the writes of every turn that
//! reached it while the previous fsync ran (group commit).
//!
//! Each piece of work draws its service time from a log-normal distribution around
//! its mean ([`Cost`]), so a host's latency grows with its load and a host given more
//! work than its cores can do falls behind without bound, as a real one does. Work
//! that finds its thread asleep (the serving runtime's, or the replication
//! driver's) pays for waking it first ([`HostModel::wake_us`]), so a busy host
//! spends less CPU per request than an idle one, as a live one does. The
//! defaults ([`HostModel::default`]) were measured on the reference machine class;
//! docs/drills.md ("The host model") says how.
//!
//! Everything here is a pure function of the times it is given and its own seeded
//! generator, one per replica, so that a run replays bit for bit and a split run
//! (`sim::shard`) draws exactly what a single-threaded one does.

use crate::rng::SimRng;
use crate::time::{SimDuration, SimTime};
use rand::distr::Distribution;
use rand_distr::LogNormal;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

/// What one kind of work costs a core: `mean_us` per item (a request, an entry, a
/// row), plus `per_kib_us` for every KiB it moves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    pub mean_us: f64,
    pub per_kib_us: f64,
}

impl Cost {
    /// The mean service time of `items` moving `bytes` in all.
    pub fn mean_for(&self, items: usize, bytes: usize) -> f64 {
        self.mean_us * items as f64 + self.per_kib_us * bytes as f64 / 1024.0
    }
}

/// What a piece of a host's cores' work was: its busy time is kept per kind
/// ([`Host::busy_by`]), so a report can say what a saturated host spent it on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// A client read (or a request refused while the replica catches up).
    Read,
    /// A client write, before its commit (on the driver's thread).
    Write,
    /// A frontend's watermark poll.
    Watermarks,
    /// Replicated entries applied (mutations, gap fills, snapshot rows).
    Apply,
    /// Rows read into a snapshot chunk.
    Snapshot,
    /// A frontend sending a request or taking an answer (on the machine the
    /// frontends share with the replicas, `Hosts::frontend_us`).
    Frontend,
    /// Waking a thread that slept before work it found (`HostModel::wake_us`):
    /// its pieces are the wake-ups.
    Wake,
}

impl Work {
    pub const ALL: [Work; 7] = [
        Work::Read,
        Work::Write,
        Work::Watermarks,
        Work::Apply,
        Work::Snapshot,
        Work::Frontend,
        Work::Wake,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Work::Read => "read",
            Work::Write => "write",
            Work::Watermarks => "watermarks",
            Work::Apply => "apply",
            Work::Snapshot => "snapshot",
            Work::Frontend => "frontend",
            Work::Wake => "wake",
        }
    }
}

/// A replica host's costs. See the module documentation, and docs/drills.md for how
/// the defaults were obtained.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HostModel {
    /// Cores serving requests and applying replication (at least 1).
    pub cores: u32,
    /// A client read, at the replica (decoding, admission, the row, the answer).
    pub read: Cost,
    /// A client write, before its commit.
    pub write: Cost,
    /// One replicated entry applied (a mutation, a gap fill's entry, a snapshot row).
    pub apply: Cost,
    /// One row read into a snapshot chunk, at the sender.
    pub snapshot: Cost,
    /// Spread of the cores' service times: the σ of their log-normal distribution
    /// (0: constant).
    pub cpu_sigma: f64,
    /// Mean time of one fsync, which commits every turn that reached the disk
    /// while the previous one ran.
    pub commit_us: f64,
    pub commit_sigma: f64,
    /// Latency every client request pays outside the cores (the kernel's network
    /// stack, waking the serving task): it adds to a request's time but occupies
    /// no core.
    pub overhead_us: u64,
    /// Share of the cores busy with work not itemized here (timers, heartbeats,
    /// other processes): pieces of `background_us` arriving at random that take
    /// turns on the cores with the itemized work (on a shared machine, the
    /// default host's share, once for the machine).
    pub background: f64,
    /// Mean length of one piece of that work: how long it holds a core once it
    /// has one. On a machine whose threads outnumber its cores this is the
    /// scheduler's time slice more than any one task's length, and it sets how
    /// long a request that finds every core taken waits (`pangea sim calibrate`
    /// fits it to the live tail).
    pub background_us: f64,
    /// CPU to wake a thread that slept (a return from `epoll_wait`, the kernel's
    /// wake-up and the scheduler's switch, more in a VM), paid by replica work
    /// that finds its thread — the serving runtime's or the replication driver's —
    /// with nothing left to do. Under load work finds it still busy and pays
    /// nothing, so CPU per request falls as load grows (`pangea sim calibrate`
    /// fits it across load levels; 0: not modelled).
    pub wake_us: f64,
    /// How much longer the replication driver's thread (writes, applies,
    /// snapshot reads) waits for a core than a serving thread does when it wakes
    /// to find every core taken: the ratio of the two threads' scheduler
    /// weights. A replica runs its driver at nice 5 (`driver_nice`), whose Linux
    /// weight is 335 against the serving threads' 1024, so on a busy machine it
    /// waits about 3× as long for its turn ([`DRIVER_WAIT`]; docs/drills.md, "The
    /// host model", has the `perf sched` measurement). Once running it drains
    /// what queued meanwhile, so work that finds it awake waits only for it.
    /// 1: first come, first served.
    pub driver_wait: f64,
    /// How often a replica's thread — the serving runtime's, or the replication
    /// driver's — is descheduled on an idle machine, per second (0: never; more
    /// often as the cores fill, [`STALLS_GROW`]), and for how long, µs (mean;
    /// exponential, [`STALL_US`]). A descheduled thread holds the work it was
    /// given until it runs again, while the cores serve other threads: the
    /// preempted slices that give a live host's reads their far tail and its
    /// applies their lag tail near capacity, which a queue of whole pieces that
    /// any free core takes does not have (`pangea sim calibrate` fits the rate
    /// to the live reads' p99.9).
    pub stall_per_s: f64,
    pub stall_us: f64,
}

/// [`HostModel::stall_us`]: two of the Linux scheduler's base slices on a
/// 2-CPU machine (0.75 ms × (1 + log2 2) each), what a thread preempted there
/// waits for one other runnable thread's turn and its own.
pub const STALL_US: f64 = 3_000.0;

/// [`HostModel::driver_wait`] of a replica at the default `driver_nice` (5): the
/// Linux scheduler's weight of nice 0 over nice 5's (`sched_prio_to_weight`).
pub const DRIVER_WAIT: f64 = 1024.0 / 335.0;

impl Default for HostModel {
    /// The reference machine class: a 2-vCPU server with a local SSD, as measured
    /// on the project machine (docs/drills.md, "The host model").
    fn default() -> Self {
        HostModel {
            cores: 2,
            read: Cost {
                mean_us: 10.0,
                per_kib_us: 2.6,
            },
            write: Cost {
                mean_us: 20.0,
                per_kib_us: 2.6,
            },
            apply: Cost {
                mean_us: 20.0,
                per_kib_us: 5.0,
            },
            snapshot: Cost {
                mean_us: 2.0,
                per_kib_us: 1.0,
            },
            cpu_sigma: 1.0,
            commit_us: 300.0,
            commit_sigma: 0.26,
            overhead_us: 60,
            background: 0.0,
            background_us: BACKGROUND_JOB_US,
            wake_us: 0.0,
            driver_wait: DRIVER_WAIT,
            stall_per_s: 0.0,
            stall_us: STALL_US,
        }
    }
}

/// Changes to [`HostModel`] for some regions or replicas (`[host.regions.NAME]`,
/// `[host.replicas.ID]` in a drill): each field set replaces the default's.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostPatch {
    pub cores: Option<u32>,
    pub read_us: Option<f64>,
    pub write_us: Option<f64>,
    pub apply_us: Option<f64>,
    pub per_kib_us: Option<f64>,
    pub cpu_sigma: Option<f64>,
    pub commit_us: Option<f64>,
    pub commit_sigma: Option<f64>,
    pub overhead_us: Option<u64>,
    pub background: Option<f64>,
    pub background_us: Option<f64>,
    pub wake_us: Option<f64>,
    pub driver_wait: Option<f64>,
    pub stall_per_s: Option<f64>,
    pub stall_us: Option<f64>,
}

impl HostPatch {
    /// `base` with this patch's fields.
    pub fn apply_to(&self, base: HostModel) -> HostModel {
        let mut m = base;
        if let Some(c) = self.cores {
            m.cores = c;
        }
        if let Some(us) = self.read_us {
            m.read.mean_us = us;
        }
        if let Some(us) = self.write_us {
            m.write.mean_us = us;
        }
        if let Some(us) = self.apply_us {
            m.apply.mean_us = us;
        }
        if let Some(us) = self.per_kib_us {
            m.read.per_kib_us = us;
            m.write.per_kib_us = us;
            m.apply.per_kib_us = 2.0 * us;
        }
        if let Some(s) = self.cpu_sigma {
            m.cpu_sigma = s;
        }
        if let Some(us) = self.commit_us {
            m.commit_us = us;
        }
        if let Some(s) = self.commit_sigma {
            m.commit_sigma = s;
        }
        if let Some(us) = self.overhead_us {
            m.overhead_us = us;
        }
        if let Some(b) = self.background {
            m.background = b;
        }
        if let Some(us) = self.background_us {
            m.background_us = us;
        }
        if let Some(us) = self.wake_us {
            m.wake_us = us;
        }
        if let Some(w) = self.driver_wait {
            m.driver_wait = w;
        }
        if let Some(n) = self.stall_per_s {
            m.stall_per_s = n;
        }
        if let Some(us) = self.stall_us {
            m.stall_us = us;
        }
        m
    }
}

/// The hosts of a run: a default and changes by region and by replica (a replica's
/// win over its region's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hosts {
    pub default: HostModel,
    /// Every host on one machine of this many cores instead of cores of its own (a
    /// local cluster, as `pangea sim calibrate` runs live). Such a run is never
    /// split across threads.
    pub machine_cores: Option<u32>,
    /// CPU a frontend spends on each request it sends and each answer it
    /// receives, in µs (mean; the cores' spread), on the machine's cores: with
    /// `machine_cores` only, where the frontends share the machine with the
    /// replicas (a local cluster and its load generator). 0: not modelled
    /// (frontends on machines of their own).
    pub frontend_us: f64,
    pub regions: std::collections::BTreeMap<String, HostPatch>,
    pub replicas: std::collections::BTreeMap<String, HostPatch>,
}

impl Hosts {
    /// The model of replica `id`, in `region`.
    pub fn model(&self, id: &str, region: &str) -> HostModel {
        let mut m = self.default;
        if let Some(p) = self.regions.get(region) {
            m = p.apply_to(m);
        }
        if let Some(p) = self.replicas.get(id) {
            m = p.apply_to(m);
        }
        m
    }
}

/// A log-normal distribution with mean 1 and spread `sigma` (constant 1 at σ = 0).
#[derive(Debug, Clone)]
struct UnitLogNormal(Option<LogNormal<f64>>);

impl UnitLogNormal {
    fn new(sigma: f64) -> Self {
        UnitLogNormal(
            (sigma > 0.0)
                .then(|| LogNormal::new(-sigma * sigma / 2.0, sigma).ok())
                .flatten(),
        )
    }

    fn draw(&self, rng: &mut SimRng) -> f64 {
        self.0.as_ref().map_or(1.0, |d| d.sample(rng))
    }
}

/// The default mean size of one piece of unitemized work
/// ([`HostModel::background_us`]).
pub const BACKGROUND_JOB_US: f64 = 100.0;

/// Work the model does not itemize (timers, heartbeats, other processes): pieces
/// of `piece_us` (mean, the cores' spread) arriving at random on each core, as
/// many as keep `share` of it busy. They take turns on the cores like any
/// other work, so the queues they make are queues, and a core they fill is busy.
#[derive(Debug, Clone)]
struct Background {
    share: f64,
    piece_us: f64,
    /// Each core's next piece's arrival.
    next: Vec<SimTime>,
    size: UnitLogNormal,
    rng: SimRng,
}

impl Background {
    fn new(share: f64, piece_us: f64, cores: usize, sigma: f64, rng: SimRng) -> Option<Background> {
        if share <= 0.0 || piece_us <= 0.0 {
            return None;
        }
        let mut b = Background {
            share: share.min(0.99),
            piece_us,
            next: Vec::with_capacity(cores),
            size: UnitLogNormal::new(sigma),
            rng,
        };
        for _ in 0..cores {
            let first = SimTime::ZERO + b.gap();
            b.next.push(first);
        }
        Some(b)
    }

    /// Exponential time to the next piece on a core.
    fn gap(&mut self) -> SimDuration {
        let mean_us = self.piece_us / self.share;
        let u = self.rng.next_f64().max(f64::MIN_POSITIVE);
        SimDuration::from_us((-u.ln() * mean_us).round() as u64)
    }

    /// Runs on `free` the pieces that arrived up to `at`; returns their time.
    fn advance(&mut self, free: &mut [SimTime], at: SimTime) -> SimDuration {
        let mut spent = SimDuration::ZERO;
        for (core, free) in free.iter_mut().enumerate() {
            while self.next[core] <= at {
                let us = (self.piece_us * self.size.draw(&mut self.rng)).round() as u64;
                let d = SimDuration::from_us(us.max(1));
                *free = (*free).max(self.next[core]) + d;
                spent += d;
                let gap = self.gap();
                self.next[core] += gap;
            }
        }
        spent
    }
}

/// When one thread is descheduled: a Poisson stream of stalls of exponential
/// length, drawn as far as the work given to the thread needs and kept until
/// they end, so that every piece of work given during a stall waits for it.
#[derive(Debug, Clone)]
struct Stalls {
    /// Stalls drawn that have not ended by the last work given: `[start, end)`,
    /// in order, never empty.
    drawn: VecDeque<(SimTime, SimTime)>,
    gap_us: f64,
    len_us: f64,
    /// How their rate grows with the cores' load ([`STALLS_GROW`]).
    grows: f64,
    rng: SimRng,
}

/// How a descheduled thread's stalls grow more frequent with the load of the
/// cores it runs on, `load`: their rate is `stall_per_s × (1 - load)^-k`, with
/// `k` the first for a serving thread and the second for the replication driver.
/// A thread is preempted when its slice is up and another is runnable, and a
/// descheduled one waits for the others' slices; the driver, at nice 5, has a
/// third of a serving thread's weight, so it is preempted sooner and waits
/// longer as the machine fills. Chosen by replay of the calibration recordings
/// (docs/drills.md#fidelity): 0 for both left the hedges and the lag tails near
/// capacity at a third of live's, 1 for both put the reads' p99 there 25 %
/// above.
pub const STALLS_GROW: (f64, f64) = (0.5, 1.0);

impl Stalls {
    fn new(per_s: f64, len_us: f64, grows: f64, rng: SimRng) -> Option<Stalls> {
        if !(per_s > 0.0 && len_us > 0.0) {
            return None;
        }
        let mut s = Stalls {
            drawn: VecDeque::new(),
            gap_us: 1e6 / per_s,
            len_us,
            grows,
            rng,
        };
        s.restart(SimTime::ZERO);
        Some(s)
    }

    fn exp_us(&mut self, mean_us: f64) -> SimDuration {
        let u = self.rng.next_f64().max(f64::MIN_POSITIVE);
        SimDuration::from_us((-u.ln() * mean_us).round() as u64)
    }

    /// Forgets the stalls drawn and draws the first after `t` (a process
    /// started again: its threads are new).
    fn restart(&mut self, t: SimTime) {
        self.drawn.clear();
        let first = self.next_after(t, 0.0);
        self.drawn.push_back(first);
    }

    /// The next stall after `t`, the cores `load` busy: a thread is
    /// descheduled more often the more other work is runnable
    /// ([`STALLS_GROW`]; the rate grows at most 20^k-fold).
    fn next_after(&mut self, t: SimTime, load: f64) -> (SimTime, SimTime) {
        let idle = (1.0 - load).clamp(0.05, 1.0);
        let gap = self.gap_us * idle.powf(self.grows);
        let start = t + self.exp_us(gap);
        (
            start,
            start + self.exp_us(self.len_us).max(SimDuration::from_us(1)),
        )
    }

    /// The `i`th stall not yet ended, drawn if need be.
    fn nth(&mut self, i: usize, load: f64) -> (SimTime, SimTime) {
        while self.drawn.len() <= i {
            let last = self.drawn.back().map_or(SimTime::ZERO, |s| s.1);
            let next = self.next_after(last, load);
            self.drawn.push_back(next);
        }
        self.drawn[i]
    }

    /// Work the thread is given at `at` that would be done at `done` if it ran
    /// throughout: when it is done, waiting out a stall it is given in and
    /// pausing for those that start while it runs. Stalls that end by `at` are
    /// forgotten (work is given in time order).
    fn delay(&mut self, at: SimTime, done: SimTime, load: f64) -> SimTime {
        while self.drawn.len() > 1 && self.drawn[0].1 <= at {
            self.drawn.pop_front();
        }
        if self.drawn[0].1 <= at {
            let last = self.drawn[0].1;
            self.drawn[0] = self.next_after(last.max(at), load);
        }
        let mut t = at;
        let mut left = done.saturating_since(at);
        for i in 0.. {
            let (start, end) = self.nth(i, load);
            if end <= t {
                continue;
            }
            if start <= t {
                t = end;
            } else if start < t + left {
                left = left - start.saturating_since(t);
                t = end;
            } else {
                break;
            }
        }
        t + left
    }
}

/// Cores and when each finishes the work it was given, with the background work
/// that takes turns on them.
#[derive(Debug, Clone)]
pub struct CoreSet {
    free: Vec<SimTime>,
    background: Option<Background>,
    /// Time the background work took on these cores.
    background_busy: SimDuration,
    /// All the time given to these cores, and their load: the work given them
    /// over the span between the last two updates, at least [`LOAD_WINDOW`]
    /// apart (work is given when it arrives, so a queue counts and the load
    /// can pass 1); `window` is the last update's time and `given` then.
    given: SimDuration,
    window: (SimTime, SimDuration),
    load: f64,
}

/// How long the cores' recent load is measured over.
const LOAD_WINDOW: SimDuration = SimDuration::from_ms(50);

impl CoreSet {
    fn new(n: u32, background: Option<Background>) -> CoreSet {
        CoreSet {
            free: vec![SimTime::ZERO; n.max(1) as usize],
            background,
            background_busy: SimDuration::ZERO,
            given: SimDuration::ZERO,
            window: (SimTime::ZERO, SimDuration::ZERO),
            load: 0.0,
        }
    }

    /// Work of `service` arriving at `at` on `core` (`None`: the first free one
    /// once the background work until `at` has run): when it is done.
    /// Returns when it is done, and when the first core to be free could have
    /// started it (`at` if one is free): the wait of a thread that may run on
    /// any core.
    fn take(
        &mut self,
        core: Option<usize>,
        at: SimTime,
        service: SimDuration,
    ) -> (SimTime, SimTime, f64) {
        if let Some(b) = &mut self.background {
            let spent = b.advance(&mut self.free, at);
            self.background_busy += spent;
            self.given += spent;
        }
        self.given += service;
        let elapsed = at.saturating_since(self.window.0);
        if elapsed >= LOAD_WINDOW {
            let given = self.given - self.window.1;
            self.load = given.as_us() as f64 / (elapsed.as_us() as f64 * self.free.len() as f64);
            self.window = (at, self.given);
        }
        let first = first_free(&self.free);
        let any_start = self.free[first].max(at);
        let core = core.unwrap_or(first);
        let done = self.free[core].max(at) + service;
        self.free[core] = done;
        (any_start, done, self.load)
    }
}

/// A host's own cores, or those of a machine every host of the run shares
/// ([`Hosts::machine_cores`]).
#[derive(Debug, Clone)]
pub enum Cores {
    Own(CoreSet),
    /// A machine's: replication work takes any free core (a process's driver thread
    /// is one of many threads on the machine), and a crash leaves the other
    /// processes' work queued.
    Shared(Arc<Mutex<CoreSet>>),
}

impl Cores {
    /// A machine of `n` cores for every host of a run, `background` of each core
    /// busy with unitemized work in pieces of `piece_us` (drawn from `seed`).
    pub fn machine(n: u32, background: f64, piece_us: f64, sigma: f64, seed: u64) -> Cores {
        let bg = Background::new(
            background,
            piece_us,
            n.max(1) as usize,
            sigma,
            SimRng::new(seed),
        );
        Cores::Shared(Arc::new(Mutex::new(CoreSet::new(n, bg))))
    }

    fn count(&self) -> usize {
        match self {
            Cores::Own(c) => c.free.len(),
            Cores::Shared(m) => m.lock().unwrap_or_else(|p| p.into_inner()).free.len(),
        }
    }

    /// Time the background work took on the shared machine's cores (`None`: the
    /// host's own cores, whose background counts as the host's busy time).
    pub fn machine_background_busy(&self) -> Option<SimDuration> {
        match self {
            Cores::Own(_) => None,
            Cores::Shared(m) => Some(m.lock().unwrap_or_else(|p| p.into_inner()).background_busy),
        }
    }
}

/// The first core to be free (the first of them on a tie: deterministic).
fn first_free(cores: &[SimTime]) -> usize {
    cores
        .iter()
        .enumerate()
        .min_by_key(|&(i, t)| (*t, i))
        .map_or(0, |(i, _)| i)
}

/// One replica's host while the run goes: when each core and the disk are next free.
#[derive(Debug, Clone)]
pub struct Host {
    model: HostModel,
    cpu: UnitLogNormal,
    disk: UnitLogNormal,
    /// Product of the active slow-host faults' factors (1: healthy).
    slow: f64,
    cores: Cores,
    /// The last fsync: when it starts and ends (it may not have started yet: turns
    /// that reach the disk before then join it).
    fsync: (SimTime, SimTime),
    /// When the serving thread, and the driver's, finish the work they were
    /// given: work that comes later finds them asleep (`HostModel::wake_us`).
    serving_until: SimTime,
    driver_until: SimTime,
    /// When the serving thread, and the driver's, are descheduled
    /// (`HostModel::stall_per_s`).
    serving_stalls: Option<Stalls>,
    driver_stalls: Option<Stalls>,
    rng: SimRng,
    /// Service time given to the cores, and to the disk, since the start.
    pub busy: SimDuration,
    /// The part of `busy` that was replication work on the driver's core
    /// ([`Host::run_driver`]).
    pub driver_busy: SimDuration,
    /// `busy` by kind of work, in [`Work::ALL`] order, and the pieces of each.
    pub busy_by: [SimDuration; Work::ALL.len()],
    pub pieces_by: [u64; Work::ALL.len()],
    pub disk_busy: SimDuration,
    pub fsyncs: u64,
}

impl Host {
    /// A host with `model.cores` cores of its own.
    pub fn new(model: HostModel, rng: SimRng) -> Host {
        let mut rng = rng;
        let bg_rng = if model.background > 0.0 {
            rng.fork(0x6267)
        } else {
            SimRng::new(0)
        };
        let bg = Background::new(
            model.background,
            model.background_us,
            model.cores.max(1) as usize,
            model.cpu_sigma,
            bg_rng,
        );
        Host::on(model, rng, Cores::Own(CoreSet::new(model.cores, bg)))
    }

    /// A host on `cores` (a machine's, [`Cores::machine`]).
    pub fn on(model: HostModel, rng: SimRng, cores: Cores) -> Host {
        // Their own generators, forked from a copy: turning stalls on leaves
        // every other draw of the host where it was.
        let stalls = |salt: u64, grows: f64| {
            Stalls::new(
                model.stall_per_s,
                model.stall_us,
                grows,
                rng.clone().fork(salt),
            )
        };
        let serving_stalls = stalls(0x7374_6c73, STALLS_GROW.0);
        let driver_stalls = stalls(0x7374_6c64, STALLS_GROW.1);
        Host {
            serving_stalls,
            driver_stalls,
            cpu: UnitLogNormal::new(model.cpu_sigma),
            disk: UnitLogNormal::new(model.commit_sigma),
            slow: 1.0,
            cores,
            fsync: (SimTime::ZERO, SimTime::ZERO),
            serving_until: SimTime::ZERO,
            driver_until: SimTime::ZERO,
            model,
            rng,
            busy: SimDuration::ZERO,
            driver_busy: SimDuration::ZERO,
            busy_by: [SimDuration::ZERO; Work::ALL.len()],
            pieces_by: [0; Work::ALL.len()],
            disk_busy: SimDuration::ZERO,
            fsyncs: 0,
        }
    }

    pub fn model(&self) -> &HostModel {
        &self.model
    }

    /// Latency a client request pays outside the cores.
    pub fn overhead(&self) -> SimDuration {
        SimDuration::from_us((self.model.overhead_us as f64 * self.slow).round() as u64)
    }

    /// Serving work of kind `work`, costing `cost` for `items` moving `bytes`,
    /// arriving at `at`: it waits for the first free core and runs for a drawn
    /// service time. Returns when it is done.
    pub fn run(
        &mut self,
        at: SimTime,
        work: Work,
        cost: Cost,
        items: usize,
        bytes: usize,
    ) -> SimTime {
        self.run_on(None, at, work, cost, items, bytes)
    }

    /// Driver work (`run`'s arguments): the node proposes client writes,
    /// applies frames and reads snapshots on one thread, its replication driver,
    /// so this work runs one piece at a time, on one core (the first) however
    /// many the host has, and serving work finds that core busy while it runs;
    /// woken to find the cores taken, it waits `driver_wait` times as long as
    /// the queue says ([`HostModel::driver_wait`]). A frame's entries are one
    /// piece of work.
    pub fn run_driver(
        &mut self,
        at: SimTime,
        work: Work,
        cost: Cost,
        items: usize,
        bytes: usize,
    ) -> SimTime {
        self.run_on(Some(0), at, work, cost, items, bytes)
    }

    /// Work on `core` of the host's own (`None`: the first free one).
    fn run_on(
        &mut self,
        core: Option<usize>,
        at: SimTime,
        work: Work,
        cost: Cost,
        items: usize,
        bytes: usize,
    ) -> SimTime {
        let mean = cost.mean_for(items, bytes) * self.slow;
        if mean <= 0.0 {
            return at;
        }
        let us = (mean * self.cpu.draw(&mut self.rng)).round() as u64;
        let mut service = SimDuration::from_us(us.max(1));
        self.busy_by[work as usize] += service;
        self.pieces_by[work as usize] += 1;
        // A frontend's thread is not the replica's (`Hosts::frontend_us` is fitted
        // per message, wake-ups included).
        let thread_until = match (core, work) {
            (_, Work::Frontend) => None,
            (Some(_), _) => Some(self.driver_until),
            (None, _) => Some(self.serving_until),
        };
        if self.model.wake_us > 0.0
            && let Some(until) = thread_until
            && at >= until
        {
            let wake =
                SimDuration::from_us((self.model.wake_us * self.slow).round().max(1.0) as u64);
            self.busy_by[Work::Wake as usize] += wake;
            self.pieces_by[Work::Wake as usize] += 1;
            service += wake;
        }
        self.busy += service;
        if core.is_some() {
            self.driver_busy += service;
        }
        let (any_start, done, load) = match &mut self.cores {
            Cores::Own(cores) => cores.take(core, at, service),
            Cores::Shared(machine) => machine
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(None, at, service),
        };
        // The driver is one thread: its work runs one piece at a time, so a
        // piece that finds it awake ends no sooner than its service after the
        // work in hand. Woken at a lower priority, it waits longer for its turn
        // than the cores' queue says. Either way the cores' time is spent as
        // their queue has it: what other threads ran meanwhile is the same work
        // in another order, and a core is never held idle for the driver.
        let done = match core {
            Some(_) if at >= self.driver_until => {
                // Waiting for every core, not for the one its work is kept on.
                let extra =
                    (any_start - at).as_us() as f64 * (self.model.driver_wait - 1.0).max(0.0);
                done + SimDuration::from_us(extra.round() as u64)
            }
            Some(_) => done.max(self.driver_until + service),
            None => done,
        };
        // A thread descheduled meanwhile holds the work until it runs again:
        // from when it takes the work (the driver once done with the work in
        // hand, whose stalls that work already waited out).
        let (stalls, taken) = match (core, work) {
            (_, Work::Frontend) => (None, at),
            (Some(_), _) => (self.driver_stalls.as_mut(), at.max(self.driver_until)),
            (None, _) => (self.serving_stalls.as_mut(), at),
        };
        let done = stalls.map_or(done, |s| s.delay(taken.min(done), done, load));
        match (core, work) {
            (_, Work::Frontend) => {}
            (Some(_), _) => self.driver_until = self.driver_until.max(done),
            (None, _) => self.serving_until = self.serving_until.max(done),
        }
        done
    }

    /// A turn whose writes are ready for the disk at `ready`: when the fsync that
    /// makes them durable ends. Group commit: a turn that arrives while an fsync
    /// runs waits for the next one, which starts when that one ends and takes every
    /// turn that arrives before it starts.
    pub fn commit(&mut self, ready: SimTime) -> SimTime {
        let (start, end) = self.fsync;
        if ready < start {
            return end; // joins the fsync that has not started yet
        }
        let start = ready.max(end);
        let us = (self.model.commit_us * self.slow * self.disk.draw(&mut self.rng)).round();
        let d = SimDuration::from_us((us as u64).max(1));
        self.disk_busy += d;
        self.fsyncs += 1;
        self.fsync = (start, start + d);
        start + d
    }

    /// The share of its cores', and of its disk's, time this host was busy over
    /// `over`.
    pub fn utilization(&self, over: SimDuration) -> (f64, f64) {
        let t = over.as_us().max(1) as f64;
        let own_background = match &self.cores {
            Cores::Own(c) => c.background_busy,
            Cores::Shared(_) => SimDuration::ZERO,
        };
        (
            (self.busy + own_background).as_us() as f64 / (t * self.cores.count() as f64),
            self.disk_busy.as_us() as f64 / t,
        )
    }

    /// Each kind of work's share of the host's cores over `over`, and its
    /// pieces (kinds that took none left out).
    pub fn work_shares(
        &self,
        over: SimDuration,
    ) -> std::collections::BTreeMap<&'static str, (f64, u64)> {
        let t = over.as_us().max(1) as f64 * self.cores.count() as f64;
        Work::ALL
            .iter()
            .zip(self.busy_by.iter().zip(self.pieces_by))
            .filter(|(_, (_, n))| *n > 0)
            .map(|(w, (d, n))| (w.name(), (d.as_us() as f64 / t, n)))
            .collect()
    }

    /// The machine's cores this host shares, if it shares them.
    pub fn cores(&self) -> &Cores {
        &self.cores
    }

    /// When the last fsync given ends (the replica's writes until then are durable).
    pub fn durable_at(&self) -> SimTime {
        self.fsync.1
    }

    /// A slow-host fault starts (`factor` > 1) or ends (its inverse).
    pub fn scale(&mut self, factor: f64) {
        self.slow *= factor;
    }

    /// The process died: its queued work is gone with it (on a shared machine,
    /// whose cores hold the other processes' work too, it is left to run out).
    pub fn crash(&mut self, now: SimTime) {
        if let Cores::Own(cores) = &mut self.cores {
            for c in &mut cores.free {
                *c = (*c).min(now);
            }
        }
        self.fsync = (now, now);
        // Its threads died with it: a restarted process's first work wakes them,
        // and they are descheduled afresh.
        self.serving_until = self.serving_until.min(now);
        self.driver_until = self.driver_until.min(now);
        for s in [&mut self.serving_stalls, &mut self.driver_stalls]
            .into_iter()
            .flatten()
        {
            s.restart(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(cores: u32, sigma: f64) -> Host {
        let model = HostModel {
            cores,
            cpu_sigma: sigma,
            commit_sigma: 0.0,
            ..HostModel::default()
        };
        Host::new(model, SimRng::new(1))
    }

    const US10: Cost = Cost {
        mean_us: 10.0,
        per_kib_us: 0.0,
    };

    /// A descheduled thread holds the work it was given until it runs again: the
    /// work pauses for the stall, every piece given during it waits for its end,
    /// and the cores are not held for it.
    #[test]
    fn a_descheduled_thread_holds_its_work_and_not_the_cores() {
        let us = SimTime::from_us;
        // Stalls from 1,000 to 1,500 µs and from 2,000 to 2,100 µs (the next
        // ones a second or so apart).
        let stalls = || {
            let mut s = Stalls::new(1.0, 1_000.0, 0.0, SimRng::new(7)).expect("on");
            s.drawn = [(us(1_000), us(1_500)), (us(2_000), us(2_100))].into();
            s
        };
        let mut s = stalls();
        // Done before the stall: untouched.
        assert_eq!(s.delay(us(500), us(900), 0.0), us(900));
        // Running into it: paused for its 500 µs.
        assert_eq!(s.delay(us(500), us(1_100), 0.0), us(1_600));
        // Running into both: 500 µs, paused, 500 µs, paused, 100 µs.
        assert_eq!(s.delay(us(500), us(1_600), 0.0), us(2_200));
        // Given during it: starts when it ends, and so does the next piece
        // given during it.
        assert_eq!(s.delay(us(1_200), us(1_210), 0.0), us(1_510));
        assert_eq!(s.delay(us(1_300), us(1_320), 0.0), us(1_520));
        // After both: they are forgotten.
        assert_eq!(s.delay(us(2_100), us(2_110), 0.0), us(2_110));
        assert!(s.drawn.iter().all(|&(_, end)| end > us(2_100)));
        // Off unless a rate and a length are set.
        assert!(Stalls::new(0.0, 1_000.0, 0.0, SimRng::new(7)).is_none());
        assert!(Stalls::new(1.0, 0.0, 0.0, SimRng::new(7)).is_none());

        // Two processes on one core: the stalled one's work waits for its
        // stall; the other's waits only for the core's work in hand.
        let machine = Cores::machine(1, 0.0, 100.0, 0.0, 1);
        let model = HostModel {
            cpu_sigma: 0.0,
            driver_wait: 1.0,
            stall_per_s: 1.0,
            ..HostModel::default()
        };
        let mut a = Host::on(model, SimRng::new(1), machine.clone());
        let mut b = Host::on(
            HostModel {
                stall_per_s: 0.0,
                ..model
            },
            SimRng::new(2),
            machine,
        );
        for s in [&mut a.serving_stalls, &mut a.driver_stalls] {
            s.as_mut().expect("on").drawn = stalls().drawn;
        }
        assert_eq!(a.run(us(1_200), Work::Read, US10, 1, 0), us(1_510));
        assert_eq!(b.run(us(1_200), Work::Read, US10, 1, 0), us(1_220));
        // The stalled driver's queued work waits behind it.
        assert_eq!(a.run_driver(us(1_250), Work::Apply, US10, 1, 0), us(1_510));
        assert_eq!(a.run_driver(us(1_260), Work::Apply, US10, 1, 0), us(1_520));
        // Each thread's stalls grow with load as `STALLS_GROW` says.
        let grows = |s: &Option<Stalls>| s.as_ref().map(|s| s.grows);
        assert_eq!(grows(&a.serving_stalls), Some(STALLS_GROW.0));
        assert_eq!(grows(&a.driver_stalls), Some(STALLS_GROW.1));
        assert_eq!(grows(&b.serving_stalls), None);

        // Many reads: 50 stalls a second of 2 ms keep the thread stalled a
        // tenth of the time, and a read given then waits 2 ms on average
        // (memoryless): about 0.2 ms a read against 10 µs.
        let run = |stall_per_s: f64| {
            let mut h = Host::new(
                HostModel {
                    cores: 2,
                    cpu_sigma: 0.0,
                    stall_per_s,
                    stall_us: 2_000.0,
                    ..HostModel::default()
                },
                SimRng::new(3),
            );
            (0..20_000u64)
                .map(|i| {
                    let at = SimTime::from_us(i * 500);
                    h.run(at, Work::Read, US10, 1, 0)
                        .saturating_since(at)
                        .as_us()
                })
                .sum::<u64>()
        };
        let (plain, stalled) = (run(0.0), run(50.0));
        assert_eq!(plain, 20_000 * 10);
        assert!(
            (12 * plain..30 * plain).contains(&stalled),
            "{stalled} against {plain}"
        );
    }

    /// Stalls come more often the busier the cores ([`STALLS_GROW`]).
    #[test]
    fn stalls_come_more_often_on_busy_cores() {
        let count = |load: f64| {
            let mut s = Stalls::new(100.0, 100.0, 1.0, SimRng::new(5)).expect("on");
            let (mut n, mut t) = (0, SimTime::ZERO);
            while t < SimTime::from_us(10_000_000) {
                t = s.next_after(t, load).1;
                n += 1;
            }
            n
        };
        let (idle, busy) = (count(0.0), count(0.75));
        // 100 a second idle, 400 at three quarters busy (k = 1), over 10 s.
        assert!((900..1_100).contains(&idle), "{idle}");
        assert!((3_500..4_500).contains(&busy), "{busy}");
    }

    /// Work that finds its thread asleep pays the wake-up; work that comes while
    /// the thread is still busy does not, so CPU per request falls with load.
    #[test]
    fn only_work_that_finds_its_thread_asleep_pays_the_wake_up() {
        // One core, constant costs, 30 µs a wake-up.
        let waking = || {
            Host::new(
                HostModel {
                    cores: 1,
                    cpu_sigma: 0.0,
                    wake_us: 30.0,
                    driver_wait: 1.0,
                    ..HostModel::default()
                },
                SimRng::new(1),
            )
        };
        let mut h = waking();
        let t = SimTime::from_us(1_000);
        // Asleep: 30 µs to wake, then 10 of work.
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_040));
        // Queued behind it: the thread is awake.
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_050));
        // Idle again later: another wake-up.
        let later = SimTime::from_us(2_000);
        assert_eq!(
            h.run(later, Work::Read, US10, 1, 0),
            SimTime::from_us(2_040)
        );
        // The driver's thread sleeps on its own.
        assert_eq!(
            h.run_driver(later, Work::Apply, US10, 1, 0),
            SimTime::from_us(2_080)
        );
        let wake = h.work_shares(SimDuration::from_us(1_000))["wake"];
        assert_eq!(wake.1, 3);
        // A crash takes its threads: the restarted process's first work wakes one,
        // even while the dead one's work would still have run.
        let mut h = waking();
        h.run(
            t,
            Work::Read,
            Cost {
                mean_us: 500.0,
                per_kib_us: 0.0,
            },
            1,
            0,
        );
        h.crash(SimTime::from_us(1_100));
        assert_eq!(
            h.run(SimTime::from_us(1_200), Work::Read, US10, 1, 0),
            SimTime::from_us(1_240)
        );
        // Off by default.
        let mut off = host(1, 0.0);
        assert_eq!(off.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_010));
        assert!(
            !off.work_shares(SimDuration::from_us(1_000))
                .contains_key("wake")
        );
    }

    #[test]
    fn work_queues_behind_busy_cores() {
        let mut h = host(2, 0.0);
        let t = SimTime::from_us(1_000);
        // Two cores take two at once; the third waits for the first to be free.
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_010));
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_010));
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_020));
        // An idle host starts at once.
        assert_eq!(
            h.run(SimTime::from_us(5_000), Work::Read, US10, 1, 0),
            SimTime::from_us(5_010)
        );
        // Bytes cost their share; a slow host costs `factor` times more.
        let kib = Cost {
            mean_us: 10.0,
            per_kib_us: 5.0,
        };
        assert_eq!(
            h.run(SimTime::from_us(9_000), Work::Read, kib, 1, 2048),
            SimTime::from_us(9_020)
        );
        h.scale(3.0);
        assert_eq!(
            h.run(SimTime::from_us(10_000), Work::Read, US10, 1, 0),
            SimTime::from_us(10_030)
        );
    }

    #[test]
    fn replication_keeps_to_one_core_and_serving_takes_the_others() {
        let mut h = host(4, 0.0);
        let t = SimTime::from_us(0);
        // A backlog of applies queues on the driver's core ...
        for k in 1..=10 {
            assert_eq!(
                h.run_driver(t, Work::Apply, US10, 1, 0),
                SimTime::from_us(10 * k)
            );
        }
        // ... while reads are served at once by the other three.
        for _ in 0..3 {
            assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(10));
        }
        // The cores' time is kept by kind: 100 µs of applies in 10 frames and
        // 30 µs of reads in 3, of 4 cores over 1 ms.
        let shares = h.work_shares(SimDuration::from_us(1_000));
        assert_eq!(shares.len(), 2, "{shares:?}");
        assert_eq!(shares["apply"], (100.0 / 4_000.0, 10));
        assert_eq!(shares["read"], (30.0 / 4_000.0, 3));
        assert_eq!(h.busy, SimDuration::from_us(130));
    }

    /// The driver's thread, woken to find every core taken, waits `driver_wait`
    /// times as long as the cores' queue says (its lower scheduler weight); the
    /// core is not held idle meanwhile, work that finds the driver awake runs
    /// after the work in hand without a wait of its own, and a driver that finds
    /// a free core waits for nothing.
    #[test]
    fn a_woken_driver_waits_longer_for_a_taken_core_than_serving_work() {
        let host = |cores| {
            Host::new(
                HostModel {
                    cores,
                    cpu_sigma: 0.0,
                    driver_wait: 3.0,
                    ..HostModel::default()
                },
                SimRng::new(1),
            )
        };
        let mut h = host(1);
        let t = SimTime::from_us(1_000);
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_010));
        // Asleep, the core taken for 10 µs: it waits 30.
        assert_eq!(
            h.run_driver(t, Work::Apply, US10, 1, 0),
            SimTime::from_us(1_040)
        );
        // The core ran the apply's 10 µs in its turn: a read queues behind that
        // alone, not behind the driver's wait.
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_030));
        // Awake: right after the work in hand, no wait of its own.
        let soon = SimTime::from_us(1_001);
        assert_eq!(
            h.run_driver(soon, Work::Write, US10, 1, 0),
            SimTime::from_us(1_050)
        );
        // Asleep again with the core free: no wait at all.
        let later = SimTime::from_us(5_000);
        assert_eq!(
            h.run_driver(later, Work::Apply, US10, 1, 0),
            SimTime::from_us(5_010)
        );
        // Two cores, the driver's taken and the other free: only its own core's
        // queue, not stretched (it is not waiting for every core).
        let mut h = host(2);
        assert_eq!(h.run(t, Work::Read, US10, 1, 0), SimTime::from_us(1_010));
        assert_eq!(
            h.run_driver(t, Work::Apply, US10, 1, 0),
            SimTime::from_us(1_020)
        );
    }

    #[test]
    fn hosts_on_one_machine_share_its_cores() {
        let model = HostModel {
            cpu_sigma: 0.0,
            driver_wait: 1.0,
            ..HostModel::default()
        };
        let machine = Cores::machine(2, 0.0, BACKGROUND_JOB_US, 0.0, 0);
        let mut a = Host::on(model, SimRng::new(1), machine.clone());
        let mut b = Host::on(model, SimRng::new(2), machine);
        let t = SimTime::ZERO;
        // Two hosts' work fills the machine's two cores; a third waits, whoever's.
        assert_eq!(a.run(t, Work::Read, US10, 1, 0), SimTime::from_us(10));
        assert_eq!(b.run(t, Work::Read, US10, 1, 0), SimTime::from_us(10));
        assert_eq!(
            a.run_driver(t, Work::Apply, US10, 1, 0),
            SimTime::from_us(20)
        );
        assert_eq!(b.run(t, Work::Read, US10, 1, 0), SimTime::from_us(20));
    }

    #[test]
    fn longer_background_pieces_keep_the_share_and_lengthen_the_waits() {
        // 30 % of each of two cores either way, so work finds both taken as often;
        // what it then waits out is one piece: the p99 wait is set by their length.
        let run = |background_us: f64| {
            let model = HostModel {
                cpu_sigma: 0.0,
                background: 0.3,
                background_us,
                ..HostModel::default()
            };
            let mut h = Host::new(model, SimRng::new(7));
            let mut waits: Vec<u64> = (0..100_000u64)
                .map(|i| {
                    let at = SimTime::from_us(i * 100);
                    (h.run(at, Work::Read, US10, 1, 0) - at).as_us() - 10
                })
                .collect();
            waits.sort_unstable();
            let (cpu, _) = h.utilization(SimDuration::from_secs(10));
            (waits[waits.len() * 99 / 100], cpu)
        };
        let (short, cpu_short) = run(BACKGROUND_JOB_US);
        let (long, cpu_long) = run(2_000.0);
        for cpu in [cpu_short, cpu_long] {
            assert!((0.32..0.38).contains(&cpu), "busy {cpu}");
        }
        assert!(short <= 100, "p99 wait behind 100 µs pieces: {short} µs");
        assert!(
            (700..=2_000).contains(&long),
            "p99 wait behind 2 ms pieces: {long} µs"
        );
    }

    #[test]
    fn background_work_keeps_its_share_of_the_cores_busy_and_queues_the_rest() {
        // 30 % of each of two cores: about that share of their time is background,
        // and a light load (10 µs every 100 µs, on the first free core) waits
        // behind it now and then, where without background it never waits.
        let model = HostModel {
            cpu_sigma: 0.0,
            background: 0.3,
            ..HostModel::default()
        };
        let run = |model: HostModel| {
            let mut h = Host::new(model, SimRng::new(7));
            let mut waited = 0;
            for i in 0..100_000u64 {
                let at = SimTime::from_us(i * 100);
                if h.run(at, Work::Read, US10, 1, 0) > at + SimDuration::from_us(10) {
                    waited += 1;
                }
            }
            let (cpu, _) = h.utilization(SimDuration::from_secs(10));
            (waited, cpu)
        };
        let (waited, cpu) = run(model);
        // 5 % of the cores is the load's own (10 µs per 100 µs over two).
        assert!((0.33..0.37).contains(&cpu), "busy {cpu}");
        // It waits when both cores are busy: about 0.3² of the time.
        assert!(
            (6_000..13_000).contains(&waited),
            "{waited} of 100,000 waited"
        );
        let (waited, cpu) = run(HostModel {
            background: 0.0,
            ..model
        });
        assert_eq!(waited, 0);
        assert!((0.049..0.051).contains(&cpu), "busy {cpu}");
        // On a shared machine the background is the machine's, reported apart.
        let machine = Cores::machine(2, 0.3, BACKGROUND_JOB_US, 0.0, 9);
        let mut h = Host::on(
            HostModel {
                background: 0.3,
                ..model
            },
            SimRng::new(1),
            machine,
        );
        h.run(SimTime::from_secs(10), Work::Read, US10, 1, 0);
        let bg = h.cores().machine_background_busy().expect("shared");
        let share = bg.as_us() as f64 / 20e6;
        assert!((0.28..0.32).contains(&share), "machine background {share}");
    }

    #[test]
    fn turns_that_reach_the_disk_during_an_fsync_share_the_next() {
        let mut h = host(1, 0.0); // commit 300 µs, constant
        let a = h.commit(SimTime::from_us(0));
        assert_eq!(a, SimTime::from_us(300));
        // Two turns during the first fsync: both in the second, 300..600.
        assert_eq!(h.commit(SimTime::from_us(100)), SimTime::from_us(600));
        assert_eq!(h.commit(SimTime::from_us(250)), SimTime::from_us(600));
        // One after the second started waits for a third.
        assert_eq!(h.commit(SimTime::from_us(400)), SimTime::from_us(900));
        assert_eq!(h.fsyncs, 3);
        assert_eq!(h.durable_at(), SimTime::from_us(900));
    }

    #[test]
    fn drawn_service_times_keep_their_mean_and_saturate_a_host() {
        let mut h = host(2, 1.0);
        // Offered 1.5× what two cores do (a 10 µs mean every 3.33 µs): the backlog
        // grows without bound, about 1/3 of the offered work per unit of time.
        let mut last = SimTime::ZERO;
        for i in 0..30_000u64 {
            last = h.run(SimTime::from_us(i * 10 / 3), Work::Read, US10, 1, 0);
        }
        let mean = h.busy.as_us() as f64 / 30_000.0;
        assert!((mean - 10.0).abs() < 0.5, "mean service {mean} µs");
        let offered_until = 30_000 * 10 / 3;
        assert!(
            last.as_us() > offered_until + offered_until / 4,
            "a saturated host kept up: done at {last:?}"
        );
        // At half its capacity it keeps up.
        let mut h = host(2, 1.0);
        let mut late = 0;
        for i in 0..30_000u64 {
            let at = SimTime::from_us(i * 10);
            if h.run(at, Work::Read, US10, 1, 0) > at + SimDuration::from_us(200) {
                late += 1;
            }
        }
        assert!(
            late < 300,
            "{late} of 30,000 waited over 200 µs at half load"
        );
    }
}
