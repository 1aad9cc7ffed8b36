//! UT-14..17: a CRUD operation and its arguments → the command document the product sends, and
//! the reply → the result document the test expects. Whether the command is a retryable read, a
//! retryable write or neither comes from the product's classifier
//! ([`retry_core::classify::classify`]); the runner never adds `lsid`, `txnNumber`,
//! `$readPreference` or `maxTimeMS` and never retries (issue 11 item 2).

use std::collections::VecDeque;
use std::sync::Arc;

use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use retry_core::classify::{classify, inherits_read_concern, inherits_write_concern};
use retry_core::engine::CursorUse;
use retry_core::error::{ErrorKind, OperationError};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_tokio::CommandOptions;
use serde_json::{Map, Value};

use super::entities::{CursorEntity, Entities, Entity, Options, Session};
use crate::json::to_bson;

/// At most this many `getMore`s drain one cursor (a bound on every loop, rule 12).
const MAX_GET_MORES: usize = 10_000;

/// The error an operation ended with, in the shape `expectError` asserts (UT-19).
#[derive(Debug)]
pub struct Failure {
    /// Not built from a server reply.
    pub client_error: bool,
    /// A client-side timeout.
    pub timeout: bool,
    /// The server's top-level code (or the first write error's).
    pub code: Option<i32>,
    /// Its code name.
    pub code_name: Option<String>,
    /// The labels of the error the product raised.
    pub labels: Vec<String>,
    /// The message, with write and write-concern errors.
    pub message: String,
    /// A bulk write's partial result.
    pub partial: Option<Bson>,
    /// The write concern errors, as `{code, message}` (clientBulkWrite's `writeConcernErrors`).
    pub write_concern_errors: Vec<Bson>,
    /// clientBulkWrite's write errors by model index, as `{code, message}`.
    pub write_errors: Option<Document>,
    /// The server's error reply, when the error came from one (`errorResponse`).
    pub response: Option<Document>,
}

impl Failure {
    /// The product's error.
    pub fn product(error: &OperationError) -> Failure {
        let server = error.server_error();
        let mut labels: Vec<String> = error.labels.names().map(str::to_owned).collect();
        if let Some(server) = server {
            labels.extend(server.other_labels.iter().cloned());
        }
        let wce = server.and_then(|s| s.write_concern_error.as_ref());
        Failure {
            client_error: !matches!(error.kind, ErrorKind::Server(_)),
            timeout: matches!(error.kind, ErrorKind::Timeout { .. }),
            code: error.code().or(wce.and_then(|w| w.code)),
            code_name: server
                .and_then(|s| s.code_name.clone())
                .or(wce.and_then(|w| w.code_name.clone())),
            labels,
            message: error.to_string(),
            partial: None,
            write_errors: None,
            response: server.map(|s| s.raw.clone()),
            write_concern_errors: wce
                .map(|w| {
                    let mut error = doc! { "message": w.message.clone() };
                    if let Some(code) = w.code {
                        error.insert("code", code);
                    }
                    Bson::Document(error)
                })
                .into_iter()
                .collect(),
        }
    }

    /// A reply with `writeErrors` (TK-4): the first write error's code, every message.
    fn write_errors(reply: &Document, errors: &[Bson], partial: Option<Bson>) -> Failure {
        let first = errors.first().and_then(Bson::as_document);
        let mut message = String::new();
        for error in errors.iter().filter_map(Bson::as_document) {
            message.push_str(error.get_str("errmsg").unwrap_or_default());
            message.push('\n');
        }
        Failure {
            client_error: false,
            timeout: false,
            code: first.and_then(|e| e.get_i32("code").ok()),
            code_name: first.and_then(|e| e.get_str("codeName").ok().map(str::to_owned)),
            labels: reply
                .get_array("errorLabels")
                .map(|l| {
                    l.iter()
                        .filter_map(Bson::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default(),
            message,
            partial,
            write_concern_errors: Vec::new(),
            write_errors: None,
            response: Some(reply.clone()),
        }
    }
}

/// What an operation produced: a result to match, or a cursor entity to save.
pub enum Produced {
    /// A result (`Bson::Null` when there is none).
    Value(Bson),
    /// A cursor (`createFindCursor`, `createChangeStream`).
    Cursor(Box<CursorEntity>),
}

/// An operation's outcome: `Err(Ok(failure))` is the operation's error, `Err(Err(message))` a
/// runner or test-file error (a harness failure).
pub type OpResult = Result<Produced, Result<Box<Failure>, String>>;

/// UT-14: the arguments of one operation; every one must be consumed.
pub struct Args(Map<String, Value>);

impl Args {
    /// The operation's `arguments` (absent: none).
    pub fn new(value: Option<&Value>) -> Result<Args, String> {
        match value {
            None => Ok(Args(Map::new())),
            Some(Value::Object(map)) => Ok(Args(map.clone())),
            Some(_) => Err("arguments must be an object".into()),
        }
    }

    /// Removes an argument.
    pub fn take(&mut self, key: &str) -> Option<Value> {
        self.0.remove(key)
    }

    /// Removes an argument as BSON.
    pub fn bson(&mut self, key: &str) -> Result<Option<Bson>, String> {
        self.take(key).map(|v| to_bson(&v)).transpose()
    }

    /// Removes a required document argument.
    pub fn document(&mut self, key: &str) -> Result<Document, String> {
        match self.bson(key)? {
            Some(Bson::Document(d)) => Ok(d),
            _ => Err(format!("argument {key} missing or not a document")),
        }
    }

    /// Removes a required string argument.
    pub fn string(&mut self, key: &str) -> Result<String, String> {
        match self.take(key) {
            Some(Value::String(s)) => Ok(s),
            _ => Err(format!("argument {key} missing or not a string")),
        }
    }

    /// UT-14: an argument left over is an error.
    pub fn finish(self) -> Result<(), String> {
        match self.0.keys().next() {
            Some(key) => Err(format!("unsupported argument {key}")),
            None => Ok(()),
        }
    }

    /// Moves the listed optional arguments into `command` under their command names.
    fn copy(&mut self, command: &mut Document, keys: &[(&str, &str)]) -> Result<(), String> {
        for (argument, field) in keys {
            if let Some(value) = self.bson(argument)? {
                command.insert(*field, value);
            }
        }
        Ok(())
    }
}

/// Where an operation runs: a client entity, a database and maybe a collection.
#[derive(Clone)]
pub struct Target {
    /// The client entity.
    pub client: String,
    /// The product client of that entity.
    pub handle: retry_tokio::Client,
    /// The database.
    pub db: String,
    /// The collection, for collection operations.
    pub collection: Option<String>,
    /// The inherited options.
    pub options: Options,
    /// The explicit session of the operation (its `session` argument, UT-10).
    pub session: Option<Arc<Session>>,
}

impl Target {
    /// The entity `id` as a target.
    pub fn of(entities: &Entities, id: &str) -> Result<Target, String> {
        let (client, db, collection, options) = match entities.map.get(id) {
            Some(Entity::Client(_)) => (id, "admin", None, Options::default()),
            Some(Entity::Database {
                client,
                name,
                options,
            }) => (client.as_str(), name.as_str(), None, options.clone()),
            Some(Entity::Collection {
                client,
                db,
                name,
                options,
            }) => (
                client.as_str(),
                db.as_str(),
                Some(name.clone()),
                options.clone(),
            ),
            _ => {
                return Err(format!(
                    "{id} is not a client, database or collection entity"
                ))
            }
        };
        let Some(Entity::Client(entity)) = entities.map.get(client) else {
            return Err(format!("{client} is not a client entity"));
        };
        Ok(Target {
            client: client.to_owned(),
            handle: entity.client.clone(),
            db: db.to_owned(),
            collection,
            options,
            session: None,
        })
    }

    fn collection(&self) -> Result<&str, String> {
        self.collection
            .as_deref()
            .ok_or_else(|| "a collection operation on a non-collection entity".to_owned())
    }
}

/// Runs `command` through the product: the kind is the product classifier's, the selection the
/// target's read preference for reads and generic commands when it has one (else the product's
/// default) and a writable server for writes.
pub async fn execute(
    target: &Target,
    command: Document,
    cursor: CursorUse,
) -> Result<retry_tokio::Reply, OperationError> {
    let kind = classify(&command, &[], target.options.write_concern.as_ref());
    execute_as(target, command, kind, cursor).await
}

/// [`execute`] with the operation's `kind` given.
async fn execute_as(
    target: &Target,
    command: Document,
    kind: OperationKind,
    cursor: CursorUse,
) -> Result<retry_tokio::Reply, OperationError> {
    let read = matches!(kind, OperationKind::Read | OperationKind::RunCommand);
    let criteria = match &target.options.read_preference {
        Some(preference) if read => Some(SelectionCriteria::Read(preference.clone())),
        _ => None,
    };
    let mut options = CommandOptions::default().with_cursor(cursor);
    options.criteria = criteria;
    // UT-9: the entity's concerns are inherited, not the operation's own: a transaction drops
    // them (TX-1).
    options.concerns_inherited =
        target.options.read_concern.is_some() || target.options.write_concern.is_some();
    match &target.session {
        // The session adds what a transaction needs (TX-1, TX-2): the product's decision.
        Some(session) => session.run(&target.db, command, kind, options).await,
        None => target.handle.run(&target.db, command, kind, options).await,
    }
}

/// TO-6: an operation's `maxTimeMS` argument, put on its command as given: the product sends
/// a command's own `maxTimeMS` as it is without `timeoutMS`, and derives its own under it
/// (CS-4, TO-8).
fn max_time_ms(
    args: &mut Args,
    command: &mut Document,
) -> Result<(), Result<Box<Failure>, String>> {
    if let Some(ms) = args.bson("maxTimeMS").map_err(Err)? {
        command.insert("maxTimeMS", ms);
    }
    Ok(())
}

/// `command` with the target's read or write concern where it inherits one, by the product's
/// rule ([`inherits_read_concern`], [`inherits_write_concern`]: the table `retry_driver`'s
/// concerns use too). Never for `runCommand`, which sends the command as given.
fn with_concerns(mut command: Document, target: &Target) -> Document {
    if let Some(rc) = target
        .options
        .read_concern
        .as_ref()
        .filter(|_| inherits_read_concern(&command))
    {
        command.insert("readConcern", rc.clone());
    }
    if let Some(wc) = target
        .options
        .write_concern
        .as_ref()
        .filter(|_| inherits_write_concern(&command))
    {
        command.insert("writeConcern", wc.clone());
    }
    command
}

fn product(error: OperationError) -> Result<Box<Failure>, String> {
    Ok(Box::new(Failure::product(&error)))
}

/// Runs a cursor-opening command and its getMores to the end (UT-16); on a getMore failure the
/// cursor is killed and the error returned.
async fn drain(target: &Target, command: Document) -> OpResult {
    let mut cursor = open_cursor(target, command).await?;
    let mut documents: Vec<Bson> = cursor.buffer.drain(..).collect();
    for _ in 0..MAX_GET_MORES {
        if cursor.id == 0 {
            return Ok(Produced::Value(Bson::Array(documents)));
        }
        if let Err(failure) = get_more(target, &mut cursor).await {
            kill(target, &cursor).await;
            return Err(failure);
        }
        documents.extend(cursor.buffer.drain(..));
    }
    Err(Err("cursor not exhausted after the getMore bound".into()))
}

/// The first command of a cursor: its batch and id.
async fn open_cursor(
    target: &Target,
    command: Document,
) -> Result<CursorEntity, Result<Box<Failure>, String>> {
    // Review37 W3 (find/getMore spec: a getMore's `batchSize` is attached only when nonzero; a
    // real server refuses 0 and below): the opening command's `batchSize` only when positive.
    let batch_size = command
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_i32("batchSize").ok())
        .or(command.get_i32("batchSize").ok())
        .filter(|&size| size > 0);
    let reply = execute(target, command, CursorUse::Open)
        .await
        .map_err(product)?;
    let (id, batch) = cursor_batch(&reply.document, "firstBatch").map_err(Err)?;
    let ns = reply
        .document
        .get_document("cursor")
        .and_then(|c| c.get_str("ns"))
        .unwrap_or_default();
    let collection = ns.split_once('.').map(|(_, c)| c).unwrap_or_default();
    Ok(CursorEntity {
        client: target.client.clone(),
        db: target.db.clone(),
        collection: collection.to_owned(),
        id,
        handle: reply.cursor,
        buffer: batch.iter().cloned().collect(),
        batch_size,
        session: target.session.clone(),
    })
}

/// One getMore of `cursor` into its buffer.
pub async fn get_more(
    target: &Target,
    cursor: &mut CursorEntity,
) -> Result<(), Result<Box<Failure>, String>> {
    let Some(handle) = cursor.handle else {
        return Err(Err("a getMore without the product's cursor handle".into()));
    };
    let mut command = doc! { "getMore": cursor.id, "collection": cursor.collection.clone() };
    if let Some(batch_size) = cursor.batch_size {
        command.insert("batchSize", batch_size);
    }
    let target = Target {
        session: cursor.session.clone(),
        ..target.clone()
    };
    let reply = execute(&target, command, CursorUse::GetMore(handle))
        .await
        .map_err(product)?;
    let (id, batch) = cursor_batch(&reply.document, "nextBatch").map_err(Err)?;
    // Review37 W15: the cursor's namespace from every reply.
    let ns = reply
        .document
        .get_document("cursor")
        .and_then(|c| c.get_str("ns"))
        .unwrap_or_default();
    if let Some((_, collection)) = ns.split_once('.') {
        cursor.collection = collection.to_owned();
    }
    cursor.id = id;
    cursor.buffer.extend(batch.iter().cloned());
    Ok(())
}

/// A cursor reply's id (read by the product's [`retry_core::reply::cursor_id`]: an Int32 id is
/// an id, not 0) and its `firstBatch` or `nextBatch`.
fn cursor_batch<'a>(reply: &'a Document, batch: &str) -> Result<(i64, &'a Vec<Bson>), String> {
    let id = retry_core::reply::cursor_id(reply)
        .ok_or_else(|| format!("reply without an integer cursor id: {reply}"))?;
    let batch = reply
        .get_document("cursor")
        .and_then(|c| c.get_array(batch))
        .map_err(|_| format!("reply without {batch}: {reply}"))?;
    Ok((id, batch))
}

/// Sends `killCursors` for an open cursor; its errors are swallowed (UT-16).
pub async fn kill(target: &Target, cursor: &CursorEntity) {
    if cursor.id == 0 {
        return;
    }
    let Some(handle) = cursor.handle else {
        return;
    };
    let command = doc! { "killCursors": cursor.collection.clone(), "cursors": [cursor.id] };
    let _ = execute(target, command, CursorUse::Close(handle)).await;
}

/// The CRUD spec's client-side check: an update is a pipeline or a document of update operators
/// (its first key starts with `$`), a replacement is a document without them; anything else is
/// an error before anything is sent (transactions `errors-client.json`: the transaction's state
/// does not change).
fn check_update(name: &str, update: &Bson) -> Result<(), OperationError> {
    let operators = match update {
        Bson::Document(d) => d.keys().next().is_some_and(|k| k.starts_with('$')),
        Bson::Array(_) if name != "replaceOne" => return Ok(()),
        _ => return Err(OperationError::usage(format!("{name}: not a document"))),
    };
    match (name, operators) {
        ("replaceOne", false) | ("updateOne" | "updateMany", true) => Ok(()),
        ("replaceOne", true) => Err(OperationError::usage(
            "replaceOne: the replacement document must not contain update operators",
        )),
        _ => Err(OperationError::usage(format!(
            "{name}: the update document must contain update operators"
        ))),
    }
}

/// A single command's reply as a result value, or its error.
async fn single(
    target: &Target,
    command: Document,
) -> Result<Document, Result<Box<Failure>, String>> {
    let kind = classify(&command, &[], target.options.write_concern.as_ref());
    single_as(target, command, kind).await
}

/// [`single`] with the operation's `kind` given.
async fn single_as(
    target: &Target,
    command: Document,
    kind: OperationKind,
) -> Result<Document, Result<Box<Failure>, String>> {
    match execute_as(target, command, kind, CursorUse::None).await {
        Ok(reply) => Ok(reply.document),
        // The product's write-errors error keeps the reply: the result shaping below reads the
        // counts and the write errors from it (partial results, unordered bulks go on).
        Err(error) => match error.kind {
            ErrorKind::Write(write) => Ok(write.reply),
            _ => Err(product(error)),
        },
    }
}

/// A write reply: `writeErrors` become the operation's error (TK-4).
fn write_reply(
    reply: Document,
    partial: impl Fn(&Document) -> Bson,
) -> Result<Document, Result<Box<Failure>, String>> {
    match reply.get_array("writeErrors") {
        Ok(errors) if !errors.is_empty() => Err(Ok(Box::new(Failure::write_errors(
            &reply,
            errors,
            Some(partial(&reply)),
        )))),
        _ => Ok(reply),
    }
}

fn number(reply: &Document, key: &str) -> i64 {
    match reply.get(key) {
        Some(Bson::Int32(n)) => i64::from(*n),
        Some(Bson::Int64(n)) => *n,
        Some(Bson::Double(n)) => *n as i64,
        _ => 0,
    }
}

/// UT-17: an update reply as `{matchedCount, modifiedCount, upsertedCount, upsertedId}`.
fn update_result(reply: &Document) -> Bson {
    let upserted = reply.get_array("upserted").map(Vec::len).unwrap_or(0) as i64;
    let mut result = doc! {
        "matchedCount": number(reply, "n") - upserted,
        "modifiedCount": number(reply, "nModified"),
        "upsertedCount": upserted,
    };
    if let Some(id) = reply
        .get_array("upserted")
        .ok()
        .and_then(|u| u.first())
        .and_then(Bson::as_document)
        .and_then(|u| u.get("_id"))
    {
        result.insert("upsertedId", id.clone());
    }
    Bson::Document(result)
}

/// The driver gives a document without `_id` a new ObjectId before sending it.
fn with_id(mut document: Document) -> (Document, Bson) {
    let id = match document.get("_id") {
        Some(id) => id.clone(),
        None => {
            let id = Bson::ObjectId(ObjectId::new());
            let mut with = doc! { "_id": id.clone() };
            with.extend(document);
            document = with;
            id
        }
    };
    (document, id)
}

/// Runs one entity operation `name` on `target`.
pub async fn run(target: &Target, name: &str, mut args: Args) -> OpResult {
    let result = run_inner(target, name, &mut args).await;
    if let Err(e) = args.finish() {
        return Err(Err(e));
    }
    result
}

async fn run_inner(target: &Target, name: &str, args: &mut Args) -> OpResult {
    let harness = |e: String| Err(e);
    match name {
        "find" | "findOne" | "createFindCursor" => {
            let coll = target.collection().map_err(harness)?;
            let filter = args.document("filter").unwrap_or_default();
            let mut command = doc! { "find": coll, "filter": filter };
            args.copy(
                &mut command,
                &[
                    ("sort", "sort"),
                    ("skip", "skip"),
                    ("limit", "limit"),
                    ("batchSize", "batchSize"),
                    ("projection", "projection"),
                ],
            )
            .map_err(harness)?;
            if name == "findOne" {
                command.insert("limit", 1);
                command.insert("singleBatch", true);
            }
            let command = with_concerns(command, target);
            if name == "createFindCursor" {
                let cursor = open_cursor(target, command).await?;
                return Ok(Produced::Cursor(Box::new(cursor)));
            }
            let result = drain(target, command).await?;
            if name == "findOne" {
                if let Produced::Value(Bson::Array(docs)) = result {
                    return Ok(Produced::Value(
                        docs.into_iter().next().unwrap_or(Bson::Null),
                    ));
                }
            }
            Ok(result)
        }
        "aggregate" | "createChangeStream" | "countDocuments" => {
            let mut pipeline = match args.bson("pipeline").map_err(harness)? {
                Some(Bson::Array(p)) => p,
                None if name == "countDocuments" => Vec::new(),
                _ => return Err(Err("pipeline missing or not an array".into())),
            };
            if name == "countDocuments" {
                let filter = args.document("filter").map_err(harness)?;
                pipeline = vec![
                    Bson::Document(doc! { "$match": filter }),
                    Bson::Document(doc! { "$group": { "_id": 1, "n": { "$sum": 1 } } }),
                ];
            }
            if name == "createChangeStream" {
                let mut stage = Document::new();
                if target.db == "admin" && target.collection.is_none() {
                    stage.insert("allChangesForCluster", true);
                }
                pipeline.insert(0, Bson::Document(doc! { "$changeStream": stage }));
            }
            let aggregate: Bson = match &target.collection {
                Some(c) => c.clone().into(),
                None => 1.into(),
            };
            let mut cursor = Document::new();
            if let Some(size) = args.bson("batchSize").map_err(harness)? {
                cursor.insert("batchSize", size);
            }
            let mut command =
                doc! { "aggregate": aggregate, "pipeline": pipeline, "cursor": cursor };
            max_time_ms(args, &mut command)?;
            let command = with_concerns(command, target);
            if name == "createChangeStream" {
                let cursor = open_cursor(target, command).await?;
                return Ok(Produced::Cursor(Box::new(cursor)));
            }
            let result = drain(target, command).await?;
            if name == "countDocuments" {
                if let Produced::Value(Bson::Array(docs)) = &result {
                    let n = docs
                        .first()
                        .and_then(Bson::as_document)
                        .and_then(|d| d.get("n").cloned())
                        .unwrap_or(Bson::Int32(0));
                    return Ok(Produced::Value(n));
                }
            }
            Ok(result)
        }
        "count" | "estimatedDocumentCount" => {
            let coll = target.collection().map_err(harness)?;
            let mut command = doc! { "count": coll };
            if name == "count" {
                command.insert("query", args.document("filter").map_err(harness)?);
            }
            max_time_ms(args, &mut command)?;
            let reply = single(target, with_concerns(command, target)).await?;
            Ok(Produced::Value(
                reply.get("n").cloned().unwrap_or(Bson::Null),
            ))
        }
        "distinct" => {
            let coll = target.collection().map_err(harness)?;
            let key = args.string("fieldName").map_err(harness)?;
            let filter = args.document("filter").map_err(harness)?;
            let command = doc! { "distinct": coll, "key": key, "query": filter };
            let reply = single(target, with_concerns(command, target)).await?;
            Ok(Produced::Value(
                reply.get("values").cloned().unwrap_or(Bson::Null),
            ))
        }
        "listDatabases" | "listDatabaseNames" | "listDatabaseObjects" => {
            let mut command = doc! { "listDatabases": 1 };
            args.copy(&mut command, &[("filter", "filter")])
                .map_err(harness)?;
            if name == "listDatabaseNames" {
                command.insert("nameOnly", true);
            }
            let admin = Target {
                db: "admin".into(),
                collection: None,
                ..target.clone()
            };
            let reply = single(&admin, command).await?;
            let databases = reply.get_array("databases").cloned().unwrap_or_default();
            Ok(Produced::Value(match name {
                "listDatabaseNames" => names(&databases),
                _ => Bson::Array(databases),
            }))
        }
        "listCollections" | "listCollectionNames" | "listCollectionObjects" => {
            let mut command = doc! { "listCollections": 1 };
            args.copy(&mut command, &[("filter", "filter")])
                .map_err(harness)?;
            if name == "listCollectionNames" {
                command.insert("nameOnly", true);
            }
            let mut cursor = Document::new();
            if let Some(size) = args.bson("batchSize").map_err(harness)? {
                cursor.insert("batchSize", size);
            }
            command.insert("cursor", cursor);
            let result = drain(target, command).await?;
            Ok(names_if(name == "listCollectionNames", result))
        }
        "listIndexes" | "listIndexNames" => {
            let coll = target.collection().map_err(harness)?;
            let mut cursor = Document::new();
            if let Some(size) = args.bson("batchSize").map_err(harness)? {
                cursor.insert("batchSize", size);
            }
            let command = doc! { "listIndexes": coll, "cursor": cursor };
            let result = drain(target, command).await?;
            Ok(names_if(name == "listIndexNames", result))
        }
        "runCommand" => {
            let command = args.document("command").map_err(harness)?;
            let command_name = args.string("commandName").map_err(harness)?;
            if command.keys().next().map(String::as_str) != Some(command_name.as_str()) {
                return Err(Err(format!(
                    "commandName {command_name} is not the first key"
                )));
            }
            // The run-command spec (SS-10): a generic command, whatever it holds, is never
            // classified: it uses the read preference it is given, else the primary (never the
            // one its database entity inherits, review35 Z3), inherits no concern, is never
            // retried by the retryable-reads or -writes rules and carries no `txnNumber` outside
            // a transaction (the product's `OperationKind::RunCommand`).
            let mut target = target.clone();
            target.options.read_preference = match args.take("readPreference") {
                Some(preference) => {
                    Some(super::entities::read_preference(&preference).map_err(harness)?)
                }
                None => None,
            };
            target.options.read_concern = None;
            target.options.write_concern = None;
            let reply = single_as(&target, command, OperationKind::RunCommand).await?;
            Ok(Produced::Value(Bson::Document(reply)))
        }
        "mapReduce" => {
            let coll = target.collection().map_err(harness)?;
            let mut command = doc! { "mapReduce": coll };
            for field in ["map", "reduce", "out"] {
                let value = args.bson(field).map_err(harness)?;
                command.insert(field, value.ok_or(Err(format!("{field} missing")))?);
            }
            let reply = single(target, with_concerns(command, target)).await?;
            Ok(Produced::Value(
                reply.get("results").cloned().unwrap_or(Bson::Null),
            ))
        }
        "insertOne" | "insertMany" => {
            let coll = target.collection().map_err(harness)?;
            let documents: Vec<Document> = if name == "insertOne" {
                vec![args.document("document").map_err(harness)?]
            } else {
                match args.bson("documents").map_err(harness)? {
                    Some(Bson::Array(list)) => list
                        .into_iter()
                        .map(|d| match d {
                            Bson::Document(d) => Ok(d),
                            _ => Err(Err("documents must be documents".to_owned())),
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err(Err("documents missing".into())),
                }
            };
            let mut ids = Vec::new();
            let mut sent = Vec::new();
            for document in documents {
                let (document, id) = with_id(document);
                ids.push(id);
                sent.push(Bson::Document(document));
            }
            let ordered = args
                .take("ordered")
                .map(|v| v.as_bool() != Some(false))
                .unwrap_or(true);
            let command = with_concerns(
                doc! { "insert": coll, "documents": sent, "ordered": ordered },
                target,
            );
            let reply = single(target, command).await?;
            let inserted = |reply: &Document| {
                let failed: Vec<i64> = failed_indexes(reply);
                let mut map = Document::new();
                for (i, id) in ids.iter().enumerate() {
                    if !failed.contains(&(i as i64))
                        && (i as i64) < number(reply, "n") + failed.len() as i64
                    {
                        map.insert(i.to_string(), id.clone());
                    }
                }
                Bson::Document(doc! { "insertedCount": number(reply, "n"), "insertedIds": map })
            };
            write_reply(reply, inserted)?;
            Ok(Produced::Value(if name == "insertOne" {
                Bson::Document(doc! { "insertedId": ids[0].clone() })
            } else {
                let mut map = Document::new();
                for (i, id) in ids.iter().enumerate() {
                    map.insert(i.to_string(), id.clone());
                }
                Bson::Document(doc! { "insertedIds": map })
            }))
        }
        "updateOne" | "updateMany" | "replaceOne" => {
            let coll = target.collection().map_err(harness)?;
            let filter = args.document("filter").map_err(harness)?;
            let update = match name {
                "replaceOne" => Bson::Document(args.document("replacement").map_err(harness)?),
                _ => args
                    .bson("update")
                    .map_err(harness)?
                    .ok_or(Err("update missing".to_owned()))?,
            };
            check_update(name, &update).map_err(product)?;
            let mut statement = doc! { "q": filter, "u": update };
            if name == "updateMany" {
                statement.insert("multi", true);
            }
            if let Some(upsert) = args.bson("upsert").map_err(harness)? {
                statement.insert("upsert", upsert);
            }
            let command = with_concerns(
                doc! { "update": coll, "updates": [statement], "ordered": true },
                target,
            );
            let reply = single(target, command).await?;
            let reply = write_reply(reply, update_result)?;
            Ok(Produced::Value(update_result(&reply)))
        }
        "deleteOne" | "deleteMany" => {
            let coll = target.collection().map_err(harness)?;
            let filter = args.document("filter").map_err(harness)?;
            let limit = if name == "deleteOne" { 1 } else { 0 };
            let command = with_concerns(
                doc! { "delete": coll, "deletes": [{ "q": filter, "limit": limit }], "ordered": true },
                target,
            );
            let reply = single(target, command).await?;
            let reply = write_reply(reply, |r| {
                Bson::Document(doc! { "deletedCount": number(r, "n") })
            })?;
            Ok(Produced::Value(Bson::Document(
                doc! { "deletedCount": number(&reply, "n") },
            )))
        }
        "findOneAndUpdate" | "findOneAndReplace" | "findOneAndDelete" => {
            let coll = target.collection().map_err(harness)?;
            let filter = args.document("filter").map_err(harness)?;
            let mut command = doc! { "findAndModify": coll, "query": filter };
            match name {
                "findOneAndDelete" => {
                    command.insert("remove", true);
                }
                "findOneAndReplace" => {
                    command.insert("update", args.document("replacement").map_err(harness)?);
                }
                _ => {
                    let update = args
                        .bson("update")
                        .map_err(harness)?
                        .ok_or(Err("update missing".to_owned()))?;
                    command.insert("update", update);
                }
            }
            if let Some(Value::String(when)) = args.take("returnDocument") {
                command.insert("new", when == "After");
            }
            args.copy(
                &mut command,
                &[
                    ("sort", "sort"),
                    ("upsert", "upsert"),
                    ("projection", "fields"),
                ],
            )
            .map_err(harness)?;
            let command = with_concerns(command, target);
            let reply = single(target, command).await?;
            Ok(Produced::Value(
                reply.get("value").cloned().unwrap_or(Bson::Null),
            ))
        }
        "bulkWrite" => bulk_write(target, args).await,
        "clientBulkWrite" => client_bulk_write(target, args).await,
        "createIndex" => {
            let coll = target.collection().map_err(harness)?;
            let keys = args.document("keys").map_err(harness)?;
            let name = args.string("name").map_err(harness)?;
            let command = with_concerns(
                doc! { "createIndexes": coll, "indexes": [{ "key": keys, "name": name.clone() }] },
                target,
            );
            single(target, command).await?;
            Ok(Produced::Value(Bson::String(name)))
        }
        "dropIndex" | "dropIndexes" => {
            let coll = target.collection().map_err(harness)?;
            let index = match name {
                "dropIndex" => args.string("name").map_err(harness)?,
                _ => "*".into(),
            };
            let command = with_concerns(doc! { "dropIndexes": coll, "index": index }, target);
            single(target, command).await?;
            Ok(Produced::Value(Bson::Null))
        }
        other => Err(Err(format!("unsupported operation {other}"))),
    }
}

fn failed_indexes(reply: &Document) -> Vec<i64> {
    reply
        .get_array("writeErrors")
        .map(|errors| {
            errors
                .iter()
                .filter_map(Bson::as_document)
                .map(|e| number(e, "index"))
                .collect()
        })
        .unwrap_or_default()
}

fn names(list: &[Bson]) -> Bson {
    Bson::Array(
        list.iter()
            .filter_map(Bson::as_document)
            .filter_map(|d| d.get("name").cloned())
            .collect(),
    )
}

fn names_if(wanted: bool, result: Produced) -> Produced {
    match result {
        Produced::Value(Bson::Array(list)) if wanted => Produced::Value(names(&list)),
        other => other,
    }
}

/// One write model of a `bulkWrite`: the command it goes in and its statement.
enum Model {
    Insert(Document, Bson),
    Update(Document),
    Delete(Document),
}

impl Model {
    fn command(&self) -> &'static str {
        match self {
            Model::Insert(..) => "insert",
            Model::Update(_) => "update",
            Model::Delete(_) => "delete",
        }
    }
}

fn model(request: &Bson) -> Result<Model, String> {
    let request = request
        .as_document()
        .ok_or("a request must be a document")?;
    let (kind, body) = request.iter().next().ok_or("empty request")?;
    let body = body
        .as_document()
        .ok_or("a request body must be a document")?;
    let allowed: &[&str] = match kind.as_str() {
        "insertOne" => &["document"],
        "updateOne" | "updateMany" => &["filter", "update", "upsert"],
        "replaceOne" => &["filter", "replacement", "upsert"],
        "deleteOne" | "deleteMany" => &["filter"],
        other => return Err(format!("unsupported bulk request {other}")),
    };
    if let Some(key) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!("unsupported {kind} field {key}"));
    }
    let filter = || {
        body.get_document("filter")
            .cloned()
            .map_err(|e| e.to_string())
    };
    Ok(match kind.as_str() {
        "insertOne" => {
            let (document, id) = with_id(
                body.get_document("document")
                    .cloned()
                    .map_err(|e| e.to_string())?,
            );
            Model::Insert(document, id)
        }
        "deleteOne" | "deleteMany" => Model::Delete(doc! {
            "q": filter()?, "limit": if kind == "deleteOne" { 1 } else { 0 }
        }),
        _ => {
            let update = body
                .get("update")
                .or(body.get("replacement"))
                .cloned()
                .ok_or("update missing")?;
            let mut statement = doc! { "q": filter()?, "u": update };
            if kind == "updateMany" {
                statement.insert("multi", true);
            }
            if let Some(upsert) = body.get("upsert") {
                statement.insert("upsert", upsert.clone());
            }
            Model::Update(statement)
        }
    })
}

/// UT-17: `bulkWrite` as consecutive same-kind batches, in order, with the five counts.
async fn bulk_write(target: &Target, args: &mut Args) -> OpResult {
    let coll = target.collection().map_err(Err)?.to_owned();
    let requests = match args.bson("requests").map_err(Err)? {
        Some(Bson::Array(r)) => r,
        _ => return Err(Err("requests missing".into())),
    };
    let ordered = args
        .take("ordered")
        .map(|v| v.as_bool() != Some(false))
        .unwrap_or(true);
    let models: Vec<Model> = requests
        .iter()
        .map(model)
        .collect::<Result<_, _>>()
        .map_err(Err)?;
    let mut counts = doc! {
        "deletedCount": 0_i64, "insertedCount": 0_i64, "matchedCount": 0_i64,
        "modifiedCount": 0_i64, "upsertedCount": 0_i64,
    };
    let mut inserted_ids = Document::new();
    let mut upserted_ids = Document::new();
    let mut batches: VecDeque<(usize, Vec<&Model>)> = VecDeque::new();
    for (index, model) in models.iter().enumerate() {
        match batches.back_mut() {
            Some((_, batch)) if batch[0].command() == model.command() => batch.push(model),
            _ => batches.push_back((index, vec![model])),
        }
    }
    let add = |counts: &mut Document, key: &str, n: i64| {
        let old = counts.get_i64(key).unwrap_or_default();
        counts.insert(key, old + n);
    };
    let mut failure = None;
    for (offset, batch) in batches {
        let kind = batch[0].command();
        let (field, statements): (&str, Vec<Bson>) = match kind {
            "insert" => (
                "documents",
                batch
                    .iter()
                    .map(|m| match m {
                        Model::Insert(d, _) => Bson::Document(d.clone()),
                        _ => Bson::Null,
                    })
                    .collect(),
            ),
            "update" => (
                "updates",
                batch
                    .iter()
                    .map(|m| match m {
                        Model::Update(s) => Bson::Document(s.clone()),
                        _ => Bson::Null,
                    })
                    .collect(),
            ),
            _ => (
                "deletes",
                batch
                    .iter()
                    .map(|m| match m {
                        Model::Delete(s) => Bson::Document(s.clone()),
                        _ => Bson::Null,
                    })
                    .collect(),
            ),
        };
        let mut command = doc! { kind: coll.clone() };
        command.insert(field, statements);
        command.insert("ordered", ordered);
        let command = with_concerns(command, target);
        let reply = match single(target, command).await {
            Ok(reply) => reply,
            // UT-19: a command that fails ends the bulk write; its error carries what the
            // earlier commands did (`expectError.expectResult`).
            Err(Ok(mut failure)) => {
                let mut partial = counts.clone();
                partial.insert("insertedIds", inserted_ids);
                partial.insert("upsertedIds", upserted_ids);
                failure.partial = Some(Bson::Document(partial));
                return Err(Ok(failure));
            }
            Err(harness) => return Err(harness),
        };
        let n = number(&reply, "n");
        let failed = failed_indexes(&reply);
        match kind {
            "insert" => {
                add(&mut counts, "insertedCount", n);
                for (i, model) in batch.iter().enumerate() {
                    if let Model::Insert(_, id) = model {
                        if !failed.contains(&(i as i64)) && (ordered_ok(ordered, &failed, i)) {
                            inserted_ids.insert((offset + i).to_string(), id.clone());
                        }
                    }
                }
            }
            "update" => {
                let upserted = reply.get_array("upserted").cloned().unwrap_or_default();
                add(&mut counts, "matchedCount", n - upserted.len() as i64);
                add(&mut counts, "modifiedCount", number(&reply, "nModified"));
                add(&mut counts, "upsertedCount", upserted.len() as i64);
                for u in upserted.iter().filter_map(Bson::as_document) {
                    if let Some(id) = u.get("_id") {
                        upserted_ids
                            .insert((offset as i64 + number(u, "index")).to_string(), id.clone());
                    }
                }
            }
            _ => add(&mut counts, "deletedCount", n),
        }
        if let Ok(errors) = reply.get_array("writeErrors") {
            if !errors.is_empty() {
                failure = Some((reply.clone(), errors.clone()));
                if ordered {
                    break;
                }
            }
        }
    }
    counts.insert("insertedIds", inserted_ids);
    counts.insert("upsertedIds", upserted_ids);
    if let Some((reply, errors)) = failure {
        return Err(Ok(Box::new(Failure::write_errors(
            &reply,
            &errors,
            Some(Bson::Document(counts)),
        ))));
    }
    Ok(Produced::Value(Bson::Document(counts)))
}

/// Whether statement `i` of an ordered batch ran (before its first write error).
fn ordered_ok(ordered: bool, failed: &[i64], i: usize) -> bool {
    !ordered || failed.iter().all(|&f| (i as i64) < f)
}

/// UT-17: `clientBulkWrite` as one admin `bulkWrite` command (8.0); the result has the five
/// counts and, with `verboseResults`, the per-model results by index.
async fn client_bulk_write(target: &Target, args: &mut Args) -> OpResult {
    let models = match args.bson("models").map_err(Err)? {
        Some(Bson::Array(m)) => m,
        _ => return Err(Err("models missing".into())),
    };
    let verbose = args
        .take("verboseResults")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    let ordered = args
        .take("ordered")
        .map(|v| v.as_bool() != Some(false))
        .unwrap_or(true);
    let mut namespaces: Vec<String> = Vec::new();
    let mut ops = Vec::new();
    let mut inserted_ids = Vec::new();
    for model in &models {
        let model = model
            .as_document()
            .ok_or(Err("a model must be a document".to_owned()))?;
        let (kind, body) = model.iter().next().ok_or(Err("empty model".to_owned()))?;
        let body = body
            .as_document()
            .ok_or(Err("a model body must be a document".to_owned()))?;
        let allowed: &[&str] = match kind.as_str() {
            "insertOne" => &["namespace", "document"],
            "updateOne" | "updateMany" => &["namespace", "filter", "update", "upsert"],
            "replaceOne" => &["namespace", "filter", "replacement", "upsert"],
            "deleteOne" | "deleteMany" => &["namespace", "filter"],
            other => return Err(Err(format!("unsupported clientBulkWrite model {other}"))),
        };
        if let Some(key) = body.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(Err(format!("unsupported {kind} field {key}")));
        }
        let namespace = body.get_str("namespace").map_err(|e| Err(e.to_string()))?;
        let index = match namespaces.iter().position(|n| n == namespace) {
            Some(i) => i,
            None => {
                namespaces.push(namespace.to_owned());
                namespaces.len() - 1
            }
        } as i32;
        let filter = || {
            body.get_document("filter")
                .cloned()
                .map_err(|e| Err(e.to_string()))
        };
        let op = match kind.as_str() {
            "insertOne" => {
                let document = body
                    .get_document("document")
                    .map_err(|e| Err(e.to_string()))?;
                let (document, id) = with_id(document.clone());
                inserted_ids.push(Some(id));
                doc! { "insert": index, "document": document }
            }
            "deleteOne" | "deleteMany" => {
                inserted_ids.push(None);
                doc! { "delete": index, "filter": filter()?, "multi": kind == "deleteMany" }
            }
            _ => {
                inserted_ids.push(None);
                let update = body
                    .get("update")
                    .or(body.get("replacement"))
                    .cloned()
                    .ok_or(Err("update missing".to_owned()))?;
                let mut op = doc! {
                    "update": index, "filter": filter()?, "updateMods": update,
                    "multi": kind == "updateMany",
                };
                if let Some(upsert) = body.get("upsert") {
                    op.insert("upsert", upsert.clone());
                }
                op
            }
        };
        ops.push(op);
    }
    let ns_info: Vec<Document> = namespaces
        .iter()
        .map(|ns| doc! { "ns": ns.clone() })
        .collect();
    let command = with_concerns(
        doc! {
            "bulkWrite": 1, "errorsOnly": !verbose, "ordered": ordered, "ops": ops,
            "nsInfo": ns_info,
        },
        target,
    );
    let admin = Target {
        db: "admin".into(),
        collection: None,
        ..target.clone()
    };
    let reply = single(&admin, command).await?;
    let mut result = doc! {
        "insertedCount": number(&reply, "nInserted"),
        "upsertedCount": number(&reply, "nUpserted"),
        "matchedCount": number(&reply, "nMatched"),
        "modifiedCount": number(&reply, "nModified"),
        "deletedCount": number(&reply, "nDeleted"),
    };
    let batch = reply
        .get_document("cursor")
        .and_then(|c| c.get_array("firstBatch"))
        .cloned()
        .unwrap_or_default();
    if retry_core::reply::cursor_id(&reply).is_some_and(|id| id != 0) {
        return Err(Err("clientBulkWrite results in more than one batch".into()));
    }
    let (mut inserts, mut updates, mut deletes) =
        (Document::new(), Document::new(), Document::new());
    let mut write_errors = Vec::new();
    for entry in batch.iter().filter_map(Bson::as_document) {
        let index = number(entry, "idx") as usize;
        if !retry_core::reply::is_ok(entry) {
            write_errors.push(Bson::Document(entry.clone()));
            continue;
        }
        let key = index.to_string();
        match models
            .get(index)
            .and_then(Bson::as_document)
            .and_then(|m| m.keys().next())
            .map(String::as_str)
        {
            Some("insertOne") => {
                if let Some(Some(id)) = inserted_ids.get(index) {
                    inserts.insert(key, doc! { "insertedId": id.clone() });
                }
            }
            Some("deleteOne" | "deleteMany") => {
                deletes.insert(key, doc! { "deletedCount": number(entry, "n") });
            }
            Some(_) => {
                let upserted = entry
                    .get_document("upserted")
                    .ok()
                    .and_then(|u| u.get("_id"))
                    .cloned();
                // The op's own `n` counts an upserted document (transactions
                // `client-bulkWrite.json`: an upsert reports matchedCount 1); the summary's
                // `nMatched` does not.
                let mut update = doc! {
                    "matchedCount": number(entry, "n"),
                    "modifiedCount": number(entry, "nModified"),
                };
                if let Some(id) = upserted {
                    update.insert("upsertedId", id);
                }
                updates.insert(key, update);
            }
            None => {
                return Err(Err(format!(
                    "a result for model {index}, which does not exist"
                )))
            }
        }
    }
    if verbose {
        result.insert("insertResults", inserts);
        result.insert("updateResults", updates);
        result.insert("deleteResults", deletes);
    }
    if !write_errors.is_empty() {
        let mut by_index = Document::new();
        for error in write_errors.iter().filter_map(Bson::as_document) {
            let mut entry = doc! { "message": error.get_str("errmsg").unwrap_or_default() };
            if let Some(code) = error.get("code") {
                entry.insert("code", code.clone());
            }
            by_index.insert(number(error, "idx").to_string(), entry);
        }
        let mut failure =
            Failure::write_errors(&reply, &write_errors, Some(Bson::Document(result)));
        failure.write_errors = Some(by_index);
        return Err(Ok(Box::new(failure)));
    }
    Ok(Produced::Value(Bson::Document(result)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRUD spec (transactions `errors-client.json`): updates need operators, replacements must
    /// not have them; a pipeline is an update.
    #[test]
    fn an_update_without_operators_or_a_replacement_with_them_is_a_client_error() {
        let update = Bson::Document(doc! { "$set": { "x": 1 } });
        let replacement = Bson::Document(doc! { "x": 1 });
        assert!(check_update("updateOne", &update).is_ok());
        assert!(check_update("updateMany", &Bson::Array(vec![])).is_ok());
        assert!(check_update("replaceOne", &replacement).is_ok());
        assert!(check_update("replaceOne", &Bson::Document(doc! {})).is_ok());
        for (name, bad) in [
            ("updateOne", &replacement),
            ("updateMany", &Bson::Document(doc! {})),
            ("replaceOne", &update),
            ("replaceOne", &Bson::Array(vec![])),
        ] {
            let error = check_update(name, bad).expect_err(name);
            assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
        }
    }

    /// Review5 item 14, UT-16: a cursor reply's Int32 id is the cursor's id, not 0 (which would
    /// count the cursor as exhausted and never kill it).
    #[test]
    fn ut16_an_int32_cursor_id_is_read_as_the_id() {
        let reply = doc! { "ok": 1, "cursor": { "id": 42_i32, "ns": "db.c", "firstBatch": [1] } };
        let (id, batch) = cursor_batch(&reply, "firstBatch").expect("a cursor reply");
        assert_eq!((id, batch.len()), (42, 1));
        let next = doc! { "ok": 1, "cursor": { "id": 0_i64, "nextBatch": [] } };
        assert_eq!(cursor_batch(&next, "nextBatch").map(|(id, _)| id), Ok(0));
        assert!(cursor_batch(&next, "firstBatch").is_err());
        assert!(cursor_batch(&doc! { "ok": 1 }, "firstBatch").is_err());
    }
}
