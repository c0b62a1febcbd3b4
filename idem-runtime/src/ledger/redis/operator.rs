//! What the Redis ledger answers beyond a call's path, by looking across the ledger: every
//! record hash on every primary (for stats, pending and the sweep), whether a Redis holds a
//! ledger at all, and the tool owners an operator lists or forgets (`idem tools`).

use std::collections::BTreeSet;

use super::codec::Bundle;
use super::connect::{failed, read};
use super::{RedisLedger, scripts};
use crate::key::Ref;
use crate::ledger::{LedgerError, ToolOwner};

/// How many keys one `SCAN` step asks a node for.
const SCAN_COUNT: usize = 1000;

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

impl RedisLedger {
    /// Every key matching `pattern`, on every primary (at most `stop_at`, if given).
    async fn keys(&self, pattern: &str, stop_at: Option<usize>) -> Result<Vec<String>, LedgerError> {
        let mut conn = self.conn.clone();
        let mut keys = BTreeSet::new();
        for node in conn.primaries().await.map_err(failed)? {
            let mut cursor = 0u64;
            loop {
                let scan =
                    redis::cmd("SCAN").arg(cursor).arg("MATCH").arg(pattern).arg("COUNT").arg(SCAN_COUNT).clone();
                let (next, found): (u64, Vec<String>) = read(conn.on_node(&node, scan).await.map_err(failed)?)?;
                keys.extend(found);
                if next == 0 || stop_at.is_some_and(|enough| keys.len() >= enough) {
                    break;
                }
                cursor = next;
            }
        }
        Ok(keys.into_iter().collect())
    }

    /// Every record hash, on every primary.
    pub(super) async fn bundles(&self) -> Result<Vec<String>, LedgerError> {
        self.keys(&starting_with(&format!("{}:r:", self.prefix)), None).await
    }

    /// Every reference's records, with the key of their hash.
    pub(super) async fn each(&self) -> Result<Vec<(String, Bundle)>, LedgerError> {
        let mut all = Vec::new();
        for key in self.bundles().await? {
            let Some(reference) = reference_of(&key) else { continue };
            all.push((key, self.load(reference).await?));
        }
        Ok(all)
    }

    /// The memory a hash takes on its node, in bytes (`MEMORY USAGE`; 0 for one that is gone).
    pub(super) async fn size_of(&self, key: &str) -> Result<u64, LedgerError> {
        let usage = redis::cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0).clone();
        let bytes: Option<u64> = usage.query_async(&mut self.conn.clone()).await.map_err(failed)?;
        Ok(bytes.unwrap_or(0))
    }

    /// Whether this Redis holds an idem ledger under this prefix: any of its keys — a server
    /// keeps its secret's check value at its first call. A mistyped host or prefix holds none.
    ///
    /// # Errors
    /// Redis cannot be reached.
    pub async fn holds_ledger(&self) -> Result<bool, LedgerError> {
        Ok(!self.keys(&starting_with(&format!("{}:", self.prefix)), Some(1)).await?.is_empty())
    }

    /// Every handler recorded as serving a tool, in order of namespace, tool and handler: what
    /// `idem tools` lists.
    ///
    /// # Errors
    /// Redis cannot be reached, or holds an owners key this build cannot read.
    pub async fn tool_owners_all(&self) -> Result<Vec<ToolOwner>, LedgerError> {
        let start = format!("{}:owners:", self.prefix);
        let mut owners = Vec::new();
        for key in self.keys(&starting_with(&start), None).await? {
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
