//! Which optional event families the engine publishes ([`EventFamilies`], issue 9): an embedder
//! that listens to none of them saves building, queueing and polling them. Events the embedder
//! needs to drive operations are never optional: [`EngineEvent::OperationFinished`] (which names
//! the server that answered a success) and [`EngineEvent::CursorOpened`]. Command monitoring has
//! its own switch,
//! [`EngineOptions::command_monitoring`](super::EngineOptions::command_monitoring).

use core::ops::BitOr;

#[cfg(doc)]
use super::EngineEvent;

/// A set of optional event families. Checked once where the engine queues an event, so an
/// unpublished family costs nothing past that check; the engine's actions and transmits do not
/// depend on it (same seed and inputs, same bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventFamilies(u8);

impl EventFamilies {
    /// No optional family.
    pub const NONE: EventFamilies = EventFamilies(0);
    /// CMAP events of the pools ([`EngineEvent::Pool`]).
    pub const POOL: EventFamilies = EventFamilies(1);
    /// SDAM monitoring: topology and server description events ([`EngineEvent::Topology`]) and
    /// the monitors' heartbeat events ([`EngineEvent::Heartbeat`]).
    pub const SDAM: EventFamilies = EventFamilies(1 << 1);
    /// Retry events ([`EngineEvent::Operation`]): attempts started, succeeded and failed,
    /// retries scheduled and denied.
    pub const RETRY: EventFamilies = EventFamilies(1 << 2);
    /// Hedging events of hedged reads ([`EngineEvent::Hedging`], A6-H1..A6-H7).
    pub const HEDGING: EventFamilies = EventFamilies(1 << 3);
    /// Every family: the default.
    pub const ALL: EventFamilies = EventFamilies(0b1111);

    /// Whether every family of `other` is in `self`.
    pub const fn contains(self, other: EventFamilies) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether a retry machine's events are published: with [`EventFamilies::RETRY`]. A
    /// machine started without records none.
    pub(super) fn publishes_retry(self) -> bool {
        self.contains(EventFamilies::RETRY)
    }

    /// Whether a hedging machine's events are published: with [`EventFamilies::HEDGING`]. A
    /// machine started without records none.
    pub(super) fn publishes_hedging(self) -> bool {
        self.contains(EventFamilies::HEDGING)
    }
}

impl Default for EventFamilies {
    fn default() -> EventFamilies {
        EventFamilies::ALL
    }
}

impl BitOr for EventFamilies {
    type Output = EventFamilies;

    fn bitor(self, other: EventFamilies) -> EventFamilies {
        EventFamilies(self.0 | other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 9 (the optional families: CMAP events CM-7, SDAM and heartbeat events LB-4,
    /// retry events, hedging events A6-H1..A6-H7): families combine with `|`, a set contains
    /// exactly its own, and every family is published by default.
    #[test]
    fn families_combine_and_contain() {
        let both = EventFamilies::POOL | EventFamilies::SDAM;
        assert!(both.contains(EventFamilies::POOL) && both.contains(EventFamilies::SDAM));
        assert!(!both.contains(EventFamilies::RETRY));
        assert!(EventFamilies::ALL.contains(both | EventFamilies::RETRY | EventFamilies::HEDGING));
        assert!(!EventFamilies::NONE.contains(EventFamilies::POOL));
        assert_eq!(EventFamilies::default(), EventFamilies::ALL);
    }
}
