//! The unified-format runner (issue 11, UT-*): loads the suites' JSON from the corpus, gates
//! each file on its schema version (UT-2, UT-3), decides each test's fate from its
//! `runOnRequirements` and `skipReason` against the deployment actually started (UT-4..6), and
//! counts every test of every file (UT-6, UT-20).
//!
//! A test that is neither skipped nor refused runs on a fresh retry-testkit deployment of the
//! first topology its requirements allow, in the order [`deploy::TOPOLOGIES`] (replica set,
//! sharded, load balanced, single), through the product's tokio client ([`runner`]). It passes
//! only when every check ran and held and the test server refused nothing (UT-20).

pub mod deploy;
pub mod entities;
pub mod matching;
pub mod operations;
pub mod requirements;
pub mod runner;
pub mod schema;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::corpus;
pub use requirements::Deployment;

/// A test that runs longer than this is failed (every wait in it is bounded, rule 12).
const TEST_LIMIT: std::time::Duration = std::time::Duration::from_secs(20);

/// A unified-format suite: its name in the summary line and its directory under the corpus root.
#[derive(Clone, Copy, Debug)]
pub struct UnifiedSuite {
    /// The name printed as `unified/<name>`.
    pub name: &'static str,
    /// The directory of its `*.json` files, relative to the corpus root.
    pub dir: &'static str,
}

/// The suites issue 11 runs, in the order they are reported.
pub const UNIFIED_SUITES: &[UnifiedSuite] = &[
    UnifiedSuite {
        name: "client-backpressure",
        dir: "source/client-backpressure/tests",
    },
    UnifiedSuite {
        name: "retryable-reads",
        dir: "source/retryable-reads/tests/unified",
    },
    UnifiedSuite {
        name: "retryable-writes",
        dir: "source/retryable-writes/tests/unified",
    },
    UnifiedSuite {
        name: "load-balancers",
        dir: "source/load-balancers/tests",
    },
    UnifiedSuite {
        name: "sdam",
        dir: "source/server-discovery-and-monitoring/tests/unified",
    },
];

/// What became of one test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TestOutcome {
    /// Every check held.
    Passed,
    /// Skipped for a fixed reason (UT-6).
    Skipped(&'static str),
    /// Failed, or could not be run by the harness (UT-20), with the reason.
    Failed(String),
}

/// One suite's counts: `total` counts every test in its files (UT-6).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SuiteReport {
    /// Tests whose checks all held.
    pub passed: usize,
    /// Every test of every file.
    pub total: usize,
    /// Skips by reason.
    pub skipped: BTreeMap<&'static str, usize>,
    /// Failures by reason.
    pub failed: BTreeMap<String, usize>,
}

impl SuiteReport {
    /// How many tests were skipped.
    pub fn skipped_count(&self) -> usize {
        self.skipped.values().sum()
    }

    /// The summary line: `unified/<suite>: passed/total (skipped s)`.
    pub fn line(&self, suite: &str) -> String {
        format!(
            "unified/{suite}: {}/{} (skipped {})",
            self.passed,
            self.total,
            self.skipped_count()
        )
    }

    fn record(&mut self, outcome: TestOutcome) {
        self.total += 1;
        match outcome {
            TestOutcome::Passed => self.passed += 1,
            TestOutcome::Skipped(reason) => *self.skipped.entry(reason).or_default() += 1,
            TestOutcome::Failed(reason) => *self.failed.entry(reason).or_default() += 1,
        }
    }
}

/// Runs every file of `suite` under `root` against `deployment`.
pub fn run_suite(
    suite: &UnifiedSuite,
    root: &Path,
    deployment: &Deployment,
) -> Result<SuiteReport, String> {
    let dir = root.join(suite.dir);
    let files =
        corpus::json_files(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("no tokio runtime: {e}"))?;
    let verbose = std::env::var_os("UNIFIED_VERBOSE").is_some();
    let mut report = SuiteReport::default();
    for path in files {
        let file = corpus::read_json(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let outcomes = run_file(&file, deployment, &runtime)?;
        for (index, outcome) in outcomes.into_iter().enumerate() {
            if verbose {
                if let TestOutcome::Failed(reason) = &outcome {
                    let name = path.file_name().unwrap_or_default().to_string_lossy();
                    println!("FAIL {}/{name}#{index}: {reason}", suite.name);
                }
            }
            report.record(outcome);
        }
    }
    Ok(report)
}

/// The outcome of each test of one file, in order. `Err` only when the file has no `tests`
/// array (it cannot be counted).
pub fn run_file(
    file: &Value,
    deployment: &Deployment,
    runtime: &tokio::runtime::Runtime,
) -> Result<Vec<TestOutcome>, String> {
    let tests = file
        .get("tests")
        .and_then(Value::as_array)
        .ok_or("a unified file needs a tests array")?;
    let file_gate = file_gate(file);
    Ok(tests
        .iter()
        .map(|test| match &file_gate {
            Some(outcome) => outcome.clone(),
            None => test_outcome(file, test, deployment, runtime),
        })
        .collect())
}

/// What the file's schema version and entities decide for all its tests.
fn file_gate(file: &Value) -> Option<TestOutcome> {
    if let Err(e) = schema::check(file.get("schemaVersion")) {
        return Some(TestOutcome::Failed(e));
    }
    let entities = file.get("createEntities").and_then(Value::as_array);
    if entities
        .into_iter()
        .flatten()
        .any(|e| e.get("bucket").is_some())
    {
        return Some(TestOutcome::Skipped(requirements::GRIDFS));
    }
    None
}

/// UT-4: the file's `runOnRequirements`, then the test's, on the first topology that meets
/// both; then `skipReason`; then execution on a fresh deployment of that topology.
fn test_outcome(
    file: &Value,
    test: &Value,
    deployment: &Deployment,
    runtime: &tokio::runtime::Runtime,
) -> TestOutcome {
    let mut first_reason = None;
    let mut chosen = None;
    for topology in deploy::TOPOLOGIES {
        let facts = Deployment {
            topology: topology.name(),
            ..deployment.clone()
        };
        let unmet = requirements::unmet(file.get("runOnRequirements"), &facts)
            .or_else(|| requirements::unmet(test.get("runOnRequirements"), &facts));
        match unmet {
            None => {
                chosen = Some(topology);
                break;
            }
            Some(reason) if reason != requirements::TOPOLOGY || first_reason.is_none() => {
                first_reason = first_reason
                    .filter(|r| *r != requirements::TOPOLOGY)
                    .or(Some(reason));
            }
            Some(_) => {}
        }
    }
    let Some(topology) = chosen else {
        return TestOutcome::Skipped(first_reason.unwrap_or(requirements::TOPOLOGY));
    };
    if test.get("skipReason").is_some() {
        return TestOutcome::Skipped(requirements::SKIP_REASON);
    }
    if test.get("expectLogMessages").is_some() {
        return TestOutcome::Skipped(requirements::LOGGING);
    }
    let result = runtime.block_on(async {
        let cluster = deploy::Cluster::start(topology)
            .await
            .map_err(|e| format!("harness: cannot start {}: {e}", topology.name()))?;
        let result = tokio::time::timeout(TEST_LIMIT, runner::run_test(file, test, &cluster))
            .await
            .unwrap_or_else(|_| Err(format!("test did not end within {TEST_LIMIT:?}")));
        cluster.shutdown().await;
        result
    });
    match result {
        Ok(()) => TestOutcome::Passed,
        Err(reason) => TestOutcome::Failed(reason),
    }
}
