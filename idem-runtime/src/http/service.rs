//! [`Idempotent`]: the service [`IdempotencyLayer`](super::IdempotencyLayer) wraps around yours.
//! One request: pick its route, check its key and principal, read its body within the limit, and
//! drive it through the engine (`Idem::call`) with the wrapped service as the handler.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

/// What the service answered the first run, for its client (every header), or its error.
type Answered<E> = Arc<Mutex<Option<Result<Response<Bytes>, E>>>>;
use std::task::{Context, Poll};

use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use serde::Serialize;
use serde_json::Value;

use super::Config;
use super::answer::{self, StoredResponse, Unstored};
use super::key::{IdempotencyKey, client_key};
use crate::canonical::{CanonicalError, parse_strict};
use crate::recipe::Recipe;

/// The error of a body: anything a service's body may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body the wrapped service is given and the layer answers with: the original body of a
/// request the layer passes through (streaming), or the bytes it read or stored.
pub struct LayerBody(UnsyncBoxBody<Bytes, BoxError>);

impl LayerBody {
    fn new<B>(body: B) -> Self
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        Self(body.map_err(Into::into).boxed_unsync())
    }

    fn full(bytes: Bytes) -> Self {
        Self(http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed_unsync())
    }
}

impl std::fmt::Debug for LayerBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerBody").finish_non_exhaustive()
    }
}

impl Body for LayerBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().0).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// The service [`IdempotencyLayer`](super::IdempotencyLayer) makes of yours.
#[derive(Clone)]
pub struct Idempotent<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> std::fmt::Debug for Idempotent<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotent").finish_non_exhaustive()
    }
}

impl<S> Idempotent<S> {
    pub(super) const fn new(inner: S, config: Arc<Config>) -> Self {
        Self { inner, config }
    }
}

/// What a protected request is keyed and fingerprinted by: the recipe keys `route` and `key`
/// (under the principal's scope and the tool, `METHOD template`); every member is fingerprinted.
#[derive(Serialize)]
struct Arguments {
    key: String,
    method: String,
    route: String,
    path: String,
    query: String,
    body: Value,
}

/// The body as the fingerprint sees it: `null` when empty; when it is labelled JSON
/// (`application/json` or `…+json`), its value as the strict canonical parser reads it
/// ([`parse_strict`](crate::canonical::parse_strict): exact integer digits, no member name twice),
/// so that spacing, member order and number spelling do not matter and any change of value does;
/// its bytes (base64) otherwise. A body labelled JSON that the parser refuses is the error: two
/// different bodies are never one fingerprint. For every body `serde_json` reads as the parser
/// does, the value — and so the fingerprint — is the one `serde_json::Value` gave before.
fn body_value(headers: &http::HeaderMap, bytes: &Bytes) -> Result<Value, CanonicalError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    let json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| {
            let media = media.trim();
            media.eq_ignore_ascii_case("application/json") || media.ends_with("+json")
        });
    if json {
        let text = std::str::from_utf8(bytes).map_err(|error| CanonicalError::Invalid {
            message: format!("the body is not UTF-8 ({error}), and JSON text is"),
        })?;
        return Ok(serde_json::json!({ "json": parse_strict(text)? }));
    }
    Ok(serde_json::json!({ "bytes": base64::engine::general_purpose::STANDARD.encode(bytes) }))
}

/// A response of the layer's own, boxed.
fn boxed(response: Response<Bytes>) -> Response<LayerBody> {
    response.map(LayerBody::full)
}

/// Reads `body` whole, or says it is longer than `max`.
async fn read_within<B>(body: B, max: usize) -> Result<Bytes, Option<BoxError>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut read = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| Some(error.into()))?;
        if let Ok(data) = frame.into_data() {
            if read.len() + data.len() > max {
                return Err(None);
            }
            read.extend_from_slice(&data);
        }
    }
    Ok(read.freeze())
}

impl<S, ReqBody, ResBody> tower_service::Service<Request<ReqBody>> for Idempotent<S>
where
    S: tower_service::Service<Request<LayerBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<LayerBody>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The service that was polled ready serves this request; a fresh clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(matched) = route_of(&self.config, &request) else {
            // Not protected: through, streaming both ways.
            let response = inner.call(request.map(LayerBody::new));
            return Box::pin(async move { Ok(response.await?.map(LayerBody::new)) });
        };
        // Run to the end whatever becomes of the client's connection: a request the service
        // started is recorded, and its client's retry answered from the record, rather than left
        // in progress (and then "outcome unknown") because the client hung up. It runs on the
        // connection's task, and only a request whose connection dropped it goes on in a task of
        // its own (a task per request would cost every request two wake-ups across threads).
        let work = Box::pin(protect(Arc::clone(&self.config), inner, request, matched));
        Box::pin(ToTheEnd {
            work: Some(work),
            runtime: tokio::runtime::Handle::try_current().ok(),
            span: tracing::Span::current(),
        })
    }
}

/// A request's work, polled where its response is awaited; if that future is dropped before the
/// work ends (the client hung up, the server timed the request out), the rest of the work is
/// spawned onto the runtime the request came in on, in the request's span, and runs to its end
/// there. A work that panics is dropped as it unwinds, never polled again.
struct ToTheEnd<F: Future<Output: Send + 'static> + Send + 'static> {
    work: Option<Pin<Box<F>>>,
    runtime: Option<tokio::runtime::Handle>,
    span: tracing::Span,
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Future for ToTheEnd<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Out while it is polled: if it panics, it unwinds with this frame, and what is dropped
        // later (by whoever catches the panic) holds nothing to run again.
        let Some(mut work) = self.work.take() else {
            panic!("a request's future was polled after it answered");
        };
        match work.as_mut().poll(cx) {
            Poll::Ready(answer) => Poll::Ready(answer),
            Poll::Pending => {
                self.work = Some(work);
                Poll::Pending
            }
        }
    }
}

impl<F: Future<Output: Send + 'static> + Send + 'static> Drop for ToTheEnd<F> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else { return };
        match &self.runtime {
            Some(runtime) => {
                runtime.spawn(tracing::Instrument::instrument(work, self.span.clone()));
            }
            None => tracing::error!(
                parent: &self.span,
                "a protected request was dropped outside a Tokio runtime before it ended: its operation is left to \
                 its lease (serve the layer on a Tokio runtime)"
            ),
        }
    }
}

/// How a protected request is kept: its recipe, its route's name, and the statuses that mean
/// nothing happened.
struct Matched {
    recipe: Arc<Recipe>,
    route: String,
    nothing_happened: std::borrow::Cow<'static, [StatusCode]>,
}

/// The route an axum router matched for `request` and the prefix of the router the layer sits
/// in (axum's `MatchedPath` and `NestedPath`, feature `axum`); outside a router, or without the
/// feature, none.
fn router_match<B>(request: &Request<B>) -> Option<(&str, Option<&str>)> {
    #[cfg(feature = "http")]
    {
        let matched = request.extensions().get::<axum::extract::MatchedPath>()?.as_str();
        let nested = request.extensions().get::<axum::extract::NestedPath>().map(axum::extract::NestedPath::as_str);
        Some((matched, nested))
    }
    #[cfg(not(feature = "http"))]
    {
        let _ = request;
        None
    }
}

/// How `request` is kept; `None` when the layer does not protect it.
fn route_of<B>(config: &Config, request: &Request<B>) -> Option<Matched> {
    let (method, path) = (request.method(), request.uri().path());
    let matched = router_match(request);
    let chosen = match matched {
        // Inside a router: the named route the router matched, and no other (a sibling the layer
        // was not told of, `/payments/export` beside `/payments/{id}`, is not protected).
        Some((matched, nested)) => {
            let templates = super::matched_templates(matched, nested);
            config.routes.iter().find(|route| route.is_route(method, &templates))
        }
        // Outside one: the router's choice among the templates that match, text before `{id}`
        // before `{*rest}`.
        None => config
            .routes
            .iter()
            .filter_map(|route| route.matches(method, path).map(|rank| (rank, route)))
            .min_by(|(a, _), (b, _)| a.cmp(b))
            .map(|(_, route)| route),
    };
    if let Some(route) = chosen {
        let (recipe, route, nothing_happened) =
            (Arc::clone(&route.recipe), route.template.clone(), route.nothing_happened.clone());
        return Some(Matched { recipe, route, nothing_happened });
    }
    let (_, recipe) = config.methods.iter().find(|(protected, _)| protected == method)?;
    // Only a request the router matched to a route: another one gets the router's 404 or 405.
    let Some((matched, _)) = matched else {
        if !config.outside_router.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                %method,
                path,
                "an IdempotencyLayer given `.methods(..)` saw a request without axum's MatchedPath: it protects \
                 those methods only on routes of a Router it is applied to with `Router::layer`, and this request \
                 (a path no route matches, or a layer applied outside the router) passed through unprotected"
            );
        }
        return None;
    };
    let (recipe, nothing_happened) = (Arc::clone(recipe), config.default_route.nothing_happened.clone());
    Some(Matched { recipe, route: matched.to_owned(), nothing_happened })
}

/// One protected request, from its key, principal and body to one engine call, and back.
async fn protect<S, ReqBody, ResBody>(
    config: Arc<Config>,
    inner: S,
    request: Request<ReqBody>,
    matched: Matched,
) -> Result<Response<LayerBody>, S::Error>
where
    S: tower_service::Service<Request<LayerBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Body<Data = Bytes> + Send + 'static,
    ReqBody::Error: Into<BoxError>,
    ResBody: Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    let (mut parts, body) = request.into_parts();
    let Matched { recipe, route, nothing_happened } = matched;
    let key = match client_key(&parts.headers, config.strict_keys) {
        Ok(key) => key,
        Err(error) => return Ok(boxed(answer::bad_key(&error))),
    };
    let Some(caller) = (config.principal)(&parts) else {
        return Ok(boxed(answer::problem(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "No authenticated principal",
            "an Idempotency-Key is kept per principal, and this request has none: authenticate, then send it again",
            false,
        )));
    };
    let too_large = || {
        let detail = format!("the body is larger than the {} bytes this endpoint accepts", config.max_request_bytes);
        boxed(answer::problem(StatusCode::PAYLOAD_TOO_LARGE, "too-large", "Request body too large", &detail, false))
    };
    if let Some(length) = parts.headers.get(http::header::CONTENT_LENGTH)
        && length
            .to_str()
            .ok()
            .and_then(|length| length.parse::<u64>().ok())
            .is_some_and(|length| usize::try_from(length).map_or(true, |length| length > config.max_request_bytes))
    {
        return Ok(too_large());
    }
    let bytes = match read_within(body, config.max_request_bytes).await {
        Ok(bytes) => bytes,
        Err(None) => return Ok(too_large()),
        Err(Some(error)) => {
            let detail = format!("the request body could not be read: {error}");
            return Ok(boxed(answer::problem(
                StatusCode::BAD_REQUEST,
                "unreadable-body",
                "Unreadable body",
                &detail,
                false,
            )));
        }
    };
    let body = match body_value(&parts.headers, &bytes) {
        Ok(body) => body,
        Err(error) => {
            let detail = format!(
                "the body is labelled JSON, and the layer fingerprints JSON exactly, so it must be strict JSON \
                 (RFC 8259, each member name once, integers kept exactly): {error}. Nothing was claimed: send it \
                 again corrected, with the same Idempotency-Key"
            );
            return Ok(boxed(answer::problem(
                StatusCode::BAD_REQUEST,
                "invalid-json",
                "Request body is not strict JSON",
                &detail,
                false,
            )));
        }
    };
    // The handler reads the client's key decoded (`IdempotencyKey`), not the header's spelling.
    parts.extensions.insert(IdempotencyKey(key.clone()));
    let arguments = Arguments {
        key,
        method: parts.method.as_str().to_owned(),
        route,
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().unwrap_or("").to_owned(),
        body,
    };
    // What the service answered, for this client: all its headers (the store keeps the
    // allow-listed ones), or its error. Shared, not borrowed: the handler's future owns what it
    // uses (one borrowing this future's locals would not be `Send` for every lifetime).
    let answered: Answered<S::Error> = Arc::default();
    let (kept, shared) = (Arc::clone(&answered), Arc::clone(&config));
    let run = move || async move {
        let (answered, config, mut inner) = (kept, shared, inner);
        let request = Request::from_parts(parts, LayerBody::full(bytes));
        let response = match std::future::poll_fn(|cx| inner.poll_ready(cx)).await {
            Ok(()) => inner.call(request).await,
            Err(error) => Err(error),
        };
        let keep = |answer| *answered.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
        let response = match response {
            Ok(response) => response,
            Err(error) => {
                keep(Err(error));
                return Err(Unstored::MaybeHappened);
            }
        };
        let (head, body) = response.into_parts();
        // The whole body reaches the client; past the limit it is not stored.
        let body = match body.collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(error) => {
                let error: BoxError = error.into();
                tracing::error!(%error, "the service's response body failed; recording the outcome as unknown");
                keep(Ok(Response::from_parts(head, Bytes::new())));
                return Err(Unstored::MaybeHappened);
            }
        };
        let (status, size) = (head.status, body.len());
        // Encoded for the store only once it is known to be stored.
        let stored = (!nothing_happened.contains(&status) && size <= config.max_response_bytes)
            .then(|| StoredResponse::of(status, &head.headers, &config.stored_headers, &body));
        keep(Ok(Response::from_parts(head, body)));
        if nothing_happened.contains(&status) {
            return Err(Unstored::NothingHappened);
        }
        stored.ok_or_else(|| {
            tracing::error!(
                size,
                max = config.max_response_bytes,
                "the response is too large to store; recording the outcome as unknown"
            );
            Unstored::MaybeHappened
        })
    };
    let answer = config.idem.call(&recipe, Some(&caller), &arguments, run).await;
    let kept = answered.lock().unwrap_or_else(PoisonError::into_inner).take();
    match (answer, kept) {
        // The first run: the service's own response, every header.
        (Ok(served), Some(Ok(response))) if !served.replayed => Ok(boxed(response)),
        (Ok(served), _) => Ok(boxed(served.value.into_response(served.replayed))),
        (Err(Unstored::Refused(rejection)), _) => Ok(boxed(answer::refused(&rejection))),
        (Err(_), Some(Ok(response))) => Ok(boxed(response)),
        (Err(_), Some(Err(error))) => Err(error),
        (Err(_), None) => Ok(boxed(answer::problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            "outcome-unknown",
            "The request's outcome is unknown",
            "the service did not answer",
            false,
        ))),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::HeaderMap;
    use serde_json::Value;

    use super::body_value;
    use crate::canonical::{CanonicalError, to_canonical_vec};

    fn json_headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::CONTENT_TYPE, "application/json; charset=utf-8".parse().unwrap());
        headers
    }

    /// A body `serde_json` read as the strict parser does keeps its fingerprint across the change
    /// of parser (issue 42, item 4): the same canonical bytes as the `serde_json::Value` before.
    #[test]
    fn bodies_that_parsed_before_keep_their_fingerprint() {
        for body in [
            r#"{"amount":100}"#,
            r#"{ "b" : [1, 2.5, -0, 1e3, 1E-7, 0.1, 18446744073709551615, -9223372036854775808] , "a":null }"#,
            r#"{"id":9007199254740993,"big":18446744073709551616,"x":1e308,"s":"\u00e9\ud83d\ude00\n"}"#,
            r#"[true,false,{},[],"",{"nested":{"deep":[1,[2,[3]]]}}]"#,
            "3.141592653589793",
            r#""text""#,
        ] {
            let before = serde_json::json!({ "json": serde_json::from_str::<Value>(body).unwrap() });
            let now = body_value(&json_headers(), &Bytes::from(body)).unwrap();
            assert_eq!(to_canonical_vec(&now).unwrap(), to_canonical_vec(&before).unwrap(), "{body}");
        }
    }

    /// What serde_json took and the strict parser refuses: a member name twice, an integer no
    /// double holds beyond the 64-bit range, malformed text; a body not labelled JSON is its bytes.
    #[test]
    fn a_json_body_the_strict_parser_refuses_is_refused() {
        let refused = |body: &'static [u8]| body_value(&json_headers(), &Bytes::from_static(body)).unwrap_err();
        assert!(matches!(refused(br#"{"a":1,"a":2}"#), CanonicalError::DuplicateKey { .. }));
        assert!(matches!(refused(br#"{"n":100000000000000000001}"#), CanonicalError::InexactInteger { .. }));
        assert!(matches!(refused(br#"{"a":1,}"#), CanonicalError::Invalid { .. }));
        assert!(matches!(refused(b"{\"a\":\"\xff\"}"), CanonicalError::Invalid { .. }));
        let mut text = HeaderMap::new();
        text.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        let bytes = body_value(&text, &Bytes::from_static(br#"{"a":1,"a":2}"#)).unwrap();
        assert!(bytes["bytes"].is_string(), "{bytes}");
        assert_eq!(body_value(&json_headers(), &Bytes::new()).unwrap(), Value::Null);
    }
}
