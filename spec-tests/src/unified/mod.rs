//! The unified-format runner (issue 11, UT-*): loads the suites' JSON from the corpus, gates
//! each file on its schema version (UT-2, UT-3), decides each test's fate from its
//! `runOnRequirements` and `skipReason` against the deployment actually started (UT-4..6), and
//! counts every test of every file (UT-6, UT-20).
//!
//! Executing a test (entities, `initialData`, operations, `expectEvents`, `outcome`) is not
//! built yet: every test that is neither skipped nor refused is counted as a harness failure
//! with the reason [`NOT_EXECUTED`], never as a pass.

pub mod matching;
pub mod requirements;
pub mod schema;

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::corpus;
pub use requirements::Deployment;

/// The reason of every test the runner cannot execute yet (UT-20: a harness failure).
pub const NOT_EXECUTED: &str = "runner: test execution (entities, operations, events) not built";

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
    let mut report = SuiteReport::default();
    for path in files {
        let file = corpus::read_json(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for outcome in run_file(&file, deployment)? {
            report.record(outcome);
        }
    }
    Ok(report)
}

/// The outcome of each test of one file, in order. `Err` only when the file has no `tests`
/// array (it cannot be counted).
pub fn run_file(file: &Value, deployment: &Deployment) -> Result<Vec<TestOutcome>, String> {
    let tests = file
        .get("tests")
        .and_then(Value::as_array)
        .ok_or("a unified file needs a tests array")?;
    let file_gate = file_gate(file, deployment);
    Ok(tests
        .iter()
        .map(|test| match &file_gate {
            Some(outcome) => outcome.clone(),
            None => test_outcome(test, deployment),
        })
        .collect())
}

/// What the file's schema version, `runOnRequirements` and entities decide for all its tests.
fn file_gate(file: &Value, deployment: &Deployment) -> Option<TestOutcome> {
    if let Err(e) = schema::check(file.get("schemaVersion")) {
        return Some(TestOutcome::Failed(e));
    }
    if let Some(reason) = requirements::unmet(file.get("runOnRequirements"), deployment) {
        return Some(TestOutcome::Skipped(reason));
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

/// UT-4: the test's own `runOnRequirements`, then `skipReason`; then execution.
fn test_outcome(test: &Value, deployment: &Deployment) -> TestOutcome {
    if let Some(reason) = requirements::unmet(test.get("runOnRequirements"), deployment) {
        return TestOutcome::Skipped(reason);
    }
    if test.get("skipReason").is_some() {
        return TestOutcome::Skipped(requirements::SKIP_REASON);
    }
    if test.get("expectLogMessages").is_some() {
        return TestOutcome::Skipped(requirements::LOGGING);
    }
    TestOutcome::Failed(NOT_EXECUTED.into())
}
