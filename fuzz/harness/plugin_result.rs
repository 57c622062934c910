// The `plugin_result` fuzz target's body, shared verbatim (via `include!`) by the libFuzzer
// target and by `plugins/sdk/tests/fuzz_corpus.rs`, which replays the committed corpus on stable.
//
// The host decodes a plugin's `process` result with exactly these SDK functions
// (`wasmswitch-plugin-host`'s `decode_verdicts` = `split_result` + a kind match per 4-byte record
// + `counter_deltas`); they live in the dependency-free SDK, so no wasmtime is built here.
//
// Input: byte 0 is the batch size the host asked about (0..=255), the rest is the guest's result.

use wasmswitch_plugin_sdk::abi::{self, Verdict};

pub fn check(data: &[u8]) {
    let Some((&count, result)) = data.split_first() else { return };
    let count = count as usize;
    let want = count * abi::VERDICT_LEN;
    match abi::split_result(result, count) {
        Ok((verdicts, trailer)) => {
            assert_eq!(verdicts.len(), want);
            assert_eq!(verdicts.len() + trailer.len(), result.len());
            assert_eq!(trailer.len() % abi::COUNTER_DELTA_LEN, 0);
            let deltas: Vec<(u32, u64)> = abi::counter_deltas(trailer).collect();
            assert!(deltas.len() <= abi::MAX_COUNTER_DELTAS);
            assert_eq!(deltas.len() * abi::COUNTER_DELTA_LEN, trailer.len(), "every trailer byte is read");
            // The records re-encode to the same bytes.
            let mut again = Vec::with_capacity(trailer.len());
            for (id, d) in &deltas {
                abi::push_counter_delta(&mut again, *id, *d);
            }
            assert_eq!(again, trailer);
            for r in verdicts.chunks_exact(abi::VERDICT_LEN) {
                let r = [r[0], r[1], r[2], r[3]];
                match Verdict::decode(r) {
                    None => assert!(r[0] > abi::kind::HOST_COPY, "known kind {} refused", r[0]),
                    Some(v) => {
                        let e = v.encode();
                        // Kind and redirect port survive; the pad byte (and unused bytes) need not.
                        assert_eq!(e[0], r[0]);
                        assert_eq!(Verdict::decode(e), Some(v));
                        if let Verdict::Redirect(p) = v {
                            assert_eq!(p, u16::from_le_bytes([r[2], r[3]]));
                        }
                    }
                }
            }
        }
        Err(e) => {
            let trailer = result.len().checked_sub(want);
            let ok_shape = trailer.is_some_and(|t| {
                t % abi::COUNTER_DELTA_LEN == 0 && t / abi::COUNTER_DELTA_LEN <= abi::MAX_COUNTER_DELTAS
            });
            assert!(!ok_shape, "a well-shaped result refused: {e}");
            assert!(e.contains(&format!("{count} packets")), "the error names the batch: {e}");
        }
    }
}
