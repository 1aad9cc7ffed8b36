//! Runners for the official MongoDB JSON spec tests.
//!
//! The JSON test files are read at test time from the specifications corpus (see [`corpus`]); they
//! are licensed CC BY-NC-SA and never copied into this repository. Each suite is a directory of
//! files; each file is one test case, run by the suite's runner, which returns `Err` with a message
//! naming what differed.
#![warn(missing_docs)]

pub mod auth;
pub mod cmap;
pub mod corpus;
pub mod in_window;
pub mod json;
pub mod rtt;
pub mod sdam;
pub mod server_selection;
pub mod unified;
pub mod uri;

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

/// How one case of a [`CaseSuite`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every assertion held.
    Passed,
    /// An assertion failed; the message says which.
    Failed(String),
    /// Not run to the end, for this reason (a feature the client does not have). Never counted
    /// as passed.
    Skipped(String),
}

/// One case of a file of a [`CaseSuite`].
#[derive(Clone, Debug)]
pub struct CaseResult {
    /// The case's `description`.
    pub description: String,
    /// How it ended.
    pub outcome: Outcome,
}

/// A suite whose files hold many cases each, counted per case with skips (the URI suites).
#[derive(Clone, Copy, Debug)]
pub struct CaseSuite {
    /// The name printed in the `suite: passed/total (skipped)` summary.
    pub name: &'static str,
    /// The directory, relative to the corpus root, searched recursively for `*.json`.
    pub dir: &'static str,
    /// How many files the pinned corpus has.
    pub expected_files: usize,
    /// How many cases those files hold (URI-15).
    pub expected_cases: usize,
    /// Runs every case of one file.
    pub run: fn(&Path) -> Result<Vec<CaseResult>, String>,
}

/// The per-case suites, in the order they are reported.
pub const CASE_SUITES: &[CaseSuite] = &[
    CaseSuite {
        name: "connection-string",
        dir: "source/connection-string/tests",
        expected_files: 8,
        expected_cases: 98,
        run: uri::run_file,
    },
    CaseSuite {
        name: "uri-options",
        dir: "source/uri-options/tests",
        expected_files: 12,
        expected_cases: 159,
        run: uri::run_file,
    },
    CaseSuite {
        name: "auth",
        dir: "source/auth/tests/legacy",
        expected_files: 1,
        expected_cases: 67,
        run: auth::run_file,
    },
    CaseSuite {
        name: "read-write-concern-uri",
        dir: "source/read-write-concern/tests/connection-string",
        expected_files: 2,
        expected_cases: 18,
        run: uri::run_concern_file,
    },
];
