//! What the layer answers: a stored response (the handler's, kept for every repeat), and the
//! `application/problem+json` refusals (RFC 9457) of requests it did not pass to the handler.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::ErrorClass;
use crate::IdempotentError;
use crate::key::Ref;
use crate::rejection::Rejection;

use super::key::KeyError;

/// The header a replayed response carries.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// A response as it is stored: its status, the allow-listed headers and its body (text when it
/// is UTF-8, base64 otherwise).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct StoredResponse {
    status: u16,
    headers: Vec<(String, String)>,
    #[serde(flatten)]
    body: StoredBody,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoredBody {
    Text(String),
    Base64(String),
}

impl StoredResponse {
    /// `status`, the headers of `headers` named in `keep`, and `body`.
    pub(super) fn of(status: StatusCode, headers: &HeaderMap, keep: &[HeaderName], body: &Bytes) -> Self {
        // A value is kept as the text its bytes spell: visible ASCII, or UTF-8 beyond it (a
        // `location` of `/files/café`), which a replay sends as the same bytes.
        let headers = keep
            .iter()
            .flat_map(|name| {
                headers.get_all(name).iter().filter_map(move |value| match std::str::from_utf8(value.as_bytes()) {
                    Ok(text) => Some((name.as_str().to_owned(), text.to_owned())),
                    Err(_) => {
                        tracing::warn!(header = %name, "a stored header's value is not UTF-8: the replay goes without it");
                        None
                    }
                })
            })
            .collect();
        let body = match std::str::from_utf8(body) {
            Ok(text) => StoredBody::Text(text.to_owned()),
            Err(_) => StoredBody::Base64(base64::engine::general_purpose::STANDARD.encode(body)),
        };
        Self { status: status.as_u16(), headers, body }
    }

    /// The stored response, marked `Idempotent-Replayed: true` when it answers a repeat.
    pub(super) fn into_response(self, replayed: bool) -> Response<Bytes> {
        let body = match self.body {
            StoredBody::Text(text) => Bytes::from(text),
            StoredBody::Base64(encoded) => {
                Bytes::from(base64::engine::general_purpose::STANDARD.decode(encoded).unwrap_or_default())
            }
        };
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        for (name, value) in self.headers {
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
                response.headers_mut().append(name, value);
            }
        }
        if replayed {
            response.headers_mut().insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
        }
        response
    }
}

/// How a handled request ends for the engine, when it is not a response to store.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Unstored {
    /// idem answered without running the handler: never stored.
    #[serde(skip)]
    Refused(Rejection),
    /// The handler answered with a status the route declares "nothing happened": the client
    /// gets it, and the next repeat runs again.
    NothingHappened,
    /// The handler's response could not be stored (too large), or its service failed: the
    /// effect may have happened, so repeats are told the outcome is unknown.
    MaybeHappened,
}

impl IdempotentError for Unstored {
    fn classify(&self) -> ErrorClass {
        match self {
            Self::Refused(_) | Self::NothingHappened => ErrorClass::NothingHappened,
            Self::MaybeHappened => ErrorClass::Unknown,
        }
    }

    fn from_rejection(rejection: Rejection) -> Self {
        Self::Refused(rejection)
    }
}

/// A problem (RFC 9457): its status, a short type name (under `urn:idem:problem:`), a title, a
/// detail, and whether the client may retry after a second.
pub(super) fn problem(status: StatusCode, kind: &str, title: &str, detail: &str, retry: bool) -> Response<Bytes> {
    problem_about(status, kind, title, detail, None, retry.then_some(1))
}

/// A problem about an operation: [`problem`], with the operation's ref as the `reference` member
/// (what the client quotes to the service's operator), and `Retry-After` in seconds.
fn problem_about(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
    reference: Option<Ref>,
    retry_after: Option<u64>,
) -> Response<Bytes> {
    let mut body = serde_json::json!({
        "type": format!("urn:idem:problem:{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    if let Some(reference) = reference {
        body["reference"] = serde_json::Value::String(reference.to_string());
    }
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    if let Some(seconds) = retry_after {
        response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// The refusal of a request whose key is missing or malformed.
pub(super) fn bad_key(error: &KeyError) -> Response<Bytes> {
    let detail = match error {
        KeyError::Missing => "this endpoint needs an Idempotency-Key header: a key the client makes unique per \
                              operation (a UUID), sent again unchanged on every retry"
            .to_owned(),
        KeyError::Repeated => "send one Idempotency-Key header, not several".to_owned(),
        KeyError::Malformed(why) => format!("the Idempotency-Key header is not a valid key: {why}"),
    };
    let (kind, title) = match error {
        KeyError::Missing => ("missing-idempotency-key", "Idempotency-Key is missing"),
        _ => ("invalid-idempotency-key", "Idempotency-Key is invalid"),
    };
    problem(StatusCode::BAD_REQUEST, kind, title, &detail, false)
}

/// The answer to a request idem refused: what the draft prescribes, in its words — an HTTP
/// client's (the same key after `Retry-After`, a new key for a new request, the `reference` to
/// quote to the operator), never an agent's (a status tool, key arguments).
pub(super) fn refused(rejection: &Rejection) -> Response<Bytes> {
    let reference = rejection.reference();
    let about = |status, kind, title, detail: &str, retry_after| {
        problem_about(status, kind, title, detail, reference, retry_after)
    };
    match rejection {
        Rejection::Conflict { reference, differing, missing } => {
            let mut detail =
                format!("This Idempotency-Key was already used for a different request (reference {reference}");
            if !differing.is_empty() {
                detail.push_str(&format!("; what differs: {}", differing.join(", ")));
            }
            if *missing > 0 {
                detail.push_str(&format!("; {missing} part(s) of the earlier request are missing"));
            }
            detail.push_str(
                "). Nothing was executed. Send the earlier request unchanged to get its response, or use a new \
                 Idempotency-Key for a new request",
            );
            about(
                StatusCode::UNPROCESSABLE_ENTITY,
                "key-reused",
                "Idempotency-Key reused with another request",
                &detail,
                None,
            )
        }
        Rejection::InFlight { reference, lease_left } => {
            let seconds = retry_after(*lease_left);
            let unit = if seconds == 1 { "second" } else { "seconds" };
            let then = if lease_left.is_some_and(|left| left.is_zero()) {
                "the lease of the server running it has run out or is about to: a retry is answered with its \
                 response if it finished, or runs the request again or is told that its outcome is unknown, as the \
                 route's policy says, once this server is sure of the time"
            } else {
                "a request that has finished by then is replayed to you, one still running is answered 409 \
                 again with a new Retry-After, and one whose server stopped renewing its lease runs again or is \
                 told that its outcome is unknown, as the route's policy says"
            };
            let detail = format!(
                "A request with this Idempotency-Key is in progress (reference {reference}); this one was not \
                 executed. Retry after {seconds} {unit} with the same Idempotency-Key and the same request: {then}"
            );
            about(
                StatusCode::CONFLICT,
                "in-progress",
                "A request with this Idempotency-Key is in progress",
                &detail,
                Some(seconds),
            )
        }
        Rejection::OutcomeUnknown { reference } => {
            let detail = format!(
                "The request with this Idempotency-Key (reference {reference}) may or may not have taken effect: \
                 its response could not be stored (the server handling it failed or stopped, or the response was \
                 too large to keep). Nothing was executed now. Do not retry: a retry with this key gets this answer until the service's operator \
                 resolves reference {reference}, and a new Idempotency-Key could do it twice — ask the operator, \
                 quoting the reference"
            );
            about(
                StatusCode::CONFLICT,
                "outcome-unknown",
                "The outcome of the request with this Idempotency-Key is unknown",
                &detail,
                None,
            )
        }
        Rejection::UnreadableResult { reference, detail: why } => {
            let detail = format!(
                "The request with this Idempotency-Key (reference {reference}) completed earlier, but this server \
                 cannot read its stored response ({why}). Nothing was executed again. Do not retry: a retry with \
                 this key gets this answer until the service's operator corrects the stored response of reference \
                 {reference}"
            );
            about(
                StatusCode::INTERNAL_SERVER_ERROR,
                rejection.code(),
                "The stored response of this Idempotency-Key cannot be read",
                &detail,
                None,
            )
        }
        Rejection::DuplicateTool { namespace, tool, .. } => {
            let detail = format!(
                "Nothing was executed: two services (or two layers) keep `{tool}` in namespace `{namespace}` on \
                 this service's idempotency ledger, and their requests would answer each other's. Retrying does not \
                 help until the service's operator gives each its own namespace (IdempotencyLayer::namespace); \
                 the service's log names both"
            );
            problem(StatusCode::INTERNAL_SERVER_ERROR, rejection.code(), "The request was not executed", &detail, false)
        }
        Rejection::LedgerUnavailable { .. } | Rejection::ShuttingDown => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "Nothing was executed; retry",
            &rejection.to_string(),
            true,
        ),
        Rejection::InvalidArguments { .. } => problem(
            StatusCode::BAD_REQUEST,
            "invalid-request",
            "The request cannot be keyed",
            &rejection.to_string(),
            false,
        ),
        _ => problem(
            StatusCode::INTERNAL_SERVER_ERROR,
            rejection.code(),
            "The request was not executed",
            &rejection.to_string(),
            false,
        ),
    }
}

/// `Retry-After` for a request in progress: the holder's remaining lease in whole seconds (rounded
/// up), at least one; one when it is not known.
fn retry_after(lease_left: Option<Duration>) -> u64 {
    lease_left.map_or(1, |left| left.as_millis().div_ceil(1000).try_into().unwrap_or(u64::MAX).max(1))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::retry_after;

    #[test]
    fn retry_after_is_the_remaining_lease_in_whole_seconds_and_at_least_one() {
        assert_eq!(retry_after(None), 1);
        assert_eq!(retry_after(Some(Duration::ZERO)), 1);
        assert_eq!(retry_after(Some(Duration::from_millis(1))), 1);
        assert_eq!(retry_after(Some(Duration::from_millis(19_001))), 20);
        assert_eq!(retry_after(Some(Duration::from_secs(30))), 30);
    }
}
