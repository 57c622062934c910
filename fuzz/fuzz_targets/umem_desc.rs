#![no_main]

mod harness {
    include!("../harness/umem_desc.rs");
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::check(data));
