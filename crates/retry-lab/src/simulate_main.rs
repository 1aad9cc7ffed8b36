//! `retry-lab simulate`: runs the simulation, writes its files and prints a summary.

use std::process::ExitCode;
use std::time::Instant;

use comfy_table::Table;
use retry_lab::simulate::{output, simulate, summary, SimulateArgs};

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
    let (header, rows) = summary::table(&report);
    let mut table = Table::new();
    table.set_header(header);
    for row in rows {
        table.add_row(row);
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
