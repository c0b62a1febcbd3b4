//! The catalogue of one ledger: which handlers this process has seen serving which operation
//! (a tool, an HTTP route) in which namespace, and which owners the ledger named last. Two
//! different handlers of one operation would derive the same keys and replay each other's
//! results, so the catalogue is the one place that refuses a second one — for an MCP tool or a
//! free function at its first call (or at startup, `Admin::register`), for an HTTP route when
//! its layer is built — on every handle over this ledger, without a round trip.
//!
//! A ledger keeps its catalogue ([`Ledger::catalogue`](super::Ledger::catalogue)); the
//! handles over it share it. A handle over a ledger that keeps none keeps its own, and then
//! learns of another handle's handler from the ledger's record of owners
//! ([`Ledger::tool_owners`](super::Ledger::tool_owners)), as another process does.
//!
//! A handler is told by its owner name (its path, or its pinned or tool name), by where its
//! recipe is declared, and — for a route — by the layer that protects it: two layers alive at
//! once on one handle are two handlers even when one function built both (on two handles they
//! are one service served twice, as two replicas are).

use std::collections::BTreeSet;
use std::panic::Location;
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::{Duration, Instant};

/// How long a handler's ownership, once confirmed by the ledger, is trusted before the ledger
/// is asked again (which also records the handler as seen then).
pub(crate) const RECHECK: Duration = Duration::from_secs(60);

/// Where a recipe is declared.
type Site = &'static Location<'static>;

/// The handlers of every operation served over one ledger, as this process has seen them. A
/// ledger implementation keeps one and returns it from
/// [`Ledger::catalogue`](super::Ledger::catalogue); it holds nothing else of the ledger.
#[derive(Default)]
pub struct Catalogue {
    /// Few (one per operation a process serves): found by comparing names, with no allocation.
    operations: RwLock<Vec<Entry>>,
}

impl std::fmt::Debug for Catalogue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let operations = self.operations.read().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Catalogue").field("operations", &operations.len()).finish()
    }
}

/// What the catalogue knows of one operation in one namespace.
#[derive(Default)]
struct Entry {
    namespace: String,
    operation: String,
    /// The handlers of this process that declared it.
    declared: Vec<Declared>,
    /// The owners the ledger named last, and when.
    recorded: Vec<String>,
    checked: Option<Instant>,
    /// Held while one call asks the ledger, so a cold burst asks once.
    asking: Arc<tokio::sync::Mutex<()>>,
}

/// One handler as declared: its owner name, where its recipe is, and the layer that protects it
/// with the handle it is built on (a route's; it stops counting when the layer is dropped).
struct Declared {
    owner: String,
    site: Site,
    layer: Option<(Weak<()>, usize)>,
}

/// A handler declaring an operation.
#[derive(Clone, Copy)]
pub(crate) struct Handler<'a> {
    pub(crate) owner: &'a str,
    pub(crate) site: Site,
    /// The layer that protects the route, and the handle it is built on (an address the layer
    /// keeps alive), for a route's handler declared when its layer is built.
    pub(crate) layer: Option<(&'a Arc<()>, usize)>,
}

impl Handler<'_> {
    /// Whether `declared` is this handler (a declaration without a layer is the route's whichever
    /// layer serves it; layers on two handles are one service served twice).
    fn is(&self, declared: &Declared) -> bool {
        declared.owner == self.owner
            && declared.site == self.site
            && match (&declared.layer, self.layer) {
                (Some((known, on)), Some((mine, here))) => {
                    std::ptr::eq(known.as_ptr(), Arc::as_ptr(mine)) || *on != here
                }
                _ => true,
            }
    }

    /// `owner` as declared at `site`, for a refusal of two handlers with one owner name.
    fn declared(owner: &str, site: Site) -> String {
        format!("{owner} declared at {site}")
    }
}

/// Two handlers of one operation: the others, and this one, named as a refusal shows them.
#[derive(Debug)]
pub(crate) struct Clash {
    /// The other handlers (owners, or an owner and where it is declared), joined by "`, `".
    pub(crate) first: String,
    /// This handler.
    pub(crate) second: String,
    /// Whether the other is this very handler under another layer alive at once.
    #[cfg_attr(
        all(not(feature = "http-tower"), not(test)),
        expect(dead_code, reason = "read by the HTTP layer alone")
    )]
    pub(crate) another_layer: bool,
}

/// What a declaration found.
pub(crate) enum Declaration {
    /// The ledger confirmed the operation's owners less than [`RECHECK`] ago.
    Confirmed,
    /// The ledger is to be asked: hold this while asking, so that one call asks.
    Ask(Arc<tokio::sync::Mutex<()>>),
}

impl Entry {
    fn is(&self, namespace: &str, operation: &str) -> bool {
        self.namespace == namespace && self.operation == operation
    }

    /// The handlers other than `handler` known for this operation, if any.
    fn clash(&self, handler: Handler<'_>) -> Option<Clash> {
        let owner = handler.owner;
        // Every call asks: the usual answer (none) allocates nothing.
        if self.declared.iter().all(|known| handler.is(known)) && self.recorded.iter().all(|other| other == owner) {
            return None;
        }
        let others: BTreeSet<String> = (self.declared.iter().filter(|known| !handler.is(known)))
            .map(|known| if known.owner == owner { Handler::declared(owner, known.site) } else { known.owner.clone() })
            .chain(self.recorded.iter().filter(|other| *other != owner).cloned())
            .collect();
        if others.is_empty() {
            return None;
        }
        let twice = self.declared.iter().any(|known| known.owner == owner && known.site != handler.site);
        let another_layer = self.declared.iter().all(|known| known.owner == owner && known.site == handler.site)
            && self.recorded.iter().all(|other| other == owner);
        Some(Clash {
            first: others.into_iter().collect::<Vec<_>>().join("`, `"),
            second: if twice { Handler::declared(owner, handler.site) } else { owner.to_owned() },
            another_layer,
        })
    }

    fn fresh(&self) -> bool {
        self.checked.is_some_and(|checked| checked.elapsed() < RECHECK)
    }
}

impl Catalogue {
    /// Declares `handler` as serving `operation` in `namespace`: refused when another handler is
    /// known for it (here, or named by the ledger last time it was asked). Once two are seen,
    /// both are refused, whichever came first. `new` is called when the operation is declared
    /// for the first time over this ledger.
    pub(crate) fn declare(
        &self,
        namespace: &str,
        operation: &str,
        handler: Handler<'_>,
        new: impl FnOnce(),
    ) -> Result<Declaration, Clash> {
        {
            let operations = self.operations.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(entry) = operations.iter().find(|entry| entry.is(namespace, operation))
                && handler.layer.is_none()
                && entry.declared.iter().any(|known| handler.is(known))
            {
                if let Some(clash) = entry.clash(handler) {
                    return Err(clash);
                }
                if entry.fresh() {
                    return Ok(Declaration::Confirmed);
                }
            }
        }
        let mut operations = self.operations.write().unwrap_or_else(PoisonError::into_inner);
        let index = operations.iter().position(|entry| entry.is(namespace, operation)).unwrap_or_else(|| {
            new();
            operations.push(Entry {
                namespace: namespace.to_owned(),
                operation: operation.to_owned(),
                ..Entry::default()
            });
            operations.len() - 1
        });
        let entry = &mut operations[index];
        // A dropped layer protects nothing any more.
        entry.declared.retain(|known| known.layer.as_ref().is_none_or(|(layer, _)| layer.strong_count() > 0));
        let mut known = |layer: Option<(Weak<()>, usize)>| {
            let declared = Declared { owner: handler.owner.to_owned(), site: handler.site, layer };
            let same = |known: &Declared| {
                known.owner == declared.owner
                    && known.site == declared.site
                    && known.layer.as_ref().map(|(layer, _)| layer.as_ptr())
                        == declared.layer.as_ref().map(|(layer, _)| layer.as_ptr())
            };
            if !entry.declared.iter().any(same) {
                entry.declared.push(declared);
            }
        };
        // The route is its handler's for good (as a tool's is); the layer, while it lives.
        known(None);
        if let Some((layer, on)) = handler.layer {
            known(Some((Arc::downgrade(layer), on)));
        }
        if let Some(clash) = entry.clash(handler) {
            return Err(clash);
        }
        Ok(if entry.fresh() { Declaration::Confirmed } else { Declaration::Ask(Arc::clone(&entry.asking)) })
    }

    /// What another call found while this one waited to ask the ledger: `None` if the ledger is
    /// still to be asked.
    pub(crate) fn confirmed(
        &self,
        namespace: &str,
        operation: &str,
        handler: Handler<'_>,
    ) -> Option<Result<(), Clash>> {
        let operations = self.operations.read().unwrap_or_else(PoisonError::into_inner);
        let entry = operations.iter().find(|entry| entry.is(namespace, operation))?;
        entry.fresh().then(|| entry.clash(handler).map_or(Ok(()), Err))
    }

    /// Whether the ledger has not yet been asked who serves the operation, in this process.
    pub(crate) fn unasked(&self, namespace: &str, operation: &str) -> bool {
        let operations = self.operations.read().unwrap_or_else(PoisonError::into_inner);
        operations.iter().find(|entry| entry.is(namespace, operation)).is_none_or(|entry| entry.checked.is_none())
    }

    /// Keeps the owners the ledger named for the operation, asked just now, and answers the
    /// clash, if any.
    pub(crate) fn recorded(
        &self,
        namespace: &str,
        operation: &str,
        handler: Handler<'_>,
        recorded: Vec<String>,
    ) -> Result<(), Clash> {
        let mut operations = self.operations.write().unwrap_or_else(PoisonError::into_inner);
        let Some(entry) = operations.iter_mut().find(|entry| entry.is(namespace, operation)) else {
            // Declared before it was asked: always there.
            return Ok(());
        };
        entry.recorded = recorded;
        entry.checked = Some(Instant::now());
        entry.clash(handler).map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler<'a>(owner: &'a str, site: Site, layer: Option<(&'a Arc<()>, usize)>) -> Handler<'a> {
        Handler { owner, site, layer }
    }

    #[test]
    fn two_owners_of_one_operation_are_both_refused_and_another_namespace_is_another_operation() {
        let catalogue = Catalogue::default();
        let here = Location::caller();
        assert!(catalogue.declare("ns", "create", handler("Orders::create", here, None), || {}).is_ok());
        let clash = catalogue.declare("ns", "create", handler("Invoices::create", here, None), || {}).err().unwrap();
        assert_eq!((clash.first.as_str(), clash.second.as_str()), ("Orders::create", "Invoices::create"));
        assert!(catalogue.declare("ns", "create", handler("Orders::create", here, None), || {}).is_err());
        assert!(catalogue.declare("other", "create", handler("Invoices::create", here, None), || {}).is_ok());
    }

    #[test]
    fn a_second_layer_alive_at_once_on_one_handle_is_refused_and_a_dropped_one_counts_no_more() {
        let catalogue = Catalogue::default();
        let here = Location::caller();
        let (first, second, third) = (Arc::new(()), Arc::new(()), Arc::new(()));
        let mut new = 0;
        assert!(catalogue.declare("ns", "POST /x", handler("o", here, Some((&first, 1))), || new += 1).is_ok());
        // A call through the first layer names no layer: it is the route's handler.
        assert!(catalogue.declare("ns", "POST /x", handler("o", here, None), || new += 1).is_ok());
        // The same code's layer on another handle: the service served twice.
        assert!(catalogue.declare("ns", "POST /x", handler("o", here, Some((&third, 2))), || {}).is_ok());
        let clash = catalogue.declare("ns", "POST /x", handler("o", here, Some((&second, 1))), || {}).err().unwrap();
        assert!(clash.another_layer, "{clash:?}");
        drop(first);
        assert!(catalogue.declare("ns", "POST /x", handler("o", here, Some((&second, 1))), || {}).is_ok());
        assert_eq!(new, 1);
    }
}
