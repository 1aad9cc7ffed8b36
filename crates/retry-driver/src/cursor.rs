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
    batch_size: Option<Bson>,
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

impl<R> Client<R> {
    /// Runs a cursor-opening command (`find`, `aggregate`, `listCollections`, `listIndexes`, ...)
    /// on `db` and returns its cursor. The kind comes from
    /// [`retry_core::classify::classify`] (an `aggregate` with `$out` is a write); the client's
    /// read or write concern is added as [`Client::command`] adds it. Later batches
    /// use the command's `batchSize` (a `find`'s or the `cursor.batchSize` of an `aggregate`).
    pub async fn cursor(&self, db: &str, command: Document) -> Result<Cursor<R>, OperationError> {
        let (command, kind) = self.with_concerns(command);
        let batch_size = command.get("batchSize").cloned().or_else(|| {
            command
                .get_document("cursor")
                .ok()
                .and_then(|c| c.get("batchSize").cloned())
        });
        let options = CommandOptions {
            cursor: CursorUse::Open,
            ..CommandOptions::default()
        };
        let reply = self.run(db, command, kind, options).await?;
        let first = Batch::read(&reply.document, "firstBatch")?;
        let (db, collection) = match first.namespace.as_deref().and_then(|ns| ns.split_once('.')) {
            Some((db, collection)) => (db.to_owned(), collection.to_owned()),
            None => (db.to_owned(), String::new()),
        };
        Ok(Cursor {
            client: self.clone(),
            db,
            collection,
            id: first.id,
            handle: reply.cursor.filter(|_| first.id != 0),
            buffer: first.documents.into(),
            batch_size,
        })
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

    /// The next document: from the current batch, else from a `getMore` (which may return an
    /// empty batch; it then asks again). `Ok(None)` once the server reported cursor id 0 and every
    /// document was returned. After an error the cursor is closed on the client side (the server
    /// side is killed when it is dropped, unless its connection failed, LB-11).
    pub async fn next(&mut self) -> Result<Option<Document>, OperationError> {
        loop {
            if let Some(document) = self.buffer.pop_front() {
                return Ok(Some(document));
            }
            if self.id == 0 {
                return Ok(None);
            }
            self.get_more().await?;
        }
    }

    /// The documents of the current batch, or of the next `getMore` when it is used up; an
    /// empty vector once exhausted.
    pub async fn next_batch(&mut self) -> Result<Vec<Document>, OperationError> {
        while self.buffer.is_empty() && self.id != 0 {
            self.get_more().await?;
        }
        Ok(self.buffer.drain(..).collect())
    }

    /// Sends one `getMore` and buffers its batch.
    async fn get_more(&mut self) -> Result<(), OperationError> {
        let Some(handle) = self.handle else {
            self.id = 0;
            return Ok(());
        };
        let mut command = doc! { "getMore": self.id, "collection": self.collection.as_str() };
        if let Some(size) = &self.batch_size {
            command.insert("batchSize", size.clone());
        }
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
                if batch.id == 0 {
                    // The engine forgot the cursor at id 0: nothing to kill.
                    self.handle = None;
                }
                self.buffer.extend(batch.documents);
                Ok(())
            }
            Err(error) => {
                // The cursor's state on the server is unknown: stop here; drop still kills it.
                self.buffer.clear();
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
