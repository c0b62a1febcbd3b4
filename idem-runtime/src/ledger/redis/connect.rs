//! Reaching Redis: the URL (standalone `redis://…`, or a cluster — `redis+cluster://host:port,…`
//! or `redis://…?cluster=true`), the one connection every call shares, what must be sent to a
//! given node (the clock, `WAIT`, the operator's scans), and the startup check that refuses a
//! server that could evict records.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{Cmd, RedisError, RedisFuture, RedisResult, Value};

use crate::ledger::LedgerError;

/// How long connecting to a node may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a standalone server's answer may take (the crate's default, 500 ms, would cut a
/// `WAIT` short of its own timeout; the cluster client sets none). A handle bounds every ledger
/// call with its own, shorter, timeout; this bounds direct use.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many connections the writes that wait for replicas share, unless the URL says.
pub(super) const WAIT_CONNECTIONS: usize = 8;

/// What a Redis URL says, once idem's own parameters are taken out of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Target {
    /// The node URLs handed to the `redis` crate (one for standalone; the seeds of a cluster).
    pub(super) nodes: Vec<String>,
    /// Whether the nodes are seeds of a Redis Cluster.
    pub(super) cluster: bool,
    /// `wait=N`: replicas that must acknowledge a write before it is reported.
    pub(super) wait: Option<u32>,
    /// `wait_timeout_ms=M`: how long to wait for them (default 1000).
    pub(super) wait_timeout_ms: u64,
    /// `prefix=P`: the first part of every key (default `idem`).
    pub(super) prefix: String,
    /// `wait_connections=K`: how many connections the writes that wait for replicas share
    /// (default 8; a `WAIT` holds its connection until the replicas answer).
    pub(super) wait_connections: usize,
    /// The place, for messages: the URL without its password or idem's parameters.
    pub(super) place: String,
}

impl Target {
    /// Reads `url`.
    pub(super) fn parse(url: &str) -> Result<Self, LedgerError> {
        let (scheme, rest) = url.split_once("://").ok_or_else(|| usage(url, "it has no scheme"))?;
        let (scheme, mut cluster) = match scheme {
            "redis" | "valkey" => ("redis", false),
            "rediss" | "valkeys" => ("rediss", false),
            "redis+cluster" | "valkey+cluster" => ("redis", true),
            "rediss+cluster" | "valkeys+cluster" => ("rediss", true),
            _ => return Err(usage(url, "its scheme is not redis, rediss, redis+cluster or rediss+cluster")),
        };
        if scheme == "rediss" {
            return Err(usage(url, "TLS to Redis is not built into this idem (use redis:// on a private network)"));
        }
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (mut wait, mut wait_timeout_ms, mut prefix) = (None, 1000, "idem".to_owned());
        let mut wait_connections = WAIT_CONNECTIONS;
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let number = || value.parse::<u64>().map_err(|_| usage(url, &format!("`{name}` wants a whole number")));
            match name {
                "cluster" => cluster = matches!(value, "true" | "1" | "yes"),
                "wait" => wait = Some(u32::try_from(number()?).map_err(|_| usage(url, "`wait` is too large"))?),
                "wait_timeout_ms" => wait_timeout_ms = number()?,
                "wait_connections" => {
                    wait_connections = usize::try_from(number()?)
                        .ok()
                        .filter(|k| (1..=256).contains(k))
                        .ok_or_else(|| usage(url, "`wait_connections` wants a number of connections from 1 to 256"))?;
                }
                "prefix" if !value.is_empty() => prefix = value.to_owned(),
                "prefix" => return Err(usage(url, "`prefix` is empty")),
                _ => kept.push(pair),
            }
        }
        let (authority, path) = base.split_once('/').unwrap_or((base, ""));
        let (credentials, hosts) = authority.rsplit_once('@').map_or(("", authority), |(c, h)| (c, h));
        if hosts.is_empty() {
            return Err(usage(url, "it names no host"));
        }
        if cluster && !path.is_empty() && path != "0" {
            return Err(usage(url, "a Redis Cluster has one database: leave the path out"));
        }
        let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
        let at = if credentials.is_empty() { String::new() } else { format!("{credentials}@") };
        let nodes: Vec<String> = hosts
            .split(',')
            .map(|host| {
                if cluster { format!("redis://{at}{host}{query}") } else { format!("redis://{at}{host}/{path}{query}") }
            })
            .collect();
        if !cluster && nodes.len() > 1 {
            return Err(usage(url, "several hosts name a cluster: write redis+cluster://"));
        }
        let shown = if credentials.is_empty() {
            String::new()
        } else {
            format!("{}:***@", credentials.split(':').next().unwrap_or(""))
        };
        let kind = if cluster { "redis+cluster" } else { "redis" };
        let place =
            format!("{kind}://{shown}{hosts}{}", if path.is_empty() { String::new() } else { format!("/{path}") });
        Ok(Self { nodes, cluster, wait, wait_timeout_ms, prefix, wait_connections, place })
    }
}

fn usage(url: &str, why: &str) -> LedgerError {
    let scheme = url.split_once("://").map_or("?", |(scheme, _)| scheme);
    LedgerError::unavailable(format!(
        "the Redis ledger URL ({scheme}://…) cannot be used: {why}. Write redis://host:port[/db] for one server, \
         redis+cluster://host:port[,host:port…] for a Redis Cluster; parameters: wait=N (replicas that must \
         acknowledge each write), wait_timeout_ms=M, wait_connections=K, prefix=P"
    ))
}

/// The one connection every call of a ledger shares (it multiplexes, and reconnects by itself).
#[derive(Clone)]
pub(super) enum Conn {
    /// One server (with its replicas, if any, behind it).
    Single(ConnectionManager),
    /// A Redis Cluster: commands go to the primary of their key's slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(conn) => conn.req_packed_command(cmd),
            Self::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(conn) => conn.get_db(),
            Self::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A primary, by address (`None`: the one server of a standalone connection).
pub(super) type Node = Option<(String, u16)>;

impl Conn {
    /// Connects to `target`.
    pub(super) async fn open(target: &Target) -> RedisResult<Self> {
        if target.cluster {
            let client = redis::cluster::ClusterClient::builder(target.nodes.clone())
                .connection_timeout(CONNECT_TIMEOUT)
                .build()?;
            Ok(Self::Cluster(client.get_async_connection().await?))
        } else {
            let client = redis::Client::open(target.nodes[0].as_str())?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT));
            Ok(Self::Single(ConnectionManager::new_with_config(client, config).await?))
        }
    }

    /// Sends `cmd` to the primary that holds `key`'s slot (for a command that names no key:
    /// `WAIT`, `TIME`).
    pub(super) async fn on_primary_of(&mut self, key: &[u8], cmd: Cmd) -> RedisResult<Value> {
        match self {
            Self::Single(conn) => cmd.query_async(conn).await,
            Self::Cluster(conn) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                conn.route_command(cmd, RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route))).await
            }
        }
    }

    /// Sends `pipeline` to the primary that holds `key`'s slot, every command on one connection
    /// in order; answers each command's value (a server error among them as a value).
    pub(super) async fn pipeline_on_primary_of(
        &mut self,
        key: &[u8],
        pipeline: &redis::Pipeline,
    ) -> RedisResult<Vec<Value>> {
        let count = pipeline.len();
        match self {
            Self::Single(conn) => conn.req_packed_commands(pipeline, 0, count).await,
            Self::Cluster(conn) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                conn.route_pipeline(pipeline.clone(), 0, count, SingleNodeRoutingInfo::SpecificNode(route)).await
            }
        }
    }

    /// Sends `cmd` to `node`.
    pub(super) async fn on_node(&mut self, node: &Node, cmd: Cmd) -> RedisResult<Value> {
        match (self, node) {
            (Self::Cluster(conn), Some((host, port))) => {
                let routing = SingleNodeRoutingInfo::ByAddress { host: host.clone(), port: *port };
                conn.route_command(cmd, RoutingInfo::SingleNode(routing)).await
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// Every primary: what the operator's scans (pending, stats, sweep) and the startup checks
    /// must visit.
    pub(super) async fn primaries(&mut self) -> RedisResult<Vec<Node>> {
        let Self::Cluster(conn) = self else { return Ok(vec![None]) };
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
        let nodes = conn.route_command(redis::cmd("CLUSTER").arg("NODES").clone(), routing).await?;
        let nodes: String = redis::from_redis_value(nodes).map_err(RedisError::from)?;
        primaries_in(&nodes)
    }
}

/// The primaries that serve slots in a `CLUSTER NODES` answer, sorted. Flags are read whole:
/// `nofailover` is a setting, and a `fail?` node is one node's suspicion and still serves its
/// slots. A primary marked `fail` that still serves slots (its replica not promoted yet) is an
/// error: a scan without it would miss its records.
fn primaries_in(nodes: &str) -> RedisResult<Vec<Node>> {
    let mut primaries = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(address), Some(flags)) = (fields.get(1), fields.get(2)) else { continue };
        let serves = fields.len() > 8;
        let flag = |name: &str| flags.split(',').any(|flag| flag == name);
        if !flag("master") || !serves {
            continue;
        }
        let address = address.split('@').next().unwrap_or(address);
        if flag("fail") {
            return Err(RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ClusterDown),
                "a primary is down",
                format!("{address} still serves slots and its replica is not promoted yet; try again in a few seconds"),
            )));
        }
        if let Some((host, port)) = address.rsplit_once(':')
            && let Ok(port) = port.parse()
        {
            primaries.push(Some((host.to_owned(), port)));
        }
    }
    primaries.sort();
    Ok(primaries)
}

/// What a failed command means for its caller: an answer that never came (I/O, a dropped
/// connection, a timeout) may have been written ([`LedgerError::Ambiguous`]); a refusal — a
/// connection that could not be made, a server or cluster error — wrote nothing.
pub(super) fn failed(error: RedisError) -> LedgerError {
    let detail = format!("Redis: {error}");
    let failure = if error.is_connection_refusal() {
        LedgerError::unavailable(detail)
    } else if error.is_io_error() || error.is_timeout() || error.is_connection_dropped() {
        LedgerError::ambiguous(detail)
    } else {
        LedgerError::unavailable(detail)
    };
    failure.with_source(error)
}

/// An answer read as `T`, or the ledger's words for one that is not.
pub(super) fn read<T: redis::FromRedisValue>(value: Value) -> Result<T, LedgerError> {
    redis::from_redis_value(value).map_err(|error| LedgerError::corrupt(format!("an answer from Redis: {error}")))
}

/// One `INFO` field's value.
pub(super) fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(':')).map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn urls_name_a_server_or_a_cluster() {
        let single = Target::parse("redis://127.0.0.1:6379/2").unwrap();
        assert_eq!(
            (single.nodes, single.cluster, single.prefix.as_str()),
            (vec!["redis://127.0.0.1:6379/2".to_owned()], false, "idem")
        );
        let cluster = Target::parse("redis+cluster://a:7001,b:7002?wait=1&wait_timeout_ms=50&prefix=t").unwrap();
        assert_eq!(cluster.nodes, ["redis://a:7001", "redis://b:7002"]);
        assert_eq!(
            (cluster.cluster, cluster.wait, cluster.wait_timeout_ms, cluster.prefix.as_str()),
            (true, Some(1), 50, "t")
        );
        assert_eq!(cluster.wait_connections, super::WAIT_CONNECTIONS);
        assert_eq!(Target::parse("redis://a?wait=1&wait_connections=3").unwrap().wait_connections, 3);
        let flagged = Target::parse("redis://127.0.0.1:7101/?cluster=true").unwrap();
        assert!(flagged.cluster);
        assert_eq!(flagged.nodes, ["redis://127.0.0.1:7101"]);
    }

    #[test]
    fn a_password_never_shows() {
        let target = Target::parse("redis://app:s3cret@host:6379/0").unwrap();
        assert_eq!(target.place, "redis://app:***@host:6379/0");
        assert!(target.nodes[0].contains("s3cret"), "the crate gets it");
        let error = Target::parse("redis://app:s3cret@host:6379?wait=x").unwrap_err().to_string();
        assert!(!error.contains("s3cret") && error.contains("wait"), "{error}");
    }

    /// A primary is visited unless it serves no slots: `nofailover` (a setting, not a state) and
    /// `fail?` (one node's suspicion; it still serves) are primaries like any other, and one marked
    /// failed that still serves slots — its replica not promoted yet — is an error, since a scan
    /// without it would miss its records and the startup check would not read its policy. (Read
    /// as a substring, "fail" skipped `master,nofailover`: found by review.)
    #[test]
    fn the_primaries_are_every_node_that_serves_slots() {
        let line = |id: &str, port: u16, flags: &str, slots: &str| {
            format!("{id} 127.0.0.1:{port}@1{port} {flags} - 0 0 1 connected {slots}").trim_end().to_owned()
        };
        let nodes = [
            line("a", 7101, "myself,master,nofailover", "0-5460"),
            line("b", 7102, "master,fail?", "5461-10922"),
            line("c", 7103, "master", "10923-16383"),
            line("d", 7104, "slave,nofailover", ""),
            line("e", 7105, "master,fail,noaddr", ""),
            line("f", 7106, "master", ""),
        ]
        .join("\n");
        let ports: Vec<u16> =
            super::primaries_in(&nodes).unwrap().into_iter().flatten().map(|(_, port)| port).collect();
        assert_eq!(ports, [7101, 7102, 7103]);
        let down = format!("{nodes}\n{}", line("g", 7107, "master,fail", "16000"));
        let error = super::primaries_in(&down).unwrap_err().to_string();
        assert!(error.contains("127.0.0.1:7107") && error.contains("try again"), "{error}");
    }

    #[test]
    fn a_bad_url_says_what_to_write() {
        for url in ["redis:/x", "http://x", "rediss://x", "redis://a,b", "redis+cluster://a/3", "redis://x?prefix="]
            .into_iter()
            .chain(["redis://x?wait_connections=0", "redis://x?wait_connections=many"])
        {
            let error = Target::parse(url).unwrap_err().to_string();
            assert!(error.contains("redis+cluster://host:port"), "{url}: {error}");
        }
    }
}
