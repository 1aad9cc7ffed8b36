//! The in-memory data behind the CRUD commands: collections, open cursors, unique `_id`s and
//! the replies of retryable writes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bson::oid::ObjectId;
use bson::spec::BinarySubtype;
use bson::{Bson, Document, RawDocument};

use crate::query::{apply_update, equal, matches, upsert_seed, Unsupported};

/// One data store, shared by every server started with it (TK-*: the members of a replica set or
/// several mongos see the same data, cursors and retryable-write records). Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct DataStore(Arc<Mutex<Store>>);

impl DataStore {
    /// A new, empty data store.
    pub fn new() -> DataStore {
        DataStore::default()
    }

    /// The store, locked; a panicking test thread must not poison it for the others.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Store> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Collections by namespace (`db.collection`), the open cursors, and the results of retryable
/// writes.
#[derive(Debug, Default)]
pub(crate) struct Store {
    collections: BTreeMap<String, Vec<Document>>,
    cursors: BTreeMap<i64, Cursor>,
    last_cursor_id: i64,
    write_results: BTreeMap<WriteKey, Document>,
    /// The highest `txnNumber` each session (lsid bytes) has used.
    txn_numbers: BTreeMap<Vec<u8>, i64>,
    /// The sessions commands named (`lsid`), for `$listLocalSessions`, in first-use order.
    sessions: Vec<Document>,
    /// The encodings of the `sessions` that are `{id: <binary>}` alone, the lsids drivers send:
    /// two such lsids are equal exactly when their bytes are, so they are found by a search, not
    /// a scan (house rule 9).
    plain_sessions: BTreeSet<Vec<u8>>,
    /// TK-15: each session's latest transaction (lsid bytes).
    transactions: BTreeMap<Vec<u8>, Transaction>,
    /// Secondary indexes by namespace (`{v, key, name}`), in creation order; `_id_` is implied.
    indexes: BTreeMap<String, Vec<Document>>,
    /// The deployment's logical clock (review5 item 11, SE-16..SE-21): the increment of its
    /// cluster time, advanced by every write.
    clock: u32,
}

/// The encoding of an lsid that is `{id: <binary>}` alone (any subtype but `BinaryOld`, whose
/// encoding has a second length), `None` for any other.
fn plain_lsid_bytes(lsid: &Document) -> Option<Vec<u8>> {
    match lsid.get("id") {
        Some(Bson::Binary(id)) if lsid.len() == 1 && id.subtype != BinarySubtype::BinaryOld => {
            lsid.to_vec().ok()
        }
        _ => None,
    }
}

/// The seconds of every cluster time the test server gives (its clock counts in increments).
const CLUSTER_TIME_SECONDS: u32 = 1_700_000_000;

/// A retryable write's identity: its session (`lsid`, as BSON bytes), `txnNumber` and
/// statement (`stmtId`, 0 when the command sends none) (TK-*: dedup for every write type).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WriteKey {
    pub(crate) session: Vec<u8>,
    pub(crate) txn_number: i64,
    pub(crate) stmt_id: i64,
}

/// TK-15: a session's transaction: its number, its state and the data as it was when it
/// started (an abort puts it back). Isolation is not modelled: other sessions see its writes at
/// once, and an abort also undoes what they wrote meanwhile.
#[derive(Debug)]
struct Transaction {
    number: i64,
    state: TransactionState,
    before: BTreeMap<String, Vec<Document>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TransactionState {
    InProgress,
    Committed,
    Aborted,
}

/// A server error: code and message.
pub(crate) type Refusal = (i32, String);

/// The result of an insert: how many documents went in, and the duplicate-key failures by
/// index in the batch.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct InsertOutcome {
    pub(crate) n: usize,
    pub(crate) duplicates: Vec<(usize, Bson)>,
}

/// The result of one update statement.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct UpdateOutcome {
    pub(crate) matched: usize,
    pub(crate) modified: usize,
    pub(crate) upserted: Option<Bson>,
}

#[derive(Debug)]
struct Cursor {
    /// The server process that opened it: a cursor stays with it (TK-12).
    owner: ObjectId,
    ns: String,
    remaining: VecDeque<Document>,
    /// A change stream's cursor: stays open when empty.
    tailable: bool,
}

/// Why a query was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueryError {
    /// The filter or update uses an operator the server does not evaluate.
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
    /// The deployment's current cluster time.
    pub(crate) fn cluster_time(&self) -> bson::Timestamp {
        bson::Timestamp {
            time: CLUSTER_TIME_SECONDS,
            increment: self.clock.max(1),
        }
    }

    /// A write happened: the clock moves on; its new time.
    pub(crate) fn tick(&mut self) -> bson::Timestamp {
        self.clock = self.clock.max(1).saturating_add(1);
        self.cluster_time()
    }

    /// Appends `documents` to `ns`, giving an `_id` to those without one. A document whose
    /// `_id` is already there is refused (error 11000); `ordered` stops at the first refusal.
    pub(crate) fn insert(
        &mut self,
        ns: &str,
        documents: Vec<Document>,
        ordered: bool,
    ) -> InsertOutcome {
        let collection = self.collections.entry(ns.into()).or_default();
        let mut outcome = InsertOutcome::default();
        for (index, mut d) in documents.into_iter().enumerate() {
            if !d.contains_key("_id") {
                d.insert("_id", ObjectId::new());
            }
            let id = d.get("_id").cloned().unwrap_or(Bson::Null);
            if collection
                .iter()
                .any(|c| c.get("_id").is_some_and(|c| equal(c, &id)))
            {
                outcome.duplicates.push((index, id));
                if ordered {
                    break;
                }
                continue;
            }
            collection.push(d);
            outcome.n += 1;
        }
        outcome
    }

    /// Updates the first (or with `multi` every) document of `ns` matching `filter`; with
    /// `upsert`, inserts one when none matches.
    pub(crate) fn update(
        &mut self,
        ns: &str,
        filter: &Document,
        update: &Document,
        multi: bool,
        upsert: bool,
    ) -> Result<UpdateOutcome, QueryError> {
        validate(filter)?;
        let collection = self.collections.entry(ns.into()).or_default();
        let mut outcome = UpdateOutcome::default();
        for document in collection.iter_mut() {
            if !matches(document, filter).map_err(unsupported)? {
                continue;
            }
            let before = document.clone();
            apply_update(document, update).map_err(unsupported)?;
            outcome.matched += 1;
            outcome.modified += usize::from(*document != before);
            if !multi {
                break;
            }
        }
        if outcome.matched == 0 && upsert {
            let mut document = upsert_seed(filter);
            apply_update(&mut document, update).map_err(unsupported)?;
            if !document.contains_key("_id") {
                document.insert("_id", ObjectId::new());
            }
            outcome.upserted = document.get("_id").cloned();
            collection.push(document);
        }
        Ok(outcome)
    }

    /// Removes the documents of `ns` matching `filter`, at most one unless `multi`; returns
    /// them.
    pub(crate) fn delete(
        &mut self,
        ns: &str,
        filter: &Document,
        multi: bool,
    ) -> Result<Vec<Document>, QueryError> {
        validate(filter)?;
        let Some(collection) = self.collections.get_mut(ns) else {
            return Ok(Vec::new());
        };
        let mut removed = Vec::new();
        let mut kept = Vec::with_capacity(collection.len());
        for document in collection.drain(..) {
            if (multi || removed.is_empty()) && matches(&document, filter).map_err(unsupported)? {
                removed.push(document);
            } else {
                kept.push(document);
            }
        }
        *collection = kept;
        Ok(removed)
    }

    /// The documents of `ns` matching `filter`, in insertion order.
    pub(crate) fn matching(
        &self,
        ns: &str,
        filter: &Document,
    ) -> Result<Vec<Document>, QueryError> {
        validate(filter)?;
        let mut out = Vec::new();
        for document in self.collections.get(ns).into_iter().flatten() {
            if matches(document, filter).map_err(unsupported)? {
                out.push(document.clone());
            }
        }
        Ok(out)
    }

    /// TK-15: a command of transaction `number` of `session` (`autocommit: false`): with `start`
    /// it starts that transaction (a number below the session's highest is TransactionTooOld,
    /// 225; a number already used, NoSuchTransaction 251); without, the transaction must be in
    /// progress (else NoSuchTransaction, 251).
    pub(crate) fn transaction_command(
        &mut self,
        session: Vec<u8>,
        number: i64,
        start: bool,
    ) -> Result<(), Refusal> {
        let highest = self.txn_numbers.get(&session).copied();
        let current = self.transactions.get(&session);
        if start {
            if highest.is_some_and(|h| number < h) {
                return Err((
                    225,
                    format!("Cannot start transaction {number} on session because a newer transaction has already started"),
                ));
            }
            if current.is_some_and(|t| t.number == number) || highest == Some(number) {
                return Err((
                    251,
                    format!("Transaction {number} has already been started"),
                ));
            }
            self.txn_numbers.insert(session.clone(), number);
            let before = self.collections.clone();
            self.transactions.insert(
                session,
                Transaction {
                    number,
                    state: TransactionState::InProgress,
                    before,
                },
            );
            return Ok(());
        }
        match current {
            Some(t) if t.number == number && t.state == TransactionState::InProgress => Ok(()),
            _ => Err((
                251,
                format!(
                    "Given transaction number {number} does not match any in-progress transactions"
                ),
            )),
        }
    }

    /// TK-15: a statement of transaction `number` of `session` failed: a transaction in progress
    /// is aborted (its data put back), as a real server aborts it.
    pub(crate) fn abort_failed_statement(&mut self, session: &[u8], number: i64) {
        if let Some(transaction) = self
            .transactions
            .get_mut(session)
            .filter(|t| t.number == number && t.state == TransactionState::InProgress)
        {
            transaction.state = TransactionState::Aborted;
            self.collections = core::mem::take(&mut transaction.before);
        }
    }

    /// TK-15: `commitTransaction` (idempotent once committed) or `abortTransaction` (puts the
    /// data back) of transaction `number` of `session`.
    pub(crate) fn end_transaction(
        &mut self,
        session: &[u8],
        number: i64,
        commit: bool,
    ) -> Result<(), Refusal> {
        let Some(transaction) = self
            .transactions
            .get_mut(session)
            .filter(|t| t.number == number)
        else {
            return Err((
                251,
                format!(
                    "Given transaction number {number} does not match any in-progress transactions"
                ),
            ));
        };
        match (transaction.state, commit) {
            (TransactionState::InProgress, true) | (TransactionState::Committed, true) => {
                transaction.state = TransactionState::Committed;
                Ok(())
            }
            (TransactionState::InProgress, false) => {
                transaction.state = TransactionState::Aborted;
                self.collections = core::mem::take(&mut transaction.before);
                Ok(())
            }
            (TransactionState::Committed, false) => Err((
                256,
                "Cannot abort a transaction that has been committed".into(),
            )),
            (TransactionState::Aborted, _) => Err((251, "Transaction has been aborted".into())),
        }
    }

    /// The indexes of `ns`: `_id_` first, then the ones created, in order.
    pub(crate) fn indexes(&self, ns: &str) -> Vec<Document> {
        let mut list = vec![bson::doc! { "v": 2, "key": { "_id": 1 }, "name": "_id_" }];
        list.extend(self.indexes.get(ns).into_iter().flatten().cloned());
        list
    }

    /// Creates the index `name` on `key` (and `ns` if needed); `Err` with a real server's code and
    /// message when the name is taken by another key.
    pub(crate) fn create_index(
        &mut self,
        ns: &str,
        key: &Document,
        name: &str,
    ) -> Result<(), (i32, String)> {
        self.collections.entry(ns.into()).or_default();
        let list = self.indexes.entry(ns.into()).or_default();
        match list.iter().find(|i| i.get_str("name").ok() == Some(name)) {
            Some(existing) if existing.get_document("key").ok() == Some(key) => Ok(()),
            Some(_) => Err((
                86,
                format!("An existing index has the same name as the requested index: {name}"),
            )),
            None if name == "_id_" => Err((197, "cannot create an _id_ index".into())),
            None => {
                list.push(bson::doc! { "v": 2, "key": key.clone(), "name": name });
                Ok(())
            }
        }
    }

    /// Drops the index `name` of `ns`, or every secondary index for `*`; `Err` with a real
    /// server's code and message when there is no such collection or index.
    pub(crate) fn drop_index(&mut self, ns: &str, name: &str) -> Result<(), (i32, String)> {
        if !self.collections.contains_key(ns) {
            return Err((26, format!("ns not found {ns}")));
        }
        let list = self.indexes.entry(ns.into()).or_default();
        if name == "*" {
            list.clear();
            return Ok(());
        }
        if name == "_id_" {
            return Err((72, "cannot drop _id index".into()));
        }
        match list
            .iter()
            .position(|i| i.get_str("name").ok() == Some(name))
        {
            Some(position) => {
                list.remove(position);
                Ok(())
            }
            None => Err((27, format!("index not found with name [{name}]"))),
        }
    }

    /// Remembers a session a command named, for `$listLocalSessions`.
    pub(crate) fn note_session(&mut self, lsid: &Document) {
        if let Some(bytes) = plain_lsid_bytes(lsid) {
            if self.plain_sessions.insert(bytes) {
                self.sessions.push(lsid.clone());
            }
        } else if !self.sessions.contains(lsid) {
            self.sessions.push(lsid.clone());
        }
    }

    /// [`Store::note_session`] of an encoded lsid that is `{id: <binary>}` alone, not of subtype
    /// `BinaryOld` (the raw path's check, `crate::server`): its bytes are the ones
    /// [`Store::note_session`] would encode.
    /// `false` when `lsid` does not decode (it does once validated).
    pub(crate) fn note_plain_session(&mut self, lsid: &[u8]) -> bool {
        if self.plain_sessions.contains(lsid) {
            return true;
        }
        let document = RawDocument::from_bytes(lsid).and_then(Document::try_from);
        let Ok(document) = document else {
            return false;
        };
        self.plain_sessions.insert(lsid.to_vec());
        self.sessions.push(document);
        true
    }

    /// `$listLocalSessions: {}`: one `{_id: lsid}` per session commands named.
    pub(crate) fn local_sessions(&self) -> Vec<Document> {
        self.sessions
            .iter()
            .map(|lsid| bson::doc! { "_id": lsid.clone() })
            .collect()
    }

    /// `$out`: `ns` holds exactly `documents` afterwards.
    pub(crate) fn replace_collection(&mut self, ns: &str, documents: Vec<Document>) {
        self.collections.insert(ns.into(), documents);
    }

    /// `$merge {into}` with the default `whenMatched: "merge"`, `whenNotMatched: "insert"`: a
    /// document with the `_id` of an existing one is merged into it, others are appended.
    pub(crate) fn merge(&mut self, ns: &str, documents: Vec<Document>) {
        let target = self.collections.entry(ns.into()).or_default();
        for document in documents {
            let existing = target
                .iter_mut()
                .find(|d| matches!((d.get("_id"), document.get("_id")), (Some(a), Some(b)) if equal(a, b)));
            match existing {
                Some(existing) => existing.extend(document),
                None => target.push(document),
            }
        }
    }

    /// Creates `ns`; `false` when it already exists.
    pub(crate) fn create(&mut self, ns: &str) -> bool {
        if self.collections.contains_key(ns) {
            return false;
        }
        self.collections.insert(ns.into(), Vec::new());
        true
    }

    /// Drops `ns` and its indexes; `false` when it did not exist.
    pub(crate) fn drop_collection(&mut self, ns: &str) -> bool {
        self.indexes.remove(ns);
        self.collections.remove(ns).is_some()
    }

    /// The collections of database `db`, by name.
    pub(crate) fn collection_names(&self, db: &str) -> Vec<String> {
        let prefix = format!("{db}.");
        self.collections
            .keys()
            .filter_map(|ns| ns.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    }

    /// The databases holding at least one collection.
    pub(crate) fn database_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .collections
            .keys()
            .filter_map(|ns| ns.split_once('.').map(|(db, _)| db.to_owned()))
            .collect();
        names.dedup();
        names
    }

    /// A batch of `documents` with a cursor for the rest, as `find` and `aggregate` reply.
    pub(crate) fn open_cursor(
        &mut self,
        owner: ObjectId,
        ns: &str,
        documents: Vec<Document>,
        batch_size: usize,
    ) -> Batch {
        let cursor = Cursor {
            owner,
            ns: ns.into(),
            remaining: documents.into(),
            tailable: false,
        };
        self.next_batch(None, cursor, batch_size)
    }

    /// The documents of `ns`, in insertion order.
    pub(crate) fn documents(&self, ns: &str) -> Vec<Document> {
        self.collections.get(ns).cloned().unwrap_or_default()
    }

    /// The documents of `ns` matching `filter`, at most `limit` of them, the first `batch_size`
    /// now and a cursor for the rest: `find` without its other options, for the tests here.
    #[cfg(test)]
    pub(crate) fn find(
        &mut self,
        owner: ObjectId,
        ns: &str,
        filter: &Document,
        limit: Option<usize>,
        batch_size: usize,
    ) -> Result<Batch, QueryError> {
        let mut documents = self.matching(ns, filter)?;
        documents.truncate(limit.unwrap_or(usize::MAX));
        Ok(self.open_cursor(owner, ns, documents, batch_size))
    }

    /// The next batch of cursor `id`, which must belong to `ns`.
    pub(crate) fn get_more(
        &mut self,
        owner: ObjectId,
        ns: &str,
        id: i64,
        batch_size: usize,
    ) -> Result<Batch, QueryError> {
        match self.cursors.remove(&id) {
            Some(cursor) if cursor.ns == ns && cursor.owner == owner => {
                Ok(self.next_batch(Some(id), cursor, batch_size))
            }
            Some(cursor) => {
                self.cursors.insert(id, cursor);
                Err(QueryError::CursorNotFound(id))
            }
            None => Err(QueryError::CursorNotFound(id)),
        }
    }

    /// Closes the cursors of `ns` among `ids`: returns those killed and those not found.
    pub(crate) fn kill_cursors(
        &mut self,
        owner: ObjectId,
        ns: &str,
        ids: &[i64],
    ) -> (Vec<i64>, Vec<i64>) {
        ids.iter().partition(|id| {
            let owned = self
                .cursors
                .get(id)
                .is_some_and(|c| c.ns == ns && c.owner == owner);
            owned && self.cursors.remove(id).is_some()
        })
    }

    /// The reply of the retryable write `key`, if it already ran.
    pub(crate) fn write_result(&self, key: &WriteKey) -> Option<Document> {
        self.write_results.get(key).cloned()
    }

    /// TK-6: starts the retryable write `key` in its session; `false` (TransactionTooOld) when
    /// the session already used a higher `txnNumber`.
    pub(crate) fn begin_write(&mut self, key: &WriteKey) -> bool {
        let highest = self
            .txn_numbers
            .entry(key.session.clone())
            .or_insert(key.txn_number);
        if key.txn_number < *highest {
            return false;
        }
        *highest = key.txn_number;
        true
    }

    /// Remembers the reply of the retryable write `key`, so a retry returns it without running.
    pub(crate) fn record_write(&mut self, key: WriteKey, reply: Document) {
        self.write_results.insert(key, reply);
    }

    /// Opens a change stream's cursor on `ns`: no events ever arrive, and it stays open until
    /// killed.
    pub(crate) fn open_change_stream(&mut self, owner: ObjectId, ns: &str) -> i64 {
        self.last_cursor_id += 1;
        let cursor = Cursor {
            owner,
            ns: ns.into(),
            remaining: VecDeque::new(),
            tailable: true,
        };
        self.cursors.insert(self.last_cursor_id, cursor);
        self.last_cursor_id
    }

    /// How many cursors are open.
    pub(crate) fn open_cursors(&self) -> usize {
        self.cursors.len()
    }

    /// The next batch of `cursor`; an unfinished cursor keeps its `id` (TK-*: stable cursor
    /// ids) or gets a new one when it has none yet.
    fn next_batch(&mut self, id: Option<i64>, mut cursor: Cursor, batch_size: usize) -> Batch {
        let take = batch_size.min(cursor.remaining.len());
        let documents: Vec<Document> = cursor.remaining.drain(..take).collect();
        let cursor_id = if cursor.remaining.is_empty() && !cursor.tailable {
            0
        } else {
            let id = id.unwrap_or_else(|| {
                self.last_cursor_id += 1;
                self.last_cursor_id
            });
            self.cursors.insert(id, cursor);
            id
        };
        Batch {
            documents,
            cursor_id,
        }
    }
}

/// A filter is checked whole before any document is read, as a real server parses it first:
/// `{$or: true}` fails even on an empty collection (TK-14).
fn validate(filter: &Document) -> Result<(), QueryError> {
    matches(&Document::new(), filter)
        .map(|_| ())
        .map_err(unsupported)
}

fn unsupported(error: Unsupported) -> QueryError {
    QueryError::UnsupportedFilter(error.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    const OWNER: ObjectId = ObjectId::from_bytes([1; 12]);

    fn store_with(n: i32) -> Store {
        let mut store = Store::default();
        let docs = (0..n)
            .map(|i| doc! { "_id": i, "even": i % 2 == 0 })
            .collect();
        assert_eq!(store.insert("db.c", docs, true).n, n as usize);
        store
    }

    #[test]
    fn insert_adds_missing_ids() {
        let mut store = Store::default();
        store.insert(
            "db.c",
            vec![doc! { "x": 1 }, doc! { "_id": 7, "x": 2 }],
            true,
        );
        let docs = store.documents("db.c");
        assert!(matches!(docs[0].get("_id"), Some(Bson::ObjectId(_))));
        assert_eq!(docs[1].get_i32("_id").ok(), Some(7));
        assert!(store.documents("db.other").is_empty());
    }

    #[test]
    fn find_then_get_more_until_exhausted() {
        let mut store = store_with(5);
        let first = store.find(OWNER, "db.c", &doc! {}, None, 2).unwrap();
        assert_eq!(first.documents.len(), 2);
        assert_ne!(first.cursor_id, 0);
        let second = store.get_more(OWNER, "db.c", first.cursor_id, 2).unwrap();
        assert_eq!(second.documents[0].get_i32("_id").ok(), Some(2));
        assert_eq!(
            second.cursor_id, first.cursor_id,
            "TK-*: a cursor keeps its id"
        );
        let last = store.get_more(OWNER, "db.c", second.cursor_id, 2).unwrap();
        assert_eq!(last.documents.len(), 1);
        assert_eq!(last.cursor_id, 0);
        assert_eq!(store.open_cursors(), 0);
        assert_eq!(
            store.get_more(OWNER, "db.c", second.cursor_id, 2),
            Err(QueryError::CursorNotFound(second.cursor_id))
        );
    }

    #[test]
    fn filter_and_limit() {
        let mut store = store_with(6);
        let evens = store
            .find(OWNER, "db.c", &doc! { "even": true }, None, 10)
            .unwrap();
        assert_eq!(evens.documents.len(), 3);
        assert_eq!(evens.cursor_id, 0);
        let limited = store.find(OWNER, "db.c", &doc! {}, Some(1), 10).unwrap();
        assert_eq!(limited.documents.len(), 1);
        assert_eq!(
            store.find(OWNER, "db.c", &doc! { "_id": { "$regex": "1" } }, None, 10),
            Err(QueryError::UnsupportedFilter("$regex".into()))
        );
    }

    #[test]
    fn kill_cursors_only_in_their_namespace() {
        let mut store = store_with(5);
        let open = store
            .find(OWNER, "db.c", &doc! {}, None, 1)
            .unwrap()
            .cursor_id;
        assert_eq!(
            store.get_more(OWNER, "db.other", open, 1),
            Err(QueryError::CursorNotFound(open))
        );
        assert_eq!(
            store.kill_cursors(OWNER, "db.other", &[open]),
            (vec![], vec![open])
        );
        assert_eq!(
            store.kill_cursors(OWNER, "db.c", &[open, 999]),
            (vec![open], vec![999])
        );
        assert_eq!(store.open_cursors(), 0);
    }

    #[test]
    fn duplicate_ids_are_refused_ordered_stops() {
        let mut store = store_with(2);
        let batch = vec![doc! { "_id": 5 }, doc! { "_id": 1 }, doc! { "_id": 6 }];
        let outcome = store.insert("db.c", batch.clone(), true);
        assert_eq!(outcome.n, 1);
        assert_eq!(outcome.duplicates, vec![(1, Bson::Int32(1))]);
        let mut store = store_with(2);
        let outcome = store.insert("db.c", batch, false);
        assert_eq!(outcome.n, 2);
        assert_eq!(store.documents("db.c").len(), 4);
    }

    #[test]
    fn update_delete_upsert() {
        let mut store = store_with(4);
        let one = store
            .update(
                "db.c",
                &doc! { "even": true },
                &doc! { "$set": { "x": 1 } },
                false,
                false,
            )
            .unwrap();
        assert_eq!((one.matched, one.modified, one.upserted), (1, 1, None));
        let many = store
            .update(
                "db.c",
                &doc! { "even": true },
                &doc! { "$set": { "x": 1 } },
                true,
                false,
            )
            .unwrap();
        assert_eq!((many.matched, many.modified), (2, 1));
        let up = store
            .update(
                "db.c",
                &doc! { "_id": 9 },
                &doc! { "$set": { "x": 2 } },
                false,
                true,
            )
            .unwrap();
        assert_eq!(up.upserted, Some(Bson::Int32(9)));
        assert_eq!(
            store.delete("db.c", &doc! { "x": 1 }, false).unwrap().len(),
            1
        );
        assert_eq!(store.delete("db.c", &doc! {}, true).unwrap().len(), 4);
        assert!(store.create("db.d"));
        assert!(!store.create("db.d"));
        assert_eq!(store.collection_names("db"), vec!["c", "d"]);
        assert_eq!(store.database_names(), vec!["db"]);
        assert!(store.drop_collection("db.d"));
        assert!(!store.drop_collection("db.d"));
    }
}
