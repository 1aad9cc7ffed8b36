//! The in-memory data behind the CRUD commands: collections, open cursors, unique `_id`s and
//! the replies of retryable writes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bson::oid::ObjectId;
use bson::spec::BinarySubtype;
use bson::{doc, Bson, Document, RawDocument};

use crate::query::{apply_update, equal, matches, upsert_seed, Unsupported};
use crate::refusals::ApiParameters;

mod collection;
use collection::Collection;

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
    /// By namespace; each keeps its `_id` index in step ([`Collection`]).
    collections: BTreeMap<String, Collection>,
    /// Review36 V3 (house rule 7): the databases the deployment has, for the case check of a
    /// database's creation ([`Store::creation_refusal`]): on a `mongod`, each database a
    /// collection was created in (`DatabaseHolderImpl::openDb` keeps it in its map until
    /// `dropDb` or `close`, and dropping its last collection closes nothing:
    /// `src/mongo/db/catalog/database_holder_impl.cpp`); on a router, each database a write or
    /// `create` went to (the config server records it in `config.databases` as the write
    /// targeter creates it, until `dropDatabase`). A transaction's abort keeps it. Only
    /// `dropDatabase` removes one.
    databases: BTreeSet<String>,
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
    /// TK-15: the sessions whose latest transaction is in progress, so that a command looks only
    /// at those, not at every session that ever ran one (house rule 9).
    open: BTreeSet<Vec<u8>>,
    /// TK-15: the session (lsid bytes) whose transaction in progress the command now running
    /// belongs to ([`Store::begin_statement`]): its writes go to that transaction's undo log.
    writer: Option<Vec<u8>>,
    /// TK-15: how many commits there were (each commit's stamp): transactions, and while a
    /// transaction is in progress, writes outside any (review7 gap b).
    commits: u64,
    /// TK-15 (review7 finding 7): the changes a command may have to hide, by namespace and
    /// document ([`id_key`]), oldest first: those of the transactions in progress, and those
    /// committed after one started. A command looks up only the documents it touches.
    changes: BTreeMap<String, BTreeMap<Vec<u8>, Vec<Change>>>,
    /// TK-15: the documents each retained commit changed, with its stamp, oldest first; a commit
    /// goes once every transaction in progress started after it.
    history: Vec<(u64, Vec<DocumentKey>)>,
    /// TK-15 (review7 gap b): while a transaction is in progress, the documents the write
    /// outside any transaction now running changed (its own commit at its end).
    statement: Option<Vec<DocumentKey>>,
    /// TK-15 (review7 finding 1): the transaction in progress (lsid bytes) the write outside any
    /// transaction now running ran into: the command is undone and waits until it ends.
    blocked_by: Option<Vec<u8>>,
    /// TK-15 (review7 finding 1, leftovers12 item 5): told when a transaction ends or a pending
    /// DDL command no longer waits, for the commands waiting on either.
    ended: Arc<tokio::sync::Notify>,
    /// How many changes commands looked at, for the tests of house rule 9.
    #[cfg(test)]
    looked_at: core::cell::Cell<usize>,
    /// Secondary indexes by namespace (`{v, key, name}`), in creation order; `_id_` is implied.
    indexes: BTreeMap<String, Vec<Document>>,
    /// The deployment's logical clock (review5 item 11, SE-16..SE-21): the increment of its
    /// cluster time, advanced by every write.
    clock: u32,
    /// The seconds of its cluster time once a gossiped `$clusterTime` moved it past
    /// [`CLUSTER_TIME_SECONDS`] (SE-17, review6 finding 8).
    seconds: u32,
    /// TK-15 (leftovers11, fixes16a): the commands outside any transaction waiting in a lock
    /// queue, by arrival number ([`Store::hold_ddl`]): the DDL commands waiting for a
    /// transaction in progress (`$out`'s rename, `drop`, `dropDatabase`, `create`,
    /// `createIndexes`, `dropIndexes`: [`LockMode::Exclusive`]), and the commands queued behind
    /// one of them ([`LockMode::Intent`], review16 finding 1). While a DDL command waits for the
    /// exclusive lock, a transaction that does not hold the namespace's lock yet cannot get it
    /// ([`Store::lock_timeout`]). Each with the session (lsid bytes) whose transaction it waits
    /// for.
    pending_ddl: BTreeMap<u64, Queued>,
    /// The number the next queued command gets.
    next_ddl: u64,
    /// Leftovers12 item 5, review16 finding 1: the number of the queued command now running,
    /// when it is one taking its turn ([`Store::set_running_ddl`]): only the conflicting ones
    /// before it hold it back.
    running_ddl: Option<u64>,
    /// Fixes18b (review18 finding 6): the running command's server is older than 4.2, whose
    /// DDL on a collection takes its database's exclusive lock ([`Store::collection_ddl_target`]).
    collection_ddl_locks_database: bool,
    /// What the command now running queues for, when it is blocked and queued (taken with
    /// [`Store::take_blocked`]'s session, [`Store::take_blocked_ddl`]).
    blocked_ddl: Option<(DdlTarget, LockMode)>,
}

/// TK-15 (review16 finding 1): the lock a command outside any transaction queues for on a
/// [`DdlTarget`]: two intent locks never conflict, an exclusive one conflicts with any other
/// (the server's `lock_manager.cpp` conflict table for IX and X).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LockMode {
    /// A read or write of documents (IS / IX).
    Intent,
    /// A DDL command (X).
    Exclusive,
}

/// TK-15: a command in a lock queue ([`Store::hold_ddl`]).
#[derive(Debug)]
struct Queued {
    target: DdlTarget,
    mode: LockMode,
    /// The session whose transaction in progress it (or the DDL ahead of it) waits for.
    session: Vec<u8>,
}

/// TK-15 (leftovers11): what a DDL command needs the exclusive lock of: one collection (`$out`'s
/// rename, `drop`) or a database (`dropDatabase`), and what a command queued behind one locks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DdlTarget {
    /// A namespace, `db.collection`.
    Collection(String),
    /// A database, with every collection in it.
    Database(String),
    /// Docs13 (house rule 7): the lock of a database alone, not of its collections: the intent
    /// lock `listCollections` takes before 5.0 (`AutoGetDb` in MODE_IS, `list_collections.cpp`).
    /// It waits only for a [`DdlTarget::Database`] request (MODE_X); a collection's DDL takes
    /// the database's MODE_IX from 4.2, which an intent lock never conflicts with (before 4.2
    /// it takes MODE_X: [`Store::collection_ddl_target`]).
    DatabaseLock(String),
}

impl DdlTarget {
    /// Whether the lock of namespace `ns` is part of it.
    fn covers(&self, ns: &str) -> bool {
        match self {
            DdlTarget::Collection(target) => target == ns,
            DdlTarget::Database(db) => ns.split_once('.').is_some_and(|(d, _)| d == db),
            DdlTarget::DatabaseLock(_) => false,
        }
    }

    /// Leftovers12 item 5: whether it and `other` want a lock in common (a database's lock
    /// conflicts with its collections': a DDL on one waits for one on the other).
    fn overlaps(&self, other: &DdlTarget) -> bool {
        match (self, other) {
            (DdlTarget::Collection(ns), target) | (target, DdlTarget::Collection(ns)) => {
                target.covers(ns)
            }
            (
                DdlTarget::Database(a) | DdlTarget::DatabaseLock(a),
                DdlTarget::Database(b) | DdlTarget::DatabaseLock(b),
            ) => a == b,
        }
    }
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
/// statement: its position in the command, from 0 (TK-5: a driver sends no `stmtId`; a whole
/// command's key is its first statement's, [`crate::commands::write_key`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct WriteKey {
    pub(crate) session: Vec<u8>,
    pub(crate) txn_number: i64,
    pub(crate) stmt_id: i64,
}

/// TK-15 (review6 finding 3): a session's transaction: its number, its state, the commits it
/// started after, and the documents it changed. Its writes go into the collections at once, but
/// nobody else sees them before the commit ([`Store::visible`] shows others the documents as
/// they were), and it does not see what committed after it started (snapshot reads, review7 gap
/// b); another write to a document it changed, or its write to one changed after its start, is a
/// WriteConflict (112), or for a write outside any transaction, a wait (review7 finding 1); an
/// abort puts back only the documents it changed and drops the collections it created.
#[derive(Debug)]
struct Transaction {
    number: i64,
    state: TransactionState,
    start: u64,
    /// The documents it changed, in the order of their first change.
    touched: Vec<DocumentKey>,
    /// TK-15 (review7 gap a): the collections its writes created.
    created: Vec<String>,
    /// TK-15 (leftovers10 item 4): the collections its statements read or wrote, whose locks
    /// it holds until it ends: a `$out` into one waits ([`Store::collection_holder`]).
    accessed: Vec<String>,
    /// Versioned-api "Transactions": its first command's API parameters, which every later
    /// command must repeat ([`Store::transaction_api_mismatch`]).
    api: ApiParameters,
    /// Leftovers12 item 1: its first command's `readConcern`, the transaction's read concern
    /// ([`Store::transaction_read_concern`]).
    read_concern: Option<Document>,
    /// TK-12: the mongos (server process) that started it, `None` on a replica set: each mongos
    /// keeps its own router state for a transaction, while the data, and so the transaction
    /// itself, lives on the shards (the shared store).
    router: Option<ObjectId>,
    /// TK-15 (review8 finding 6): when it started, on tokio's clock: a real server's reaper
    /// aborts it `transactionLifetimeLimitSeconds` after this.
    started: tokio::time::Instant,
}

/// A stored document's namespace and [`id_key`].
type DocumentKey = (String, Vec<u8>);

/// TK-15: who made a [`Change`]: a transaction in progress (its session) or a commit (its
/// stamp).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Author {
    Open(Vec<u8>),
    Committed(u64),
}

/// TK-15: a document as it was before its author first changed it (`None`: the author
/// inserted it), and its position then.
#[derive(Debug)]
struct Change {
    author: Author,
    before: Option<Document>,
    index: usize,
}

/// TK-15 (review7 finding 7, review8 finding 7, review9 finding 9): the key of an `_id` in
/// [`Store::changes`]: ids that [`equal`] calls equal share it and others do not: an integral
/// number that fits an int64 by that integer (exactly, never through f64; -0.0 is 0), another
/// double by its bits, every NaN one key; any other id by the encoding of its
/// [`canonical_numbers`] copy, so numbers inside documents and arrays follow the same rule.
fn id_key(id: &Bson) -> Vec<u8> {
    let integer = |v: i64| {
        let mut key = vec![0];
        key.extend_from_slice(&v.to_be_bytes());
        key
    };
    match crate::query::exact_number(id) {
        Some(crate::query::Exact::Int(v)) => integer(v),
        Some(crate::query::Exact::Double(v)) if v.is_nan() => vec![3],
        Some(crate::query::Exact::Double(v)) => match integral(v) {
            Some(v) => integer(v),
            None => {
                let mut key = vec![2];
                key.extend_from_slice(&v.to_bits().to_be_bytes());
                key
            }
        },
        None => {
            let mut key = vec![1];
            let canonical = bson::doc! { "": canonical_numbers(id) };
            key.extend(canonical.to_vec().unwrap_or_default());
            key
        }
    }
}

/// `v` as the int64 it equals, when it is integral and fits one (-0.0 is 0).
fn integral(v: f64) -> Option<i64> {
    // 2^63 as f64 is exact; integral doubles in [-2^63, 2^63) convert to i64 exactly.
    const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;
    (v.trunc() == v && (-TWO_TO_63..TWO_TO_63).contains(&v)).then_some(v as i64)
}

/// Review9 finding 9: `value` with every number at every depth in one form per value, the key
/// [`id_key`] encodes: integers, integral doubles and integral Decimal128s (review10 finding 9)
/// that fit as int64, every NaN as one NaN, other doubles as they are.
fn canonical_numbers(value: &Bson) -> Bson {
    match value {
        Bson::Int32(v) => Bson::Int64(i64::from(*v)),
        Bson::Decimal128(v) => {
            crate::query::decimal_integer(v).map_or(Bson::Decimal128(*v), Bson::Int64)
        }
        Bson::Double(v) if v.is_nan() => Bson::Double(f64::NAN),
        Bson::Double(v) => integral(*v).map_or(Bson::Double(*v), Bson::Int64),
        Bson::Document(document) => Bson::Document(
            document
                .iter()
                .map(|(key, value)| (key.clone(), canonical_numbers(value)))
                .collect(),
        ),
        Bson::Array(items) => Bson::Array(items.iter().map(canonical_numbers).collect()),
        other => other.clone(),
    }
}

/// Review10 finding 9, TK-2: whether `id` holds, at any depth, a Decimal128 that is not an
/// integer fitting an int64: equal ids with one are not modelled (a real server calls
/// `NumberDecimal("1.5")` and `1.5` one id), so inserting one is refused loudly.
fn fractional_decimal(id: &Bson) -> bool {
    match id {
        Bson::Decimal128(v) => crate::query::decimal_integer(v).is_none(),
        Bson::Document(document) => document.values().any(fractional_decimal),
        Bson::Array(items) => items.iter().any(fractional_decimal),
        _ => false,
    }
}

/// TK-2 (review12 finding 2): `document` as every write that adds documents stores it
/// (`insert`, `$out`, `$merge`): its `_id` first ([`id_first`]); an `_id` holding a Decimal128
/// that is not an int64 integer is refused ([`fractional_decimal`]).
fn admit(document: Document) -> Result<Document, QueryError> {
    if document.get("_id").is_some_and(fractional_decimal) {
        return Err(QueryError::UnsupportedFilter(
            "an _id holding a Decimal128 that is not an int64 integer".into(),
        ));
    }
    Ok(id_first(document))
}

/// TK-4 (house rule 7): `document` with its `_id` as the first field, as a real server stores a
/// new document (the insert path's `fixDocumentForInsert`, an upsert's `ensureIdFieldIsFirst`):
/// an `_id` elsewhere is moved to the front, a missing one is a new ObjectId at the front, the
/// other fields keep their order.
fn id_first(mut document: Document) -> Document {
    if document.keys().next().map(String::as_str) == Some("_id") {
        return document;
    }
    let id = document
        .remove("_id")
        .unwrap_or_else(|| Bson::ObjectId(ObjectId::new()));
    let mut first = Document::new();
    first.insert("_id", id);
    first.extend(document);
    first
}

/// TK-15: documents to put back ([`rebuild`]), by [`id_key`]: each as it was (`None`: absent) and
/// its position then.
type Replaced = BTreeMap<Vec<u8>, (Option<Document>, usize)>;

/// TK-15: `documents` (a collection) with the documents of `replaced` (by [`id_key`]) put back as
/// they were: the current version (if any) goes, the one from before (if any) takes its place,
/// or its old position when it had gone.
fn rebuild(documents: impl IntoIterator<Item = Document>, mut replaced: Replaced) -> Vec<Document> {
    let mut out = Vec::new();
    for document in documents {
        match replaced.remove(&id_key(&id_of(&document))) {
            Some((before, _)) => out.extend(before),
            None => out.push(document),
        }
    }
    let mut gone: Vec<(usize, Document)> = replaced
        .into_values()
        .filter_map(|(before, index)| before.map(|b| (index, b)))
        .collect();
    gone.sort_by_key(|(index, _)| *index);
    for (index, document) in gone {
        out.insert(index.min(out.len()), document);
    }
    out
}

/// TK-15: what the running command sees: its own transaction's changes (`writer`), and the
/// commits up to its transaction's start (`start`; outside a transaction, all of them).
struct Viewer<'a> {
    writer: Option<&'a [u8]>,
    start: Option<u64>,
}

impl Viewer<'_> {
    fn hides(&self, change: &Change) -> bool {
        match &change.author {
            Author::Open(session) => self.writer != Some(session.as_slice()),
            Author::Committed(stamp) => self.start.is_some_and(|start| *stamp > start),
        }
    }
}

/// Review7 finding 3: how many levels of nesting a stored document may have, the document itself
/// counting as one and empty documents and arrays as none (the server's
/// `BSONDepth::getMaxDepthForUserStorage`, below the 200 it takes in a command).
pub(crate) const MAX_STORED_DEPTH: usize = 100;

/// Review7 finding 3: whether `document` has more than [`MAX_STORED_DEPTH`] levels of nesting.
pub(crate) fn too_deep(document: &Document) -> bool {
    fn deeper(value: &Bson, level: usize) -> bool {
        match value {
            Bson::Document(d) if !d.is_empty() => {
                level >= MAX_STORED_DEPTH || d.values().any(|v| deeper(v, level + 1))
            }
            Bson::Array(a) if !a.is_empty() => {
                level >= MAX_STORED_DEPTH || a.iter().any(|v| deeper(v, level + 1))
            }
            _ => false,
        }
    }
    document.values().any(|v| deeper(v, 1))
}

/// Review34 Y8: a document to insert as it was sent, before its conversion to a `Document`
/// (which keeps one value of a key sent twice).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AsSent {
    /// Its size in bytes, as the server's `objsize()`.
    pub(crate) size: usize,
    /// Whether it holds `_id` more than once at its top level, the first two taken by
    /// [`refused_id_type`].
    pub(crate) repeated_id: bool,
    /// Review36 V6: the type of the first top-level `_id` [`refused_id_type`] refuses, when it
    /// comes before a second `_id` (the server checks each `_id` as it meets it, then whether
    /// one came before).
    pub(crate) refused_id: Option<&'static str>,
}

/// Review36 V6 (house rule 7): the name of an `_id`'s type a real server does not store
/// (`validIdField`, `src/mongo/db/query/util/validate_id.cpp`, formerly
/// `storage_validation::storageValidIdField`): a regex, an array or undefined, refused as
/// InvalidIdField (53), "The '_id' value cannot be of type {type}". (Its refusal of a
/// `$`-prefixed field inside a document `_id` is not modelled.)
pub(crate) fn refused_id_type(kind: bson::spec::ElementType) -> Option<&'static str> {
    use bson::spec::ElementType;
    match kind {
        ElementType::RegularExpression => Some("regex"),
        ElementType::Array => Some("array"),
        ElementType::Undefined => Some("undefined"),
        _ => None,
    }
}

/// The refusal a real server gives a document to insert, in its order (`fixDocumentForInsert`,
/// `src/mongo/db/query/write_ops/insert.cpp`, formerly `src/mongo/db/ops/insert.cpp`): larger
/// than `maxBsonObjectSize` as sent (`BSONObjMaxUserSize`, 16 MiB): BadValue (2), "object to
/// insert too large. size in bytes: {n}, max size: 16777216" (review32 R4, house rule 7); then
/// nested deeper than [`MAX_STORED_DEPTH`]: Overflow (15), review7 finding 3; then `_id` sent
/// twice: BadValue (2), "can't have multiple _id fields in one document" (review34 Y8). Each is
/// the statement's write error, not the command's. Review36 V6: the last two in the order of
/// the document's `_id`s, as the server's one pass over its elements meets them: an `_id` of a
/// type [`refused_id_type`] names is InvalidIdField (53) when it is the first `_id` or the
/// second (checked before the repeat), else the second `_id` is the BadValue above.
///
/// Review34 Y8: `sent` is the document as it arrived (a key sent twice counts twice in its
/// size); without it the document is measured encoded again, and one that does not encode is
/// refused (BadValue), never passed as size 0.
pub(crate) fn insert_refusal(document: &Document, sent: Option<AsSent>) -> Option<(i32, String)> {
    let sent = match sent {
        Some(sent) => sent,
        None => match document.to_vec() {
            Ok(bytes) => AsSent {
                size: bytes.len(),
                repeated_id: false,
                refused_id: document
                    .get("_id")
                    .and_then(|id| refused_id_type(id.element_type())),
            },
            Err(e) => return Some((2, format!("object to insert does not encode: {e}"))),
        },
    };
    let (size, max) = (sent.size, crate::config::MAX_BSON_OBJECT_SIZE);
    if size > max.unsigned_abs() as usize {
        let message = format!("object to insert too large. size in bytes: {size}, max size: {max}");
        return Some((2, message));
    }
    if too_deep(document) {
        let message = format!(
            "cannot insert document because it exceeds {MAX_STORED_DEPTH} levels of nesting"
        );
        return Some((15, message));
    }
    if let Some(kind) = sent.refused_id {
        let message = format!("The '_id' value cannot be of type {kind}");
        return Some((53, message));
    }
    sent.repeated_id.then(|| {
        (
            2,
            String::from("can't have multiple _id fields in one document"),
        )
    })
}

/// The database of namespace `ns` (`db.collection`).
fn database_of(ns: &str) -> &str {
    ns.split_once('.').map_or("", |(db, _)| db)
}

/// The `_id` of a stored document (every stored document has one).
fn id_of(document: &Document) -> Bson {
    document.get("_id").cloned().unwrap_or(Bson::Null)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TransactionState {
    InProgress,
    Committed,
    Aborted,
}

/// A server error: code and message.
pub(crate) type Refusal = (i32, String);

/// TK-12: NoSuchTransaction (251) from a mongos that did not start transaction `number`.
fn unknown_to_router(number: i64) -> Refusal {
    (
        251,
        format!(
            "Cannot continue transaction {number} of the session: this mongos did not start it"
        ),
    )
}

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

/// Where a command runs, for the cursors it opens and continues: the server process (a cursor
/// stays with it, TK-12), the command's `lsid` and, in a transaction, its `txnNumber` (SE-14: a
/// getMore must come from the same session and transaction), its Stable API parameters
/// (versioned-api "Cursors": a getMore must repeat them), and whether the server is a router
/// (mongos and load balancer: their own error codes).
#[derive(Clone, Copy, Debug)]
pub(crate) struct CursorOrigin<'a> {
    pub(crate) owner: ObjectId,
    pub(crate) lsid: Option<&'a Document>,
    pub(crate) txn_number: Option<i64>,
    pub(crate) api: ApiParameters,
    pub(crate) router: bool,
}

#[derive(Debug)]
struct Cursor {
    /// The server process that opened it: a cursor stays with it (TK-12).
    owner: ObjectId,
    /// The session (lsid bytes) of the command that opened it.
    lsid: Option<Vec<u8>>,
    /// The transaction it was opened in.
    txn_number: Option<i64>,
    /// The Stable API parameters of the command that opened it.
    api: ApiParameters,
    ns: String,
    remaining: VecDeque<Document>,
    /// A change stream's cursor: stays open when empty.
    tailable: bool,
    /// A cursor whose getMore takes its collection's lock before 5.0
    /// ([`Store::note_locking_cursor`]; fixes15c, docs13).
    locks_collection: bool,
}

/// Why a query was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum QueryError {
    /// The filter or update uses an operator the server does not evaluate.
    UnsupportedFilter(String),
    /// No open cursor has this id in this namespace.
    CursorNotFound(i64),
    /// SE-14, TX-1: a getMore from another session or transaction than its cursor's, or with
    /// other Stable API parameters (versioned-api "Cursors"), or with a `maxTimeMS` its cursor
    /// does not take (review37 W4) (a real server's code and message).
    CursorMismatch(i32, String),
    /// TK-15: the write touches a document another transaction in progress changed (112).
    WriteConflict,
    /// Review7 finding 3: an update would store a document nested deeper than
    /// [`MAX_STORED_DEPTH`] (Overflow, 15).
    TooDeep,
    /// TK-15 (review7 finding 1): a write outside any transaction touches a document the
    /// transaction in progress of this session (lsid bytes) changed: it waits until that ends.
    Blocked(Vec<u8>),
    /// The statement's write error, code and message: an upsert would store an `_id` already
    /// there (DuplicateKey 11000, [`duplicate_key_message`]), or an update would change a
    /// document's `_id` (ImmutableField 66).
    Write(i32, String),
}

/// A real server's message for a document whose `_id` `id` is already in `ns` (11000).
pub(crate) fn duplicate_key_message(ns: &str, id: &Bson) -> String {
    format!("E11000 duplicate key error collection: {ns} index: _id_ dup key: {{ _id: {id} }}")
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
            time: self.seconds.max(CLUSTER_TIME_SECONDS),
            increment: self.clock.max(1),
        }
    }

    /// SE-17 (review6 finding 8): a command's gossiped `$clusterTime` advances the clock, as a
    /// real server's does before it reads the command's `afterClusterTime`.
    pub(crate) fn advance_clock(&mut self, time: bson::Timestamp) {
        let now = self.cluster_time();
        if (time.time, time.increment) > (now.time, now.increment) {
            self.seconds = time.time;
            self.clock = time.increment;
        }
    }

    /// A write happened: the clock moves on; its new time.
    pub(crate) fn tick(&mut self) -> bson::Timestamp {
        self.clock = self.clock.max(1).saturating_add(1);
        self.cluster_time()
    }

    /// Appends `documents` to `ns`, giving an `_id` to those without one. A document whose
    /// `_id` is already there is refused (error 11000); `ordered` stops at the first refusal. An
    /// `_id` another transaction in progress changed is a WriteConflict for the whole command
    /// (TK-15), checked before anything is written; outside a transaction, a wait (review7
    /// finding 1).
    pub(crate) fn insert(
        &mut self,
        ns: &str,
        documents: Vec<Document>,
        ordered: bool,
    ) -> Result<InsertOutcome, QueryError> {
        let documents = documents
            .into_iter()
            .map(admit)
            .collect::<Result<Vec<_>, _>>()?;
        self.note_access(ns);
        let conflict = documents
            .iter()
            .try_for_each(|d| self.conflict(ns, &id_of(d)));
        self.noted(conflict)?;
        let mut outcome = InsertOutcome::default();
        // Review34 Y4: nothing to store makes no collection (nor a database), as on a server.
        if documents.is_empty() {
            return Ok(outcome);
        }
        self.collection_mut(ns);
        for (index, d) in documents.into_iter().enumerate() {
            let id = id_of(&d);
            let collection = self.collection_mut(ns);
            if collection.contains_id(&id) {
                outcome.duplicates.push((index, id));
                if ordered {
                    break;
                }
                continue;
            }
            let position = collection.len();
            collection.push(d);
            self.record(ns, id, None, position);
            outcome.n += 1;
        }
        Ok(outcome)
    }

    /// TK-15 (review7 finding 1): told whenever a transaction ends (commit or abort), for the
    /// writes outside any transaction that wait on one.
    pub(crate) fn transaction_ended(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.ended)
    }

    /// TK-15: the command now running belongs to the transaction in progress of `session`
    /// (lsid bytes), or to none; [`Store::end_statement`] ends it.
    pub(crate) fn begin_statement(&mut self, session: Option<Vec<u8>>) {
        self.end_statement();
        self.blocked_by = None;
        self.blocked_ddl = None;
        if session.is_none() && !self.open.is_empty() {
            self.statement = Some(Vec::new());
        }
        self.writer = session;
    }

    /// TK-15: the command of [`Store::begin_statement`] ended. A write outside any transaction
    /// that ran into a transaction in progress is undone ([`Store::take_blocked`]: it waits, then
    /// runs again, review7 finding 1); any other is a commit of its own for the transactions in
    /// progress (review7 gap b).
    pub(crate) fn end_statement(&mut self) {
        self.writer = None;
        if self.blocked_by.is_some() {
            if let Some(keys) = self.statement.take() {
                self.undo(&Author::Committed(self.commits + 1), keys);
            }
        }
        self.seal();
    }

    /// TK-15 (review7 finding 1): the session whose transaction in progress the last write
    /// outside any transaction ran into (that write was undone and must wait), once.
    pub(crate) fn take_blocked(&mut self) -> Option<Vec<u8>> {
        self.blocked_by.take()
    }

    /// TK-15 (leftovers11, review16 finding 1): what the last blocked command queues for, once
    /// ([`Store::take_blocked`] gives the session it waits for).
    pub(crate) fn take_blocked_ddl(&mut self) -> Option<(DdlTarget, LockMode)> {
        self.blocked_ddl.take()
    }

    /// TK-15 (leftovers11, review16 finding 1): a command on `target` (`mode`) waits in its lock
    /// queue (for the transaction in progress of `session`, directly or through a DDL command
    /// ahead of it) until [`Store::release_ddl`] with the number returned.
    pub(crate) fn hold_ddl(&mut self, target: DdlTarget, mode: LockMode, session: Vec<u8>) -> u64 {
        let number = self.next_ddl;
        self.next_ddl += 1;
        let queued = Queued {
            target,
            mode,
            session,
        };
        self.pending_ddl.insert(number, queued);
        number
    }

    /// Fixes18b (review18 finding 6, TK-15, house rule 7): the running command's server is
    /// older than 4.2 (`locks_database`) or not, for [`Store::collection_ddl_target`].
    pub(crate) fn set_collection_ddl_locks_database(&mut self, locks_database: bool) {
        self.collection_ddl_locks_database = locks_database;
    }

    /// Fixes18b (review18 finding 6, TK-15, house rule 7): the lock a DDL command on collection
    /// `ns` (`drop`, `create`, the index commands, `$out`'s rename) requests exclusively: from
    /// 4.2 the collection's (with the database's IX), before 4.2 its database's, so that
    /// everything on any collection of the database queues behind it and it waits for any
    /// transaction holding one of them ([`Store::set_collection_ddl_locks_database`]).
    pub(crate) fn collection_ddl_target(&self, ns: &str) -> DdlTarget {
        match ns.split_once('.') {
            Some((db, _)) if self.collection_ddl_locks_database => DdlTarget::Database(db.into()),
            _ => DdlTarget::Collection(ns.to_owned()),
        }
    }

    /// Leftovers12 item 5: the running command is the queued command `number` taking its turn
    /// (`None`: it is not one).
    pub(crate) fn set_running_ddl(&mut self, number: Option<u64>) {
        self.running_ddl = number;
    }

    /// TK-15: whether any command is queued ([`Store::hold_ddl`]); when none is, no command has
    /// a pending-DDL check to make (house rule 9: a `bulkWrite` op costs nothing more for it).
    pub(crate) fn ddl_pending(&self) -> bool {
        !self.pending_ddl.is_empty()
    }

    /// TK-15 (leftovers11, leftovers12 item 5, review16 finding 1, house rule 7): a real
    /// server's pending DDL holds back the operations outside any transaction that come after it
    /// on its namespace, in order: they queue behind its exclusive lock request (a new request
    /// queues behind a waiting conflicting one), and the lock manager grants the queue from its
    /// front (`lock_manager.cpp`, `LockManager::_onLockModeChanged`: compatible requests in
    /// order, stopping at the first that conflicts), so they run after the DDL even once the
    /// transaction it waits for has ended, and a DDL command arriving after them runs after
    /// them. A command outside any transaction on `target` (`ddl`: a DDL command itself, which
    /// takes the exclusive lock) waits ([`QueryError::Blocked`], with the session the command
    /// ahead waits for) while a command before it on an overlapping target whose lock conflicts
    /// with its own is queued; it is then queued itself ([`Store::take_blocked_ddl`]), and its
    /// own turn ([`Store::set_running_ddl`]) waits only for the conflicting ones before it.
    pub(crate) fn ddl_queue(&mut self, target: &DdlTarget, ddl: bool) -> Result<(), QueryError> {
        if self.pending_ddl.is_empty() || self.writer.is_some() {
            return Ok(());
        }
        let mode = if ddl {
            LockMode::Exclusive
        } else {
            LockMode::Intent
        };
        let before = self.running_ddl.unwrap_or(u64::MAX);
        let waited = self.pending_ddl.range(..before).map(|(_, q)| q).find(|q| {
            (mode == LockMode::Exclusive || q.mode == LockMode::Exclusive)
                && q.target.overlaps(target)
        });
        let Some(queued) = waited else {
            return Ok(());
        };
        let blocked = Err(QueryError::Blocked(queued.session.clone()));
        if self.running_ddl.is_none() {
            self.blocked_ddl = Some((target.clone(), mode));
        }
        self.noted(blocked)
    }

    /// TK-15 (leftovers11): the command numbered `number` no longer waits; the commands queued
    /// behind it go on (leftovers12 item 5).
    pub(crate) fn release_ddl(&mut self, number: u64) {
        if self.pending_ddl.remove(&number).is_some() {
            self.ended.notify_waiters();
        }
    }

    /// TK-15 (leftovers11, house rule 7): a real server's pending DDL ("Pending DDL Operations
    /// and Transactions"): while a DDL command waits for the exclusive lock of a collection or
    /// database, a transaction that does not hold that collection's (or, for a database, any of
    /// its collections') intent lock yet cannot get it and aborts after
    /// `maxTransactionLockRequestTimeoutMillis` (5 ms by default): LockTimeout (24), with a
    /// TransientTransactionError label (TK-7). `None` outside a transaction, for a namespace no
    /// DDL waits for, and for a transaction that already holds it (the DDL waits for it).
    pub(crate) fn lock_timeout(&self, ns: &str) -> Option<(i32, String)> {
        if self.pending_ddl.is_empty() {
            return None;
        }
        let transaction = self
            .writer
            .as_ref()
            .and_then(|w| self.transactions.get(w))
            .filter(|t| t.state == TransactionState::InProgress)?;
        let holds = |target: &DdlTarget| {
            let mut held = transaction.created.iter().chain(&transaction.accessed);
            match target {
                DdlTarget::Collection(_) => held.any(|c| c == ns),
                DdlTarget::Database(_) | DdlTarget::DatabaseLock(_) => {
                    held.any(|c| target.covers(c))
                }
            }
        };
        let waiting = self
            .pending_ddl
            .values()
            .any(|q| q.mode == LockMode::Exclusive && q.target.covers(ns) && !holds(&q.target));
        waiting.then(|| {
            (
                24,
                format!("Unable to acquire IX lock on '{ns}' within 5ms."),
            )
        })
    }

    /// TK-15 (review7 finding 1): a transaction of `session` a write waited on for the
    /// transaction lifetime limit is aborted, as a real server's periodic reaper aborts one
    /// older than `transactionLifetimeLimitSeconds`.
    pub(crate) fn expire_transaction(&mut self, session: &[u8]) {
        self.abort(session);
    }

    /// UT-25, TK-15 (review8 finding 3, review9 finding 2): `killAllSessions` (`sessions`
    /// `None`) or `killSessions` kills the sessions, as a real server does: their transactions
    /// in progress are aborted (`killSessionsAbortUnpreparedTransactions`; a write waiting for
    /// one of them runs) and their open cursors closed (a getMore then gets CursorNotFound, 43).
    /// `killAllSessions` closes every cursor opened in a session, not those opened outside one.
    pub(crate) fn kill_sessions(&mut self, sessions: Option<&[Vec<u8>]>) {
        let killed: Vec<Vec<u8>> = match sessions {
            None => self.open.iter().cloned().collect(),
            Some(sessions) => sessions.to_vec(),
        };
        for session in killed {
            self.abort(&session);
        }
        self.cursors
            .retain(|_, cursor| match (&cursor.lsid, sessions) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(lsid), Some(sessions)) => !sessions.contains(lsid),
            });
    }

    /// TK-15 (review8 finding 6): when the transaction in progress of `session` started (`None`
    /// when it has none).
    pub(crate) fn transaction_started(&self, session: &[u8]) -> Option<tokio::time::Instant> {
        self.transactions
            .get(session)
            .filter(|t| t.state == TransactionState::InProgress)
            .map(|t| t.started)
    }

    /// TK-15 (review7 gap b): the write outside any transaction that ran while a transaction was
    /// in progress commits: the transactions in progress go on seeing the documents as before.
    fn seal(&mut self) {
        let Some(keys) = self.statement.take() else {
            return;
        };
        if !keys.is_empty() {
            self.commits += 1;
            self.history.push((self.commits, keys));
        }
    }

    /// Remembers the transaction a write outside any transaction ran into
    /// ([`Store::end_statement`]).
    fn noted<T>(&mut self, result: Result<T, QueryError>) -> Result<T, QueryError> {
        if let Err(QueryError::Blocked(session)) = &result {
            self.blocked_by = Some(session.clone());
        }
        result
    }

    /// TK-15: what the running command sees ([`Viewer`]).
    fn viewer(&self) -> Viewer<'_> {
        let writer = self.writer.as_deref();
        let start = writer
            .and_then(|w| self.transactions.get(w))
            .filter(|t| t.state == TransactionState::InProgress)
            .map(|t| t.start);
        Viewer { writer, start }
    }

    /// TK-15: the change of the document `key` of `ns` the running command does not see, the
    /// oldest first (what it sees is that change's `before`).
    fn hidden_change(&self, viewer: &Viewer<'_>, ns: &str, key: &[u8]) -> Option<&Change> {
        let chain = self.changes.get(ns)?.get(key)?;
        self.hidden_in(viewer, chain)
    }

    fn hidden_in<'c>(&self, viewer: &Viewer<'_>, chain: &'c [Change]) -> Option<&'c Change> {
        #[cfg(test)]
        self.looked_at.set(self.looked_at.get() + chain.len());
        chain.iter().find(|c| viewer.hides(c))
    }

    /// TK-15: a write of the document `id` of `ns` changed by a transaction the running command
    /// does not see: in a transaction, a WriteConflict (112); outside any, a wait for the
    /// transaction in progress that changed it (review7 finding 1).
    fn conflict(&self, ns: &str, id: &Bson) -> Result<(), QueryError> {
        let viewer = self.viewer();
        match self.hidden_change(&viewer, ns, &id_key(id)) {
            None => Ok(()),
            Some(Change {
                author: Author::Open(session),
                ..
            }) if viewer.writer.is_none() => Err(QueryError::Blocked(session.clone())),
            Some(_) => Err(QueryError::WriteConflict),
        }
    }

    /// TK-15: the namespaces the running command sees: not those a transaction in progress it
    /// does not belong to created (invisible until that transaction commits).
    fn seen_collections(&self) -> impl Iterator<Item = &String> {
        let unseen: Vec<&String> = self
            .open
            .iter()
            .filter(|session| self.writer.as_ref() != Some(*session))
            .filter_map(|session| self.transactions.get(session))
            .flat_map(|t| &t.created)
            .collect();
        self.collections
            .keys()
            .filter(move |ns| !unseen.contains(ns))
    }

    /// The collection `ns`, created when missing (TK-15, review7 gap a: by the running command's
    /// transaction, whose abort drops it again).
    fn collection_mut(&mut self, ns: &str) -> &mut Collection {
        if !self.collections.contains_key(ns) {
            if let Some(transaction) = self.writing_transaction() {
                transaction.created.push(ns.into());
            }
            self.note_database(ns);
        }
        self.collections.entry(ns.into()).or_default()
    }

    /// TK-15 (leftovers10 item 4): the running command's transaction in progress, if any, reads
    /// or writes `ns`: it holds the collection's lock until it ends, as a real server's
    /// transaction holds the intent locks of the collections it accessed.
    fn note_access(&mut self, ns: &str) {
        if let Some(transaction) = self.writing_transaction() {
            if !transaction.accessed.iter().any(|a| a == ns) {
                transaction.accessed.push(ns.to_owned());
            }
        }
    }

    /// The running command's transaction, when it is in progress.
    fn writing_transaction(&mut self) -> Option<&mut Transaction> {
        self.writer
            .as_ref()
            .and_then(|w| self.transactions.get_mut(w))
            .filter(|t| t.state == TransactionState::InProgress)
    }

    /// TK-15: the running command changes the document `id` of `ns` (`before`, at `index`): the
    /// first change of each document by a transaction in progress (or, while one is in
    /// progress, by a write outside any) goes into [`Store::changes`].
    fn record(&mut self, ns: &str, id: Bson, before: Option<Document>, index: usize) {
        let in_transaction = self.writing_transaction().is_some();
        let author = match (&self.writer, &self.statement) {
            (Some(session), _) if in_transaction => Author::Open(session.clone()),
            (None, Some(_)) => Author::Committed(self.commits + 1),
            _ => return,
        };
        let key = id_key(&id);
        let chain = self
            .changes
            .entry(ns.into())
            .or_default()
            .entry(key.clone())
            .or_default();
        if chain.iter().any(|c| c.author == author) {
            return;
        }
        chain.push(Change {
            author: author.clone(),
            before,
            index,
        });
        let document = (ns.to_owned(), key);
        match author {
            Author::Open(_) => {
                if let Some(transaction) = self.writing_transaction() {
                    transaction.touched.push(document);
                }
            }
            Author::Committed(_) => self.statement.get_or_insert_with(Vec::new).push(document),
        }
    }

    /// TK-15: the changes of `author` to `documents` are undone, newest first in each
    /// namespace; nobody else's writes are touched.
    fn undo(&mut self, author: &Author, documents: Vec<DocumentKey>) {
        let mut by_ns: BTreeMap<String, Replaced> = BTreeMap::new();
        for (ns, key) in documents {
            let Some(chains) = self.changes.get_mut(&ns) else {
                continue;
            };
            if let Some(chain) = chains.get_mut(&key) {
                if let Some(at) = chain.iter().rposition(|c| &c.author == author) {
                    let change = chain.remove(at);
                    by_ns
                        .entry(ns.clone())
                        .or_default()
                        .insert(key.clone(), (change.before, change.index));
                }
                if chain.is_empty() {
                    chains.remove(&key);
                }
            }
            if chains.is_empty() {
                self.changes.remove(&ns);
            }
        }
        for (ns, replaced) in by_ns {
            let current = self.collections.remove(&ns);
            if current.is_none() && replaced.values().all(|(before, _)| before.is_none()) {
                continue;
            }
            let current = current.map(Collection::into_documents);
            let restored = rebuild(current.unwrap_or_default(), replaced);
            self.collections.insert(ns, Collection::new(restored));
        }
    }

    /// TK-15: the documents of `ns` the running command sees: those others changed and it does
    /// not see as they were (borrowed when it sees every change of `ns`). It looks only at the
    /// changes of `ns` (review7 finding 7).
    fn visible(&self, ns: &str) -> Cow<'_, [Document]> {
        let base = self
            .collections
            .get(ns)
            .map_or(&[][..], Collection::documents);
        let Some(chains) = self.changes.get(ns) else {
            return Cow::Borrowed(base);
        };
        let viewer = self.viewer();
        let replaced: Replaced = chains
            .iter()
            .filter_map(|(key, chain)| {
                let change = self.hidden_in(&viewer, chain)?;
                Some((key.clone(), (change.before.clone(), change.index)))
            })
            .collect();
        if replaced.is_empty() {
            return Cow::Borrowed(base);
        }
        Cow::Owned(rebuild(base.iter().cloned(), replaced))
    }

    /// The positions in `ns` of the documents a write with `filter` changes (the first only
    /// unless `multi`), matched against what the running command sees (review7 finding 1); a
    /// WriteConflict (or, outside a transaction, a wait) when a transaction it does not see
    /// changed one.
    fn targets(&self, ns: &str, filter: &Document, multi: bool) -> Result<Vec<usize>, QueryError> {
        validate(filter)?;
        let view = self.visible(ns);
        let mut positions = Vec::new();
        let mut keys = BTreeSet::new();
        for (index, document) in view.iter().enumerate() {
            if matches(document, filter).map_err(unsupported)? {
                let id = id_of(document);
                self.conflict(ns, &id)?;
                positions.push(index);
                keys.insert(id_key(&id));
                if !multi {
                    break;
                }
            }
        }
        if matches!(view, Cow::Borrowed(_)) || keys.is_empty() {
            return Ok(positions);
        }
        // A matched document has no hidden change: it is in the collection as seen.
        Ok(self
            .collections
            .get(ns)
            .map_or(&[][..], Collection::documents)
            .iter()
            .enumerate()
            .filter(|(_, d)| keys.contains(&id_key(&id_of(d))))
            .map(|(index, _)| index)
            .collect())
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
        self.note_access(ns);
        let targets = self.targets(ns, filter, multi);
        let targets = self.noted(targets)?;
        // Review34 Y4: only an upsert makes the collection (as on a server, where an update
        // without one creates nothing, and so no database either).
        let mut outcome = UpdateOutcome::default();
        for index in targets {
            let collection = self.collection_mut(ns);
            let applied = collection.change(index, |document| {
                let before = document.clone();
                immutable_id(&before, update)?;
                if let Err(error) = apply_update(document, update) {
                    *document = before;
                    return Err(unsupported(error));
                }
                if let Some(error) = changed_id(&before, document, update) {
                    *document = before;
                    return Err(error);
                }
                if too_deep(document) {
                    *document = before;
                    return Err(QueryError::TooDeep);
                }
                let changed = *document != before;
                Ok(changed.then_some(before))
            });
            let Some(applied) = applied else {
                continue;
            };
            outcome.matched += 1;
            if let Some(before) = applied? {
                outcome.modified += 1;
                self.record(ns, id_of(&before), Some(before), index);
            }
        }
        if outcome.matched == 0 && upsert {
            let mut document = upsert_seed(filter);
            apply_update(&mut document, update).map_err(unsupported)?;
            if too_deep(&document) {
                return Err(QueryError::TooDeep);
            }
            let document = id_first(document);
            let id = id_of(&document);
            let conflict = self.conflict(ns, &id);
            self.noted(conflict)?;
            if self.collection_mut(ns).contains_id(&id) {
                return Err(QueryError::Write(11000, duplicate_key_message(ns, &id)));
            }
            outcome.upserted = Some(id.clone());
            let collection = self.collection_mut(ns);
            let position = collection.len();
            collection.push(document);
            self.record(ns, id, None, position);
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
        self.note_access(ns);
        let targets = self.targets(ns, filter, multi);
        let targets = self.noted(targets)?;
        let mut removed = Vec::new();
        let Some(collection) = self.collections.get_mut(ns) else {
            return Ok(removed);
        };
        for &index in targets.iter().rev() {
            removed.push(collection.remove(index));
        }
        removed.reverse();
        for (document, index) in removed.iter().zip(targets) {
            self.record(ns, id_of(document), Some(document.clone()), index);
        }
        Ok(removed)
    }

    /// The documents of `ns` matching `filter`, in insertion order.
    pub(crate) fn matching(
        &mut self,
        ns: &str,
        filter: &Document,
    ) -> Result<Vec<Document>, QueryError> {
        validate(filter)?;
        self.note_access(ns);
        let mut out = Vec::new();
        for document in self.visible(ns).iter() {
            if matches(document, filter).map_err(unsupported)? {
                out.push(document.clone());
            }
        }
        Ok(out)
    }

    /// TK-15: a command of transaction `number` of `session` (`autocommit: false`) on `router`
    /// (a mongos; `None` on a replica set): with `start` it starts that transaction (a number
    /// below the session's highest is TransactionTooOld, 225; a number already used,
    /// ConflictingOperationInProgress 117, review37 W10, [`already_started`]); without, the transaction must be in progress and, on a mongos,
    /// started by that mongos (TK-12, TX-3: another one does not know it), else
    /// NoSuchTransaction (251).
    pub(crate) fn transaction_command(
        &mut self,
        session: Vec<u8>,
        number: i64,
        start: bool,
        router: Option<ObjectId>,
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
                return Err(already_started(&session, number, router.is_some()));
            }
            self.txn_numbers.insert(session.clone(), number);
            // A newer transaction of the session replaces (and so aborts) one in progress.
            self.abort(&session);
            self.seal();
            self.open.insert(session.clone());
            self.transactions.insert(
                session,
                Transaction {
                    number,
                    state: TransactionState::InProgress,
                    start: self.commits,
                    touched: Vec::new(),
                    created: Vec::new(),
                    accessed: Vec::new(),
                    api: ApiParameters::NONE,
                    read_concern: None,
                    router,
                    started: tokio::time::Instant::now(),
                },
            );
            self.prune_history();
            return Ok(());
        }
        match current {
            Some(t) if t.number == number && t.router != router => Err(unknown_to_router(number)),
            Some(t) if t.number == number && t.state == TransactionState::InProgress => Ok(()),
            _ => Err((
                251,
                format!(
                    "Given transaction number {number} does not match any in-progress transactions"
                ),
            )),
        }
    }

    /// Versioned-api "Transactions", leftovers12 item 1: the transaction `session` just started
    /// keeps its first command's API parameters and `readConcern`.
    pub(crate) fn note_transaction_start(
        &mut self,
        session: &[u8],
        api: ApiParameters,
        read_concern: Option<Document>,
    ) {
        if let Some(transaction) = self.transactions.get_mut(session) {
            transaction.api = api;
            transaction.read_concern = read_concern;
        }
    }

    /// Leftovers12 item 1: the `readConcern` of `session`'s transaction (its first command's).
    pub(crate) fn transaction_read_concern(&self, session: &[u8]) -> Option<&Document> {
        self.transactions.get(session)?.read_concern.as_ref()
    }

    /// Versioned-api "Transactions" (house rule 7): a command `name` with `txnNumber` `number`
    /// on `session` whose API parameters `api` are not those of the session's transaction in
    /// progress: APIMismatchError (347), refused before it runs, the transaction going on. The
    /// data's server (a mongod, a router's shard) compares with that transaction whatever the
    /// command's number (`TransactionParticipant::getAPIParameters` when it checks the session
    /// out). A router (`router`, the mongos running the command) compares a command of that
    /// transaction itself, with its own message and even once the transaction ended (a
    /// commit's retry), when it started it (`TransactionRouter::beginOrContinueTxn`); one that
    /// did not refuses it as unknown instead (TK-12).
    pub(crate) fn transaction_api_mismatch(
        &self,
        session: &[u8],
        number: i64,
        api: ApiParameters,
        name: &str,
        router: Option<ObjectId>,
    ) -> Option<Refusal> {
        let transaction = self.transactions.get(session)?;
        let first = "the transaction's first command";
        if router.is_some() && transaction.number == number {
            let continuing = "transaction-continuing command";
            let known = transaction.router == router;
            return known
                .then(|| api.mismatch(transaction.api, continuing, first))
                .flatten();
        }
        if transaction.state != TransactionState::InProgress {
            return None;
        }
        api.mismatch(transaction.api, name, first)
    }

    /// TK-15: a statement of transaction `number` of `session` failed: a transaction in progress
    /// is aborted (its changes undone), as a real server aborts it.
    pub(crate) fn abort_failed_statement(&mut self, session: &[u8], number: i64) {
        if self
            .transactions
            .get(session)
            .is_some_and(|t| t.number == number)
        {
            self.abort(session);
        }
    }

    /// TK-15: drops the changes of the commits every transaction in progress already sees.
    fn prune_history(&mut self) {
        let oldest = self
            .open
            .iter()
            .filter_map(|session| self.transactions.get(session))
            .map(|t| t.start)
            .min();
        let keep = self
            .history
            .iter()
            .position(|(stamp, _)| oldest.is_some_and(|oldest| *stamp > oldest))
            .unwrap_or(self.history.len());
        for (stamp, documents) in self.history.drain(..keep).collect::<Vec<_>>() {
            let author = Author::Committed(stamp);
            for (ns, key) in documents {
                let Some(chains) = self.changes.get_mut(&ns) else {
                    continue;
                };
                if let Some(chain) = chains.get_mut(&key) {
                    chain.retain(|c| c.author != author);
                    if chain.is_empty() {
                        chains.remove(&key);
                    }
                }
                if chains.is_empty() {
                    self.changes.remove(&ns);
                }
            }
        }
    }

    /// TK-15: the transaction in progress of `session`, if any, is aborted: the documents it
    /// changed are put back and the collections it created dropped (review7 gap a); nobody
    /// else's writes are touched.
    fn abort(&mut self, session: &[u8]) {
        let Some(transaction) = self
            .transactions
            .get_mut(session)
            .filter(|t| t.state == TransactionState::InProgress)
        else {
            return;
        };
        transaction.state = TransactionState::Aborted;
        let touched = core::mem::take(&mut transaction.touched);
        let created = core::mem::take(&mut transaction.created);
        self.open.remove(session);
        self.undo(&Author::Open(session.to_vec()), touched);
        for ns in created {
            if self.collections.get(&ns).is_some_and(Collection::is_empty) {
                self.collections.remove(&ns);
                self.indexes.remove(&ns);
            }
        }
        self.prune_history();
        self.ended.notify_waiters();
    }

    /// TK-15: `commitTransaction` (idempotent once committed) or `abortTransaction` (puts the
    /// data back) of transaction `number` of `session`, on `router` (see
    /// [`Store::transaction_command`]). On a mongos that did not start the transaction a commit
    /// is a recovering commit: without `recovery_token` it is refused with 50940, as a real
    /// mongos does (`TransactionRouter`, review8 finding 2, TX-6); with it, a commit of a
    /// committed transaction succeeds. Anything else there is NoSuchTransaction (251) and
    /// changes nothing.
    pub(crate) fn end_transaction(
        &mut self,
        session: &[u8],
        number: i64,
        commit: bool,
        router: Option<ObjectId>,
        recovery_token: bool,
    ) -> Result<(), Refusal> {
        let started_here = self
            .transactions
            .get(session)
            .is_some_and(|t| t.number == number && t.router == router);
        if commit && router.is_some() && !started_here && !recovery_token {
            return Err((
                50940,
                "Cannot recover the transaction decision without a recoveryToken".to_owned(),
            ));
        }
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
        if transaction.router != router
            && !(commit && transaction.state == TransactionState::Committed)
        {
            return Err(unknown_to_router(number));
        }
        match (transaction.state, commit) {
            (TransactionState::InProgress, true) | (TransactionState::Committed, true) => {
                if transaction.state == TransactionState::InProgress {
                    transaction.state = TransactionState::Committed;
                    transaction.created.clear();
                    let touched = core::mem::take(&mut transaction.touched);
                    self.open.remove(session);
                    self.commits += 1;
                    let open = Author::Open(session.to_vec());
                    for (ns, key) in &touched {
                        let change = self
                            .changes
                            .get_mut(ns)
                            .and_then(|chains| chains.get_mut(key))
                            .and_then(|chain| chain.iter_mut().rfind(|c| c.author == open));
                        if let Some(change) = change {
                            change.author = Author::Committed(self.commits);
                        }
                    }
                    if !touched.is_empty() {
                        self.history.push((self.commits, touched));
                    }
                    self.prune_history();
                    self.ended.notify_waiters();
                }
                Ok(())
            }
            (TransactionState::InProgress, false) => {
                self.abort(session);
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
        self.collection_mut(ns);
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
        let document = RawDocument::from_bytes(lsid)
            .ok()
            .map(retry_core::wire::to_document);
        let Some(Ok(document)) = document else {
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

    /// `$out`: `ns` holds exactly `documents` afterwards, each admitted as an insert admits it
    /// ([`admit`]). Like a real server's `$out`, which inserts its result into a new collection
    /// with an `_id` index and then renames it over `ns`, a second document with one `_id` is
    /// DuplicateKey (11000) with `ns` unchanged (review12 finding 2). TK-15: outside any
    /// transaction the rename first waits ([`QueryError::Blocked`]) for a transaction in
    /// progress that holds `ns` (read or wrote it, or created it), as a real server's does for
    /// a collection whose lock a transaction holds. Nothing is written before.
    pub(crate) fn replace_collection(
        &mut self,
        ns: &str,
        documents: Vec<Document>,
    ) -> Result<(), QueryError> {
        let mut new = Collection::default();
        for document in documents {
            let document = admit(document)?;
            let id = id_of(&document);
            if new.contains_id(&id) {
                return Err(QueryError::Write(11000, duplicate_key_message(ns, &id)));
            }
            new.push(document);
        }
        let target = self.collection_ddl_target(ns);
        self.ddl_queue(&target, true)?;
        self.ddl_holder(target)?;
        let added: Vec<Bson> = new.documents().iter().map(id_of).collect();
        let old = core::mem::replace(self.collection_mut(ns), new).into_documents();
        // TK-15: in a transaction, every old document was removed and every new one added.
        for (index, document) in old.into_iter().enumerate() {
            self.record(ns, id_of(&document), Some(document), index);
        }
        for (index, id) in added.into_iter().enumerate() {
            self.record(ns, id, None, index);
        }
        Ok(())
    }

    /// TK-15: [`Store::collection_holder`] for a DDL command on `target`: when it must wait, the
    /// target is noted for [`Store::take_blocked_ddl`].
    fn ddl_holder(&mut self, target: DdlTarget) -> Result<(), QueryError> {
        let held = self.collection_holder(|c| target.covers(c));
        if held.is_err() && self.running_ddl.is_none() {
            self.blocked_ddl = Some((target, LockMode::Exclusive));
        }
        self.noted(held)
    }

    /// TK-15: the transaction in progress the running command (outside any) does not belong to
    /// that holds a namespace `held` picks: it created it, or read or wrote it (leftovers10 item
    /// 4: a real transaction holds the intent lock of every collection it accessed until it
    /// ends, and the rename of a `$out` or a drop needs the collection's exclusive lock). Looks
    /// at the transactions in progress and the collections each accessed.
    fn collection_holder(&self, held: impl Fn(&str) -> bool) -> Result<(), QueryError> {
        let viewer = self.viewer();
        let holder = self
            .open
            .iter()
            .filter(|session| viewer.writer != Some(session.as_slice()))
            .find(|session| {
                self.transactions
                    .get(*session)
                    .is_some_and(|t| t.created.iter().chain(&t.accessed).any(|c| held(c)))
            });
        match holder {
            Some(session) => Err(QueryError::Blocked(session.clone())),
            None => Ok(()),
        }
    }

    /// `$merge {into}` with the default `whenMatched: "merge"`, `whenNotMatched: "insert"`: a
    /// document with the `_id` of an existing one is merged into it, others are appended, each
    /// admitted as an insert admits it ([`admit`]: a missing `_id` added). TK-15:
    /// outside any transaction, a document whose `_id` a transaction in progress changed makes
    /// it wait first ([`QueryError::Blocked`]), as any other write to that document does;
    /// nothing is written before. Leftovers12 item 4 (house rule 7): a real server merges with
    /// an unordered batch of upserts `{q: {_id}, u: {$set: <document>}}`, so a document whose
    /// `_id` equals an existing one's only as a number of another type (`5000.0` onto `5000`) is
    /// ImmutableField 66 ([`changed_id`]: `$set` of `_id` to a value not binary-equal), and the
    /// others are written all the same: the first such error is answered after them. Review15
    /// finding 1 (house rule 7): those upserts lock the target as any update does
    /// (`write_ops_exec.cpp`), so outside any transaction (the only place a `$merge` runs) it
    /// first queues behind a DDL command pending on the target ([`Store::ddl_queue`]).
    pub(crate) fn merge(&mut self, ns: &str, documents: Vec<Document>) -> Result<(), QueryError> {
        let documents = documents
            .into_iter()
            .map(admit)
            .collect::<Result<Vec<_>, _>>()?;
        if self.ddl_pending() {
            self.ddl_queue(&DdlTarget::Collection(ns.to_owned()), false)?;
        }
        let conflict = documents
            .iter()
            .try_for_each(|d| self.conflict(ns, &id_of(d)));
        self.noted(conflict)?;
        self.collection_mut(ns);
        let mut refused = None;
        for document in documents {
            let target = self.collection_mut(ns);
            // The index says where the document with this `_id` is (house rule 9).
            let existing = document.get("_id").and_then(|id| target.position_of(id));
            // TK-15: in a transaction, the document as it was goes into the undo log.
            let (before, index) = match existing {
                Some(index) => {
                    let set = doc! { "$set": document.clone() };
                    let changed = changed_id(&target.documents()[index], &document, &set);
                    if let Some(error) = changed {
                        refused.get_or_insert(error);
                        continue;
                    }
                    let before = target.change(index, |d| {
                        let before = d.clone();
                        d.extend(document);
                        before
                    });
                    (before, index)
                }
                None => {
                    target.push(document);
                    (None, target.len() - 1)
                }
            };
            let id = id_of(&self.collections[ns].documents()[index]);
            self.record(ns, id, before, index);
        }
        refused.map_or(Ok(()), Err)
    }

    /// Review34 Y4: the refusal a real server gives the creation of collection `ns` when that
    /// creates its database: the running command's `router` or a `mongod`, with the databases
    /// the deployment has (review36 V3, [`Store::databases`]: a database stays until
    /// `dropDatabase`, its last collection's drop or a transaction's abort notwithstanding);
    /// `None` when its database exists ([`crate::database_name::creation_refusal`]). On a
    /// `router`, a database it may create is created (recorded) now, whatever the write: its
    /// targeter creates the database before the write runs (review36 V3).
    pub(crate) fn creation_refusal(&mut self, ns: &str, router: bool) -> Option<Refusal> {
        let db = database_of(ns);
        // The usual case, the database there, looks up no other.
        if self.databases.contains(db) {
            return None;
        }
        let existing = self.databases.iter().map(String::as_str);
        let refusal = crate::database_name::creation_refusal(db, existing, router);
        if router && refusal.is_none() {
            self.note_database(ns);
        }
        refusal
    }

    /// Review36 V3: the database of `ns` exists from now on ([`Store::databases`]): a collection
    /// was created in it, or a router's write went to it (after
    /// [`Store::creation_refusal`] passed it).
    pub(crate) fn note_database(&mut self, ns: &str) {
        let db = database_of(ns);
        if !self.databases.contains(db) {
            self.databases.insert(db.to_owned());
        }
    }

    /// Creates `ns`; `false` when it already exists.
    pub(crate) fn create(&mut self, ns: &str) -> bool {
        if self.collections.contains_key(ns) {
            return false;
        }
        self.collection_mut(ns);
        true
    }

    /// Drops `ns` and its indexes; `false` when it did not exist. TK-15 (review12 finding 1):
    /// first waits ([`QueryError::Blocked`]) for a transaction in progress that holds `ns`, as
    /// `$out` does ([`Store::replace_collection`]): on a real server a drop is DDL that waits
    /// for the collection lock of such a transaction ("Pending DDL Operations and
    /// Transactions"), so that transaction's abort never brings the dropped documents back.
    pub(crate) fn drop_collection(&mut self, ns: &str) -> Result<bool, QueryError> {
        let target = self.collection_ddl_target(ns);
        self.ddl_queue(&target, true)?;
        self.ddl_holder(target)?;
        self.indexes.remove(ns);
        Ok(self.collections.remove(ns).is_some())
    }

    /// `dropDatabase`: drops every collection of database `db` the running command sees. TK-15
    /// (review12 finding 1): first waits for a transaction in progress that holds any
    /// collection of `db` (the database's exclusive lock), with nothing dropped before.
    pub(crate) fn drop_database(&mut self, db: &str) -> Result<(), QueryError> {
        let target = DdlTarget::Database(db.to_owned());
        self.ddl_queue(&target, true)?;
        self.ddl_holder(target)?;
        let prefix = format!("{db}.");
        for c in self.collection_names(db) {
            let ns = format!("{prefix}{c}");
            self.indexes.remove(&ns);
            self.collections.remove(&ns);
        }
        // Review36 V3: `dropDatabase` closes the database (`DatabaseHolderImpl::dropDb`; on a
        // router, its `config.databases` entry goes), unless a collection another transaction
        // in progress created is still there.
        if !self.collections.keys().any(|ns| database_of(ns) == db) {
            self.databases.remove(db);
        }
        Ok(())
    }

    /// The collections of database `db` the running command sees, by name.
    pub(crate) fn collection_names(&self, db: &str) -> Vec<String> {
        let prefix = format!("{db}.");
        self.seen_collections()
            .filter_map(|ns| ns.strip_prefix(&prefix).map(str::to_owned))
            .collect()
    }

    /// Docs13: the namespaces the running command sees ([`Store::seen_collections`]), in order.
    pub(crate) fn seen_collection_names(&self) -> Vec<String> {
        self.seen_collections().cloned().collect()
    }

    /// The databases holding at least one collection the running command sees.
    pub(crate) fn database_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .seen_collections()
            .filter_map(|ns| ns.split_once('.').map(|(db, _)| db.to_owned()))
            .collect();
        names.dedup();
        names
    }

    /// A batch of `documents` with a cursor for the rest, as `find` and `aggregate` reply.
    pub(crate) fn open_cursor(
        &mut self,
        origin: CursorOrigin<'_>,
        ns: &str,
        documents: Vec<Document>,
        batch_size: usize,
    ) -> Batch {
        let cursor = Cursor {
            owner: origin.owner,
            lsid: origin.lsid.and_then(|l| l.to_vec().ok()),
            txn_number: origin.txn_number,
            api: origin.api,
            ns: ns.into(),
            remaining: documents.into(),
            tailable: false,
            locks_collection: false,
        };
        self.next_batch(None, cursor, batch_size)
    }

    /// Fixes15c, docs13 (TK-15): the open cursor `id` is one whose getMore takes its
    /// collection's lock before 5.0: a `find` cursor, or an aggregate's whose pipeline the
    /// server answered with its query layer alone (the executor's `kLockExternally` lock
    /// policy, `getmore_cmd.cpp`). A pipeline's or `listIndexes`' cursor locks internally,
    /// only when it reads more from the collection.
    pub(crate) fn note_locking_cursor(&mut self, id: i64) {
        if let Some(cursor) = self.cursors.get_mut(&id) {
            cursor.locks_collection = true;
        }
    }

    /// Fixes15c (TK-15): whether `owner`'s open cursor `id` of `ns` takes its collection's lock
    /// for a getMore ([`Store::note_locking_cursor`]).
    pub(crate) fn is_locking_cursor(&self, owner: ObjectId, ns: &str, id: i64) -> bool {
        self.cursors
            .get(&id)
            .is_some_and(|c| c.locks_collection && c.owner == owner && c.ns == ns)
    }

    /// The documents of `ns` the running command sees ([`Store::visible`]), in insertion order.
    pub(crate) fn documents(&mut self, ns: &str) -> Vec<Document> {
        self.note_access(ns);
        self.visible(ns).into_owned()
    }

    /// The documents of `ns` matching `filter`, at most `limit` of them, the first `batch_size`
    /// now and a cursor for the rest: `find` without its other options, for the tests here.
    #[cfg(test)]
    pub(crate) fn find(
        &mut self,
        origin: CursorOrigin<'_>,
        ns: &str,
        filter: &Document,
        limit: Option<usize>,
        batch_size: usize,
    ) -> Result<Batch, QueryError> {
        let mut documents = self.matching(ns, filter)?;
        documents.truncate(limit.unwrap_or(usize::MAX));
        Ok(self.open_cursor(origin, ns, documents, batch_size))
    }

    /// The next batch of cursor `id`, which must belong to `ns` and, as on a real server, to
    /// the getMore's session and transaction ([`cursor_mismatch`]), then have been opened with
    /// the getMore's Stable API parameters (versioned-api "Cursors": APIMismatchError, 347, the
    /// server's `setUpOperationContextStateForGetMore`); a refused getMore leaves the cursor open.
    pub(crate) fn get_more(
        &mut self,
        origin: CursorOrigin<'_>,
        ns: &str,
        id: i64,
        batch_size: usize,
        max_time: bool,
    ) -> Result<Batch, QueryError> {
        match self.cursors.remove(&id) {
            Some(cursor) if cursor.ns == ns && cursor.owner == origin.owner => {
                let mismatch = cursor_mismatch(&cursor, id, origin)
                    .or_else(|| {
                        let opener = "the cursor-creating command";
                        origin.api.mismatch(cursor.api, "getMore", opener)
                    })
                    .or_else(|| (max_time && !cursor.tailable).then(max_time_on_get_more));
                if let Some((code, message)) = mismatch {
                    self.cursors.insert(id, cursor);
                    return Err(QueryError::CursorMismatch(code, message));
                }
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
    /// the session already used a higher `txnNumber`. A higher number aborts the session's
    /// transaction in progress, as on a real server (TK-15: else the write would wait for its
    /// own session's transaction).
    pub(crate) fn begin_write(&mut self, key: &WriteKey) -> bool {
        let highest = self
            .txn_numbers
            .entry(key.session.clone())
            .or_insert(key.txn_number);
        if key.txn_number < *highest {
            return false;
        }
        *highest = key.txn_number;
        let older = self
            .transactions
            .get(&key.session)
            .is_some_and(|t| t.number < key.txn_number);
        if older {
            self.abort(&key.session);
        }
        true
    }

    /// Remembers the reply of the retryable write `key`, so a retry returns it without running.
    pub(crate) fn record_write(&mut self, key: WriteKey, reply: Document) {
        self.write_results.insert(key, reply);
    }

    /// Opens a change stream's cursor on `ns`: no events ever arrive, and it stays open until
    /// killed.
    pub(crate) fn open_change_stream(&mut self, origin: CursorOrigin<'_>, ns: &str) -> i64 {
        self.last_cursor_id += 1;
        let cursor = Cursor {
            owner: origin.owner,
            lsid: origin.lsid.and_then(|l| l.to_vec().ok()),
            txn_number: origin.txn_number,
            api: origin.api,
            ns: ns.into(),
            remaining: VecDeque::new(),
            tailable: true,
            locks_collection: false,
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

/// Review37 W10 (TX-1, TX-7): a `startTransaction` at the session's active transaction number
/// (the transaction in progress, committed or aborted, or a retryable write's number) is
/// ConflictingOperationInProgress (117), with no `TransientTransactionError` label
/// (`crate::commands::transaction_labels`): a replica-set member is not in a sharded cluster
/// (mongodb/mongo src/mongo/db/transaction/transaction_participant.cpp: "Only servers in a
/// sharded cluster can start a new transaction at the active transaction number"; a shard
/// server's 50911 is not modelled), and a mongos's router has the number already
/// (src/mongo/s/transaction_router.cpp: "txnNumber N for session ... already started").
fn already_started(session: &[u8], number: i64, router: bool) -> Refusal {
    if !router {
        return (
            117,
            String::from(
                "Only servers in a sharded cluster can start a new transaction at the active \
                 transaction number",
            ),
        );
    }
    let id = Document::from_reader(session)
        .ok()
        .and_then(|lsid| match lsid.get("id") {
            Some(Bson::Binary(id)) => Some(
                id.bytes
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        let dash = if matches!(i, 4 | 6 | 8 | 10) { "-" } else { "" };
                        format!("{dash}{b:02x}")
                    })
                    .collect::<String>(),
            ),
            _ => None,
        })
        .unwrap_or_default();
    (
        117,
        format!("txnNumber {number} for session {{ id: UUID(\"{id}\") }} already started"),
    )
}

/// Review37 W4 (TO-13, CS-4): a real server refuses `maxTimeMS` on a getMore of a cursor that is
/// not awaitData, once it has found the cursor and checked its session, transaction and API
/// parameters: BadValue (2) (mongodb/mongo src/mongo/db/commands/getmore_cmd.cpp). The cursor
/// stays open. Of the test server's cursors only a change stream's is tailable and awaitData.
fn max_time_on_get_more() -> (i32, String) {
    (
        2,
        String::from("cannot set maxTimeMS on getMore command for a non-awaitData cursor"),
    )
}

/// SE-14, TX-1 (review6 finding 4): a real server's refusal of a getMore of `cursor` (`id`) from
/// `origin`: a session when the cursor has none (50736), none when it has one (50737), another
/// session (50738); a transaction when it was opened outside one (50739), none when it was
/// opened in one (50740), another transaction (50741). A router's codes are 50799..50804.
fn cursor_mismatch(cursor: &Cursor, id: i64, origin: CursorOrigin<'_>) -> Option<(i32, String)> {
    let lsid = origin.lsid.and_then(|l| l.to_vec().ok());
    let (code, message) = match (&cursor.lsid, &lsid, cursor.txn_number, origin.txn_number) {
        (None, Some(_), _, _) => (
            50736,
            "which was not created in a session, in a session".into(),
        ),
        (Some(_), None, _, _) => (
            50737,
            "which was created in a session, without an lsid".into(),
        ),
        (Some(a), Some(b), _, _) if a != b => {
            (50738, "which was created in another session".into())
        }
        (_, _, None, Some(t)) => (
            50739,
            format!("which was not created in a transaction, in transaction {t}"),
        ),
        (_, _, Some(n), None) => (
            50740,
            format!("which was created in transaction {n}, without a txnNumber"),
        ),
        (_, _, Some(n), Some(t)) if n != t => (
            50741,
            format!("which was created in transaction {n}, in transaction {t}"),
        ),
        _ => return None,
    };
    let code = if origin.router { code + 63 } else { code };
    Some((
        code,
        format!("Cannot run getMore on cursor {id}, {message}"),
    ))
}

/// House rule 7, leftovers12 item 4: what a real server answers when `update` turned `before`
/// into `after`: ImmutableField 66 when the `_id` is gone, or, for a replacement, is another
/// value (`ObjectReplaceExecutor`: compared as values, so `5000.0` may replace `5000` and is
/// stored), or, for an update with operators, is not binary-equal to the old one (a `$set` of
/// `_id` to a value of another type is no no-op, `SetNode::updateExistingElement` and
/// `BSONElement::binaryEqualValues`, so `modifier_node.cpp` refuses it: "Updating the path
/// '_id' to _id: … would modify the immutable field '_id'"). `None` when the `_id` stays.
fn changed_id(before: &Document, after: &Document, update: &Document) -> Option<QueryError> {
    let old = id_of(before);
    let replacement = update.keys().next().is_some_and(|k| !k.starts_with('$'));
    let message = match after.get("_id") {
        Some(new) if replacement && equal(new, &old) => return None,
        Some(new) if !replacement && binary_equal(new, &old) => return None,
        Some(new) if !replacement => {
            format!("Updating the path '_id' to _id: {new} would modify the immutable field '_id'")
        }
        _ => "Performing an update on the path '_id' would modify the immutable field '_id'".into(),
    };
    Some(QueryError::Write(66, message))
}

/// Leftovers12 item 4: whether `a` and `b` are one BSON value, type and bytes alike (the
/// server's `BSONElement::binaryEqualValues`): `5000` and `5000.0` are not.
fn binary_equal(a: &Bson, b: &Bson) -> bool {
    let bytes = |value: &Bson| doc! { "": value.clone() }.to_vec().ok();
    bytes(a) == bytes(b)
}

/// House rule 7: a replacement `update` of `document` naming another `_id` is refused as a real
/// server refuses it (ImmutableField 66).
fn immutable_id(document: &Document, update: &Document) -> Result<(), QueryError> {
    let replacement = update.keys().next().is_some_and(|k| !k.starts_with('$'));
    match update.get("_id") {
        Some(id) if replacement && !equal(id, &id_of(document)) => Err(QueryError::Write(
            66,
            format!(
                "After applying the update, the (immutable) field '_id' was found to have been \
                 altered to _id: {id}"
            ),
        )),
        _ => Ok(()),
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
    use bson::{bson, doc};

    const OWNER: CursorOrigin<'static> = CursorOrigin {
        owner: ObjectId::from_bytes([1; 12]),
        lsid: None,
        txn_number: None,
        api: ApiParameters::NONE,
        router: false,
    };

    /// Sets the fields of `set` in the first `db.c` document `filter` matches.
    fn set_one(
        store: &mut Store,
        filter: Document,
        set: Document,
    ) -> Result<UpdateOutcome, QueryError> {
        store.update("db.c", &filter, &doc! { "$set": set }, false, false)
    }

    /// Sets `x` to `x` in the `db.c` documents `filter` matches (`multi`: all of them).
    fn set_x(
        store: &mut Store,
        filter: Document,
        x: i32,
        multi: bool,
        upsert: bool,
    ) -> Result<UpdateOutcome, QueryError> {
        store.update("db.c", &filter, &doc! { "$set": { "x": x } }, multi, upsert)
    }

    fn store_with(n: i32) -> Store {
        let mut store = Store::default();
        let docs = (0..n)
            .map(|i| doc! { "_id": i, "even": i % 2 == 0 })
            .collect();
        assert_eq!(store.insert("db.c", docs, true).unwrap().n, n as usize);
        store
    }

    #[test]
    fn insert_adds_missing_ids() {
        let mut store = Store::default();
        store
            .insert(
                "db.c",
                vec![doc! { "x": 1 }, doc! { "_id": 7, "x": 2 }],
                true,
            )
            .unwrap();
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
        let second = store
            .get_more(OWNER, "db.c", first.cursor_id, 2, false)
            .unwrap();
        assert_eq!(second.documents[0].get_i32("_id").ok(), Some(2));
        assert_eq!(
            second.cursor_id, first.cursor_id,
            "TK-*: a cursor keeps its id"
        );
        let last = store
            .get_more(OWNER, "db.c", second.cursor_id, 2, false)
            .unwrap();
        assert_eq!(last.documents.len(), 1);
        assert_eq!(last.cursor_id, 0);
        assert_eq!(store.open_cursors(), 0);
        assert_eq!(
            store.get_more(OWNER, "db.c", second.cursor_id, 2, false),
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
            store.get_more(OWNER, "db.other", open, 1, false),
            Err(QueryError::CursorNotFound(open))
        );
        assert_eq!(
            store.kill_cursors(OWNER.owner, "db.other", &[open]),
            (vec![], vec![open])
        );
        assert_eq!(
            store.kill_cursors(OWNER.owner, "db.c", &[open, 999]),
            (vec![open], vec![999])
        );
        assert_eq!(store.open_cursors(), 0);
    }

    #[test]
    fn duplicate_ids_are_refused_ordered_stops() {
        let mut store = store_with(2);
        let batch = vec![doc! { "_id": 5 }, doc! { "_id": 1 }, doc! { "_id": 6 }];
        let outcome = store.insert("db.c", batch.clone(), true).unwrap();
        assert_eq!(outcome.n, 1);
        assert_eq!(outcome.duplicates, vec![(1, Bson::Int32(1))]);
        let mut store = store_with(2);
        let outcome = store.insert("db.c", batch, false).unwrap();
        assert_eq!(outcome.n, 2);
        assert_eq!(store.documents("db.c").len(), 4);
    }

    #[test]
    fn update_delete_upsert() {
        let mut store = store_with(4);
        let one = set_x(&mut store, doc! { "even": true }, 1, false, false).unwrap();
        assert_eq!((one.matched, one.modified, one.upserted), (1, 1, None));
        let many = set_x(&mut store, doc! { "even": true }, 1, true, false).unwrap();
        assert_eq!((many.matched, many.modified), (2, 1));
        let up = set_x(&mut store, doc! { "_id": 9 }, 2, false, true).unwrap();
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
        assert_eq!(store.drop_collection("db.d"), Ok(true));
        assert_eq!(store.drop_collection("db.d"), Ok(false));
    }
    /// The `_id` index of `db.c` holds exactly the keys of its documents.
    fn assert_index_in_step(store: &Store) {
        let Some(collection) = store.collections.get("db.c") else {
            return;
        };
        assert_eq!(collection.indexed(), collection.len());
        for document in collection.documents() {
            assert!(collection.contains_id(&id_of(document)), "{document}");
        }
    }

    /// House rule 9 (leftovers10 item 3): the duplicate-`_id` check of an insert, an upsert and
    /// a `$merge` searches the `_id` index: it compares no stored document, however many there
    /// are (it compared every one before), with canonical `_id` equality (an integral
    /// Decimal128 and a double are their int64).
    #[test]
    fn tk2_duplicate_id_check_searches_the_index_not_the_collection() {
        let mut store = store_with(10_000);
        let calls = || crate::query::EQUAL_CALLS.with(core::cell::Cell::get);
        let start = calls();
        let batch = vec![doc! { "_id": 10_000 }, doc! { "_id": decimal("17") }];
        let outcome = store.insert("db.c", batch, false).unwrap();
        assert_eq!(outcome.duplicates, vec![(1, decimal("17"))]);
        assert_eq!(outcome.n, 1);
        store
            .merge("db.c", vec![doc! { "_id": 20_000_i64, "m": 1 }])
            .unwrap();
        assert_eq!(calls() - start, 0, "the insert's and the merge's checks");
        // The upsert's filter compares its `_id` with every document: that is the filter's
        // work (one comparison per document, two for the one whose `_id` matches); its
        // duplicate check adds none.
        let start = calls();
        let upsert = store.update(
            "db.c",
            &doc! { "_id": 5.0, "even": true },
            &doc! { "$set": { "x": 1 } },
            false,
            true,
        );
        assert!(
            matches!(upsert, Err(QueryError::Write(11000, _))),
            "{upsert:?}"
        );
        let filter_work = store.documents("db.c").len() + 1;
        assert!(
            calls() - start <= filter_work,
            "{} comparisons",
            calls() - start
        );
        assert_eq!(store.documents("db.c").len(), 10_002);
        assert_index_in_step(&store);
    }

    /// House rule 9 (leftovers11): a `$merge` into a document that is there finds it through the
    /// `_id` index and the insertion numbers, comparing no stored document, also after removals
    /// moved the documents; the document it finds is the one with that `_id`.
    #[test]
    fn house_rule_9_merge_into_an_existing_id_compares_no_document() {
        let mut store = store_with(10_000);
        store.delete("db.c", &doc! { "_id": 0 }, false).unwrap();
        store.delete("db.c", &doc! { "_id": 10 }, false).unwrap();
        let calls = || crate::query::EQUAL_CALLS.with(core::cell::Cell::get);
        let start = calls();
        store
            .merge(
                "db.c",
                vec![doc! { "_id": 5_000, "m": 1 }, doc! { "_id": 9_999, "m": 2 }],
            )
            .unwrap();
        assert_eq!(calls() - start, 0);
        let documents = store.documents("db.c");
        assert_eq!(documents.len(), 9_998);
        assert_eq!(
            documents[4_998],
            doc! { "_id": 5_000, "even": true, "m": 1 }
        );
        assert_eq!(
            documents[9_997],
            doc! { "_id": 9_999, "even": false, "m": 2 }
        );
        assert_index_in_step(&store);
    }

    /// TK-4 (house rule 7): a stored document's `_id` is its first field, as a real server's
    /// `fixDocumentForInsert` (insert, `$out`, `$merge`) and an upsert's `ensureIdFieldIsFirst`
    /// store it: a generated one at the front, one sent elsewhere moved there, the other fields
    /// in their order.
    #[test]
    fn tk4_a_stored_documents_id_comes_first() {
        let keys = |document: &Document| document.keys().cloned().collect::<Vec<_>>();
        let mut store = Store::default();
        let batch = vec![doc! { "x": 1, "y": 2 }, doc! { "x": 3, "_id": 7, "y": 4 }];
        store.insert("db.c", batch, true).unwrap();
        let upsert = store.update(
            "db.c",
            &doc! { "a": 1 },
            &doc! { "$set": { "b": 2 } },
            false,
            true,
        );
        assert!(upsert.is_ok(), "{upsert:?}");
        store
            .merge("db.c", vec![doc! { "m": 1, "_id": 8 }, doc! { "n": 1 }])
            .unwrap();
        let documents = store.documents("db.c");
        assert_eq!(keys(&documents[0]), ["_id", "x", "y"]);
        assert!(matches!(documents[0].get("_id"), Some(Bson::ObjectId(_))));
        assert_eq!(documents[1], doc! { "_id": 7, "x": 3, "y": 4 });
        assert_eq!(keys(&documents[2]), ["_id", "a", "b"]);
        assert_eq!(documents[3], doc! { "_id": 8, "m": 1 });
        assert_eq!(keys(&documents[4]), ["_id", "n"]);
        store
            .replace_collection("db.o", vec![doc! { "z": 1, "_id": 2 }, doc! { "z": 2 }])
            .unwrap();
        let out = store.documents("db.o");
        assert_eq!(out[0], doc! { "_id": 2, "z": 1 });
        assert_eq!(keys(&out[1]), ["_id", "z"]);
    }

    /// Leftovers12 item 4 (house rule 7; the server's `set_node.cpp`, `modifier_node.cpp`,
    /// `object_replace_executor.cpp`, `bsonelement.cpp` `binaryEqualValues` and
    /// `document_source_merge.cpp`'s unordered `$set` upserts): a `$set` of `_id` to the same
    /// number of another type is ImmutableField 66, a replacement naming it is taken (the new
    /// type stored), and a `$merge` of `{_id: 5000.0}` onto `{_id: 5000}` is 66 for that document
    /// while the batch's others are written.
    #[test]
    fn item4_an_id_of_another_number_type_is_immutable_for_set_and_merge() {
        let mut store = Store::default();
        let seed = vec![doc! { "_id": 5000, "a": 1 }];
        assert_eq!(store.insert("db.c", seed, true).unwrap().n, 1);
        let id = |store: &Store| id_of(&store.collections["db.c"].documents()[0]);
        let changed = set_one(&mut store, doc! { "_id": 5000 }, doc! { "_id": 5000.0 });
        match changed {
            Err(QueryError::Write(66, message)) => assert!(
                message.starts_with("Updating the path '_id' to _id: ")
                    && message.ends_with(" would modify the immutable field '_id'"),
                "{message}"
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(id(&store), Bson::Int32(5000));
        let same = set_one(
            &mut store,
            doc! { "_id": 5000 },
            doc! { "_id": 5000, "a": 2 },
        );
        assert_eq!(same.unwrap().modified, 1, "the same _id is a no-op");
        let merged = store.merge(
            "db.c",
            vec![doc! { "_id": 5000.0, "m": 1 }, doc! { "_id": 7, "m": 2 }],
        );
        assert!(
            matches!(merged, Err(QueryError::Write(66, _))),
            "{merged:?}"
        );
        let documents = store.collections["db.c"].documents();
        assert_eq!(documents[0], doc! { "_id": 5000, "a": 2 }, "left as it was");
        assert_eq!(
            documents[1],
            doc! { "_id": 7, "m": 2 },
            "the batch's other document"
        );
        store
            .merge("db.c", vec![doc! { "_id": 5000, "m": 3 }])
            .unwrap();
        assert_eq!(
            store.collections["db.c"].documents()[0],
            doc! { "_id": 5000, "a": 2, "m": 3 }
        );
        let replaced = store.update(
            "db.c",
            &doc! { "_id": 5000 },
            &doc! { "_id": 5000.0, "r": 1 },
            false,
            false,
        );
        assert_eq!(replaced.unwrap().modified, 1);
        assert_eq!(
            id(&store),
            Bson::Double(5000.0),
            "the replacement's _id is stored"
        );
        assert_index_in_step(&store);
    }

    /// Leftovers10 item 3: the `_id` index follows every change: insert, update (an `_id`
    /// changed by `$set` too), upsert, delete, `$merge`, `$out`, a transaction's abort (its
    /// undo) and commit, and a drop.
    #[test]
    fn tk15_the_id_index_follows_every_change() {
        let mut store = store_with(6);
        assert_index_in_step(&store);
        set_x(&mut store, doc! { "even": true }, 1, true, false).unwrap();
        // House rule 7: an update never changes an `_id` (ImmutableField 66), nor a replacement.
        let changed = set_one(&mut store, doc! { "_id": 1 }, doc! { "_id": 100 });
        assert!(
            matches!(changed, Err(QueryError::Write(66, _))),
            "{changed:?}"
        );
        let replaced = store.update(
            "db.c",
            &doc! { "_id": 1 },
            &doc! { "_id": 100 },
            false,
            false,
        );
        assert!(
            matches!(replaced, Err(QueryError::Write(66, _))),
            "{replaced:?}"
        );
        let same = store.update(
            "db.c",
            &doc! { "_id": 1 },
            &doc! { "_id": 1.0, "r": 1 },
            false,
            false,
        );
        assert_eq!(
            same.unwrap().modified,
            1,
            "a replacement naming the same _id"
        );
        assert_index_in_step(&store);
        assert!(!store.collections["db.c"].contains_id(&Bson::Int64(100)));
        assert!(store.collections["db.c"].contains_id(&Bson::Int32(1)));
        set_x(&mut store, doc! { "_id": 50 }, 2, false, true).unwrap();
        store.delete("db.c", &doc! { "even": false }, true).unwrap();
        assert_index_in_step(&store);
        store
            .merge("db.c", vec![doc! { "_id": 0, "m": 1 }, doc! { "_id": 60 }])
            .unwrap();
        assert_index_in_step(&store);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.c", vec![doc! { "_id": 70 }], true).unwrap();
            s.delete("db.c", &doc! { "_id": 0 }, false).unwrap();
        });
        assert_index_in_step(&store);
        store.end_transaction(S1, 1, false, None, false).unwrap();
        assert_index_in_step(&store);
        assert!(store.collections["db.c"].contains_id(&Bson::Int32(0)));
        assert!(!store.collections["db.c"].contains_id(&Bson::Int32(70)));
        in_transaction(&mut store, S2, 1, true, |s| {
            s.insert("db.c", vec![doc! { "_id": 71 }], true).unwrap();
        });
        store.end_transaction(S2, 1, true, None, false).unwrap();
        assert_index_in_step(&store);
        assert!(store.collections["db.c"].contains_id(&Bson::Double(71.0)));
        store
            .replace_collection("db.c", vec![doc! { "_id": "a" }, doc! { "_id": "b" }])
            .unwrap();
        assert_index_in_step(&store);
        assert_eq!(store.collections["db.c"].len(), 2);
        assert!(store.collections["db.c"].contains_id(&Bson::String("a".into())));
        assert_eq!(store.drop_collection("db.c"), Ok(true));
        let outcome = store
            .insert("db.c", vec![doc! { "_id": "a" }], true)
            .unwrap();
        assert_eq!(outcome.n, 1, "a dropped collection's index went with it");
    }

    const S1: &[u8] = b"session one";
    const S2: &[u8] = b"session two";

    /// Runs `write` as a statement of `session`'s transaction `number` (`start`: its first).
    fn in_transaction<T>(
        store: &mut Store,
        session: &[u8],
        number: i64,
        start: bool,
        write: impl FnOnce(&mut Store) -> T,
    ) -> T {
        store
            .transaction_command(session.to_vec(), number, start, None)
            .unwrap();
        store.begin_statement(Some(session.to_vec()));
        let result = write(store);
        store.end_statement();
        result
    }

    /// TK-15 (leftovers11): a blocked `dropDatabase` is a pending DDL on the whole database: a
    /// transaction holding none of its collections cannot lock any (24); the one it waits for,
    /// which holds a collection of it, can lock another of the same database; once released,
    /// nothing is refused; a namespace of another database never is.
    #[test]
    fn tk15_a_pending_drop_database_holds_back_transactions_on_the_database() {
        let mut store = store_with(2);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.find(OWNER, "db.c", &doc! {}, None, 10)
        })
        .unwrap();
        let (dropped, blocked) = outside(&mut store, |s| s.drop_database("db"));
        assert_eq!(dropped, Err(QueryError::Blocked(S1.to_vec())));
        assert_eq!(blocked, Some(S1.to_vec()));
        let (target, mode) = store.take_blocked_ddl().expect("the blocked DDL");
        assert_eq!(target, DdlTarget::Database("db".into()));
        assert_eq!(mode, LockMode::Exclusive);
        let number = store.hold_ddl(target, mode, S1.to_vec());
        let refused = in_transaction(&mut store, S2, 1, true, |s| s.lock_timeout("db.other"));
        assert_eq!(refused.map(|(code, _)| code), Some(24));
        let other_db = in_transaction(&mut store, S2, 2, true, |s| s.lock_timeout("other.c"));
        assert_eq!(other_db, None);
        let holder = in_transaction(&mut store, S1, 1, false, |s| s.lock_timeout("db.other"));
        assert_eq!(
            holder, None,
            "the transaction the drop waits for holds the database"
        );
        assert_eq!(outside(&mut store, |s| s.lock_timeout("db.c")).0, None);
        store.release_ddl(number);
        let released = in_transaction(&mut store, S2, 2, false, |s| s.lock_timeout("db.c"));
        assert_eq!(released, None);
    }

    /// Leftovers12 item 5, review16 finding 1 (TK-15, house rule 7; the server's
    /// `lock_manager.cpp`: a lock's waiting requests are granted from the front of its queue,
    /// compatible ones together, stopping at the first that conflicts): commands queue behind a
    /// pending DDL command in arrival order, even once the transaction it waits for has ended: a
    /// command on its collection (queued too, for the intent lock), and a `dropDatabase` of its
    /// database (queued after it, for the exclusive lock). Once the first DDL is released, the
    /// command queued before the `dropDatabase` runs, the `dropDatabase` waits for it, and a
    /// command arriving after the `dropDatabase` waits behind it.
    #[test]
    fn item5_commands_queue_behind_a_pending_ddl_in_order() {
        let mut store = store_with(2);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.find(OWNER, "db.c", &doc! {}, None, 10)
        })
        .unwrap();
        let (dropped, _) = outside(&mut store, |s| s.drop_collection("db.c"));
        assert_eq!(dropped, Err(QueryError::Blocked(S1.to_vec())));
        let (target, mode) = store.take_blocked_ddl().expect("the blocked drop");
        assert_eq!(mode, LockMode::Exclusive);
        let first = store.hold_ddl(target, mode, S1.to_vec());
        store.end_transaction(S1, 1, false, None, false).unwrap();
        let collection = DdlTarget::Collection("db.c".into());
        let (queued, blocked) = outside(&mut store, |s| s.ddl_queue(&collection, false));
        assert_eq!(
            queued,
            Err(QueryError::Blocked(S1.to_vec())),
            "after the transaction"
        );
        assert_eq!(blocked, Some(S1.to_vec()));
        let (target, mode) = store
            .take_blocked_ddl()
            .expect("queued for the intent lock");
        assert_eq!((&target, mode), (&collection, LockMode::Intent));
        let command = store.hold_ddl(target, mode, S1.to_vec());
        let (database, _) = outside(&mut store, |s| s.drop_database("db"));
        assert_eq!(database, Err(QueryError::Blocked(S1.to_vec())));
        let (target, mode) = store.take_blocked_ddl().expect("a pending DDL command too");
        assert_eq!(target, DdlTarget::Database("db".into()));
        let second = store.hold_ddl(target, mode, S1.to_vec());
        let (turn, _) = outside(&mut store, |s| {
            s.set_running_ddl(Some(first));
            let turn = s.drop_collection("db.c");
            s.set_running_ddl(None);
            turn
        });
        assert_eq!(turn, Ok(true), "the first one's turn");
        store.release_ddl(first);
        let turn = |store: &mut Store, number: u64, run: &dyn Fn(&mut Store) -> bool| {
            outside(store, |s| {
                s.set_running_ddl(Some(number));
                let ran = run(s);
                s.set_running_ddl(None);
                ran
            })
            .0
        };
        let drop_database = |s: &mut Store| s.drop_database("db").is_ok();
        assert!(
            !turn(&mut store, second, &drop_database),
            "the dropDatabase waits for the command queued before it"
        );
        let (later, _) = outside(&mut store, |s| s.ddl_queue(&collection, false));
        assert_eq!(
            later,
            Err(QueryError::Blocked(S1.to_vec())),
            "a command arriving after the dropDatabase waits behind it"
        );
        store.take_blocked_ddl();
        let queue = |s: &mut Store| s.ddl_queue(&collection, false).is_ok();
        assert!(
            turn(&mut store, command, &queue),
            "the command queued before the dropDatabase runs"
        );
        store.release_ddl(command);
        assert!(
            turn(&mut store, second, &drop_database),
            "then the dropDatabase"
        );
        store.release_ddl(second);
        assert_eq!(
            outside(&mut store, |s| s.ddl_queue(&collection, false)).0,
            Ok(())
        );
    }

    /// Runs `write` as a command outside any transaction; with the session it has to wait for.
    fn outside<T>(store: &mut Store, write: impl FnOnce(&mut Store) -> T) -> (T, Option<Vec<u8>>) {
        store.begin_statement(None);
        let result = write(store);
        store.end_statement();
        (result, store.take_blocked())
    }

    /// A `$out` of `{_id: 9}` into `ns` outside any transaction (TK-15): its result, and the
    /// sessions it waits for.
    fn out_into(store: &mut Store, ns: &str) -> (Result<(), QueryError>, Option<Vec<u8>>) {
        outside(store, |s| s.replace_collection(ns, vec![doc! { "_id": 9 }]))
    }

    /// TK-15: S1 ends (commits when `commit`, else aborts); then a `$out` into `db.c` runs.
    fn out_runs_once_s1_ends(store: &mut Store, commit: bool) {
        assert_eq!(store.end_transaction(S1, 1, commit, None, false), Ok(()));
        let (out, blocked) = out_into(store, "db.c");
        let end = if commit { "commit" } else { "abort" };
        assert_eq!((out, blocked), (Ok(()), None), "after the {end}");
        assert_eq!(ids(store), [9]);
    }

    fn ids(store: &Store) -> Vec<i32> {
        store
            .visible("db.c")
            .iter()
            .map(|d| d.get_i32("_id").unwrap())
            .collect()
    }

    /// TK-15 (review6 finding 3): an abort undoes only its own transaction's changes: a write
    /// acknowledged outside the transaction meanwhile survives (the review's scenario: the
    /// transaction's failed statement aborts it).
    #[test]
    fn tk15_an_abort_undoes_only_its_own_changes() {
        let mut store = store_with(2);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true).unwrap();
            set_x(s, doc! { "_id": 0 }, 1, false, false).unwrap();
            s.delete("db.c", &doc! { "_id": 1 }, false).unwrap();
        });
        assert_eq!(
            store
                .insert("db.c", vec![doc! { "_id": 20 }], true)
                .unwrap()
                .n,
            1
        );
        let duplicate = in_transaction(&mut store, S1, 1, false, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true).unwrap()
        });
        assert_eq!(duplicate.duplicates.len(), 1);
        store.abort_failed_statement(S1, 1);
        assert_eq!(ids(&store), [0, 1, 20]);
        assert!(!store.documents("db.c")[0].contains_key("x"));
    }

    /// TK-15 (review6 finding 3, review7 finding 1): a transaction's writes are invisible to
    /// others until its commit; another transaction's write to a document it changed is a
    /// WriteConflict (112), a write outside any transaction has to wait (`Blocked`), and both
    /// change nothing; after the commit both are possible.
    #[test]
    fn tk15_isolation_and_write_conflicts() {
        let mut store = store_with(2);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true).unwrap();
            s.delete("db.c", &doc! { "_id": 0 }, false).unwrap();
        });
        assert_eq!(ids(&store), [0, 1], "others see the committed data");
        let own = in_transaction(&mut store, S1, 1, false, |s| {
            s.matching("db.c", &doc! {}).unwrap().len()
        });
        assert_eq!(own, 2, "its own writes: 1 and 10");
        assert_eq!(
            store.insert("db.c", vec![doc! { "_id": 10 }], true),
            Err(QueryError::Blocked(S1.to_vec()))
        );
        let conflict = in_transaction(&mut store, S2, 1, true, |s| {
            set_x(s, doc! { "_id": 0 }, 1, false, true)
        });
        assert_eq!(conflict, Err(QueryError::WriteConflict));
        assert_eq!(
            outside(&mut store, |s| s.delete("db.c", &doc! {}, true)),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        assert_eq!(ids(&store), [0, 1], "the waiting delete was undone");
        assert_eq!(store.end_transaction(S1, 1, true, None, false), Ok(()));
        assert_eq!(ids(&store), [1, 10]);
        assert_eq!(
            store
                .delete("db.c", &doc! { "_id": 10 }, false)
                .unwrap()
                .len(),
            1
        );
    }
    /// TK-15 (`isolation.json` "two transactions"): a transaction reads the data as of its
    /// start: another transaction's commit after that stays invisible to it, and its write to a
    /// document that commit changed is a WriteConflict; a transaction started after the commit
    /// sees it.
    #[test]
    fn tk15_snapshot_reads_and_conflicts_with_later_commits() {
        let mut store = store_with(1);
        in_transaction(&mut store, S1, 1, true, |s| {
            set_x(s, doc! { "_id": 0 }, 1, false, false).unwrap();
        });
        let seen = in_transaction(&mut store, S2, 1, true, |s| {
            s.matching("db.c", &doc! { "x": 1 })
        });
        assert_eq!(seen.unwrap().len(), 0);
        assert_eq!(store.end_transaction(S1, 1, true, None, false), Ok(()));
        let after = in_transaction(&mut store, S2, 1, false, |s| {
            (
                s.matching("db.c", &doc! { "x": 1 }).unwrap().len(),
                s.delete("db.c", &doc! { "_id": 0 }, false),
            )
        });
        assert_eq!(after, (0, Err(QueryError::WriteConflict)));
        let fresh = in_transaction(&mut store, S1, 2, true, |s| {
            s.matching("db.c", &doc! { "x": 1 }).unwrap().len()
        });
        assert_eq!(fresh, 1);
        assert_eq!(store.matching("db.c", &doc! { "x": 1 }).unwrap().len(), 1);
    }
    /// TK-15 (review7 finding 1): a transaction's write matches its filter against its snapshot:
    /// a document another transaction in progress deleted, or one a commit after its start
    /// changed, is still there for it, and writing it is a WriteConflict (112), not `n: 0`.
    #[test]
    fn tk15_review7_f1_a_transaction_write_matches_its_snapshot() {
        let mut store = store_with(3);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.delete("db.c", &doc! { "_id": 1 }, false).unwrap();
        });
        let write = in_transaction(&mut store, S2, 1, true, |s| {
            (
                s.matching("db.c", &doc! { "_id": 1 }).unwrap().len(),
                set_one(s, doc! { "_id": 1 }, doc! { "x": 1 }),
            )
        });
        assert_eq!(write, (1, Err(QueryError::WriteConflict)));
        assert_eq!(store.end_transaction(S1, 1, true, None, false), Ok(()));
        // Transaction 2 of S2 starts, then S1's transaction 2 commits `even: false` on 2.
        in_transaction(&mut store, S2, 2, true, |_| ());
        in_transaction(&mut store, S1, 2, true, |s| {
            set_one(s, doc! { "_id": 2 }, doc! { "even": false }).unwrap();
        });
        assert_eq!(store.end_transaction(S1, 2, true, None, false), Ok(()));
        let old_value = in_transaction(&mut store, S2, 2, false, |s| {
            s.delete("db.c", &doc! { "_id": 2, "even": true }, false)
        });
        assert_eq!(old_value, Err(QueryError::WriteConflict));
    }

    /// Review8 finding 7 (TK-15): `_id` equality and the change index compare int64s exactly
    /// (2^53 and 2^53 + 1 are two ids, a real server takes both) and take every NaN as one id.
    #[test]
    fn review8_f7_int64_ids_above_2_pow_53_are_distinct_and_nans_one() {
        let big = 9_007_199_254_740_992_i64;
        let mut store = Store::default();
        let (insert, _) = outside(&mut store, |s| {
            s.insert(
                "db.c",
                vec![doc! { "_id": big }, doc! { "_id": big + 1 }],
                true,
            )
        });
        assert_eq!(insert.unwrap().n, 2, "distinct longs are distinct ids");
        let (insert, _) = outside(&mut store, |s| {
            s.insert(
                "db.c",
                vec![doc! { "_id": f64::NAN }, doc! { "_id": -f64::NAN }],
                false,
            )
        });
        assert_eq!(insert.unwrap().n, 1, "NaN ids are duplicates");
        // The change index: a transaction's change to `big` does not block `big + 1`.
        in_transaction(&mut store, S1, 1, true, |s| {
            set_one(s, doc! { "_id": big }, doc! { "x": 1 }).unwrap();
        });
        let (update, blocked) = outside(&mut store, |s| {
            set_one(s, doc! { "_id": big + 1 }, doc! { "x": 2 })
        });
        assert_eq!((update.map(|u| u.matched), blocked), (Ok(1), None));
        let (update, blocked) = outside(&mut store, |s| {
            set_one(s, doc! { "_id": big as f64 }, doc! { "x": 2 })
        });
        assert_eq!(
            update.map(|u| u.matched),
            Err(QueryError::Blocked(S1.to_vec()))
        );
        assert_eq!(blocked, Some(S1.to_vec()));
        assert!(equal(&Bson::Int64(big), &Bson::Double(big as f64)));
        assert!(!equal(&Bson::Int64(big + 1), &Bson::Double(big as f64)));
        assert!(!equal(
            &Bson::Int64(i64::MAX),
            &Bson::Double(i64::MAX as f64)
        ));
        assert!(equal(&Bson::Double(f64::NAN), &Bson::Double(f64::NAN)));
        assert_eq!(id_key(&Bson::Double(-0.0)), id_key(&Bson::Int32(0)));
    }

    /// A Decimal128 value from its text.
    fn decimal(text: &str) -> Bson {
        Bson::Decimal128(text.parse().expect("a decimal"))
    }

    /// Review10 finding 9 (TK-15): a Decimal128 is the int64 it equals when it is an integer
    /// that fits one, in any of its encodings; any other decimal is no integer.
    #[test]
    fn tk15_review10_f9_integral_decimals_are_their_integers() {
        let integer = |text: &str| match decimal(text) {
            Bson::Decimal128(v) => crate::query::decimal_integer(&v),
            _ => unreachable!(),
        };
        for (text, expected) in [
            ("1", Some(1)),
            ("1.00", Some(1)),
            ("1E+2", Some(100)),
            ("-2E+1", Some(-20)),
            ("-0", Some(0)),
            ("0E-10", Some(0)),
            ("-9223372036854775808", Some(i64::MIN)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("1E+6000", None),
            ("1.5", None),
            ("1E-6100", None),
            ("Infinity", None),
            ("NaN", None),
        ] {
            assert_eq!(integer(text), expected, "{text}");
        }
    }

    /// Review10 finding 9, TK-2: an `_id` holding a Decimal128 that is no int64 integer (at
    /// any depth) is refused loudly, never stored as an id that equality may get wrong.
    #[test]
    fn tk2_review10_f9_a_fractional_decimal_id_is_refused() {
        let mut store = Store::default();
        for id in [decimal("1.5"), bson!({ "a": [decimal("0.1")] })] {
            let (insert, _) = outside(&mut store, |s| {
                s.insert("db.d", vec![doc! { "_id": id.clone() }], true)
            });
            assert!(
                matches!(insert, Err(QueryError::UnsupportedFilter(_))),
                "{id}: {insert:?}"
            );
        }
    }

    /// Review9 finding 9 (TK-15, house rule 7): `_id`s equal with canonical numbers at every
    /// depth are one id, as on a real server: `{a: 1}` then `{a: 1.0}` or `[1, {b: 2}]` then
    /// `[1.0, {b: NumberLong(2)}]` is a duplicate (11000), while keys in another order are another
    /// id; the change index gives equal ids one key, so an outside write to `{a: NumberLong(1)}`
    /// waits for the transaction that changed `{a: 1}`, and one to `{a: 2}` does not.
    #[test]
    fn tk15_review9_f9_ids_are_equal_with_canonical_numbers_at_every_depth() {
        let mut store = Store::default();
        let pairs = [
            (bson!({ "a": 1 }), bson!({ "a": 1.0 })),
            (bson!({ "a": 1 }), bson!({ "a": 1_i64 })),
            (bson!([1, { "b": 2 }]), bson!([1.0, { "b": 2_i64 }])),
            (bson!({ "n": f64::NAN }), bson!({ "n": -f64::NAN })),
            // Review10 finding 9: an integral Decimal128 is that integer.
            (bson!({ "a": 1 }), bson!({ "a": decimal("1") })),
            (bson!([decimal("1.00")]), bson!([1.0])),
            (decimal("-2E+1"), bson!(-20_i64)),
        ];
        for (index, (first, second)) in pairs.iter().enumerate() {
            let ns = format!("db.dup{index}");
            assert!(equal(first, second), "{first} == {second}");
            assert_eq!(id_key(first), id_key(second), "{first}, {second}: one key");
            let (insert, _) = outside(&mut store, |s| {
                s.insert(&ns, vec![doc! { "_id": first.clone() }], true)
            });
            assert_eq!(insert.unwrap().n, 1);
            let (insert, _) = outside(&mut store, |s| {
                s.insert(&ns, vec![doc! { "_id": second.clone() }], true)
            });
            let insert = insert.unwrap();
            assert_eq!(
                (insert.n, insert.duplicates.len()),
                (0, 1),
                "{second}: E11000"
            );
        }
        let distinct = [
            (bson!({ "a": 1, "b": 2 }), bson!({ "b": 2, "a": 1 })),
            (bson!({ "a": 1 }), bson!({ "a": 1.5 })),
            (bson!([1, 2]), bson!([1, 2, 3])),
            (bson!({ "a": [1] }), bson!({ "a": 1 })),
        ];
        for (first, second) in &distinct {
            assert!(!equal(first, second), "{first} != {second}");
            assert_ne!(id_key(first), id_key(second), "{first}, {second}: two keys");
        }
        outside(&mut store, |s| {
            s.insert(
                "db.c",
                vec![doc! { "_id": { "a": 1 } }, doc! { "_id": { "a": 2 } }],
                true,
            )
        })
        .0
        .unwrap();
        in_transaction(&mut store, S1, 1, true, |s| {
            set_one(s, doc! { "_id": { "a": 1 } }, doc! { "x": 1 }).unwrap();
        });
        let (update, blocked) = outside(&mut store, |s| {
            set_one(s, doc! { "_id": { "a": 2.0 } }, doc! { "x": 2 })
        });
        assert_eq!((update.map(|u| u.matched), blocked), (Ok(1), None));
        let (update, blocked) = outside(&mut store, |s| {
            set_one(s, doc! { "_id": { "a": 1_i64 } }, doc! { "x": 2 })
        });
        assert_eq!(
            update.map(|u| u.matched),
            Err(QueryError::Blocked(S1.to_vec()))
        );
        assert_eq!(blocked, Some(S1.to_vec()));
    }

    /// TK-15 (review7 finding 1): a write outside any transaction that touches a document a
    /// transaction in progress changed (or inserted) is undone whole and waits for it; a write
    /// that touches nothing it changed goes through, and after its commit the write runs on the
    /// committed data.
    #[test]
    fn tk15_review7_f1_a_write_outside_a_transaction_waits() {
        let mut store = store_with(2);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true).unwrap();
            set_one(s, doc! { "_id": 1 }, doc! { "x": 1 }).unwrap();
        });
        let (update, blocked) = outside(&mut store, |s| {
            s.update("db.c", &doc! {}, &doc! { "$set": { "y": 1 } }, true, false)
        });
        assert_eq!(update, Err(QueryError::Blocked(S1.to_vec())));
        assert_eq!(blocked, Some(S1.to_vec()));
        assert!(
            store.collections["db.c"]
                .documents()
                .iter()
                .all(|d| !d.contains_key("y")),
            "document 0 was put back"
        );
        let (insert, blocked) = outside(&mut store, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true)
        });
        assert_eq!(
            (insert, blocked),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        let (free, blocked) = outside(&mut store, |s| {
            set_one(s, doc! { "_id": 0 }, doc! { "y": 1 })
        });
        assert_eq!((free.unwrap().modified, blocked), (1, None));
        assert_eq!(store.end_transaction(S1, 1, true, None, false), Ok(()));
        let (insert, blocked) = outside(&mut store, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true)
        });
        assert_eq!((insert.unwrap().duplicates.len(), blocked), (1, None));
    }

    /// TK-15 (seventh session's note): `$out` and `$merge` outside any transaction wait like
    /// other writes: `$out` for a transaction in progress that changed a document of its target
    /// or created it (a real server's rename into the target waits for the transaction's
    /// collection lock), `$merge` for one that changed a document it writes; both write nothing
    /// before. Other targets and documents go through; after the commit both run.
    #[test]
    fn tk15_out_and_merge_outside_a_transaction_wait_for_one_holding_their_target() {
        let mut store = store_with(3);
        in_transaction(&mut store, S1, 1, true, |s| {
            set_one(s, doc! { "_id": 1 }, doc! { "x": 1 }).unwrap();
            s.insert("db.made", vec![doc! { "_id": 7 }], true).unwrap();
        });
        let (out, blocked) = out_into(&mut store, "db.c");
        assert_eq!(
            (out, blocked),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        assert_eq!(ids(&store), [0, 1, 2], "nothing written");
        let (out, blocked) = out_into(&mut store, "db.made");
        assert_eq!(blocked, Some(S1.to_vec()), "{out:?}: created by S1");
        let (merge, blocked) = outside(&mut store, |s| {
            s.merge(
                "db.c",
                vec![doc! { "_id": 2, "y": 1 }, doc! { "_id": 1, "y": 1 }],
            )
        });
        assert_eq!(
            (merge, blocked),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        assert!(
            store.collections["db.c"]
                .documents()
                .iter()
                .all(|d| !d.contains_key("y")),
            "nothing merged"
        );
        let (merge, blocked) = outside(&mut store, |s| {
            s.merge("db.c", vec![doc! { "_id": 2, "y": 1 }, doc! { "_id": 5 }])
        });
        assert_eq!(
            (merge, blocked),
            (Ok(()), None),
            "documents S1 did not change"
        );
        let (out, blocked) = out_into(&mut store, "db.other");
        assert_eq!((out, blocked), (Ok(()), None), "a target S1 does not hold");
        out_runs_once_s1_ends(&mut store, true);
    }

    /// TK-15 (leftovers10 item 4): a transaction holds the lock of every collection it accessed
    /// until it ends, so a `$out` into a collection a transaction in progress only read (or
    /// updated without a match) waits for it, as on a real server (its rename needs the target's
    /// exclusive lock); a read of another collection holds nothing of this one.
    #[test]
    fn tk15_out_waits_for_a_transaction_that_only_read_its_target() {
        let mut store = store_with(3);
        in_transaction(&mut store, S1, 1, true, |s| {
            assert_eq!(s.matching("db.c", &doc! { "_id": 1 }).unwrap().len(), 1);
        });
        in_transaction(&mut store, S2, 1, true, |s| {
            s.matching("db.other", &doc! {}).unwrap();
            let none = s.update(
                "db.d",
                &doc! { "_id": 5 },
                &doc! { "$set": { "x": 1 } },
                false,
                false,
            );
            assert_eq!(none.unwrap().matched, 0);
        });
        let (out, blocked) = out_into(&mut store, "db.c");
        assert_eq!(
            (out, blocked),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        assert_eq!(ids(&store), [0, 1, 2], "nothing written");
        let (out, blocked) = out_into(&mut store, "db.d");
        assert_eq!(
            blocked,
            Some(S2.to_vec()),
            "{out:?}: an update without a match"
        );
        let (out, blocked) = out_into(&mut store, "db.e");
        assert_eq!((out, blocked), (Ok(()), None), "a target nobody accessed");
        out_runs_once_s1_ends(&mut store, false);
    }

    /// TK-15 (review12 finding 1): `drop` and `dropDatabase` outside any transaction wait for a
    /// transaction in progress that holds the collection (or, for `dropDatabase`, any collection
    /// of the database), as `$out` does, with nothing dropped before; after that transaction
    /// aborts the drop runs and the collection stays gone (the abort no longer re-creates it
    /// from the transaction's before-images).
    #[test]
    fn tk15_drop_waits_for_a_transaction_that_wrote_the_collection() {
        let mut store = store_with(3);
        store
            .insert("other.c", vec![doc! { "_id": 1 }], true)
            .unwrap();
        in_transaction(&mut store, S1, 1, true, |s| {
            assert_eq!(
                set_one(s, doc! { "_id": 1 }, doc! { "x": 1 })
                    .unwrap()
                    .modified,
                1
            );
        });
        let (dropped, blocked) = outside(&mut store, |s| s.drop_collection("db.c"));
        assert_eq!(
            (dropped, blocked),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        let (dropped, blocked) = outside(&mut store, |s| s.drop_database("db"));
        assert_eq!(
            (dropped, blocked),
            (Err(QueryError::Blocked(S1.to_vec())), Some(S1.to_vec()))
        );
        assert_eq!(ids(&store), [0, 1, 2], "nothing dropped");
        let (dropped, blocked) = outside(&mut store, |s| s.drop_database("other"));
        assert_eq!(
            (dropped, blocked),
            (Ok(()), None),
            "a database S1 does not hold"
        );
        assert!(!store.collections.contains_key("other.c"));
        assert_eq!(store.end_transaction(S1, 1, false, None, false), Ok(()));
        let (dropped, blocked) = outside(&mut store, |s| s.drop_collection("db.c"));
        assert_eq!((dropped, blocked), (Ok(true), None), "after the abort");
        assert!(!store.collections.contains_key("db.c"), "it stays gone");
        assert!(ids(&store).is_empty());
    }

    /// TK-15 (review12 finding 1): a collection a transaction in progress created (invisible to
    /// others) is held by it: its `drop` and its database's `dropDatabase` wait; after the
    /// commit the drop runs.
    #[test]
    fn tk15_drop_waits_for_a_transaction_that_created_the_collection() {
        let mut store = Store::default();
        in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.made", vec![doc! { "_id": 7 }], true).unwrap();
        });
        let (dropped, blocked) = outside(&mut store, |s| s.drop_collection("db.made"));
        assert_eq!(blocked, Some(S1.to_vec()), "{dropped:?}");
        let (dropped, blocked) = outside(&mut store, |s| s.drop_database("db"));
        assert_eq!(blocked, Some(S1.to_vec()), "{dropped:?}");
        assert_eq!(store.end_transaction(S1, 1, true, None, false), Ok(()));
        assert_eq!(store.collection_names("db"), ["made"]);
        let (dropped, blocked) = outside(&mut store, |s| s.drop_database("db"));
        assert_eq!((dropped, blocked), (Ok(()), None), "after the commit");
        assert!(store.collection_names("db").is_empty());
    }

    /// TK-2, TK-15 (review12 finding 2): `$out` admits its documents as an insert does: two with
    /// one `_id` are DuplicateKey 11000 and the target keeps its documents (a real `$out` fills
    /// a new collection with an `_id` index and renames it over the target only on success); an
    /// `_id` holding a fractional Decimal128 is refused as an insert refuses it.
    #[test]
    fn tk15_out_with_duplicate_ids_is_duplicate_key_and_leaves_the_target() {
        let mut store = store_with(3);
        let out = store.replace_collection(
            "db.c",
            vec![
                doc! { "_id": 8 },
                doc! { "_id": 1, "a": 1 },
                doc! { "_id": 1.0 },
            ],
        );
        assert_eq!(
            out,
            Err(QueryError::Write(
                11000,
                duplicate_key_message("db.c", &Bson::Double(1.0))
            ))
        );
        assert_eq!(ids(&store), [0, 1, 2], "the target is unchanged");
        assert_index_in_step(&store);
        let out = store.replace_collection("db.c", vec![doc! { "_id": decimal("1.5") }]);
        assert!(
            matches!(out, Err(QueryError::UnsupportedFilter(_))),
            "{out:?}"
        );
        assert_eq!(ids(&store), [0, 1, 2]);
        assert!(!store.collections.contains_key("db.new"));
        let out = store.replace_collection("db.new", vec![doc! { "_id": 1 }, doc! { "_id": 1 }]);
        assert!(matches!(out, Err(QueryError::Write(11000, _))), "{out:?}");
        assert!(
            !store.collections.contains_key("db.new"),
            "a failed $out creates nothing"
        );
    }

    /// TK-2 (review12 finding 2): a document `$out` or `$merge` stores without an `_id` gets an
    /// ObjectId one, as an insert's does (`$project: {_id: 0}`, `$count`); the index holds them.
    #[test]
    fn tk2_out_and_merge_give_a_document_without_an_id_an_object_id() {
        let mut store = store_with(0);
        store
            .replace_collection("db.c", vec![doc! { "a": 1 }, doc! { "a": 2 }])
            .unwrap();
        store.merge("db.c", vec![doc! { "a": 3 }]).unwrap();
        let documents = store.collections["db.c"].documents();
        assert_eq!(documents.len(), 3);
        assert!(
            documents
                .iter()
                .all(|d| matches!(d.get("_id"), Some(Bson::ObjectId(_)))),
            "{documents:?}"
        );
        assert_index_in_step(&store);
    }

    /// TK-6, TK-15: a retryable write with a higher `txnNumber` aborts its session's transaction
    /// in progress (its changes undone), so it does not wait for its own session.
    #[test]
    fn tk15_a_newer_retryable_write_aborts_its_sessions_transaction() {
        let mut store = store_with(1);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.delete("db.c", &doc! { "_id": 0 }, false).unwrap();
        });
        let key = WriteKey {
            session: S1.to_vec(),
            txn_number: 2,
            stmt_id: 0,
        };
        assert!(store.begin_write(&key));
        let (update, blocked) = outside(&mut store, |s| {
            s.update(
                "db.c",
                &doc! { "_id": 0 },
                &doc! { "$set": { "x": 1 } },
                false,
                false,
            )
        });
        assert_eq!((update.map(|o| o.modified), blocked), (Ok(1), None));
        assert_eq!(
            store
                .transaction_command(S1.to_vec(), 1, false, None)
                .map_err(|e| e.0),
            Err(251)
        );
    }

    /// TK-15 (review7 gap b): a write outside any transaction after a transaction started is
    /// invisible to its snapshot reads, and the transaction's write to that document is a
    /// WriteConflict, as after another transaction's commit.
    #[test]
    fn tk15_review7_gap_b_outside_writes_after_the_snapshot_are_invisible() {
        let mut store = store_with(1);
        in_transaction(&mut store, S1, 1, true, |_| ());
        outside(&mut store, |s| {
            s.insert("db.c", vec![doc! { "_id": 5 }], true).unwrap();
            set_one(s, doc! { "_id": 0 }, doc! { "x": 1 }).unwrap();
        });
        let seen = in_transaction(&mut store, S1, 1, false, |s| {
            (
                s.matching("db.c", &doc! {}).unwrap(),
                set_one(s, doc! { "_id": 0 }, doc! { "z": 1 }),
            )
        });
        assert_eq!(
            seen,
            (
                vec![doc! { "_id": 0, "even": true }],
                Err(QueryError::WriteConflict)
            )
        );
        assert_eq!(ids(&store), [0, 5], "outside the transaction: committed");
        in_transaction(&mut store, S2, 1, true, |_| ());
        assert_eq!(
            in_transaction(&mut store, S2, 1, false, |s| s
                .matching("db.c", &doc! {})
                .unwrap()
                .len()),
            2,
            "a transaction started after the write sees it"
        );
    }

    /// TK-15 (review7 gap a): a collection a transaction's write created is dropped when the
    /// transaction aborts; one it wrote to that existed before stays.
    #[test]
    fn tk15_review7_gap_a_an_aborted_transaction_drops_the_collections_it_created() {
        let mut store = store_with(1);
        in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.new", vec![doc! { "_id": 1 }], true).unwrap();
            assert!(s.create("db.made"));
            s.insert("db.c", vec![doc! { "_id": 1 }], true).unwrap();
        });
        assert_eq!(store.end_transaction(S1, 1, false, None, false), Ok(()));
        assert_eq!(store.collection_names("db"), vec!["c"]);
        assert_eq!(ids(&store), [0]);
    }

    /// TK-15, house rule 9 (review7 finding 7): a command looks only at the changes of the
    /// documents it touches: another transaction's 1,000 changes in `db.a` cost nothing to a
    /// read of `db.b`, and one look to a write of one document of `db.a`.
    #[test]
    fn tk15_review7_f7_cost_does_not_follow_unrelated_transactions() {
        let mut store = Store::default();
        in_transaction(&mut store, S1, 1, true, |s| {
            let docs = (0..1_000).map(|i| doc! { "_id": i }).collect();
            s.insert("db.a", docs, true).unwrap();
        });
        store.insert("db.b", vec![doc! { "_id": 1 }], true).unwrap();
        store.looked_at.set(0);
        let (read, _) = outside(&mut store, |s| s.matching("db.b", &doc! {}).unwrap().len());
        assert_eq!((read, store.looked_at.get()), (1, 0));
        let write = in_transaction(&mut store, S2, 1, true, |s| {
            s.insert("db.a", vec![doc! { "_id": 5 }], true)
        });
        assert_eq!(write, Err(QueryError::WriteConflict));
        assert_eq!(store.looked_at.get(), 1);
    }

    /// TK-15 (`isolation.json` "one transaction"): a transaction reads from its snapshot: writes
    /// outside any transaction made after it started (insert, update, delete) stay invisible to
    /// it, and its own write to a document one of them changed is a WriteConflict (112); everyone
    /// else sees them at once, and so does a transaction started after them.
    #[test]
    fn tk15_snapshot_reads_hide_later_writes_outside_transactions() {
        let mut store = store_with(3);
        let snapshot = in_transaction(&mut store, S1, 1, true, |s| {
            s.matching("db.c", &doc! {}).unwrap()
        });
        outside(&mut store, |s| {
            s.insert("db.c", vec![doc! { "_id": 10 }], true).unwrap();
            set_x(s, doc! { "_id": 0 }, 5, false, false).unwrap();
            s.delete("db.c", &doc! { "_id": 1 }, false).unwrap();
        });
        assert_eq!(ids(&store), [0, 2, 10], "others see them at once");
        let seen = in_transaction(&mut store, S1, 1, false, |s| {
            s.matching("db.c", &doc! {}).unwrap()
        });
        assert_eq!(seen, snapshot, "the snapshot as it was");
        let conflict = in_transaction(&mut store, S1, 1, false, |s| {
            set_x(s, doc! { "_id": 0 }, 6, false, false)
        });
        assert_eq!(conflict, Err(QueryError::WriteConflict));
        let untouched = in_transaction(&mut store, S1, 1, false, |s| {
            set_x(s, doc! { "_id": 2 }, 7, false, false)
        });
        assert_eq!(
            untouched.map(|o| o.modified),
            Ok(1),
            "no conflict elsewhere"
        );
        let later = in_transaction(&mut store, S2, 1, true, |s| {
            s.matching("db.c", &doc! {}).unwrap().len()
        });
        assert_eq!(later, 3, "a later snapshot sees them: 0, 2 and 10");
        assert_eq!(store.end_transaction(S1, 1, true, None, false), Ok(()));
        assert_eq!(store.end_transaction(S2, 1, true, None, false), Ok(()));
        assert!(
            store.history.is_empty(),
            "nothing kept once no transaction is open"
        );
    }

    /// SE-14, TX-1 (review6 finding 4): a getMore must come from its cursor's session and
    /// transaction, as on a real server (50736..50741; a router's 50799..50804); a refused
    /// getMore leaves the cursor open.
    #[test]
    fn se14_a_get_more_from_another_session_or_transaction_is_refused() {
        let mut store = store_with(5);
        let s1 = doc! { "id": 1 };
        let s2 = doc! { "id": 2 };
        let origin = |lsid, txn_number| CursorOrigin {
            lsid,
            txn_number,
            ..OWNER
        };
        let plain = store
            .find(origin(Some(&s1), None), "db.c", &doc! {}, None, 1)
            .unwrap();
        let in_transaction = store
            .find(origin(Some(&s1), Some(3)), "db.c", &doc! {}, None, 1)
            .unwrap();
        let no_session = store.find(OWNER, "db.c", &doc! {}, None, 1).unwrap();
        let mut code = |origin, id| match store.get_more(origin, "db.c", id, 1, false) {
            Err(QueryError::CursorMismatch(code, _)) => Some(code),
            Ok(_) => None,
            Err(other) => panic!("{other:?}"),
        };
        assert_eq!(
            code(origin(Some(&s1), None), no_session.cursor_id),
            Some(50736)
        );
        assert_eq!(code(OWNER, plain.cursor_id), Some(50737));
        assert_eq!(code(origin(Some(&s2), None), plain.cursor_id), Some(50738));
        assert_eq!(
            code(origin(Some(&s1), Some(4)), plain.cursor_id),
            Some(50739)
        );
        assert_eq!(
            code(origin(Some(&s1), None), in_transaction.cursor_id),
            Some(50740)
        );
        assert_eq!(
            code(origin(Some(&s1), Some(4)), in_transaction.cursor_id),
            Some(50741)
        );
        let router = CursorOrigin {
            router: true,
            ..OWNER
        };
        assert_eq!(code(router, plain.cursor_id), Some(50800));
        assert_eq!(
            code(origin(Some(&s1), Some(3)), in_transaction.cursor_id),
            None
        );
        assert_eq!(code(origin(Some(&s1), None), plain.cursor_id), None);
        assert_eq!(code(OWNER, no_session.cursor_id), None);
    }

    /// Review36 V3 (house rule 7): a database stays once created, as a mongod's
    /// `DatabaseHolderImpl` keeps it open (`src/mongo/db/catalog/database_holder_impl.cpp`:
    /// only `dropDb` closes it): the abort of the transaction that created it and the drop of
    /// its last collection keep it, `dropDatabase` removes it. A router records a database on a
    /// write that creates no collection.
    #[test]
    fn review36_v3_a_database_stays_until_drop_database() {
        let mut store = Store::default();
        let differ = |s: &mut Store| s.creation_refusal("Db.c", false).map(|(code, _)| code);
        let inserted = in_transaction(&mut store, S1, 1, true, |s| {
            s.insert("db.c", vec![doc! { "_id": 1 }], true)
        });
        assert_eq!(inserted.map(|outcome| outcome.n), Ok(1));
        assert_eq!(store.end_transaction(S1, 1, false, None, false), Ok(()));
        assert!(
            store.collection_names("db").is_empty(),
            "the abort drops it"
        );
        assert_eq!(differ(&mut store), Some(13297));
        assert!(outside(&mut store, |s| s.create("db.d")).0);
        assert_eq!(
            outside(&mut store, |s| s.drop_collection("db.d")).0,
            Ok(true)
        );
        assert_eq!(differ(&mut store), Some(13297));
        assert_eq!(outside(&mut store, |s| s.drop_database("db")).0, Ok(()));
        assert_eq!(differ(&mut store), None);
        assert_eq!(store.creation_refusal("other.c", true), None);
        assert!(store.collection_names("other").is_empty());
        let refused = store.creation_refusal("OTHER.c", false);
        assert_eq!(refused.map(|(code, _)| code), Some(13297));
    }
}
