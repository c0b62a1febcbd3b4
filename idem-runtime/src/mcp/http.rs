//! The streamable-HTTP part (feature `mcp-http`): an axum middleware that turns a bearer token
//! into the request's [`Caller`](crate::Caller), where idempotent tools find it.

use super::caller::Validator;

/// An axum middleware: `Authorization: Bearer <token>` → the validator's
/// [`Caller`](crate::Caller) in the request extensions, where idempotent tools find it; anything
/// else is answered 401.
///
/// `router.layer(axum::middleware::from_fn_with_state(validator, require_bearer))`, where
/// `validator` is your [`Validator`].
pub async fn require_bearer(
    axum::extract::State(validate): axum::extract::State<Validator>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let token = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match token.and_then(|token| validate(token.trim())) {
        Some(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        None => (http::StatusCode::UNAUTHORIZED, "a valid bearer token is required").into_response(),
    }
}
