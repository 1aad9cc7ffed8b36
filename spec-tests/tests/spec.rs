//! The spec-test harness: one test case per JSON file, named by its path under the corpus root,
//! then a `suite: passed/total` line per suite; then one trial per unified-format suite and its
//! `unified/<suite>: passed/total (skipped s)` line (issue 11).
//!
//! The corpus comes from `$MONGODB_SPECS_DIR`, else `../shared/specifications` beside the checkout.
//! Without it the run is reported as ignored, except under `CI=true`, where it fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};
use spec_tests::unified::{self, Deployment, SuiteReport, UNIFIED_SUITES};
use spec_tests::{corpus, CaseSuite, Outcome, Suite, CASE_SUITES, SUITES};

/// Passed and run counts per suite, filled in by the trials as they finish.
type Tally = Arc<Mutex<BTreeMap<&'static str, (usize, usize)>>>;

/// Per case suite: passed, total, and the skip reasons with their counts.
type CaseTally = BTreeMap<&'static str, (usize, usize, BTreeMap<String, usize>)>;
/// The unified suites' reports, filled in by their trials.
type Reports = Arc<Mutex<BTreeMap<&'static str, SuiteReport>>>;

fn main() {
    let args = Arguments::from_args();
    let root = corpus::root();
    let tally: Tally = Arc::default();
    let reports: Reports = Arc::default();
    let mut trials = Vec::new();
    let mut case_tally = CaseTally::new();
    if root.join("source").is_dir() {
        for suite in SUITES {
            trials.extend(suite_trials(suite, &root, &tally));
        }
        for suite in CASE_SUITES {
            trials.extend(case_suite_trials(suite, &root, &mut case_tally));
        }
        trials.extend(unified_trials(&root, &reports));
    } else {
        let message = format!(
            "spec corpus not found at {} (set {})",
            root.display(),
            corpus::SPECS_DIR_VAR
        );
        eprintln!("{message}");
        let missing = Trial::test("corpus", move || Err(Failed::from(message.as_str())));
        trials.push(missing.with_ignored_flag(!corpus::required()));
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if let Ok(tally) = tally.lock() {
        for suite in SUITES {
            if let Some((passed, total)) = tally.get(suite.name) {
                println!("{}: {passed}/{total}", suite.name);
            }
        }
    }
    for suite in CASE_SUITES {
        if let Some((passed, total, skips)) = case_tally.get(suite.name) {
            let skipped: usize = skips.values().sum();
            println!("{}: {passed}/{total} ({skipped} skipped)", suite.name);
            for (reason, count) in skips {
                println!("  skipped {count}: {reason}");
            }
        }
    }
    if let Ok(reports) = reports.lock() {
        for suite in UNIFIED_SUITES {
            if let Some(report) = reports.get(suite.name) {
                println!("{}", report.line(suite.name));
                if std::env::var_os("UNIFIED_VERBOSE").is_some() {
                    println!("  skipped: {:?}", report.skipped);
                    println!("  failed: {:?}", report.failed);
                }
            }
        }
    }
    conclusion.exit();
}

/// One trial per case of `suite` (skipped cases are ignored trials), plus one that checks the
/// file and case counts. Cases are pure and fast, so they run while the trials are listed.
fn case_suite_trials(suite: &'static CaseSuite, root: &Path, tally: &mut CaseTally) -> Vec<Trial> {
    let dir = root.join(suite.dir);
    let files = match corpus::json_files(&dir) {
        Ok(files) => files,
        Err(e) => {
            let message = format!("cannot list {}: {e}", dir.display());
            return vec![Trial::test(suite.dir, move || Err(message.into()))];
        }
    };
    let entry = tally.entry(suite.name).or_default();
    let mut trials = Vec::new();
    let file_count = files.len();
    for path in files {
        let name = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let cases = match (suite.run)(&path) {
            Ok(cases) => cases,
            Err(message) => {
                trials.push(Trial::test(name, move || Err(message.into())));
                continue;
            }
        };
        for (i, case) in cases.into_iter().enumerate() {
            let trial_name = format!("{name}#{i} {}", case.description);
            entry.1 += 1;
            match case.outcome {
                Outcome::Passed => {
                    entry.0 += 1;
                    trials.push(Trial::test(trial_name, || Ok(())));
                }
                Outcome::Failed(message) => {
                    trials.push(Trial::test(trial_name, move || Err(message.into())));
                }
                Outcome::Skipped(reason) => {
                    let trial_name = format!("{trial_name} [skipped: {reason}]");
                    *entry.2.entry(reason).or_default() += 1;
                    trials.push(Trial::test(trial_name, || Ok(())).with_ignored_flag(true));
                }
            }
        }
    }
    let cases = entry.1;
    trials.push(Trial::test(
        format!("{}/file and case count", suite.dir),
        move || {
            if (file_count, cases) == (suite.expected_files, suite.expected_cases) {
                Ok(())
            } else {
                Err(format!(
                    "expected {} files and {} cases, found {file_count} and {cases}",
                    suite.expected_files, suite.expected_cases
                )
                .into())
            }
        },
    ));
    trials
}

/// UT-5: the deployment's facts, asked of a retry-testkit server started on 127.0.0.1.
fn probe_deployment() -> Result<Deployment, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let probe = async {
            let server = retry_testkit::TestServer::start(unified::deploy::server_config(
                retry_testkit::Role::Standalone,
            ))
            .await
            .map_err(|e| e.to_string())?;
            let mut client = retry_testkit::RawClient::connect(server.address())
                .await
                .map_err(|e| e.to_string())?;
            let reply = client
                .command(bson::doc! { "buildInfo": 1, "$db": "admin" })
                .await
                .map_err(|e| e.to_string())?;
            server.shutdown().await;
            let parts = reply.get_array("versionArray").map_err(|e| e.to_string())?;
            let mut version = [0u32; 3];
            for (slot, part) in version.iter_mut().zip(parts) {
                *slot = part
                    .as_i32()
                    .and_then(|p| u32::try_from(p).ok())
                    .ok_or("versionArray holds non-integers")?;
            }
            Ok(Deployment {
                version,
                auth: false,
                topology: "single",
            })
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), probe)
            .await
            .map_err(|_| String::from("buildInfo probe timed out"))?
    })
}

/// One trial per unified suite: it fails when the suite cannot be loaded and counted, or when
/// its failures differ from its known failures ([`unified::UnifiedSuite::known_failures`]: a
/// failing test not listed, a listed test that passes or did not run); each failing test is
/// counted in the suite's line (issue 11, item 4).
fn unified_trials(root: &Path, reports: &Reports) -> Vec<Trial> {
    let deployment = match probe_deployment() {
        Ok(d) => Arc::new(d),
        Err(e) => {
            return vec![Trial::test("unified/deployment", move || {
                Err(Failed::from(e.as_str()))
            })]
        }
    };
    UNIFIED_SUITES
        .iter()
        .map(|suite| {
            let root = root.to_path_buf();
            let reports = Arc::clone(reports);
            let deployment = Arc::clone(&deployment);
            Trial::test(format!("unified/{}", suite.name), move || {
                let report = unified::run_suite(suite, &root, &deployment)?;
                let surprises = suite.surprises(&report);
                if let Ok(mut reports) = reports.lock() {
                    reports.insert(suite.name, report);
                }
                let filtered = std::env::var_os("UNIFIED_FILTER").is_some();
                if !surprises.is_empty() && !filtered {
                    return Err(format!(
                        "unified/{}: not as expected:\n  {}",
                        suite.name,
                        surprises.join("\n  ")
                    )
                    .into());
                }
                Ok(())
            })
        })
        .collect()
}

/// One trial per file of `suite`, plus one that checks the file count.
fn suite_trials(suite: &'static Suite, root: &Path, tally: &Tally) -> Vec<Trial> {
    let dir = root.join(suite.dir);
    let files = match corpus::json_files(&dir) {
        Ok(files) => files,
        Err(e) => {
            let message = format!("cannot list {}: {e}", dir.display());
            return vec![Trial::test(suite.dir, move || Err(message.into()))];
        }
    };
    let count = files.len();
    let mut trials = vec![Trial::test(
        format!("{}/file count", suite.dir),
        move || {
            if count == suite.expected_files {
                Ok(())
            } else {
                Err(format!("expected {} files, found {count}", suite.expected_files).into())
            }
        },
    )];
    for path in files {
        let name = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let tally = Arc::clone(tally);
        trials.push(Trial::test(name, move || {
            let result = (suite.run)(&path);
            if let Ok(mut tally) = tally.lock() {
                let entry = tally.entry(suite.name).or_default();
                entry.0 += usize::from(result.is_ok());
                entry.1 += 1;
            }
            result.map_err(Failed::from)
        }));
    }
    trials
}
