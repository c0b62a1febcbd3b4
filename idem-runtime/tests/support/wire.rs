//! A line-delimited JSON-RPC client for the rmcp tests: an MCP client on one end of an in-memory
//! pipe, the server on the other, speaking as over stdio.

use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A line-delimited JSON-RPC client on one end of an in-memory pipe, the server on the other.
pub struct Wire {
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    next_id: u64,
}

impl Wire {
    pub async fn connect<S: ServerHandler>(server: S) -> Self {
        let (client, server_end) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let running = server.serve(tokio::io::split(server_end)).await.expect("the server starts");
            let _ = running.waiting().await;
        });
        let (reader, writer) = tokio::io::split(client);
        let mut wire = Self { writer, lines: BufReader::new(reader).lines(), next_id: 0 };
        let init = wire
            .request(
                "initialize",
                json!({
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": { "name": "idem-test", "version": "0.0.0" }
                }),
            )
            .await;
        assert!(init.get("result").is_some(), "{init}");
        wire.send(json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).await;
        wire
    }

    pub async fn send(&mut self, message: Value) {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.writer.write_all(&line).await.unwrap();
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send(json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params })).await;
        loop {
            let line = tokio::time::timeout(std::time::Duration::from_secs(10), self.lines.next_line())
                .await
                .expect("the server answers")
                .unwrap()
                .expect("the server keeps the pipe open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == json!(id) {
                return message;
            }
        }
    }

    /// A tool call's `result`.
    pub async fn call(&mut self, tool: &str, arguments: Value) -> Value {
        let response = self.request("tools/call", json!({ "name": tool, "arguments": arguments })).await;
        response.get("result").cloned().unwrap_or_else(|| panic!("no result: {response}"))
    }
}
