//! Where the probed server is, and a session with it: a process spoken to over stdio, or a
//! streamable HTTP endpoint. A session can be cut while a call is in flight — the process
//! SIGKILLed, or the HTTP connection dropped — so the next session repeats a call whose answer
//! was lost.

use std::collections::HashMap;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject, Tool};
use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::Value;

/// The server under probe.
#[derive(Clone, Debug)]
pub enum Target {
    /// A command started for each session, spoken to over its stdin and stdout.
    Stdio { program: String, args: Vec<String>, env: Vec<(String, String)>, cwd: Option<String> },
    /// A streamable HTTP endpoint, with headers sent on every request.
    Http { url: String, bearer: Option<String>, headers: Vec<(String, String)> },
}

impl Target {
    /// A human name for the report.
    pub fn describe(&self) -> String {
        match self {
            Self::Stdio { program, args, .. } => format!("stdio: {program} {}", args.join(" ")).trim_end().to_owned(),
            Self::Http { url, .. } => format!("streamable HTTP: {url}"),
        }
    }

    /// Opens a session (a new process, for stdio).
    pub async fn connect(&self) -> Result<Session, String> {
        match self {
            Self::Stdio { program, args, env, cwd } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args).envs(env.iter().cloned());
                if let Some(cwd) = cwd {
                    command.current_dir(cwd);
                }
                let (transport, _) = TokioChildProcess::builder(command)
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .map_err(|error| format!("cannot start `{program}`: {error}"))?;
                let pid = transport.id();
                let client = ()
                    .serve(transport)
                    .await
                    .map_err(|error| format!("`{program}` started but did not speak MCP on its stdout: {error}"))?;
                Ok(Session { client: Some(client), pid })
            }
            Self::Http { url, bearer, headers } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let name = http::HeaderName::try_from(name.as_str())
                        .map_err(|error| format!("header name `{name}`: {error}"))?;
                    let value = http::HeaderValue::try_from(value.as_str())
                        .map_err(|error| format!("header `{name}`: {error}"))?;
                    custom.insert(name, value);
                }
                let mut config =
                    rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                        url.as_str(),
                    )
                    .custom_headers(custom);
                if let Some(token) = bearer {
                    config = config.auth_header(token.clone());
                }
                let transport = StreamableHttpClientTransport::from_config(config);
                let client =
                    ().serve(transport)
                        .await
                        .map_err(|error| format!("cannot reach an MCP server at {url}: {error}"))?;
                Ok(Session { client: Some(client), pid: None })
            }
        }
    }
}

/// One session with the server.
pub struct Session {
    client: Option<RunningService<RoleClient, ()>>,
    /// The server process, over stdio.
    pid: Option<u32>,
}

/// A tool call's answer as JSON (`content`, `structuredContent`, `isError`, `_meta`), or the
/// protocol error that came instead.
pub type Answer = Result<Value, String>;

impl Session {
    fn client(&self) -> &RunningService<RoleClient, ()> {
        self.client.as_ref().expect("a session is used only before it is cut")
    }

    /// A handle for calls made at once.
    pub fn peer(&self) -> Peer<RoleClient> {
        self.client().peer().clone()
    }

    /// Every tool the server lists.
    pub async fn tools(&self) -> Result<Vec<Tool>, String> {
        self.client().list_all_tools().await.map_err(|error| format!("tools/list failed: {error}"))
    }

    /// Cuts the session as a lost connection would: the process is SIGKILLed (stdio) or the
    /// connection dropped (HTTP). Calls in flight never get their answer.
    pub fn cut(&mut self) {
        if let Some(pid) = self.pid.take() {
            let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
        drop(self.client.take());
    }
}

/// Calls `tool` with `arguments` on `peer`.
pub async fn call(peer: &Peer<RoleClient>, tool: &str, arguments: &JsonObject) -> Answer {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
    match peer.call_tool(params).await {
        Ok(result) => serde_json::to_value(&result).map_err(|error| error.to_string()),
        Err(error) => Err(error.to_string()),
    }
}
