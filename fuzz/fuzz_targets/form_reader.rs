//! The multipart form reader: where it accepts a form, in whatever frames
//! it arrives, the replica's parser (its reference, python-multipart's
//! rules) reads the same `model` and `stream`, and no `priority`. The
//! first byte says how many cut points follow; the boundary is `XyZ`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else { return };
    let n = (n as usize % 8).min(rest.len());
    let (cuts, body) = rest.split_at(n);
    let cuts: Vec<usize> = cuts.iter().map(|c| *c as usize * body.len() / 255).collect();
    slogate::fuzzing::form_reader(body, b"XyZ", &cuts);
});
