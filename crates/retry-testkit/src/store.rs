//! The in-memory data behind `insert`, `find`, `getMore` and `killCursors`.

use std::collections::{BTreeMap, VecDeque};

use bson::oid::ObjectId;
use bson::{Bson, Document};

/// Collections by namespace (`db.collection`), the open cursors, and the results of retryable
/// writes.
#[derive(Debug, Default)]
pub(crate) struct Store {
    collections: BTreeMap<String, Vec<Document>>,
    cursors: BTreeMap<i64, Cursor>,
    last_cursor_id: i64,
    write_results: BTreeMap<WriteKey, Document>,
}

/// A retryable write's identity: its session (`lsid`, as BSON bytes) and `txnNumber`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WriteKey {
    pub(crate) session: Vec<u8>,
    pub(crate) txn_number: i64,
}

#[derive(Debug)]
struct Cursor {
    ns: String,
    remaining: VecDeque<Document>,
}

/// Why a query was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueryError {
    /// The filter uses an operator; only top-level equality is supported.
    UnsupportedFilter(String),
    /// No open cursor has this id in this namespace.
    CursorNotFound(i64),
}

/// One batch of a cursor and the id to continue it with (0 when exhausted).
#[derive(Debug, PartialEq)]
pub(crate) struct Batch {
    pub(crate) documents: Vec<Document>,
    pub(crate) cursor_id: i64,
}

impl Store {
    /// Appends `documents` to `ns`, giving an `_id` to those without one.
    pub(crate) fn insert(&mut self, ns: &str, documents: Vec<Document>) -> usize {
        let collection = self.collections.entry(ns.into()).or_default();
        let n = documents.len();
        collection.extend(documents.into_iter().map(|mut d| {
            if !d.contains_key("_id") {
                d.insert("_id", ObjectId::new());
            }
            d
        }));
        n
    }

    /// The documents of `ns`, in insertion order.
    pub(crate) fn documents(&self, ns: &str) -> Vec<Document> {
        self.collections.get(ns).cloned().unwrap_or_default()
    }

    /// The documents of `ns` equal to `filter` on each of its top-level fields, at most `limit`
    /// of them, the first `batch_size` now and a cursor for the rest.
    pub(crate) fn find(
        &mut self,
        ns: &str,
        filter: &Document,
        limit: Option<usize>,
        batch_size: usize,
    ) -> Result<Batch, QueryError> {
        if let Some(key) = filter.iter().find_map(|(k, v)| uses_operator(k, v)) {
            return Err(QueryError::UnsupportedFilter(key));
        }
        let matching = self.collections.get(ns).into_iter().flatten();
        let remaining: VecDeque<Document> = matching
            .filter(|d| filter.iter().all(|(k, v)| d.get(k) == Some(v)))
            .take(limit.unwrap_or(usize::MAX))
            .cloned()
            .collect();
        let cursor = Cursor {
            ns: ns.into(),
            remaining,
        };
        Ok(self.next_batch(cursor, batch_size))
    }

    /// The next batch of cursor `id`, which must belong to `ns`.
    pub(crate) fn get_more(
        &mut self,
        ns: &str,
        id: i64,
        batch_size: usize,
    ) -> Result<Batch, QueryError> {
        match self.cursors.remove(&id) {
            Some(cursor) if cursor.ns == ns => Ok(self.next_batch(cursor, batch_size)),
            Some(cursor) => {
                self.cursors.insert(id, cursor);
                Err(QueryError::CursorNotFound(id))
            }
            None => Err(QueryError::CursorNotFound(id)),
        }
    }

    /// Closes the cursors of `ns` among `ids`: returns those killed and those not found.
    pub(crate) fn kill_cursors(&mut self, ns: &str, ids: &[i64]) -> (Vec<i64>, Vec<i64>) {
        ids.iter().partition(|id| {
            let owned = self.cursors.get(id).is_some_and(|c| c.ns == ns);
            owned && self.cursors.remove(id).is_some()
        })
    }

    /// The reply of the retryable write `key`, if it already ran.
    pub(crate) fn write_result(&self, key: &WriteKey) -> Option<Document> {
        self.write_results.get(key).cloned()
    }

    /// Remembers the reply of the retryable write `key`, so a retry returns it without running.
    pub(crate) fn record_write(&mut self, key: WriteKey, reply: Document) {
        self.write_results.insert(key, reply);
    }

    /// How many cursors are open.
    pub(crate) fn open_cursors(&self) -> usize {
        self.cursors.len()
    }

    fn next_batch(&mut self, mut cursor: Cursor, batch_size: usize) -> Batch {
        let take = batch_size.min(cursor.remaining.len());
        let documents: Vec<Document> = cursor.remaining.drain(..take).collect();
        let cursor_id = if cursor.remaining.is_empty() {
            0
        } else {
            self.last_cursor_id += 1;
            self.cursors.insert(self.last_cursor_id, cursor);
            self.last_cursor_id
        };
        Batch {
            documents,
            cursor_id,
        }
    }
}

/// The offending key when a filter entry is an operator (`$gt`, `{$in: …}`, …).
fn uses_operator(key: &str, value: &Bson) -> Option<String> {
    if key.starts_with('$') {
        return Some(key.into());
    }
    match value {
        Bson::Document(d) => d.keys().find(|k| k.starts_with('$')).cloned(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn store_with(n: i32) -> Store {
        let mut store = Store::default();
        let docs = (0..n)
            .map(|i| doc! { "_id": i, "even": i % 2 == 0 })
            .collect();
        assert_eq!(store.insert("db.c", docs), n as usize);
        store
    }

    #[test]
    fn insert_adds_missing_ids() {
        let mut store = Store::default();
        store.insert("db.c", vec![doc! { "x": 1 }, doc! { "_id": 7, "x": 2 }]);
        let docs = store.documents("db.c");
        assert!(matches!(docs[0].get("_id"), Some(Bson::ObjectId(_))));
        assert_eq!(docs[1].get_i32("_id").ok(), Some(7));
        assert!(store.documents("db.other").is_empty());
    }

    #[test]
    fn find_then_get_more_until_exhausted() {
        let mut store = store_with(5);
        let first = store.find("db.c", &doc! {}, None, 2).unwrap();
        assert_eq!(first.documents.len(), 2);
        assert_ne!(first.cursor_id, 0);
        let second = store.get_more("db.c", first.cursor_id, 2).unwrap();
        assert_eq!(second.documents[0].get_i32("_id").ok(), Some(2));
        assert_ne!(second.cursor_id, 0);
        let last = store.get_more("db.c", second.cursor_id, 2).unwrap();
        assert_eq!(last.documents.len(), 1);
        assert_eq!(last.cursor_id, 0);
        assert_eq!(store.open_cursors(), 0);
        assert_eq!(
            store.get_more("db.c", second.cursor_id, 2),
            Err(QueryError::CursorNotFound(second.cursor_id))
        );
    }

    #[test]
    fn filter_and_limit() {
        let mut store = store_with(6);
        let evens = store
            .find("db.c", &doc! { "even": true }, None, 10)
            .unwrap();
        assert_eq!(evens.documents.len(), 3);
        assert_eq!(evens.cursor_id, 0);
        let limited = store.find("db.c", &doc! {}, Some(1), 10).unwrap();
        assert_eq!(limited.documents.len(), 1);
        assert_eq!(
            store.find("db.c", &doc! { "_id": { "$gt": 1 } }, None, 10),
            Err(QueryError::UnsupportedFilter("$gt".into()))
        );
    }

    #[test]
    fn kill_cursors_only_in_their_namespace() {
        let mut store = store_with(5);
        let open = store.find("db.c", &doc! {}, None, 1).unwrap().cursor_id;
        assert_eq!(
            store.get_more("db.other", open, 1),
            Err(QueryError::CursorNotFound(open))
        );
        assert_eq!(
            store.kill_cursors("db.other", &[open]),
            (vec![], vec![open])
        );
        assert_eq!(
            store.kill_cursors("db.c", &[open, 999]),
            (vec![open], vec![999])
        );
        assert_eq!(store.open_cursors(), 0);
    }
}
