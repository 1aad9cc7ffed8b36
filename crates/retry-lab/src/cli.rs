//! The command line: `retry-lab [demo] [options]` and `retry-lab probe <uri>`.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// retry-lab: watch retry-core's retry policies work against real sockets.
///
/// With no subcommand it runs the demo.
#[derive(Parser, Clone, Debug, PartialEq)]
#[command(name = "retry-lab", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// What to run; the demo when absent.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The demo's options, when no subcommand is given.
    #[command(flatten)]
    pub demo: DemoArgs,
}

impl Cli {
    /// The command to run: the subcommand, or the demo with the top-level options.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or(Command::Demo(self.demo))
    }
}

/// The subcommands.
#[derive(Subcommand, Clone, Debug, PartialEq)]
pub enum Command {
    /// Start test mongos routers behind ingress rate limiters on 127.0.0.1 and drive the same
    /// load through the client under each retry policy (the default command).
    Demo(DemoArgs),
    /// Connect to a server, run a ping with retries and print every event.
    ///
    /// A refused connection or other network error while connecting (but not a failed name
    /// lookup, nor a TLS certificate or host-name failure) carries the labels
    /// SystemOverloadedError and RetryableError by HS-9, whether or not the server is
    /// overloaded.
    Probe(ProbeArgs),
    /// Compare the retry policies in a deterministic simulation of many clients and servers.
    Simulate(crate::simulate::SimulateArgs),
    /// Run the fault-injecting test server on 127.0.0.1, print its URI, serve until Ctrl-C.
    Serve(crate::serve::ServeArgs),
}

/// The demo's options.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct DemoArgs {
    /// Operations per policy.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub operations: u32,
    /// Operations in flight at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Test mongos routers to start.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub servers: u32,
    /// Requests per second each router's ingress limiter admits (its refill rate); 0 never
    /// refills, so each router admits exactly `--burst` requests.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(0..=10_000_000))]
    pub capacity: u32,
    /// Requests each router's ingress limiter admits in a burst (its bucket size).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub burst: u32,
    /// The seed of each client's random numbers (backoff jitter, the choice between servers).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The policies to compare, in order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = PolicyName::ALL)]
    pub policies: Vec<PolicyName>,
}

/// A retry policy the demo can run.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyName {
    /// No retries: `retryReads` and `retryWrites` off.
    None,
    /// The current client-backpressure spec (the default policy).
    Current,
    /// The token bucket of the spec's first versions.
    TokenBucket,
    /// gRPC A6 retries with retry throttling.
    Grpc,
}

impl PolicyName {
    /// Every policy, in the order the demo runs them.
    pub const ALL: [PolicyName; 4] = [
        PolicyName::None,
        PolicyName::Current,
        PolicyName::TokenBucket,
        PolicyName::Grpc,
    ];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::None => "none",
            PolicyName::Current => "current",
            PolicyName::TokenBucket => "token-bucket",
            PolicyName::Grpc => "grpc",
        }
    }
}

/// The probe's options.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct ProbeArgs {
    /// A `mongodb://` or `mongodb+srv://` URI with the client's options, for example
    /// `mongodb://127.0.0.1:27017/?serverSelectionTimeoutMS=2000`.
    pub uri: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(std::iter::once("retry-lab").chain(args.iter().copied()))
            .map(Cli::into_command)
    }

    fn defaults() -> DemoArgs {
        DemoArgs {
            operations: 1500,
            concurrency: 32,
            servers: 3,
            capacity: 400,
            burst: 20,
            seed: 1,
            policies: PolicyName::ALL.to_vec(),
        }
    }

    #[test]
    fn the_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn no_arguments_run_the_demo_with_defaults() {
        assert_eq!(parse(&[]).unwrap(), Command::Demo(defaults()));
        assert_eq!(parse(&["demo"]).unwrap(), Command::Demo(defaults()));
    }

    #[test]
    fn demo_options_with_or_without_the_subcommand() {
        let expected = DemoArgs {
            operations: 10,
            concurrency: 2,
            servers: 1,
            capacity: 50,
            burst: 5,
            seed: 7,
            policies: vec![PolicyName::Grpc, PolicyName::None],
        };
        let args = [
            "--operations",
            "10",
            "--concurrency",
            "2",
            "--servers",
            "1",
            "--capacity",
            "50",
            "--burst",
            "5",
            "--seed",
            "7",
            "--policies",
            "grpc,none",
        ];
        assert_eq!(parse(&args).unwrap(), Command::Demo(expected.clone()));
        let with_subcommand: Vec<&str> = std::iter::once("demo").chain(args).collect();
        assert_eq!(parse(&with_subcommand).unwrap(), Command::Demo(expected));
    }

    #[test]
    fn probe_takes_a_uri() {
        assert_eq!(
            parse(&["probe", "mongodb://127.0.0.1:27017"]).unwrap(),
            Command::Probe(ProbeArgs {
                uri: "mongodb://127.0.0.1:27017".into()
            })
        );
        assert!(parse(&["probe"]).is_err());
    }

    #[test]
    fn bad_values_name_the_option_and_the_value() {
        for (args, option, value) in [
            (&["--operations", "0"][..], "--operations", "0"),
            (
                &["demo", "--concurrency", "many"][..],
                "--concurrency",
                "many",
            ),
            (&["--servers", "17"][..], "--servers", "17"),
            (
                &["--policies", "current,fastest"][..],
                "--policies",
                "fastest",
            ),
            (&["--seed", "1.5"][..], "--seed", "1.5"),
        ] {
            let error = parse(args).unwrap_err().to_string();
            assert!(
                error.contains(option) && error.contains(value),
                "{args:?}: {error}"
            );
        }
    }

    #[test]
    fn demo_options_do_not_mix_with_probe() {
        assert!(parse(&["--operations", "5", "probe", "mongodb://h"]).is_err());
        assert!(parse(&["frobnicate"]).is_err());
    }

    #[test]
    fn policy_names_round_trip() {
        for policy in PolicyName::ALL {
            assert_eq!(PolicyName::from_str(policy.as_str(), false), Ok(policy));
        }
    }
}
