//! Finding the specifications corpus and its test files.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{CaseResult, Outcome};

/// The environment variable that names the corpus root (the directory holding `source/`).
pub const SPECS_DIR_VAR: &str = "MONGODB_SPECS_DIR";

/// Where the corpus should be: `$MONGODB_SPECS_DIR` if set, else `../shared/specifications`
/// beside the workspace checkout.
pub fn root() -> PathBuf {
    match std::env::var_os(SPECS_DIR_VAR) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/specifications"),
    }
}

/// Whether a run must fail when the corpus is missing: under CI (`CI=true`).
pub fn required() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Every `*.json` file under `dir`, recursively, sorted by path so runs are reproducible.
pub fn json_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "json") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

/// Reads and parses one JSON file.
pub fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("invalid JSON: {e}"))
}

/// Runs `run_case` on every case of the file's `tests` array, with the case's `description`.
pub(crate) fn run_cases(
    path: &Path,
    run_case: impl Fn(&str, &Value) -> Outcome,
) -> Result<Vec<CaseResult>, String> {
    let json = read_json(path)?;
    let cases = json
        .get("tests")
        .and_then(Value::as_array)
        .ok_or("missing `tests` array")?;
    Ok(cases
        .iter()
        .map(|case| {
            let description = case
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string();
            let outcome = run_case(&description, case);
            CaseResult {
                description,
                outcome,
            }
        })
        .collect())
}
