//! Who serves a tool: two different handlers given one tool name in one namespace would derive
//! the same keys and replay each other's results, so each call first makes sure its handler is
//! the only one seen for its tool — on this ledger, by every process.
//!
//! A handler is named by its path (`billing::Invoices::create`, with the generic arguments of
//! an instance of a generic one: `Store<OrderRow>::create`; `#[idempotent]` names it), or by its
//! tool name when pinned with `name = "..."` (with the instance's generic arguments, if any) or
//! built by hand without [`Recipe::owner`]. That name is what the ledger keeps: the same across
//! restarts and replicas of the same code. In this process a handler is also told by where its
//! recipe is declared ([`Recipe::site`]): two handlers pinned to one name, or two hand-built
//! recipes of one tool, are two on any handle, as they are on one handle. Across processes a
//! pinned name is one handler wherever it is declared, as a pin is meant to survive moves.
//! The ledger records each owner seen per (namespace, tool) with the time
//! ([`Ledger::tool_owners`]); this process keeps the owners it has seen per ledger too, so a
//! second handler on another handle of the same ledger is seen at once, with no round trip. The
//! ledger is asked at a handler's first call and again at most every [`RECHECK`], which also
//! keeps its record fresh. An owner not seen for longer than the tool's records live no longer
//! counts: nothing of it can be replayed.
//!
//! Once two are seen, both are refused — whichever came first — with
//! [`Rejection::DuplicateTool`].

use std::collections::BTreeSet;
use std::panic::Location;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

use crate::ledger::Ledger;
use crate::recipe::Recipe;
use crate::rejection::Rejection;

use super::facts::ToolFacts;

/// How long a handler's ownership, once confirmed by the ledger, is trusted before the ledger
/// is asked again (which also records the handler as seen then).
pub(crate) const RECHECK: Duration = Duration::from_secs(60);

/// The longest owner name kept: a longer one is cut and ends in a digest of the whole.
const MAX_OWNER: usize = 200;

/// What this process knows of one tool's owners on one ledger.
struct Seen {
    ledger: Weak<dyn Ledger>,
    namespace: String,
    tool: String,
    /// The handlers of this process that called the tool: their owner names, and where each
    /// one's recipe is declared.
    here: BTreeSet<(String, Site)>,
    /// The owners the ledger returned last, and when.
    recorded: Vec<String>,
    checked: Option<Instant>,
    /// Held while one call asks the ledger, so a cold burst asks once.
    asking: Arc<tokio::sync::Mutex<()>>,
}

impl Seen {
    fn is(&self, ledger: &Arc<dyn Ledger>, namespace: &str, tool: &str) -> bool {
        // A dropped ledger's entry is not this ledger's, even if a new one took its address.
        self.namespace == namespace
            && self.tool == tool
            && std::ptr::addr_eq(self.ledger.as_ptr(), Arc::as_ptr(ledger))
            && self.ledger.strong_count() > 0
    }

    /// Another handler than `owner` declared at `site`, if any is known: another owner, or the
    /// same owner name declared elsewhere in this process (then named with where).
    fn other(&self, owner: &str, site: Site) -> Option<String> {
        // Every call asks: the usual answer (none) allocates nothing.
        let same = |(other, at): &(String, Site)| other == owner && *at == site;
        if self.here.iter().all(same) && self.recorded.iter().all(|other| other == owner) {
            return None;
        }
        let others: BTreeSet<String> = (self.here.iter().filter(|handler| !same(handler)))
            .map(|(other, at)| if other == owner { declared(other, at) } else { other.clone() })
            .chain(self.recorded.iter().filter(|other| *other != owner).cloned())
            .collect();
        (!others.is_empty()).then(|| others.into_iter().collect::<Vec<_>>().join("`, `"))
    }

    /// Whether the owner name `owner` is declared at another site than `site` here.
    fn twice(&self, owner: &str, site: Site) -> bool {
        self.here.iter().any(|(other, at)| other == owner && *at != site)
    }
}

/// Where a recipe is declared.
type Site = &'static Location<'static>;

/// `owner` as declared at `site`, for a refusal of two handlers with one owner name.
fn declared(owner: &str, site: Site) -> String {
    format!("{owner} declared at {site}")
}

/// Every tool's owners this process has seen, per ledger (a dropped ledger's entries go).
static SEEN: RwLock<Vec<Seen>> = RwLock::new(Vec::new());

/// One call's check of who serves its tool ([`Ownership::check`]): what it needs of the handle,
/// gathered where the call starts, so the rule lives here and the handle gains no method.
pub(super) struct Ownership<'a> {
    /// The ledger as given: this process's record of owners is kept per ledger.
    pub(super) ledger: &'a Arc<dyn Ledger>,
    /// The same ledger under the handle's timeout: what is asked.
    pub(super) timed: &'a dyn Ledger,
    pub(super) namespace: &'a str,
    pub(super) recipe: &'a Recipe,
    /// The handler as the call names it (`#[idempotent]`), else the recipe's owner.
    pub(super) owner: Option<&'a str>,
    /// The JSON Schema of the handler's result, if `#[idempotent]` found one: kept with the
    /// tool's facts at its first check.
    pub(super) result_schema: Option<fn() -> serde_json::Value>,
    /// The ledger's time as last measured (an owner's horizon is hours: no read of its own).
    pub(super) now: u64,
    /// How long after it was last seen an owner stops counting ([`horizon`]).
    pub(super) horizon: Duration,
    /// How long a call waits for another one asking the ledger before asking itself.
    pub(super) patience: Duration,
}

impl Ownership<'_> {
    /// Makes sure the call's handler is the only one seen serving its tool in its namespace on
    /// this ledger; refuses it otherwise.
    pub(super) async fn check(self) -> Result<(), Rejection> {
        let Self { ledger, timed, namespace, recipe, owner, result_schema, now, horizon, patience } = self;
        let tool = recipe.tool();
        let owner = owner_name(owner.or(recipe.owner_path()), tool);
        let site = recipe.site();
        let refuse = |entry: &Seen, other: String| {
            let second = if entry.twice(&owner, site) { declared(&owner, site) } else { owner.clone() };
            let rejection = Rejection::DuplicateTool {
                namespace: namespace.to_owned(),
                tool: tool.to_owned(),
                first: other,
                second,
            };
            tracing::error!(%rejection, "two handlers serve one tool; handler not run");
            rejection
        };
        {
            let seen = SEEN.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = seen.iter().find(|entry| entry.is(ledger, namespace, tool))
                && entry.here.iter().any(|(known, at)| *known == owner && *at == site)
            {
                if let Some(other) = entry.other(&owner, site) {
                    return Err(refuse(entry, other));
                }
                if entry.checked.is_some_and(|checked| checked.elapsed() < RECHECK) {
                    return Ok(());
                }
            }
        }
        let asking = {
            let mut seen = SEEN.write().unwrap_or_else(PoisonError::into_inner);
            seen.retain(|entry| entry.ledger.strong_count() > 0);
            let index = match seen.iter().position(|entry| entry.is(ledger, namespace, tool)) {
                Some(index) => index,
                None => {
                    seen.push(Seen {
                        ledger: Arc::downgrade(ledger),
                        namespace: namespace.to_owned(),
                        tool: tool.to_owned(),
                        here: BTreeSet::new(),
                        recorded: Vec::new(),
                        checked: None,
                        asking: Arc::default(),
                    });
                    seen.len() - 1
                }
            };
            seen[index].here.insert((owner.clone(), site));
            if let Some(other) = seen[index].other(&owner, site) {
                return Err(refuse(&seen[index], other));
            }
            Arc::clone(&seen[index].asking)
        };
        // One call asks; the calls that queued meanwhile take its answer — or, if it has not
        // answered within the patience (its caller stopped polling it), ask themselves.
        let _asking = tokio::time::timeout(patience, asking.lock()).await.ok();
        {
            let seen = SEEN.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = seen.iter().find(|entry| entry.is(ledger, namespace, tool))
                && entry.checked.is_some_and(|checked| checked.elapsed() < RECHECK)
            {
                return entry.other(&owner, site).map_or(Ok(()), |other| Err(refuse(entry, other)));
            }
        }
        let since = now.saturating_sub(millis(horizon));
        let recorded = timed.tool_owners(namespace, tool, &owner, now, since).await.map_err(|error| {
            tracing::error!(tool, %error, "the ledger could not say who serves this tool; handler not run");
            Rejection::ledger_unavailable(&error)
        })?;
        let first = {
            let seen = SEEN.read().unwrap_or_else(PoisonError::into_inner);
            seen.iter().find(|entry| entry.is(ledger, namespace, tool)).is_none_or(|entry| entry.checked.is_none())
        };
        if first {
            // What the operator is shown of the tool: one statement per process and tool, on the
            // first call's way; its failure refuses nothing (a verdict on a tool without facts is
            // simply not checked).
            let facts = ToolFacts::new(recipe.stale_policy(), result_schema.map(|schema| schema())).to_json();
            if let Err(error) = timed.keep_tool_facts(namespace, tool, &facts, now).await {
                tracing::warn!(tool, %error, "could not keep the tool's result shape for its operator");
            }
        }
        let mut seen = SEEN.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = seen.iter_mut().find(|entry| entry.is(ledger, namespace, tool)) {
            entry.recorded = recorded;
            entry.checked = Some(Instant::now());
            if let Some(other) = entry.other(&owner, site) {
                return Err(refuse(entry, other));
            }
        }
        Ok(())
    }
}

/// How long after it was last seen an owner's operations of a tool can still be replayed: the
/// longest a record of it lives (its window, or the retention if longer), its grace and lease,
/// plus the time between two checks.
pub(super) fn horizon(window: Option<Duration>, retention: Duration, grace: Duration, lease: Duration) -> Duration {
    let life = window.map_or(retention, |window| window.max(retention));
    life.saturating_add(grace).saturating_add(lease).saturating_add(RECHECK)
}

/// The owner's name as recorded: the handler's, else the tool's own (a pinned or hand-built
/// recipe), cut to [`MAX_OWNER`] bytes with a digest of the whole.
fn owner_name(owner: Option<&str>, tool: &str) -> String {
    let owner = owner.map_or_else(|| format!("name = \"{tool}\""), str::to_owned);
    if owner.len() <= MAX_OWNER {
        return owner;
    }
    let digest = sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(owner.as_bytes()));
    let mut cut = MAX_OWNER - 17;
    while !owner.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…{}", &owner[..cut], crate::bytes::hex(&digest[..8]))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_owner_is_cut_with_a_digest() {
        let long = "a::".repeat(100) + "create";
        let name = owner_name(Some(&long), "create");
        assert!(name.len() <= MAX_OWNER + 2, "{}", name.len());
        assert_ne!(name, owner_name(Some(&("b::".repeat(100) + "create")), "create"));
        assert_eq!(owner_name(None, "create"), "name = \"create\"");
    }
}
