//! What the Redis ledger answers beyond a call's path, by looking across the ledger: every
//! record hash on every primary (for stats, pending and the sweep), whether a Redis holds a
//! ledger at all, and the tool owners an operator lists or forgets (`idem tools`).

use std::collections::BTreeSet;

use super::codec::Bundle;
use super::connect::{Conn, Node, failed, read};
use super::{RedisLedger, scripts};
use crate::key::Ref;
use crate::ledger::{LedgerError, ToolOwner};

/// How many keys one `SCAN` step asks a node for.
const SCAN_COUNT: usize = 1000;

/// How many hashes an operator's scan reads at once.
const READS_AT_ONCE: usize = 16;

/// The reference a record hash's key names (`…:r:{<ref>}`).
pub(super) fn reference_of(key: &str) -> Option<Ref> {
    let inner = key.rsplit_once('{')?.1.strip_suffix('}')?;
    Ref::parse(inner).ok()
}

/// A glob pattern matching keys that start with `text` (its glob characters escaped), then `*`.
fn starting_with(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 1);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('*');
    pattern
}

/// The keys matching a pattern on every primary, a `SCAN` page at a time (a key may come twice:
/// `SCAN` promises every key at least once).
pub(super) struct Pages {
    conn: Conn,
    pattern: String,
    /// The primaries still to scan, the one being scanned last.
    nodes: Vec<Node>,
    cursor: u64,
}

impl Pages {
    /// The next page of keys (never empty), or `None` once every primary was scanned.
    pub(super) async fn next(&mut self) -> Result<Option<Vec<String>>, LedgerError> {
        while let Some(node) = self.nodes.last() {
            let scan = redis::cmd("SCAN")
                .arg(self.cursor)
                .arg("MATCH")
                .arg(&self.pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .clone();
            let (next, found): (u64, Vec<String>) = read(self.conn.on_node(node, scan).await.map_err(failed)?)?;
            self.cursor = next;
            if next == 0 {
                self.nodes.pop();
            }
            if !found.is_empty() {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }
}

impl RedisLedger {
    /// The keys matching `pattern` on every primary, a `SCAN` page at a time.
    pub(super) async fn pages(&self, pattern: String) -> Result<Pages, LedgerError> {
        let mut nodes = self.conn.clone().primaries().await.map_err(failed)?;
        nodes.reverse();
        Ok(Pages { conn: self.conn.clone(), pattern, nodes, cursor: 0 })
    }

    /// The record hashes on every primary, a page at a time.
    pub(super) async fn bundle_pages(&self) -> Result<Pages, LedgerError> {
        self.pages(starting_with(&format!("{}:r:", self.prefix))).await
    }

    /// Every key matching `pattern`, on every primary, once each.
    async fn keys(&self, pattern: String) -> Result<Vec<String>, LedgerError> {
        let mut keys = BTreeSet::new();
        let mut pages = self.pages(pattern).await?;
        while let Some(page) = pages.next().await? {
            keys.extend(page);
        }
        Ok(keys.into_iter().collect())
    }

    /// The records of each hash of a page, read a few at once (the connection pipelines them), with
    /// the memory the hash takes if `sized` (`MEMORY USAGE`); a hash gone meanwhile is left out.
    pub(super) async fn read_page(
        &self,
        keys: Vec<String>,
        sized: bool,
    ) -> Result<Vec<(Ref, Bundle, u64)>, LedgerError> {
        let mut read = Vec::with_capacity(keys.len());
        // A few at a time: enough to fill the round trips, not a flood that a failing node
        // would hold up every call of the process behind.
        for chunk in keys.chunks(READS_AT_ONCE) {
            let mut reads = tokio::task::JoinSet::new();
            for key in chunk {
                let Some(reference) = reference_of(key) else { continue };
                let (ledger, key) = (self.clone(), key.clone());
                reads.spawn(async move {
                    let bundle = ledger.load(reference).await?;
                    let size = if sized { ledger.size_of(&key).await? } else { 0 };
                    Ok::<_, LedgerError>((reference, bundle, size))
                });
            }
            while let Some(done) = reads.join_next().await {
                let (reference, bundle, size) =
                    done.map_err(|error| LedgerError::unavailable(format!("a read of the Redis ledger: {error}")))??;
                if bundle.version.is_some() {
                    read.push((reference, bundle, size));
                }
            }
        }
        Ok(read)
    }

    /// The memory a hash takes on its node, in bytes (`MEMORY USAGE`; 0 for one that is gone).
    async fn size_of(&self, key: &str) -> Result<u64, LedgerError> {
        let usage = redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).clone();
        let bytes: Option<u64> = read(self.conn.clone().on_primary_of(key.as_bytes(), usage).await.map_err(failed)?)?;
        Ok(bytes.unwrap_or(0))
    }

    /// Whether this Redis holds an idem ledger under this prefix: any of its keys — a server
    /// keeps its secret's check value at its first call. A mistyped host or prefix holds none.
    ///
    /// # Errors
    /// Redis cannot be reached.
    pub async fn holds_ledger(&self) -> Result<bool, LedgerError> {
        let mut pages = self.pages(starting_with(&format!("{}:", self.prefix))).await?;
        Ok(pages.next().await?.is_some())
    }

    /// Every handler recorded as serving a tool, in order of namespace, tool and handler: what
    /// `idem tools` lists.
    ///
    /// # Errors
    /// Redis cannot be reached, or holds an owners key this build cannot read.
    pub async fn tool_owners_all(&self) -> Result<Vec<ToolOwner>, LedgerError> {
        let start = format!("{}:owners:", self.prefix);
        let mut owners = Vec::new();
        for key in self.keys(starting_with(&start)).await? {
            let unreadable =
                || LedgerError::corrupt(format!("the Redis ledger holds an owners key it cannot read: {key}"));
            let rest = key.strip_prefix(&start).ok_or_else(unreadable)?;
            let (length, rest) = rest.split_once(':').ok_or_else(unreadable)?;
            let length: usize = length.parse().map_err(|_| unreadable())?;
            let namespace = rest.get(..length).ok_or_else(unreadable)?;
            let tool = rest.get(length..).and_then(|tool| tool.strip_prefix(':')).ok_or_else(unreadable)?;
            let seen: Vec<(String, u64)> =
                redis::cmd("HGETALL").arg(&key).query_async(&mut self.conn.clone()).await.map_err(failed)?;
            owners.extend(seen.into_iter().map(|(owner, seen_at)| ToolOwner {
                namespace: namespace.to_owned(),
                tool: tool.to_owned(),
                owner,
                seen_at,
            }));
        }
        owners.sort_by(|a, b| (&a.namespace, &a.tool, &a.owner).cmp(&(&b.namespace, &b.tool, &b.owner)));
        Ok(owners)
    }

    /// Forgets every handler recorded for `tool` in `namespace` (`idem tools forget`), so the
    /// one that serves it next is recorded alone; returns how many were forgotten.
    ///
    /// # Errors
    /// Redis cannot be reached.
    pub async fn forget_tool_owners(&self, namespace: &str, tool: &str) -> Result<u64, LedgerError> {
        let key = self.tool_key("owners", namespace, tool);
        scripts::FORGET.key(&key).invoke_async(&mut self.conn.clone()).await.map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::{reference_of, starting_with};

    #[test]
    fn a_hash_key_names_its_reference() {
        assert_eq!(
            reference_of("idem:r:{00112233aabbccdd}").map(|r| r.to_string()).as_deref(),
            Some("00112233aabbccdd")
        );
        assert_eq!(reference_of("idem:owners:7:default:x"), None);
        assert_eq!(starting_with("a*b[1]:r:"), "a\\*b\\[1\\]:r:*");
    }
}
