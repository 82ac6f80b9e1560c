//! How glibc's allocator treats the large buffers request bodies need
//! (docs/design/reduction.md, rule 8).
//!
//! By default glibc maps each allocation of 128 KiB and more on its own and
//! returns memory at the top of its heaps to the kernel as soon as 128 KiB
//! of it is free, raising both bounds only as it meets larger blocks. A
//! burst of 4 MB bodies arriving together then costs fresh pages every
//! time: zeroed by the kernel on first touch and unmapped on free, about a
//! fifth of the gateway's CPU for those bodies. Serving blocks up to
//! `MMAP_THRESHOLD` from the heaps, which keep up to `TRIM_THRESHOLD`
//! free at their top, lets the next body reuse the last one's pages.

use std::ffi::OsStr;

/// The largest block served from the heaps: 32 MiB (glibc's largest on
/// 64-bit), above the 4 MiB body limit and a 25 MB form read whole.
const MMAP_THRESHOLD: i32 = 32 << 20;

/// The free memory a heap keeps at its top before it returns it. Measured
/// with ten 4 MB bodies arriving together, each copied into one buffer as
/// it came (a read path since changed): 32 MiB kept 150-186 MB resident
/// after the burst for 6.7 ms of CPU a body, 16 MiB 96-115 MB for 6.3-6.8
/// ms, 8 MiB 65-74 MB for 7.3-7.7 ms, glibc's defaults 44-67 MB for 7.9-8.5.
/// With the read path as it is (frames joined aside), 16 MiB: 101-163 MB
/// and 7.4-7.6 ms, against glibc's defaults 62-157 MB and 8.0-9.2 ms.
const TRIM_THRESHOLD: i32 = 16 << 20;

/// Apply both to this process's allocator, unless `tunables` (the
/// process's `GLIBC_TUNABLES`) already sets malloc's own; returns whether it
/// was applied. Elsewhere than glibc it does nothing.
pub fn keep_large_buffers(tunables: Option<&OsStr>) -> bool {
    if tunables.is_some_and(|t| t.to_string_lossy().contains("glibc.malloc.")) {
        return false;
    }
    apply()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() -> bool {
    // SAFETY: mallopt changes two of the allocator's parameters, under its own lock.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user's own malloc tunables win: slogate leaves the allocator alone.
    #[test]
    fn a_users_malloc_tunables_are_left_as_they_are() {
        assert!(!keep_large_buffers(Some(OsStr::new("glibc.malloc.trim_threshold=1048576"))));
    }

    /// Without them, glibc takes both settings (mallopt answers 1 for each).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn glibc_takes_the_settings() {
        assert!(keep_large_buffers(Some(OsStr::new("glibc.pthread.rseq=0"))));
        assert!(keep_large_buffers(None));
    }
}
