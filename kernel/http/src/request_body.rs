//! A request's body that tells, once its handler has answered, whether it
//! was read to its end.
//!
//! A handler may answer before reading the body (a refusal, a method it
//! does not serve). The server then closes the connection after the
//! answer, as the rest of the body would be read as the next request; a
//! client that was not told so keeps the connection in its pool and its
//! next request meets a broken pipe. Such an answer says `Connection:
//! close`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{header, HeaderValue, Response};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};

/// The body of a request as a face's service reads it.
#[derive(Debug)]
pub struct RequestBody {
    incoming: Incoming,
    read: Arc<AtomicBool>,
}

/// Whether a request's body has been read to its end.
#[derive(Debug, Clone)]
pub struct ReadToEnd(Arc<AtomicBool>);

impl RequestBody {
    /// `incoming`, and what tells whether it was read to its end.
    pub fn new(incoming: Incoming) -> (RequestBody, ReadToEnd) {
        let read = Arc::new(AtomicBool::new(incoming.is_end_stream()));
        let tells = ReadToEnd(Arc::clone(&read));
        (RequestBody { incoming, read }, tells)
    }
}

impl ReadToEnd {
    /// Says `Connection: close` on `response` unless the body was read to
    /// its end.
    pub fn close_unless_read<B>(&self, response: &mut Response<B>) {
        if !self.0.load(Ordering::Acquire) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

impl HttpBody for RequestBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.incoming).poll_frame(context);
        if matches!(polled, Poll::Ready(None)) || self.incoming.is_end_stream() {
            self.read.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}
