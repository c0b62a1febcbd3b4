//! The Lua scripts the Redis ledger runs: each touches one key (so one slot), and none decides
//! anything about a record — the decisions are `judge.rs`'s, made in Rust on the records read;
//! a script only writes them if nothing changed since they were read.

use std::sync::LazyLock;

use redis::{Cmd, Script};

/// Keeps a reference's record hash until `until_ms` of the ledger's clock (measured against the
/// server's `TIME`), and never less than the margin: shared by the scripts that write. A hash
/// needed past what a TTL can say (`i64::MAX` ms: kept for ever) keeps none — the sweep removes
/// it — since a `PEXPIRE` that failed would fail the script after its writes.
const KEEP: &str = r"
local function keep(key, until_ms, margin)
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local ttl = tonumber(until_ms) - now
  if ttl < tonumber(margin) then ttl = tonumber(margin) end
  if ttl > 1e13 then
    redis.call('PERSIST', key)
  else
    redis.call('PEXPIRE', key, ttl)
  end
end
";

/// A script the ledger sends as a command of its own making (`EVALSHA` on the key it touches),
/// so that it can share one pipeline — one connection, one node — with the `WAIT` after it.
/// Holds the script's text and its SHA-1.
pub(super) struct Lua(LazyLock<(String, String)>);

impl Lua {
    /// `EVALSHA` of this script on `key`; its arguments follow.
    pub(super) fn on(&self, key: &str) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.0.1.as_str()).arg(1).arg(key);
        cmd
    }

    /// `SCRIPT LOAD` of this script: for a node that answered `NOSCRIPT` (a new node, a restart).
    pub(super) fn load(&self) -> Cmd {
        redis::cmd("SCRIPT").arg("LOAD").arg(self.0.0.as_str()).clone()
    }
}

/// A script's text and its SHA-1, as [`Lua`] keeps them.
fn made(source: String) -> (String, String) {
    let hash = Script::new(&source).get_hash().to_owned();
    (source, hash)
}

/// A claim of a reference nobody holds a record of: creates its hash with the one record and a
/// version, and answers 1; or, if the hash exists, answers its fields (the claim is then decided
/// in Rust on them). KEYS: the hash. ARGV: version, field, record, keep until, margin.
pub(super) static CREATE: Lua = Lua(LazyLock::new(|| {
    made(format!(
        "{KEEP}
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HGETALL', KEYS[1]) end
redis.call('HSET', KEYS[1], 'v', ARGV[1], ARGV[2], ARGV[3])
keep(KEYS[1], ARGV[4], ARGV[5])
return 1"
    ))
}));

/// The compare-and-set: if the hash's version is still the one read (an empty one: no hash),
/// sets and deletes the fields given, stores a new version and answers 1 — deleting the hash
/// once no record is left (counted with the version in: on a hash that did not exist, one
/// record set is one record kept); else answers 0 and writes nothing. A hash that already has
/// the new version holds this very write, sent again by the client after it took effect (its
/// answer lost): answered 1, its version written again so that a `WAIT` after it covers the
/// first send's writes. The new version is this write's alone (random), so nothing another
/// writer left — however alike — is taken for it. KEYS: the hash. ARGV: the version read, the
/// new version, keep until, margin, how many fields to set, then field–value pairs, then the
/// fields to delete.
pub(super) static SWAP: Lua = Lua(LazyLock::new(|| {
    made(format!(
        "{KEEP}
local version = redis.call('HGET', KEYS[1], 'v') or ''
if version == ARGV[2] then
  redis.call('HSET', KEYS[1], 'v', ARGV[2])
  return 1
end
if version ~= ARGV[1] then return 0 end
local sets = tonumber(ARGV[5])
local i = 6
for _ = 1, sets do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[i])
  i = i + 1
end
redis.call('HSET', KEYS[1], 'v', ARGV[2])
if redis.call('HLEN', KEYS[1]) <= 1 then
  redis.call('DEL', KEYS[1])
  return 1
end
keep(KEYS[1], ARGV[3], ARGV[4])
return 1"
    ))
}));

/// Makes what was read of a hash something a `WAIT` after it covers: if the hash still has the
/// version read, writes that same version again (a write that changes nothing, but is
/// replicated, so a `WAIT` on this connection waits for everything the primary had until then)
/// and answers 1; else answers 0 and writes nothing. KEYS: the hash. ARGV: the version read.
pub(super) static TOUCH: Lua = Lua(LazyLock::new(|| {
    made(
        "if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', ARGV[1])
return 1"
            .to_owned(),
    )
}));

/// Keeps a secret version's check value unless one is kept, and answers the one kept. Writes it
/// (again) either way, so that a `WAIT` after it covers the value answered, whoever kept it.
/// KEYS: its key. ARGV: the check value.
pub(super) static KEEP_CHECK: Lua = Lua(LazyLock::new(|| {
    made(
        "local kept = redis.call('GET', KEYS[1]) or ARGV[1]
redis.call('SET', KEYS[1], kept)
return kept"
            .to_owned(),
    )
}));

/// Keeps until when a secret version's operations may be repeated, keeping the later time and
/// writing it (again) either way, so that a `WAIT` after it covers the version's time (for
/// version 0, nothing is written: a read), and answers every version with its time. KEYS: the
/// hash. ARGV: version, time.
pub(super) static KEEP_LIVE: Lua = Lua(LazyLock::new(|| {
    made(
        "if ARGV[1] ~= '0' then
local seen = redis.call('HGET', KEYS[1], ARGV[1])
local at = ARGV[2]
if seen and tonumber(seen) > tonumber(at) then at = seen end
redis.call('HSET', KEYS[1], ARGV[1], at)
end
return redis.call('HGETALL', KEYS[1])"
            .to_owned(),
    )
}));

/// Records an owner of a tool as seen at a time, keeping the later time, and answers every
/// owner with its time. Writes the owner's time (again) either way, so that a `WAIT` after it
/// covers every owner answered. KEYS: the tool's hash. ARGV: owner, time.
pub(super) static KEEP_OWNER: Lua = Lua(LazyLock::new(|| {
    made(
        "local seen = redis.call('HGET', KEYS[1], ARGV[1])
local at = ARGV[2]
if seen and tonumber(seen) > tonumber(at) then at = seen end
redis.call('HSET', KEYS[1], ARGV[1], at)
return redis.call('HGETALL', KEYS[1])"
            .to_owned(),
    )
}));

/// Keeps a tool's facts unless newer ones are kept. KEYS: the tool's hash. ARGV: time, facts.
pub(super) static KEEP_FACTS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "local t = tonumber(redis.call('HGET', KEYS[1], 't') or '-1')
if t <= tonumber(ARGV[1]) then redis.call('HSET', KEYS[1], 't', ARGV[1], 'f', ARGV[2]) end
return 1",
    )
});

/// Forgets a tool's owners and answers how many there were. KEYS: the tool's hash.
pub(super) static FORGET: LazyLock<Script> =
    LazyLock::new(|| Script::new("local n = redis.call('HLEN', KEYS[1]) redis.call('DEL', KEYS[1]) return n"));
