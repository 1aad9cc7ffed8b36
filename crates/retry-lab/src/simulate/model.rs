//! The discrete-event model: clients, servers and operations in virtual time.
//!
//! One run simulates one policy under one load profile. Time is a `u64` of nanoseconds; events are
//! ordered by (time, sequence number), so ties resolve in the order they were scheduled and a run
//! is a pure function of its parameters and seeds. Arrivals and service times come from generators
//! seeded by the load alone, so every policy sees the same offered operations.

use std::collections::VecDeque;
use std::time::Duration;

use bson::doc;
use rand_core::RngCore;
use retry_core::address::ServerAddress;
use retry_core::error::{ErrorKind, NetworkErrorKind, NetworkPhase, OperationError};
use retry_core::hedging::{self, CopyId, CopyStage, HedgingMachine};
use retry_core::retry::{self, AttemptServer, OperationKind, OperationSpec, RetryMachine};
use retry_core::rng::EngineRng;
use retry_core::selection::{
    ReadPreference, ReadPreferenceMode, RepeatedSelection, SelectionCriteria, SelectionSettings,
};
use retry_core::time::{Instant, OperationTimeout};
use retry_core::topology::{
    AverageRtt, ServerDescription, ServerType, TopologyDescription, TopologyType,
};
use smallvec::SmallVec;

use super::events::{Event, Few, Kind, Lane, Timers, NONE};
use super::exponential::Exponential;
use super::policy::{
    unit, ClientBudget, GrpcConfigs, SimPolicy, AWS_MAX_ATTEMPTS, AWS_MAX_BACKOFF, AWS_QUOTA,
    AWS_THROTTLING_BASE, AWS_THROTTLING_COST, AWS_TRANSIENT_BASE, AWS_TRANSIENT_COST,
    OVERLOAD_CODE, SRE_BACKOFF_BASE, SRE_MAX_ATTEMPTS,
};
use super::sort::sort_u32;

/// The most replica-set members a simulation models: a client's deprioritized members are one
/// 64-bit set of member indices (SS-11), and a member index is kept in a byte (at most 255).
/// [`Cluster::validate`] refuses more, and fewer than one (house rule 11).
pub const MAX_MEMBERS: usize = 64;

/// The member-count rule of [`Cluster::validate`] and
/// [`SimulateArgs::validate`](super::SimulateArgs::validate): 1 to [`MAX_MEMBERS`] members
/// (house rule 11, review17 finding 1: refused, never truncated).
pub(super) fn check_members(servers: usize) -> Result<(), String> {
    if (1..=MAX_MEMBERS).contains(&servers) {
        Ok(())
    } else {
        Err(format!(
            "the simulated replica set has 1 to {MAX_MEMBERS} members"
        ))
    }
}

/// The simulated cluster and its clients.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Replica-set members (one primary, the rest secondaries); reads use `nearest`.
    pub servers: usize,
    /// Clients, each with its own budgets; operations are spread evenly over them.
    pub clients: usize,
    /// Operations each secondary runs at once.
    pub workers: u32,
    /// Operations the primary runs at once for these reads (it also serves the writes, which are
    /// not simulated), so that one member overloads before the others.
    pub primary_workers: u32,
    /// Mean service time of an ordinary admitted operation (exponentially distributed).
    pub service_mean: Duration,
    /// The fraction of operations that straggle (a slow disk, a pause): their service time is
    /// `straggler_factor` times longer.
    pub straggler_fraction: f64,
    /// How much longer a straggler takes.
    pub straggler_factor: f64,
    /// The ingress limiter admits this fraction of the server's capacity (a token bucket refilled
    /// at that rate); the rest is shed with code 462.
    pub admit_fraction: f64,
    /// The ingress limiter's burst: it holds this long's worth of admissions.
    pub burst: Duration,
    /// The server time a shed request (or one whose deadline passed in the queue) costs.
    pub shed_cost: Duration,
    /// One-way network delay.
    pub network: Duration,
    /// The client's operation timeout (CSOT `timeoutMS`).
    pub timeout: Duration,
    /// The service configs of the gRPC policies.
    pub grpc: GrpcConfigs,
}

impl Default for Cluster {
    fn default() -> Cluster {
        Cluster {
            servers: 3,
            clients: 24,
            workers: 4,
            primary_workers: 2,
            service_mean: Duration::from_millis(4),
            straggler_fraction: 0.01,
            straggler_factor: 10.0,
            admit_fraction: 0.9,
            burst: Duration::from_millis(25),
            shed_cost: Duration::from_micros(50),
            network: Duration::from_micros(250),
            timeout: Duration::from_secs(2),
            grpc: GrpcConfigs::default(),
        }
    }
}

impl Cluster {
    /// Checks what the model cannot run: `servers` outside 1 to [`MAX_MEMBERS`] (house rule 11,
    /// review17 finding 1). [`run`] and [`run_all`](super::run_all) call it.
    pub fn validate(&self) -> Result<(), String> {
        check_members(self.servers)
            .map_err(|e| format!("invalid Cluster::servers {}: {e}", self.servers))
    }

    /// Operations per second the whole cluster completes at full use.
    pub fn capacity(&self) -> f64 {
        (0..self.servers.max(1))
            .map(|i| f64::from(self.workers_of(i)))
            .sum::<f64>()
            / self.mean_service().as_secs_f64()
    }

    /// The mean service time, stragglers included.
    pub fn mean_service(&self) -> Duration {
        let p = self.straggler_fraction.clamp(0.0, 1.0);
        self.service_mean
            .mul_f64(1.0 - p + p * self.straggler_factor.max(1.0))
    }

    /// The workers of member `i` (0 is the primary).
    pub fn workers_of(&self, i: usize) -> u32 {
        if i == 0 {
            self.primary_workers.max(1)
        } else {
            self.workers.max(1)
        }
    }
}

/// The offered load over time, as a multiple of the cluster's capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Load {
    /// The same load throughout.
    Steady(f64),
    /// `base`, then `peak` from `start` for `length`, then `base` again.
    Episode {
        /// The load before and after.
        base: f64,
        /// The load during the episode.
        peak: f64,
        /// When the episode starts.
        start: Duration,
        /// How long it lasts.
        length: Duration,
    },
}

impl Load {
    fn max(&self) -> f64 {
        match *self {
            Load::Steady(x) => x,
            Load::Episode { base, peak, .. } => base.max(peak),
        }
    }
}

/// One run: a policy, a load, how long operations arrive, what is measured.
#[derive(Clone, Debug, PartialEq)]
pub struct RunSpec {
    /// The policy.
    pub policy: SimPolicy,
    /// The offered load.
    pub load: Load,
    /// Operations arrive during this long; the run then continues until every one has finished.
    pub duration: Duration,
    /// Operations that start before this are not measured.
    pub warmup: Duration,
    /// The width of the time-series buckets.
    pub bucket: Duration,
    /// The seed of arrivals and service times (policies share it) and of the clients' choices.
    pub seed: u64,
}

/// What a run measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunResult {
    /// Measured operations (started after the warmup).
    pub operations: u64,
    /// Of those, the successful ones.
    pub succeeded: u64,
    /// Attempts sent to a server by measured operations (hedged copies included).
    pub attempts: u64,
    /// Requests the servers shed with code 462, over the whole run.
    pub shed: u64,
    /// Every attempt sent to a server, over the whole run (the speed benchmark's unit).
    pub total_attempts: u64,
    /// The most attempts any one operation sent.
    pub max_attempts_per_operation: u32,
    /// Latencies of measured operations in microseconds, successes and failures, sorted.
    pub latencies_us: Vec<u32>,
    /// Per bucket: operations that succeeded (by completion time).
    pub series_succeeded: Vec<u32>,
    /// Per bucket: operations that failed (by completion time).
    pub series_failed: Vec<u32>,
    /// Per bucket: attempts sent (by send time).
    pub series_attempts: Vec<u32>,
    /// Per bucket: the summed latency of completed operations, in microseconds.
    pub series_latency_us: Vec<u64>,
    /// Inputs the retry and hedging machines refused, over the whole run: each is a simulator
    /// bug (an operation would wait for an input that never comes), counted in every build, and
    /// [`simulate`](super::simulate) fails a run with any (house rule 8, review9 finding 8). An
    /// event the model finds in a source that does not hold its kind (a bug too) counts here.
    pub refused: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The lane of operation deadlines (a timeout after the start).
const DEADLINES: usize = 0;
/// The source of the next arrival (the lanes are 0 and 1).
const ARRIVAL: usize = 4;
/// The source of the timers.
const TIMERS: usize = 2;
/// The source of the workers' completions.
const COMPLETIONS: usize = 3;
/// The lane of requests on their way to a server and replies on their way back: both arrive the
/// network delay after they left.
const NETWORK: usize = 1;

/// One attempt from its send to its reply: on its way, in a server's queue, on a worker, on its
/// way back. Kept in [`World::works`] so that events carry only its index.
#[derive(Clone, Copy, Debug)]
struct Work {
    op: u32,
    serial: u32,
    gen: u32,
    copy: u8,
    shed: bool,
    server: u8,
    outcome: Outcome,
    deadline: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Overloaded,
    Expired,
}

struct Server {
    workers: u32,
    /// Ingress admissions per nanosecond, and the burst in admissions.
    admit_per_ns: f64,
    burst: f64,
    busy: u32,
    queue: VecDeque<Queued>,
    tokens: f64,
    refilled_at: u64,
    rng: EngineRng,
}

/// An attempt in a server's queue, with what a worker reads when it takes the attempt: its entry
/// in [`World::works`], written when it arrived, is then only written (its outcome), not read, so
/// that an attempt that waited long (its entry long evicted from the caches) costs no load that
/// misses.
#[derive(Clone, Copy)]
struct Queued {
    work: u32,
    shed: bool,
    deadline: u64,
}

/// What a worker spends on an item: the service time of an admitted operation, the shed cost.
struct Service {
    /// Exponential variates (service times, inter-arrival times).
    exp: Exponential,
    shed_ns: u64,
    service_ns: f64,
    straggler_fraction: f64,
    straggler_factor: f64,
}

impl Service {
    /// A worker of `server` takes the attempt `item` at `now`: how long it takes, and its
    /// outcome.
    #[inline]
    fn begin(&self, server: &mut Server, item: Queued, now: u64) -> (u64, Outcome) {
        if item.shed {
            (self.shed_ns, Outcome::Overloaded)
        } else if now >= item.deadline {
            // maxTimeMS: the server drops an operation whose time ran out while it queued.
            (self.shed_ns, Outcome::Expired)
        } else {
            let e = self.exp.sample(&mut server.rng);
            let mut mean = self.service_ns;
            if unit(&mut server.rng) < self.straggler_fraction {
                mean *= self.straggler_factor;
            }
            ((e * mean) as u64 + 1, Outcome::Ok)
        }
    }
}

/// A baseline policy's per-operation state (naive, AWS, SRE).
#[derive(Default)]
struct Simple {
    attempts: u32,
    /// The server the latest attempt went to.
    server: u8,
    /// AWS: the quota tokens the retry in flight holds (refunded on success).
    holding: u32,
    /// Whether an attempt is at a server.
    in_flight: bool,
}

/// An operation's machine, inline in its [`Slot`] (not boxed): an event finds the slot and the
/// machine by one index, without a dependent load of the machine's address (the slots of the
/// operations in flight at high load are megabytes, so each such load is a cache miss).
#[allow(clippy::large_enum_variant)] // the baselines' slots are as large as the machines'
enum Machine {
    Retry(RetryMachine),
    Hedge(HedgingMachine),
    Simple(Simple),
}

/// An operation's state in its [`Slot`] of [`Sim::slots`]. A slot outlives its operation: the
/// next operation in it restarts the machine it holds in place (the policy, so the kind of
/// machine, is the run's).
struct Op {
    client: u32,
    /// Never 0 while the operation runs; 0 once it has ended, so that no event matches it.
    serial: u32,
    start: u64,
    gen: u32,
    measured: bool,
    attempts: u32,
    /// The server of each copy (hedging).
    servers: SmallVec<[u8; 5]>,
    /// The server of the latest attempt (retry machine; 0 before the first).
    server: u8,
    timer_at: u64,
}

impl Op {
    fn empty() -> Op {
        Op {
            client: 0,
            serial: 0,
            start: 0,
            gen: 0,
            measured: false,
            attempts: 0,
            servers: SmallVec::new(),
            server: 0,
            timer_at: u64::MAX,
        }
    }
}

struct Client {
    budget: ClientBudget,
    rng: EngineRng,
    /// Operations in flight per member, by member index: one entry for each of the most members
    /// a run has ([`Cluster::validate`]), so that an index masked to `0..MAX_MEMBERS` needs no
    /// bounds check.
    in_flight: [u32; MAX_MEMBERS],
}

/// Server selection as every client runs it: retry-core's pipeline over the replica set, reads
/// with `nearest`, the client's operations in flight per member for the power of two choices. The
/// topology never changes, so [`RepeatedSelection`] remembers the latency window per deprioritized
/// set (the same choices and draws as `select_server`).
struct Selector {
    selection: RepeatedSelection,
}

impl Selector {
    /// The member for the client's next attempt, avoiding the members of `deprioritized` (one
    /// bit per member index) when it can.
    #[inline]
    fn pick(&mut self, client: &mut Client, deprioritized: u64) -> u8 {
        let in_flight = &client.in_flight;
        let chosen = self.selection.select_index(
            &[deprioritized],
            |i| in_flight[member(i)],
            &mut client.rng,
        );
        match chosen {
            Ok(Some(i)) => i as u8,
            _ => 0,
        }
    }
}

/// Member index `i` (below [`MAX_MEMBERS`], which [`Cluster::validate`] ensures) as an index of
/// a per-member array of [`MAX_MEMBERS`] entries: masked, so that indexing checks no bounds.
#[inline]
fn member(i: usize) -> usize {
    debug_assert!(i < MAX_MEMBERS);
    i % MAX_MEMBERS
}

/// The members of `addresses` as a set of member indices (the simulator's addresses are
/// `member:27017 + index`).
#[inline]
fn member_set(addresses: &[ServerAddress]) -> u64 {
    debug_assert!(addresses.iter().all(|a| index(a) < MAX_MEMBERS));
    addresses.iter().fold(0, |set, a| {
        set | 1u64.checked_shl(index(a) as u32).unwrap_or(0)
    })
}

/// A run in progress: the operations' slots, and the rest of the model apart from them, so that
/// an operation's machine can be driven while the model around it changes.
pub(crate) struct Sim<'a> {
    /// The operations' slots, and the free ones among them.
    slots: Vec<Slot>,
    free: Vec<u32>,
    w: World<'a>,
}

/// An operation's slot and its machine: one lookup finds both, and both can be borrowed at once.
/// Aligned to a cache line, the operation first: an event that finds its operation ended reads
/// one line.
#[repr(C, align(64))]
struct Slot {
    op: Op,
    machine: Machine,
}

/// Everything of a run but the operations' slots: time, events, servers, clients, results.
struct World<'a> {
    cluster: &'a Cluster,
    spec: &'a RunSpec,
    now: u64,
    seq: u64,
    /// Timers (backoffs, hedging delays).
    timers: Timers,
    /// Workers finishing, at most one per busy worker.
    completions: Few,
    /// The next arrival: there is never more than one.
    arrival: Option<Event>,
    /// The earlier of the next arrival and the earliest deadline, and which it is
    /// ([`ARRIVAL`] or [`DEADLINES`]): the two sources that change about once per operation,
    /// so [`Sim::run`] compares them once when they change instead of on every event.
    slow: (u128, usize),
    /// The earlier of [`World::slow`] and the earliest timer, and which it is ([`TIMERS`] for
    /// a timer): timers change about once per attempt that backs off, so the choice of the next
    /// event compares this one key with the network lane's and the completions'.
    early: (u128, usize),
    /// Events a fixed delay after they were scheduled: [`DEADLINES`], [`NETWORK`].
    lanes: [Lane; 2],
    /// The attempts between send and reply, and the free slots among them.
    works: Vec<Work>,
    free_works: Vec<u32>,
    /// The members by index, one for each of the most members a run has (those past the
    /// cluster's are never sent to), so that a masked member index needs no bounds check.
    servers: Box<[Server; MAX_MEMBERS]>,
    clients: Vec<Client>,
    next_serial: u32,
    arrivals: EngineRng,
    arrivals_end: u64,
    selector: Selector,
    /// Per member index (masked, as [`World::servers`]): what the retry machine reads about the
    /// member, and the overload error it sheds with. The entries past the cluster's members
    /// repeat member 0's and are never read.
    attempt_servers: Box<[AttemptServer; MAX_MEMBERS]>,
    overloaded: Box<[OperationError; MAX_MEMBERS]>,
    result: RunResult,
    service: Service,
    net_ns: u64,
    timeout_ns: u64,
    bucket_ns: u64,
    /// The bucket of the latest [`World::bucket`] call, and where it ends.
    current_bucket: usize,
    bucket_end: u64,
    warmup_ns: u64,
    /// Arrivals per nanosecond at the profile's highest load.
    max_rate: f64,
    /// Its inverse, the mean gap between candidate arrivals in nanoseconds (a multiplication
    /// per arrival instead of a division).
    mean_gap_ns: f64,
    /// An episode's window and acceptance ratios, computed once (`None` for a steady load).
    episode: Option<Episode>,
}

/// A [`Load::Episode`] as the thinning of arrivals reads it, computed once per run: the window
/// in nanoseconds, and the ratio of the peak and of the base load to the highest.
#[derive(Clone, Copy)]
struct Episode {
    start: u64,
    end: u64,
    peak: f64,
    base: f64,
}

impl Episode {
    fn of(load: &Load) -> Option<Episode> {
        match *load {
            Load::Steady(_) => None,
            Load::Episode {
                base,
                peak,
                start,
                length,
            } => Some(Episode {
                start: nanos(start),
                end: nanos(start + length),
                peak: peak / load.max(),
                base: base / load.max(),
            }),
        }
    }

    /// The load at `t` over the highest: the chance that a candidate arrival at `t` is kept.
    #[inline]
    fn accept(&self, t: u64) -> f64 {
        if t >= self.start && t < self.end {
            self.peak
        } else {
            self.base
        }
    }
}

fn address(i: usize) -> ServerAddress {
    ServerAddress::new("member", 27017 + i as u16)
}

fn index(address: &ServerAddress) -> usize {
    usize::from(address.port() - 27017)
}

/// Runs one simulation to the end, or refuses a cluster [`Cluster::validate`] refuses.
pub fn run(cluster: &Cluster, spec: &RunSpec) -> Result<RunResult, String> {
    cluster.validate()?;
    let mut sim = Sim::new(cluster, spec);
    sim.run();
    Ok(sim.finish())
}

impl<'a> World<'a> {
    /// Schedules a timer (a backoff's end, a hedging delay).
    fn schedule(&mut self, time: u64, kind: Kind) {
        self.seq += 1;
        let event = Event {
            time,
            seq: self.seq,
            kind,
        };
        let key = event.key();
        self.timers.push(event, self.now);
        if key < self.early.0 {
            self.early = (key, TIMERS);
        }
    }

    /// [`World::early`] from [`World::slow`] and the timers.
    #[inline]
    fn refresh_early(&mut self) {
        let timer = self.timers.min_key();
        self.early = if timer < self.slow.0 {
            (timer, TIMERS)
        } else {
            self.slow
        };
    }

    /// The time-series bucket of now (`now / bucket`), its counters present. Time only moves
    /// forward, so the bucket is kept and moved on when now passes its end: no division per call.
    #[inline]
    fn bucket(&mut self) -> usize {
        if self.now >= self.bucket_end {
            self.next_bucket();
        }
        self.current_bucket
    }

    /// Moves [`World::bucket`] on to the bucket of now.
    #[cold]
    fn next_bucket(&mut self) {
        let b = (self.now / self.bucket_ns) as usize;
        self.current_bucket = b;
        self.bucket_end = (b as u64 + 1).saturating_mul(self.bucket_ns);
        let r = &mut self.result;
        if r.series_attempts.len() <= b {
            r.series_attempts.resize(b + 1, 0);
            r.series_succeeded.resize(b + 1, 0);
            r.series_failed.resize(b + 1, 0);
            r.series_latency_us.resize(b + 1, 0);
        }
    }

    /// [`Sim::next_arrival`] without [`Sim::refresh_slow`].
    fn draw_arrival(&mut self) {
        let max_rate = self.max_rate;
        if max_rate <= 0.0 {
            return;
        }
        let mut t = self.now;
        loop {
            let gap = self.service.exp.sample(&mut self.arrivals) * self.mean_gap_ns;
            // Review22 R8 (house rule 11): a gap reaching past the arrivals' end ends them
            // before the cast, which would saturate a huge gap (a tiny load: the mean gap can
            // pass 2^64 ns, or be infinite) and overflow `t`. A NaN gap ends them too.
            if gap.is_nan() || gap >= self.arrivals_end.saturating_sub(t) as f64 {
                return;
            }
            t += gap as u64 + 1;
            if t >= self.arrivals_end {
                return;
            }
            // A steady load accepts every candidate (x / x is exactly 1).
            let accept = match self.episode {
                None => 1.0,
                Some(e) => e.accept(t),
            };
            if accept >= 1.0 || unit(&mut self.arrivals) < accept {
                self.seq += 1;
                self.arrival = Some(Event {
                    time: t,
                    seq: self.seq,
                    kind: Kind::Arrival,
                });
                return;
            }
        }
    }

    /// Schedules `kind` a fixed `delay` from now in a first-in first-out lane: every event of a
    /// lane has the same delay, so the lane stays in time order without a heap.
    fn schedule_after(&mut self, lane: usize, delay: u64, kind: Kind) {
        self.seq += 1;
        self.lanes[lane].push(Event {
            time: self.now + delay,
            seq: self.seq,
            kind,
        });
    }

    fn at_server(&mut self, id: u32) {
        let now = self.now;
        let work = &mut self.works[id as usize];
        let server = &mut self.servers[member(usize::from(work.server))];
        let tokens = server.tokens + (now - server.refilled_at) as f64 * server.admit_per_ns;
        // `tokens.min(burst)` without its NaN handling: the burst is at least 1 (never NaN),
        // and a NaN `tokens` gives the burst either way.
        server.tokens = if tokens < server.burst {
            tokens
        } else {
            server.burst
        };
        server.refilled_at = now;
        if server.tokens >= 1.0 {
            server.tokens -= 1.0;
        } else {
            work.shed = true;
            self.result.shed += 1;
        }
        let item = Queued {
            work: id,
            shed: work.shed,
            deadline: work.deadline,
        };
        if server.busy < server.workers {
            server.busy += 1;
            let (cost, outcome) = self.service.begin(server, item, now);
            work.outcome = outcome;
            self.complete_after(cost, id);
        } else {
            server.queue.push_back(item);
        }
    }

    /// Schedules the end of the work a worker has just begun, `cost` from now: the one place a
    /// completion takes its sequence number (review15 finding 3).
    #[inline]
    fn complete_after(&mut self, cost: u64, work: u32) {
        self.seq += 1;
        self.completions.push(Event {
            time: self.now + cost,
            seq: self.seq,
            kind: Kind::Completed(work),
        });
    }

    /// A worker finished: the reply leaves, the worker takes the next item.
    fn completed(&mut self, work: u32) {
        self.schedule_after(NETWORK, self.net_ns, Kind::Reply(work));
        let now = self.now;
        let server = &mut self.servers[member(usize::from(self.works[work as usize].server))];
        match server.queue.pop_front() {
            // The worker goes on with the next item: it stays busy.
            Some(next) => {
                let (cost, outcome) = self.service.begin(server, next, now);
                self.works[next.work as usize].outcome = outcome;
                self.complete_after(cost, next.work);
            }
            None => server.busy -= 1,
        }
    }

    /// An attempt of operation `id` (its slot `op`) leaves for member `server`.
    #[inline]
    fn send(&mut self, op: &mut Op, id: u32, server: u8, copy: u8) {
        debug_assert_ne!(op.serial, 0, "a live operation's slot");
        op.gen += 1;
        op.attempts += 1;
        let work = Work {
            op: id,
            serial: op.serial,
            gen: op.gen,
            copy,
            shed: false,
            server,
            outcome: Outcome::Ok,
            deadline: op.start + self.timeout_ns,
        };
        self.clients[op.client as usize].in_flight[member(usize::from(server))] += 1;
        self.result.total_attempts += 1;
        if op.measured {
            self.result.attempts += 1;
        }
        let b = self.bucket();
        self.result.series_attempts[b] += 1;
        let work = match self.free_works.pop() {
            Some(slot) => {
                self.works[slot as usize] = work;
                slot
            }
            None => {
                self.works.push(work);
                (self.works.len() - 1) as u32
            }
        };
        self.schedule_after(NETWORK, self.net_ns, Kind::AtServer(work));
    }

    /// Operation `op` ends now; its slot is free once the caller has put it back.
    fn end(&mut self, op: &mut Op, ok: bool) {
        debug_assert_ne!(op.serial, 0, "a live operation's slot");
        op.serial = 0;
        let latency_us = ((self.now - op.start) / 1000) as u32;
        let most = &mut self.result.max_attempts_per_operation;
        *most = (*most).max(op.attempts);
        if op.measured {
            self.result.operations += 1;
            self.result.latencies_us.push(latency_us);
            if ok {
                self.result.succeeded += 1;
            }
        }
        let b = self.bucket();
        if ok {
            self.result.series_succeeded[b] += 1;
        } else {
            self.result.series_failed[b] += 1;
        }
        self.result.series_latency_us[b] += u64::from(latency_us);
    }

    fn released(&mut self, client: u32, server: u8) {
        let n = &mut self.clients[client as usize].in_flight[member(usize::from(server))];
        *n = n.saturating_sub(1);
    }
}

impl<'a> Sim<'a> {
    fn new(cluster: &'a Cluster, spec: &'a RunSpec) -> Sim<'a> {
        let servers = cluster.servers;
        let descriptions: Vec<ServerDescription> = (0..servers)
            .map(|i| ServerDescription {
                server_type: if i == 0 {
                    ServerType::RsPrimary
                } else {
                    ServerType::RsSecondary
                },
                average_rtt: AverageRtt::from_duration(cluster.network * 2),
                max_wire_version: 25,
                logical_session_timeout: Some(Duration::from_secs(1800)),
                ..ServerDescription::unknown(address(i))
            })
            .collect();
        let topology = TopologyDescription::new(TopologyType::ReplicaSetWithPrimary, descriptions);
        let attempt_servers: Vec<AttemptServer> = topology
            .servers
            .iter()
            .map(|s| AttemptServer::from_description(s, TopologyType::ReplicaSetWithPrimary))
            .collect();
        let load_seed = spec.seed ^ (spec.load.max().to_bits().rotate_left(17));
        // One shed reply, shared by every member's error (each with its member's address): a
        // retry machine that keeps one member's error and then gets another's copies only the
        // address, not a reference count.
        let reply = doc! { "ok": 0, "code": OVERLOAD_CODE,
        "errorLabels": ["SystemOverloadedError", "RetryableError"] };
        let mut shed = OperationError::from_reply(&reply, &address(0)).expect("an error");
        if let ErrorKind::Server(s) = &mut shed.kind {
            std::sync::Arc::make_mut(s).raw = bson::Document::new();
        }
        let overloaded = (0..servers)
            .map(|i| {
                let mut e = shed.clone();
                e.address = Some(address(i));
                e
            })
            .collect::<Vec<_>>();
        // `Cluster::validate` (checked by `run`) ensures 1 to MAX_MEMBERS members.
        let per_member = |i: usize| if i < servers { i } else { 0 };
        let attempt_servers = Box::new(std::array::from_fn(|i| {
            attempt_servers[per_member(i)].clone()
        }));
        let overloaded = Box::new(std::array::from_fn(|i| overloaded[per_member(i)].clone()));
        let mut policy_seed = EngineRng::from_seed_u64(spec.seed.wrapping_mul(0x9E37_79B9));
        let clients = (0..cluster.clients.max(1))
            .map(|_| Client {
                budget: ClientBudget::new(spec.policy, &cluster.grpc),
                rng: EngineRng::from_seed_u64(policy_seed.next_u64()),
                in_flight: [0; MAX_MEMBERS],
            })
            .collect();
        let w = World {
            cluster,
            spec,
            now: 0,
            seq: 0,
            timers: Timers::new(),
            completions: Few::new(),
            arrival: None,
            slow: (NONE, ARRIVAL),
            early: (NONE, ARRIVAL),
            // Room for the deadlines of a timeout's worth of operations at the highest rate (at
            // most 2 MiB), and for a burst of sends and replies: growing a lane copies it.
            lanes: [
                Lane::with_capacity(
                    latency_reserve(
                        spec.load.max() * cluster.capacity() * cluster.timeout.as_secs_f64(),
                    )
                    .min(1 << 16),
                ),
                Lane::with_capacity(4096),
            ],
            works: Vec::new(),
            free_works: Vec::new(),
            servers: Box::new(std::array::from_fn(|i| {
                let workers = cluster.workers_of(i);
                let admit_per_s = f64::from(workers) / cluster.mean_service().as_secs_f64()
                    * cluster.admit_fraction;
                Server {
                    workers,
                    admit_per_ns: admit_per_s / 1e9,
                    burst: (admit_per_s * cluster.burst.as_secs_f64()).max(1.0),
                    busy: 0,
                    queue: VecDeque::new(),
                    tokens: 1.0,
                    refilled_at: 0,
                    rng: EngineRng::from_seed_u64(load_seed ^ ((i as u64 + 1) * 0x5851_F42D)),
                }
            })),
            clients,
            next_serial: 0,
            arrivals: EngineRng::from_seed_u64(load_seed),
            arrivals_end: nanos(spec.duration),
            selector: Selector {
                selection: RepeatedSelection::new(
                    topology,
                    SelectionCriteria::Read(
                        ReadPreference::new(ReadPreferenceMode::Nearest, Vec::new(), None)
                            .expect("nearest without tags is valid"),
                    ),
                    SelectionSettings::default(),
                ),
            },
            attempt_servers,
            overloaded,
            result: RunResult {
                // The measured operations' latencies, one per operation arriving after the
                // warmup: reserved for the highest rate, so that pushing them copies nothing.
                latencies_us: Vec::with_capacity(latency_reserve(
                    spec.load.max()
                        * cluster.capacity()
                        * spec.duration.saturating_sub(spec.warmup).as_secs_f64(),
                )),
                ..RunResult::default()
            },
            service: Service {
                exp: Exponential::new(),
                shed_ns: nanos(cluster.shed_cost),
                service_ns: nanos(cluster.service_mean) as f64,
                straggler_fraction: cluster.straggler_fraction,
                straggler_factor: cluster.straggler_factor,
            },
            net_ns: nanos(cluster.network),
            timeout_ns: nanos(cluster.timeout),
            bucket_ns: nanos(spec.bucket).max(1),
            current_bucket: 0,
            bucket_end: 0,
            warmup_ns: nanos(spec.warmup),
            max_rate: spec.load.max() * cluster.capacity() / 1e9,
            mean_gap_ns: 1e9 / (spec.load.max() * cluster.capacity()),
            episode: Episode::of(&spec.load),
        };
        Sim {
            // Room for a timeout's worth of operations at the highest rate (the most that can be
            // in flight at once, give or take the arrivals' spread; at most 64 Ki slots): growing
            // the slots copies them, and a slot holds its machine.
            slots: Vec::with_capacity(
                latency_reserve(
                    spec.load.max() * cluster.capacity() * cluster.timeout.as_secs_f64(),
                )
                .min(1 << 16),
            ),
            free: Vec::new(),
            w,
        }
    }

    /// Poisson arrivals at the current rate, by thinning against the profile's highest rate.
    fn next_arrival(&mut self) {
        self.w.draw_arrival();
        self.refresh_slow();
    }

    /// [`World::slow`] from the arrival and the deadline lane, after dropping the deadlines of
    /// operations that have ended from the lane's front (most end long before their deadline;
    /// [`Sim::run`] drops one that ends after this).
    #[inline]
    fn refresh_slow(&mut self) {
        let lane = &mut self.w.lanes[DEADLINES];
        while let Some(Kind::Deadline { op, serial }) = lane.front().map(|e| e.kind) {
            if self
                .slots
                .get(op as usize)
                .is_some_and(|s| s.op.serial == serial)
            {
                break;
            }
            lane.pop();
        }
        let arrival = self.w.arrival.as_ref().map_or(NONE, Event::key);
        let deadline = lane.min_key();
        self.w.slow = if deadline < arrival {
            (deadline, DEADLINES)
        } else {
            (arrival, ARRIVAL)
        };
        self.w.refresh_early();
    }

    /// Runs every event in (time, sequence) order, the same order as one queue of every event:
    /// each turn takes the earliest of the sources (the arrival and the deadlines, the network
    /// lane, the timers, the completions) and dispatches it by its source, whose kinds of event
    /// are known, so that no `Option<Event>` is passed on and the common kinds are matched
    /// among two at most.
    ///
    /// The deadline of an operation that has already ended is dropped where it is taken: it
    /// would change nothing (no later event reads the clock before setting it), and most
    /// operations end before their deadline.
    fn run(&mut self) {
        self.next_arrival();
        loop {
            // Keys are unique (the sequence number), so the order of the comparisons cannot
            // matter.
            let (mut best, mut source) = self.w.early;
            let key = self.w.lanes[NETWORK].min_key();
            if key < best {
                (best, source) = (key, NETWORK);
            }
            let key = self.w.completions.min_key();
            if key < best {
                (best, source) = (key, COMPLETIONS);
            }
            if best == NONE {
                return;
            }
            match source {
                NETWORK => {
                    let Some(event) = self.w.lanes[NETWORK].pop() else {
                        return;
                    };
                    self.w.now = event.time;
                    match event.kind {
                        Kind::AtServer(work) => self.w.at_server(work),
                        Kind::Reply(work) => self.reply(work),
                        kind => self.misplaced(kind),
                    }
                }
                COMPLETIONS => {
                    let Some(event) = self.w.completions.pop() else {
                        return;
                    };
                    self.w.now = event.time;
                    match event.kind {
                        Kind::Completed(work) => self.w.completed(work),
                        kind => self.misplaced(kind),
                    }
                }
                TIMERS => {
                    let event = self.w.timers.pop();
                    self.w.refresh_early();
                    let Some(event) = event else {
                        return;
                    };
                    self.w.now = event.time;
                    match event.kind {
                        Kind::Timer { op, serial, gen } => self.timer(op, serial, gen),
                        kind => self.misplaced(kind),
                    }
                }
                ARRIVAL => {
                    let Some(event) = self.w.arrival.take() else {
                        return;
                    };
                    self.w.now = event.time;
                    self.start_operation();
                    // Also refreshes `slow` for the deadline just scheduled.
                    self.next_arrival();
                }
                _ => {
                    let event = self.w.lanes[DEADLINES].pop();
                    self.refresh_slow();
                    let Some(event) = event else {
                        return;
                    };
                    match event.kind {
                        Kind::Deadline { op, serial } => {
                            if self
                                .slots
                                .get(op as usize)
                                .is_some_and(|s| s.op.serial == serial)
                            {
                                self.w.now = event.time;
                                self.deadline(op, serial);
                            }
                        }
                        kind => self.misplaced(kind),
                    }
                }
            }
        }
    }

    /// An event found in a source that does not hold its kind: a simulator bug, counted with
    /// the refused inputs so that the run fails (house rule 8).
    #[cold]
    #[inline(never)]
    fn misplaced(&mut self, kind: Kind) {
        debug_assert!(false, "an event in the wrong source: {kind:?}");
        self.w.result.refused += 1;
    }

    fn finish(mut self) -> RunResult {
        sort_u32(&mut self.w.result.latencies_us);
        self.w.result
    }

    // ---- servers ----

    // ---- operations ----

    fn start_operation(&mut self) {
        let now = self.w.now;
        // The client, uniform over them: the high half of a 64 × 64-bit product (a
        // multiplication, not a 64-bit division; the same bias, under 2^-58, as a remainder).
        let client =
            ((u128::from(self.w.arrivals.next_u64()) * self.w.clients.len() as u128) >> 64) as u32;
        // Serial 0 marks an ended operation's slot.
        self.w.next_serial = self.w.next_serial.wrapping_add(1).max(1);
        let serial = self.w.next_serial;
        let timeout =
            OperationTimeout::from_timeout_ms(Instant::from_nanos(now), self.w.cluster.timeout);
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.slots.push(Slot {
                    op: Op::empty(),
                    machine: Machine::Simple(Simple::default()),
                });
                (self.slots.len() - 1) as u32
            }
        };
        let Slot { op, machine } = &mut self.slots[id as usize];
        let c = &mut self.w.clients[client as usize];
        let start = Instant::from_nanos(now);
        // A finished operation's machine is restarted in place in its slot: nothing is
        // allocated, built or moved.
        match (&c.budget, machine) {
            (ClientBudget::Machine(options), machine) => {
                let spec = OperationSpec::new(OperationKind::Read).with_timeout(timeout);
                let seed = c.rng.next_u64();
                match machine {
                    Machine::Retry(m) => m.restart(spec, options, seed, start),
                    // Nothing here publishes monitoring events; the decisions are the same.
                    other => {
                        *other = Machine::Retry(
                            RetryMachine::new(spec, options, seed, start).without_events(),
                        )
                    }
                }
            }
            (ClientBudget::Hedging(policy), machine) => match machine {
                Machine::Hedge(m) => m
                    .restart(OperationKind::Read, timeout, policy, start)
                    .expect("reads are hedgeable"),
                other => {
                    *other = Machine::Hedge(
                        HedgingMachine::new(OperationKind::Read, timeout, policy, start)
                            .expect("reads are hedgeable")
                            .without_events(),
                    )
                }
            },
            (_, machine) => *machine = Machine::Simple(Simple::default()),
        }
        op.client = client;
        op.serial = serial;
        op.start = now;
        op.gen = 0;
        op.measured = now >= self.w.warmup_ns;
        op.attempts = 0;
        op.servers.clear();
        op.server = 0;
        op.timer_at = u64::MAX;
        let simple = matches!(self.slots[id as usize].machine, Machine::Simple(_));
        self.w.schedule_after(
            DEADLINES,
            self.w.timeout_ns,
            Kind::Deadline { op: id, serial },
        );
        if simple {
            self.simple_attempt(id, None);
        } else {
            self.pump(id);
        }
    }

    /// Ends operation `id` (a baseline's, or one whose machine is not in hand).
    fn end(&mut self, id: u32, ok: bool) {
        self.w.end(&mut self.slots[id as usize].op, ok);
        self.free.push(id);
    }

    /// Drains a core machine's actions: selection, sends, releases, timers, the result.
    fn pump(&mut self, id: u32) {
        let Slot { op, machine } = &mut self.slots[id as usize];
        match machine {
            Machine::Retry(m) => drive_retry(&mut self.w, &mut self.free, op, m, id),
            Machine::Hedge(m) => drive_hedge(&mut self.w, &mut self.free, op, m, id),
            Machine::Simple(_) => {}
        }
    }

    fn reply(&mut self, slot: u32) {
        let w = &mut self.w;
        let work = w.works[slot as usize];
        w.free_works.push(slot);
        let outcome = work.outcome;
        let at = Instant::from_nanos(w.now);
        let id = work.op;
        let Some(Slot { op, machine }) = self
            .slots
            .get_mut(id as usize)
            .filter(|s| s.op.serial == work.serial)
        else {
            return;
        };
        match machine {
            Machine::Retry(m) => {
                if op.gen != work.gen {
                    return;
                }
                let accepted = match outcome {
                    Outcome::Ok => m.handle_succeeded(at),
                    // The shed error of the server the attempt went to, shared by every
                    // operation: the machine copies it only to keep it (not when it already
                    // keeps that server's), and the simulator copies nothing.
                    Outcome::Overloaded | Outcome::Expired => {
                        m.handle_failed_ref(&w.overloaded[member(usize::from(work.server))], at)
                    }
                };
                // House rule 8 (review8 finding 10, review9 finding 8): the `gen` / `serial`
                // guards above let only replies the machine expects through; a refused one is a
                // simulator bug, counted in every build.
                w.result.refused += u64::from(accepted.is_err());
                drive_retry(w, &mut self.free, op, m, id);
            }
            Machine::Hedge(m) => {
                let copy = CopyId(u32::from(work.copy));
                let accepted = match outcome {
                    Outcome::Ok => m.handle_succeeded(copy, at),
                    Outcome::Overloaded | Outcome::Expired => m.handle_failed(
                        copy,
                        w.overloaded[member(usize::from(work.server))].clone(),
                        at,
                    ),
                };
                w.result.refused += u64::from(accepted.is_err());
                drive_hedge(w, &mut self.free, op, m, id);
            }
            Machine::Simple(s) => {
                if op.gen != work.gen {
                    return;
                }
                let server = s.server;
                let client = op.client;
                s.in_flight = false;
                w.released(client, server);
                if outcome == Outcome::Ok {
                    self.simple_succeeded(id);
                } else {
                    self.simple_attempt(id, Some((server, outcome == Outcome::Overloaded)));
                }
            }
        }
    }

    fn timer(&mut self, id: u32, serial: u32, gen: u32) {
        let now = self.w.now;
        let Some(Slot { op, machine }) = self
            .slots
            .get_mut(id as usize)
            .filter(|s| s.op.serial == serial)
        else {
            return;
        };
        match machine {
            Machine::Retry(m) => {
                if op.gen == gen {
                    m.handle_timeout(Instant::from_nanos(now));
                    drive_retry(&mut self.w, &mut self.free, op, m, id);
                }
            }
            Machine::Hedge(m) => {
                if op.timer_at == now {
                    op.timer_at = u64::MAX;
                    m.handle_timeout(Instant::from_nanos(now));
                    drive_hedge(&mut self.w, &mut self.free, op, m, id);
                }
            }
            Machine::Simple(_) => {
                if op.gen == gen {
                    self.simple_send(id);
                }
            }
        }
    }

    /// The operation's deadline: an attempt still in flight fails with a socket timeout.
    fn deadline(&mut self, id: u32, serial: u32) {
        let at = Instant::from_nanos(self.w.now);
        let Some(Slot { op, machine }) = self
            .slots
            .get_mut(id as usize)
            .filter(|s| s.op.serial == serial)
        else {
            return;
        };
        match machine {
            Machine::Retry(m) => {
                let e = OperationError::network(
                    NetworkErrorKind::Timeout,
                    NetworkPhase::AfterSend,
                    address(usize::from(op.server)),
                );
                if m.handle_failed(e, at).is_err() {
                    // Not in flight (backing off): the deadline still ends it.
                    let cancelled = m.cancel(at);
                    self.w.result.refused += u64::from(cancelled.is_err());
                }
                drive_retry(&mut self.w, &mut self.free, op, m, id);
            }
            Machine::Hedge(m) => {
                m.handle_timeout(at);
                drive_hedge(&mut self.w, &mut self.free, op, m, id);
            }
            Machine::Simple(s) => {
                let (client, server) = (op.client, s.server);
                if s.in_flight {
                    self.w.released(client, server);
                }
                self.end(id, false);
            }
        }
    }

    // ---- the baselines: naive, AWS standard, SRE adaptive ----

    /// Starts the first attempt (`failed` = None) or decides on a retry after a failure on
    /// server `failed.0`; `failed.1` says whether it was a throttling (overload) error.
    fn simple_attempt(&mut self, id: u32, failed: Option<(u8, bool)>) {
        let now = self.w.now;
        let policy = self.w.spec.policy;
        let Slot { op, machine } = &mut self.slots[id as usize];
        debug_assert_ne!(op.serial, 0, "a live operation's slot");
        let Machine::Simple(s) = machine else {
            return;
        };
        let client = &mut self.w.clients[op.client as usize];
        if failed.is_some() {
            let allowed = match policy {
                SimPolicy::Naive(n) => s.attempts <= n,
                SimPolicy::AwsStandard => {
                    let ClientBudget::Aws { tokens } = &mut client.budget else {
                        return;
                    };
                    // The shed 462 is a throttling error; anything else is transient.
                    let throttling = failed.is_some_and(|f| f.1);
                    let (cost, base) = if throttling {
                        (AWS_THROTTLING_COST, AWS_THROTTLING_BASE)
                    } else {
                        (AWS_TRANSIENT_COST, AWS_TRANSIENT_BASE)
                    };
                    let bound = base
                        .saturating_mul(1u32 << (s.attempts - 1).min(20))
                        .min(AWS_MAX_BACKOFF);
                    let delay = nanos(bound.mul_f64(unit(&mut client.rng)));
                    if s.attempts >= AWS_MAX_ATTEMPTS
                        || now + delay >= op.start + self.w.timeout_ns
                        || *tokens < cost
                    {
                        false
                    } else {
                        *tokens -= cost;
                        s.holding = cost;
                        op.gen += 1;
                        let (serial, gen) = (op.serial, op.gen);
                        self.w.schedule(
                            now + delay,
                            Kind::Timer {
                                op: id,
                                serial,
                                gen,
                            },
                        );
                        return;
                    }
                }
                SimPolicy::SreAdaptive => {
                    if s.attempts >= SRE_MAX_ATTEMPTS {
                        false
                    } else {
                        let bound =
                            SRE_BACKOFF_BASE.saturating_mul(1u32 << (s.attempts - 1).min(20));
                        let delay = nanos(bound.mul_f64(unit(&mut client.rng)));
                        if now + delay >= op.start + self.w.timeout_ns {
                            false
                        } else {
                            op.gen += 1;
                            let (serial, gen) = (op.serial, op.gen);
                            self.w.schedule(
                                now + delay,
                                Kind::Timer {
                                    op: id,
                                    serial,
                                    gen,
                                },
                            );
                            return;
                        }
                    }
                }
                _ => false,
            };
            if !allowed {
                self.end(id, false);
                return;
            }
        }
        self.simple_send(id);
    }

    fn simple_send(&mut self, id: u32) {
        let now = self.w.now;
        let policy = self.w.spec.policy;
        // The slot, its machine and its client looked up once.
        let Slot { op, machine } = &mut self.slots[id as usize];
        debug_assert_ne!(op.serial, 0, "a live operation's slot");
        let Machine::Simple(s) = machine else {
            return;
        };
        let c = &mut self.w.clients[op.client as usize];
        if policy == SimPolicy::SreAdaptive && !c.budget.sre_admit(now, &mut c.rng) {
            // Rejected locally: the operation fails without reaching a server.
            self.w.end(op, false);
            self.free.push(id);
            return;
        }
        let deprioritized = if s.attempts > 0 { 1u64 << s.server } else { 0 };
        let server = self.w.selector.pick(c, deprioritized);
        s.attempts += 1;
        s.server = server;
        s.in_flight = true;
        self.w.send(op, id, server, 0);
    }

    fn simple_succeeded(&mut self, id: u32) {
        let now = self.w.now;
        let Slot { op, machine } = &mut self.slots[id as usize];
        debug_assert_ne!(op.serial, 0, "a live operation's slot");
        let c = &mut self.w.clients[op.client as usize];
        if let Machine::Simple(s) = machine {
            match &mut c.budget {
                ClientBudget::Aws { tokens } => {
                    // A retry's success refunds its cost; a first-try success adds 1.
                    let credit = if s.holding > 0 { s.holding } else { 1 };
                    *tokens = (*tokens + credit).min(AWS_QUOTA);
                }
                ClientBudget::Sre { .. } => c.budget.sre_accepted(now),
                _ => {}
            }
        }
        self.end(id, true);
    }
}

/// Drains the actions of a live operation run by a [`RetryMachine`] (operation `id`, its slot
/// `op`), with the machine in hand: selection, sends, releases, timers, the result. A function of
/// its own, so that draining it sets up nothing the hedging machine's actions need.
fn drive_retry(w: &mut World, free: &mut Vec<u32>, op: &mut Op, m: &mut RetryMachine, id: u32) {
    debug_assert_ne!(op.serial, 0, "a live operation's slot");
    let now = Instant::from_nanos(w.now);
    while let Some(action) = m.poll_action() {
        match action {
            retry::Action::SelectServer => {
                let c = &mut w.clients[op.client as usize];
                let s = w.selector.pick(c, member_set(m.deprioritized()));
                let server = w.attempt_servers[member(usize::from(s))].clone();
                let accepted = m.handle_server_selected(server, now);
                w.result.refused += u64::from(accepted.is_err());
            }
            retry::Action::Dispatch(attempt) => {
                let accepted = m.handle_sent(now);
                w.result.refused += u64::from(accepted.is_err());
                let s = index(&attempt.address) as u8;
                op.server = s;
                w.send(op, id, s, 0);
            }
            retry::Action::ReleaseConnection { .. } => w.released(op.client, op.server),
            retry::Action::Wait { until } => {
                let (serial, gen) = (op.serial, op.gen);
                w.schedule(
                    until.as_nanos(),
                    Kind::Timer {
                        op: id,
                        serial,
                        gen,
                    },
                );
            }
            retry::Action::Finished(result) => {
                w.end(op, result.is_ok());
                free.push(id);
                return;
            }
        }
    }
}

/// [`drive_retry`] for an operation run by a [`HedgingMachine`].
fn drive_hedge(w: &mut World, free: &mut Vec<u32>, op: &mut Op, m: &mut HedgingMachine, id: u32) {
    debug_assert_ne!(op.serial, 0, "a live operation's slot");
    let now = Instant::from_nanos(w.now);
    loop {
        let Some(action) = m.poll_action() else {
            if let Some(at) = m.poll_timeout() {
                let at = at.as_nanos();
                // A wake-up at the deadline is the deadline event's: that event was
                // scheduled first, so it runs first and ends the operation.
                if at != op.timer_at && at < op.start + w.timeout_ns {
                    op.timer_at = at;
                    let (serial, gen) = (op.serial, 0);
                    w.schedule(
                        at,
                        Kind::Timer {
                            op: id,
                            serial,
                            gen,
                        },
                    );
                }
            }
            return;
        };
        match action {
            hedging::Action::SelectServer(copy) => {
                let c = &mut w.clients[op.client as usize];
                let s = w.selector.pick(c, member_set(m.deprioritized()));
                let address = w.attempt_servers[member(usize::from(s))].address.clone();
                let accepted = m.handle_server_selected(copy, address, now);
                w.result.refused += u64::from(accepted.is_err());
            }
            hedging::Action::Dispatch { copy, address } => {
                let accepted = m.handle_sent(copy, now);
                w.result.refused += u64::from(accepted.is_err());
                let s = index(&address) as u8;
                let slot = copy.0 as usize - 1;
                if slot == op.servers.len() {
                    op.servers.push(s);
                } else {
                    if op.servers.len() < slot {
                        op.servers.resize(slot + 1, 0);
                    }
                    op.servers[slot] = s;
                }
                w.send(op, id, s, copy.0 as u8);
            }
            hedging::Action::Release { copy, .. } => {
                let s = op.servers[copy.0 as usize - 1];
                w.released(op.client, s);
            }
            hedging::Action::Cancel { copy, stage } => {
                // The connection stays busy until the reply; the server still works.
                if !matches!(stage, CopyStage::Selecting) {
                    let s = op.servers[copy.0 as usize - 1];
                    w.released(op.client, s);
                }
            }
            hedging::Action::Finished(result) => {
                w.end(op, result.is_ok());
                free.push(id);
                return;
            }
        }
    }
}

/// Room for the measured operations' latencies, from the expected count at the highest offered
/// rate (+10 %): pushing them then copies nothing. Capped (the vector grows past the cap), so a
/// huge or non-finite estimate (a tiny service time, a long run) reserves a bounded amount
/// instead of failing with a capacity overflow (house rule 11).
fn latency_reserve(expected: f64) -> usize {
    const CAP: f64 = (1u64 << 24) as f64;
    let wanted = expected * 1.1;
    // Negative estimates reserve the minimum; NaN and infinite ones the cap (review11 finding 5).
    (if wanted.is_finite() {
        wanted.clamp(0.0, CAP)
    } else {
        CAP
    }) as usize
        + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// House rule 8, review9 finding 8: a reply the retry machine does not expect, let through
    /// as a broken `serial` / `gen` guard would (a failed attempt's reply delivered a second time
    /// while the operation backs off), is refused by the machine and counted, in release builds
    /// as in debug ones (`cargo test --release -p retry-lab` runs this too).
    #[test]
    fn review9_f8_a_refused_reply_is_counted_in_every_build() {
        let cluster = Cluster::default();
        let spec = RunSpec {
            policy: SimPolicy::Current,
            load: Load::Steady(0.5),
            duration: Duration::from_millis(100),
            warmup: Duration::ZERO,
            bucket: Duration::from_millis(10),
            seed: 1,
        };
        let mut sim = Sim::new(&cluster, &spec);
        sim.start_operation();
        assert_eq!(sim.w.works.len(), 1, "the first attempt is on its way");
        sim.w.works[0].outcome = Outcome::Overloaded;
        let work = sim.w.works[0];
        sim.reply(0);
        assert_eq!(sim.w.result.refused, 0, "the first reply is expected");
        assert_eq!(
            sim.slots[work.op as usize].op.serial, work.serial,
            "it backs off to retry"
        );
        sim.w.works.push(work);
        sim.reply(1);
        assert_eq!(sim.w.result.refused, 1, "the second is refused and counted");
    }

    /// Review22 R8 (house rule 11): a steady load so small that the mean gap between arrivals
    /// passes 2^64 ns (1e-15 of the capacity), or is infinite (the smallest positive load),
    /// ends with no arrival at all, bounded by the run's length: no overflow of the arrival
    /// time (a panic in a debug build, arrivals repeated at one instant forever in a release
    /// one).
    #[test]
    fn review22_r8_a_tiny_load_gets_no_arrival_and_ends() {
        let cluster = Cluster::default();
        for load in [1e-15, f64::MIN_POSITIVE] {
            let spec = RunSpec {
                policy: SimPolicy::Current,
                load: Load::Steady(load),
                duration: Duration::from_secs(2),
                warmup: Duration::ZERO,
                bucket: Duration::from_millis(250),
                seed: 1,
            };
            let result = run(&cluster, &spec).expect("a valid cluster");
            assert_eq!(result.operations, 0, "load {load}: {result:?}");
            assert_eq!(result.total_attempts, 0, "load {load}: {result:?}");
        }
    }

    /// House rule 11: the latency reserve is bounded whatever the estimate (review10 finding 7).
    #[test]
    fn a_huge_or_non_finite_rate_estimate_reserves_a_bounded_amount() {
        assert_eq!(latency_reserve(100.0), 126);
        assert_eq!(latency_reserve(1e30), (1 << 24) + 16);
        assert_eq!(latency_reserve(f64::INFINITY), (1 << 24) + 16);
        assert_eq!(latency_reserve(f64::NAN), (1 << 24) + 16);
        assert_eq!(latency_reserve(-5.0), 16);
    }
}
