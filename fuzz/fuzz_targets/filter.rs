#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pangea_fuzz::filter(data));
