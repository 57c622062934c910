#![no_main]

mod harness {
    include!("../harness/wire.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::check(data));
