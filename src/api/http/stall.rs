//! A write-stall timeout around a connection.
//!
//! hyper's header-read timeout bounds idle and slow-header clients, and body reads are
//! bounded by the handler; what is left is a client that stops *reading* (pipelining
//! requests without reading answers): the write then waits forever and the connection keeps
//! its slot. This wrapper fails a write, flush or shutdown that has made no progress for
//! `timeout`, so hyper closes the connection and the slot is freed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

pub struct StallTimeout<S> {
    inner: S,
    timeout: Duration,
    /// Armed while a write is pending; dropped on progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StallTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        StallTimeout {
            inner,
            timeout,
            stalled: None,
        }
    }

    /// Called when the inner write returned `Pending`: errors once the stall outlasts the
    /// timeout (the sleep's waker is registered either way).
    fn poll_stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progress<T>(&mut self, r: Poll<io::Result<T>>, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match r {
            Poll::Ready(v) => {
                self.stalled = None;
                Poll::Ready(v)
            }
            Poll::Pending => self.poll_stall(cx),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StallTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StallTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(r, cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progress(r, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_flush(cx);
        this.progress(r, cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.progress(r, cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_timeout() {
        let (a, _b) = tokio::io::duplex(16);
        let mut s = StallTimeout::new(a, Duration::from_millis(50));
        let r = s.write_all(&[0u8; 1024]).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn writes_that_progress_are_not_cut() {
        let (a, mut b) = tokio::io::duplex(16);
        let reader = tokio::spawn(async move {
            let mut sink = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut b, &mut sink)
                .await
                .map(|_| sink.len())
        });
        let mut s = StallTimeout::new(a, Duration::from_secs(5));
        s.write_all(&[1u8; 4096]).await.unwrap();
        s.shutdown().await.unwrap();
        drop(s);
        assert_eq!(reader.await.unwrap().unwrap(), 4096);
    }
}
