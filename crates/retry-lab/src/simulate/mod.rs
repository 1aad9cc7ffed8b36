//! `retry-lab simulate`: a deterministic discrete-event simulation of many clients and several
//! servers under overload, comparing retry policies side by side.
//!
//! Each client runs retry-core's decision code for every operation: the retry machine, server
//! selection with deprioritization, the budgets and throttles, hedging ([`policy`] lists what runs
//! where). Each server has workers, a queue and an ingress limiter that sheds with code 462 and the
//! labels `SystemOverloadedError` and `RetryableError` ([`model`]). Time is virtual; the same seed
//! gives byte-identical output. Two scenarios run for every policy: a steady load from 0.5× to 5×
//! the cluster's capacity, and an overload episode (the load steps up for a while, then back) that
//! measures recovery. [`output`] writes the CSV files and SVG charts; [`summary`] makes the table
//! printed at the end.

mod events;
mod exponential;
pub mod model;
pub mod output;
pub mod policy;
mod sort;
pub mod summary;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use clap::Args;

use model::{Cluster, Load, RunResult, RunSpec};
use policy::{GrpcConfigs, SimPolicy};

/// The options of `retry-lab simulate`.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct SimulateArgs {
    /// The seed of arrivals, service times and every client's random choices.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The directory for the CSV files and SVG charts (created if missing).
    #[arg(long, default_value = "simulation")]
    pub out: PathBuf,
    /// Replica-set members.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub servers: u32,
    /// Clients, each with its own budgets.
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub clients: u32,
    /// Seconds of arrivals per steady-load run.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..=3600))]
    pub seconds: u32,
    /// The steady loads, as multiples of the cluster's capacity.
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_LOADS.to_vec())]
    pub loads: Vec<f64>,
    /// The episode's load, as a multiple of capacity (before and after it: 0.7).
    #[arg(long, default_value_t = 3.0)]
    pub peak: f64,
    /// How long the episode lasts, in seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub episode_seconds: u32,
    /// A JSON service config (gRPC A6) with a retryPolicy or hedgingPolicy for `find`; it replaces
    /// the built-in config of `grpc-retry` or `grpc-hedging` accordingly.
    #[arg(long, value_name = "FILE")]
    pub service_config: Option<PathBuf>,
    /// Immediate retries of the naive policy.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub naive_retries: u32,
}

/// The default steady loads.
pub const DEFAULT_LOADS: [f64; 10] = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0];
/// The load before and after the episode.
pub const EPISODE_BASE: f64 = 0.7;
/// The time-series bucket of the episode.
pub const BUCKET: Duration = Duration::from_millis(250);
/// The window over which recovery is judged.
pub const RECOVERY_WINDOW: Duration = Duration::from_secs(1);

impl SimulateArgs {
    /// Checks the values clap cannot: loads and peak positive and finite, and (for arguments
    /// built without clap) 1 to [`MAX_MEMBERS`](model::MAX_MEMBERS) members, the most the model keeps apart
    /// (review15 finding 7: past it, deprioritization would be lost without a word).
    pub fn validate(&self) -> Result<(), String> {
        let members = usize::try_from(self.servers).unwrap_or(usize::MAX);
        model::check_members(members)
            .map_err(|e| format!("invalid --servers {}: {e}", self.servers))?;
        for &load in self.loads.iter().chain([&self.peak]) {
            if !(load.is_finite() && load > 0.0 && load <= 100.0) {
                return Err(format!(
                    "invalid load {load}: loads must be numbers above 0 and at most 100"
                ));
            }
        }
        if self.loads.is_empty() {
            return Err("--loads needs at least one load".into());
        }
        Ok(())
    }

    /// The policies compared.
    pub fn policies(&self) -> Vec<SimPolicy> {
        SimPolicy::ALL
            .iter()
            .map(|&p| match p {
                SimPolicy::Naive(_) => SimPolicy::Naive(self.naive_retries),
                p => p,
            })
            .collect()
    }

    /// The simulated cluster, with the user's service config if one was given.
    pub fn cluster(&self) -> Result<Cluster, String> {
        let grpc = match &self.service_config {
            None => GrpcConfigs::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                GrpcConfigs::with_user_config(&text)
                    .map_err(|e| format!("{}: {e}", path.display()))?
            }
        };
        Ok(Cluster {
            servers: self.servers as usize,
            clients: self.clients as usize,
            grpc,
            ..Cluster::default()
        })
    }
}

/// One steady-load result row.
#[derive(Clone, Debug, PartialEq)]
pub struct SteadyRow {
    /// The policy.
    pub policy: SimPolicy,
    /// Offered load as a multiple of capacity.
    pub load: f64,
    /// Offered operations per second.
    pub offered: f64,
    /// Successful operations per second.
    pub goodput: f64,
    /// Attempts sent per operation.
    pub amplification: f64,
    /// Failed operations per operation.
    pub failure_rate: f64,
    /// Latency percentiles in milliseconds (p50, p99, p99.9), failures included.
    pub latency_ms: [f64; 3],
    /// Requests shed per second.
    pub shed_per_s: f64,
}

/// One policy's episode.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeRow {
    /// The policy.
    pub policy: SimPolicy,
    /// Seconds from the episode's end to the start of the first one-second window in which the
    /// failure rate is at most 2 points above the pre-episode rate and the mean latency at most
    /// twice the pre-episode mean;
    /// `None` when it never is before the run ends.
    pub time_to_recover: Option<f64>,
    /// Per bucket: (start in seconds, offered load, goodput, attempts per second, failure rate).
    pub series: Vec<(f64, f64, f64, f64, f64)>,
}

/// Everything one `simulate` run produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// The cluster simulated.
    pub cluster: Cluster,
    /// The steady-load rows, by policy then load.
    pub steady: Vec<SteadyRow>,
    /// The episode rows, by policy.
    pub episode: Vec<EpisodeRow>,
    /// The episode's load profile.
    pub episode_load: Load,
    /// Attempts simulated in all runs.
    pub total_attempts: u64,
}

/// Runs every policy under every load and the episode. Runs are independent and deterministic,
/// so they are spread over the machine's cores and collected in order.
pub fn simulate(args: &SimulateArgs) -> Result<Report, String> {
    args.validate()?;
    let cluster = args.cluster()?;
    let policies = args.policies();
    let warmup = Duration::from_secs(1);
    let episode_load = Load::Episode {
        base: EPISODE_BASE,
        peak: args.peak,
        start: Duration::from_secs(5),
        length: Duration::from_secs(u64::from(args.episode_seconds)),
    };
    let episode_duration = Duration::from_secs(5 + u64::from(args.episode_seconds) + 15);
    let mut specs = Vec::new();
    for &policy in &policies {
        for &load in &args.loads {
            specs.push(RunSpec {
                policy,
                load: Load::Steady(load),
                duration: Duration::from_secs(u64::from(args.seconds)),
                warmup,
                bucket: BUCKET,
                seed: args.seed,
            });
        }
        specs.push(RunSpec {
            policy,
            load: episode_load,
            duration: episode_duration,
            warmup,
            bucket: BUCKET,
            seed: args.seed,
        });
    }
    let results = run_all(&cluster, &specs)?;
    // House rule 8 (review9 finding 8): a machine input refused in any run is a simulator bug.
    let refused: u64 = results.iter().map(|r| r.refused).sum();
    if refused > 0 {
        return Err(format!(
            "the simulator fed its retry and hedging machines {refused} input(s) they refused, \
             or found events in the wrong queue (a simulator bug: those operations waited for an \
             input that never came)"
        ));
    }
    let mut steady = Vec::new();
    let mut episode = Vec::new();
    let mut total_attempts = 0;
    for (spec, result) in specs.iter().zip(&results) {
        total_attempts += result.total_attempts;
        match spec.load {
            Load::Steady(load) => steady.push(steady_row(&cluster, spec, load, result)),
            Load::Episode { .. } => episode.push(episode_row(&cluster, spec, result)),
        }
    }
    Ok(Report {
        cluster,
        steady,
        episode,
        episode_load,
        total_attempts,
    })
}

/// Runs `specs` on every core; results in the order of `specs`. Refuses a cluster
/// [`Cluster::validate`] refuses (each [`model::run`] checks it).
pub fn run_all(cluster: &Cluster, specs: &[RunSpec]) -> Result<Vec<RunResult>, String> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(specs.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<RunResult, String>>>> =
        Mutex::new(vec![None; specs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(spec) = specs.get(i) else {
                    return;
                };
                let result = model::run(cluster, spec);
                results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(result);
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Ok(RunResult::default())))
        .collect()
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1]) / 1000.0
}

fn steady_row(cluster: &Cluster, spec: &RunSpec, load: f64, r: &RunResult) -> SteadyRow {
    let measured = (spec.duration - spec.warmup).as_secs_f64();
    let ops = r.operations.max(1) as f64;
    // Goodput counts successes completed while operations arrive, after the warmup.
    let first = (spec.warmup.as_nanos() / spec.bucket.as_nanos()) as usize;
    let last = (spec.duration.as_nanos() / spec.bucket.as_nanos()) as usize;
    let succeeded: u64 = r
        .series_succeeded
        .iter()
        .take(last)
        .skip(first)
        .map(|&n| u64::from(n))
        .sum();
    SteadyRow {
        policy: spec.policy,
        load,
        offered: load * cluster.capacity(),
        goodput: succeeded as f64 / measured,
        amplification: r.attempts as f64 / ops,
        failure_rate: (r.operations - r.succeeded) as f64 / ops,
        latency_ms: [
            percentile(&r.latencies_us, 0.5),
            percentile(&r.latencies_us, 0.99),
            percentile(&r.latencies_us, 0.999),
        ],
        shed_per_s: r.shed as f64 / spec.duration.as_secs_f64(),
    }
}

fn episode_row(cluster: &Cluster, spec: &RunSpec, r: &RunResult) -> EpisodeRow {
    let bucket_s = spec.bucket.as_secs_f64();
    let buckets = (spec.duration.as_nanos() / spec.bucket.as_nanos()) as usize;
    let Load::Episode { start, length, .. } = spec.load else {
        return EpisodeRow {
            policy: spec.policy,
            time_to_recover: None,
            series: Vec::new(),
        };
    };
    let get = |v: &[u32], i: usize| f64::from(v.get(i).copied().unwrap_or(0));
    let completed = |i: usize| get(&r.series_succeeded, i) + get(&r.series_failed, i);
    let failure = |i: usize| get(&r.series_failed, i) / completed(i).max(1.0);
    let series = (0..buckets)
        .map(|i| {
            let t = i as f64 * bucket_s;
            let load = spec.load_at_secs(t);
            (
                t,
                load * cluster.capacity(),
                get(&r.series_succeeded, i) / bucket_s,
                get(&r.series_attempts, i) / bucket_s,
                failure(i),
            )
        })
        .collect();
    let first = (spec.warmup.as_secs_f64() / bucket_s) as usize;
    let start_b = (start.as_secs_f64() / bucket_s) as usize;
    let end_b = ((start + length).as_secs_f64() / bucket_s) as usize;
    // Rates over a window of buckets: failures per completion, latency per completion.
    let window = |from: usize, to: usize| {
        let (mut done, mut failed, mut latency) = (0.0, 0.0, 0.0);
        for i in from..to {
            done += completed(i);
            failed += get(&r.series_failed, i);
            latency += r.series_latency_us.get(i).copied().unwrap_or(0) as f64;
        }
        (failed / done.max(1.0), latency / done.max(1.0))
    };
    let (baseline_failure, baseline_latency) = window(first, start_b);
    let width = (RECOVERY_WINDOW.as_secs_f64() / bucket_s).round().max(1.0) as usize;
    let recovered = (end_b..buckets.saturating_sub(width) + 1).find(|&b| {
        let (failure, latency) = window(b, b + width);
        failure <= baseline_failure + 0.02 && latency <= 2.0 * baseline_latency
    });
    EpisodeRow {
        policy: spec.policy,
        time_to_recover: recovered.map(|b| (b - end_b) as f64 * bucket_s),
        series,
    }
}

impl RunSpec {
    fn load_at_secs(&self, t: f64) -> f64 {
        match self.load {
            Load::Steady(x) => x,
            Load::Episode {
                base,
                peak,
                start,
                length,
            } => {
                if t >= start.as_secs_f64() && t < (start + length).as_secs_f64() {
                    peak
                } else {
                    base
                }
            }
        }
    }
}
