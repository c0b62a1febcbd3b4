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
//!
//! In this process, the ledger's [`Catalogue`] knows every handler declared over it, on every
//! handle, and refuses a second one at once ([`Idem::declare`](super::Idem)). The ledger records
//! each owner seen per (namespace, tool) with the time ([`Ledger::tool_owners`]): it is asked at
//! a handler's first call and again at most every [`RECHECK`], which also keeps its record
//! fresh. An owner not seen for longer than the tool's records live no longer counts: nothing
//! of it can be replayed.
//!
//! Once two are seen, both are refused — whichever came first — with
//! [`Rejection::DuplicateTool`].

use std::time::Duration;

use crate::ledger::{Catalogue, Clash, Declaration, Handler, Ledger, RECHECK};
use crate::recipe::Recipe;
use crate::rejection::Rejection;

use super::Idem;
use super::facts::ToolFacts;

/// The longest owner name kept: a longer one is cut and ends in a digest of the whole.
const MAX_OWNER: usize = 200;

/// A handler declared in its ledger's catalogue: its owner name as recorded, and whether the
/// ledger is still to be asked.
pub(crate) struct Declared {
    pub(crate) owner: String,
    pub(crate) declaration: Declaration,
}

/// The refusal of a handler that another one shares its tool with.
pub(crate) fn refusal(namespace: &str, tool: &str, clash: Clash) -> Rejection {
    let rejection = Rejection::DuplicateTool {
        namespace: namespace.to_owned(),
        tool: tool.to_owned(),
        first: clash.first,
        second: clash.second,
    };
    tracing::error!(%rejection, "two handlers serve one tool; handler not run");
    rejection
}

/// One call's check with the ledger of who serves its tool ([`Ownership::check`]), after the
/// catalogue took its handler: what it needs of the handle, gathered where the call starts, so
/// the rule lives here and the handle gains no method.
pub(super) struct Ownership<'a> {
    /// The catalogue of the handle's ledger.
    catalogue: &'a Catalogue,
    /// The ledger under the handle's timeout: what is asked.
    timed: &'a dyn Ledger,
    namespace: &'a str,
    recipe: &'a Recipe,
    /// The handler, as declared.
    declared: Declared,
    /// The JSON Schema of the handler's result, if `#[idempotent]` found one: kept with the
    /// tool's facts at its first check.
    result_schema: Option<fn() -> serde_json::Value>,
    /// The ledger's time as last measured (an owner's horizon is hours: no read of its own).
    now: u64,
    /// How long after it was last seen an owner stops counting ([`horizon`]).
    horizon: Duration,
    /// How long a call waits for another one asking the ledger before asking itself.
    patience: Duration,
}

impl<'a> Ownership<'a> {
    /// The check of the handler `declared` for `recipe`'s tool in `namespace`, on `idem`'s
    /// ledger; `result_schema`: the handler's own (`#[idempotent]`), else the recipe's (the HTTP
    /// layer's routes).
    pub(super) fn of(
        idem: &'a Idem,
        recipe: &'a Recipe,
        namespace: &'a str,
        declared: Declared,
        result_schema: Option<fn() -> serde_json::Value>,
    ) -> Self {
        let settings = &idem.inner.settings;
        Self {
            catalogue: idem.catalogue(),
            timed: &*idem.inner.ledger,
            namespace,
            recipe,
            declared,
            result_schema,
            now: idem.ledger_now(),
            horizon: horizon(recipe.window_duration(), settings.retention, settings.grace, settings.lease),
            patience: settings.ledger_timeout.saturating_mul(2),
        }
    }

    /// Makes sure the call's handler is the only one the ledger names serving its tool in its
    /// namespace, unless it did less than [`RECHECK`] ago; refuses it otherwise.
    pub(super) async fn check(self) -> Result<(), Rejection> {
        let Self { catalogue, timed, namespace, recipe, declared, result_schema, now, horizon, patience } = self;
        let Declared { owner, declaration } = declared;
        let Declaration::Ask(asking) = declaration else { return Ok(()) };
        let tool = recipe.tool();
        let handler = Handler { owner: &owner, site: recipe.site(), layer: None };
        // One call asks; the calls that queued meanwhile take its answer — or, if it has not
        // answered within the patience (its caller stopped polling it), ask themselves.
        let _asking = tokio::time::timeout(patience, asking.lock()).await.ok();
        if let Some(found) = catalogue.confirmed(namespace, tool, handler) {
            return found.map_err(|clash| refusal(namespace, tool, clash));
        }
        let since = now.saturating_sub(millis(horizon));
        let recorded = timed.tool_owners(namespace, tool, &owner, now, since).await.map_err(|error| {
            tracing::error!(tool, %error, "the ledger could not say who serves this tool; handler not run");
            Rejection::ledger_unavailable(&error)
        })?;
        // Kept before the answer is recorded, as before the catalogue: a first call dropped while
        // it keeps them leaves the next call first, to keep them.
        if catalogue.unasked(namespace, tool) {
            // What the operator is shown of the tool: one statement per process and tool, on the
            // first call's way; its failure refuses nothing (a verdict on a tool without facts is
            // simply not checked).
            let facts = ToolFacts::new(recipe.stale_policy(), result_schema.map(|schema| schema())).to_json();
            if let Err(error) = timed.keep_tool_facts(namespace, tool, &facts, now).await {
                tracing::warn!(tool, %error, "could not keep the tool's result shape for its operator");
            }
        }
        catalogue.recorded(namespace, tool, handler, recorded).map_err(|clash| refusal(namespace, tool, clash))
    }
}

/// How long after it was last seen an owner's operations of a tool can still be replayed: the
/// longest a record of it lives (its window, or the retention if longer), its grace and lease,
/// plus the time between two checks.
fn horizon(window: Option<Duration>, retention: Duration, grace: Duration, lease: Duration) -> Duration {
    let life = window.map_or(retention, |window| window.max(retention));
    life.saturating_add(grace).saturating_add(lease).saturating_add(RECHECK)
}

/// The owner's name as recorded: the handler's, else the tool's own (a pinned or hand-built
/// recipe), cut to [`MAX_OWNER`] bytes with a digest of the whole.
pub(super) fn owner_name(owner: Option<&str>, tool: &str) -> String {
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
