#![no_main]

mod harness {
    include!("../harness/plugin_result.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::check(data));
