//! [`Cursor`]: the batches of a cursor-opening command, fetched with `getMore` until the server
//! reports cursor id 0, and closed with `killCursors` when dropped or closed early.
//!
//! The engine follows the cursor: every `getMore` and the `killCursors` name its
//! [`CursorHandle`] ([`CursorUse::GetMore`], [`CursorUse::Close`]), so they go to the server (and,
//! pinned, the connection) that opened it, with its session (SE-14). A `getMore` is never a
//! retryable read (RR-4) but is retried on overload errors (BP-5).

use std::collections::VecDeque;

use bson::{doc, Bson, Document};
use retry_core::engine::{CursorHandle, CursorUse};
use retry_core::error::OperationError;
use retry_core::retry::OperationKind;

use crate::client::{Client, CommandOptions};

/// The documents of a server-side cursor, from [`Client::cursor`]. Dropping it (or
/// [`Cursor::close`]) before it is exhausted sends `killCursors`.
pub struct Cursor<R> {
    client: Client<R>,
    db: String,
    collection: String,
    /// The server's cursor id; 0 once exhausted or closed.
    id: i64,
    /// The engine's name for it, while it is open.
    handle: Option<CursorHandle>,
    /// Documents received and not yet returned.
    buffer: VecDeque<Document>,
    /// The `batchSize` of every `getMore`: the opening command's, when a positive number
    /// (review37 W3: a getMore never carries 0, see [`get_more_batch_size`]).
    batch_size: Option<Bson>,
    /// Whether the server's replies named the cursor's namespace (`cursor.ns`); a `getMore`
    /// needs it (review37 W15).
    namespace_known: bool,
    /// A `getMore` failed: the cursor is closed on the client side (review38 L9).
    failed: bool,
}

impl<R> core::fmt::Debug for Cursor<R> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Cursor")
            .field(
                "namespace",
                &format_args!("{}.{}", self.db, self.collection),
            )
            .field("id", &self.id)
            .field("buffered", &self.buffer.len())
            .field("failed", &self.failed)
            .finish()
    }
}

/// The `cursor` sub-document of a reply: its id, namespace and batch.
struct Batch {
    id: i64,
    /// `ns`: `db.collection`.
    namespace: Option<String>,
    documents: Vec<Document>,
}

impl Batch {
    /// Reads `cursor.{id, ns, firstBatch | nextBatch}`, or says what is missing.
    fn read(reply: &Document, field: &str) -> Result<Batch, OperationError> {
        let malformed = |what: &str| {
            OperationError::usage(format!(
                "the reply has no cursor ({what}): the command does not open a cursor"
            ))
        };
        let Some(Bson::Document(cursor)) = reply.get("cursor") else {
            return Err(malformed("no `cursor` document"));
        };
        let Some(id) = retry_core::reply::cursor_id(reply) else {
            return Err(malformed("no integer `cursor.id`"));
        };
        let Some(Bson::Array(items)) = cursor.get(field) else {
            return Err(malformed(&format!("no `cursor.{field}` array")));
        };
        let documents = items
            .iter()
            .map(|item| match item {
                Bson::Document(d) => Ok(d.clone()),
                other => Err(malformed(&format!(
                    "a {:?} in the batch",
                    other.element_type()
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let namespace = cursor.get_str("ns").ok().map(str::to_owned);
        Ok(Batch {
            id,
            namespace,
            documents,
        })
    }
}

/// Review37 W3 (find/getMore/killCursors spec, `GetMoreCommand.batchSize`: a positive integer,
/// attached only when nonzero): the `batchSize` of the cursor's `getMore`s from the opening
/// command's (`batchSize` of a `find`, `cursor.batchSize` of an `aggregate`): `None` unless it is
/// a positive number. A real server refuses a getMore's `batchSize` of 0 or below (BadValue, 2:
/// mongodb/mongo src/mongo/db/query/getmore_request.cpp, "Batch size for getMore must be
/// positive"); a `batchSize: 0` on the opening command is the usual way to open a cursor with an
/// empty first batch, and its getMores then take the server's default.
fn get_more_batch_size(command: &Document) -> Option<Bson> {
    let given = command.get("batchSize").or_else(|| {
        command
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get("batchSize"))
    })?;
    let positive = match given {
        Bson::Int32(n) => *n > 0,
        Bson::Int64(n) => *n > 0,
        Bson::Double(n) => *n >= 1.0,
        _ => false,
    };
    positive.then(|| given.clone())
}

impl<R> Client<R> {
    /// Runs a cursor-opening command (`find`, `aggregate`, `listCollections`, `listIndexes`, ...)
    /// on `db` and returns its cursor. The kind comes from
    /// [`retry_core::classify::classify`] (an `aggregate` with `$out` is a write); the client's
    /// read or write concern is added as [`Client::command`] adds it. Later batches
    /// use the command's `batchSize` (a `find`'s or the `cursor.batchSize` of an `aggregate`)
    /// when it is positive, else the server's default (review37 W3: a `getMore` never carries
    /// `batchSize: 0`).
    pub async fn cursor(&self, db: &str, command: Document) -> Result<Cursor<R>, OperationError> {
        let (command, kind) = self.with_concerns(command);
        let batch_size = get_more_batch_size(&command);
        let options = CommandOptions {
            cursor: CursorUse::Open,
            ..CommandOptions::default()
        };
        let reply = self.run(db, command, kind, options).await?;
        let first = Batch::read(&reply.document, "firstBatch")?;
        let mut cursor = Cursor {
            client: self.clone(),
            db: db.to_owned(),
            collection: String::new(),
            id: first.id,
            handle: reply.cursor.filter(|_| first.id != 0),
            buffer: first.documents.into(),
            batch_size,
            namespace_known: false,
            failed: false,
        };
        cursor.take_namespace(first.namespace.as_deref());
        Ok(cursor)
    }
}

impl<R> Cursor<R> {
    /// The server's cursor id: 0 once the server has no more documents (or the cursor closed).
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Whether every document was returned and the server has no more.
    pub fn is_exhausted(&self) -> bool {
        self.id == 0 && self.buffer.is_empty()
    }

    /// Whether a `getMore` failed: the cursor is then closed on the client side ([`Cursor::next`]).
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// Review37 W15 (find/getMore spec: the local cursor takes its `id` and `ns` from every
    /// reply): the namespace its `getMore`s and `killCursors` name, from a reply's `cursor.ns`
    /// (`db.collection`). A reply without one keeps the namespace already known.
    fn take_namespace(&mut self, namespace: Option<&str>) {
        if let Some((db, collection)) = namespace.and_then(|ns| ns.split_once('.')) {
            self.db = db.to_owned();
            self.collection = collection.to_owned();
            self.namespace_known = true;
        }
    }

    /// The next document: from the current batch, else from a `getMore` (which may return an
    /// empty batch; it then asks again). `Ok(None)` once the server reported cursor id 0 and every
    /// document was returned.
    ///
    /// Review38 L9: after an error the cursor is closed on the client side: this and
    /// [`Cursor::next_batch`] return no more documents and send no other `getMore` (a cursor
    /// never retries its `getMore` itself, RR-4: the server may have moved or killed the cursor,
    /// and in load-balanced mode its pinned connection may be gone, LB-11); see
    /// [`Cursor::has_failed`]. The server side is killed when the cursor is dropped or closed,
    /// unless its connection failed (LB-11).
    pub async fn next(&mut self) -> Result<Option<Document>, OperationError> {
        loop {
            if let Some(document) = self.buffer.pop_front() {
                return Ok(Some(document));
            }
            if self.id == 0 || self.failed {
                return Ok(None);
            }
            self.get_more().await?;
        }
    }

    /// The documents of the current batch, or of the next `getMore` when it is used up; an
    /// empty vector once exhausted or after an error (review38 L9, [`Cursor::next`]).
    pub async fn next_batch(&mut self) -> Result<Vec<Document>, OperationError> {
        while self.buffer.is_empty() && self.id != 0 && !self.failed {
            self.get_more().await?;
        }
        Ok(self.buffer.drain(..).collect())
    }

    /// The `getMore` of this cursor: `batchSize` only when positive (review37 W3); a usage error
    /// when no reply named the cursor's namespace (review37 W15: a server refuses a getMore
    /// without a collection, InvalidNamespace).
    fn get_more_command(&self) -> Result<Document, OperationError> {
        if !self.namespace_known {
            return Err(OperationError::usage(
                "the cursor's reply named no namespace (`cursor.ns`): its getMore cannot name \
                 the collection",
            ));
        }
        let mut command = doc! { "getMore": self.id, "collection": self.collection.as_str() };
        if let Some(size) = &self.batch_size {
            command.insert("batchSize", size.clone());
        }
        Ok(command)
    }

    /// Sends one `getMore` and buffers its batch.
    async fn get_more(&mut self) -> Result<(), OperationError> {
        let Some(handle) = self.handle else {
            self.id = 0;
            return Ok(());
        };
        let command = match self.get_more_command() {
            Ok(command) => command,
            Err(error) => {
                self.failed = true;
                return Err(error);
            }
        };
        let options = CommandOptions {
            cursor: CursorUse::GetMore(handle),
            ..CommandOptions::default()
        };
        let reply = self
            .client
            .run(&self.db, command, OperationKind::GetMore, options)
            .await;
        let batch = reply.and_then(|r| Batch::read(&r.document, "nextBatch"));
        match batch {
            Ok(batch) => {
                self.id = batch.id;
                self.take_namespace(batch.namespace.as_deref());
                if batch.id == 0 {
                    // The engine forgot the cursor at id 0: nothing to kill.
                    self.handle = None;
                }
                self.buffer.extend(batch.documents);
                Ok(())
            }
            Err(error) => {
                // Review38 L9: the cursor's state on the server is unknown: closed on the
                // client side; the handle stays, so drop or close still kills it (or releases
                // its pinned connection, LB-11).
                self.buffer.clear();
                self.failed = true;
                Err(error)
            }
        }
    }

    /// Closes the cursor now: `killCursors` when the server still has it (its errors are
    /// returned, the cursor is closed either way). Dropping the cursor does the same without
    /// waiting.
    pub async fn close(mut self) -> Result<(), OperationError> {
        self.buffer.clear();
        match self.kill_command() {
            Some((command, options)) => self
                .client
                .run(&self.db, command, OperationKind::RunCommand, options)
                .await
                .map(drop),
            None => Ok(()),
        }
    }

    /// The `killCursors` for a cursor the server still has, and forgets it.
    fn kill_command(&mut self) -> Option<(Document, CommandOptions)> {
        let handle = self.handle.take()?;
        let id = core::mem::take(&mut self.id);
        if id == 0 {
            return None;
        }
        let command = doc! { "killCursors": self.collection.as_str(), "cursors": [id] };
        let options = CommandOptions {
            cursor: CursorUse::Close(handle),
            ..CommandOptions::default()
        };
        Some((command, options))
    }
}

impl<R> Drop for Cursor<R> {
    /// A cursor dropped before it was exhausted is killed: its `killCursors` is queued without
    /// waiting (a client driven by its own futures sends it when one of them is next polled;
    /// a client shut down first sends nothing).
    fn drop(&mut self) {
        if let Some((command, options)) = self.kill_command() {
            let kind = OperationKind::RunCommand;
            let operation = self.client.operation(&self.db, command, kind, options);
            let _ = self.client.submit(operation);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review37 W3: a getMore carries the opening command's `batchSize` only when it is a
    /// positive number (find/getMore spec: `GetMoreCommand.batchSize` is attached only when
    /// nonzero; a real server refuses 0 and below with BadValue).
    #[test]
    fn w3_a_get_more_batch_size_is_the_opening_commands_only_when_positive() {
        let find = |size: Bson| doc! { "find": "c", "batchSize": size };
        let aggregate =
            |size: Bson| doc! { "aggregate": "c", "pipeline": [], "cursor": { "batchSize": size } };
        for open in [find, aggregate] {
            assert_eq!(get_more_batch_size(&open(Bson::Int32(0))), None);
            assert_eq!(get_more_batch_size(&open(Bson::Int64(0))), None);
            assert_eq!(get_more_batch_size(&open(Bson::Double(0.0))), None);
            assert_eq!(get_more_batch_size(&open(Bson::Int32(-1))), None);
            assert_eq!(
                get_more_batch_size(&open(Bson::Int32(2))),
                Some(Bson::Int32(2))
            );
            assert_eq!(
                get_more_batch_size(&open(Bson::Int64(3))),
                Some(Bson::Int64(3))
            );
        }
        assert_eq!(get_more_batch_size(&doc! { "find": "c" }), None);
        assert_eq!(
            get_more_batch_size(&doc! { "aggregate": "c", "pipeline": [], "cursor": {} }),
            None
        );
    }
}
