//! The unified-format runner (issue 11, UT-*): loads the suites' JSON from the corpus, gates
//! each file on its schema version (UT-2, UT-3), decides each test's fate from its
//! `runOnRequirements` and `skipReason` against the deployment actually started (UT-4..6), and
//! counts every test of every file (UT-6, UT-20).
//!
//! A test that is neither skipped nor refused runs on a fresh retry-testkit deployment of the
//! first topology its requirements allow, in the order [`deploy::TOPOLOGIES`] (replica set,
//! sharded, load balanced, single), without authentication unless it asks for `auth: true`
//! (then the servers have a SCRAM user and the clients authenticate for real, UT-5), through the product's tokio client ([`runner`]). It passes
//! only when every check ran and held and the test server refused nothing (UT-20).

pub mod deploy;
pub mod entities;
pub mod known_failures;
pub mod matching;
pub mod operations;
pub mod requirements;
pub mod runner;
pub mod schema;

use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

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
    /// The files of `dir` it runs, by name; empty for every one. docs/spec-coverage.md says why
    /// each file left out is not run.
    pub files: &'static [&'static str],
    /// The tests known to fail, each with its reason (house rule 10: no failure hides). Any
    /// other failing test fails the suite's trial, and so does a listed test that passes (then
    /// it leaves the list) or is not run.
    pub known_failures: &'static [KnownFailure],
}

/// A test a suite's trial expects to fail ([`UnifiedSuite::known_failures`]).
#[derive(Clone, Copy, Debug)]
pub struct KnownFailure {
    /// `<file>.json: <test description>`.
    pub test: &'static str,
    /// Why it fails.
    pub reason: &'static str,
    /// It depends on timing (the machine's load) and may pass: its passing is not an error.
    pub may_pass: bool,
}

/// A test that fails for `reason`.
const fn fails(test: &'static str, reason: &'static str) -> KnownFailure {
    KnownFailure {
        test,
        reason,
        may_pass: false,
    }
}

/// The suites issue 11 runs (and the transactions and sessions suites, review5 item 12), in the
/// order they are reported.
pub const UNIFIED_SUITES: &[UnifiedSuite] = &[
    UnifiedSuite {
        name: "client-backpressure",
        dir: "source/client-backpressure/tests",
        files: &[],
        known_failures: &[],
    },
    UnifiedSuite {
        name: "retryable-reads",
        dir: "source/retryable-reads/tests/unified",
        files: &[],
        known_failures: &[],
    },
    UnifiedSuite {
        name: "retryable-writes",
        dir: "source/retryable-writes/tests/unified",
        files: &[],
        known_failures: &[],
    },
    UnifiedSuite {
        name: "load-balancers",
        dir: "source/load-balancers/tests",
        files: &[],
        known_failures: &[],
    },
    UnifiedSuite {
        name: "sdam",
        dir: "source/server-discovery-and-monitoring/tests/unified",
        files: &[],
        known_failures: known_failures::SDAM,
    },
    UnifiedSuite {
        name: "transactions",
        dir: "source/transactions/tests/unified",
        files: &[],
        known_failures: known_failures::TRANSACTIONS,
    },
    UnifiedSuite {
        name: "sessions",
        dir: "source/sessions/tests",
        files: &[],
        known_failures: known_failures::SESSIONS,
    },
    // CS-7 (review33 G1): the MaxTimeMSExpired transformation file and the two others that pass
    // whole; TO-6 and TO-14 (txn21): the legacy-timeouts file (`maxCommitTimeMS`, `maxTimeMS`)
    // and the two session-timeout files (`defaultTimeoutMS` and the client's fallback); the
    // other 22 files need runner operations and arguments not written yet, or product features
    // (withTransaction), docs/spec-coverage.md says which.
    UnifiedSuite {
        name: "client-side-operations-timeout",
        dir: "source/client-side-operations-timeout/tests",
        files: &[
            "error-transformations.json",
            "global-timeoutMS.json",
            "legacy-timeouts.json",
            "retryability-legacy-timeouts.json",
            "sessions-inherit-timeoutMS.json",
            "sessions-override-timeoutMS.json",
        ],
        known_failures: known_failures::CLIENT_SIDE_OPERATIONS_TIMEOUT,
    },
];

impl UnifiedSuite {
    /// What in `report` contradicts the suite's known failures: a failing test not listed, a
    /// listed test that passed (unless it may) or did not run. Empty when the run is as expected.
    pub fn surprises(&self, report: &SuiteReport) -> Vec<String> {
        let mut surprises: Vec<String> = report
            .failures
            .iter()
            .filter(|(test, _)| !self.known_failures.iter().any(|k| k.test == test.as_str()))
            .map(|(test, reason)| format!("fails: {test}: {reason}"))
            .collect();
        for known in self.known_failures {
            if report.failures.contains_key(known.test) {
                continue;
            }
            if report.passes.contains(known.test) {
                if !known.may_pass {
                    surprises.push(format!("passes now (take it off the list): {}", known.test));
                }
            } else {
                surprises.push(format!("listed but not run: {}", known.test));
            }
        }
        surprises
    }
}

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
    /// Each failed test (`<file>.json: <description>`) with its reason.
    pub failures: BTreeMap<String, String>,
    /// Each passed test (`<file>.json: <description>`).
    pub passes: std::collections::BTreeSet<String>,
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

    fn record(&mut self, test: String, outcome: TestOutcome) {
        self.total += 1;
        match outcome {
            TestOutcome::Passed => {
                self.passed += 1;
                self.passes.insert(test);
            }
            TestOutcome::Skipped(reason) => *self.skipped.entry(reason).or_default() += 1,
            TestOutcome::Failed(reason) => {
                *self.failed.entry(reason.clone()).or_default() += 1;
                self.failures.insert(test, reason);
            }
        }
    }
}

/// How many tests of a suite run at once, each on its own deployment. Most of a test's time is
/// the product waiting (e.g. `minHeartbeatFrequencyMS` before a server is checked again after a
/// state-change error), so a few at a time keep a run short without loading the cores.
const CONCURRENCY: usize = 8;

/// A client `socketTimeoutMS` below this makes its test run alone, after the suite's other tests:
/// their work on the same thread would eat into it.
const SHORT_TIMEOUT_MS: u64 = 500;

/// A client `connectTimeoutMS` at or below this makes its test run alone too: its monitors'
/// deadlines (`connectTimeoutMS`, plus `heartbeatFrequencyMS` for a streamed hello, MO-4) leave
/// the sdam tests that set it (`hello-timeout.json`, `hello-command-error.json`,
/// `interruptInUse-pool-clear.json`: 250–1,000 ms) margins of 250–500 ms against their
/// servers' replies and blocks, which seven other tests' work on the same thread exceeded under
/// load (a monitor timed out with its reply due: a spurious Unknown and pool clear).
const SHORT_CONNECT_TIMEOUT_MS: u64 = 1_000;

/// Whether `test` (or its file's entities) sets a client `socketTimeoutMS` below
/// [`SHORT_TIMEOUT_MS`] (e.g. `auth-network-timeout-error.json`'s 250 ms, which other tests' work
/// on the same thread could otherwise exhaust during an authentication) or a `connectTimeoutMS`
/// at or below [`SHORT_CONNECT_TIMEOUT_MS`].
fn has_short_timeout(file: &Value, test: &Value) -> bool {
    fn walk(value: &Value, depth: usize) -> bool {
        if depth > 64 {
            return false;
        }
        match value {
            Value::Object(map) => map.iter().any(|(key, v)| {
                (key == "socketTimeoutMS"
                    && v.as_u64().is_some_and(|ms| ms > 0 && ms < SHORT_TIMEOUT_MS))
                    || (key == "connectTimeoutMS"
                        && v.as_u64()
                            .is_some_and(|ms| ms > 0 && ms <= SHORT_CONNECT_TIMEOUT_MS))
                    || walk(v, depth + 1)
            }),
            Value::Array(items) => items.iter().any(|v| walk(v, depth + 1)),
            _ => false,
        }
    }
    file.get("createEntities").is_some_and(|e| walk(e, 0))
        || test.get("operations").is_some_and(|o| walk(o, 0))
}

/// What becomes of one test before it runs: decided already, or run on a topology.
enum Plan {
    Decided(TestOutcome),
    /// On this topology, authenticating or not.
    Run(deploy::Topology, bool),
}

/// Runs every file of `suite` under `root` against `deployment`: every test's plan first, then
/// the tests to run, 8 at a time on one thread; outcomes are counted in file order.
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
    let local = tokio::task::LocalSet::new();
    let permits = Rc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    // Tests with a short client timeout run last and alone (`has_short_timeout`): they wait for
    // `others_done`, opened when the count of the other tests still to finish reaches 0.
    let others = Rc::new(std::cell::Cell::new(0_usize));
    let others_done = Rc::new(tokio::sync::Semaphore::new(0));
    let mut jobs = Vec::new();
    // UNIFIED_FILTER=<text>: only the files whose name contains it (a debugging aid; the
    // suite's line then counts only those).
    let only = std::env::var("UNIFIED_FILTER").ok();
    for path in files {
        let file_name = path.file_name().unwrap_or_default().to_string_lossy();
        if !suite.files.is_empty() && !suite.files.contains(&file_name.as_ref()) {
            continue;
        }
        if only
            .as_ref()
            .is_some_and(|o| !file_name.contains(o.as_str()))
        {
            continue;
        }
        let file =
            Rc::new(corpus::read_json(&path).map_err(|e| format!("{}: {e}", path.display()))?);
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        for (index, plan) in plan_file(&file, deployment)?.into_iter().enumerate() {
            let job = match plan {
                Plan::Decided(outcome) => Job::Decided(outcome),
                Plan::Run(topology, auth) => {
                    let (file, permits) = (Rc::clone(&file), Rc::clone(&permits));
                    let alone = file
                        .get("tests")
                        .and_then(|t| t.get(index))
                        .is_some_and(|test| has_short_timeout(&file, test));
                    let (others, others_done) = (Rc::clone(&others), Rc::clone(&others_done));
                    if !alone {
                        others.set(others.get() + 1);
                    }
                    Job::Running(local.spawn_local(async move {
                        if alone {
                            // After every other test of the suite, one at a time.
                            drop(others_done.acquire().await);
                            let _permit = permits.acquire_many(CONCURRENCY as u32).await;
                            return execute(&file, index, topology, auth).await;
                        }
                        let outcome = {
                            let _permit = permits.acquire().await;
                            execute(&file, index, topology, auth).await
                        };
                        others.set(others.get() - 1);
                        if others.get() == 0 {
                            others_done.add_permits(1);
                        }
                        outcome
                    }))
                }
            };
            let description = file
                .get("tests")
                .and_then(|t| t.get(index))
                .and_then(|t| t.get("description"))
                .and_then(Value::as_str)
                .unwrap_or("(no description)");
            jobs.push((format!("{name}: {description}"), job));
        }
    }
    if others.get() == 0 {
        others_done.add_permits(1);
    }
    let verbose = std::env::var_os("UNIFIED_VERBOSE").is_some();
    let mut report = SuiteReport::default();
    runtime.block_on(local.run_until(async {
        for (name, job) in jobs {
            let outcome = match job {
                Job::Decided(outcome) => outcome,
                Job::Running(handle) => handle.await.unwrap_or_else(|e| {
                    TestOutcome::Failed(format!("harness: the test panicked: {e}"))
                }),
            };
            if verbose {
                if let TestOutcome::Failed(reason) = &outcome {
                    println!("FAIL {}/{name}: {reason}", suite.name);
                }
            }
            report.record(name, outcome);
        }
    }));
    Ok(report)
}

/// A test decided before running, or running.
enum Job {
    Decided(TestOutcome),
    Running(tokio::task::JoinHandle<TestOutcome>),
}

/// The plan of each test of one file, in order. `Err` only when the file has no `tests`
/// array (it cannot be counted).
fn plan_file(file: &Value, deployment: &Deployment) -> Result<Vec<Plan>, String> {
    let tests = file
        .get("tests")
        .and_then(Value::as_array)
        .ok_or("a unified file needs a tests array")?;
    let file_gate = file_gate(file);
    Ok(tests
        .iter()
        .map(|test| match &file_gate {
            Some(outcome) => Plan::Decided(outcome.clone()),
            None => plan(file, test, deployment),
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
/// both; then `skipReason`; else the test runs on that topology.
fn plan(file: &Value, test: &Value, deployment: &Deployment) -> Plan {
    let mut first_reason = None;
    let mut chosen = None;
    // A deployment without authentication first; one with a SCRAM user when the test needs it.
    let candidates = [false, true]
        .into_iter()
        .flat_map(|auth| deploy::TOPOLOGIES.into_iter().map(move |t| (t, auth)));
    for (topology, auth) in candidates {
        let facts = Deployment {
            topology: topology.name(),
            auth,
            ..deployment.clone()
        };
        let unmet = requirements::unmet(file.get("runOnRequirements"), &facts)
            .or_else(|| requirements::unmet(test.get("runOnRequirements"), &facts));
        match unmet {
            None => {
                chosen = Some((topology, auth));
                break;
            }
            Some(reason) => {
                // A reason other than the topology says more about why nothing fits.
                if first_reason.is_none_or(|r| r == requirements::TOPOLOGY) {
                    first_reason = Some(reason);
                }
            }
        }
    }
    let Some((topology, auth)) = chosen else {
        return Plan::Decided(TestOutcome::Skipped(
            first_reason.unwrap_or(requirements::TOPOLOGY),
        ));
    };
    if test.get("skipReason").is_some() {
        return Plan::Decided(TestOutcome::Skipped(requirements::SKIP_REASON));
    }
    if test.get("expectLogMessages").is_some() {
        return Plan::Decided(TestOutcome::Skipped(requirements::LOGGING));
    }
    let operations = test.get("operations").and_then(Value::as_array);
    // UT-6: stepping a primary down needs a real election.
    if operations.into_iter().flatten().any(|o| {
        o.get("arguments")
            .and_then(|a| a.get("command"))
            .is_some_and(|c| c.get("replSetStepDown").is_some())
    }) {
        return Plan::Decided(TestOutcome::Skipped(requirements::ELECTION));
    }
    // UT-6: a mapReduce that must succeed needs server-side JavaScript.
    if operations.into_iter().flatten().any(|o| {
        o.get("name").and_then(Value::as_str) == Some("mapReduce") && o.get("expectError").is_none()
    }) {
        return Plan::Decided(TestOutcome::Skipped(requirements::SERVER_JS));
    }
    Plan::Run(topology, auth)
}

/// Runs test `index` of `file` on a fresh deployment of `topology` (with a SCRAM user when
/// `auth`), within [`TEST_LIMIT`].
async fn execute(
    file: &Value,
    index: usize,
    topology: deploy::Topology,
    auth: bool,
) -> TestOutcome {
    let Some(test) = file.get("tests").and_then(|t| t.get(index)) else {
        return TestOutcome::Failed(format!("harness: no test {index}"));
    };
    let started = std::time::Instant::now();
    let result = async {
        let cluster = deploy::Cluster::start(topology, auth)
            .await
            .map_err(|e| format!("harness: cannot start {}: {e}", topology.name()))?;
        let result = tokio::time::timeout(TEST_LIMIT, runner::run_test(file, test, &cluster))
            .await
            .unwrap_or_else(|_| Err(format!("test did not end within {TEST_LIMIT:?}")));
        cluster.shutdown().await;
        result
    }
    .await;
    if std::env::var_os("UNIFIED_TIMES").is_some() {
        let name = test
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        println!("TIME {:>6} ms {name}", started.elapsed().as_millis());
    }
    match result {
        Ok(()) => TestOutcome::Passed,
        Err(reason) => TestOutcome::Failed(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_testkit::{IngressLimit, RateLimit};
    use serde_json::json;

    fn run_one(file: Value) -> TestOutcome {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        runtime.block_on(local.run_until(execute(&file, 0, deploy::Topology::ReplicaSet, false)))
    }

    fn file(operations: Value) -> Value {
        json!({
            "schemaVersion": "1.0",
            "createEntities": [
                { "client": { "id": "c", "observeEvents": ["commandStartedEvent"] } },
                { "database": { "id": "d", "client": "c", "databaseName": "db" } },
                { "collection": { "id": "coll", "database": "d", "collectionName": "x" } }
            ],
            "initialData": [{ "databaseName": "db", "collectionName": "x", "documents": [{ "_id": 1 }] }],
            "tests": [{ "description": "t", "operations": operations }]
        })
    }

    /// UT-20: an expected error met by the test server's refusal (CommandNotFound) is a harness
    /// failure, never a pass.
    #[test]
    fn a_refusal_by_the_test_server_fails_the_test() {
        let outcome = run_one(file(json!([{
            "name": "runCommand", "object": "d",
            "arguments": { "command": { "collMod": "x" }, "commandName": "collMod" },
            "expectError": { "isError": true }
        }])));
        let TestOutcome::Failed(reason) = outcome else {
            panic!("passed: {outcome:?}");
        };
        assert!(reason.contains("refused command collMod"), "{reason}");
    }

    /// UT-14: an unknown argument is an error, never ignored.
    #[test]
    fn an_unknown_argument_fails_the_test() {
        let outcome = run_one(file(json!([{
            "name": "find", "object": "coll", "arguments": { "filter": {}, "hint": "x" }
        }])));
        assert!(
            matches!(&outcome, TestOutcome::Failed(r) if r.contains("unsupported argument hint")),
            "{outcome:?}"
        );
    }

    /// UT-18, UT-21, UT-13: a find through the product passes with its result, its event and
    /// the outcome; a wrong expected result fails.
    #[test]
    fn a_find_passes_and_a_wrong_result_fails() {
        let mut good = file(json!([{
            "name": "find", "object": "coll", "arguments": { "filter": {} },
            "expectResult": [{ "_id": 1 }]
        }]));
        good["tests"][0]["expectEvents"] = json!([{ "client": "c", "events": [
            { "commandStartedEvent": { "command": { "find": "x", "filter": {} }, "databaseName": "db" } }
        ] }]);
        good["tests"][0]["outcome"] =
            json!([{ "databaseName": "db", "collectionName": "x", "documents": [{ "_id": 1 }] }]);
        assert_eq!(run_one(good), TestOutcome::Passed);
        let bad = file(json!([{
            "name": "find", "object": "coll", "arguments": { "filter": {} },
            "expectResult": [{ "_id": 2 }]
        }]));
        assert!(matches!(run_one(bad), TestOutcome::Failed(_)));
    }

    /// UT-25, review10 finding 4, review11 finding 9: after a test that started a transaction,
    /// a failed teardown `killAllSessions` is reported beside the test's own failure, never in
    /// its place. The kill fails by the servers' ingress limit (no admission left: 462), set
    /// after the test's checks: nothing in UT-25's teardown order (fail points off, sessions
    /// ended, clients closed) lifts it.
    #[test]
    fn ut25_a_teardown_failure_keeps_the_tests_own_failure() {
        let mut failing = file(json!([
            { "name": "startTransaction", "object": "s" },
            { "name": "find", "object": "coll", "arguments": { "filter": {}, "session": "s" },
                "expectResult": [{ "_id": 2 }] }
        ]));
        let entities = failing["createEntities"].as_array_mut().expect("entities");
        entities.push(json!({ "session": { "id": "s", "client": "c" } }));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let local = tokio::task::LocalSet::new();
        let result = runtime.block_on(local.run_until(async {
            let cluster = deploy::Cluster::start(deploy::Topology::ReplicaSet, false)
                .await
                .expect("a deployment");
            let no_admission = IngressLimit::new(RateLimit::new(0.0, 0));
            let result = tokio::time::timeout(
                TEST_LIMIT,
                runner::run_test_then(&failing, &failing["tests"][0], &cluster, |cluster| {
                    for handle in cluster.handles() {
                        handle.set_ingress_limit(Some(no_admission));
                    }
                }),
            )
            .await
            .expect("the test ends");
            cluster.shutdown().await;
            result
        }));
        let Err(reason) = result else {
            panic!("the find's wrong result passed");
        };
        assert!(reason.starts_with("operation 1: "), "{reason}");
        assert!(
            reason.contains("; teardown: harness: killAllSessions: "),
            "{reason}"
        );
        assert!(reason.contains("462"), "{reason}");
    }

    /// UT-25 (review11 finding 9): only a test with a `startTransaction` or `withTransaction`
    /// operation, at any depth, gets the teardown `killAllSessions`.
    #[test]
    fn ut25_only_a_test_that_may_start_a_transaction_kills_all_sessions() {
        let with = |operations: Value| json!({ "operations": operations });
        assert!(runner::starts_transaction(&with(json!([
            { "name": "startTransaction", "object": "s" }
        ]))));
        assert!(runner::starts_transaction(&with(json!([
            { "name": "loop", "object": "testRunner", "arguments": { "operations": [
                { "name": "withTransaction", "object": "s", "arguments": { "callback": [] } }
            ] } }
        ]))));
        assert!(!runner::starts_transaction(&with(json!([
            { "name": "find", "object": "coll", "arguments": { "filter": {}, "session": "s" } }
        ]))));
        assert!(!runner::starts_transaction(&json!({})));
    }

    /// UT-8: only a test that may set a fail point gets the reduced heartbeat, wherever its
    /// `configureFailPoint` is (a `failPoint` argument or a command run directly).
    #[test]
    fn a_fail_point_anywhere_in_the_operations_is_found() {
        let through_runner = json!({ "operations": [{ "name": "failPoint", "object": "testRunner",
            "arguments": { "client": "c", "failPoint": { "configureFailPoint": "failCommand" } } }] });
        let direct = json!({ "operations": [{ "name": "runCommand", "object": "d",
            "arguments": { "command": { "configureFailPoint": "failCommand", "mode": "off" } } }] });
        let filter_key = json!({ "operations": [{ "name": "find", "object": "coll",
            "arguments": { "filter": { "configureFailPoint": { "$exists": false } } } }] });
        assert!(entities::may_set_fail_point(&through_runner));
        assert!(entities::may_set_fail_point(&direct));
        // A filter field of that name is still a possible fail point: the walk errs on the side
        // of a faster recovery, never of a missed one.
        assert!(entities::may_set_fail_point(&filter_key));
        assert!(!entities::may_set_fail_point(&json!({ "operations": [] })));
    }

    /// MO-4, UT-4 (the flaky sdam interruptInUse-pool-clear / hello-command-error /
    /// hello-timeout tests): a client `connectTimeoutMS` of at most 1,000 ms, or a
    /// `socketTimeoutMS` below 500 ms, makes a test run alone; longer ones, 0 (no limit) and
    /// other keys do not.
    #[test]
    fn mo4_a_short_connect_or_socket_timeout_makes_a_test_run_alone() {
        let with = |uri_options: Value| {
            json!({ "operations": [{ "name": "createEntities", "object": "testRunner",
                "arguments": { "entities": [{ "client": { "id": "c",
                    "uriOptions": uri_options } }] } }] })
        };
        let file = json!({});
        assert!(has_short_timeout(
            &file,
            &with(json!({ "connectTimeoutMS": 500 }))
        ));
        assert!(has_short_timeout(
            &file,
            &with(json!({ "connectTimeoutMS": 1000 }))
        ));
        assert!(has_short_timeout(
            &file,
            &with(json!({ "socketTimeoutMS": 250 }))
        ));
        assert!(!has_short_timeout(
            &file,
            &with(json!({ "connectTimeoutMS": 1001 }))
        ));
        assert!(!has_short_timeout(
            &file,
            &with(json!({ "connectTimeoutMS": 0 }))
        ));
        assert!(!has_short_timeout(
            &file,
            &with(json!({ "heartbeatFrequencyMS": 500 }))
        ));
        let in_file = json!({ "createEntities": [{ "client": { "id": "c",
            "uriOptions": { "connectTimeoutMS": 250 } } }] });
        assert!(has_short_timeout(&in_file, &json!({ "operations": [] })));
    }

    /// Review35 Z3, the run-command spec (SS-10): runCommand is never classified. A `find`
    /// goes to the primary though the client's `readPreference` is secondary (no
    /// `$readPreference`), and an `insert` carries no `txnNumber` (never a retryable write).
    #[test]
    fn z3_run_command_uses_the_primary_and_is_never_a_retryable_write() {
        let mut test = file(json!([
            { "name": "runCommand", "object": "d",
                "arguments": { "command": { "find": "x" }, "commandName": "find" } },
            { "name": "runCommand", "object": "d",
                "arguments": { "command": { "insert": "x", "documents": [{ "_id": 2 }] },
                    "commandName": "insert" } }
        ]));
        test["createEntities"][0]["client"]["uriOptions"] =
            json!({ "readPreference": "secondary" });
        test["tests"][0]["expectEvents"] = json!([{ "client": "c", "events": [
            { "commandStartedEvent": { "commandName": "find",
                "command": { "find": "x", "$readPreference": { "$$exists": false } } } },
            { "commandStartedEvent": { "commandName": "insert",
                "command": { "insert": "x", "lsid": { "$$exists": true },
                    "txnNumber": { "$$exists": false } } } }
        ] }]);
        assert_eq!(run_one(test), TestOutcome::Passed);
    }
}
