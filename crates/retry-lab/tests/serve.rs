//! `retry-lab serve` as a process: it prints its URI, and `retry-lab probe` connects to it with
//! TLS (the generated CA as `tlsCAFile`, TL-2).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Polls of the probe before it is taken for hung: 1200 × 50 ms. Nothing is asserted about time.
const POLLS: u32 = 1200;

/// The serve process, killed when the test ends however it ends.
struct Serving(Child);

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `retry-lab serve --tls` with `extra` options, probes the URI it prints after `edit`,
/// and returns whether the probe succeeded with its output.
fn serve_and_probe(name: &str, extra: &[&str], edit: impl Fn(&str) -> String) -> (bool, String) {
    let ca = std::env::temp_dir().join(format!(
        "retry-lab-serve-test-{name}-{}.pem",
        std::process::id()
    ));
    let mut serving = Serving(
        Command::new(env!("CARGO_BIN_EXE_retry-lab"))
            .args(["serve", "--tls", "--tls-ca-file"])
            .arg(&ca)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("retry-lab serve starts"),
    );
    // The first line is the URI; the read ends at the newline or when the process exits.
    let mut uri = String::new();
    BufReader::new(serving.0.stdout.take().expect("its stdout"))
        .read_line(&mut uri)
        .expect("the URI line");
    let uri = uri.trim().to_string();
    assert!(uri.starts_with("mongodb://127.0.0.1:"), "{uri:?}");
    assert!(uri.contains("tls=true&tlsCAFile="), "{uri}");
    let mut probe = Command::new(env!("CARGO_BIN_EXE_retry-lab"))
        .args(["probe", &edit(&uri)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("retry-lab probe starts");
    let mut finished = false;
    for _ in 0..POLLS {
        if probe
            .try_wait()
            .expect("the probe can be waited for")
            .is_some()
        {
            finished = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if !finished {
        let _ = probe.kill();
    }
    let out = probe.wait_with_output().expect("the probe's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(finished, "the probe hung:\n{stdout}\n{stderr}");
    drop(serving);
    let _ = std::fs::remove_file(&ca);
    (out.status.success(), format!("{stdout}\n{stderr}"))
}

#[test]
fn probe_connects_with_tls_to_serve() {
    let (ok, output) = serve_and_probe("tls", &[], str::to_string);
    assert!(ok, "{output}");
    assert!(output.contains("ping succeeded"), "{output}");
}

/// Issue #13's done-when: TLS and SCRAM-SHA-256 together; a wrong password fails and no
/// password is printed.
#[test]
fn probe_connects_with_tls_and_scram_to_serve() {
    let with = |credentials: &'static str| {
        move |uri: &str| uri.replacen("mongodb://", &format!("mongodb://{credentials}@"), 1)
    };
    let (ok, output) = serve_and_probe(
        "scram",
        &["--user", "alice:s3cret-pw"],
        with("alice:s3cret-pw"),
    );
    assert!(ok, "{output}");
    assert!(output.contains("ping succeeded"), "{output}");
    assert!(!output.contains("s3cret-pw"), "{output}");
    let (ok, output) = serve_and_probe(
        "scram-wrong",
        &["--user", "alice:s3cret-pw"],
        with("alice:not-it"),
    );
    assert!(!ok, "{output}");
    assert!(
        !output.contains("not-it") && !output.contains("s3cret-pw"),
        "{output}"
    );
}
