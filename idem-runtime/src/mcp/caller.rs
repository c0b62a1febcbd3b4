//! Where an rmcp tool's caller comes from: the request context's authenticated [`Caller`], or,
//! over stdio only, the caller in scope or the handle's local identity; what a request without
//! one is told — and the shape of
//! a validator that turns a bearer token into a caller.
//!
//! Guarantees: a request that arrived over HTTP is served for its authenticated caller only,
//! never the local identity nor a caller in scope; without one, none. A request refused for
//! want of a caller is told whose move it is: the client's (HTTP) or the operator's (stdio).

use std::sync::Arc;

use rmcp::RoleServer;
use rmcp::service::RequestContext;

use crate::idem::Idem;
use crate::rejection::Rejection;
use crate::scope::Caller;

/// The request context an idempotent rmcp tool reads its caller from (rmcp's; the public
/// signatures spell it out).
pub(crate) type Context = RequestContext<RoleServer>;

/// The authenticated caller of a request: the [`Caller`] an HTTP auth middleware inserted into
/// the request's extensions (or directly into the context's).
#[must_use]
pub fn caller_of(context: &Context) -> Option<Caller> {
    if let Some(caller) =
        context.extensions.get::<http::request::Parts>().and_then(|parts| parts.extensions.get::<Caller>())
    {
        return Some(caller.clone());
    }
    context.extensions.get::<Caller>().cloned()
}

/// Whether the request arrived over HTTP (rmcp put its request parts into the context). Such a
/// request is answered for its authenticated caller only: never the local (stdio) identity, nor
/// a caller in scope — without one it is refused.
#[must_use]
pub fn is_remote(context: &Context) -> bool {
    context.extensions.get::<http::request::Parts>().is_some()
}

/// The caller a request is served for: its authenticated one; over stdio, failing that, the
/// caller in scope or the handle's local identity. Over HTTP without one: none. For tools
/// without a recipe that must answer per caller (a listing scoped to the caller's tenant).
#[must_use]
pub fn request_caller(idem: &Idem, context: &RequestContext<RoleServer>) -> Option<Caller> {
    caller_of(context).or_else(|| {
        if is_remote(context) {
            return None;
        }
        crate::idem::current_caller().or_else(|| idem.local_caller().cloned())
    })
}

/// The refusal for a request served without a caller: over HTTP, the client must authenticate
/// ([`Rejection::NoCaller`]); locally (stdio), the server was started without a local caller
/// ([`Rejection::NoLocalCaller`]) — logged at WARN too, as only its operator can fix that.
pub(crate) fn no_caller(remote: bool) -> Rejection {
    if remote {
        return Rejection::NoCaller;
    }
    tracing::warn!(
        "refused a call over stdio: this server's idem handle has no local caller, so every idempotent tool call \
         on stdio is refused. Configure one with `Idem::builder(…).local_caller(…)` (and check it at startup with \
         `idem_runtime::mcp::check` and `Transport::Stdio`)"
    );
    Rejection::NoLocalCaller
}

/// A validator for [`require_bearer`](super::require_bearer): a token in, a caller out (or
/// `None`: 401). Check the token for real (a JWT's signature and audience, a session lookup):
/// whatever it returns is who every idempotent call of the request acts for.
pub type Validator = Arc<dyn Fn(&str) -> Option<Caller> + Send + Sync>;
