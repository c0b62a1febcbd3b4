//! Forwarding made automatic: the running operation's idempotency key on a handler's outbound
//! requests. [`forwarded_key`] is the header value for any client; [`ForwardKeyLayer`] sets it on
//! every request a tower HTTP client sends while an operation runs, so a handler's call to a
//! downstream API that honours `Idempotency-Key` (one behind an [`IdempotencyLayer`]) carries the
//! operation's key with no code of its own — and a takeover's second run is answered from the
//! downstream's record instead of acting twice.
//!
//! A handler that sends **two** requests to one downstream (create a customer, then charge)
//! must not send one key on both: the downstream would answer the charge with the customer's
//! record. Each names its child key instead — [`Child`] on a tower client's request,
//! [`forwarded_child_key`] for any other client — derived from the operation's key and a label
//! ([`Operation::child`](crate::Operation::child)), the same in every run of the operation.
//! [`ForwardKeyLayer`] logs a warning when one run sends one key twice to one origin.
//!
//! [`IdempotencyLayer`]: super::IdempotencyLayer

use std::borrow::Cow;
use std::task::{Context, Poll};

use http::{HeaderValue, Request};

use super::key::IDEMPOTENCY_KEY;
use crate::{Operation, current_operation};

/// The `Idempotency-Key` value for the operation running in this task ([`current_operation`]):
/// its [`idempotency_key`](crate::Operation::idempotency_key) as a Structured Field String
/// (`"…"`), or `None` outside an operation. With reqwest:
/// `request.header(IDEMPOTENCY_KEY, forwarded_key().expect("inside a handler"))`.
///
/// The key is task-local: a task the handler spawns does not see it — read it in the handler
/// and pass it along.
#[must_use]
pub fn forwarded_key() -> Option<HeaderValue> {
    quoted(&current_operation()?.idempotency_key())
}

/// The `Idempotency-Key` value of the running operation's child key for `label`
/// ([`Operation::child`](crate::Operation::child)), quoted as [`forwarded_key`] is, or `None`
/// outside an operation: for a client that is not a tower service (reqwest's `RequestBuilder`
/// takes it as `.header(IDEMPOTENCY_KEY, value)` too). One key per request to one processor:
///
/// ```no_run
/// use idem_runtime::http::{IDEMPOTENCY_KEY, forwarded_child_key};
///
/// // Inside the handler (`None` outside an operation).
/// let customer = http::Request::post("https://processor.internal/customers")
///     .header(IDEMPOTENCY_KEY, forwarded_child_key("customer").expect("inside a handler"))
///     .body(r#"{"email":"a@example.com"}"#.to_owned());
/// let charge = http::Request::post("https://processor.internal/charges")
///     .header(IDEMPOTENCY_KEY, forwarded_child_key("charge").expect("inside a handler"))
///     .body(r#"{"amount":4200}"#.to_owned());
/// ```
#[must_use]
pub fn forwarded_child_key(label: &str) -> Option<HeaderValue> {
    quoted(&current_operation()?.child(label))
}

/// A key of 64 hex digits as a Structured Field String: always a valid header value.
fn quoted(key: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(&format!("\"{key}\"")).ok()
}

/// Names the child key a request carries through [`ForwardKeyLayer`]: put it in the request's
/// extensions and the layer sends the running operation's
/// [`child`](crate::Operation::child) for this label instead of the operation's own key.
///
/// ```
/// use idem_runtime::http::Child;
///
/// let charge = http::Request::post("https://processor.internal/charges")
///     .extension(Child::new("charge"))
///     .body(r#"{"amount":4200}"#.to_owned())
///     .unwrap();
/// # assert_eq!(charge.extensions().get::<Child>().unwrap().label(), "charge");
/// ```
///
/// Keep labels fixed in code (`"charge"`, `format!("refund-{line}")` for a line the arguments
/// name): a second run of the operation must name the same children for the downstream to
/// answer them from its record. Outside an operation the request passes unchanged, as without
/// it; a request that already carries `Idempotency-Key` keeps its own.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Child(Cow<'static, str>);

impl Child {
    /// The child named `label` (any text; distinct labels give distinct keys).
    #[must_use]
    pub fn new(label: impl Into<Cow<'static, str>>) -> Self {
        Self(label.into())
    }

    /// Its label.
    #[must_use]
    pub fn label(&self) -> &str {
        &self.0
    }
}

/// A tower layer for outbound HTTP clients: each request sent while an operation runs carries
/// its key as `Idempotency-Key` ([`forwarded_key`]) — or, when the request names a [`Child`] in
/// its extensions, that child's key — unless the request already names one. Outside an
/// operation, requests pass unchanged.
///
/// When one run of a handler sends one key twice to one origin (scheme, host and port) — two
/// requests without a [`Child`], or two with one label — the layer logs a warning (`WARN`,
/// target `idem_runtime::http::forward`): the downstream will answer the second with the first
/// one's record, or refuse it. What it remembers is the run's own (at most 64 origin-key
/// pairs, dropped when the handler returns). A retry layer belongs inside this one
/// (`ForwardKeyLayer` wrapping `Retry`), so a retried request is one request here and keeps
/// its key without a warning.
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
        if !request.headers().contains_key(IDEMPOTENCY_KEY) {
            let key = match request.extensions().get::<Child>() {
                Some(child) => forwarded_child_key(child.label()),
                None => forwarded_key(),
            };
            if let Some(key) = key {
                request.headers_mut().insert(IDEMPOTENCY_KEY, key);
            }
        }
        if let Some(key) = request.headers().get(IDEMPOTENCY_KEY) {
            let origin = origin(&request);
            let key = String::from_utf8_lossy(key.as_bytes());
            if Operation::note_sent(&origin, &key) == Some(true) {
                let operation = current_operation();
                let tool = operation.as_ref().map_or("", Operation::tool);
                let reference = operation.as_ref().map(|operation| operation.reference().to_string());
                tracing::warn!(
                    tool,
                    reference = reference.as_deref().unwrap_or(""),
                    %origin,
                    idempotency_key = %key,
                    "one operation sent one Idempotency-Key twice to one origin: the downstream will answer the \
                     second request with the first one's record, or refuse it; name each request's child key \
                     (`idem_runtime::http::Child::new(\"charge\")` in its extensions, or `forwarded_child_key`)"
                );
            }
        }
        self.inner.call(request)
    }
}

/// The request's origin: scheme, host (lower case) and port (the scheme's default when none is
/// given), from its URI, or from its `Host` header when the URI is a path alone.
fn origin<B>(request: &Request<B>) -> String {
    let uri = request.uri();
    let scheme = uri.scheme_str().unwrap_or("http").to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "https" | "wss" => 443,
        _ => 80,
    };
    let (host, port) = match uri.authority() {
        Some(authority) => (authority.host().to_ascii_lowercase(), authority.port_u16()),
        None => {
            let host = request.headers().get(http::header::HOST).and_then(|host| host.to_str().ok()).unwrap_or("");
            match host.parse::<http::uri::Authority>() {
                Ok(authority) => (authority.host().to_ascii_lowercase(), authority.port_u16()),
                Err(_) => (host.to_ascii_lowercase(), None),
            }
        }
    };
    format!("{scheme}://{host}:{}", port.unwrap_or(default_port))
}
