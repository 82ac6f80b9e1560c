//! The config parser: any text is a config or a list of problems; never a panic.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    slogate::fuzzing::config(&String::from_utf8_lossy(data));
});
