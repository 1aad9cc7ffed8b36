//! The engine's open cursors, by handle and, in load-balanced mode, by the connection each is
//! pinned to (LB-10, LB-11), so that what happens to one connection touches only its own cursors
//! (house rule 9: cost follows the work).

use alloc::collections::{BTreeMap, BTreeSet};

use super::{ConnId, Cursor, CursorHandle};
use crate::address::ServerAddress;
use crate::pool::ConnectionId;

/// Open cursors, indexed by handle and by pinned connection.
#[derive(Default)]
pub(super) struct Cursors {
    by_handle: BTreeMap<CursorHandle, Cursor>,
    /// (pinned connection, cursor) for every cursor with a pinned connection.
    by_conn: BTreeSet<(ConnId, CursorHandle)>,
}

impl Cursors {
    pub(super) fn insert(&mut self, handle: CursorHandle, cursor: Cursor) {
        if let Some(conn) = cursor.conn {
            self.by_conn.insert((conn, handle));
        }
        if let Some(old) = self.by_handle.insert(handle, cursor) {
            self.unindex(handle, &old);
        }
    }

    pub(super) fn remove(&mut self, handle: &CursorHandle) -> Option<Cursor> {
        let cursor = self.by_handle.remove(handle)?;
        self.unindex(*handle, &cursor);
        Some(cursor)
    }

    /// Drops `old`'s index entry unless the cursor now at `handle` has the same connection.
    fn unindex(&mut self, handle: CursorHandle, old: &Cursor) {
        let current = self.by_handle.get(&handle).and_then(|c| c.conn);
        if let Some(conn) = old.conn.filter(|c| current != Some(*c)) {
            self.by_conn.remove(&(conn, handle));
        }
    }

    pub(super) fn get_mut(&mut self, handle: &CursorHandle) -> Option<&mut Cursor> {
        self.by_handle.get_mut(handle)
    }

    pub(super) fn len(&self) -> usize {
        self.by_handle.len()
    }

    /// The connections cursors are pinned to, one entry per cursor, in handle order: the socket,
    /// the pool's id of the connection (LB-11: kept after the socket died) and the server.
    pub(super) fn pinned(
        &self,
    ) -> impl Iterator<Item = (ConnId, Option<ConnectionId>, &ServerAddress)> + '_ {
        self.by_handle
            .values()
            .filter_map(|c| Some((c.conn?, c.pin.connection(), &c.server.address)))
    }

    /// The cursors pinned to `conn`, without looking at any other cursor.
    pub(super) fn on_conn(&self, conn: ConnId) -> impl Iterator<Item = CursorHandle> + '_ {
        self.by_conn
            .range((conn, CursorHandle(0))..=(conn, CursorHandle(u64::MAX)))
            .map(|&(_, handle)| handle)
    }

    /// Every cursor, emptying the table.
    pub(super) fn take_all(&mut self) -> BTreeMap<CursorHandle, Cursor> {
        self.by_conn.clear();
        core::mem::take(&mut self.by_handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ServerAddress;
    use crate::engine::OpSession;
    use crate::pinning::CursorPin;
    use crate::retry::AttemptServer;
    use crate::topology::{ServerType, TopologyType};
    use alloc::vec::Vec;

    fn cursor(conn: Option<u64>) -> Cursor {
        Cursor {
            server: AttemptServer {
                address: ServerAddress::new("lb", 27017),
                server_type: ServerType::LoadBalancer,
                topology_type: TopologyType::LoadBalanced,
                max_wire_version: 25,
                sessions_supported: true,
            },
            conn: conn.map(ConnId),
            pin: CursorPin::new(),
            session: OpSession::Never,
            transaction: None,
        }
    }

    /// House rule 9, LB-11: a connection's cursors are found without looking at the others, and
    /// the index follows inserts, replacements and removals.
    #[test]
    fn a_connections_cursors_are_indexed() {
        let mut cursors = Cursors::default();
        cursors.insert(CursorHandle(1), cursor(Some(7)));
        cursors.insert(CursorHandle(2), cursor(Some(8)));
        cursors.insert(CursorHandle(3), cursor(Some(7)));
        cursors.insert(CursorHandle(4), cursor(None));
        let on = |c: &Cursors, conn| c.on_conn(ConnId(conn)).collect::<Vec<_>>();
        assert_eq!(on(&cursors, 7), [CursorHandle(1), CursorHandle(3)]);
        assert_eq!(on(&cursors, 8), [CursorHandle(2)]);
        cursors.insert(CursorHandle(3), cursor(Some(8)));
        assert_eq!(on(&cursors, 7), [CursorHandle(1)]);
        assert_eq!(on(&cursors, 8), [CursorHandle(2), CursorHandle(3)]);
        assert!(cursors.remove(&CursorHandle(2)).is_some());
        assert_eq!(on(&cursors, 8), [CursorHandle(3)]);
        assert_eq!(cursors.len(), 3);
        assert_eq!(cursors.take_all().len(), 3);
        assert_eq!(on(&cursors, 7), []);
        assert_eq!(cursors.len(), 0);
    }
}
