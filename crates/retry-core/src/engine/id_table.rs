//! The engine's ids in an [`IdTable`] (they are handed out in increasing order), and its pending
//! checkouts by server and checkout id.

use alloc::vec::Vec;

use super::{ConnId, OpId, ServerId};
use crate::id_table::{sealed, Id, IdTable};
use crate::pool::CheckoutId;

impl sealed::Sealed for OpId {}

impl Id for OpId {
    fn raw(self) -> u64 {
        self.0
    }
    fn from_raw(raw: u64, _: sealed::Token) -> OpId {
        OpId(raw)
    }
}

impl sealed::Sealed for ConnId {}

impl Id for ConnId {
    fn raw(self) -> u64 {
        self.0
    }
    fn from_raw(raw: u64, _: sealed::Token) -> ConnId {
        ConnId(raw)
    }
}

/// Pending checkouts and the operation slot each is for, by server and checkout id: a pool
/// numbers its checkouts in increasing order, so each server's are an [`IdTable`] (issue 9, house
/// rule 9: a checkout's cost does not grow with the checkouts pending).
#[derive(Default)]
pub(super) struct Checkouts {
    by_server: Vec<IdTable<CheckoutId, (OpId, usize)>>,
}

impl Checkouts {
    pub(super) fn insert(&mut self, (server, id): (ServerId, CheckoutId), slot: (OpId, usize)) {
        let index = server.0 as usize;
        if self.by_server.len() <= index {
            self.by_server.resize_with(index + 1, IdTable::default);
        }
        self.by_server[index].insert(id, slot);
    }

    pub(super) fn remove(
        &mut self,
        (server, id): &(ServerId, CheckoutId),
    ) -> Option<(OpId, usize)> {
        self.by_server.get_mut(server.0 as usize)?.remove(id)
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.by_server.iter().all(IdTable::is_empty)
    }
}
