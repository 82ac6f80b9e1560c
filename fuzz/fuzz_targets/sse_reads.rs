//! The SSE observer (parser, usage cutter, held-back partial events): what
//! the client gets does not depend on how the replica's stream was cut
//! into reads. The first byte says how many cut points follow.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else { return };
    let n = (n as usize % 8).min(rest.len());
    let (cuts, stream) = rest.split_at(n);
    slogate::fuzzing::sse_reads(stream, cuts);
});
