//! What one client may hold of the server: llama-server's read/write timeout (`--timeout N`,
//! cpp-httplib's per-read and per-write limits) and a bound on open connections.
//!
//! A connection is closed when, for `--timeout` seconds,
//! - its request's headers have not all arrived (hyper's header timeout, which also closes
//!   an idle kept-alive connection that sends no next request),
//! - the next piece of its request body has not arrived ([`TimeoutBody`]: the handler's read
//!   fails, the answer is 400 and the connection is closed), or
//! - a piece of the answer could not be written (the client reads nothing: [`WriteTimeout`]).
//!
//! The time a request spends waiting for a slot or generating counts for none of these, as
//! in llama-server, where the handler runs between the reads and the writes.
//!
//! At most [`max_connections`] connections are open at once; the listener accepts no more
//! until one closes (the others wait in the kernel's backlog), so stuck clients can neither
//! use up the process's file descriptors nor keep it from serving once they time out.

use hyper::body::{Body, Frame, SizeHint};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// File descriptors kept for the rest of the server (the model file, the runtime's own
/// descriptors, `--path`'s files) when [`max_connections`] sizes the bound from the limit.
pub const RESERVED_FDS: u64 = 64;

/// The most connections open at once whatever the descriptor limit (each costs a task and
/// hyper's buffers).
pub const MAX_CONNECTIONS: usize = 4096;

/// The bound on open connections: the soft file-descriptor limit (`ulimit -n`) less
/// [`RESERVED_FDS`], at most [`MAX_CONNECTIONS`], at least 1; [`MAX_CONNECTIONS`] where the
/// limit cannot be read.
pub fn max_connections() -> usize {
    match fd_limit() {
        Some(n) => usize::try_from(n.saturating_sub(RESERVED_FDS))
            .unwrap_or(MAX_CONNECTIONS)
            .clamp(1, MAX_CONNECTIONS),
        None => MAX_CONNECTIONS,
    }
}

/// The soft `RLIMIT_NOFILE` (`None`: unlimited or unreadable).
#[cfg(unix)]
fn fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer to a local.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    // `rlim_t` is u64 on Linux and macOS, narrower elsewhere.
    #[allow(clippy::unnecessary_cast)]
    let cur = lim.rlim_cur as u64;
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(cur)
}

#[cfg(not(unix))]
fn fd_limit() -> Option<u64> {
    None
}

/// A deadline armed while an operation is pending and dropped when it makes progress.
#[derive(Debug)]
struct Deadline {
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Deadline {
    fn new(timeout: Duration) -> Deadline {
        Deadline {
            timeout,
            sleep: None,
        }
    }

    /// Called with the operation's poll: progress drops the deadline; pending arms it
    /// (once) and reports whether it has passed.
    fn check<T>(&mut self, cx: &mut Context<'_>, r: Poll<T>) -> Poll<Result<T, TimedOut>> {
        match r {
            Poll::Ready(v) => {
                self.sleep = None;
                Poll::Ready(Ok(v))
            }
            Poll::Pending => {
                let timeout = self.timeout;
                let sleep = self
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.sleep = None;
                        Poll::Ready(Err(TimedOut(timeout)))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// An operation pending for longer than `--timeout`.
#[derive(Debug, Clone, Copy)]
pub struct TimedOut(pub Duration);

impl std::fmt::Display for TimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no progress for {} s (--timeout)", self.0.as_secs_f64())
    }
}

impl std::error::Error for TimedOut {}

impl From<TimedOut> for io::Error {
    fn from(t: TimedOut) -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, t)
    }
}

/// A connection whose writes fail with [`io::ErrorKind::TimedOut`] once one has waited
/// `timeout` for the client to take bytes (cpp-httplib's write timeout). Reads pass
/// through.
#[derive(Debug)]
pub struct WriteTimeout<T> {
    io: T,
    deadline: Deadline,
}

impl<T> WriteTimeout<T> {
    /// `io` with writes limited to `timeout` each.
    pub fn new(io: T, timeout: Duration) -> WriteTimeout<T> {
        WriteTimeout {
            io,
            deadline: Deadline::new(timeout),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, buf);
        this.deadline
            .check(cx, r)
            .map(|r| r.unwrap_or_else(|t| Err(t.into())))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.deadline
            .check(cx, r)
            .map(|r| r.unwrap_or_else(|t| Err(t.into())))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_flush(cx);
        this.deadline
            .check(cx, r)
            .map(|r| r.unwrap_or_else(|t| Err(t.into())))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_shutdown(cx);
        this.deadline
            .check(cx, r)
            .map(|r| r.unwrap_or_else(|t| Err(t.into())))
    }
}

/// A request body whose next piece must arrive within `timeout` once the handler waits for
/// it (cpp-httplib's read timeout); past it the read fails with [`TimedOut`].
#[derive(Debug)]
pub struct TimeoutBody<B> {
    body: B,
    deadline: Deadline,
}

impl<B> TimeoutBody<B> {
    /// `body` with each piece limited to `timeout`.
    pub fn new(body: B, timeout: Duration) -> TimeoutBody<B> {
        TimeoutBody {
            body,
            deadline: Deadline::new(timeout),
        }
    }
}

/// The error of a body read: the body's own, or [`TimedOut`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> Body for TimeoutBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.body).poll_frame(cx);
        match this.deadline.check(cx, r) {
            Poll::Ready(Ok(frame)) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Ready(Err(t)) => Poll::Ready(Some(Err(Box::new(t)))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A write that the peer never takes fails with TimedOut once the timeout has passed
    /// (tokio's paused clock: no real waiting), and not before.
    #[tokio::test(start_paused = true)]
    async fn stuck_write_times_out() {
        let (a, _b) = tokio::io::duplex(16);
        let mut w = WriteTimeout::new(a, Duration::from_secs(600));
        w.write_all(&[0; 16]).await.expect("fits the pipe");
        let t0 = tokio::time::Instant::now();
        let e = w.write_all(&[0; 1]).await.expect_err("stuck");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(t0.elapsed(), Duration::from_secs(600));
    }

    /// Writes the peer keeps taking never time out, however long they take in all.
    #[tokio::test(start_paused = true)]
    async fn slow_reader_does_not_time_out() {
        let (a, mut b) = tokio::io::duplex(16);
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut got = 0;
            let mut buf = [0; 16];
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                match b.read(&mut buf).await {
                    Ok(0) | Err(_) => return got,
                    Ok(n) => got += n,
                }
            }
        });
        let mut w = WriteTimeout::new(a, Duration::from_secs(10));
        w.write_all(&[1; 16 * 20])
            .await
            .expect("each piece taken in time");
        w.shutdown().await.expect("shut down");
        drop(w);
        assert_eq!(reader.await.expect("reader"), 16 * 20);
    }

    /// A request body fed by a channel: the client's pieces as they arrive.
    struct Chan(tokio::sync::mpsc::Receiver<hyper::body::Bytes>);

    impl Body for Chan {
        type Data = hyper::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
            self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
        }
    }

    /// A body whose next piece does not come fails with TimedOut; pieces that do come reset
    /// the deadline (four pieces 2 s apart under a 3 s timeout: 8 s in all).
    #[tokio::test(start_paused = true)]
    async fn stuck_body_times_out() {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut body = TimeoutBody::new(Chan(rx), Duration::from_secs(3));
        let sender = tokio::spawn(async move {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                let _ = tx.send(hyper::body::Bytes::from_static(b"x")).await;
            }
            // Then nothing more, the sender kept open.
            tokio::time::sleep(Duration::from_secs(3600)).await;
        });
        for _ in 0..4 {
            let frame = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
                .await
                .expect("a frame")
                .expect("in time");
            assert_eq!(frame.into_data().ok().as_deref(), Some(&b"x"[..]));
        }
        let e = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx))
            .await
            .expect("an error")
            .expect_err("stuck");
        assert!(e.is::<TimedOut>(), "{e}");
        sender.abort();
    }
}
