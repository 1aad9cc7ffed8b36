//! `retry-lab`: the demo of the retry policies (the default) and the probe of a URI.

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use retry_lab::cli::{Cli, Command, DemoArgs};
use retry_lab::{demo, probe, report, serve};

mod simulate_main;

fn main() -> ExitCode {
    let command = Cli::parse().into_command();
    if let Command::Simulate(args) = &command {
        return simulate_main::run(args);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("retry-lab: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command {
        Command::Demo(args) => runtime.block_on(run_demo(&args)),
        Command::Simulate(_) => ExitCode::SUCCESS,
        Command::Serve(args) => runtime.block_on(run_serve(&args)),
        Command::Probe(args) => {
            let mut out = io::stdout().lock();
            match runtime.block_on(probe::probe(&args.uri, &mut out)) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("retry-lab probe: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

async fn run_demo(args: &DemoArgs) -> ExitCode {
    println!(
        "retry-lab demo: {} test mongos on 127.0.0.1, each admitting {} requests/s (burst {}); \
         {} reads per policy, {} in flight, seed {}",
        args.servers, args.capacity, args.burst, args.operations, args.concurrency, args.seed
    );
    match demo::run(args, io::stderr().is_terminal()).await {
        Ok(runs) => {
            println!("{}", report::table(&runs));
            println!(
                "amplification = attempts / operations; retargets = retries that deprioritized a \
                 server and ran on another; shed = requests the routers rejected with code 462"
            );
            let _ = io::stdout().flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("retry-lab demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `retry-lab serve`: prints the URI on the first line of stdout, then serves until Ctrl-C.
async fn run_serve(args: &serve::ServeArgs) -> ExitCode {
    let served = match serve::start(args).await {
        Ok(served) => served,
        Err(e) => {
            eprintln!("retry-lab serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{}", served.uri);
    let _ = io::stdout().flush();
    eprintln!("retry-lab serve: listening; Ctrl-C stops it");
    let stopped = tokio::signal::ctrl_c().await;
    served.server.shutdown().await;
    match stopped {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("retry-lab serve: cannot wait for Ctrl-C: {e}");
            ExitCode::FAILURE
        }
    }
}
