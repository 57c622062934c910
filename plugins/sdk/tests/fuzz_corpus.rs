//! Replays the committed `plugin_result` fuzz corpus (`fuzz/corpus/plugin_result/`, in the switch
//! repository) through the fuzz target's own body (`fuzz/harness/plugin_result.rs`): the result
//! decoding the host runs on every plugin call, checked on stable without nightly or cargo-fuzz.

mod plugin_result {
    include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/plugin_result.rs"));
}

include!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/harness/replay.rs"));

#[test]
fn plugin_result_corpus_replays_clean() {
    replay(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")), "plugin_result", plugin_result::check);
}
