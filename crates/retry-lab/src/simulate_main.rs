//! `retry-lab simulate`: runs the simulation, writes its files and prints a summary.

use std::process::ExitCode;
use std::time::Instant;

use comfy_table::Table;
use retry_lab::simulate::{output, simulate, SimulateArgs};

/// Runs the simulation and reports where its files went.
pub fn run(args: &SimulateArgs) -> ExitCode {
    let cluster = match args.validate().and_then(|()| args.cluster()) {
        Ok(cluster) => cluster,
        Err(e) => {
            eprintln!("retry-lab simulate: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "retry-lab simulate: {} members x {} workers ({:.0} ops/s in all), {} clients, seed {}",
        cluster.servers,
        cluster.workers,
        cluster.capacity(),
        cluster.clients,
        args.seed
    );
    let started = Instant::now();
    let report = match simulate(args) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("retry-lab simulate: {e}");
            return ExitCode::from(2);
        }
    };
    let elapsed = started.elapsed();
    let mut table = Table::new();
    table.set_header([
        "policy",
        "failed @0.75x",
        "p99 ms @0.75x",
        "goodput @2x",
        "failed @2x",
        "amplif. @2x",
        "p99 ms @2x",
        "goodput @5x",
        "amplif. @5x",
        "recovery s",
    ]);
    for episode in &report.episode {
        let at = |load: f64| {
            report
                .steady
                .iter()
                .find(|r| r.policy == episode.policy && (r.load - load).abs() < 1e-9)
        };
        let cell = |load: f64, f: &dyn Fn(&retry_lab::simulate::SteadyRow) -> String| {
            at(load).map_or_else(|| "-".to_string(), f)
        };
        table.add_row([
            episode.policy.name(),
            cell(0.75, &|r| format!("{:.1}%", r.failure_rate * 100.0)),
            cell(0.75, &|r| format!("{:.1}", r.latency_ms[1])),
            cell(2.0, &|r| format!("{:.0}", r.goodput)),
            cell(2.0, &|r| format!("{:.1}%", r.failure_rate * 100.0)),
            cell(2.0, &|r| format!("{:.2}", r.amplification)),
            cell(2.0, &|r| format!("{:.1}", r.latency_ms[1])),
            cell(5.0, &|r| format!("{:.0}", r.goodput)),
            cell(5.0, &|r| format!("{:.2}", r.amplification)),
            episode
                .time_to_recover
                .map_or_else(|| "never".to_string(), |t| format!("{t:.2}")),
        ]);
    }
    println!("{table}");
    match output::write(&report, &args.out) {
        Ok(paths) => {
            println!(
                "{} attempts simulated in {:.2} s ({:.2} M attempts/s); wrote {} files to {}",
                report.total_attempts,
                elapsed.as_secs_f64(),
                report.total_attempts as f64 / elapsed.as_secs_f64() / 1e6,
                paths.len(),
                args.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "retry-lab simulate: cannot write to {}: {e}",
                args.out.display()
            );
            ExitCode::FAILURE
        }
    }
}
