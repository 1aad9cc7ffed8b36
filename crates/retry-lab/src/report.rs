//! The demo's result table.

use std::time::Duration;

use comfy_table::presets::ASCII_MARKDOWN;
use comfy_table::{CellAlignment, Table};

use crate::cli::PolicyName;
use crate::cluster::ServerTotals;
use crate::stats::Summary;

/// The result of one policy's run: what the client reported and what the servers counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyRun {
    /// The policy.
    pub policy: PolicyName,
    /// The client's side.
    pub summary: Summary,
    /// The servers' side, for the demo's command.
    pub servers: ServerTotals,
}

const HEADER: [&str; 10] = [
    "policy",
    "operations",
    "successes",
    "failures",
    "attempts",
    "amplification",
    "retargets",
    "shed by servers",
    "p50 latency",
    "p99 latency",
];

/// The table of `runs`, one row per policy, as text.
pub fn table(runs: &[PolicyRun]) -> String {
    let mut table = Table::new();
    table.load_style(ASCII_MARKDOWN).set_header(HEADER);
    for run in runs {
        let s = &run.summary;
        table.add_row([
            run.policy.as_str().to_string(),
            s.operations.to_string(),
            s.successes.to_string(),
            s.failures.to_string(),
            s.attempts.to_string(),
            s.amplification()
                .map_or_else(|| "-".into(), |a| format!("{a:.2}x")),
            s.retargets.to_string(),
            run.servers.shed.to_string(),
            millis(s.p50),
            millis(s.p99),
        ]);
    }
    for index in 1..HEADER.len() {
        if let Some(column) = table.column_mut(index) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table.to_string()
}

/// A latency in milliseconds with one decimal, `-` when there is none.
fn millis(latency: Option<Duration>) -> String {
    latency.map_or_else(
        || "-".into(),
        |d| format!("{:.1} ms", d.as_secs_f64() * 1000.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_policy_with_every_column() {
        let summary = Summary {
            operations: 4,
            successes: 3,
            failures: 1,
            attempts: 7,
            retries: 3,
            retargets: 2,
            latencies: 4,
            p50: Some(Duration::from_micros(1260)),
            p99: Some(Duration::from_millis(250)),
        };
        let empty = Summary {
            operations: 0,
            successes: 0,
            failures: 0,
            attempts: 0,
            retries: 0,
            retargets: 0,
            latencies: 0,
            p50: None,
            p99: None,
        };
        let servers = ServerTotals {
            received: 7,
            executed: 5,
            shed: 2,
        };
        let text = table(&[
            PolicyRun {
                policy: PolicyName::Current,
                summary,
                servers,
            },
            PolicyRun {
                policy: PolicyName::Grpc,
                summary: empty,
                servers: ServerTotals::default(),
            },
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        for name in HEADER {
            assert!(lines[0].contains(name), "{text}");
        }
        let cells = |line: &str| -> Vec<String> {
            line.split('|')
                .map(|c| c.trim().to_string())
                .filter(|c| !c.is_empty())
                .collect()
        };
        assert_eq!(
            cells(lines[2]),
            ["current", "4", "3", "1", "7", "1.75x", "2", "2", "1.3 ms", "250.0 ms"]
        );
        assert_eq!(
            cells(lines[3]),
            ["grpc", "0", "0", "0", "0", "-", "0", "0", "-", "-"]
        );
    }
}
