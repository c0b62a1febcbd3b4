//! A line-delimited JSON-RPC client over an in-process pipe to a real rmcp server: the tasks
//! and waiting tests speak to their servers through it, with several requests outstanding.

use std::collections::HashMap;
use std::time::Duration;

use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A line-delimited JSON-RPC client that can have several requests outstanding (answers are
/// kept by id until asked for).
pub struct Wire {
    writer: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    lines: tokio::io::Lines<BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
    answers: HashMap<u64, Value>,
    next_id: u64,
}

/// The request `_meta` of a client that declares the tasks extension.
pub fn declares_tasks() -> Value {
    json!({ "io.modelcontextprotocol/clientCapabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } } })
}

impl Wire {
    pub async fn connect<S: ServerHandler>(server: S) -> Self {
        let (client, server_end) = tokio::io::duplex(256 * 1024);
        tokio::spawn(async move {
            let running = server.serve(tokio::io::split(server_end)).await.expect("the server starts");
            let _ = running.waiting().await;
        });
        let (reader, writer) = tokio::io::split(client);
        let mut wire = Self { writer, lines: BufReader::new(reader).lines(), answers: HashMap::new(), next_id: 0 };
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
        let mut line = serde_json::to_vec(&json!({ "jsonrpc": "2.0", "method": "notifications/initialized" })).unwrap();
        line.push(b'\n');
        wire.writer.write_all(&line).await.unwrap();
        wire
    }

    pub async fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let message = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        self.writer.write_all(&line).await.unwrap();
        id
    }

    /// Waits for `started`, notified by the handler of request `id`.
    ///
    /// # Panics
    /// With the request's answer, if it is answered first (refused: its handler will never start),
    /// or when the server says nothing for as long as [`Wire::answer`] waits.
    pub async fn started(&mut self, id: u64, started: &tokio::sync::Notify) {
        tokio::select! {
            () = started.notified() => {}
            answer = self.answer(id) => panic!("request {id} was answered before its handler started: {answer}"),
        }
    }

    pub async fn answer(&mut self, id: u64) -> Value {
        loop {
            if let Some(answer) = self.answers.remove(&id) {
                return answer;
            }
            let line = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
                .await
                .expect("the server answers")
                .unwrap()
                .expect("the server keeps the pipe open");
            let message: Value = serde_json::from_str(&line).unwrap();
            if let Some(id) = message["id"].as_u64() {
                self.answers.insert(id, message);
            }
        }
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        self.answer(id).await
    }

    /// Sends a `tools/call` of `tool`, from a client with (`tasks`) or without the extension.
    pub async fn call(&mut self, tool: &str, deploy: &Value, tasks: bool) -> u64 {
        let mut params = json!({ "name": tool, "arguments": deploy });
        if tasks {
            params["_meta"] = declares_tasks();
        }
        self.send("tools/call", params).await
    }

    /// `tasks/get` for `task_id`, from a client that declares the tasks extension.
    pub async fn get_task(&mut self, task_id: &str) -> Value {
        self.request("tasks/get", json!({ "taskId": task_id, "_meta": declares_tasks() })).await
    }

    /// The `result` of the answer to `id`.
    pub async fn result(&mut self, id: u64) -> Value {
        let answer = self.answer(id).await;
        answer.get("result").cloned().unwrap_or_else(|| panic!("a result: {answer}"))
    }
}
