//! The spec-test harness: one test case per JSON file, named by its path under the corpus root,
//! then a `suite: passed/total` line per suite.
//!
//! The corpus comes from `$MONGODB_SPECS_DIR`, else `../shared/specifications` beside the checkout.
//! Without it the run is reported as ignored, except under `CI=true`, where it fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use libtest_mimic::{Arguments, Failed, Trial};
use spec_tests::{corpus, Suite, SUITES};

/// Passed and run counts per suite, filled in by the trials as they finish.
type Tally = Arc<Mutex<BTreeMap<&'static str, (usize, usize)>>>;

fn main() {
    let args = Arguments::from_args();
    let root = corpus::root();
    let tally: Tally = Arc::default();
    let mut trials = Vec::new();
    if root.join("source").is_dir() {
        for suite in SUITES {
            trials.extend(suite_trials(suite, &root, &tally));
        }
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
    conclusion.exit();
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
