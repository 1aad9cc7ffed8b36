//! Entries by increasing id, looked up in constant time (house rule 9: an input's cost must not
//! grow with the operations, sockets or connections in flight, and these are looked up several
//! times per input): the engine's operations, sockets and pending checkouts, and a pool's
//! connections.
//!
//! The engine hands ids out in increasing order (`OpId`, `ConnId`), as a pool does its
//! [`ConnectionId`]s (CM-1) and [`CheckoutId`]s, so an entry lives at `id - first` in a ring of
//! slots, and the ring's front moves on as the oldest entries end. An entry that outlives many
//! younger ones (a monitor's socket, an operation waiting out its selection timeout) would keep a
//! slot for every id handed out after it; once the ring is mostly holes, its oldest entries move
//! to an ordered map instead, so memory stays proportional to the entries alive. Iteration is in
//! id order, as a `BTreeMap`'s.

use alloc::collections::{BTreeMap, VecDeque};
use core::marker::PhantomData;

use crate::pool::{CheckoutId, ConnectionId};

/// An id handed out in increasing order.
pub(crate) trait Id: Copy {
    fn raw(self) -> u64;
    fn from_raw(raw: u64) -> Self;
}

impl Id for ConnectionId {
    fn raw(self) -> u64 {
        u64::from(self.0)
    }
    /// Only ever given back what [`Id::raw`] made (a `u32`).
    fn from_raw(raw: u64) -> ConnectionId {
        debug_assert!(u32::try_from(raw).is_ok(), "a connection id is a u32");
        ConnectionId(raw as u32)
    }
}

impl Id for CheckoutId {
    fn raw(self) -> u64 {
        self.0
    }
    fn from_raw(raw: u64) -> CheckoutId {
        CheckoutId(raw)
    }
}

/// Holes the ring may hold beyond twice its entries before its oldest entries move out.
const SLACK: usize = 1024;

/// Entries of type `T` by increasing ids of type `K` (see the module docs).
pub(crate) struct IdTable<K, T> {
    /// The id of `ring[0]`.
    first: u64,
    ring: VecDeque<Option<T>>,
    /// Entries in `ring`.
    in_ring: usize,
    /// Entries whose ids are below `first`.
    old: BTreeMap<u64, T>,
    ids: PhantomData<K>,
}

impl<K, T> Default for IdTable<K, T> {
    fn default() -> Self {
        IdTable {
            first: 0,
            ring: VecDeque::new(),
            in_ring: 0,
            old: BTreeMap::new(),
            ids: PhantomData,
        }
    }
}

impl<K: Id, T> IdTable<K, T> {
    /// The number of entries.
    pub(crate) fn len(&self) -> usize {
        self.in_ring + self.old.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get(&self, id: &K) -> Option<&T> {
        let id = id.raw();
        match id.checked_sub(self.first) {
            Some(at) => self.ring.get(usize::try_from(at).ok()?)?.as_ref(),
            None => self.old.get(&id),
        }
    }

    pub(crate) fn get_mut(&mut self, id: &K) -> Option<&mut T> {
        let id = id.raw();
        match id.checked_sub(self.first) {
            Some(at) => self.ring.get_mut(usize::try_from(at).ok()?)?.as_mut(),
            None => self.old.get_mut(&id),
        }
    }

    pub(crate) fn contains_key(&self, id: &K) -> bool {
        self.get(id).is_some()
    }

    /// Adds the entry of `id`, which must be above every id added before (the engine's ids
    /// only grow); an id below is kept in the ordered map, so nothing is lost either way.
    pub(crate) fn insert(&mut self, id: K, value: T) {
        let id = id.raw();
        if self.in_ring == 0 {
            self.ring.clear();
            self.first = self.first.max(id);
        }
        let Some(at) = id
            .checked_sub(self.first)
            .and_then(|at| usize::try_from(at).ok())
        else {
            self.old.insert(id, value);
            return;
        };
        if at < self.ring.len() {
            if self.ring[at].replace(value).is_none() {
                self.in_ring += 1;
            }
            return;
        }
        while self.ring.len() < at {
            self.ring.push_back(None);
        }
        self.ring.push_back(Some(value));
        self.in_ring += 1;
        self.compact();
    }

    pub(crate) fn remove(&mut self, id: &K) -> Option<T> {
        let id = id.raw();
        let Some(at) = id.checked_sub(self.first) else {
            return self.old.remove(&id);
        };
        let value = self.ring.get_mut(usize::try_from(at).ok()?)?.take()?;
        self.in_ring -= 1;
        while matches!(self.ring.front(), Some(None)) {
            self.ring.pop_front();
            self.first += 1;
        }
        // Holes at the back stay: ids only grow, so the next insert reuses them, one push per
        // new id (house rule 9), and `compact` bounds them.
        Some(value)
    }

    /// Moves the oldest entries to the ordered map while the ring is mostly holes.
    fn compact(&mut self) {
        while self.ring.len() > 2 * self.in_ring + SLACK {
            match self.ring.pop_front() {
                Some(Some(value)) => {
                    self.old.insert(self.first, value);
                    self.in_ring -= 1;
                }
                Some(None) => {}
                None => break,
            }
            self.first += 1;
        }
        while matches!(self.ring.front(), Some(None)) {
            self.ring.pop_front();
            self.first += 1;
        }
    }

    /// The ids, in increasing order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = K> + '_ {
        let ring = self.ring.iter().enumerate();
        let first = self.first;
        self.old.keys().map(|&id| K::from_raw(id)).chain(
            ring.filter(|(_, v)| v.is_some())
                .map(move |(at, _)| K::from_raw(first + at as u64)),
        )
    }

    /// The entries, in id order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> + '_ {
        self.old
            .values()
            .chain(self.ring.iter().filter_map(Option::as_ref))
    }

    /// The entries, in id order.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.old
            .values_mut()
            .chain(self.ring.iter_mut().filter_map(Option::as_mut))
    }
}

impl<K: Id + core::fmt::Debug, T: core::fmt::Debug> core::fmt::Debug for IdTable<K, T> {
    /// As the ordered map it stands for.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_map()
            .entries(self.keys().zip(self.values()))
            .finish()
    }
}

// The engine's own tests index the table as they indexed the map it replaced.
#[cfg(test)]
impl<K: Id, T> core::ops::Index<&K> for IdTable<K, T> {
    type Output = T;

    /// The entry of `id`; panics when there is none, as a `BTreeMap` does.
    fn index(&self, id: &K) -> &T {
        self.get(id).expect("no entry for this id")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    /// House rule 9, issue 9 (DESIGN.md "Composition": O(1) indices for what the hot path looks
    /// up): lookups, removals and id-ordered iteration agree with a `BTreeMap` through
    /// long-lived entries, holes and compaction.
    #[test]
    fn behaves_as_an_ordered_map_of_increasing_ids() {
        let mut table: IdTable<CheckoutId, u64> = IdTable::default();
        let mut model = BTreeMap::new();
        // A long-lived entry, then many short ones: the ring compacts around it.
        for id in 0..10_000_u64 {
            table.insert(CheckoutId(id), id * 10);
            model.insert(id, id * 10);
            if id % 7 != 0 && id >= 3 {
                let old = id - 3;
                assert_eq!(table.remove(&CheckoutId(old)), model.remove(&old));
            }
            if id % 1_000 == 0 {
                assert_eq!(table.len(), model.len());
                assert!(table.ring.len() <= 2 * table.in_ring + SLACK + 2);
            }
        }
        for id in [0, 1, 2, 6, 7, 14, 9_997, 9_999, 10_000, u64::MAX] {
            assert_eq!(table.get(&CheckoutId(id)), model.get(&id), "{id}");
            assert_eq!(table.contains_key(&CheckoutId(id)), model.contains_key(&id));
        }
        let ids: Vec<u64> = table.keys().map(|id| id.0).collect();
        assert_eq!(ids, model.keys().copied().collect::<Vec<_>>());
        let values: Vec<u64> = table.values_mut().map(|v| *v).collect();
        assert_eq!(values, model.values().copied().collect::<Vec<_>>());
        assert!(table.values().eq(model.values()));
        for id in ids {
            assert_eq!(table.remove(&CheckoutId(id)), model.remove(&id));
        }
        assert!(table.is_empty() && table.remove(&CheckoutId(5)).is_none());
        table.insert(CheckoutId(20_000), 1);
        assert_eq!(table.get(&CheckoutId(20_000)), Some(&1));
        assert_eq!(table.ring.len(), 1);
    }

    /// House rule 9, issue 9 (DESIGN.md "Composition": an input's cost does not depend on the
    /// unrelated operations; review7 finding 4): while a long-lived entry holds the ring's front,
    /// each later insert of a one-at-a-time operation adds exactly one slot to the ring's end,
    /// however many operations ended since the long-lived one began.
    #[test]
    fn an_insert_after_a_long_lived_entry_adds_one_slot() {
        let mut table: IdTable<CheckoutId, u64> = IdTable::default();
        table.insert(CheckoutId(0), 0);
        let end = |table: &IdTable<CheckoutId, u64>| table.first + table.ring.len() as u64;
        for id in 1..3_000_u64 {
            let before = end(&table);
            table.insert(CheckoutId(id), id);
            assert_eq!(end(&table) - before, 1, "slots added by the insert of {id}");
            assert!(
                table.ring.len() <= 2 * table.in_ring + SLACK,
                "memory stays bounded"
            );
            assert_eq!(table.remove(&CheckoutId(id)), Some(id));
        }
        assert_eq!(table.get(&CheckoutId(0)), Some(&0));
        assert_eq!(table.len(), 1);
    }
}
