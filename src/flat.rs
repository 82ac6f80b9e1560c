//! Small vectored writes as one plain write. A socket's `writev` goes
//! through the kernel's file layer (the iovec imported, the file's
//! position taken) where `send` goes straight to the socket; hyper writes
//! an answer's head and body (and a streamed event's chunk size, data and
//! end) as separate slices. Under 4 KiB they are copied into one buffer
//! kept per thread and sent with one `send`; larger writes stay vectored,
//! where the copy would cost more than the system call saves. The rule and
//! its measurement: docs/design/replica-connections.md, rule 11.

use std::cell::RefCell;
use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The most bytes copied into one write.
pub(crate) const FLAT_MAX: usize = 4096;

thread_local! {
    static FLAT: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(FLAT_MAX));
}

/// Write `bufs` to `w`: one plain write of them all when they are several
/// and small, else as they are.
pub(crate) fn poll_write_flat<W: AsyncWrite + ?Sized>(
    w: Pin<&mut W>,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<std::io::Result<usize>> {
    let mut filled = bufs.iter().filter(|b| !b.is_empty());
    let Some(first) = filled.next() else { return Poll::Ready(Ok(0)) };
    if filled.next().is_none() {
        return w.poll_write(cx, first);
    }
    if bufs.iter().map(|b| b.len()).sum::<usize>() > FLAT_MAX {
        return w.poll_write_vectored(cx, bufs);
    }
    FLAT.with_borrow_mut(|flat| {
        flat.clear();
        for b in bufs {
            flat.extend_from_slice(b);
        }
        w.poll_write(cx, flat)
    })
}

/// A stream whose vectored writes go as [`poll_write_flat`] writes them
/// (a client's plain TCP connection, served by hyper).
pub(crate) struct Flat<T>(pub(crate) T);

impl<T: AsyncRead + Unpin> AsyncRead for Flat<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Flat<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        poll_write_flat(Pin::new(&mut self.get_mut().0), cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A writer that counts its plain and vectored writes.
    #[derive(Default)]
    struct Counting {
        plain: usize,
        vectored: usize,
        got: Vec<u8>,
    }

    impl AsyncWrite for Counting {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            this.plain += 1;
            this.got.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_write_vectored(self: Pin<&mut Self>, _: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            this.vectored += 1;
            bufs.iter().for_each(|b| this.got.extend_from_slice(b));
            Poll::Ready(Ok(bufs.iter().map(|b| b.len()).sum()))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// An event's chunk size, data and end go as one plain write; one
    /// slice among empty ones as a plain write of it; slices over the
    /// limit together as one vectored write.
    #[tokio::test]
    async fn small_slices_go_as_one_plain_write_and_large_ones_vectored() {
        let write = |slices: Vec<Vec<u8>>| async move {
            let mut w = Flat(Counting::default());
            let io: Vec<IoSlice<'_>> = slices.iter().map(|s| IoSlice::new(s)).collect();
            let n = w.write_vectored(&io).await.expect("write");
            assert_eq!(n, slices.iter().map(Vec::len).sum::<usize>());
            assert_eq!(w.0.got, slices.concat());
            (w.0.plain, w.0.vectored)
        };
        assert_eq!(write(vec![b"5\r\n".to_vec(), b"hello".to_vec(), b"\r\n".to_vec()]).await, (1, 0));
        assert_eq!(write(vec![Vec::new(), b"only".to_vec(), Vec::new()]).await, (1, 0));
        assert_eq!(write(vec![vec![b'a'; FLAT_MAX - 2], b"bc".to_vec()]).await, (1, 0), "at the limit");
        assert_eq!(write(vec![vec![b'a'; FLAT_MAX], b"!".to_vec()]).await, (0, 1), "past it");
    }

    /// Whatever the slices, the bytes that arrive are theirs, in order:
    /// few and small (one write), one alone, many past the limit
    /// (vectored), and empty ones among them.
    #[tokio::test]
    async fn what_arrives_is_every_slice_in_order_whether_flattened_or_not() {
        let cases: Vec<Vec<Vec<u8>>> = vec![
            vec![b"5\r\n".to_vec(), b"hello".to_vec(), b"\r\n".to_vec()],
            vec![Vec::new(), b"only".to_vec(), Vec::new()],
            vec![vec![b'a'; FLAT_MAX - 2], b"bc".to_vec()],
            vec![vec![b'a'; FLAT_MAX], b"over".to_vec(), vec![b'z'; 3 * FLAT_MAX]],
        ];
        for case in cases {
            let (a, mut b) = tokio::io::duplex(64 * FLAT_MAX);
            let mut a = Flat(a);
            let want: Vec<u8> = case.concat();
            let mut at = 0;
            while at < want.len() {
                // Slices of what is left, as a writer resumes after a short write.
                let mut skip = at;
                let left: Vec<&[u8]> = case
                    .iter()
                    .map(|c| {
                        let s = &c[skip.min(c.len())..];
                        skip = skip.saturating_sub(c.len());
                        s
                    })
                    .collect();
                let slices: Vec<IoSlice<'_>> = left.iter().map(|s| IoSlice::new(s)).collect();
                let n = a.write_vectored(&slices).await.expect("write");
                assert!(n > 0);
                at += n;
            }
            a.shutdown().await.expect("shutdown");
            let mut got = Vec::new();
            b.read_to_end(&mut got).await.expect("read");
            assert_eq!(got, want);
        }
    }
}
