//! A run split into two shards that run side by side, one per core.
//!
//! Each shard is a [`Simulation`] that runs the replicas and the clients of its own
//! regions; the regions are split so that the shards share as little as possible
//! and lie far apart (two groups of continents). Nothing one shard does can reach the
//! other sooner than the shortest latency between them, the lookahead `L`: a frame
//! between replicas, a client's request to a replica or its answer (conservative
//! parallel discrete-event simulation with a fixed lookahead).
//!
//! Time runs in windows of `L / 2` ([`SLACK`] windows per lookahead). At the end of
//! each window a shard sends the other a *crossing*: what it sent it during the
//! window. What is sent in window `j` is due no sooner than window `j + 2`, so a
//! shard runs window `j` as soon as it has taken in the other's crossing of window
//! `j - 2`: the shards never meet, and one that is slower in a window catches up in
//! the next instead of holding the other at a barrier. Over 10 virtual minutes of
//! the reference deployment (`L` about 35 ms, us-east to eu-west) that is about
//! 34,000 windows and crossings each way.
//!
//! What a crossing carries:
//! * frames in flight to the other shard's replicas ([`Network::hand_out`]): the
//!   sender's network decided their delivery time (its links, its pipes, its random
//!   draws);
//! * client requests, answers and probes, as events due in a later window (a read
//!   carries its key, scope and consistency: the operation lives in the client's
//!   shard);
//! * in-flight bytes a sender may release (`Replica::handle_sent`): delivered
//!   frames are credited to a sender of the other shard when the crossing is taken
//!   in, two windows on: at most `L` late, as an acknowledgement would be;
//! * what the checkers' record of each of the sender's origins gained (C1,
//!   replication lag), sent with the window's frames, so never later than a write.
//!
//! The shards share no memory they write in the hot path: each runs on its own
//! detached copy of the scenario (`Scenario::detached`), and frames and events
//! cross with their row mutations and keys copied and their ids swapped for the
//! receiving shard's own, by the receiver on its own thread. (Snapshot chunks and
//! merged rows of a placement backfill cross as they are: rare.) Two threads cloning
//! the same `Arc` write one cache line, and every read of the name behind it on the
//! other core then misses: shared ids made the two threads 10-80 % slower than
//! apart. So the values of the sender's that the receiver replaces are parked and
//! go back with the receiver's next crossing, for their owner to drop ([`Parked`]).
//!
//! Faults, the end of the workload, the catch-up and drain checks are global
//! instants: both shards run to one, take in everything in flight, and the
//! coordinator runs it there. Every shard runs every fault on its own replicas,
//! clients and network (both networks learn of every partition and every replica
//! down; a rollout draws its order from a stream both shards share), and convergence
//! is measured over both. The windows between two global instants are a *segment*.
//! The reports are merged. A run depends on its seed and its split (a function of
//! the topology and workload), never on the threads: one thread runs the shards'
//! windows in turn, each shard taking in, running and sending in the same order as
//! on two, and gives the same `trace_hash`.

use super::*;
use crate::net::{HandOff, ReplicaIdx};
use pangea_core::frame::Applied;
use std::collections::VecDeque;
use std::sync::mpsc;

/// What a shard needs to know about the split, and what it sends the others.
#[derive(Debug)]
pub(super) struct ShardCtx {
    pub(super) me: u8,
    /// The shard of each replica (network order).
    pub(super) replica: Vec<u8>,
    /// The shard of each region's clients (network order).
    pub(super) region: Vec<u8>,
    /// Events for other shards: (shard, due time, event).
    pub(super) outbox: Vec<(u8, SimTime, Ev)>,
    /// Frames delivered (or dropped) here from a replica of another shard: (from,
    /// to, bytes, the sender's life when it sent them if known).
    pub(super) sent_back: Vec<(usize, usize, usize, Option<u32>)>,
    /// Nothing this shard sends the other during the window being run may be due
    /// before this: where the window that takes it in starts (checked in debug
    /// builds).
    pub(super) due_min: SimTime,
    /// The other shard's values this shard replaced by its own while taking in:
    /// they go back with the next crossing, for the other to drop.
    parked: Parked,
    /// How much of each of its origins' checker records (`Checks::streams`,
    /// `Checks::proposed_us`) this shard has sent the other.
    tails_sent: Vec<(usize, usize)>,
}

/// What one shard sent the other during a window (see the module's list), taken
/// out at the window's end.
#[derive(Debug, Default)]
struct Crossing {
    frames: Vec<HandOff<Wire>>,
    events: Vec<(u8, SimTime, Ev)>,
    sent_back: Vec<(usize, usize, usize, Option<u32>)>,
    /// What the checkers' records of the sender's origins gained.
    tails: Vec<Tail>,
    /// The receiver's own values the sender parked: the receiver drops them.
    returned: Parked,
}

impl Crossing {
    /// When the first of it is due at the receiver.
    fn first_due(&self) -> Option<SimTime> {
        let frames = self.frames.iter().map(HandOff::deliver_at);
        frames.chain(self.events.iter().map(|e| e.1)).min()
    }
}

/// The end of one origin's checker records (`Checks::streams`, `Checks::proposed_us`)
/// that its shard has not sent yet, and where each begins.
#[derive(Debug)]
struct Tail {
    stream: usize,
    fingerprints_from: usize,
    fingerprints: Vec<Fingerprint>,
    proposed_from: usize,
    proposed: Vec<u64>,
}

/// Values of one shard that the other replaced by its own copies while taking in a
/// crossing. The owner drops them, on its own thread: dropping an `Arc` writes its
/// count, whose cache line the owner's thread reads all the time (the same traffic
/// that made shared ids 10-80 % slower).
#[derive(Debug, Default)]
pub(super) struct Parked {
    replicas: Vec<ReplicaId>,
    scopes: Vec<ScopeId>,
    mutations: Vec<RowMutation>,
    keys: Vec<Bytes>,
    applied: Vec<Applied>,
}

/// How a run is split: the shard of each region and the lookahead.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    /// By region, in the topology's region order.
    pub region_shard: Vec<u8>,
    /// The shortest one-way latency between the two shards.
    pub lookahead: SimDuration,
}

/// Lookaheads shorter than this are not worth the crossings: the run stays whole.
const LOOKAHEAD_MIN: SimDuration = SimDuration::from_ms(5);

/// The best split of `sc` into two shards: the most even load (replicas, and
/// client rate, by region), the longest lookahead among equals. `None` when no split
/// keeps the shards at least [`LOOKAHEAD_MIN`] apart.
pub fn plan_split(sc: &Scenario) -> Option<Split> {
    if sc.host.machine_cores.is_some() {
        return None; // the hosts share one machine's cores: one thread
    }
    if sc
        .faults
        .iter()
        .any(|f| matches!(f.kind, FaultKind::Backup { .. }))
    {
        return None; // a backup's tool reads from replicas of any region
    }
    let t = &sc.deployment.topology;
    let regions: Vec<&RegionId> = t.regions.keys().collect();
    let nr = regions.len();
    if !(2..=20).contains(&nr) {
        return None;
    }
    let replicas: Vec<f64> = regions
        .iter()
        .map(|r| t.regions[*r].replicas.len() as f64)
        .collect();
    let rate: Vec<f64> = regions
        .iter()
        .map(|r| {
            sc.workload
                .regions
                .iter()
                .filter(|l| l.region == **r)
                .map(|l| l.rate)
                .sum()
        })
        .collect();
    let (rt, ratet) = (
        replicas.iter().sum::<f64>().max(1.0),
        rate.iter().sum::<f64>().max(1e-9),
    );
    // Replicas do about 60 % of the work, clients the rest (docs/drills.md, "Where the time goes").
    let load: Vec<f64> = (0..nr)
        .map(|i| 0.6 * replicas[i] / rt + 0.4 * rate[i] / ratet)
        .collect();
    let mut rtt = vec![f64::INFINITY; nr * nr];
    for a in 0..nr {
        for b in 0..nr {
            if a != b {
                rtt[a * nr + b] = t.region_rtt_ms(regions[a], regions[b]).unwrap_or(0.0);
            }
        }
    }
    // Each split once (region 0 stays in shard 0): its heavier shard's load and its
    // shortest cross round trip.
    let splits: Vec<(f64, f64, u32)> = (2u32..1 << nr)
        .step_by(2)
        .map(|mask| {
            let (mut l0, mut l1, mut min_rtt) = (0.0, 0.0, f64::INFINITY);
            for a in 0..nr {
                let in1 = mask >> a & 1 == 1;
                if in1 {
                    l1 += load[a];
                } else {
                    l0 += load[a];
                }
                for b in 0..nr {
                    if in1 != (mask >> b & 1 == 1) {
                        min_rtt = min_rtt.min(rtt[a * nr + b]);
                    }
                }
            }
            (f64::max(l0, l1), min_rtt, mask)
        })
        .filter(|&(_, rtt, _)| SimDuration::from_ms_f64(rtt / 2.0) >= LOOKAHEAD_MIN)
        .collect();
    // Long windows matter as much as even shards (each window costs two crossings):
    // among the splits that keep at least 40 % of the load in each shard, those within
    // 3/4 of the longest lookahead; of those, the most even, then the longest.
    let longest = splits
        .iter()
        .filter(|s| s.0 <= 0.6)
        .map(|s| s.1)
        .fold(0.0, f64::max);
    let best = splits
        .iter()
        .filter(|s| s.0 <= 0.6 && s.1 >= 0.75 * longest)
        .min_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)))
        .copied();
    let (_, min_rtt, mask) = best?;
    Some(Split {
        region_shard: (0..nr).map(|a| (mask >> a & 1) as u8).collect(),
        lookahead: SimDuration::from_ms_f64(min_rtt / 2.0),
    })
}

/// Runs `sc` the fastest way that gives the same result on any machine: split into
/// two shards when [`plan_split`] finds a split (on up to `threads` threads: the
/// result does not depend on them), else whole.
pub fn run_scenario(sc: Scenario, threads: usize) -> Result<RunReport> {
    match plan_split(&sc) {
        Some(split) => run_split(sc, &split, threads),
        None => Simulation::new(sc)?.run(),
    }
}

/// Threads worth using for a split run on this machine: 2 with two cores or more.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// Global events of a split run: the coordinator handles them with both shards
/// stopped at their instant.
#[derive(Debug, Clone, Copy)]
enum Global {
    FaultStart(usize),
    FaultEnd(usize),
    EndWorkload,
    /// Of the catch-up that many heals ago started (one chain of checks at a time:
    /// each check ends a segment, and a chain per heal, as a whole run keeps, would
    /// cut the windows short after many faults).
    CatchUpCheck(u64),
    DrainCheck,
}

/// Runs `sc` split as `split` says, on `threads` threads (1 or 2; the result is
/// the same).
pub fn run_split(sc: Scenario, split: &Split, threads: usize) -> Result<RunReport> {
    let wall = std::time::Instant::now();
    let cpu0 = process_cpu_s();
    let mut shards = Vec::new();
    for me in 0..2u8 {
        let probe =
            Network::<Wire>::new(&sc.deployment.topology, sc.net.clone(), 0).context("network")?;
        let region_idx = |r: ReplicaIdx| probe.region_idx_of(r).expect("replica of the network");
        let replica = probe
            .replicas()
            .map(|(idx, _)| split.region_shard[region_idx(idx)])
            .collect();
        let ctx = ShardCtx {
            me,
            replica,
            region: split.region_shard.clone(),
            outbox: Vec::new(),
            sent_back: Vec::new(),
            due_min: SimTime::ZERO,
            parked: Parked::default(),
            tails_sent: Vec::new(),
        };
        let own = sc.detached();
        shards.push(Simulation::build(own, Some(Box::new(ctx)))?);
    }
    let [a, b] = shards
        .get_disjoint_mut([0, 1])
        .expect("two different shards");
    a.pin_other(b);
    b.pin_other(a);
    // From the networks as built (the split's figure is from the topology's round
    // trips): a window never outlasts the shortest way across.
    let lookahead = lookahead_of(&shards[0]);
    anyhow::ensure!(
        lookahead > SimDuration::ZERO,
        "the split's shards are not apart: {split:?}"
    );
    for s in &mut shards {
        s.start();
    }
    let mut end = Ending::new(&sc, threads);
    if threads > 1 {
        // One worker runs the second shard for the whole run; the shard travels to
        // it and back once per segment, the crossings once per window each way.
        std::thread::scope(|scope| {
            let (to_worker, work) = mpsc::channel::<(Simulation, Segment)>();
            let (to_main, done) = mpsc::channel::<Simulation>();
            let (a_to_b, from_a) = mpsc::channel::<Crossing>();
            let (b_to_a, from_b) = mpsc::channel::<Crossing>();
            scope.spawn(move || {
                while let Some((mut s, seg)) = recv_spinning(&work) {
                    s.run_segment(
                        seg,
                        &mut || recv_spinning(&from_a).expect("the main thread runs"),
                        &mut |c| b_to_a.send(c).expect("the main thread runs"),
                    );
                    if to_main.send(s).is_err() {
                        return;
                    }
                }
            });
            drive(&mut shards, lookahead, &mut end, &mut |shards, seg| {
                let b = shards.pop().expect("two shards");
                to_worker.send((b, seg)).expect("the worker runs");
                shards[0].run_segment(
                    seg,
                    &mut || recv_spinning(&from_b).expect("the worker runs"),
                    &mut |c| a_to_b.send(c).expect("the worker runs"),
                );
                shards.push(recv_spinning(&done).expect("the worker answers"));
            });
            drop(to_worker);
        });
    } else {
        // The shards in turn, window by window: each shard takes in, runs and sends
        // in the same order as on two threads.
        drive(&mut shards, lookahead, &mut end, &mut |shards, seg| {
            let [a, b] = shards
                .get_disjoint_mut([0, 1])
                .expect("two different shards");
            let (mut to_b, mut to_a) = (VecDeque::new(), VecDeque::new());
            let sent = "sent a window before";
            for j in 0..seg.windows() {
                a.window(seg, j, &mut || to_a.pop_front().expect(sent), &mut |c| {
                    to_b.push_back(c)
                });
                b.window(seg, j, &mut || to_b.pop_front().expect(sent), &mut |c| {
                    to_a.push_back(c)
                });
            }
            a.end_segment(seg, &mut || to_a.pop_front().expect(sent));
            b.end_segment(seg, &mut || to_b.pop_front().expect(sent));
        });
    }
    let Ending {
        catch_up,
        drain_started,
        final_convergence,
        violations,
        ..
    } = end;
    if final_convergence.is_none() && violations.is_empty() {
        // Named by the shard that runs a replica still behind.
        let targets = shards[0].durable_targets();
        let behind = shards.iter().position(|s| !s.covers(&targets)).unwrap_or(0);
        shards[behind].explain_not_converged();
    }
    // C1 over every acknowledged write: acknowledgements are counted where the
    // client runs, replicas checked where they run.
    let acked: Vec<u64> = (0..shards[0].checks.acked_max.len())
        .map(|i| {
            shards
                .iter()
                .map(|s| s.checks.acked_max[i])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut gaps = vec![None; acked.len()];
    for s in &mut shards {
        s.checks.acked_max.clone_from(&acked);
        for (g, mine) in gaps.iter_mut().zip(s.acked_gaps()) {
            if mine.as_ref().map_or(0, |m| m.0)
                > g.as_ref().map_or(0, |g: &(u64, ReplicaId, u64)| g.0)
            {
                *g = mine;
            }
        }
    }
    shards[0].report_acked_gaps(&gaps);
    // C8 likewise: increments acknowledged where clients run, counted where
    // replicas run.
    let mut counted = checks::Counted::new();
    for s in &mut shards {
        for (k, mut n) in std::mem::take(&mut s.checks.counted) {
            counted.entry(k).or_default().append(&mut n);
        }
    }
    if !counted.is_empty() {
        let oracle = merged_oracle(&shards);
        for s in &mut shards {
            s.check_counters(&counted, &oracle);
        }
    }
    let other = shards.pop().expect("two shards");
    let mut main = shards.pop().expect("two shards");
    main.catch_up = catch_up;
    main.drain_started = drain_started;
    main.final_convergence = final_convergence;
    main.checks.other_violations += violations.len() as u64;
    main.checks.violations.extend(violations);
    main.absorb(other);
    let wall_s = wall.elapsed().as_secs_f64();
    let cpu_s = process_cpu_s().zip(cpu0).map(|(b, a)| b - a);
    let mut report = main.report(wall_s);
    report.shards = 2;
    report.lookahead_ms = Some(lookahead.as_ms_f64());
    report.cpu_s = cpu_s;
    report.speedup_cpu = cpu_s.filter(|c| *c > 0.0).map(|c| report.virtual_s / c);
    Ok(report)
}

/// What the coordinator learns about the end of a split run.
struct Ending {
    global: EventQueue<Global>,
    hard_end: SimTime,
    catch_up: Option<CatchUp>,
    drain_started: Option<SimTime>,
    final_convergence: Option<SimTime>,
    violations: Vec<String>,
    /// Catch-ups started so far: only the newest one's checks run.
    catch_ups: u64,
    /// Threads the run may use (the final C5 check runs a thread per shard).
    threads: usize,
}

impl Ending {
    fn new(sc: &Scenario, threads: usize) -> Ending {
        let end_workload = SimTime::ZERO + sc.duration;
        let mut global = EventQueue::new();
        global.push(end_workload, Global::EndWorkload);
        for (i, f) in sc.faults.iter().enumerate() {
            if f.at < sc.duration {
                global.push(SimTime::ZERO + f.at, Global::FaultStart(i));
            }
        }
        Ending {
            global,
            hard_end: end_workload + sc.drain_max,
            catch_up: None,
            drain_started: None,
            final_convergence: None,
            violations: Vec::new(),
            catch_ups: 0,
            threads,
        }
    }
}

/// Runs the run as segments between global instants: `run` takes every shard
/// through a segment's windows, then the coordinator handles the global events due
/// at its end, with both shards stopped and everything in flight where it goes.
fn drive(
    shards: &mut Vec<Simulation>,
    lookahead: SimDuration,
    e: &mut Ending,
    run: &mut dyn FnMut(&mut Vec<Simulation>, Segment),
) {
    let hard_end = e.hard_end;
    let global = &mut e.global;
    let catch_up = &mut e.catch_up;
    let drain_started = &mut e.drain_started;
    let final_convergence = &mut e.final_convergence;
    let violations = &mut e.violations;
    let catch_ups = &mut e.catch_ups;
    let mut stop = false;
    loop {
        let end = global.peek_time().unwrap_or(hard_end).min(hard_end);
        let start = shards
            .iter()
            .filter_map(Simulation::next_time)
            .min()
            .unwrap_or(end)
            .min(end);
        if end > start {
            run(shards, Segment::new(start, end, lookahead));
        }
        for s in shards.iter_mut() {
            s.now = s.now.max(end);
        }
        let mut handled = false;
        while !stop && global.peek_time() == Some(end) {
            handled = true;
            let (_, g) = global.pop().expect("peeked");
            // Every shard runs every fault (each on its own replicas, clients and
            // network); convergence is measured over both.
            match g {
                Global::FaultStart(i) => {
                    for s in shards.iter_mut() {
                        s.fault_start(i);
                    }
                    let st = &shards[0].faults[i];
                    if st.started
                        && !st.ended
                        && let Some(d) = shards[0].sc.faults[i].duration
                    {
                        global.push(end + d, Global::FaultEnd(i));
                    }
                }
                Global::FaultEnd(i) => {
                    for s in shards.iter_mut() {
                        s.fault_end(i);
                    }
                    if shards[0].workload_on {
                        *catch_up = Some(CatchUp {
                            heal_at: end,
                            targets: shards[0].durable_targets(),
                            done_at: None,
                        });
                        *catch_ups += 1;
                        global.push(end + CATCH_UP_CHECK, Global::CatchUpCheck(*catch_ups));
                    }
                }
                Global::EndWorkload => {
                    let had_heal_inside = catch_up.is_some();
                    for s in shards.iter_mut() {
                        s.end_workload_here();
                    }
                    *drain_started = Some(end);
                    if !had_heal_inside {
                        *catch_up = Some(CatchUp {
                            heal_at: end,
                            targets: shards[0].durable_targets(),
                            done_at: None,
                        });
                        *catch_ups += 1;
                        global.push(end, Global::CatchUpCheck(*catch_ups));
                    } else if catch_up.as_ref().is_some_and(|c| c.done_at.is_none()) {
                        *catch_ups += 1;
                        global.push(end, Global::CatchUpCheck(*catch_ups));
                    }
                    global.push(end + DRAIN_CHECK, Global::DrainCheck);
                }
                Global::CatchUpCheck(n) => {
                    if n != *catch_ups {
                        continue; // a newer heal started its own chain
                    }
                    if let Some(c) = catch_up.as_mut().filter(|c| c.done_at.is_none()) {
                        if shards.iter().all(|s| s.covers(&c.targets)) {
                            c.done_at = Some(end);
                        } else if shards[0].workload_on || drain_started.is_some() {
                            global.push(end + CATCH_UP_CHECK, Global::CatchUpCheck(n));
                        }
                    }
                }
                Global::DrainCheck => {
                    let targets = shards[0].durable_targets();
                    if shards.iter().all(|s| s.covers(&targets)) {
                        if let Err(why) = digests_agree(shards, e.threads) {
                            violations.push(format!("C5: {why}"));
                        } else {
                            // As in one run (`on_drain_check`): a catch-up not yet
                            // seen done is done by now.
                            if let Some(c) = catch_up.as_mut().filter(|c| c.done_at.is_none()) {
                                c.done_at = Some(end);
                            }
                            *final_convergence = Some(end);
                        }
                        stop = true;
                        break;
                    }
                    global.push(end + DRAIN_CHECK, Global::DrainCheck);
                }
            }
        }
        if handled {
            // What the global events sent (a restarted replica's frames, answers to
            // requests a pause held) is due from `end + L` on: over to its shard
            // before the next segment, which may start later than `end`.
            exchange(shards);
        }
        if stop {
            break;
        }
        if end >= hard_end {
            // The last instant, as a whole run's `run_until(hard_end)` includes it
            // (nothing at it can reach the other shard in time to matter).
            for s in shards.iter_mut() {
                s.run_until(hard_end);
            }
            break;
        }
    }
}

/// Receives, spinning a while first: a window is a few milliseconds, and waking a
/// blocked thread costs tens of microseconds.
fn recv_spinning<T>(rx: &mpsc::Receiver<T>) -> Option<T> {
    for _ in 0..100_000 {
        match rx.try_recv() {
            Ok(v) => return Some(v),
            Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
            Err(mpsc::TryRecvError::Disconnected) => return None,
        }
    }
    rx.recv().ok()
}

/// The shortest time anything one shard does takes to reach the other: frames
/// between their replicas, client requests and answers between their regions.
fn lookahead_of(s: &Simulation) -> SimDuration {
    let ctx = s.shard.as_ref().expect("a shard");
    let n = ctx.replica.len();
    let mut min_us = u64::MAX;
    for a in 0..n {
        for b in 0..n {
            if ctx.replica[a] != ctx.replica[b]
                && let Some(l) = s
                    .net
                    .one_way_latency(ReplicaIdx::new(a), ReplicaIdx::new(b))
            {
                min_us = min_us.min(l.as_us());
            }
        }
    }
    for (region, row) in s.client_one_way_us.iter().enumerate() {
        for (r, &us) in row.iter().enumerate() {
            if ctx.region[region] != ctx.replica[r] {
                min_us = min_us.min(us);
            }
        }
    }
    SimDuration::from_us(min_us)
}

/// Windows between two global instants: each shard runs window `j` once the other
/// has run window `j - SLACK`, and may run ahead of it by up to `SLACK - 1` windows.
#[derive(Debug, Clone, Copy)]
struct Segment {
    start: SimTime,
    end: SimTime,
    window: SimDuration,
    lookahead: SimDuration,
}

/// Windows per lookahead. What a shard sends in a window is due at the other
/// shard a lookahead later at the soonest: `SLACK` windows on. So a window needs
/// only the other's crossings from `SLACK` windows before, and a shard slower in one
/// window catches up in the next ones instead of holding the other at a barrier
/// (lockstep windows of a whole lookahead made each thread wait 6-12 % of the run).
const SLACK: usize = 2;

impl Segment {
    fn new(start: SimTime, end: SimTime, lookahead: SimDuration) -> Segment {
        let window = SimDuration::from_us((lookahead.as_us() / SLACK as u64).max(1));
        Segment {
            start,
            end,
            window,
            lookahead,
        }
    }

    fn windows(&self) -> usize {
        let len = (self.end - self.start).as_us();
        len.div_ceil(self.window.as_us()) as usize
    }

    fn window_start(&self, j: usize) -> SimTime {
        self.start + SimDuration::from_us(self.window.as_us() * j as u64)
    }

    fn window_end(&self, j: usize) -> SimTime {
        self.window_start(j + 1).min(self.end)
    }
}

/// At a global instant, with both shards stopped: each takes in what the other
/// sent since the last window.
fn exchange(shards: &mut [Simulation]) {
    let [a, b] = shards
        .get_disjoint_mut([0, 1])
        .expect("a split run has two shards");
    let (to_b, to_a) = (a.take_out(), b.take_out());
    b.take_in(to_b);
    a.take_in(to_a);
}

impl Simulation {
    fn ctx_mut(&mut self) -> &mut ShardCtx {
        self.shard.as_mut().expect("a shard")
    }

    /// Takes out what this shard sent the other during the window just run: the
    /// frames in flight to its replicas, the events for its clients and replicas,
    /// the bytes its senders may release, what its origins' checker records gained,
    /// and the other's values it parked.
    fn take_out(&mut self) -> Crossing {
        let frames = self.net.hand_out();
        let n = self.names.len();
        let Simulation { shard, checks, .. } = self;
        let ctx = shard.as_mut().expect("a shard");
        debug_assert!(
            frames.iter().all(|h| h.deliver_at() >= ctx.due_min)
                && ctx.outbox.iter().all(|e| e.1 >= ctx.due_min),
            "something sent to another shard is due before the window that takes it in: \
             the lookahead is wrong"
        );
        debug_assert!({
            let other = 1 - ctx.me;
            frames.iter().all(|h| ctx.replica[h.to().index()] == other)
                && ctx.outbox.iter().all(|(k, ..)| *k == other)
                && ctx.sent_back.iter().all(|(s, ..)| ctx.replica[*s] == other)
        });
        // The checkers' record of each origin's writes goes from the origin's shard
        // to the other with the window's frames: a write reaches the other shard no
        // sooner.
        ctx.tails_sent.resize(checks.streams.len(), (0, 0));
        let mut tails = Vec::new();
        for (st, sent) in ctx.tails_sent.iter_mut().enumerate() {
            let (f, p) = (&checks.streams[st], &checks.proposed_us[st]);
            if ctx.replica[st % n] == ctx.me && (f.len(), p.len()) != *sent {
                tails.push(Tail {
                    stream: st,
                    fingerprints_from: sent.0,
                    fingerprints: f[sent.0..].to_vec(),
                    proposed_from: sent.1,
                    proposed: p[sent.1..].to_vec(),
                });
                // The records only grow: what was sent is a prefix.
                *sent = (f.len(), p.len());
            }
        }
        Crossing {
            frames,
            events: std::mem::take(&mut ctx.outbox),
            sent_back: std::mem::take(&mut ctx.sent_back),
            tails,
            returned: std::mem::take(&mut ctx.parked),
        }
    }

    /// Takes in what the other shard sent this one, making it this shard's own
    /// ([`Simulation::take_over`]), and drops the values of its own the other
    /// parked. On this shard's thread.
    fn take_in(&mut self, c: Crossing) {
        let Crossing {
            mut frames,
            events,
            sent_back,
            tails,
            returned,
        } = c;
        drop(returned);
        for t in tails {
            extend_tail(
                &mut self.checks.streams[t.stream],
                t.fingerprints_from,
                t.fingerprints,
                Fingerprint::default(),
            );
            extend_tail(
                &mut self.checks.proposed_us[t.stream],
                t.proposed_from,
                t.proposed,
                u64::MAX,
            );
        }
        let mut copies = Copies {
            parked: std::mem::take(&mut self.ctx_mut().parked),
            ..Copies::default()
        };
        for h in &mut frames {
            self.take_over(&mut h.msg_mut().frame, &mut copies);
        }
        if !frames.is_empty() {
            self.net.hand_in(frames);
        }
        for (_, at, mut ev) in events {
            self.take_over_event(&mut ev, &mut copies);
            self.queue.push(at, ev);
        }
        for (sender, receiver, bytes, life) in sent_back {
            let [node, to] = self
                .nodes
                .get_disjoint_mut([sender, receiver])
                .expect("a frame goes to another replica");
            if life.is_none_or(|l| node.life == l)
                && let Some(rep) = node.replica.as_mut()
            {
                rep.handle_sent(&to.id, bytes);
            }
        }
        self.ctx_mut().parked = copies.parked;
    }

    /// Window `j` of `seg`: takes in what the other shard sent `SLACK` windows
    /// before (`inbox`), runs every event before the window's end, and sends the
    /// other what it gets (`send`).
    fn window(
        &mut self,
        seg: Segment,
        j: usize,
        inbox: &mut dyn FnMut() -> Crossing,
        send: &mut dyn FnMut(Crossing),
    ) {
        let start = seg.window_start(j);
        if j >= SLACK {
            let c = inbox();
            debug_assert!(c.first_due().is_none_or(|t| t >= start));
            self.take_in(c);
        }
        self.ctx_mut().due_min = start + seg.lookahead;
        self.run_before(seg.window_end(j));
        send(self.take_out());
    }

    /// The end of a segment: takes in what the other sent in its last windows.
    fn end_segment(&mut self, seg: Segment, inbox: &mut dyn FnMut() -> Crossing) {
        let n = seg.windows();
        for _ in n.saturating_sub(SLACK)..n {
            self.take_in(inbox());
        }
    }

    /// Every window of `seg`, then its end.
    fn run_segment(
        &mut self,
        seg: Segment,
        inbox: &mut dyn FnMut() -> Crossing,
        send: &mut dyn FnMut(Crossing),
    ) {
        for j in 0..seg.windows() {
            self.window(seg, j, inbox, send);
        }
        self.end_segment(seg, inbox);
    }

    /// Lets this shard find the other's ids by address, as it finds its own
    /// (`localize`). The other's names are pinned here, never cloned again.
    fn pin_other(&mut self, other: &Simulation) {
        for node in &other.nodes {
            self.names.pin(&node.id);
        }
        pin_views(&mut self.names, &mut self.scopes, &other.views);
    }

    /// Makes a frame from the other shard this shard's own: its ids are swapped for
    /// this shard's and its row mutations copied (`RowMutation::detached`; once per
    /// crossing however many replicas the entry goes to, see [`Copies`]), so that the
    /// threads never write each other's memory. A snapshot chunk's rows stay
    /// shared: they cross only when a replica rebuilds.
    pub(super) fn take_over(&self, frame: &mut Frame, copies: &mut Copies) {
        let entry = |e: &mut LogEntry, copies: &mut Copies| {
            self.own_scope(&mut e.scope, &mut copies.parked);
            self.own_replica(&mut e.origin, &mut copies.parked);
            copies.copy(&mut e.mutation);
        };
        let p = &mut copies.parked;
        match frame {
            Frame::Mutations(es) => es.iter_mut().for_each(|e| entry(e, copies)),
            Frame::Heartbeats(hbs) => {
                for hb in hbs {
                    self.own_scope(&mut hb.scope, p);
                    self.own_replica(&mut hb.origin, p);
                    if !hb.applied.is_empty() {
                        let own = hb
                            .applied
                            .iter()
                            .map(|(o, w)| {
                                let mut o = o.clone();
                                self.own_replica(&mut o, p);
                                (o, *w)
                            })
                            .collect();
                        p.applied.push(std::mem::replace(&mut hb.applied, own));
                    }
                }
            }
            Frame::GapRequest(g) => {
                self.own_scope(&mut g.scope, p);
                self.own_replica(&mut g.origin, p);
            }
            Frame::GapFill(g) => {
                self.own_scope(&mut g.scope, p);
                self.own_replica(&mut g.origin, p);
                g.entries.iter_mut().for_each(|e| entry(e, copies));
            }
            Frame::SnapshotRequest { scope } => self.own_scope(scope, p),
            Frame::SnapshotChunk(c) => {
                self.own_scope(&mut c.scope, p);
                c.watermarks
                    .iter_mut()
                    .for_each(|(o, _)| self.own_replica(o, p));
            }
        }
    }

    /// Makes an event from the other shard this shard's own, as `take_over` does
    /// a frame: a write's mutation and a read's key are copied, and the
    /// watermarks and tokens of answers and probe replies (about 250 a second on
    /// the reference run, each naming every origin) get this shard's ids.
    pub(super) fn take_over_event(&self, ev: &mut Ev, copies: &mut Copies) {
        let p = &mut copies.parked;
        match ev {
            Ev::Request { write, remote, .. } => {
                for w in write.iter_mut().flat_map(|w| w.iter_mut()) {
                    let own = w.detached();
                    p.mutations.push(std::mem::replace(w, own));
                }
                if let Some(r) = remote {
                    let own = Bytes::copy_from_slice(&r.key);
                    p.keys.push(std::mem::replace(&mut r.key, own));
                    if let Consistency::Watermark(t) = &mut r.consistency {
                        self.own_scope(&mut t.scope, p);
                        self.own_replica(&mut t.origin, p);
                    }
                }
            }
            Ev::Response { reply, .. } => match &mut **reply {
                Reply::Ok { wm, token, .. } => {
                    if let Some(wm) = wm {
                        self.own_watermarks(wm, p);
                    }
                    if let Some(t) = token {
                        self.own_scope(&mut t.scope, p);
                        self.own_replica(&mut t.origin, p);
                    }
                }
                Reply::Err(_, Some(wm)) => self.own_watermarks(wm, p),
                Reply::Err(_, None) | Reply::Refused => {}
            },
            Ev::ProbeReply { wms: Some(wms), .. } => {
                wms.iter_mut()
                    .for_each(|(_, wm)| self.own_watermarks(wm, p));
            }
            _ => {}
        }
    }

    fn own_watermarks(&self, wm: &mut ScopeWatermarks, p: &mut Parked) {
        self.own_scope(&mut wm.scope, p);
        for o in wm.ids_mut() {
            self.own_replica(o, p);
        }
    }

    /// Swaps `id` for this shard's own, parking the other's.
    fn own_scope(&self, id: &mut ScopeId, p: &mut Parked) {
        if let Some(s) = self.scopes.get(id.as_str()) {
            let own = &self.scope_ids[s];
            if own.as_str().as_ptr() != id.as_str().as_ptr() {
                p.scopes.push(std::mem::replace(id, own.clone()));
            }
        }
    }

    /// Swaps `id` for this shard's own, parking the other's.
    fn own_replica(&self, id: &mut ReplicaId, p: &mut Parked) {
        if let Some(r) = self.names.get(id.as_str()) {
            let own = &self.nodes[r].id;
            if own.as_str().as_ptr() != id.as_str().as_ptr() {
                p.replicas.push(std::mem::replace(id, own.clone()));
            }
        }
    }
}

/// The copies of row mutations made taking in one crossing, by the address of the
/// original's mutations (a `RowMutation`'s clones share them): an entry forwarded
/// to several replicas of the other shard is copied once. The originals are parked,
/// so no address is reused meanwhile.
#[derive(Default)]
pub(super) struct Copies {
    by_addr: HashMap<usize, RowMutation>,
    parked: Parked,
}

impl Copies {
    /// Swaps `m` for this shard's copy, parking the original.
    fn copy(&mut self, m: &mut RowMutation) {
        let copy = (self.by_addr.entry(m.mutations().as_ptr() as usize))
            .or_insert_with(|| m.detached())
            .clone();
        debug_assert_eq!(&copy, m);
        self.parked.mutations.push(std::mem::replace(m, copy));
    }
}

/// Extends `dst` with what `tail` (the part of another shard's record from `from`
/// on) has beyond `dst`'s length; `dst` may have grown on its own meanwhile.
fn extend_tail<T: Clone>(dst: &mut Vec<T>, from: usize, tail: Vec<T>, hole: T) {
    if dst.len() < from {
        dst.resize(from, hole); // not expected: every earlier tail came first
    }
    if let Some(new) = tail.get(dst.len() - from..) {
        dst.extend_from_slice(new);
    }
}

/// The union of the shards' oracles (each holds its origins' writes).
fn merged_oracle(shards: &[Simulation]) -> BTreeMap<(Arc<str>, Bytes), RowState> {
    let mut oracle = shards[0].checks.oracle.clone();
    for s in &shards[1..] {
        for ((table, key), row) in &s.checks.oracle {
            let schema = s.checks.schema.table(table);
            oracle
                .entry((table.clone(), key.clone()))
                .or_default()
                .merge(row, schema);
        }
    }
    oracle
}

/// C5 over both shards: the oracle is the union of the shards' (each holds its
/// origins' writes), and every replica, in its own shard, must match it.
fn digests_agree(shards: &[Simulation], threads: usize) -> std::result::Result<(), String> {
    let oracle = merged_oracle(shards);
    // Digested once: the shards meet at the same instant with equal deployments.
    let (oracle, location) = shards[0].oracle_digests(&oracle);
    if threads < 2 {
        return shards
            .iter()
            .try_for_each(|s| s.replicas_match(&oracle, &location));
    }
    // A shard per thread: at the end of a long run this is a few hundred ms each.
    // The first error in shard order, as on one thread.
    std::thread::scope(|scope| {
        let (oracle, location) = (&oracle, &location);
        let rest: Vec<_> = shards[1..]
            .iter()
            .map(|s| scope.spawn(move || s.replicas_match(oracle, location)))
            .collect();
        let first = shards[0].replicas_match(oracle, location);
        let rest = rest
            .into_iter()
            .map(|h| h.join().expect("a digest thread does not panic"));
        std::iter::once(first).chain(rest).collect()
    })
}

/// CPU seconds of this process (Linux `/proc/self/stat`: user plus system, in
/// clock ticks of 10 ms); `None` elsewhere.
fn process_cpu_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

impl Simulation {
    /// The time of this shard's next event, if any.
    pub(super) fn next_time(&self) -> Option<SimTime> {
        match (self.queue.peek_time(), self.net.next_delivery()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes in another shard's measurements, checks and trace at the end of a
    /// split run.
    fn absorb(&mut self, o: Simulation) {
        let m = &mut self.metrics;
        let om = o.metrics;
        for (a, b) in m.modes.iter_mut().zip(&om.modes) {
            a.absorb(b);
        }
        for (a, b) in m.regions.iter_mut().zip(&om.regions) {
            a.absorb(b);
        }
        for (a, b) in m.region_modes.iter_mut().zip(&om.region_modes) {
            for (x, y) in a.iter_mut().zip(b) {
                x.absorb(y);
            }
        }
        m.writes.absorb(&om.writes);
        m.batches.absorb(&om.batches);
        m.reads += om.reads;
        m.reads_ok += om.reads_ok;
        m.lag.add(&om.lag).expect("same histogram bounds");
        for (a, b) in m.lag_matrix.iter_mut().zip(&om.lag_matrix) {
            a.absorb(b);
        }
        for (a, b) in m.series.iter_mut().zip(&om.series) {
            for (x, y) in a.iter_mut().zip(b) {
                x.absorb(y);
            }
        }
        for (a, b) in m.lag_series.iter_mut().zip(&om.lag_series) {
            a.absorb(b);
        }
        m.counters.absorb(om.counters);
        // A job runs in its runner's shard alone.
        self.migrations.extend(o.migrations);
        // Each host is busy in its replica's shard alone.
        for (a, b) in self.nodes.iter_mut().zip(o.nodes) {
            if a.foreign && !b.foreign {
                a.host = b.host;
            }
        }
        m.client_cross_region_bytes += om.client_cross_region_bytes;
        let c = &mut self.checks;
        c.lost_writes += o.checks.lost_writes;
        c.lost_increments += o.checks.lost_increments;
        c.watermark_violations += o.checks.watermark_violations;
        c.token_violations += o.checks.token_violations;
        c.staleness_violations += o.checks.staleness_violations;
        c.other_violations += o.checks.other_violations;
        // Both shards run every fault: an error in one is reported once.
        for v in o.checks.violations {
            if !c.violations.contains(&v) {
                c.violation(v);
            }
        }
        self.leak_bytes += o.leak_bytes;
        self.now = self.now.max(o.now);
        self.trace.0.update(&o.trace.0.digest().to_le_bytes());
        self.net_absorbed = Some(o.net.stats());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_tiles_its_span_with_windows_of_half_the_lookahead() {
        let ms = SimDuration::from_ms;
        let start = SimTime::ZERO + ms(100);
        let seg = Segment::new(start, start + ms(100), ms(35));
        assert_eq!(seg.window, SimDuration::from_us(17_500));
        // 100 ms in windows of 17.5 ms: five whole and a last one cut at the end.
        assert_eq!(seg.windows(), 6);
        assert_eq!(seg.window_start(0), start);
        assert_eq!(seg.window_end(0), start + SimDuration::from_us(17_500));
        assert_eq!(
            seg.window_start(5),
            start + ms(87) + SimDuration::from_us(500)
        );
        assert_eq!(seg.window_end(5), start + ms(100));
        // What a window sends is due a lookahead after its start at the soonest,
        // which is where window `j + SLACK` starts, or later.
        for j in 0..seg.windows() {
            assert!(seg.window_start(j) + seg.lookahead >= seg.window_start(j + SLACK));
        }
        // A span shorter than a window is one window.
        assert_eq!(Segment::new(start, start + ms(1), ms(35)).windows(), 1);
    }

    #[test]
    fn a_tail_extends_only_past_what_the_receiver_has() {
        let mut dst = vec![1, 2, 3];
        // The sender's record from index 2 on: [3, 4, 5]; the receiver has 3 already.
        extend_tail(&mut dst, 2, vec![3, 4, 5], 0);
        assert_eq!(dst, [1, 2, 3, 4, 5]);
        // The receiver grew on its own past the tail: nothing to add.
        extend_tail(&mut dst, 3, vec![4], 0);
        assert_eq!(dst, [1, 2, 3, 4, 5]);
        // A tail past the end (not expected) leaves a hole, never a shifted record.
        extend_tail(&mut dst, 7, vec![8], 0);
        assert_eq!(dst, [1, 2, 3, 4, 5, 0, 0, 8]);
    }
}
