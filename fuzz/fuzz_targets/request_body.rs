//! The request-body reader: its quick path and its general path read the
//! same head and write the same request, or both reject the body.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else { return };
    let priority = match flags % 3 {
        0 => None,
        1 => Some(0),
        _ => Some(1),
    };
    slogate::fuzzing::request_body(body, flags & 4 != 0, priority);
});
