//! The client's side of a call (feature `mcp-client`): [`IdempotentClient`] gives each logical
//! `tools/call` one key, sends it in `_meta["idempotency-key"]` on every attempt, reconnects and
//! resends after a transport error only to a tool the server hints idempotent (or read-only),
//! waits out "in flight" with backoff, and hands conflicts and unknown outcomes to the caller.
//!
//! Guarantees: a logical call never gets a second key, and every error after a send names it;
//! a tool without the hint is never resent after a lost connection (a lost answer is
//! [`CallError::MaybeExecuted`]); of idem's refusals only "in flight" and those the server marks
//! `"retry": "safe"` are sent again, under the same key. It keeps no state of its own beyond the
//! connection and the tools' hints, and decides nothing the server's answer does not say
//! (`_meta["dev.idem/outcome"]`).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, MetaObject, RequestMetaObject};
use rmcp::service::{RoleClient, RunningService, Service, ServiceError};
use serde_json::Value;

use super::meta::OUTCOME_META_KEY;
use crate::recipe::CLIENT_KEY_META;

/// An error from the `connect` function an [`IdempotentClient`] is built with.
pub type ConnectError = Box<dyn std::error::Error + Send + Sync>;

/// How an [`IdempotentClient`] retries: how many times it sends one logical call after a
/// transport error, and how it waits on an operation in flight.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Sends of one call that ended in a transport error before it gives up (default 4).
    pub attempts: u32,
    /// The first wait after "in flight" (default 250 ms); each next one doubles.
    pub in_flight_first: Duration,
    /// The longest single wait (default 5 s).
    pub in_flight_max: Duration,
    /// How long one call waits on "in flight" in all before it answers [`CallError::InFlight`]
    /// (default 2 min).
    pub in_flight_total: Duration,
    /// How long one send may wait for its answer before the connection is dropped and, for a
    /// hinted tool, the call resent (default: as long as the transport waits). A hung connection
    /// that never closes is found only with this set.
    pub attempt_timeout: Option<Duration>,
    /// How long making a connection (and listing its tools) may take (default 30 s).
    pub connect_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            in_flight_first: Duration::from_millis(250),
            in_flight_max: Duration::from_secs(5),
            in_flight_total: Duration::from_mins(2),
            attempt_timeout: None,
            connect_timeout: Duration::from_secs(30),
        }
    }
}

/// A tool's answer to one logical call.
#[derive(Debug)]
#[non_exhaustive]
pub struct Called {
    /// The tool's result as the server sent it (an `isError` result of the tool's own is here
    /// too: it is the tool's answer, not idem's refusal).
    pub result: CallToolResult,
    /// The key this call was sent under, on every attempt.
    pub key: String,
    /// The operation's ref, when the server runs the tool through idem.
    pub reference: Option<String>,
    /// `true` when the server answered with the stored result of an earlier attempt or call.
    pub replayed: bool,
    /// How many times the call was sent.
    pub attempts: u32,
}

/// Why a logical call has no answer. Each variant names the tool and the key the call was
/// sent under, so the caller can resume it ([`IdempotentClient::call_with_key`]) or report it.
#[derive(Debug)]
#[non_exhaustive]
pub enum CallError {
    /// The call was sent and its answer lost, and the tool is not hinted idempotent, so it was not
    /// sent again: it may have run. Ask the server (or its operator) before calling it again.
    MaybeExecuted {
        /// The tool called.
        tool: String,
        /// The call's key.
        key: String,
        /// How the connection was lost.
        error: ServiceError,
    },
    /// A hinted tool's call lost its connection on each of `attempts` sends.
    GaveUp {
        /// The tool called.
        tool: String,
        /// The call's key, to resume it with.
        key: String,
        /// How many sends lost their connection.
        attempts: u32,
        /// How the last one was lost.
        error: ServiceError,
    },
    /// The operation was still running after waiting [`RetryPolicy::in_flight_total`]; the
    /// same call (with [`IdempotentClient::call_with_key`] and this key) gets its result later.
    InFlight {
        /// The tool called.
        tool: String,
        /// The call's key, to resume it with.
        key: String,
        /// The operation's ref, for the server's status tool.
        reference: Option<String>,
        /// How long the call waited.
        waited: Duration,
    },
    /// The server refused the call and says retrying it is not safe, or will not change the
    /// answer: `conflict` (the key was used with other arguments), `outcome_unknown` (an
    /// operator must settle it), or another of idem's codes.
    Refused {
        /// The tool called.
        tool: String,
        /// The call's key.
        key: String,
        /// idem's code (`_meta["dev.idem/outcome"].code`).
        code: String,
        /// The operation's ref, when the refusal names one.
        reference: Option<String>,
        /// The server's words.
        message: String,
    },
    /// A connection could not be made (or its tools listed) in time. `sent` says whether an
    /// earlier send of this call may have reached the server before: then it may have run, and
    /// only this key resumes it.
    Connect {
        /// The tool called.
        tool: String,
        /// The call's key.
        key: String,
        /// Whether an earlier send of this call lost its connection.
        sent: bool,
        /// Why no connection was made.
        error: ConnectError,
    },
    /// An error that is not a lost connection: the server answered with a JSON-RPC error (an
    /// unknown tool, invalid arguments), or rmcp could not use its answer (a task this client did
    /// not ask for, too many input rounds). Not retried.
    Service {
        /// The tool called.
        tool: String,
        /// The call's key.
        key: String,
        /// The error.
        error: ServiceError,
    },
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MaybeExecuted { tool, key, error } => write!(
                f,
                "`{tool}` may have run: its answer was lost ({error}), and the tool is not hinted idempotent, so it \
                 was not sent again (key {key}); find out whether it ran before calling it again"
            ),
            Self::GaveUp { tool, key, attempts, error } => write!(
                f,
                "`{tool}` lost its connection on each of {attempts} sends (last: {error}); call it again later with \
                 the same key ({key}) to get its result"
            ),
            Self::InFlight { tool, key, reference, waited } => write!(
                f,
                "`{tool}` is still in flight after {waited:?} (ref {}); call it again later with the same key \
                 ({key}) to get its result",
                reference.as_deref().unwrap_or("unknown")
            ),
            Self::Refused { tool, code, message, .. } => write!(f, "`{tool}` was refused ({code}): {message}"),
            Self::Connect { tool, key, sent: true, error } => write!(
                f,
                "cannot connect to the MCP server again ({error}) after `{tool}`'s answer was lost; it may have run: \
                 call it again with the same key ({key}) to get its result"
            ),
            Self::Connect { error, .. } => write!(f, "cannot connect to the MCP server: {error}"),
            Self::Service { tool, error, .. } => write!(f, "`{tool}` failed: {error}"),
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::MaybeExecuted { error, .. } | Self::GaveUp { error, .. } | Self::Service { error, .. } => Some(error),
            Self::Connect { error, .. } => Some(error.as_ref()),
            Self::InFlight { .. } | Self::Refused { .. } => None,
        }
    }
}

/// One connection and the names of the tools it may resend.
struct Session<S: Service<RoleClient>> {
    service: RunningService<RoleClient, S>,
    resendable: HashSet<String>,
}

/// An rmcp client that retries `tools/call` safely.
///
/// `connect` makes a new connection (an rmcp client service that has been served on a
/// transport); it is called for the first call and again after a connection is lost.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_runtime::mcp::client::IdempotentClient;
/// use rmcp::ServiceExt;
///
/// // Each connection: a new transport, served as an rmcp client. Here a TCP stream; a child
/// // process's stdio or streamable HTTP is built the same way.
/// let client = IdempotentClient::new(|| async {
///     let stream = tokio::net::TcpStream::connect("127.0.0.1:8931").await?;
///     Ok::<_, Box<dyn std::error::Error + Send + Sync>>(().serve(stream).await?)
/// });
/// let mut arguments = serde_json::Map::new();
/// arguments.insert("card".into(), "tok_visa".into());
/// arguments.insert("amount_cents".into(), 1250.into());
/// let called = client.call("charge_card", arguments).await?;
/// println!("ref {:?}, replayed: {}", called.reference, called.replayed);
/// # Ok(()) }
/// ```
pub struct IdempotentClient<S: Service<RoleClient>, C> {
    connect: C,
    session: tokio::sync::Mutex<Option<Arc<Session<S>>>>,
    policy: RetryPolicy,
    sends: AtomicU64,
}

impl<S, C, F, E> IdempotentClient<S, C>
where
    S: Service<RoleClient>,
    C: Fn() -> F,
    F: Future<Output = Result<RunningService<RoleClient, S>, E>>,
    E: Into<ConnectError>,
{
    /// A client that connects with `connect` when it first needs to, under the default
    /// [`RetryPolicy`].
    pub fn new(connect: C) -> Self {
        Self {
            connect,
            session: tokio::sync::Mutex::new(None),
            policy: RetryPolicy::default(),
            sends: AtomicU64::new(0),
        }
    }

    /// The same client, retrying as `policy` says.
    #[must_use]
    pub const fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// How many times this client has sent a logical call's `tools/call` (each resend counted;
    /// the input rounds of a multi-round-trip tool are not).
    pub fn sends(&self) -> u64 {
        self.sends.load(Ordering::Relaxed)
    }

    /// Calls `tool` with `arguments` as one logical call under a new key.
    ///
    /// # Errors
    /// A [`CallError`] says whether the call may have run and what to do next.
    pub async fn call(&self, tool: impl Into<Cow<'static, str>>, arguments: JsonObject) -> Result<Called, CallError> {
        self.call_with_key(tool, arguments, new_key()).await
    }

    /// Calls `tool` with `arguments` under `key`: the same logical call as every earlier one
    /// with this key (a call resumed after the client itself restarted, with the key it kept).
    ///
    /// # Errors
    /// As [`call`](Self::call).
    pub async fn call_with_key(
        &self,
        tool: impl Into<Cow<'static, str>>,
        arguments: JsonObject,
        key: impl Into<String>,
    ) -> Result<Called, CallError> {
        let tool = tool.into();
        let key = key.into();
        let mut meta = MetaObject(JsonObject::new());
        meta.0.insert(CLIENT_KEY_META.to_owned(), Value::String(key.clone()));
        let mut params = CallToolRequestParams::new(tool.clone()).with_arguments(arguments);
        params.meta = Some(RequestMetaObject(meta));
        let (mut attempts, mut lost) = (0_u32, 0_u32);
        let mut waited = Duration::ZERO;
        let mut pause = self.policy.in_flight_first;
        loop {
            let session = match self.session().await {
                Ok(session) => session,
                Err(error) => return Err(CallError::Connect { tool: tool.into_owned(), key, sent: lost > 0, error }),
            };
            attempts += 1;
            self.sends.fetch_add(1, Ordering::Relaxed);
            let error = match self.send(&session, params.clone()).await {
                Ok(result) => match outcome(&result) {
                    Outcome::Served { reference, replayed } => {
                        return Ok(Called { result, key, reference, replayed, attempts });
                    }
                    Outcome::Refused { code, reference, safe } if code == "in_flight" || safe => {
                        if waited >= self.policy.in_flight_total {
                            let tool = tool.into_owned();
                            if code == "in_flight" {
                                return Err(CallError::InFlight { tool, key, reference, waited });
                            }
                            let message = text_of(&result);
                            return Err(CallError::Refused { tool, key, code, reference, message });
                        }
                        if code == "shutting_down" {
                            // That replica is draining: the next send goes over a new connection.
                            self.forget(&session).await;
                        }
                        tokio::time::sleep(pause).await;
                        waited += pause;
                        pause = (pause * 2).min(self.policy.in_flight_max);
                        continue;
                    }
                    Outcome::Refused { code, reference, .. } => {
                        let message = text_of(&result);
                        return Err(CallError::Refused { tool: tool.into_owned(), key, code, reference, message });
                    }
                },
                Err(error) => error,
            };
            if !is_lost_connection(&error) {
                return Err(CallError::Service { tool: tool.into_owned(), key, error });
            }
            self.forget(&session).await;
            if !session.resendable.contains(tool.as_ref()) {
                return Err(CallError::MaybeExecuted { tool: tool.into_owned(), key, error });
            }
            lost += 1;
            if lost >= self.policy.attempts.max(1) {
                return Err(CallError::GaveUp { tool: tool.into_owned(), key, attempts: lost, error });
            }
            tracing::info!(%tool, %key, attempt = attempts, %error, "the connection was lost; sending the call again");
        }
    }

    /// One send, bounded by the policy's attempt timeout (a timeout counts as a lost connection).
    async fn send(&self, session: &Session<S>, params: CallToolRequestParams) -> Result<CallToolResult, ServiceError> {
        let call = session.service.call_tool(params);
        match self.policy.attempt_timeout {
            None => call.await,
            Some(limit) => {
                tokio::time::timeout(limit, call).await.unwrap_or(Err(ServiceError::Timeout { timeout: limit }))
            }
        }
    }

    /// The connection in use, made (with the tools' hints read) if there is none or it has closed
    /// (a connection found closed before a send is not a lost call).
    async fn session(&self) -> Result<Arc<Session<S>>, ConnectError> {
        let mut slot = self.session.lock().await;
        if let Some(session) = slot.as_ref()
            && !session.service.is_closed()
            && !session.service.peer().is_transport_closed()
        {
            return Ok(Arc::clone(session));
        }
        *slot = None;
        let connecting = async {
            let service = (self.connect)().await.map_err(Into::into)?;
            let tools = service.peer().list_all_tools().await?;
            Ok::<_, ConnectError>((service, tools))
        };
        let limit = self.policy.connect_timeout;
        let (service, tools) = tokio::time::timeout(limit, connecting)
            .await
            .map_err(|_| ConnectError::from(format!("no connection within {limit:?}")))??;
        let resendable = tools
            .into_iter()
            .filter(|tool| {
                tool.annotations
                    .as_ref()
                    .is_some_and(|hints| hints.is_idempotent() || hints.read_only_hint == Some(true))
            })
            .map(|tool| tool.name.into_owned())
            .collect();
        let session = Arc::new(Session { service, resendable });
        *slot = Some(Arc::clone(&session));
        drop(slot);
        Ok(session)
    }

    /// Drops `session` if it is still the one in use (another call may have replaced it).
    async fn forget(&self, session: &Arc<Session<S>>) {
        let mut slot = self.session.lock().await;
        if slot.as_ref().is_some_and(|current| Arc::ptr_eq(current, session)) {
            *slot = None;
        }
    }
}

/// A new client key: 128 random bits in hex.
#[must_use]
pub fn new_key() -> String {
    crate::bytes::hex(&crate::bytes::random::<16>())
}

/// What idem's `_meta["dev.idem/outcome"]` on a result says.
enum Outcome {
    /// An answer: fresh or replayed (a tool without idem: fresh, no ref).
    Served { reference: Option<String>, replayed: bool },
    /// A refusal, with whether the server says a retry is safe.
    Refused { code: String, reference: Option<String>, safe: bool },
}

fn outcome(result: &CallToolResult) -> Outcome {
    let idem = result.meta.as_ref().and_then(|meta| meta.0.get(OUTCOME_META_KEY));
    let field = |name: &str| idem.and_then(|idem| idem.get(name)).and_then(Value::as_str).map(str::to_owned);
    let reference = field("ref");
    match field("code") {
        Some(code) if result.is_error == Some(true) => {
            Outcome::Refused { code, reference, safe: field("retry").as_deref() == Some("safe") }
        }
        _ => {
            let replayed = idem.and_then(|idem| idem.get("replayed")).and_then(Value::as_bool).unwrap_or(false);
            Outcome::Served { reference, replayed }
        }
    }
}

fn text_of(result: &CallToolResult) -> String {
    let texts: Vec<&str> =
        result.content.iter().filter_map(|block| block.as_text().map(|text| text.text.as_str())).collect();
    texts.join("\n")
}

/// Whether `error` says the connection is gone (so the call may or may not have reached the
/// server), not that the server answered.
const fn is_lost_connection(error: &ServiceError) -> bool {
    matches!(error, ServiceError::TransportClosed | ServiceError::TransportSend(_) | ServiceError::Timeout { .. })
}
