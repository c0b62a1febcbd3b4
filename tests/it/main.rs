//! The idem test suite in one binary — one link of sea-orm, sqlx and rmcp instead of one per
//! file: the ledger conformance suite on every backend, what only a durable ledger shows, the
//! macros' behaviour (and their code under `clippy::pedantic`), rmcp, security, and the end to
//! end run with a real MCP client. The long reliability suites and the simulation are the
//! `reliability` target; compile errors are the `ui` target.
//!
//! Each module was once a binary of its own and now shares this process: a test that touches
//! process-wide state holds the lock that guards it ([`INSTALLED_HANDLE`]), and `layout` fails
//! on any source file no target compiles.

mod apalis_jobs;
mod architecture;
mod child_keys;
mod drain;
mod example_server;
mod failover;
mod golden_keys;
mod hooks;
mod http_door;
mod http_layer;
mod http_verdicts;
mod layout;
mod ledger_durable;
mod ledger_memory;
mod ledger_mysql;
mod ledger_postgres;
mod ledger_redis;
mod ledger_sqlite;
mod ledger_timeout;
mod macro_behaviour;
mod mcp_client;
mod mcp_e2e;
mod metrics;
mod mrtr;
mod ops;
mod owners;
mod pedantic;
mod processor_service;
mod publish;
mod rig_agent;
mod rmcp_tasks;
mod rmcp_tools;
mod rmcp_waiting;
mod rotation;
mod security;
mod sweeper;
mod waiting;
mod wire;

/// Held by every test that calls `Idem::install`: the installed handle is one per process, so a
/// second test's install would otherwise swap the ledger under the first one's free functions.
static INSTALLED_HANDLE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
