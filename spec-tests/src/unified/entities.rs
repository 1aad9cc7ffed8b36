//! UT-7..10: the entities of one test — product clients with their observed events, databases,
//! collections, cursors and saved values — and UT-8's event filters. Every event comes from the
//! product's own stream ([`retry_tokio::Events`]); the runner only filters and renames them.

use std::collections::BTreeMap;
use std::sync::Arc;

use bson::{doc, Bson, Document};
use retry_core::engine::{CommandEvent, CursorHandle, EngineEvent};
use retry_core::monitor::HeartbeatEvent;
use retry_core::pool::PoolEvent;
use retry_core::selection::ReadPreference;
use retry_core::topology::{SdamEvent, ServerType};
use retry_core::transaction::TransactionOptions;
use retry_driver::SessionOptions;
use serde_json::Value;

use super::deploy::Cluster;
use crate::json::to_bson;

/// An event kept for `expectEvents`, `waitForEvent` and `assertEventCount` (UT-21, UT-22).
#[derive(Clone, Debug)]
pub struct Observed {
    /// `command`, `cmap` or `sdam`.
    pub kind: &'static str,
    /// The unified format's event name, e.g. `commandStartedEvent`.
    pub name: &'static str,
    /// Its assertable fields (UT-22).
    pub body: Document,
}

/// A client entity: the product's tokio client and what it observed.
pub struct ClientEntity {
    /// The product client.
    pub client: retry_tokio::Client,
    events: retry_tokio::Events,
    observe: Vec<String>,
    ignore: Vec<String>,
    /// The observed events, in the product's order.
    pub observed: Vec<Observed>,
    /// Every started command (observed or not), for the lsid assertions.
    pub started: Vec<Document>,
    /// UT-8: connections checked out, from the product's CMAP events.
    pub checked_out: i64,
    /// The write concern its URI gives, inherited by its databases and collections.
    pub write_concern: Option<Document>,
}

impl ClientEntity {
    /// Takes the product's events delivered so far into `observed` (`UNIFIED_EVENTS=1` prints
    /// every one, a debugging aid).
    pub fn collect(&mut self) {
        for (_, event) in self.events.drain() {
            if std::env::var_os("UNIFIED_EVENTS").is_some() {
                println!("EVENT {event:?}");
            }
            self.take(event);
        }
    }

    fn take(&mut self, event: EngineEvent) {
        let Some((kind, name, body)) = convert(&event) else {
            return;
        };
        if let EngineEvent::Command(c) = &event {
            if let CommandEvent::Started { command, .. } = &**c {
                self.started.push(command.clone());
            }
        }
        match name {
            "connectionCheckedOutEvent" => self.checked_out += 1,
            "connectionCheckedInEvent" => self.checked_out -= 1,
            _ => {}
        }
        if kind == "command" {
            let command_name = body.get_str("commandName").unwrap_or_default();
            // UT-8: the fail points' own commands and the ignored ones are never observed.
            if command_name == "configureFailPoint" || self.ignore.iter().any(|i| i == command_name)
            {
                return;
            }
        }
        if self.observe.iter().any(|o| o == name) {
            self.observed.push(Observed { kind, name, body });
        }
    }
}

/// The unified format's name and fields of a product event; `None` for events the format has
/// no name for.
fn convert(event: &EngineEvent) -> Option<(&'static str, &'static str, Document)> {
    Some(match event {
        EngineEvent::Command(command) => {
            let (name, info, extra) = match &**command {
                CommandEvent::Started { info, command } => (
                    "commandStartedEvent",
                    info,
                    doc! { "command": command.clone() },
                ),
                CommandEvent::Succeeded { info, reply, .. } => (
                    "commandSucceededEvent",
                    info,
                    doc! { "reply": reply.clone() },
                ),
                CommandEvent::Failed { info, .. } => ("commandFailedEvent", info, doc! {}),
                _ => return None,
            };
            let mut body = extra;
            body.insert("commandName", info.command_name.clone());
            body.insert("databaseName", info.database_name.clone());
            body.insert("hasServiceId", info.service_id.is_some());
            body.insert("hasServerConnectionId", info.server_connection_id.is_some());
            ("command", name, body)
        }
        EngineEvent::Pool { event, .. } => {
            let (name, body) = match event {
                PoolEvent::PoolCreated => ("poolCreatedEvent", doc! {}),
                PoolEvent::PoolReady => ("poolReadyEvent", doc! {}),
                PoolEvent::PoolCleared {
                    service_id,
                    interrupt_in_use_connections,
                } => (
                    "poolClearedEvent",
                    doc! {
                        "hasServiceId": service_id.is_some(),
                        "interruptInUseConnections": *interrupt_in_use_connections,
                    },
                ),
                PoolEvent::PoolClosed => ("poolClosedEvent", doc! {}),
                PoolEvent::ConnectionCreated { .. } => ("connectionCreatedEvent", doc! {}),
                PoolEvent::ConnectionReady { .. } => ("connectionReadyEvent", doc! {}),
                PoolEvent::ConnectionClosed { reason, .. } => {
                    ("connectionClosedEvent", doc! { "reason": reason.as_str() })
                }
                PoolEvent::CheckOutStarted { .. } => ("connectionCheckOutStartedEvent", doc! {}),
                PoolEvent::CheckOutFailed { reason, .. } => (
                    "connectionCheckOutFailedEvent",
                    doc! { "reason": reason.as_str() },
                ),
                PoolEvent::CheckedOut { .. } => ("connectionCheckedOutEvent", doc! {}),
                PoolEvent::CheckedIn { .. } => ("connectionCheckedInEvent", doc! {}),
            };
            ("cmap", name, body)
        }
        EngineEvent::Topology(event) => {
            let (name, body) = match event {
                SdamEvent::TopologyOpening => ("topologyOpeningEvent", doc! {}),
                SdamEvent::ServerOpening { .. } => ("serverOpeningEvent", doc! {}),
                SdamEvent::ServerDescriptionChanged { previous, new, .. } => (
                    "serverDescriptionChangedEvent",
                    doc! {
                        "previousDescription": { "type": server_type(previous.server_type) },
                        "newDescription": { "type": server_type(new.server_type) },
                    },
                ),
                SdamEvent::ServerClosed { .. } => ("serverClosedEvent", doc! {}),
                SdamEvent::TopologyDescriptionChanged { previous, new } => (
                    "topologyDescriptionChangedEvent",
                    doc! {
                        "previousDescription": { "type": format!("{:?}", previous.topology_type) },
                        "newDescription": { "type": format!("{:?}", new.topology_type) },
                    },
                ),
                SdamEvent::TopologyClosed => ("topologyClosedEvent", doc! {}),
            };
            ("sdam", name, body)
        }
        // MO-15: every heartbeat event says whether its check was awaited (streaming).
        EngineEvent::Heartbeat { event, .. } => {
            let (name, awaited) = match event {
                HeartbeatEvent::Started { awaited } => ("serverHeartbeatStartedEvent", awaited),
                HeartbeatEvent::Succeeded { awaited, .. } => {
                    ("serverHeartbeatSucceededEvent", awaited)
                }
                HeartbeatEvent::Failed { awaited, .. } => ("serverHeartbeatFailedEvent", awaited),
                _ => return None,
            };
            ("sdam", name, doc! { "awaited": *awaited })
        }
        _ => return None,
    })
}

/// The unified format's name of a server type (SDAM).
fn server_type(kind: ServerType) -> &'static str {
    match kind {
        ServerType::Unknown => "Unknown",
        ServerType::Standalone => "Standalone",
        ServerType::Mongos => "Mongos",
        ServerType::RsPrimary => "RSPrimary",
        ServerType::RsSecondary => "RSSecondary",
        ServerType::RsArbiter => "RSArbiter",
        ServerType::RsOther => "RSOther",
        ServerType::RsGhost => "RSGhost",
        ServerType::LoadBalancer => "LoadBalancer",
    }
}

/// Options a database or collection entity carries (UT-9).
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// `writeConcern`, sent with its write commands.
    pub write_concern: Option<Document>,
    /// `readConcern`, sent with its read commands.
    pub read_concern: Option<Document>,
    /// `readPreference`: where its reads may run (the product adds `$readPreference`).
    pub read_preference: Option<ReadPreference>,
}

/// A cursor entity: `createFindCursor` / `createChangeStream` results.
pub struct CursorEntity {
    /// The client entity it runs on.
    pub client: String,
    /// Its database.
    pub db: String,
    /// The collection its `getMore`s name.
    pub collection: String,
    /// The server's cursor id; 0 once exhausted.
    pub id: i64,
    /// The product's handle, for getMore / killCursors routing.
    pub handle: Option<CursorHandle>,
    /// Documents received and not yet iterated.
    pub buffer: std::collections::VecDeque<Bson>,
    /// `batchSize` for its getMores.
    pub batch_size: Option<i32>,
    /// The explicit session it was opened in: its `getMore`s run in it (SE-14, TX-1).
    pub session: Option<Arc<Session>>,
}

/// The product's explicit session on tokio.
pub type Session = retry_driver::Session<retry_tokio::TokioRuntime>;

/// One entity of the map.
pub enum Entity {
    /// A client.
    Client(Box<ClientEntity>),
    /// A database on a client.
    Database {
        /// The client entity.
        client: String,
        /// The database name.
        name: String,
        /// Its options.
        options: Options,
    },
    /// A collection of a database.
    Collection {
        /// The client entity.
        client: String,
        /// The database name.
        db: String,
        /// The collection name.
        name: String,
        /// Its options (the database's, overridden by its own).
        options: Options,
    },
    /// A cursor or change stream.
    Cursor(Box<CursorEntity>),
    /// An explicit session of a client (UT-10); `None` once ended.
    Session {
        /// The client entity.
        client: String,
        /// The product's session.
        session: Option<Arc<Session>>,
        /// Its `lsid` once known (for `$$sessionLsid`, kept after it ended).
        lsid: Option<Document>,
    },
    /// A saved result.
    Value(Bson),
    /// A thread (UT-11): the operations started on it, each a task on the test's thread.
    Thread(Vec<tokio::task::JoinHandle<Result<(), String>>>),
}

/// UT-7: the entity map of one test.
#[derive(Default)]
pub struct Entities {
    /// By id.
    pub map: BTreeMap<String, Entity>,
    /// Whether the test may run `configureFailPoint`: its clients then check their servers every
    /// [`FAIL_POINT_HEARTBEAT_MS`] unless their `uriOptions` set `heartbeatFrequencyMS`.
    pub fail_points: bool,
}

/// UT-8: the `heartbeatFrequencyMS` of a client in a test that may set a fail point, unless the
/// client sets its own; the format allows a reduced value there to speed up SDAM recovery. It is
/// the lowest the product accepts (`minHeartbeatFrequencyMS`, MO-6). Without it a streaming
/// monitor (MO-9) rediscovers a server marked Unknown by a shutdown error only when its awaited
/// `hello` returns, 10 s later: an immediate-check request is ignored while a check is in
/// progress (MO-5).
pub const FAIL_POINT_HEARTBEAT_MS: u64 = 500;

/// Whether `test` may run `configureFailPoint` (`failPoint`, `targetedFailPoint`, or a command
/// run directly): any object in its operations with a `configureFailPoint` key.
pub fn may_set_fail_point(test: &Value) -> bool {
    fn walk(value: &Value, depth: usize) -> bool {
        if depth > 64 {
            return false;
        }
        match value {
            Value::Object(map) => {
                map.contains_key("configureFailPoint") || map.values().any(|v| walk(v, depth + 1))
            }
            Value::Array(items) => items.iter().any(|v| walk(v, depth + 1)),
            _ => false,
        }
    }
    test.get("operations").is_some_and(|o| walk(o, 0))
}

/// UT-8: the client options the runner refuses (removed from the format, or never supported).
const REFUSED_CLIENT_FIELDS: [&str; 3] =
    ["storeEventsAsEntities", "observeLogMessages", "serverApi"];

impl Entities {
    /// UT-7, UT-8, UT-9: creates every entity of a `createEntities` list, in order.
    pub async fn create(&mut self, list: &Value, cluster: &Cluster) -> Result<(), String> {
        let list = list.as_array().ok_or("createEntities must be an array")?;
        for item in list {
            let object = item.as_object().ok_or("an entity must be an object")?;
            let (kind, spec) = object.iter().next().ok_or("empty entity")?;
            let id = spec
                .get("id")
                .and_then(Value::as_str)
                .ok_or("an entity needs an id")?
                .to_owned();
            if self.map.contains_key(&id) {
                return Err(format!("entity {id} already exists"));
            }
            let entity = match kind.as_str() {
                "client" => {
                    let mut entity = client(spec, cluster, self.fail_points)?;
                    await_min_pool_size(&mut entity, spec, cluster).await?;
                    Entity::Client(Box::new(entity))
                }
                "database" => {
                    check_fields(spec, &["id", "client", "databaseName", "databaseOptions"])?;
                    let client = str_field(spec, "client")?;
                    let client_wc = self.client(&client)?.write_concern.clone();
                    let mut options = options(spec.get("databaseOptions"))?;
                    options.write_concern = options.write_concern.or(client_wc);
                    Entity::Database {
                        client,
                        name: str_field(spec, "databaseName")?,
                        options,
                    }
                }
                "collection" => {
                    check_fields(
                        spec,
                        &["id", "database", "collectionName", "collectionOptions"],
                    )?;
                    let database = str_field(spec, "database")?;
                    let Some(Entity::Database {
                        client,
                        name,
                        options: db_options,
                    }) = self.map.get(&database)
                    else {
                        return Err(format!("{database} is not a database entity"));
                    };
                    let own = options(spec.get("collectionOptions"))?;
                    Entity::Collection {
                        client: client.clone(),
                        db: name.clone(),
                        name: str_field(spec, "collectionName")?,
                        options: Options {
                            write_concern: own.write_concern.or(db_options.write_concern.clone()),
                            read_concern: own.read_concern.or(db_options.read_concern.clone()),
                            read_preference: own
                                .read_preference
                                .or(db_options.read_preference.clone()),
                        },
                    }
                }
                "session" => {
                    // UT-10: `sessionOptions`: causal consistency is always on in the product;
                    // `defaultTransactionOptions` and `defaultTimeoutMS` (TO-14) are the
                    // product's session options.
                    check_fields(spec, &["id", "client", "sessionOptions"])?;
                    let options = session_options(spec.get("sessionOptions"))?;
                    let client = str_field(spec, "client")?;
                    let session = self
                        .client(&client)?
                        .client
                        .start_session_with(options)
                        .await
                        .map_err(|e| format!("session {id}: {e}"))?;
                    Entity::Session {
                        client,
                        session: Some(Arc::new(session)),
                        lsid: None,
                    }
                }
                "thread" => {
                    check_fields(spec, &["id"])?;
                    Entity::Thread(Vec::new())
                }
                other => return Err(format!("entity type {other} is not supported")),
            };
            self.map.insert(id, entity);
        }
        Ok(())
    }

    /// The client entity `id`.
    pub fn client(&mut self, id: &str) -> Result<&mut ClientEntity, String> {
        match self.map.get_mut(id) {
            Some(Entity::Client(client)) => Ok(client),
            _ => Err(format!("{id} is not a client entity")),
        }
    }

    /// UT-10, UT-25: ends every session, then shuts every client down.
    pub async fn close(&mut self) {
        for entity in self.map.values_mut() {
            if let Entity::Session { session, .. } = entity {
                session.take();
            }
        }
        for entity in self.map.values() {
            match entity {
                Entity::Client(client) => client.client.shutdown().await,
                Entity::Thread(tasks) => tasks.iter().for_each(|t| t.abort()),
                _ => {}
            }
        }
        self.map.clear();
    }
}

/// UT-8 (schema 1.26): a client's `awaitMinPoolSizeMS`: waits, at most that long, until the pool
/// of every server the client connects to ([`Cluster::hosts`]: data-bearing servers, or the load
/// balancer) holds the `minPoolSize` of its `uriOptions` (ready connections, less the closed
/// ones); else the test fails. The events before are dropped, as the format says listeners
/// ignore them. Nothing to wait for without it or with `minPoolSize` 0.
async fn await_min_pool_size(
    entity: &mut ClientEntity,
    spec: &Value,
    cluster: &Cluster,
) -> Result<(), String> {
    let Some(limit) = spec.get("awaitMinPoolSizeMS") else {
        return Ok(());
    };
    let limit = limit
        .as_u64()
        .ok_or_else(|| format!("awaitMinPoolSizeMS must be a non-negative integer: {limit}"))?;
    let min = spec
        .get("uriOptions")
        .and_then(|o| o.get("minPoolSize"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    if min == 0 {
        return Ok(());
    }
    let multiple = spec
        .get("useMultipleMongoses")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let hosts = cluster.hosts(multiple);
    let mut open: BTreeMap<String, i64> = BTreeMap::new();
    let populated = |open: &BTreeMap<String, i64>| {
        hosts.iter().all(|h| {
            open.get(h)
                .is_some_and(|n| u64::try_from(*n).is_ok_and(|n| n >= min))
        })
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(limit);
    while !populated(&open) {
        let event = tokio::time::timeout_at(deadline, entity.events.next_event())
            .await
            .map_err(|_| {
                format!(
                    "awaitMinPoolSizeMS: the pools were not populated within {limit} ms: {open:?}"
                )
            })?
            .ok_or("awaitMinPoolSizeMS: the client's events ended")?;
        if let (_, EngineEvent::Pool { address, event }) = event {
            let change = match event {
                PoolEvent::ConnectionReady { .. } => 1,
                PoolEvent::ConnectionClosed { .. } => -1,
                _ => 0,
            };
            *open.entry(address.to_string()).or_default() += change;
        }
    }
    Ok(())
}

fn str_field(spec: &Value, key: &str) -> Result<String, String> {
    spec.get(key)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("entity field {key} missing or not a string"))
}

/// UT-14: an unknown field is an error, never ignored.
/// UT-10: a session's `sessionOptions`: `causalConsistency: true` (the product's only mode),
/// `defaultTransactionOptions` and `defaultTimeoutMS` (TO-14); anything else is refused.
fn session_options(value: Option<&Value>) -> Result<SessionOptions, String> {
    let Some(value) = value else {
        return Ok(SessionOptions::default());
    };
    let object = value
        .as_object()
        .ok_or("sessionOptions must be an object")?;
    let mut options = SessionOptions::default();
    for (key, value) in object {
        match key.as_str() {
            "causalConsistency" if value == &Value::Bool(true) => {}
            "defaultTransactionOptions" => {
                options = options.with_default_transaction_options(transaction_options(value)?);
            }
            "defaultTimeoutMS" => {
                let ms = value
                    .as_i64()
                    .ok_or("defaultTimeoutMS must be an integer")?;
                options = options
                    .with_default_timeout_ms(ms)
                    .map_err(|e| e.to_string())?;
            }
            other => return Err(format!("unsupported sessionOptions field {other}: {value}")),
        }
    }
    Ok(options)
}

/// TX-1: transaction options (`startTransaction` arguments, `defaultTransactionOptions`):
/// `readConcern`, `writeConcern`, `maxCommitTimeMS` (TO-6) and a `readPreference` of mode
/// primary (the product's only transaction read preference); anything else is refused.
pub fn transaction_options(value: &Value) -> Result<TransactionOptions, String> {
    let object = value
        .as_object()
        .ok_or("transaction options must be an object")?;
    let mut options = TransactionOptions::default();
    for (key, value) in object {
        if key == "maxCommitTimeMS" {
            let ms = value.as_i64().ok_or("maxCommitTimeMS must be an integer")?;
            options = options
                .with_max_commit_time_ms(ms)
                .map_err(|e| e.to_string())?;
            continue;
        }
        let document = match crate::json::to_bson(value)? {
            Bson::Document(d) => d,
            _ => return Err(format!("transaction option {key} must be a document")),
        };
        match key.as_str() {
            "readConcern" => options = options.with_read_concern(document),
            "writeConcern" => options = options.with_write_concern(wire_write_concern(document)?),
            "readPreference" if document.get_str("mode").ok() == Some("primary") => {}
            other => return Err(format!("unsupported transaction option {other}: {value}")),
        }
    }
    Ok(options)
}

/// UT-15: a test file's write concern (`w`, `journal`, `wtimeoutMS`) as sent on the wire (`w`,
/// `j`, `wtimeout`); another field is refused.
fn wire_write_concern(given: Document) -> Result<Document, String> {
    let mut wire = Document::new();
    for (key, value) in given {
        match key.as_str() {
            "w" => wire.insert("w", value),
            "journal" | "j" => wire.insert("j", value),
            "wtimeoutMS" | "wtimeout" => match value.as_i64().or(value.as_i32().map(i64::from)) {
                Some(ms) => wire.insert("wtimeout", ms),
                None => return Err(format!("writeConcern {key} must be an integer")),
            },
            other => return Err(format!("unsupported writeConcern field {other}")),
        };
    }
    Ok(wire)
}

fn check_fields(spec: &Value, known: &[&str]) -> Result<(), String> {
    let object = spec.as_object().ok_or("an entity must be an object")?;
    match object.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(format!("unsupported entity field {unknown}")),
        None => Ok(()),
    }
}

fn options(value: Option<&Value>) -> Result<Options, String> {
    let mut options = Options::default();
    let Some(value) = value else {
        return Ok(options);
    };
    let object = value.as_object().ok_or("options must be an object")?;
    for (key, value) in object {
        if key == "readPreference" {
            options.read_preference = Some(read_preference(value)?);
            continue;
        }
        let Bson::Document(document) = to_bson(value)? else {
            return Err(format!("{key} must be a document"));
        };
        match key.as_str() {
            "writeConcern" => options.write_concern = Some(wire_write_concern(document)?),
            "readConcern" => options.read_concern = Some(document),
            other => return Err(format!("unsupported database/collection option {other}")),
        }
    }
    Ok(options)
}

/// UT-9: a `readPreference` document (`mode` and optional `tagSets`, `maxStalenessSeconds`).
pub fn read_preference(value: &Value) -> Result<ReadPreference, String> {
    let object = value
        .as_object()
        .ok_or("readPreference must be an object")?;
    if let Some(key) = object
        .keys()
        .find(|k| !["mode", "tagSets", "maxStalenessSeconds"].contains(&k.as_str()))
    {
        return Err(format!("unsupported readPreference field {key}"));
    }
    let mut renamed = serde_json::Map::new();
    for (key, value) in object {
        let key = if key == "tagSets" {
            "tag_sets"
        } else {
            key.as_str()
        };
        renamed.insert(key.to_owned(), value.clone());
    }
    crate::json::read_preference(&Value::Object(renamed))?
}

/// UT-8: a product client on the deployment with the entity's `uriOptions` (and the reduced
/// [`FAIL_POINT_HEARTBEAT_MS`] when `fail_points` and they set no `heartbeatFrequencyMS`).
fn client(spec: &Value, cluster: &Cluster, fail_points: bool) -> Result<ClientEntity, String> {
    check_fields(
        spec,
        &[
            "id",
            "uriOptions",
            "useMultipleMongoses",
            "observeEvents",
            "ignoreCommandMonitoringEvents",
            "awaitMinPoolSizeMS",
        ],
    )
    .map_err(|e| {
        match REFUSED_CLIENT_FIELDS
            .iter()
            .find(|f| spec.get(**f).is_some())
        {
            Some(field) => format!("client {field} is not supported"),
            None => e,
        }
    })?;
    let multiple = spec
        .get("useMultipleMongoses")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let mut uri = cluster.uri(multiple);
    let mut write_concern = None;
    if let Some(options) = spec.get("uriOptions") {
        let options = options.as_object().ok_or("uriOptions must be an object")?;
        for (key, value) in options {
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Bool(b) => b.to_string(),
                Value::Number(n) => n.to_string(),
                other => return Err(format!("uriOptions.{key}: unsupported value {other}")),
            };
            if key == "w" {
                let w = to_bson(value)?;
                write_concern = Some(doc! { "w": w });
            }
            if !uri.ends_with('?') {
                uri.push('&');
            }
            uri.push_str(&format!("{key}={text}"));
        }
    }
    let sets_heartbeat = spec
        .get("uriOptions")
        .and_then(|o| o.get("heartbeatFrequencyMS"))
        .is_some();
    if fail_points && !sets_heartbeat {
        if !uri.ends_with('?') {
            uri.push('&');
        }
        uri.push_str(&format!("heartbeatFrequencyMS={FAIL_POINT_HEARTBEAT_MS}"));
    }
    let list = |key: &str| -> Vec<String> {
        spec.get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let options =
        retry_tokio::ClientOptions::parse(&uri).map_err(|e| format!("client {uri}: {e}"))?;
    // UT-8: an option the product ignores with a warning would make the test pass untested.
    if !options.warnings.is_empty() {
        return Err(format!(
            "client {uri}: options ignored: {:?}",
            options.warnings
        ));
    }
    let client = retry_tokio::Client::connect(options).map_err(|e| format!("client {uri}: {e}"))?;
    let events = client.events();
    Ok(ClientEntity {
        client,
        events,
        observe: list("observeEvents"),
        ignore: list("ignoreCommandMonitoringEvents"),
        observed: Vec::new(),
        started: Vec::new(),
        checked_out: 0,
        write_concern,
    })
}
