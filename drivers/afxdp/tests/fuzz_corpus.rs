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

include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/replay.rs"));

#[test]
fn xsk_ring_corpus_replays_clean() {
    replay(std::path::Path::new(ROOT), "xsk_ring", xsk_ring::check);
}

#[test]
fn umem_desc_corpus_replays_clean() {
    replay(std::path::Path::new(ROOT), "umem_desc", umem_desc::check);
}
