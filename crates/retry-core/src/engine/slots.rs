//! An operation's attempt slots: the first inline, the others (a hedged read's further copies)
//! in a `Vec`.
//!
//! Issue 9: a retry machine has exactly one slot, named by the constant 0 on its path, so that
//! every access is a field access. A `SmallVec<[Slot; 1]>` checked whether it had spilled on
//! each access (about fifteen per round trip, some 200 instructions).

use alloc::vec::Vec;

use super::Slot;

/// Slot `0` is `first`, slot `n` is `rest[n - 1]`.
pub(super) struct Slots {
    first: Slot,
    rest: Vec<Slot>,
}

impl Slots {
    /// Only `first`.
    pub(super) fn new(first: Slot) -> Slots {
        Slots {
            first,
            rest: Vec::new(),
        }
    }

    /// Makes these slots `Slots::new(first)`, keeping the storage of the others.
    #[inline(always)]
    pub(super) fn reset(&mut self, first: Slot) {
        self.first = first;
        if !self.rest.is_empty() {
            self.rest.clear();
        }
    }

    /// How many there are (at least one).
    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        1 + self.rest.len()
    }

    /// Slot `index`, if there is one.
    #[inline(always)]
    pub(super) fn get(&self, index: usize) -> Option<&Slot> {
        match index {
            0 => Some(&self.first),
            _ => self.rest.get(index - 1),
        }
    }

    /// Slot `index`, if there is one, to change.
    #[inline(always)]
    pub(super) fn get_mut(&mut self, index: usize) -> Option<&mut Slot> {
        match index {
            0 => Some(&mut self.first),
            _ => self.rest.get_mut(index - 1),
        }
    }

    /// Adds the next slot.
    pub(super) fn push(&mut self, slot: Slot) {
        self.rest.push(slot);
    }

    /// Every slot, in order.
    #[inline(always)]
    pub(super) fn iter(&self) -> impl Iterator<Item = &Slot> + '_ {
        core::iter::once(&self.first).chain(self.rest.iter())
    }

    /// Every slot, in order.
    #[inline(always)]
    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = &mut Slot> + '_ {
        self.into_iter()
    }
}

impl core::ops::Index<usize> for Slots {
    type Output = Slot;

    /// Slot `index`; panics when there is none, as a slice does.
    #[inline(always)]
    fn index(&self, index: usize) -> &Slot {
        match index {
            0 => &self.first,
            _ => &self.rest[index - 1],
        }
    }
}

impl core::ops::IndexMut<usize> for Slots {
    #[inline(always)]
    fn index_mut(&mut self, index: usize) -> &mut Slot {
        match index {
            0 => &mut self.first,
            _ => &mut self.rest[index - 1],
        }
    }
}

impl<'a> IntoIterator for &'a mut Slots {
    type Item = &'a mut Slot;
    type IntoIter =
        core::iter::Chain<core::iter::Once<&'a mut Slot>, core::slice::IterMut<'a, Slot>>;

    fn into_iter(self) -> Self::IntoIter {
        core::iter::once(&mut self.first).chain(self.rest.iter_mut())
    }
}
