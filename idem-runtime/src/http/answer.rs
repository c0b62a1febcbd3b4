//! What the layer answers: a stored response (the handler's, kept for every repeat), and the
//! `application/problem+json` refusals (RFC 9457) of requests it did not pass to the handler.

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};
use serde::{Deserialize, Serialize};

use crate::ErrorClass;
use crate::IdempotentError;
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
        let headers = keep
            .iter()
            .flat_map(|name| {
                headers.get_all(name).iter().filter_map(move |value| {
                    value.to_str().ok().map(|value| (name.as_str().to_owned(), value.to_owned()))
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
    let body = serde_json::json!({
        "type": format!("urn:idem:problem:{kind}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Bytes::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
    if retry {
        response.headers_mut().insert(http::header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

/// The refusal of a request whose key is missing or malformed.
pub(super) fn bad_key(error: &KeyError) -> Response<Bytes> {
    let detail = match error {
        KeyError::Missing => "this endpoint needs an Idempotency-Key header: a quoted string the client makes unique \
                              per operation (a UUID), sent again unchanged on every retry"
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

/// The answer to a request idem refused: what the draft prescribes, in its words.
pub(super) fn refused(rejection: &Rejection) -> Response<Bytes> {
    let detail = rejection.to_string();
    match rejection {
        Rejection::Conflict { .. } => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "key-reused",
            "Idempotency-Key reused with another request",
            &detail,
            false,
        ),
        Rejection::InFlight { .. } => problem(
            StatusCode::CONFLICT,
            "in-progress",
            "A request with this Idempotency-Key is in progress",
            &detail,
            true,
        ),
        Rejection::OutcomeUnknown { .. } => problem(
            StatusCode::CONFLICT,
            "outcome-unknown",
            "The outcome of the request with this Idempotency-Key is unknown",
            &detail,
            false,
        ),
        Rejection::LedgerUnavailable { .. } | Rejection::ShuttingDown => {
            problem(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Nothing was executed; retry", &detail, true)
        }
        Rejection::InvalidArguments { .. } => {
            problem(StatusCode::BAD_REQUEST, "invalid-request", "The request cannot be keyed", &detail, false)
        }
        _ => {
            problem(StatusCode::INTERNAL_SERVER_ERROR, rejection.code(), "The request was not executed", &detail, false)
        }
    }
}
