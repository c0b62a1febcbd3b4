//! The `Ledger` trait on Redis: a call's path (claim, renew, complete, release, the look-ups), each
//! one step on one reference, what a caller relies on waited for on the replicas; the operator's
//! reads and the sweep over every primary; secret check values, tool owners and facts under keys
//! of their own.

use redis::{AsyncCommands, Value};

use super::codec::{Bundle, current_field, encode};
use super::connect::{failed, read};
use super::{MARGIN_MS, RedisLedger, scripts};
use crate::key::{Address, Key, Ref, SubjectTag, TenantTag};
use crate::ledger::records::{Records, oldest_first};
use crate::ledger::{
    BoxFuture, Claim, ClaimRequest, Ledger, LedgerError, LedgerStats, Outcome, PendingQuery, PendingRecord, Resolution,
    State, StatusReport, Token,
};

impl Ledger for RedisLedger {
    fn claim<'a>(&'a self, request: &'a ClaimRequest) -> BoxFuture<'a, Result<Claim, LedgerError>> {
        Box::pin(async move {
            let reference = request.key.reference();
            let key = self.key_of(reference);
            let mut fresh = Records::default();
            let won = fresh.claim(request);
            let record = fresh.current.get(&request.key).map(encode).unwrap_or_default();
            let version = crate::bytes::hex(&crate::bytes::random::<8>());
            let mut create = scripts::CREATE.on(&key);
            create.arg(&version).arg(current_field(&request.key)).arg(record).arg(fresh.needed_until()).arg(MARGIN_MS);
            let (created, acknowledged) = self.write(&key, &scripts::CREATE, create, true).await?;
            let made = matches!(created, Value::Int(1));
            tracing::debug!(%reference, token = ?request.token, made, "redis ledger: claim");
            if made {
                self.acknowledged(acknowledged)?;
                return Ok(won);
            }
            let pairs: Vec<(Vec<u8>, Vec<u8>)> = read(created)?;
            let first = Bundle::decode(pairs)?;
            let answer = self
                .update(reference, Some(first), |records| {
                    let claim = records.claim(request);
                    // A won claim, and a result the caller will be given, are relied on.
                    let relied_on = matches!(claim, Claim::Won { .. } | Claim::Replay { .. });
                    (claim, relied_on)
                })
                .await;
            let shown = match &answer {
                Ok(Claim::Won { .. }) => "won",
                Ok(Claim::InFlight { .. }) => "in flight",
                Ok(Claim::Replay { .. }) => "replay",
                Ok(Claim::Unknown) => "unknown",
                Ok(Claim::Conflict { .. }) => "conflict",
                Err(_) => "failed",
            };
            tracing::debug!(%reference, token = ?request.token, answer = shown, "redis ledger: claim answered");
            answer
        })
    }

    fn renew<'a>(&'a self, key: &'a Key, token: Token, lease_until: u64) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            // The holder acts on the lease it is told it has: a renewal a failover could lose
            // would let a takeover run the call at the old lease's end while it still believes
            // it holds it.
            self.update(key.reference(), None, |records| {
                let renewed = records.renew(key, token, lease_until);
                let ok = renewed.is_ok();
                (renewed, ok)
            })
            .await?
        })
    }

    fn complete<'a>(
        &'a self,
        key: &'a Key,
        token: Token,
        outcome: Outcome,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let done = self
                .update(key.reference(), None, |records| {
                    let done = records.complete(key, token, outcome.clone(), keep_until);
                    // Sent again after its answer was lost (a replica's acknowledgement that did not
                    // come in time, a connection cut): the record holds this very completion, which
                    // is done — once the replicas have it. Asked only of a completion refused: one
                    // the holder may still write (an unknown a repeat marked under `hold`) is written.
                    if matches!(done, Err(LedgerError::Fenced)) && records.settled_as(key, token, &outcome) {
                        return (Ok(()), true);
                    }
                    let ok = done.is_ok();
                    (done, ok)
                })
                .await;
            tracing::debug!(reference = %key.reference(), ?token, answer = ?done, "redis ledger: complete");
            done?
        })
    }

    fn release<'a>(&'a self, key: &'a Key, token: Token) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let done = self.update(key.reference(), None, |records| (records.release(key, token), false)).await;
            tracing::debug!(reference = %key.reference(), ?token, answer = ?done, "redis ledger: release");
            done?
        })
    }

    fn lookup<'a>(&'a self, key: &'a Key, now: u64) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async move {
            let read = self.load_relied_on(key.reference(), |records| completed(records.lookup(key, now))).await?;
            Ok(read.records.lookup(key, now))
        })
    }

    fn status<'a>(
        &'a self,
        tenant: TenantTag,
        subject: SubjectTag,
        reference: Ref,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async move {
            let read = self
                .load_relied_on(reference, |records| {
                    completed(records.clone().status(tenant, Some(subject), reference, now))
                })
                .await?;
            let mut records = read.records;
            Ok(records.status(tenant, Some(subject), reference, now))
        })
    }

    fn resolve<'a>(
        &'a self,
        tenant: TenantTag,
        address: Address,
        resolution: Resolution,
        now: u64,
        keep_until: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            self.update(address.reference, None, |records| {
                let done = records.resolve(tenant, address, resolution.clone(), now, keep_until);
                let ok = done.is_ok();
                (done, ok)
            })
            .await?
        })
    }

    fn inspect<'a>(
        &'a self,
        tenant: TenantTag,
        reference: Ref,
        window_end: Option<u64>,
        now: u64,
    ) -> BoxFuture<'a, Result<Option<StatusReport>, LedgerError>> {
        Box::pin(async move {
            let mut records = self.load(reference).await?.records;
            Ok(match window_end {
                Some(window_end) => records.inspect_at(tenant, Address { reference, window_end }, now),
                None => records.status(tenant, None, reference, now),
            })
        })
    }

    fn stats(&self, now: u64) -> BoxFuture<'_, Result<LedgerStats, LedgerError>> {
        Box::pin(async move {
            let mut stats = LedgerStats::default();
            let mut size = 0;
            let mut pages = self.bundle_pages().await?;
            while let Some(keys) = pages.next().await? {
                for (_, bundle, bytes) in self.read_page(keys, true).await? {
                    bundle.records.count(now, &mut stats);
                    size += bytes;
                }
            }
            stats.size_bytes = Some(size);
            Ok(stats)
        })
    }

    fn pending<'a>(
        &'a self,
        query: &'a PendingQuery,
        now: u64,
    ) -> BoxFuture<'a, Result<Vec<PendingRecord>, LedgerError>> {
        Box::pin(async move {
            let mut found = Vec::new();
            let mut pages = self.bundle_pages().await?;
            while let Some(keys) = pages.next().await? {
                for (_, bundle, _) in self.read_page(keys, false).await? {
                    found.extend(bundle.records.pending(query, now));
                }
                // Only the oldest `limit` can make the page: keep no more while scanning.
                if found.len() > 2 * query.limit.max(64) {
                    oldest_first(&mut found, query.limit);
                }
            }
            oldest_first(&mut found, query.limit);
            Ok(found)
        })
    }

    fn keeps_labels(&self) -> bool {
        true
    }

    fn catalogue(&self) -> Option<&crate::ledger::Catalogue> {
        Some(&self.catalogue)
    }

    fn sweep(&self, now: u64, limit: usize) -> BoxFuture<'_, Result<usize, LedgerError>> {
        Box::pin(async move {
            let mut swept = 0;
            let mut pages = self.bundle_pages().await?;
            while let Some(keys) = pages.next().await? {
                // A page read at once; a write only where the ledger's rules delete something
                // (Redis's TTLs have usually been there first).
                for (reference, bundle, _) in self.read_page(keys, false).await? {
                    let room = limit - swept;
                    if bundle.records.clone().sweep(now, room) > 0 {
                        swept +=
                            self.update(reference, Some(bundle), |records| (records.sweep(now, room), false)).await?;
                    }
                    if swept >= limit {
                        return Ok(swept);
                    }
                }
            }
            Ok(swept)
        })
    }

    fn now(&self) -> BoxFuture<'_, Result<Option<u64>, LedgerError>> {
        Box::pin(async move {
            let clock = format!("{}:clock", self.prefix);
            let time = self.conn.clone().on_primary_of(clock.as_bytes(), redis::cmd("TIME")).await.map_err(failed)?;
            let (seconds, micros): (u64, u64) = read(time)?;
            Ok(Some(seconds * 1000 + micros / 1000))
        })
    }

    fn secret_check<'a>(
        &'a self,
        version: u32,
        check: Option<&'a [u8; 32]>,
    ) -> BoxFuture<'a, Result<Option<[u8; 32]>, LedgerError>> {
        Box::pin(async move {
            let key = format!("{}:secret:{version}", self.prefix);
            let kept: Option<Vec<u8>> = match check {
                // Relied on — a replica that keys with its secret has compared it with the value
                // kept — so waited for like a won claim, whoever kept it.
                Some(check) => {
                    let mut keep = scripts::KEEP_CHECK.on(&key);
                    keep.arg(&check[..]);
                    let (kept, acknowledged) = self.write(&key, &scripts::KEEP_CHECK, keep, true).await?;
                    self.acknowledged(acknowledged)?;
                    read(kept)?
                }
                None => self.conn.clone().get(&key).await.map_err(failed)?,
            };
            kept.map(|bytes| {
                <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| {
                    LedgerError::corrupt(format!("the check value of secret version {version} is not 32 bytes"))
                })
            })
            .transpose()
        })
    }

    fn secret_versions<'a>(&'a self, live: Option<(u32, u64)>) -> BoxFuture<'a, Result<Vec<(u32, u64)>, LedgerError>> {
        Box::pin(async move {
            // One hash, version → time: one slot, read whole.
            let key = format!("{}:secrets-live", self.prefix);
            let (version, until) = live.map_or((0, 0), |(version, until)| (version, until));
            // Relied on — a replica refuses to serve while another version's time is ahead — so
            // a time kept is waited for like a won claim.
            let mut keep = scripts::KEEP_LIVE.on(&key);
            keep.arg(version).arg(until);
            let (kept, acknowledged) = self.write(&key, &scripts::KEEP_LIVE, keep, live.is_some()).await?;
            self.acknowledged(acknowledged)?;
            let mut kept: Vec<(u32, u64)> = read(kept)?;
            kept.sort_unstable();
            Ok(kept)
        })
    }

    fn tool_owners<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        owner: &'a str,
        now: u64,
        since: u64,
    ) -> BoxFuture<'a, Result<Vec<String>, LedgerError>> {
        Box::pin(async move {
            let key = self.tool_key("owners", namespace, tool);
            // Relied on — a handler serves the tool only if no other owner is answered — so
            // waited for like a won claim: this owner, and every other answered.
            let mut keep = scripts::KEEP_OWNER.on(&key);
            keep.arg(owner).arg(now);
            let (seen, acknowledged) = self.write(&key, &scripts::KEEP_OWNER, keep, true).await?;
            self.acknowledged(acknowledged)?;
            let seen: Vec<(String, u64)> = read(seen)?;
            let mut owners: Vec<String> =
                seen.into_iter().filter(|(_, at)| *at >= since).map(|(owner, _)| owner).collect();
            owners.sort();
            Ok(owners)
        })
    }

    fn keep_tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
        facts: &'a str,
        now: u64,
    ) -> BoxFuture<'a, Result<(), LedgerError>> {
        Box::pin(async move {
            let key = self.tool_key("facts", namespace, tool);
            let _: i64 = scripts::KEEP_FACTS
                .key(&key)
                .arg(now)
                .arg(facts)
                .invoke_async(&mut self.conn.clone())
                .await
                .map_err(failed)?;
            Ok(())
        })
    }

    fn tool_facts<'a>(
        &'a self,
        namespace: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<Option<String>, LedgerError>> {
        Box::pin(async move {
            let key = self.tool_key("facts", namespace, tool);
            self.conn.clone().hget(&key, "f").await.map_err(failed)
        })
    }
}

/// Whether a report gives a completed result — which a caller relies on.
fn completed(report: Option<StatusReport>) -> bool {
    report.is_some_and(|report| report.state == State::Completed)
}
