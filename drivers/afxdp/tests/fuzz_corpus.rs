//! Replays the committed `xsk_ring` and `umem_desc` fuzz corpora (`fuzz/corpus/`) through the
//! fuzz targets' own bodies (`fuzz/harness/`), so the inputs libFuzzer found, crashes included,
//! stay checked on stable without nightly or cargo-fuzz. No socket or kernel is involved.

mod xsk_ring {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/xsk_ring.rs"));
}

mod umem_desc {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/umem_desc.rs"));
}

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Runs `check` on every file of `fuzz/corpus/<target>/`, naming the files that fail.
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

#[test]
fn xsk_ring_corpus_replays_clean() {
    replay(std::path::Path::new(ROOT), "xsk_ring", xsk_ring::check);
}

#[test]
fn umem_desc_corpus_replays_clean() {
    replay(std::path::Path::new(ROOT), "umem_desc", umem_desc::check);
}
