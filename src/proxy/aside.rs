//! Reading a large request body (parsing its JSON, finding a form's fields)
//! runs aside: on a thread of its own at a lower CPU priority than the
//! workers, so the streams those workers carry go first whenever the cores
//! are busy (docs/design/reduction.md, rule 7).

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use crate::error::GatewayError;

/// Bodies from this size up are read aside. Parsing runs at roughly a
/// gigabyte a second: below this, a body holds a worker for well under a
/// millisecond.
pub(super) const LARGE_BODY: usize = 256 * 1024;

/// The aside thread's nice value. Against a busy worker (nice 0) it gets
/// about a tenth of a core, so a few milliseconds of parsing spread over
/// tens while streams wait on nothing; on idle cores it runs at full speed.
const NICE: i32 = 10;

type Job = Box<dyn FnOnce() + Send>;

/// The aside thread's queue, the thread started on first use; `None` if it
/// could not be started.
fn queue() -> Option<&'static Mutex<mpsc::Sender<Job>>> {
    static QUEUE: OnceLock<Option<Mutex<mpsc::Sender<Job>>>> = OnceLock::new();
    QUEUE
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<Job>();
            let spawned = std::thread::Builder::new().name("slogate-aside".into()).spawn(move || {
                lower_priority();
                while let Ok(job) = rx.recv() {
                    // A job that panics drops its answer; the thread goes on.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
            });
            spawned.ok().map(|_| Mutex::new(tx))
        })
        .as_ref()
}

/// On Linux a thread's nice value is its own (`PRIO_PROCESS` with its
/// thread id); lowering it needs no privilege.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: gettid and setpriority read no memory of ours; a failure
    // leaves the thread at the workers' priority, as before.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, NICE);
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// A multi-thread runtime runs this task: a worker can hand its other
/// tasks over (tests run on a current-thread one).
pub(super) fn multi_thread() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// `f`, work on a request body of `len` bytes: aside for a large body in a
/// multi-thread runtime, inline otherwise (small bodies; tests on a
/// current-thread runtime). Without the aside thread, a large body's
/// worker hands its other tasks over while `f` runs.
pub(super) async fn run<R: Send + 'static>(len: usize, f: impl FnOnce() -> R + Send + 'static) -> Result<R, GatewayError> {
    if len < LARGE_BODY || !multi_thread() {
        return Ok(f());
    }
    let Some(sender) = queue().and_then(|q| q.lock().ok().map(|s| s.clone())) else {
        return Ok(tokio::task::block_in_place(f));
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    if let Err(mpsc::SendError(job)) = sender.send(job) {
        tokio::task::block_in_place(job);
    }
    rx.await.map_err(|_| GatewayError::Internal("reading the request body failed".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_large_body_is_read_on_the_aside_thread_at_a_lower_priority() {
        let (name, nice) = run(LARGE_BODY, || {
            let name = std::thread::current().name().map(str::to_string);
            // SAFETY: getpriority reads no memory of ours.
            #[cfg(target_os = "linux")]
            let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::syscall(libc::SYS_gettid) as libc::id_t) };
            #[cfg(not(target_os = "linux"))]
            let nice = NICE;
            (name, nice)
        })
        .await
        .expect("ran");
        assert_eq!(name.as_deref(), Some("slogate-aside"));
        assert_eq!(nice, NICE);
        let small = run(LARGE_BODY - 1, || std::thread::current().name().map(str::to_string)).await.expect("ran");
        assert_ne!(small.as_deref(), Some("slogate-aside"), "a small body is read inline");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_job_that_panics_is_an_error_and_the_thread_goes_on() {
        let failed = run(LARGE_BODY, || -> u32 { panic!("a parser bug") }).await;
        assert!(matches!(failed, Err(GatewayError::Internal(_))));
        assert_eq!(run(LARGE_BODY, || 7).await.expect("the next job runs"), 7);
    }
}
