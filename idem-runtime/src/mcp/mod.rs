//! MCP servers with rmcp: callers from the request context, outcomes an agent can act on, the
//! ready status tool, and the check a server passes before it serves ([`check`]: its hinted tools
//! backed by recipes, the status tool served, a caller for its transport).
//!
//! On an rmcp tool (a method with `#[tool]` below `#[idempotent]`), the attribute adds a
//! [`ToolContext`] parameter to read the caller from, and returns a [`ToolOutcome`] that rmcp
//! turns into the tool result:
//!
//! - a fresh or replayed result carries `_meta["dev.idem/outcome"] = {"ref": "…", "replayed":
//!   true|false}` ([`OUTCOME_META_KEY`](wire::OUTCOME_META_KEY)); a replay also ends with a text block the model reads,
//!   [`replay_note`](wire::replay_note) ("nothing was executed again"), unless the tool says
//!   `#[idempotent(replay_note = false)]`;
//! - a refusal is an `isError` result in words for the model, with
//!   `_meta["dev.idem/outcome"] = {"code": "in_flight" | "conflict" | …, "ref": "…", "statusTool":
//!   "idem_status", "executed": false, "retry": "no" | "safe"}`;
//! - the tool's definition in `tools/list` advertises its recipe under
//!   `_meta["dev.idem/recipe"]` ([`RECIPE_META_KEY`](wire::RECIPE_META_KEY), [`recipe_json`](wire::recipe_json)).
//!
//! A tool that may ask the client for input before it acts (a multi-round-trip request) returns
//! a [`Step`] ([`confirm`] and [`confirmed`] for the common confirmation): its input request
//! never completes the operation, the continuation runs it once, and the `requestState` it
//! carries is sealed to the operation (`single_use_state` makes it single-use, through the
//! ledger).
//!
//! [`ToolError`] is a ready error type for such tools (each constructor says what the error
//! means for a repeat); your own type works too, if it implements
//! [`IdempotentError`](crate::IdempotentError) and rmcp's `IntoContents`.
//!
//! A unit test calls a tool directly, with [`ToolContext::local`] or
//! [`ToolContext::for_caller`] for the added parameter and [`ToolOutcome::into_result`] for
//! the tool's own result (see [`ToolContext`]).
//!
//! The caller: over streamable HTTP, the [`Caller`](crate::Caller) an auth middleware put into
//! the request's extensions ([`require_bearer`] is a small one to replace with your own
//! validation); over stdio, the handle's configured local identity
//! ([`Builder::local_caller`](crate::settings::Builder::local_caller)). Neither: refused — over HTTP
//! with `no_caller` (the client must authenticate), over stdio with `no_local_caller` (the
//! operator must configure one; [`check`] with [`Transport::Stdio`] catches that at startup).
//!
//! What idem puts on the wire (its `_meta` keys, the status tool's name) is in [`wire`]; what a
//! server forwards MCP tasks' requests to, in [`tasks`].

mod caller;
pub(crate) mod check;
#[cfg(feature = "mcp-client")]
pub mod client;
mod context;
mod error;
#[cfg(feature = "mcp-http")]
mod http;
pub(crate) mod macro_support;
pub(crate) mod meta;
mod mrtr;
pub(crate) mod outcome;
mod status;
mod task;

pub use caller::{Validator, request_caller};
pub use check::{NotReady, Transport, check};
pub use context::ToolContext;
pub use error::ToolError;
#[cfg(feature = "mcp-http")]
pub use http::require_bearer;
pub use mrtr::{Step, confirm, confirmed};
pub use outcome::ToolOutcome;
pub use status::status_tool;

/// What idem puts on the wire of an MCP server, for clients, hand-written tools and tests: the
/// `_meta` keys of an outcome and a recipe (and what marks a tool added by hand as backed:
/// [`recipe_meta`](wire::recipe_meta), or [`backed_meta`](wire::backed_meta) with
/// [`Backing::Inherent`](wire::Backing::Inherent)), the status tool's name, the answer a refusal
/// is and the note a replay ends with.
pub mod wire {
    pub use super::check::{Backing, backed_meta};
    pub use super::meta::{OUTCOME_META_KEY, RECIPE_META_KEY, recipe_json, recipe_meta};
    pub use super::outcome::{refusal, replay_note};
    pub use crate::rejection::STATUS_TOOL;
}

/// MCP tasks (`task = true` tools): what a server forwards `tasks/get` and `tasks/cancel` to,
/// the poll interval it advertises, and the JSON-RPC error codes of a task that ended without
/// a result.
pub mod tasks {
    pub use super::task::{CANNOT_CANCEL, NOTHING_RAN, OUTCOME_UNKNOWN, POLL_INTERVAL_MS, cancel_task, get_task};
}
