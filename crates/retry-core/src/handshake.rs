//! The connection handshake: the `hello` / legacy hello command every new socket sends first, with
//! the client metadata, and the validation of its reply.
//!
//! The command goes over OP_MSG to `admin` in every case (HS-2). Its reply is parsed into a
//! [`ServerDescription`] by the SDAM rules of the [`crate::topology`] module; this module
//! adds what only the connection needs (size limits, the negotiated compressor, `helloOk`) and the
//! checks that fail the handshake: `ok: 0`, no `serviceId` in load-balanced mode (LB-8) and a wire
//! version range that does not overlap ours (SDAM).
//!
//! Nothing here reads the environment: the operating system, platform and FaaS / container facts
//! are data the caller passes in ([`OsInfo`], [`EnvInfo::detect`]).

use alloc::string::String;
use alloc::vec::Vec;
use bson::oid::ObjectId;
use bson::{doc, Bson, Document};
use core::fmt;
use core::time::Duration;

use crate::address::ServerAddress;
use crate::error::{ErrorKind, Labels, OperationError};
use crate::time::Instant;
use crate::topology::{self, CheckError, ServerDescription};
use crate::wire::{DEFAULT_MAX_MESSAGE_SIZE_BYTES, MIN_MESSAGE_LEN};

/// HS-6: the encoded `client` document, BSON overhead included, is at most this many bytes.
pub const MAX_CLIENT_METADATA_BYTES: usize = 512;

/// HS-5: `client.application.name` is at most this many bytes (the string alone).
pub const MAX_APPLICATION_NAME_BYTES: usize = 128;

/// HS-4, C5: the value of the handshake's `backpressure` field, a string naming the version of the
/// client-backpressure spec this engine follows.
pub const BACKPRESSURE_VERSION: &str = "2";

/// LB-8: the error message when a load-balanced handshake reply has no `serviceId`.
pub const LOAD_BALANCER_UNSUPPORTED: &str =
    "Driver attempted to initialize in load balancing mode, but the server does not support this mode.";

/// HS-7: the delimiter between appended driver-info values.
pub const DRIVER_INFO_DELIMITER: char = '|';

/// WP-7: `maxBsonObjectSize` when the reply has none (16 MiB).
pub const DEFAULT_MAX_BSON_OBJECT_SIZE: u32 = 16 * 1024 * 1024;

/// WP-7: `maxWriteBatchSize` when the reply has none.
pub const DEFAULT_MAX_WRITE_BATCH_SIZE: u32 = 100_000;

/// Information a library wrapping the driver appends to the metadata (HS-7, `DriverInfoOptions`).
///
/// An empty string counts as unset; two values are equal when they would produce the same
/// metadata.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DriverInfo {
    /// The wrapping library's name.
    pub name: String,
    /// Its version.
    pub version: Option<String>,
    /// Its platform details.
    pub platform: Option<String>,
}

impl DriverInfo {
    /// The same information with empty strings turned into unset fields (HS-7).
    fn normalized(&self) -> (Option<&str>, Option<&str>, Option<&str>) {
        fn set(s: Option<&str>) -> Option<&str> {
            s.filter(|s| !s.is_empty())
        }
        (
            set(Some(&self.name)),
            set(self.version.as_deref()),
            set(self.platform.as_deref()),
        )
    }
}

/// `client.os` (HS-5): `type` is required and is `"unknown"` when it cannot be found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsInfo {
    /// `os.type`, e.g. `"Linux"` (`uname -s`).
    pub os_type: String,
    /// `os.name`, e.g. a distribution's pretty name.
    pub name: Option<String>,
    /// `os.architecture`, e.g. `"x86_64"` (`uname -m`).
    pub architecture: Option<String>,
    /// `os.version`.
    pub version: Option<String>,
}

impl Default for OsInfo {
    /// HS-5: an unknown operating system.
    fn default() -> OsInfo {
        OsInfo {
            os_type: String::from("unknown"),
            name: None,
            architecture: None,
            version: None,
        }
    }
}

/// `client.env` (HS-5): the FaaS and container facts of the process.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct EnvInfo {
    /// `env.name`: `aws.lambda`, `azure.func`, `gcp.func` or `vercel`.
    pub name: Option<String>,
    /// `env.timeout_sec`.
    pub timeout_sec: Option<i32>,
    /// `env.memory_mb`.
    pub memory_mb: Option<i32>,
    /// `env.region`.
    pub region: Option<String>,
    /// `env.container.runtime` (`"docker"`).
    pub container_runtime: Option<String>,
    /// `env.container.orchestrator` (`"kubernetes"`).
    pub container_orchestrator: Option<String>,
}

impl EnvInfo {
    /// HS-5: derives `client.env` from environment variables, looked up through `var`, and from
    /// whether `/.dockerenv` exists. The caller does the reading; this applies the rules.
    ///
    /// The FaaS name comes from which provider's variables are set (non-empty): `aws.lambda`
    /// (`AWS_EXECUTION_ENV` starting with `AWS_Lambda_`, or `AWS_LAMBDA_RUNTIME_API`), `azure.func`
    /// (`FUNCTIONS_WORKER_RUNTIME`), `gcp.func` (`K_SERVICE` or `FUNCTION_NAME`), `vercel`
    /// (`VERCEL`). Vercel wins over AWS; any other combination omits every FaaS field. Values of the
    /// wrong type are dropped quietly. `None` when no field would be set.
    pub fn detect(var: impl Fn(&str) -> Option<String>, dockerenv_exists: bool) -> Option<EnvInfo> {
        let get = |name: &str| var(name).filter(|v| !v.is_empty());
        let int = |name: &str| get(name).and_then(|v| v.parse::<i32>().ok());
        let aws = get("AWS_EXECUTION_ENV").is_some_and(|v| v.starts_with("AWS_Lambda_"))
            || get("AWS_LAMBDA_RUNTIME_API").is_some();
        let azure = get("FUNCTIONS_WORKER_RUNTIME").is_some();
        let gcp = get("K_SERVICE").is_some() || get("FUNCTION_NAME").is_some();
        let vercel = get("VERCEL").is_some();
        let mut env = EnvInfo::default();
        match (aws, azure, gcp, vercel) {
            (true, false, false, false) => {
                env.name = Some("aws.lambda".into());
                env.region = get("AWS_REGION");
                env.memory_mb = int("AWS_LAMBDA_FUNCTION_MEMORY_SIZE");
            }
            (false, true, false, false) => env.name = Some("azure.func".into()),
            (false, false, true, false) => {
                env.name = Some("gcp.func".into());
                env.memory_mb = int("FUNCTION_MEMORY_MB");
                env.timeout_sec = int("FUNCTION_TIMEOUT_SEC");
                env.region = get("FUNCTION_REGION");
            }
            (_, false, false, true) => {
                env.name = Some("vercel".into());
                env.region = get("VERCEL_REGION");
            }
            _ => {}
        }
        if dockerenv_exists {
            env.container_runtime = Some("docker".into());
        }
        if get("KUBERNETES_SERVICE_HOST").is_some() {
            env.container_orchestrator = Some("kubernetes".into());
        }
        (env != EnvInfo::default()).then_some(env)
    }

    fn to_document(&self, name_only: bool) -> Document {
        let mut d = Document::new();
        if let Some(name) = &self.name {
            d.insert("name", name.as_str());
        }
        if name_only {
            return d;
        }
        if let Some(v) = self.timeout_sec {
            d.insert("timeout_sec", v);
        }
        if let Some(v) = self.memory_mb {
            d.insert("memory_mb", v);
        }
        if let Some(v) = &self.region {
            d.insert("region", v.as_str());
        }
        let mut container = Document::new();
        if let Some(v) = &self.container_runtime {
            container.insert("runtime", v.as_str());
        }
        if let Some(v) = &self.container_orchestrator {
            container.insert("orchestrator", v.as_str());
        }
        if !container.is_empty() {
            d.insert("container", container);
        }
        d
    }
}

/// Why client metadata could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetadataError {
    /// HS-5: `application.name` is longer than [`MAX_APPLICATION_NAME_BYTES`].
    ApplicationNameTooLong(usize),
    /// HS-7: a driver-info value contains [`DRIVER_INFO_DELIMITER`].
    DelimiterInDriverInfo(String),
    /// HS-6: even after every truncation step the `client` document is over
    /// [`MAX_CLIENT_METADATA_BYTES`] (the driver name, version or application name is too long).
    TooLarge(usize),
}

impl fmt::Display for MetadataError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MetadataError::ApplicationNameTooLong(n) => write!(
                f,
                "application name is {n} bytes; the limit is {MAX_APPLICATION_NAME_BYTES}"
            ),
            MetadataError::DelimiterInDriverInfo(v) => write!(
                f,
                "driver info {v:?} contains the delimiter '{DRIVER_INFO_DELIMITER}'"
            ),
            MetadataError::TooLarge(n) => write!(
                f,
                "client metadata is {n} bytes after truncation; the limit is {MAX_CLIENT_METADATA_BYTES}"
            ),
        }
    }
}

impl core::error::Error for MetadataError {}

/// The `client` document of the handshake (HS-5), built once per client and fitted to 512 bytes
/// when a connection's handshake is built (HS-6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientMetadata {
    application_name: Option<String>,
    driver_name: String,
    driver_version: String,
    os: OsInfo,
    platform: Option<String>,
    env: Option<EnvInfo>,
    appended: Vec<DriverInfo>,
}

impl ClientMetadata {
    /// Metadata for a driver called `driver_name` at `driver_version`, on an unknown OS.
    pub fn new(
        driver_name: impl Into<String>,
        driver_version: impl Into<String>,
    ) -> ClientMetadata {
        ClientMetadata {
            application_name: None,
            driver_name: driver_name.into(),
            driver_version: driver_version.into(),
            os: OsInfo::default(),
            platform: None,
            env: None,
            appended: Vec::new(),
        }
    }

    /// MO-7, HS-5: whether the process runs in a FaaS environment (`env.name` is set), where
    /// `serverMonitoringMode=auto` polls.
    pub fn is_faas(&self) -> bool {
        self.env.as_ref().is_some_and(|env| env.name.is_some())
    }

    /// Sets `application.name` (the `appName` option); HS-5: more than 128 bytes is an error.
    pub fn with_application_name(
        mut self,
        name: impl Into<String>,
    ) -> Result<ClientMetadata, MetadataError> {
        let name = name.into();
        if name.len() > MAX_APPLICATION_NAME_BYTES {
            return Err(MetadataError::ApplicationNameTooLong(name.len()));
        }
        self.application_name = Some(name);
        Ok(self)
    }

    /// Sets `os`.
    pub fn with_os(mut self, os: OsInfo) -> ClientMetadata {
        self.os = os;
        self
    }

    /// Sets `platform` (put the most important facts first: HS-6 may truncate its end).
    pub fn with_platform(mut self, platform: impl Into<String>) -> ClientMetadata {
        self.platform = Some(platform.into());
        self
    }

    /// Sets `env` (see [`EnvInfo::detect`]).
    pub fn with_env(mut self, env: EnvInfo) -> ClientMetadata {
        self.env = Some(env);
        self
    }

    /// HS-7: appends a wrapping library's name, version and platform to `driver.name`,
    /// `driver.version` and `platform`, separated by `|`. Empty values count as unset; info equal
    /// to info already appended is ignored; a value containing `|` is an error. Affects handshakes
    /// built afterwards only.
    pub fn append_driver_info(&mut self, info: DriverInfo) -> Result<(), MetadataError> {
        let (name, version, platform) = info.normalized();
        for value in [name, version, platform].into_iter().flatten() {
            if value.contains(DRIVER_INFO_DELIMITER) {
                return Err(MetadataError::DelimiterInDriverInfo(value.into()));
            }
        }
        let new = info.normalized();
        if self.appended.iter().any(|old| old.normalized() == new) {
            return Ok(());
        }
        self.appended.push(info);
        Ok(())
    }

    fn joined<'a>(
        base: Option<&'a str>,
        appended: impl Iterator<Item = Option<&'a str>>,
    ) -> Option<String> {
        let mut out: Option<String> = base.map(String::from);
        for value in appended.flatten() {
            match &mut out {
                Some(s) => {
                    s.push(DRIVER_INFO_DELIMITER);
                    s.push_str(value);
                }
                None => out = Some(value.into()),
            }
        }
        out
    }

    /// HS-5, HS-6: the `client` document, reduced until it encodes to at most 512 bytes by, in
    /// order and cumulatively: keeping only `env.name`; keeping only `os.type`; dropping `env`;
    /// truncating `platform`.
    pub fn to_document(&self) -> Result<Document, MetadataError> {
        let name = ClientMetadata::joined(
            Some(&self.driver_name),
            self.appended.iter().map(|i| i.normalized().0),
        )
        .unwrap_or_default();
        let version = ClientMetadata::joined(
            Some(&self.driver_version),
            self.appended.iter().map(|i| i.normalized().1),
        )
        .unwrap_or_default();
        let platform = ClientMetadata::joined(
            self.platform.as_deref().filter(|p| !p.is_empty()),
            self.appended.iter().map(|i| i.normalized().2),
        );
        let build = |step: u8, platform: Option<&str>| {
            let mut d = Document::new();
            if let Some(app) = &self.application_name {
                d.insert("application", doc! { "name": app.as_str() });
            }
            d.insert(
                "driver",
                doc! { "name": name.as_str(), "version": version.as_str() },
            );
            let mut os = doc! { "type": self.os.os_type.as_str() };
            if step < 2 {
                for (key, value) in [
                    ("name", &self.os.name),
                    ("architecture", &self.os.architecture),
                    ("version", &self.os.version),
                ] {
                    if let Some(v) = value {
                        os.insert(key, v.as_str());
                    }
                }
            }
            d.insert("os", os);
            if let Some(p) = platform {
                d.insert("platform", p);
            }
            if let Some(env) = self.env.as_ref().filter(|_| step < 3) {
                let env = env.to_document(step >= 1);
                if !env.is_empty() {
                    d.insert("env", env);
                }
            }
            d
        };
        for step in 0..3 {
            let d = build(step, platform.as_deref());
            if encoded_len(&d) <= MAX_CLIENT_METADATA_BYTES {
                return Ok(d);
            }
        }
        let d = build(3, platform.as_deref());
        let size = encoded_len(&d);
        if size <= MAX_CLIENT_METADATA_BYTES {
            return Ok(d);
        }
        // Step 4: cut the platform by the excess, on a character boundary.
        let Some(p) = platform.as_deref() else {
            return Err(MetadataError::TooLarge(size));
        };
        let mut keep = p.len().saturating_sub(size - MAX_CLIENT_METADATA_BYTES);
        while !p.is_char_boundary(keep) {
            keep -= 1;
        }
        let d = build(3, (keep > 0).then(|| &p[..keep]));
        match encoded_len(&d) {
            size if size <= MAX_CLIENT_METADATA_BYTES => Ok(d),
            size => Err(MetadataError::TooLarge(size)),
        }
    }
}

/// The encoded size of a document (its int32 length prefix); 0 if it does not encode.
fn encoded_len(d: &Document) -> usize {
    d.to_vec().map(|v| v.len()).unwrap_or(usize::MAX)
}

/// The Stable API version a client declares (versioned-API spec); when set, the handshake uses
/// `hello` (HS-2) and every command the engine sends carries these fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerApi {
    /// `apiVersion`, e.g. `"1"`.
    pub version: String,
    /// `apiStrict`, when set.
    pub strict: Option<bool>,
    /// `apiDeprecationErrors`, when set.
    pub deprecation_errors: Option<bool>,
}

impl ServerApi {
    /// The command fields of a declared version, in their wire order (versioned-api spec,
    /// "Command Syntax"): `version`, `strict`, `deprecationErrors`.
    pub(crate) const KEYS: [&'static str; 3] = ["apiVersion", "apiStrict", "apiDeprecationErrors"];

    /// The command fields of this version (versioned-api spec): `apiVersion`, then `apiStrict`
    /// and `apiDeprecationErrors` when set, even to the server's default. The handshake (HS-2)
    /// and, through the engine and [`Authentication`](crate::auth::Authentication), every other
    /// command carry them ([`insert_api_fields`]).
    pub(crate) fn fields(&self) -> Document {
        let [version, strict, deprecation_errors] = ServerApi::KEYS;
        let mut fields = Document::new();
        fields.insert(version, self.version.as_str());
        if let Some(value) = self.strict {
            fields.insert(strict, value);
        }
        if let Some(value) = self.deprecation_errors {
            fields.insert(deprecation_errors, value);
        }
        fields
    }
}

/// LB-7 with HS-2: whether a server refuses every handshake of a client with `load_balanced`
/// and the declared version `api`: a load-balanced hello carries `loadBalanced: true` (LB-7), an
/// unstable field of the server's hello command (hello.idl, `stability: unstable`), which a
/// server refuses under `apiStrict: true` (APIStrictError, 323). The one rule behind
/// [`EngineError::LoadBalancedStrictApi`](crate::engine::EngineError::LoadBalancedStrictApi) and
/// a client's check of its options before it makes an engine.
pub fn load_balanced_refused(load_balanced: bool, api: Option<&ServerApi>) -> bool {
    load_balanced && api.is_some_and(|api| api.strict == Some(true))
}

/// Adds a declared version's `fields` ([`ServerApi::fields`]) to `command`, each replacing a
/// field of the same name (versioned-api spec: the client's version, never the command's).
pub(crate) fn insert_api_fields(fields: &Document, command: &mut Document) {
    for (key, value) in fields {
        command.insert(key.clone(), value.clone());
    }
}

/// What a connection's handshake command depends on. Made with [`HandshakeOptions::new`] (or
/// `Default`); every field may then be changed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandshakeOptions {
    /// The client metadata.
    pub metadata: ClientMetadata,
    /// `loadBalanced=true` (LB-1).
    pub load_balanced: bool,
    /// The declared Stable API version, if any.
    pub server_api: Option<ServerApi>,
    /// The compressors the client offers, in preference order; empty for none (HS-4). The server
    /// may then compress any reply, the handshake's included (WP-8). Through the
    /// [`Engine`](crate::engine::Engine) leave it empty (or offer only `noop`, which the decoder
    /// unwraps itself): the engine builds its connections with no
    /// [`Decompressor`](crate::wire::Decompressor) (it carries no compression library), so a
    /// reply compressed with `snappy`, `zlib` or `zstd` would fail its connection with a decode
    /// error (review32 R19). A [`Connection`](crate::connection::Connection) driven directly
    /// takes one in [`ConnectionConfig::decompressor`](
    /// crate::connection::ConnectionConfig::decompressor).
    pub compressors: Vec<String>,
}

impl Default for HandshakeOptions {
    fn default() -> HandshakeOptions {
        HandshakeOptions::new()
    }
}

impl HandshakeOptions {
    /// Options for a driver named `retry-core` at this crate's version (replace
    /// [`HandshakeOptions::metadata`] with your driver's), not load-balanced, no Stable API
    /// version, no compression.
    pub fn new() -> HandshakeOptions {
        HandshakeOptions {
            metadata: ClientMetadata::new("retry-core", env!("CARGO_PKG_VERSION")),
            load_balanced: false,
            server_api: None,
            compressors: Vec::new(),
        }
    }

    /// HS-2: `hello` when a Stable API version is declared or in load-balanced mode, else legacy
    /// hello.
    pub fn uses_hello(&self) -> bool {
        self.server_api.is_some() || self.load_balanced
    }

    /// HS-2, HS-4, LB-7: the handshake command, for OP_MSG to `admin`.
    ///
    /// `{hello: 1}` or `{isMaster: 1, helloOk: true}`, then `backpressure: "2"`, `client`,
    /// `compression` (when compressors are configured), `loadBalanced: true` (load-balanced mode
    /// only), the Stable API fields, and `$db: "admin"`.
    pub fn command(&self) -> Result<Document, MetadataError> {
        let mut cmd = if self.uses_hello() {
            doc! { "hello": 1 }
        } else {
            doc! { "isMaster": 1, "helloOk": true }
        };
        cmd.insert("backpressure", BACKPRESSURE_VERSION);
        cmd.insert("client", self.metadata.to_document()?);
        if !self.compressors.is_empty() {
            cmd.insert(
                "compression",
                self.compressors
                    .iter()
                    .map(|c| Bson::String(c.clone()))
                    .collect::<Vec<_>>(),
            );
        }
        if self.load_balanced {
            cmd.insert("loadBalanced", true);
        }
        if let Some(api) = &self.server_api {
            insert_api_fields(&api.fields(), &mut cmd);
        }
        cmd.insert("$db", "admin");
        Ok(cmd)
    }
}

/// What a successful handshake tells the connection and the pool.
#[derive(Clone, Debug, PartialEq)]
pub struct HandshakeReply {
    /// The server as SDAM describes it, from this reply.
    pub description: ServerDescription,
    /// `serviceId`: in load-balanced mode, the service behind the balancer (LB-14, CM-5).
    pub service_id: Option<ObjectId>,
    /// WP-7: this connection's `maxMessageSizeBytes`.
    pub max_message_size_bytes: u32,
    /// WP-7: this connection's `maxBsonObjectSize`.
    pub max_bson_object_size: u32,
    /// WP-7: this connection's `maxWriteBatchSize`.
    pub max_write_batch_size: u32,
    /// HS-3: the legacy reply said `helloOk: true`, so monitoring may use `hello`.
    pub hello_ok: bool,
    /// HS-4: the negotiated compressor, `compression[0]` of the reply.
    pub compressor: Option<String>,
    /// EV-2: the reply's `connectionId`, the server's id for this connection (an integer; absent or
    /// not an integer: none).
    pub server_connection_id: Option<i64>,
}

/// Why a handshake reply is rejected.
#[derive(Clone, Debug, PartialEq)]
pub enum HandshakeError {
    /// The server answered with an error (`ok: 0`), with its labels.
    Server(OperationError),
    /// A reply field has the wrong type.
    Malformed(CheckError),
    /// LB-8: load-balanced mode, and the reply has no `serviceId`.
    LoadBalancerUnsupported,
    /// SDAM: the server's wire-version range does not overlap ours.
    IncompatibleWireVersion(String),
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandshakeError::Server(e) => write!(f, "{e}"),
            HandshakeError::Malformed(e) => write!(f, "{e}"),
            HandshakeError::LoadBalancerUnsupported => f.write_str(LOAD_BALANCER_UNSUPPORTED),
            HandshakeError::IncompatibleWireVersion(m) => f.write_str(m),
        }
    }
}

impl core::error::Error for HandshakeError {}

impl HandshakeError {
    /// The error the operation waiting for this connection sees. A server error keeps its own
    /// labels; a rejected reply is an [`ErrorKind::Handshake`] error with no labels (HS-9: only
    /// network errors and timeouts of the handshake carry the overload labels).
    pub fn into_operation_error(self, address: &ServerAddress) -> OperationError {
        match self {
            HandshakeError::Server(e) => e,
            other => OperationError {
                kind: ErrorKind::Handshake {
                    message: alloc::format!("{other}"),
                },
                labels: Labels::NONE,
                address: Some(address.clone()),
            },
        }
    }
}

/// Validates a handshake reply from `address`, received `round_trip` after the command was queued,
/// at `now`.
///
/// In order: an error reply (`ok` not 1) fails with the server's error; a reply SDAM cannot parse
/// fails as malformed; in load-balanced mode a reply without `serviceId` fails with
/// [`LOAD_BALANCER_UNSUPPORTED`] (LB-8); a wire-version range that does not overlap
/// [`topology::MIN_SUPPORTED_WIRE_VERSION`]..=[`topology::MAX_SUPPORTED_WIRE_VERSION`] fails
/// (SDAM). Otherwise the reply becomes a [`HandshakeReply`].
pub fn validate_reply(
    reply: &Document,
    address: &ServerAddress,
    load_balanced: bool,
    round_trip: Duration,
    now: Instant,
) -> Result<HandshakeReply, HandshakeError> {
    validate_reply_of(reply, address, load_balanced, round_trip, now, true)
}

/// [`validate_reply`], checking the wire-version range only when `wire_versions` is true: a
/// monitor's connection leaves the incompatibility to SDAM, which records it in the topology
/// (SS-16 step 2, review32 R3).
pub(crate) fn validate_reply_of(
    reply: &Document,
    address: &ServerAddress,
    load_balanced: bool,
    round_trip: Duration,
    now: Instant,
    wire_versions: bool,
) -> Result<HandshakeReply, HandshakeError> {
    if let Some(error) = OperationError::from_reply(reply, address) {
        return Err(HandshakeError::Server(error));
    }
    let mut description = ServerDescription::from_hello(address.clone(), reply, round_trip, now);
    if let Some(error) = description.error.take() {
        return Err(HandshakeError::Malformed(error));
    }
    if load_balanced && description.service_id.is_none() {
        return Err(HandshakeError::LoadBalancerUnsupported);
    }
    if let Some(message) = topology::incompatibility(&description).filter(|_| wire_versions) {
        return Err(HandshakeError::IncompatibleWireVersion(message));
    }
    let max_message_size_bytes =
        limit(reply, "maxMessageSizeBytes", DEFAULT_MAX_MESSAGE_SIZE_BYTES)?
            .clamp(MIN_MESSAGE_LEN as u32, i32::MAX as u32);
    let compressor = match reply.get("compression") {
        None | Some(Bson::Null) => None,
        Some(Bson::Array(items)) => match items.first() {
            None => None,
            Some(Bson::String(s)) => Some(s.clone()),
            Some(_) => return Err(malformed("compression", "an array of strings")),
        },
        Some(_) => return Err(malformed("compression", "an array of strings")),
    };
    let hello_ok = match reply.get("helloOk") {
        None | Some(Bson::Null) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(_) => return Err(malformed("helloOk", "a boolean")),
    };
    let server_connection_id = match reply.get("connectionId") {
        Some(Bson::Int32(n)) => Some(i64::from(*n)),
        Some(Bson::Int64(n)) => Some(*n),
        Some(Bson::Double(n)) if n.fract() == 0.0 && n.abs() < 9.0e15 => Some(*n as i64),
        _ => None,
    };
    Ok(HandshakeReply {
        server_connection_id,
        service_id: description.service_id,
        max_message_size_bytes,
        max_bson_object_size: limit(reply, "maxBsonObjectSize", DEFAULT_MAX_BSON_OBJECT_SIZE)?,
        max_write_batch_size: limit(reply, "maxWriteBatchSize", DEFAULT_MAX_WRITE_BATCH_SIZE)?,
        hello_ok,
        compressor,
        description,
    })
}

fn malformed(field: &'static str, expected: &'static str) -> HandshakeError {
    HandshakeError::Malformed(CheckError::MalformedHello { field, expected })
}

/// A positive size limit from the reply (int32, int64 or integral double), `default` when absent.
fn limit(reply: &Document, field: &'static str, default: u32) -> Result<u32, HandshakeError> {
    let value = match reply.get(field) {
        None | Some(Bson::Null) => return Ok(default),
        Some(Bson::Int32(v)) => i64::from(*v),
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Double(v)) if v.fract() == 0.0 && v.abs() < 9.0e15 => *v as i64,
        Some(_) => return Err(malformed(field, "a positive integer")),
    };
    u32::try_from(value)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| malformed(field, "a positive integer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::ServerType;

    fn metadata() -> ClientMetadata {
        ClientMetadata::new("retry-core", "0.1.0")
    }

    fn options(load_balanced: bool, server_api: Option<ServerApi>) -> HandshakeOptions {
        HandshakeOptions {
            metadata: metadata(),
            load_balanced,
            server_api,
            compressors: Vec::new(),
        }
    }

    fn client() -> Document {
        doc! { "driver": { "name": "retry-core", "version": "0.1.0" }, "os": { "type": "unknown" } }
    }

    #[test]
    fn hs2_hs4_legacy_hello_with_hello_ok_and_backpressure_string_to_admin() {
        let cmd = options(false, None).command().unwrap();
        let expected = doc! {
            "isMaster": 1, "helloOk": true, "backpressure": "2", "client": client(), "$db": "admin",
        };
        assert_eq!(cmd, expected);
        assert_eq!(cmd.get("backpressure"), Some(&Bson::String("2".into())));
    }

    #[test]
    fn hs2_lb7_hello_with_load_balanced_true_and_compression() {
        let mut opts = options(true, None);
        opts.compressors = vec!["zstd".into(), "zlib".into()];
        let expected = doc! {
            "hello": 1, "backpressure": "2", "client": client(),
            "compression": ["zstd", "zlib"], "loadBalanced": true, "$db": "admin",
        };
        assert_eq!(opts.command().unwrap(), expected);
    }

    #[test]
    fn hs2_stable_api_uses_hello_and_carries_the_api_fields() {
        let api = ServerApi {
            version: "1".into(),
            strict: Some(true),
            deprecation_errors: None,
        };
        let expected = doc! {
            "hello": 1, "backpressure": "2", "client": client(),
            "apiVersion": "1", "apiStrict": true, "$db": "admin",
        };
        assert_eq!(options(false, Some(api)).command().unwrap(), expected);
    }

    #[test]
    fn hs5_application_name_is_limited_to_128_bytes() {
        let ok = metadata().with_application_name("é".repeat(64)).unwrap();
        let d = ok.to_document().unwrap();
        assert_eq!(
            d.get_document("application")
                .unwrap()
                .get_str("name")
                .unwrap()
                .len(),
            128
        );
        assert_eq!(
            metadata().with_application_name("a".repeat(129)),
            Err(MetadataError::ApplicationNameTooLong(129))
        );
    }

    fn driver_fields(m: &ClientMetadata) -> (String, String, Option<String>) {
        let d = m.to_document().unwrap();
        let driver = d.get_document("driver").unwrap();
        (
            driver.get_str("name").unwrap().into(),
            driver.get_str("version").unwrap().into(),
            d.get_str("platform").ok().map(String::from),
        )
    }

    fn info(name: &str, version: Option<&str>, platform: Option<&str>) -> DriverInfo {
        DriverInfo {
            name: name.into(),
            version: version.map(String::from),
            platform: platform.map(String::from),
        }
    }

    #[test]
    fn hs7_wrapping_libraries_append_with_a_pipe_and_unset_fields_stay_unchanged() {
        let mut m = metadata().with_platform("rustc");
        m.append_driver_info(info("library", Some("1.2"), Some("Library Platform")))
            .unwrap();
        m.append_driver_info(info("framework", None, Some("")))
            .unwrap();
        assert_eq!(
            driver_fields(&m),
            (
                "retry-core|library|framework".into(),
                "0.1.0|1.2".into(),
                Some("rustc|Library Platform".into())
            )
        );
    }

    #[test]
    fn hs7_duplicate_driver_info_is_a_no_op_even_after_other_appends() {
        let mut m = metadata();
        m.append_driver_info(info("library", Some("1.2"), None))
            .unwrap();
        m.append_driver_info(info("framework", Some("1.2"), None))
            .unwrap();
        let before = m.to_document().unwrap();
        m.append_driver_info(info("library", Some("1.2"), Some("")))
            .unwrap();
        assert_eq!(m.to_document().unwrap(), before);
        assert_eq!(driver_fields(&m).0, "retry-core|library|framework");
    }

    #[test]
    fn hs7_a_value_containing_the_delimiter_is_an_error() {
        let mut m = metadata();
        assert_eq!(
            m.append_driver_info(info("a|b", None, None)),
            Err(MetadataError::DelimiterInDriverInfo("a|b".into()))
        );
        assert_eq!(driver_fields(&m).0, "retry-core");
    }

    fn full_env(region: &str) -> EnvInfo {
        EnvInfo {
            name: Some("aws.lambda".into()),
            timeout_sec: None,
            memory_mb: Some(1024),
            region: Some(region.into()),
            container_runtime: Some("docker".into()),
            container_orchestrator: None,
        }
    }

    fn os(name: &str) -> OsInfo {
        OsInfo {
            os_type: "Linux".into(),
            name: Some(name.into()),
            architecture: Some("x86_64".into()),
            version: None,
        }
    }

    #[test]
    fn hs6_fits_without_truncation_when_small() {
        let m = metadata()
            .with_os(os("Debian"))
            .with_env(full_env("us-east-2"));
        let d = m.to_document().unwrap();
        assert_eq!(
            d.get_document("env").unwrap(),
            &doc! { "name": "aws.lambda", "memory_mb": 1024, "region": "us-east-2",
            "container": { "runtime": "docker" } }
        );
        assert_eq!(d.get_document("os").unwrap().len(), 3);
    }

    #[test]
    fn hs6_step1_keeps_only_env_name() {
        let m = metadata()
            .with_os(os("Debian"))
            .with_env(full_env(&"a".repeat(512)));
        let d = m.to_document().unwrap();
        assert_eq!(
            d.get_document("env").unwrap(),
            &doc! { "name": "aws.lambda" }
        );
        assert_eq!(d.get_document("os").unwrap().len(), 3, "os untouched");
        assert!(d.to_vec().unwrap().len() <= MAX_CLIENT_METADATA_BYTES);
    }

    #[test]
    fn hs6_step2_keeps_only_os_type_and_step3_drops_env() {
        let m = metadata()
            .with_os(os(&"d".repeat(480)))
            .with_env(full_env("r"));
        let d = m.to_document().unwrap();
        assert_eq!(d.get_document("os").unwrap(), &doc! { "type": "Linux" });
        assert_eq!(
            d.get_document("env").unwrap(),
            &doc! { "name": "aws.lambda" }
        );

        let mut env = full_env("r");
        env.name = Some("n".repeat(480));
        let d = metadata()
            .with_os(os("Debian"))
            .with_env(env)
            .to_document()
            .unwrap();
        assert!(d.get("env").is_none());
        assert_eq!(d.get_document("os").unwrap(), &doc! { "type": "Linux" });
    }

    #[test]
    fn hs6_step4_truncates_platform_to_exactly_fit() {
        let m = metadata()
            .with_os(os("Debian"))
            .with_env(full_env("r"))
            .with_platform("p".repeat(1000));
        let d = m.to_document().unwrap();
        assert_eq!(d.to_vec().unwrap().len(), MAX_CLIENT_METADATA_BYTES);
        assert!(d.get("env").is_none());
        assert!(d.get_str("platform").unwrap().chars().all(|c| c == 'p'));
        // A multi-byte character is never split.
        let d = metadata()
            .with_platform("é".repeat(500))
            .to_document()
            .unwrap();
        assert!(d.to_vec().unwrap().len() <= MAX_CLIENT_METADATA_BYTES);
        assert!(d.get_str("platform").unwrap().chars().all(|c| c == 'é'));
    }

    #[test]
    fn hs6_too_large_after_every_step_is_an_error() {
        let m = ClientMetadata::new("n".repeat(600), "1");
        assert!(matches!(m.to_document(), Err(MetadataError::TooLarge(_))));
    }

    fn detect(vars: &[(&str, &str)], docker: bool) -> Option<EnvInfo> {
        EnvInfo::detect(
            |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| String::from(*v))
            },
            docker,
        )
    }

    #[test]
    fn hs5_faas_detection_rules() {
        let aws = detect(
            &[
                ("AWS_EXECUTION_ENV", "AWS_Lambda_java8"),
                ("AWS_REGION", "us-east-2"),
                ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "1024"),
                ("KUBERNETES_SERVICE_HOST", "1"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(aws.name.as_deref(), Some("aws.lambda"));
        assert_eq!(
            (aws.memory_mb, aws.region.as_deref()),
            (Some(1024), Some("us-east-2"))
        );
        assert_eq!(aws.container_orchestrator.as_deref(), Some("kubernetes"));

        let gcp = detect(
            &[
                ("K_SERVICE", "s"),
                ("FUNCTION_MEMORY_MB", "1024"),
                ("FUNCTION_TIMEOUT_SEC", "60"),
                ("FUNCTION_REGION", "us-central1"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            (gcp.name.as_deref(), gcp.memory_mb, gcp.timeout_sec),
            (Some("gcp.func"), Some(1024), Some(60))
        );
        let azure = detect(&[("FUNCTIONS_WORKER_RUNTIME", "node")], false).unwrap();
        assert_eq!(azure.name.as_deref(), Some("azure.func"));
        // Vercel beats AWS; any other mix drops the FaaS fields.
        let vercel = detect(
            &[
                ("VERCEL", "1"),
                ("VERCEL_REGION", "cdg1"),
                ("AWS_LAMBDA_RUNTIME_API", "x"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            (vercel.name.as_deref(), vercel.region.as_deref()),
            (Some("vercel"), Some("cdg1"))
        );
        assert_eq!(
            detect(
                &[
                    ("AWS_EXECUTION_ENV", "AWS_Lambda_java8"),
                    ("FUNCTIONS_WORKER_RUNTIME", "node")
                ],
                false
            ),
            None
        );
        // A wrong type drops that field only; a non-Lambda AWS_EXECUTION_ENV is not AWS.
        let typed = detect(
            &[
                ("AWS_EXECUTION_ENV", "AWS_Lambda_java8"),
                ("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "big"),
            ],
            false,
        )
        .unwrap();
        assert_eq!(
            (typed.name.as_deref(), typed.memory_mb),
            (Some("aws.lambda"), None)
        );
        assert_eq!(detect(&[("AWS_EXECUTION_ENV", "EC2")], false), None);
        let docker = detect(&[], true).unwrap();
        assert_eq!(
            (docker.name, docker.container_runtime.as_deref()),
            (None, Some("docker"))
        );
    }

    fn addr() -> ServerAddress {
        ServerAddress::new("lb", 27017)
    }

    fn validate(reply: Document, load_balanced: bool) -> Result<HandshakeReply, HandshakeError> {
        validate_reply(
            &reply,
            &addr(),
            load_balanced,
            Duration::from_millis(3),
            Instant::from_millis(9),
        )
    }

    /// EV-2: `serverConnectionId` is the reply's `connectionId`, an integer of any BSON width.
    #[test]
    fn ev2_the_server_connection_id_is_the_replys_connection_id() {
        let reply = |id: Bson| {
            let mut d = doc! { "ok": 1, "isWritablePrimary": true, "minWireVersion": 0,
            "maxWireVersion": 21 };
            d.insert("connectionId", id);
            validate(d, false).unwrap().server_connection_id
        };
        assert_eq!(reply(Bson::Int32(7)), Some(7));
        assert_eq!(reply(Bson::Int64(1 << 40)), Some(1 << 40));
        assert_eq!(reply(Bson::Double(9.0)), Some(9));
        assert_eq!(reply(Bson::Double(9.5)), None);
        assert_eq!(reply(Bson::String("7".into())), None);
    }

    #[test]
    fn reply_becomes_a_description_with_the_connection_limits() {
        let r = validate(
            doc! { "ok": 1, "isWritablePrimary": true, "minWireVersion": 0, "maxWireVersion": 21,
            "maxMessageSizeBytes": 1000, "maxBsonObjectSize": 500, "maxWriteBatchSize": 10,
            "compression": ["zstd"], "helloOk": true },
            false,
        )
        .unwrap();
        assert_eq!(r.description.server_type, ServerType::Standalone);
        assert_eq!(r.description.max_wire_version, 21);
        assert_eq!(
            (
                r.max_message_size_bytes,
                r.max_bson_object_size,
                r.max_write_batch_size
            ),
            (1000, 500, 10)
        );
        assert_eq!((r.hello_ok, r.compressor.as_deref()), (true, Some("zstd")));
        let d = validate(doc! { "ok": 1, "maxWireVersion": 21 }, false).unwrap();
        assert_eq!(
            (
                d.max_message_size_bytes,
                d.max_bson_object_size,
                d.max_write_batch_size
            ),
            (48_000_000, 16 * 1024 * 1024, 100_000)
        );
    }

    #[test]
    fn lb8_missing_service_id_fails_with_the_exact_message() {
        let err = validate(
            doc! { "ok": 1, "msg": "isdbgrid", "maxWireVersion": 21 },
            true,
        )
        .unwrap_err();
        assert_eq!(err, HandshakeError::LoadBalancerUnsupported);
        let op = err.into_operation_error(&addr());
        assert_eq!(
            op.kind,
            ErrorKind::Handshake {
                message: "Driver attempted to initialize in load balancing mode, but the server does not support this mode.".into()
            }
        );
        assert_eq!(op.labels, Labels::NONE);
        assert!(!op.was_sent());
        let id = ObjectId::from_bytes([1; 12]);
        let ok = validate(
            doc! { "ok": 1, "msg": "isdbgrid", "maxWireVersion": 21, "serviceId": id },
            true,
        )
        .unwrap();
        assert_eq!(ok.service_id, Some(id));
    }

    #[test]
    fn error_replies_keep_the_server_error_and_labels() {
        let err = validate(
            doc! { "ok": 0, "code": 462, "errmsg": "busy",
            "errorLabels": ["SystemOverloadedError", "RetryableError"] },
            false,
        )
        .unwrap_err();
        let HandshakeError::Server(op) = err else {
            panic!("{err:?}")
        };
        assert_eq!(op.code(), Some(462));
        assert!(op.is_retryable_overload());
    }

    #[test]
    fn sdam_wire_version_ranges_must_overlap() {
        let old = validate(doc! { "ok": 1, "maxWireVersion": 7 }, false).unwrap_err();
        assert!(
            matches!(&old, HandshakeError::IncompatibleWireVersion(m) if m.contains("reports wire version 7")),
            "{old}"
        );
        let new = validate(
            doc! { "ok": 1, "minWireVersion": 99, "maxWireVersion": 99 },
            false,
        )
        .unwrap_err();
        assert!(
            matches!(&new, HandshakeError::IncompatibleWireVersion(m) if m.contains("requires wire version 99")),
            "{new}"
        );
    }

    #[test]
    fn malformed_fields_are_rejected_not_panicked_on() {
        for reply in [
            doc! { "ok": 1, "maxWireVersion": "x" },
            doc! { "ok": 1, "maxWireVersion": 21, "maxMessageSizeBytes": -1 },
            doc! { "ok": 1, "maxWireVersion": 21, "compression": "zstd" },
            doc! { "ok": 1, "maxWireVersion": 21, "helloOk": 1 },
        ] {
            assert!(matches!(
                validate(reply, false),
                Err(HandshakeError::Malformed(_))
            ));
        }
    }
}
