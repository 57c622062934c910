// Shared by the stable replay tests (each `include!`s it): runs a target's body on every file
// of its committed corpus and names the files that fail.

/// Runs `check` on every file of `fuzz/corpus/<target>/` under `root`, naming the files that fail.
fn replay(root: &std::path::Path, target: &str, check: fn(&[u8])) {
    let dir = root.join("fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus in {}", dir.display());
    let failed: Vec<String> = files
        .iter()
        .filter(|p| {
            let data = std::fs::read(p).unwrap();
            std::panic::catch_unwind(|| check(&data)).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{} of {} {target} corpus files fail: {failed:?}", failed.len(), files.len());
}
