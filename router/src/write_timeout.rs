//! A connection whose client stops reading is closed after a while.
//!
//! A response body is polled only when its socket takes bytes, so a client
//! that never reads its stream kept the stream, its generation, its admission
//! slot and its KV cache for as long as the socket stayed open (eight such
//! streams locked every client out for minutes). Here a write that cannot
//! proceed for the whole timeout fails the connection: hyper drops the
//! response body, which cancels the generation in the engine and frees its
//! slot. The clock starts when the socket stops taking bytes and restarts on
//! every byte it takes, so a slow reader is not cut off, only a stopped one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// Default of [`crate::ServeOptions::write_timeout`].
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// `io` whose writes fail with `TimedOut` once blocked for `timeout`.
pub struct WriteTimeout<T> {
    io: T,
    timeout: Duration,
    /// Running while writes are blocked; `None` while they proceed.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> WriteTimeout<T> {
    /// Wraps `io`.
    pub fn new(io: T, timeout: Duration) -> Self {
        WriteTimeout {
            io,
            timeout,
            stalled: None,
        }
    }

    /// After a write-side poll: restarts the clock on progress; on `Pending`,
    /// fails once the clock runs out (its timer wakes this task then).
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {} s", timeout.as_secs_f64()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for WriteTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_stops_fails_the_write_after_the_timeout() {
        let (writer, mut reader) = tokio::io::duplex(64);
        let mut writer = WriteTimeout::new(writer, Duration::from_secs(30));
        // A reader that reads keeps the writer going past the timeout.
        let reading = tokio::spawn(async move {
            let mut sink = Vec::new();
            let mut buf = [0u8; 64];
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let n = tokio::io::AsyncReadExt::read(&mut reader, &mut buf)
                    .await
                    .unwrap();
                sink.extend_from_slice(&buf[..n]);
            }
            reader
        });
        for _ in 0..20 {
            writer.write_all(&[7u8; 64]).await.unwrap();
        }
        let _reader = reading.await.unwrap();
        // Now nobody reads: the buffer fills, and 30 s later the write fails.
        writer.write_all(&[7u8; 64]).await.unwrap();
        let started = tokio::time::Instant::now();
        let error = writer.write_all(&[7u8; 64]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
    }
}
