//! Entries by increasing id, looked up in constant time (house rule 9: an input's cost must not
//! grow with the operations, sockets or connections in flight, and these are looked up several
//! times per input): the engine's operations, sockets and pending checkouts, a pool's
//! connections, and a driver's state per operation ([`IdTable`] is public for that, issue 9).
//!
//! The engine hands ids out in increasing order (`OpId`, `ConnId`), as a pool does its
//! [`ConnectionId`]s (CM-1) and [`CheckoutId`]s, so the entries alive at once have ids close
//! together: an entry lives in the slot its id's low bits name (a table of a power of two
//! slots), holding its id to tell it from an older one of the same low bits. A lookup is a mask,
//! a load and a comparison (issue 9: about forty lookups per round trip). Two live entries whose
//! ids share their low bits double the table while it is at least half full; otherwise the
//! older one (a monitor's socket, an operation waiting out its selection timeout) moves to an
//! ordered map, so memory stays proportional to the entries alive. Iteration is in id order, as
//! a `BTreeMap`'s (it sorts: only closing and clearing iterate).

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::marker::PhantomData;

use crate::pool::{CheckoutId, ConnectionId};

/// An id handed out in increasing order: the engine's [`OpId`](crate::engine::OpId) and
/// [`ConnId`](crate::engine::ConnId), a pool's [`ConnectionId`] and [`CheckoutId`].
pub trait Id: Copy {
    /// The id as an integer.
    fn raw(self) -> u64;
    /// The id of an integer [`Id::raw`] gave.
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

/// The slots of a table's first entry.
const FIRST_SLOTS: usize = 8;

/// Entries of type `T` by increasing ids of type `K` (see the module docs).
pub struct IdTable<K, T> {
    /// `slots[id & mask]` holds the entry of `id`, or of another id with the same low bits, or
    /// none. Empty, or a power of two long.
    slots: Vec<Option<(u64, T)>>,
    /// `slots.len() - 1`, or 0 while there are none.
    mask: usize,
    /// Entries in `slots`.
    in_slots: usize,
    /// Entries that gave their slot up to a younger one.
    old: BTreeMap<u64, T>,
    ids: PhantomData<K>,
}

impl<K, T> Default for IdTable<K, T> {
    fn default() -> Self {
        IdTable {
            slots: Vec::new(),
            mask: 0,
            in_slots: 0,
            old: BTreeMap::new(),
            ids: PhantomData,
        }
    }
}

impl<K: Id, T> IdTable<K, T> {
    /// The number of entries.
    pub fn len(&self) -> usize {
        self.in_slots + self.old.len()
    }

    /// Whether there is no entry.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The slot `id`'s entry lives in when it is not in `old`.
    #[inline(always)]
    fn at(&self, id: u64) -> usize {
        // Only the low bits matter: the truncation on 32-bit targets keeps them.
        (id as usize) & self.mask
    }

    /// The entry of `id`.
    #[inline]
    pub fn get(&self, id: &K) -> Option<&T> {
        let id = id.raw();
        match self.slots.get(self.at(id)) {
            Some(Some((at, value))) if *at == id => Some(value),
            _ => self.old_get(id),
        }
    }

    /// The entry of `id`, to change.
    #[inline]
    pub fn get_mut(&mut self, id: &K) -> Option<&mut T> {
        let id = id.raw();
        let at = self.at(id);
        match self.slots.get_mut(at) {
            Some(Some((slot_id, value))) if *slot_id == id => Some(value),
            _ => self.old.get_mut(&id),
        }
    }

    #[inline(never)]
    fn old_get(&self, id: u64) -> Option<&T> {
        self.old.get(&id)
    }

    /// Whether `id` has an entry.
    pub fn contains_key(&self, id: &K) -> bool {
        self.get(id).is_some()
    }

    /// Adds the entry of `id` (the engine's ids only grow, but an id below the others is kept
    /// as well), replacing the one it had.
    pub fn insert(&mut self, id: K, value: T) {
        let id = id.raw();
        if !self.old.is_empty() {
            if let Some(entry) = self.old.get_mut(&id) {
                *entry = value;
                return;
            }
        }
        if self.slots.is_empty() {
            self.resize(FIRST_SLOTS);
        }
        loop {
            let at = self.at(id);
            let half_full = 2 * self.in_slots >= self.slots.len();
            match &mut self.slots[at] {
                slot @ None => {
                    *slot = Some((id, value));
                    self.in_slots += 1;
                    return;
                }
                Some((slot_id, entry)) if *slot_id == id => {
                    *entry = value;
                    return;
                }
                Some(_) if half_full => {
                    let len = 2 * self.slots.len();
                    self.resize(len);
                }
                Some((slot_id, entry)) => {
                    // A sparse table: the older of the two moves out, as the entries it
                    // outlived would otherwise keep growing the table.
                    if *slot_id < id {
                        let (older, kept) = (*slot_id, core::mem::replace(entry, value));
                        *slot_id = id;
                        self.old.insert(older, kept);
                    } else {
                        self.old.insert(id, value);
                    }
                    return;
                }
            }
        }
    }

    /// Moves every entry into a table of `len` slots (a power of two); of two that share their
    /// slot there, the older moves to `old`.
    fn resize(&mut self, len: usize) {
        debug_assert!(len.is_power_of_two());
        let mut slots = Vec::with_capacity(len);
        slots.resize_with(len, || None);
        let previous = core::mem::replace(&mut self.slots, slots);
        self.mask = len - 1;
        self.in_slots = 0;
        for (id, value) in previous.into_iter().flatten() {
            let at = self.at(id);
            match &mut self.slots[at] {
                slot @ None => {
                    *slot = Some((id, value));
                    self.in_slots += 1;
                }
                Some((slot_id, entry)) => {
                    if *slot_id < id {
                        let (older, kept) = (*slot_id, core::mem::replace(entry, value));
                        *slot_id = id;
                        self.old.insert(older, kept);
                    } else {
                        self.old.insert(id, value);
                    }
                }
            }
        }
    }

    /// Takes the entry of `id` out.
    #[inline]
    pub fn remove(&mut self, id: &K) -> Option<T> {
        let id = id.raw();
        let at = self.at(id);
        match self.slots.get_mut(at) {
            Some(slot @ Some(_)) if slot.as_ref().is_some_and(|(slot_id, _)| *slot_id == id) => {
                self.in_slots -= 1;
                slot.take().map(|(_, value)| value)
            }
            _ => self.old.remove(&id),
        }
    }

    /// The ids, in increasing order.
    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.sorted().into_iter().map(|(id, _)| K::from_raw(id))
    }

    /// The entries, in id order.
    pub fn values(&self) -> impl Iterator<Item = &T> + '_ {
        self.sorted().into_iter().map(|(_, value)| value)
    }

    /// The entries, in id order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        let mut entries: Vec<(u64, &mut T)> = self
            .slots
            .iter_mut()
            .flatten()
            .map(|(id, value)| (*id, value))
            .chain(self.old.iter_mut().map(|(id, value)| (*id, value)))
            .collect();
        entries.sort_unstable_by_key(|(id, _)| *id);
        entries.into_iter().map(|(_, value)| value)
    }

    /// Every entry with its id, in id order.
    fn sorted(&self) -> Vec<(u64, &T)> {
        let mut entries: Vec<(u64, &T)> = self
            .slots
            .iter()
            .flatten()
            .map(|(id, value)| (*id, value))
            .chain(self.old.iter().map(|(id, value)| (*id, value)))
            .collect();
        entries.sort_unstable_by_key(|(id, _)| *id);
        entries
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
    /// long-lived entries, shared slots and growth.
    #[test]
    fn behaves_as_an_ordered_map_of_increasing_ids() {
        let mut table: IdTable<CheckoutId, u64> = IdTable::default();
        let mut model = BTreeMap::new();
        // Every seventh entry long-lived, the others short: the table grows and moves the
        // long-lived ones out around the short ones.
        for id in 0..10_000_u64 {
            table.insert(CheckoutId(id), id * 10);
            model.insert(id, id * 10);
            if id % 7 != 0 && id >= 3 {
                let old = id - 3;
                assert_eq!(table.remove(&CheckoutId(old)), model.remove(&old));
            }
            if id % 1_000 == 0 {
                assert_eq!(table.len(), model.len());
                assert!(table.slots.len() <= 4 * table.len().max(FIRST_SLOTS));
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
        assert_eq!((table.in_slots, table.old.len()), (1, 0));
    }

    /// House rule 9, issue 9 (DESIGN.md "Composition": an input's cost does not depend on the
    /// unrelated operations; review7 finding 4): while a long-lived entry keeps its slot, the
    /// one-at-a-time operations after it neither grow the table nor leave anything behind,
    /// however many of them ended since the long-lived one began; it moves out once, and stays
    /// found.
    #[test]
    fn a_long_lived_entry_does_not_grow_the_table() {
        let mut table: IdTable<CheckoutId, u64> = IdTable::default();
        table.insert(CheckoutId(0), 0);
        for id in 1..3_000_u64 {
            table.insert(CheckoutId(id), id);
            assert_eq!(
                table.slots.len(),
                FIRST_SLOTS,
                "slots after the insert of {id}"
            );
            assert!(table.old.len() <= 1, "memory stays bounded");
            assert_eq!(table.remove(&CheckoutId(id)), Some(id));
        }
        assert_eq!(table.get(&CheckoutId(0)), Some(&0));
        assert_eq!(table.len(), 1);
    }

    /// Issue 9: a window of 64 operations in flight, ending out of order, lives in the slots
    /// (the ordered map is never used on this path) and the table stays within four times the
    /// window.
    #[test]
    fn a_window_in_flight_stays_in_the_slots() {
        let mut table: IdTable<CheckoutId, u64> = IdTable::default();
        let mut live = alloc::collections::VecDeque::new();
        for id in 0..10_000_u64 {
            table.insert(CheckoutId(id), id);
            live.push_back(id);
            if live.len() > 64 {
                // The oldest or the one after it ends, by turns.
                let ended = live.remove((id % 2) as usize).expect("64 live");
                assert_eq!(table.remove(&CheckoutId(ended)), Some(ended));
            }
            assert!(table.old.is_empty(), "{id}");
        }
        assert!(table.slots.len() <= 256, "{} slots", table.slots.len());
        assert_eq!(table.len(), 64);
    }
}
