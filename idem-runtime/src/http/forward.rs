//! Forwarding made automatic: the running operation's idempotency key on a handler's outbound
//! requests. [`forwarded_key`] is the header value for any client; [`ForwardKeyLayer`] sets it on
//! every request a tower HTTP client sends while an operation runs, so a handler's call to a
//! downstream API that honours `Idempotency-Key` (one behind an [`IdempotencyLayer`]) carries the
//! operation's key with no code of its own — and a takeover's second run is answered from the
//! downstream's record instead of acting twice.
//!
//! [`IdempotencyLayer`]: super::IdempotencyLayer

use std::task::{Context, Poll};

use http::{HeaderValue, Request};

use super::key::IDEMPOTENCY_KEY;
use crate::current_operation;

/// The `Idempotency-Key` value for the operation running in this task ([`current_operation`]):
/// its [`idempotency_key`](crate::Operation::idempotency_key) as a Structured Field String
/// (`"…"`), or `None` outside an operation. With reqwest:
/// `request.header(IDEMPOTENCY_KEY, forwarded_key().expect("inside a handler"))`.
///
/// The key is task-local: a task the handler spawns does not see it — read it in the handler
/// and pass it along.
#[must_use]
pub fn forwarded_key() -> Option<HeaderValue> {
    let key = current_operation()?.idempotency_key();
    // 64 hex digits, quoted: always a valid header value.
    HeaderValue::from_str(&format!("\"{key}\"")).ok()
}

/// A tower layer for outbound HTTP clients: each request sent while an operation runs carries
/// its key as `Idempotency-Key` ([`forwarded_key`]), unless the request already names one.
/// Outside an operation, requests pass unchanged.
#[derive(Clone, Copy, Debug, Default)]
pub struct ForwardKeyLayer;

impl<S> tower_layer::Layer<S> for ForwardKeyLayer {
    type Service = ForwardKey<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ForwardKey { inner }
    }
}

/// The client service [`ForwardKeyLayer`] makes of yours.
#[derive(Clone, Debug)]
pub struct ForwardKey<S> {
    inner: S,
}

impl<S, B> tower_service::Service<Request<B>> for ForwardKey<S>
where
    S: tower_service::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if !request.headers().contains_key(IDEMPOTENCY_KEY)
            && let Some(key) = forwarded_key()
        {
            request.headers_mut().insert(IDEMPOTENCY_KEY, key);
        }
        self.inner.call(request)
    }
}
