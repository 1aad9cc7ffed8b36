//! The summary table `retry-lab simulate` prints: per policy, a few figures at up to three of the
//! steady loads that ran (`--loads`), and the time to recover from the episode.

use super::{Report, SteadyRow};

/// The defaults' loads the summary shows: below capacity, twice it, five times it.
const DEFAULT_SHOWN: [f64; 3] = [0.75, 2.0, 5.0];

/// A figure of one steady-load run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Figure {
    Goodput,
    Failed,
    Amplification,
    P99,
}

impl Figure {
    const ALL: [Figure; 4] = [
        Figure::Goodput,
        Figure::Failed,
        Figure::Amplification,
        Figure::P99,
    ];

    fn name(self) -> &'static str {
        match self {
            Figure::Goodput => "goodput",
            Figure::Failed => "failed",
            Figure::Amplification => "amplif.",
            Figure::P99 => "p99 ms",
        }
    }

    fn format(self, row: &SteadyRow) -> String {
        match self {
            Figure::Goodput => format!("{:.0}", row.goodput),
            Figure::Failed => format!("{:.1}%", row.failure_rate * 100.0),
            Figure::Amplification => format!("{:.2}", row.amplification),
            Figure::P99 => format!("{:.1}", row.latency_ms[1]),
        }
    }
}

/// The loads the summary shows, lowest first: 0.75×, 2× and 5× when all three ran (the default
/// `--loads` holds them); otherwise every load that ran when there are three or fewer, else the
/// lowest, the middle and the highest.
pub fn shown_loads(report: &Report) -> Vec<f64> {
    let mut loads: Vec<f64> = Vec::new();
    for row in &report.steady {
        if !loads.iter().any(|&l| same(l, row.load)) {
            loads.push(row.load);
        }
    }
    loads.sort_by(f64::total_cmp);
    if DEFAULT_SHOWN
        .iter()
        .all(|&d| loads.iter().any(|&l| same(l, d)))
    {
        return DEFAULT_SHOWN.to_vec();
    }
    match loads.len() {
        0..=3 => loads,
        n => vec![loads[0], loads[n / 2], loads[n - 1]],
    }
}

/// The figures shown at the `index`th of `count` loads: the lowest (of several) shows how
/// policies do when healthy (failures, p99); the highest of three shows goodput and
/// amplification; any other all four.
fn figures(index: usize, count: usize) -> &'static [Figure] {
    match (index, count) {
        (_, 1) => &Figure::ALL,
        (0, _) => &[Figure::Failed, Figure::P99],
        (2, 3) => &[Figure::Goodput, Figure::Amplification],
        _ => &Figure::ALL,
    }
}

/// The summary's header and one row per policy (in the episode's order): the policy's name, the
/// figures at each of [`shown_loads`] ("-" for a run that is missing), and the time to recover.
pub fn table(report: &Report) -> (Vec<String>, Vec<Vec<String>>) {
    let loads = shown_loads(report);
    let columns: Vec<(f64, Figure)> = loads
        .iter()
        .enumerate()
        .flat_map(|(i, &load)| figures(i, loads.len()).iter().map(move |&f| (load, f)))
        .collect();
    let mut header = vec!["policy".to_string()];
    header.extend(
        columns
            .iter()
            .map(|(load, figure)| format!("{} @{load}x", figure.name())),
    );
    header.push("recovery s".to_string());
    let rows = report
        .episode
        .iter()
        .map(|episode| {
            let mut row = vec![episode.policy.name()];
            row.extend(columns.iter().map(|&(load, figure)| {
                report
                    .steady
                    .iter()
                    .find(|r| r.policy == episode.policy && same(r.load, load))
                    .map_or_else(|| "-".to_string(), |r| figure.format(r))
            }));
            row.push(
                episode
                    .time_to_recover
                    .map_or_else(|| "never".to_string(), |t| format!("{t:.2}")),
            );
            row
        })
        .collect();
    (header, rows)
}

fn same(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::model::{Cluster, Load};
    use crate::simulate::policy::SimPolicy;

    fn report(loads: &[f64]) -> Report {
        let row = |load: f64| SteadyRow {
            policy: SimPolicy::ALL[0],
            load,
            offered: 0.0,
            goodput: 1000.0 * load,
            amplification: 1.0,
            failure_rate: 0.0,
            latency_ms: [1.0, 2.0, 3.0],
            shed_per_s: 0.0,
        };
        Report {
            cluster: Cluster::default(),
            steady: loads.iter().map(|&l| row(l)).collect(),
            episode: Vec::new(),
            episode_load: Load::Steady(1.0),
            total_attempts: 0,
        }
    }

    /// Review32 R22: the columns follow `--loads`; the defaults keep 0.75×, 2× and 5×.
    #[test]
    fn the_shown_loads_follow_the_loads_that_ran() {
        let defaults = super::super::DEFAULT_LOADS;
        assert_eq!(shown_loads(&report(&defaults)), vec![0.75, 2.0, 5.0]);
        assert_eq!(shown_loads(&report(&[1.0])), vec![1.0]);
        assert_eq!(shown_loads(&report(&[4.0, 0.5])), vec![0.5, 4.0]);
        assert_eq!(
            shown_loads(&report(&[0.5, 1.0, 1.5, 3.0, 4.0])),
            vec![0.5, 1.5, 4.0]
        );
    }

    /// Review32 R22: every figure has a column at a single load, named after it.
    #[test]
    fn one_load_shows_every_figure_at_that_load() {
        let (header, _) = table(&report(&[1.5]));
        assert_eq!(
            header,
            [
                "policy",
                "goodput @1.5x",
                "failed @1.5x",
                "amplif. @1.5x",
                "p99 ms @1.5x",
                "recovery s"
            ]
        );
    }
}
