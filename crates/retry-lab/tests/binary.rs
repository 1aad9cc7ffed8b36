//! The `retry-lab` binary: exit codes and what it prints.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Polls of a running binary before it is taken for hung and killed: 1200 × 50 ms, far above
/// any run here. Nothing is asserted about how long a run takes.
const POLLS: u32 = 1200;

fn retry_lab(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_retry-lab"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    for _ in 0..POLLS {
        if child
            .try_wait()
            .expect("the binary can be waited for")
            .is_some()
        {
            return child.wait_with_output().expect("its output");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().expect("a hung binary can be killed");
    panic!("retry-lab {args:?} hung");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_small_demo_prints_its_table_and_succeeds() {
    // One router that admits exactly two requests: the counts are exact.
    let out = retry_lab(&[
        "--operations",
        "4",
        "--concurrency",
        "2",
        "--servers",
        "1",
        "--capacity",
        "0",
        "--burst",
        "2",
        "--policies",
        "none",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("amplification"), "{stdout}");
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("| none"))
        .unwrap_or_else(|| panic!("no row for none in\n{stdout}"))
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    // policy, operations, successes, failures, attempts, amplification, retargets, shed
    assert_eq!(
        row[..8],
        ["none", "4", "2", "2", "4", "1.00x", "0", "2"],
        "{stdout}"
    );
    // Not a terminal: no progress bars.
    assert!(!stderr.contains("ops"), "{stderr}");
}

#[test]
fn bad_options_exit_with_a_message_that_names_them() {
    for (args, named) in [
        (
            &["probe", "mongodb://127.0.0.1/?maxAdaptiveRetries=-1"][..],
            &["maxAdaptiveRetries", "-1"][..],
        ),
        (
            &["probe", "mongodb://127.0.0.1/?heartbeatFrequencyMS=10"][..],
            &["heartbeatFrequencyMS", "10"][..],
        ),
        (
            &["probe", "postgres://db"][..],
            &["uri", "postgres://db"][..],
        ),
        (&["--concurrency", "0"][..], &["--concurrency", "0"][..]),
    ] {
        let out = retry_lab(args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        for name in named {
            assert!(stderr.contains(name), "{args:?}: {stderr}");
        }
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
