//! The fleet benchmark (issue 31): `cargo bench -p idem-tests --bench fleet`.
//!
//! N idem processes (`fleet_worker`, default 3) charge distinct orders — a claim and a completion
//! each, through `Idem::call` with a no-op handler — against one PostgreSQL, a standalone Redis
//! (one the benchmark starts, append-only with `fsync` on every write, and the machine's own,
//! which keeps nothing on disk) and the local three-primary Redis Cluster (without and with
//! `wait=1`: each claim and result acknowledged by a replica), at rising
//! concurrency, side by side in one run on this machine. Per engine and level: calls per second, p50 and p99 latency, and the CPU the
//! engine's server processes used per call (and the idem processes' own). The knee is the lowest
//! level that reaches 90% of the engine's best throughput. Compare ratios, not times: the
//! processes, the servers and this benchmark share the machine's cores.
//!
//! Beside PostgreSQL, its floor: idem's own two statements sent through sqlx from the same kind
//! of process without idem (`fleet_worker … raw`), so the client CPU per call reads against what
//! two round trips cost before idem does anything.
//!
//! `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL`, `IDEM_TEST_REDIS_CLUSTER_URL` name the
//! engines (defaults: the local servers, and the cluster `scripts/redis-cluster.sh up` starts);
//! one that does not answer is skipped and says so. `IDEM_FLEET_PROCESSES` (3),
//! `IDEM_FLEET_TASKS` (tasks per process at each level, `1,4,16,64,256`), `IDEM_FLEET_SECONDS` (4 per
//! level).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};

use sea_orm::{ConnectionTrait, Database, Statement};

const POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";
const REDIS: &str = "redis://127.0.0.1:6379";
const CLUSTER: &str = "redis+cluster://127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// CPU time (user + system) of a process, in milliseconds (`/proc/<pid>/stat`, 100 ticks a
/// second); 0 for one that is gone.
fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    fields.get(11..13).map_or(0, |f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum::<u64>()) * 10
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// A process and every child it has now.
fn family(root: u32) -> Vec<u32> {
    let mut pids = vec![root];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok())
            && parent_of(pid) == Some(root)
        {
            pids.push(pid);
        }
    }
    pids
}

/// The server processes of an engine, found again before each reading (PostgreSQL's backends
/// come with the pools).
enum Servers {
    Postgres(u32),
    Redis(Vec<u32>),
}

impl Servers {
    /// Each server process's CPU time now.
    fn cpu_ms(&self) -> BTreeMap<u32, u64> {
        let pids = match self {
            Self::Postgres(postmaster) => family(*postmaster),
            Self::Redis(pids) => pids.clone(),
        };
        pids.into_iter().map(|pid| (pid, cpu_ms(pid))).collect()
    }

    /// The CPU time the server processes used since `before`: per process alive now, what it used
    /// since then (all of it, for one that started since) — a backend of an earlier level's pool
    /// that exits meanwhile takes nothing away.
    fn used_since(&self, before: &BTreeMap<u32, u64>) -> u64 {
        self.cpu_ms().into_iter().map(|(pid, now)| now.saturating_sub(before.get(&pid).copied().unwrap_or(0))).sum()
    }
}

async fn postgres_servers(url: &str) -> Option<Servers> {
    let db = Database::connect(url).await.ok()?;
    let row =
        db.query_one_raw(Statement::from_string(db.get_database_backend(), "SELECT pg_backend_pid()")).await.ok()??;
    let backend: i32 = row.try_get_by_index(0).ok()?;
    Some(Servers::Postgres(parent_of(u32::try_from(backend).ok()?)?))
}

async fn redis_pid(url: &str) -> Option<u32> {
    let client = redis::Client::open(url).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO").arg("server").query_async(&mut conn).await.ok()?;
    info.lines().find_map(|line| line.strip_prefix("process_id:")).and_then(|pid| pid.trim().parse().ok())
}

async fn redis_servers(url: &str) -> Option<Servers> {
    if !url.contains("cluster") {
        return Some(Servers::Redis(vec![redis_pid(url).await?]));
    }
    // Every node of the cluster, replicas included: replication is part of what a write costs.
    let seeds = url.split_once("://")?.1.split('?').next()?;
    let mut pids = BTreeSet::new();
    for seed in seeds.split(',') {
        let Ok(client) = redis::Client::open(format!("redis://{seed}")) else { continue };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else { continue };
        let Ok(nodes) = redis::cmd("CLUSTER").arg("NODES").query_async::<String>(&mut conn).await else { continue };
        for line in nodes.lines() {
            let Some(address) = line.split(' ').nth(1).and_then(|a| a.split('@').next()) else { continue };
            if let Some(pid) = redis_pid(&format!("redis://{address}")).await {
                pids.insert(pid);
            }
        }
        break;
    }
    (!pids.is_empty()).then(|| Servers::Redis(pids.into_iter().collect()))
}

/// The key prefix the benchmark's Redis ledgers write under.
const PREFIX: &str = "prefix=idem-fleet";

/// `url` with one more query parameter.
fn with_param(url: &str, param: &str) -> String {
    if url.is_empty() {
        return String::new();
    }
    format!("{url}{}{param}", if url.contains('?') { '&' } else { '?' })
}

/// Deletes what the benchmark wrote to the engine at `url`: the rows of its own database, or the
/// keys under its prefix on every primary.
async fn forget(url: &str) {
    if url.is_empty() {
        return;
    }
    if !idem_runtime::ledger::is_redis_url(url) {
        if let Ok(db) = Database::connect(url).await {
            for table in ["idem_records", "idem_superseded"] {
                let _ = db.execute_unprepared(&format!("DELETE FROM {table}")).await;
            }
        }
        return;
    }
    let seeds = url.split_once("://").map_or("", |(_, rest)| rest).split('?').next().unwrap_or("");
    let mut primaries: Vec<String> = seeds.split(',').map(|seed| format!("redis://{seed}")).collect();
    if url.contains("cluster") {
        let nodes = async {
            let mut conn =
                redis::Client::open(primaries[0].as_str()).ok()?.get_multiplexed_async_connection().await.ok()?;
            redis::cmd("CLUSTER").arg("NODES").query_async::<String>(&mut conn).await.ok()
        };
        let nodes = nodes.await.unwrap_or_default();
        primaries = nodes
            .lines()
            .filter(|line| line.split(' ').nth(2).is_some_and(|flags| flags.contains("master")))
            .filter_map(|line| line.split(' ').nth(1)?.split('@').next().map(|address| format!("redis://{address}")))
            .collect();
    }
    let mut deleted = 0;
    for primary in primaries {
        let Ok(client) = redis::Client::open(primary.as_str()) else { continue };
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else { continue };
        let mut cursor = 0u64;
        loop {
            let scan = redis::cmd("SCAN").arg(cursor).arg("MATCH").arg("idem-fleet:*").arg("COUNT").arg(1000).clone();
            let Ok((next, keys)) = scan.query_async::<(u64, Vec<String>)>(&mut conn).await else { break };
            let mut unlink = redis::pipe();
            for key in &keys {
                unlink.cmd("UNLINK").arg(key).ignore();
            }
            if unlink.query_async::<()>(&mut conn).await.is_ok() {
                deleted += keys.len();
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    println!("(deleted the benchmark's {deleted} keys)");
}

/// A `redis-server` of the benchmark's own on a free port, append-only with `fsync` on every
/// write (as the cluster's nodes are), in a directory of its own; stopped when dropped.
struct DurableRedis {
    child: Child,
    dir: std::path::PathBuf,
    url: String,
}

impl DurableRedis {
    fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let dir = std::env::temp_dir().join(format!("idem-fleet-redis-{port}"));
        std::fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let redis = Self { child, dir, url: format!("redis://127.0.0.1:{port}") };
        for _ in 0..50 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(redis);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        None
    }
}

impl Drop for DurableRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What one level of one engine came to.
struct Level {
    tasks: usize,
    calls: u64,
    errors: u64,
    seconds: f64,
    p50: u64,
    p99: u64,
    server_cpu_ms: u64,
    idem_cpu_ms: u64,
}

impl Level {
    #[allow(clippy::cast_precision_loss)]
    fn per_second(&self) -> f64 {
        self.calls as f64 / self.seconds
    }

    #[allow(clippy::cast_precision_loss)]
    fn server_us_per_call(&self) -> f64 {
        self.server_cpu_ms as f64 * 1000.0 / self.calls.max(1) as f64
    }

    #[allow(clippy::cast_precision_loss)]
    fn idem_us_per_call(&self) -> f64 {
        self.idem_cpu_ms as f64 * 1000.0 / self.calls.max(1) as f64
    }
}

fn spawn(url: &str, tasks: usize, millis: u64, run: &str, raw: bool) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fleet_worker"))
        .args([url, &tasks.to_string(), &millis.to_string(), run])
        .args(raw.then_some("raw"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start fleet_worker")
}

fn read_line(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("read a worker");
    line.trim_end().to_owned()
}

fn level(
    url: &str,
    raw: bool,
    servers: &Servers,
    processes: usize,
    tasks: usize,
    millis: u64,
) -> Result<Level, String> {
    let run = format!("fleet{}", idem_runtime::ledger::Token::random().get());
    let mut children: Vec<Child> = (0..processes).map(|_| spawn(url, tasks, millis, &run, raw)).collect();
    let mut readers: Vec<_> = children.iter_mut().map(|c| BufReader::new(c.stdout.take().expect("stdout"))).collect();
    for reader in &mut readers {
        let line = read_line(reader);
        if line != "READY" {
            return Err(format!("a worker said: {line}"));
        }
    }
    let before = servers.cpu_ms();
    let started = std::time::Instant::now();
    for child in &mut children {
        let _ = writeln!(child.stdin.as_mut().expect("stdin"), "go");
    }
    let (mut calls, mut errors, mut idem_cpu, mut latencies) = (0, 0, 0, Vec::new());
    for reader in &mut readers {
        let done = read_line(reader);
        let fields: Vec<u64> = done.split(' ').skip(1).filter_map(|f| f.parse().ok()).collect();
        let [n, failed, cpu] = fields[..] else { return Err(format!("a worker said: {done}")) };
        calls += n;
        errors += failed;
        idem_cpu += cpu;
        let listed = read_line(reader);
        latencies.extend(listed.split(' ').skip(1).filter_map(|f| f.parse::<u64>().ok()));
    }
    let seconds = started.elapsed().as_secs_f64();
    let server_cpu_ms = servers.used_since(&before);
    for mut child in children {
        drop(child.stdin.take());
        let _ = child.wait();
    }
    latencies.sort_unstable();
    let at = |p: f64| {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let index = ((latencies.len().saturating_sub(1)) as f64 * p).round() as usize;
        latencies.get(index).copied().unwrap_or(0)
    };
    Ok(Level { tasks, calls, errors, seconds, p50: at(0.5), p99: at(0.99), server_cpu_ms, idem_cpu_ms: idem_cpu })
}

/// The lowest level that reaches 90% of the best throughput.
fn knee(levels: &[Level]) -> Option<&Level> {
    let best = levels.iter().map(Level::per_second).fold(0.0, f64::max);
    levels.iter().find(|level| level.per_second() >= 0.9 * best)
}

#[tokio::main]
async fn main() {
    let processes: usize = env_or("IDEM_FLEET_PROCESSES", "3").parse().expect("IDEM_FLEET_PROCESSES");
    let levels: Vec<usize> = env_or("IDEM_FLEET_TASKS", "1,4,16,64,256")
        .split(',')
        .map(|n| n.trim().parse().expect("IDEM_FLEET_TASKS"))
        .collect();
    let millis = env_or("IDEM_FLEET_SECONDS", "4").parse::<u64>().expect("IDEM_FLEET_SECONDS") * 1000;
    // A standalone Redis as durable as the cluster's nodes, of the benchmark's own.
    let durable = DurableRedis::start();
    let durable_url = durable.as_ref().map_or_else(String::new, |redis| redis.url.clone());
    // What the benchmark writes goes under names of its own — a database, a key prefix — and is
    // deleted after each engine: a shared server is left as it was found (a million leftover
    // records would slow every scan the test suite makes there).
    let postgres =
        idem_tests::own_database("fleet", "IDEM_TEST_POSTGRES_URL", POSTGRES, "fleet").await.unwrap_or_default();
    let cluster = with_param(&env_or("IDEM_TEST_REDIS_CLUSTER_URL", CLUSTER), PREFIX);
    // The second row is the first's floor: idem's own claim and completion statements sent
    // through sqlx from the same kind of process, without idem — what two round trips cost the
    // client before idem does anything.
    let engines = [
        ("PostgreSQL (fsync at commit)", postgres.clone(), false),
        ("PostgreSQL, idem's two statements through sqlx, no idem", postgres, true),
        ("Redis standalone (appendfsync always)", durable_url, false),
        ("Redis standalone (no persistence)", with_param(&env_or("IDEM_TEST_REDIS_URL", REDIS), PREFIX), false),
        ("Redis Cluster, 3 primaries + 3 replicas (appendfsync always)", cluster.clone(), false),
        ("Redis Cluster, as above, wait=1", with_param(&cluster, "wait=1"), false),
    ];
    println!("fleet: {processes} idem processes, tasks per process {levels:?}, {} s per level", millis / 1000);
    let mut results: Vec<(&str, Vec<Level>)> = Vec::new();
    for (name, url, raw) in &engines {
        let servers = if idem_runtime::ledger::is_redis_url(url) {
            redis_servers(url).await
        } else {
            postgres_servers(url).await
        };
        let Some(servers) = servers.filter(|_| !url.is_empty()) else {
            println!("SKIPPED {name}: nothing answers at {url}");
            continue;
        };
        let mut measured = Vec::new();
        for &tasks in &levels {
            match level(url, *raw, &servers, processes, tasks, millis) {
                Ok(level) => {
                    println!(
                        "{name:<42} {:>3} tasks x {processes}: {:>8.0} calls/s  p50 {:>6} µs  p99 {:>6} µs  server CPU {:>6.1} µs/call  client CPU {:>6.1} µs/call  errors {}",
                        level.tasks,
                        level.per_second(),
                        level.p50,
                        level.p99,
                        level.server_us_per_call(),
                        level.idem_us_per_call(),
                        level.errors
                    );
                    measured.push(level);
                }
                Err(why) => println!("SKIPPED {name} at {tasks} tasks: {why}"),
            }
        }
        results.push((name, measured));
        forget(url).await;
    }
    println!();
    println!(
        "| engine | knee (tasks × processes) | calls/s at the knee | p50 | p99 | server CPU per call | client CPU per call (idem's processes) | best calls/s | vs PostgreSQL (knee calls/s) | vs PostgreSQL (server CPU per call) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let base = results.first().and_then(|(_, levels)| knee(levels)).map(|k| (k.per_second(), k.server_us_per_call()));
    for (name, levels) in &results {
        let Some(k) = knee(levels) else { continue };
        let best = levels.iter().map(Level::per_second).fold(0.0, f64::max);
        let (vs_rate, vs_cpu) = base.map_or((String::new(), String::new()), |(rate, cpu)| {
            (format!("{:.2}", k.per_second() / rate), format!("{:.2}", k.server_us_per_call() / cpu))
        });
        println!(
            "| {name} | {} × {processes} | {:.0} | {} µs | {} µs | {:.1} µs | {:.1} µs | {best:.0} | {vs_rate} | {vs_cpu} |",
            k.tasks,
            k.per_second(),
            k.p50,
            k.p99,
            k.server_us_per_call(),
            k.idem_us_per_call()
        );
    }
}
