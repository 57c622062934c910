//! Replays the committed `wire` fuzz corpus (`fuzz/corpus/wire/`) through the fuzz target's own
//! body (`fuzz/harness/wire.rs`), so the inputs libFuzzer found, crashes included, stay checked
//! on stable without nightly or cargo-fuzz.

mod wire {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/wire.rs"));
}

include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/replay.rs"));

#[test]
fn wire_corpus_replays_clean() {
    replay(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")), "wire", wire::check);
}
