//! A stream whose writes may not stall: a client that pipelines requests and never reads the
//! answers fills its socket buffer, and without a deadline the connection would wait on it for
//! ever, holding a descriptor. hyper's header timeout covers reads; this covers the writes.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::responder::connections::Activity;

/// Wraps a stream; a write, flush or shutdown that cannot progress for `limit` fails with
/// `TimedOut`, which ends the connection.
pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed while a write waits; allocated at the first stall only.
    stall: Option<Pin<Box<Sleep>>>,
    armed: bool,
    /// Told when a write starts and stops waiting, for the shedding order.
    activity: Option<Arc<Activity>>,
}

impl<S> WriteDeadline<S> {
    /// Also tells `activity` when a write waits for the client and when it went through.
    pub fn new(inner: S, limit: Duration, activity: Option<Arc<Activity>>) -> Self {
        Self {
            inner,
            limit,
            stall: None,
            armed: false,
            activity,
        }
    }

    /// Turns a pending write into an error once it has waited for `limit`.
    fn waited<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            if self.armed
                && let Some(activity) = &self.activity
            {
                activity.stalled(false);
            }
            self.armed = false;
            return result;
        }
        let deadline = Instant::now() + self.limit;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            stall.as_mut().reset(deadline);
            self.armed = true;
            if let Some(activity) = &self.activity {
                activity.stalled(true);
            }
        }
        match stall.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client has not read its answer for {}",
                    crate::settings::duration::format_duration(self.limit)
                ),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.waited(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.waited(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.waited(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.waited(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_never_reads_fails_the_write_after_the_limit() {
        let (client, _server_never_reads) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(client, Duration::from_secs(5), None);
        let started = Instant::now();
        let error = stream
            .write_all(&[b'x'; 4096])
            .await
            .expect_err("the buffer fills and nobody reads");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_but_steady_reader_is_served() {
        let (client, mut server) = tokio::io::duplex(64);
        let mut stream = WriteDeadline::new(client, Duration::from_secs(5), None);
        let reader = tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut all = Vec::new();
            let mut chunk = [0; 64];
            loop {
                tokio::time::sleep(Duration::from_secs(4)).await;
                match server.read(&mut chunk).await {
                    Ok(0) | Err(_) => break all.len(),
                    Ok(n) => all.extend_from_slice(&chunk[..n]),
                }
            }
        });
        stream
            .write_all(&[b'x'; 256])
            .await
            .expect("progress within each 5 s");
        drop(stream);
        assert_eq!(reader.await.unwrap(), 256);
    }
}
