//! A scheduling hint for the gateway's threads: the shortest time slice
//! Linux's fair scheduler grants (EEVDF, Linux 6.12 and later).
//!
//! Every event of every stream wakes a gateway thread twice on its way
//! through (the replica's write, then the client's read), so when the
//! gateway shares cores with other busy processes, how long a woken thread
//! waits for a core is added to every token. With the default slice the
//! thread that is running keeps the core until its slice is used up (1.4 ms
//! on the machines this was developed on); a thread that asks for a short slice
//! gets an earlier deadline and takes the core when it wakes. Its share of
//! CPU is unchanged (that is set by its weight, which stays the default): it
//! runs sooner, in shorter turns.
//!
//! On a core of its own the gateway never waits, and the hint changes
//! nothing; it helps only where the gateway shares cores with other busy
//! processes (docs/operations.md gives what it measured). Off by default
//! (`server.short_sched_slice`).
//!
//! Before 6.12 the kernel read `sched_runtime` only for SCHED_DEADLINE, so
//! the request should be accepted and the slice ignored there (not tried:
//! this project's machines run 6.18). Where the call is refused (a seccomp
//! profile, another OS) the default slices stay and nothing else changes.

use std::io;

/// The slice requested, in nanoseconds: the least the kernel grants (0.1 ms).
pub(crate) const SLICE_NS: u64 = 100_000;

/// Ask for [`SLICE_NS`] slices on the calling thread (keeping its policy,
/// SCHED_OTHER, and its nice value 0).
#[cfg(target_os = "linux")]
pub(crate) fn request_short_slice() -> io::Result<()> {
    // `struct sched_attr` from the kernel's uapi (sched_setattr(2)), as of
    // its second version (with the utilisation clamps).
    #[repr(C)]
    struct SchedAttr {
        size: u32,
        sched_policy: u32,
        sched_flags: u64,
        sched_nice: i32,
        sched_priority: u32,
        sched_runtime: u64,
        sched_deadline: u64,
        sched_period: u64,
        sched_util_min: u32,
        sched_util_max: u32,
    }
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        sched_policy: libc::SCHED_OTHER as u32,
        sched_flags: 0,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: SLICE_NS,
        sched_deadline: 0,
        sched_period: 0,
        sched_util_min: 0,
        sched_util_max: 0,
    };
    // SAFETY: sched_setattr(pid 0 = this thread, attr, flags 0) reads
    // `attr.size` bytes from a live, properly laid out `sched_attr`, and
    // writes nothing.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0u32) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
pub fn request_short_slice() -> io::Result<()> {
    Err(io::Error::new(io::ErrorKind::Unsupported, "time slices are a Linux scheduler setting"))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The slice this kernel reports for the calling thread, when it reports one (6.12+).
    fn reported_slice() -> Option<u64> {
        let tid = unsafe { libc::gettid() };
        let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/sched")).ok()?;
        let line = text.lines().find(|l| l.trim_start().starts_with("se.slice"))?;
        line.rsplit(':').next()?.trim().parse().ok()
    }

    /// The running kernel's (major, minor) version.
    fn kernel() -> (u32, u32) {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("kernel release");
        let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
        (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
    }

    /// What the module docs promise, per kernel: from 6.12 the thread runs
    /// with the short slice (the kernel reports it); before, the request is
    /// accepted and the slice ignored.
    #[test]
    fn the_thread_gets_the_short_slice_where_the_kernel_has_slices() {
        // On a thread of its own: the test harness's threads keep theirs.
        std::thread::spawn(|| {
            let before = reported_slice();
            request_short_slice().expect("sched_setattr is accepted");
            if kernel() >= (6, 12) {
                let before = before.expect("a 6.12+ kernel reports se.slice in /proc/<pid>/task/<tid>/sched");
                assert_ne!(before, SLICE_NS, "the default slice is already the short one; the test would prove nothing");
                assert_eq!(reported_slice(), Some(SLICE_NS), "the kernel runs the thread with the short slice");
            } else {
                assert_eq!(reported_slice(), before, "before 6.12 the request changes nothing the kernel reports");
            }
        })
        .join()
        .expect("thread");
    }
}
