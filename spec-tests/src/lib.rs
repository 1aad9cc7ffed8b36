//! Runners for the official MongoDB JSON spec tests.
//!
//! The JSON test files are read at test time from the specifications corpus (see [`corpus`]); they
//! are licensed CC BY-NC-SA and never copied into this repository. Each suite is a directory of
//! files; each file is one test case, run by the suite's runner, which returns `Err` with a message
//! naming what differed.

pub mod cmap;
pub mod corpus;
pub mod in_window;
pub mod json;
pub mod rtt;
pub mod sdam;
pub mod server_selection;
pub mod unified;

use std::path::Path;

/// A suite of the corpus: where its files are and how to run one.
#[derive(Clone, Copy, Debug)]
pub struct Suite {
    /// The name printed in the `suite: passed/total` summary.
    pub name: &'static str,
    /// The directory, relative to the corpus root, searched recursively for `*.json`.
    pub dir: &'static str,
    /// How many files the pinned corpus has; a different count fails the run, so a moved
    /// directory cannot pass by running nothing.
    pub expected_files: usize,
    /// Runs one file.
    pub run: fn(&Path) -> Result<(), String>,
}

/// The suites this crate runs, in the order they are reported.
pub const SUITES: &[Suite] = &[
    Suite {
        name: "server_selection",
        dir: "source/server-selection/tests/server_selection",
        expected_files: 88,
        run: server_selection::run_file,
    },
    Suite {
        name: "in_window",
        dir: "source/server-selection/tests/in_window",
        expected_files: 8,
        run: in_window::run_file,
    },
    Suite {
        name: "rtt",
        dir: "source/server-selection/tests/rtt",
        expected_files: 7,
        run: rtt::run_file,
    },
    Suite {
        name: "max_staleness",
        dir: "source/max-staleness/tests",
        expected_files: 32,
        run: server_selection::run_file,
    },
    Suite {
        name: "cmap_format",
        dir: "source/connection-monitoring-and-pooling/tests/cmap-format",
        expected_files: 33,
        run: cmap::run_file,
    },
    Suite {
        name: "sdam_single",
        dir: "source/server-discovery-and-monitoring/tests/single",
        expected_files: 19,
        run: sdam::run_file,
    },
    Suite {
        name: "sdam_rs",
        dir: "source/server-discovery-and-monitoring/tests/rs",
        expected_files: 77,
        run: sdam::run_file,
    },
    Suite {
        name: "sdam_sharded",
        dir: "source/server-discovery-and-monitoring/tests/sharded",
        expected_files: 9,
        run: sdam::run_file,
    },
    Suite {
        name: "sdam_load_balanced",
        dir: "source/server-discovery-and-monitoring/tests/load-balanced",
        expected_files: 1,
        run: sdam::run_file,
    },
    Suite {
        name: "sdam_errors",
        dir: "source/server-discovery-and-monitoring/tests/errors",
        expected_files: 72,
        run: sdam::run_file,
    },
    Suite {
        name: "sdam_monitoring",
        dir: "source/server-discovery-and-monitoring/tests/monitoring",
        expected_files: 8,
        run: sdam::run_file,
    },
];
