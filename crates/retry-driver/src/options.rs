//! Client options under the names of the MongoDB URI options, and `mongodb://` URIs.
//!
//! [`ClientOptions::parse`] reads a URI with [`ConnectionString::parse`] (the spec's syntax,
//! types, ranges and conflicts, URI-*) and then keeps what this client supports. Features it
//! does not have are errors that name them: authentication mechanisms other than SCRAM-SHA-256
//! and SCRAM-SHA-1 (yours go in [`ClientOptions::auth`]), Unix domain sockets, encrypted TLS
//! keys and SOCKS5 proxies. TLS is [`TlsOptions`]. A `mongodb+srv` URI is supported, but its
//! DNS lookups come first: `parse` refuses it with an error saying so, and
//! [`crate::Client::with_uri_async`] (or [`crate::resolve_seedlist`] then
//! [`ClientOptions::from_connection_string`]) makes them.
//!
//! As the URI-options spec allows (URI-7), `parse` ignores an unknown option or an invalid value
//! with a warning, kept in [`ClientOptions::warnings`]; so it ignores compression (URI-9:
//! compressors a client does not support are left out of the handshake) and the
//! single-threaded `serverSelectionTryOnce` (SS-1). [`ClientOptions::parse_strict`], which
//! [`crate::Client::with_uri`] uses, refuses every one of them instead, naming the option and
//! the value (house rule 11, review32 R1), and so a repeated option's earlier value and a
//! deprecated name shadowed by its replacement; a deprecated spelling it applies in full
//! (URI-8, URI-10) only warns (review34 Y3).

use core::fmt;
use core::time::Duration;
use std::hash::BuildHasher;

use bson::{Bson, Document};
use retry_core::address::ServerAddress;
use retry_core::auth::{AuthOptions, Credential};
use retry_core::connection::DEFAULT_CONNECT_TIMEOUT;
use retry_core::engine::EngineOptions;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::monitor::ServerMonitoringMode;
use retry_core::policy::{RetryOptions, RetryPolicy, DEFAULT_MAX_ADAPTIVE_RETRIES};
use retry_core::pool::PoolOptions;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionSettings};
use retry_core::service_config::ServiceConfig;
use retry_core::topology::{TagSet, TopologySettings};

use crate::connection_string::{
    self, shown, ConnectionString, HostKind, OptionValue, Warnings, REDACTED,
};
use crate::tls::TlsOptions;

/// An option, or a URI, that could not be used: which option, what value, and why; for two
/// options that cannot be used together, the other one too ([`OptionsError::conflicting`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionsError {
    option: String,
    value: String,
    reason: String,
    conflicting: Option<(String, String)>,
}

impl OptionsError {
    pub(crate) fn new(option: &str, value: &str, reason: impl Into<String>) -> OptionsError {
        OptionsError {
            option: option.into(),
            value: value.into(),
            reason: reason.into(),
            conflicting: None,
        }
    }

    /// `option` = `value` cannot be used with `other` = `other_value`, for `reason`.
    pub(crate) fn conflict(
        (option, value): (&str, &str),
        (other, other_value): (&str, &str),
        reason: impl Into<String>,
    ) -> OptionsError {
        OptionsError {
            conflicting: Some((other.into(), other_value.into())),
            ..OptionsError::new(option, value, reason)
        }
    }

    /// The same error, `more` appended to its reason.
    pub(crate) fn append_reason(&mut self, more: &str) {
        self.reason.push_str(more);
    }

    /// The other option and its value, when the error is two options that cannot be used
    /// together (e.g. `loadBalanced` with `apiStrict`: LB-7, HS-2).
    pub fn conflicting(&self) -> Option<(&str, &str)> {
        self.conflicting
            .as_ref()
            .map(|(option, value)| (option.as_str(), value.as_str()))
    }

    /// The option's name as written (`uri` for the URI as a whole, `host` for a host).
    pub fn option(&self) -> &str {
        &self.option
    }

    /// The value given.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Why it could not be used.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} {:?}", self.option, self.value)?;
        if let Some((other, value)) = &self.conflicting {
            write!(f, " with {other} {value:?}")?;
        }
        write!(f, ": {}", self.reason)
    }
}

impl std::error::Error for OptionsError {}

/// A Stable API version this client knows (versioned-api spec, `ServerApiVersion`). Later
/// versions may be added in a minor release, so a `match` needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ServerApiVersion {
    /// API version `"1"`.
    V1,
}

impl ServerApiVersion {
    /// The version as the server names it (`apiVersion`).
    pub fn as_str(self) -> &'static str {
        match self {
            ServerApiVersion::V1 => "1",
        }
    }
}

impl fmt::Display for ServerApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::str::FromStr for ServerApiVersion {
    type Err = OptionsError;

    /// `"1"`; any other version is an error naming the versions this client knows (versioned-api
    /// spec: an unknown API version is a client-side error).
    fn from_str(version: &str) -> Result<ServerApiVersion, OptionsError> {
        match version {
            "1" => Ok(ServerApiVersion::V1),
            other => Err(OptionsError::new(
                "serverApi.version",
                other,
                "unknown Stable API version; this client knows \"1\"",
            )),
        }
    }
}

/// The Stable API version a client declares (versioned-api spec, `serverApi`): every command
/// the client sends (the handshake, which is then `hello`, monitoring, authentication, `getMore`
/// and every command of a transaction included) carries `apiVersion`, and `apiStrict` /
/// `apiDeprecationErrors` when set here, even to the server's default (false). Not a URI option
/// (the spec forbids one), and fixed for the client's life once it is connected.
///
/// With `strict`, the server refuses commands outside the declared version (`APIStrictError`,
/// 323); with `deprecation_errors`, deprecated ones (`APIDeprecationError`, 324). A command given
/// to [`crate::Client::run_command`] with its own API fields gets the client's instead (the spec
/// leaves that case undefined).
///
/// ```
/// use retry_driver::{ClientOptions, ServerApi, ServerApiVersion};
/// # use retry_core::address::ServerAddress;
/// let mut options = ClientOptions::new(vec![ServerAddress::new("127.0.0.1", 27017)]);
/// options.server_api = Some(ServerApi::new(ServerApiVersion::V1).with_strict(true));
/// assert!("2".parse::<ServerApiVersion>().is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerApi {
    version: ServerApiVersion,
    strict: Option<bool>,
    deprecation_errors: Option<bool>,
}

impl ServerApi {
    /// Declares `version`, with `apiStrict` and `apiDeprecationErrors` unset (not sent).
    pub fn new(version: ServerApiVersion) -> ServerApi {
        ServerApi {
            version,
            strict: None,
            deprecation_errors: None,
        }
    }

    /// Sends `apiStrict: strict`.
    pub fn with_strict(self, strict: bool) -> ServerApi {
        ServerApi {
            strict: Some(strict),
            ..self
        }
    }

    /// Sends `apiDeprecationErrors: errors`.
    pub fn with_deprecation_errors(self, errors: bool) -> ServerApi {
        ServerApi {
            deprecation_errors: Some(errors),
            ..self
        }
    }

    /// The declared version.
    pub fn version(&self) -> ServerApiVersion {
        self.version
    }

    /// `apiStrict`, if set.
    pub fn strict(&self) -> Option<bool> {
        self.strict
    }

    /// `apiDeprecationErrors`, if set.
    pub fn deprecation_errors(&self) -> Option<bool> {
        self.deprecation_errors
    }

    /// The engine's form of this declaration.
    fn to_engine(self) -> retry_core::handshake::ServerApi {
        retry_core::handshake::ServerApi {
            version: self.version.as_str().to_owned(),
            strict: self.strict,
            deprecation_errors: self.deprecation_errors,
        }
    }
}

/// What a client is configured with. Field names follow the URI options; [`ClientOptions::set`]
/// takes them by those names.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ClientOptions {
    /// The seed list.
    pub hosts: Vec<ServerAddress>,
    /// `retryReads` (default true).
    pub retry_reads: bool,
    /// `retryWrites` (default true).
    pub retry_writes: bool,
    /// `maxAdaptiveRetries` (default 2).
    pub max_adaptive_retries: u32,
    /// `enableOverloadRetargeting` (default false).
    pub enable_overload_retargeting: bool,
    /// `loadBalanced` (default false).
    pub load_balanced: bool,
    /// `directConnection` (default false).
    pub direct_connection: bool,
    /// `replicaSet`: the expected set name (URI-13: the topology starts as ReplicaSetNoPrimary).
    pub replica_set: Option<String>,
    /// `timeoutMS`: `None` leaves CSOT off; `Some(0)` turns it on without a limit.
    pub timeout: Option<Duration>,
    /// `serverSelectionTimeoutMS` (default 30 s).
    pub server_selection_timeout: Duration,
    /// `localThresholdMS` (default 15 ms).
    pub local_threshold: Duration,
    /// `heartbeatFrequencyMS` (default 10 s, at least 500 ms).
    pub heartbeat_frequency: Duration,
    /// `connectTimeoutMS` (TO-2): default 10 s; zero means no limit.
    pub connect_timeout: Duration,
    /// `socketTimeoutMS` (TO-3): no limit by default (or zero); ignored under `timeoutMS` (TO-8).
    pub socket_timeout: Option<Duration>,
    /// `maxPoolSize`, `minPoolSize`, `maxConnecting`, `maxIdleTimeMS`, `waitQueueTimeoutMS`.
    pub pool: PoolOptions,
    /// `readPreference`, `readPreferenceTags`, `maxStalenessSeconds`: the default read
    /// preference of reads that name none (SS-2).
    pub read_preference: ReadPreference,
    /// `readConcernLevel`, if given: the `readConcern` of the reads [`crate::Client::command`]
    /// and [`crate::Client::cursor`] send without one of their own.
    pub read_concern_level: Option<String>,
    /// `w`, `wTimeoutMS`, `journal` as the `writeConcern` document servers take (`w`, `wtimeout`,
    /// `j`), if any was given: the `writeConcern` of the writes [`crate::Client::command`] and
    /// [`crate::Client::cursor`] send without one of their own (`wtimeout` not under
    /// `timeoutMS`, TO-8). [`crate::Client::run_command`] adds neither concern.
    pub write_concern: Option<Document>,
    /// `serverMonitoringMode` (MO-7): `stream` streams heartbeats (awaitable `hello`, MO-9, with
    /// an RTT connection, MO-12), `poll` polls, `auto` (the default) streams except on a FaaS
    /// platform.
    pub server_monitoring_mode: ServerMonitoringMode,
    /// `appName`.
    pub app_name: Option<String>,
    /// `tls` / `ssl` and the `tls*` options (TL-1, TL-2): `None` is a plain TCP connection.
    /// `mongodb+srv` turns TLS on unless `tls=false`; any other `tls*` option turns it on too
    /// (documented implicit enabling, TL-1), except with an explicit `tls=false`.
    pub tls: Option<TlsOptions>,
    /// The retry policy (not a URI option); the current spec's by default.
    pub policy: RetryPolicy,
    /// The seed of the engine's RNG (not a URI option); `None` draws one from the OS.
    pub seed: Option<u64>,
    /// A gRPC A6 service config (not a URI option), set with
    /// [`ClientOptions::set_service_config`]: per command an A6 `retryPolicy`, or a
    /// `hedgingPolicy` under which reads run as hedged copies (`retry_core::hedging`). `None`:
    /// the client's retry rules for every command.
    pub service_config: Option<ServiceConfig>,
    /// The credential of the URI's userinfo, `authSource`, `authMechanism` and
    /// `authMechanismProperties` (AU-1, AU-10), used with retry-auth's SCRAM (nonces from the
    /// OS). `Debug` redacts it.
    pub credential: Option<Credential>,
    /// Your own authentication: a [`retry_core::auth::Mechanism`] of yours (X.509, OIDC, AWS,
    /// ...) in [`AuthOptions`]. When set, [`ClientOptions::credential`] is not used.
    pub auth: Option<AuthOptions>,
    /// What parsing the URI warned about (URI-7, URI-8, URI-10, and options this client
    /// ignores), for the application to log.
    pub warnings: Vec<String>,
    /// SRV polling for mongos discovery, for a client of a resolved `mongodb+srv` URI: the name
    /// the driver rescans and what the engine needs (SP-1..SP-6).
    pub srv: Option<crate::srv::SrvPolling>,
    /// The declared Stable API version ([`ServerApi`], versioned-api spec); `None` (the
    /// default) sends no API fields. Not a URI option.
    pub server_api: Option<ServerApi>,
}

impl ClientOptions {
    /// Options for `hosts` with every other option at its default.
    pub fn new(hosts: Vec<ServerAddress>) -> ClientOptions {
        let selection = SelectionSettings::default();
        ClientOptions {
            hosts,
            retry_reads: true,
            retry_writes: true,
            max_adaptive_retries: DEFAULT_MAX_ADAPTIVE_RETRIES,
            enable_overload_retargeting: false,
            load_balanced: false,
            direct_connection: false,
            replica_set: None,
            timeout: None,
            server_selection_timeout: selection.server_selection_timeout,
            local_threshold: selection.local_threshold,
            heartbeat_frequency: selection.heartbeat_frequency,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            socket_timeout: None,
            pool: PoolOptions::default(),
            read_preference: ReadPreference::PRIMARY,
            read_concern_level: None,
            write_concern: None,
            server_monitoring_mode: ServerMonitoringMode::Auto,
            app_name: None,
            tls: None,
            policy: RetryPolicy::Current,
            seed: None,
            service_config: None,
            credential: None,
            auth: None,
            warnings: Vec::new(),
            srv: None,
            server_api: None,
        }
    }

    /// Parses a `mongodb://` URI ([`ConnectionString::parse`]) and keeps what this client
    /// supports ([`ClientOptions::from_connection_string`]). As the URI-options spec allows
    /// (URI-7), an unknown option or an invalid value is ignored with a warning, kept in
    /// [`ClientOptions::warnings`]: log them, or use [`ClientOptions::parse_strict`] (which
    /// [`Client::with_uri`](crate::Client::with_uri) does) to have them refused.
    pub fn parse(uri: &str) -> Result<ClientOptions, OptionsError> {
        ClientOptions::from_connection_string(&ConnectionString::parse(uri)?)
    }

    /// [`ClientOptions::parse`], with every option or value it would drop with a warning an
    /// error naming the option and the value as written (the first one, followed by the other
    /// dropped ones' texts): an unknown option, an invalid value, `compressors`,
    /// `serverSelectionTryOnce`, a repeated option's earlier value, a deprecated name shadowed
    /// by its replacement. E.g. `?maxAdaptiveRetries=-1` is `invalid maxAdaptiveRetries "-1":
    /// expected an integer from 0 to 2147483647` (house rule 11, review32 R1). A deprecated
    /// spelling applied in full (URI-8's `journal=yes`, URI-10's `wtimeout=5000` without
    /// `wTimeoutMS`) is accepted, its warning kept in [`ClientOptions::warnings`] (review34 Y3).
    pub fn parse_strict(uri: &str) -> Result<ClientOptions, OptionsError> {
        ClientOptions::from_connection_string_strict(&ConnectionString::parse(uri)?)
    }

    /// [`ClientOptions::from_connection_string`], with any warning an error
    /// ([`ClientOptions::parse_strict`]).
    pub(crate) fn from_connection_string_strict(
        cs: &ConnectionString,
    ) -> Result<ClientOptions, OptionsError> {
        let (options, warnings) = ClientOptions::build(cs)?;
        warnings.refuse()?;
        Ok(options)
    }

    /// The client options of a parsed connection string. Errors name the feature this client
    /// does not have (authentication mechanisms other than SCRAM, Unix sockets, SOCKS5 proxies,
    /// encrypted TLS keys) and a `mongodb+srv` string whose DNS lookups were not made yet;
    /// compressors and `serverSelectionTryOnce` are ignored with a warning. The connection
    /// string's own warnings are kept in [`ClientOptions::warnings`] too.
    pub fn from_connection_string(cs: &ConnectionString) -> Result<ClientOptions, OptionsError> {
        Ok(ClientOptions::build(cs)?.0)
    }

    /// The client options of `cs`, and every warning (the connection string's, then the
    /// client's).
    fn build(cs: &ConnectionString) -> Result<(ClientOptions, Warnings), OptionsError> {
        let unsupported = |option: &str, value: &str, what: &str| {
            Err(OptionsError::new(
                option,
                value,
                format!("{what} is not supported by this client"),
            ))
        };
        if cs.srv && !cs.seedlist_resolved() {
            return Err(OptionsError::new(
                "uri",
                "mongodb+srv",
                "a mongodb+srv URI needs its DNS lookups first: use Client::with_uri_async or \
                 resolve_seedlist (SRV-2)",
            ));
        }
        let credential = cs.credential().cloned();
        if let Some(credential) = &credential {
            crate::credential::check_complete(credential)?;
            check_credential(credential)?;
        }
        let mut hosts = Vec::with_capacity(cs.hosts.len());
        for host in &cs.hosts {
            if host.kind == HostKind::Unix {
                return unsupported("host", &host.host, "a Unix domain socket");
            }
            hosts.push(ServerAddress::new(&host.host, host.port.unwrap_or(27017)));
        }
        let mut options = ClientOptions::new(hosts);
        options.credential = credential;
        let mut warnings = cs.warnings.clone();
        for (name, value) in cs.options() {
            options.apply(name, value, &mut warnings)?;
        }
        options.warnings = warnings.texts().to_vec();
        // TL-1: an explicit `tls=false` wins over the other `tls*` options and over SRV.
        match cs.option("tls") {
            Some(OptionValue::Bool(false)) => options.tls = None,
            None if cs.srv => {
                options.tls.get_or_insert_with(TlsOptions::default);
            }
            _ => {}
        }
        options.read_preference = read_preference(cs)?;
        options.write_concern = write_concern(cs);
        options.srv = cs.srv_polling.clone();
        Ok((options, warnings))
    }

    /// Sets the URI option `name` (case-insensitive) from its string `value`, with the URI's
    /// types and ranges. Unlike in a URI, a value the URI would ignore with a warning is an error
    /// here. Read preference and write concern options are set through their fields.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), OptionsError> {
        let Some((canonical, kind)) = connection_string::canonical(name) else {
            return Err(OptionsError::new(
                name,
                shown(name, value),
                "unknown option",
            ));
        };
        if matches!(
            canonical,
            "readPreference"
                | "readPreferenceTags"
                | "maxStalenessSeconds"
                | "w"
                | "wTimeoutMS"
                | "journal"
        ) {
            return Err(OptionsError::new(
                name,
                value,
                "set `read_preference` or `write_concern` instead",
            ));
        }
        if canonical.starts_with("auth") {
            return Err(OptionsError::new(
                name,
                shown(name, value),
                "set `credential` instead",
            ));
        }
        // Named as the caller wrote it (review32 R16: the reason alone, no "; ignored").
        let as_written = |mut error: OptionsError| {
            error.option = name.to_string();
            error
        };
        let mut warnings = Warnings::default();
        let parsed = connection_string::read_value(canonical, kind, value, &mut warnings)
            .map_err(as_written)?;
        warnings.refuse().map_err(as_written)?;
        // An ignored value pushed a warning of a dropped value, refused just above (review34 Y11).
        let parsed = parsed.expect("an ignored value is refused with its warning");
        // What `apply` warns about (compression, `serverSelectionTryOnce`) it leaves unset.
        self.apply(canonical, &parsed, &mut warnings)?;
        warnings.refuse().map_err(as_written)
    }

    /// Applies one parsed option by canonical name.
    fn apply(
        &mut self,
        name: &'static str,
        value: &OptionValue,
        warnings: &mut Warnings,
    ) -> Result<(), OptionsError> {
        let unsupported = |what: &str| {
            Err(OptionsError::new(
                name,
                shown(name, &value.to_string()),
                format!("{what} is not supported by this client"),
            ))
        };
        let ms = |v: i64| Duration::from_millis(u64::try_from(v).unwrap_or(0));
        let count = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
        match (name, value) {
            ("retryReads", OptionValue::Bool(b)) => self.retry_reads = *b,
            ("retryWrites", OptionValue::Bool(b)) => self.retry_writes = *b,
            ("maxAdaptiveRetries", OptionValue::Int(v)) => self.max_adaptive_retries = count(*v),
            ("enableOverloadRetargeting", OptionValue::Bool(b)) => {
                self.enable_overload_retargeting = *b
            }
            ("loadBalanced", OptionValue::Bool(b)) => self.load_balanced = *b,
            ("directConnection", OptionValue::Bool(b)) => self.direct_connection = *b,
            ("replicaSet", OptionValue::Str(s)) => self.replica_set = Some(s.clone()),
            ("timeoutMS", OptionValue::Int(v)) => self.timeout = Some(ms(*v)),
            ("serverSelectionTimeoutMS", OptionValue::Int(v)) => {
                self.server_selection_timeout = ms(*v)
            }
            ("localThresholdMS", OptionValue::Int(v)) => self.local_threshold = ms(*v),
            ("heartbeatFrequencyMS", OptionValue::Int(v)) => self.heartbeat_frequency = ms(*v),
            ("connectTimeoutMS", OptionValue::Int(v)) => self.connect_timeout = ms(*v),
            ("socketTimeoutMS", OptionValue::Int(v)) => {
                self.socket_timeout = (*v > 0).then(|| ms(*v))
            }
            ("maxPoolSize", OptionValue::Int(v)) => self.pool.max_pool_size = count(*v),
            ("minPoolSize", OptionValue::Int(v)) => self.pool.min_pool_size = count(*v),
            ("maxConnecting", OptionValue::Int(v)) => self.pool.max_connecting = count(*v),
            ("maxIdleTimeMS", OptionValue::Int(v)) => {
                self.pool.max_idle_time = (*v > 0).then(|| ms(*v))
            }
            ("waitQueueTimeoutMS", OptionValue::Int(v)) => {
                self.pool.wait_queue_timeout = (*v > 0).then(|| ms(*v))
            }
            ("readConcernLevel", OptionValue::Str(s)) => self.read_concern_level = Some(s.clone()),
            ("serverMonitoringMode", OptionValue::Str(s)) => {
                self.server_monitoring_mode = match s.as_str() {
                    "stream" => ServerMonitoringMode::Stream,
                    "poll" => ServerMonitoringMode::Poll,
                    _ => ServerMonitoringMode::Auto,
                }
            }
            ("appName", OptionValue::Str(s)) => {
                // The engine's metadata rules decide what an application name may be (HS-5).
                ClientMetadata::new("", "")
                    .with_application_name(s.as_str())
                    .map_err(|e| OptionsError::new(name, s, e.to_string()))?;
                self.app_name = Some(s.clone());
            }
            // Read by `read_preference` and `write_concern` as a whole.
            ("readPreference" | "readPreferenceTags" | "maxStalenessSeconds", _) => {}
            ("w" | "wTimeoutMS" | "journal", _) => {}
            ("tls", OptionValue::Bool(on)) => {
                self.tls = on.then(|| self.tls.take().unwrap_or_default());
            }
            ("tlsCAFile", OptionValue::Str(path)) => {
                self.tls.get_or_insert_with(TlsOptions::default).ca_file = Some(path.into())
            }
            ("tlsCertificateKeyFile", OptionValue::Str(path)) => {
                self.tls
                    .get_or_insert_with(TlsOptions::default)
                    .certificate_key_file = Some(path.into())
            }
            ("tlsAllowInvalidCertificates", OptionValue::Bool(b)) => {
                self.tls
                    .get_or_insert_with(TlsOptions::default)
                    .allow_invalid_certificates = *b
            }
            ("tlsAllowInvalidHostnames", OptionValue::Bool(b)) => {
                self.tls
                    .get_or_insert_with(TlsOptions::default)
                    .allow_invalid_hostnames = *b
            }
            ("tlsInsecure", OptionValue::Bool(b)) => {
                let tls = self.tls.get_or_insert_with(TlsOptions::default);
                tls.allow_invalid_certificates = *b;
                tls.allow_invalid_hostnames = *b;
            }
            // rustls checks neither OCSP nor revocation lists (TL-2): nothing to turn off.
            ("tlsDisableOCSPEndpointCheck" | "tlsDisableCertificateRevocationCheck", _) => {
                self.tls.get_or_insert_with(TlsOptions::default);
            }
            ("tlsCertificateKeyFilePassword", _) => {
                return Err(OptionsError::new(
                    name,
                    REDACTED,
                    "encrypted private keys are not supported by this client",
                ))
            }
            // Used by the seedlist lookup, before these options are built (SRV-2, SRV-4).
            ("srvMaxHosts" | "srvServiceName", _) => {}
            // Read by `ConnectionString::credential` as a whole (AU-1).
            ("authMechanism" | "authSource" | "authMechanismProperties", _) => {}
            (n, _) if n.starts_with("proxy") => return unsupported("a SOCKS5 proxy"),
            ("compressors" | "zlibCompressionLevel", _) => warnings.push(
                OptionsError::new(
                    name,
                    &value.to_string(),
                    "compression is not supported by this client (URI-9)",
                ),
                format!("'{name}' ignored: compression is not supported by this client"),
            ),
            ("serverSelectionTryOnce", _) => warnings.push(
                OptionsError::new(
                    name,
                    &value.to_string(),
                    "it is for single-threaded drivers (SS-1)",
                ),
                "'serverSelectionTryOnce' ignored: it is for single-threaded drivers (SS-1)"
                    .to_string(),
            ),
            _ => return unsupported("this option"),
        }
        Ok(())
    }

    /// Validates a gRPC A6 service config and sets [`ClientOptions::service_config`]. The config
    /// is the JSON shape as a BSON document (`methodConfig` with `retryPolicy` or
    /// `hedgingPolicy`, `retryThrottling`; retry-lab's `service_config::parse_json` reads the JSON
    /// text). A field that breaks an A6 rule is an error naming it, e.g. option
    /// `serviceConfig.methodConfig[0].hedgingPolicy.maxAttempts`, value `1`, reason `must be an
    /// integer of at least 2`.
    pub fn set_service_config(&mut self, config: &Document) -> Result<(), OptionsError> {
        let config = ServiceConfig::from_document(config).map_err(|e| {
            OptionsError::new(&format!("serviceConfig.{}", e.field()), e.value(), e.rule())
        })?;
        self.service_config = Some(config);
        Ok(())
    }

    /// Checks the options that cannot be used together and that no connection string can
    /// carry, because one of them is not a URI option: `loadBalanced=true` with a strict Stable
    /// API ([`ServerApi::with_strict`]`(true)`) is an error naming both options (a server refuses
    /// the handshake's `loadBalanced` under `apiStrict`, APIStrictError 323, so every
    /// connection would fail). The rule is the core's,
    /// [`retry_core::handshake::load_balanced_refused`], which the engine applies too
    /// (`EngineError::LoadBalancedStrictApi`, house rule 4).
    /// [`ClientOptions::engine_options`] checks it, so [`crate::Client::connect`] fails with it
    /// before anything starts.
    pub fn validate(&self) -> Result<(), OptionsError> {
        let api = self.server_api.map(ServerApi::to_engine);
        if retry_core::handshake::load_balanced_refused(self.load_balanced, api.as_ref()) {
            return Err(OptionsError::conflict(
                ("loadBalanced", "true"),
                ("apiStrict", "true"),
                "a load-balanced handshake carries loadBalanced: true, which a server refuses \
                 under apiStrict: true (APIStrictError, 323); leave ServerApi's strict unset or \
                 false",
            ));
        }
        Ok(())
    }

    /// The engine's options ([`ClientOptions::validate`] first); the RNG seed is
    /// [`ClientOptions::seed`] or one from the OS.
    pub fn engine_options(&self) -> Result<EngineOptions, OptionsError> {
        self.validate()?;
        let mut topology = TopologySettings::new(self.hosts.clone());
        topology.load_balanced = self.load_balanced;
        topology.direct_connection = self.direct_connection;
        topology.replica_set = self.replica_set.clone();
        topology.pool = PoolOptions {
            load_balanced: self.load_balanced,
            ..self.pool.clone()
        };
        let mut metadata = ClientMetadata::new("retry-driver", env!("CARGO_PKG_VERSION"));
        if let Some(name) = &self.app_name {
            metadata = metadata
                .with_application_name(name.clone())
                .map_err(|e| OptionsError::new("appName", name, e.to_string()))?;
        }
        let mut handshake = HandshakeOptions::new();
        handshake.metadata = metadata;
        handshake.load_balanced = self.load_balanced;
        handshake.server_api = self.server_api.map(ServerApi::to_engine);
        let mut options = EngineOptions::new(topology, handshake);
        options.retry = RetryOptions::default()
            .retry_reads(self.retry_reads)
            .retry_writes(self.retry_writes)
            .enable_overload_retargeting(self.enable_overload_retargeting)
            .policy(self.policy.clone())
            .max_adaptive_retries(i64::from(self.max_adaptive_retries))
            .map_err(|e| {
                OptionsError::new(
                    "maxAdaptiveRetries",
                    &self.max_adaptive_retries.to_string(),
                    e.to_string(),
                )
            })?;
        options.selection = SelectionSettings {
            local_threshold: self.local_threshold,
            server_selection_timeout: self.server_selection_timeout,
            heartbeat_frequency: self.heartbeat_frequency,
        };
        options.heartbeat_frequency = self.heartbeat_frequency;
        options.connect_timeout = self.connect_timeout;
        options.socket_timeout = self.socket_timeout;
        options.server_monitoring_mode = self.server_monitoring_mode;
        options.srv_polling = self.srv.as_ref().map(|srv| {
            retry_core::topology::SrvPollingOptions::new(srv.max_hosts, srv.initial_ttl)
        });
        options.seed = self.seed.unwrap_or_else(os_seed);
        options.service_config = self.service_config.clone();
        options.auth = match (&self.auth, &self.credential) {
            (Some(auth), _) => Some(auth.clone()),
            (None, Some(credential)) => Some(
                retry_auth::auth_options(credential, retry_auth::os_rng())
                    .map_err(|e| OptionsError::new("authMechanism", &e.mechanism, e.message))?,
            ),
            (None, None) => None,
        };
        Ok(options)
    }
}

/// The mechanisms this client implements (retry-auth's SCRAM); the others are refused by name,
/// and SCRAM needs a password (AU-13).
fn check_credential(credential: &Credential) -> Result<(), OptionsError> {
    let mechanism = credential.mechanism.as_deref();
    if let Some(other) = mechanism.filter(|m| !matches!(*m, "SCRAM-SHA-256" | "SCRAM-SHA-1")) {
        return Err(OptionsError::new(
            "authMechanism",
            other,
            "this mechanism is not supported by this client (SCRAM-SHA-256 and SCRAM-SHA-1 are); \
             implement retry_core::auth::Mechanism and set ClientOptions::auth",
        ));
    }
    if credential.password.is_none() {
        return Err(OptionsError::new(
            "userinfo",
            REDACTED,
            format!("{} needs a password", mechanism.unwrap_or("SCRAM")),
        ));
    }
    Ok(())
}

/// SS-2: the read preference of `readPreference`, `readPreferenceTags` and
/// `maxStalenessSeconds`.
fn read_preference(cs: &ConnectionString) -> Result<ReadPreference, OptionsError> {
    let mode = match cs.option("readPreference") {
        Some(OptionValue::Str(mode)) => mode
            .parse::<ReadPreferenceMode>()
            .map_err(|e| OptionsError::new("readPreference", mode, e.to_string()))?,
        _ => ReadPreferenceMode::Primary,
    };
    let tag_sets = match cs.option("readPreferenceTags") {
        Some(OptionValue::TagSets(sets)) => sets
            .iter()
            .map(|set| {
                set.iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect::<TagSet>()
            })
            .collect(),
        _ => Vec::new(),
    };
    let max_staleness = match cs.option("maxStalenessSeconds") {
        Some(OptionValue::Int(s)) => Some(*s),
        _ => None,
    };
    ReadPreference::new(mode, tag_sets, max_staleness)
        .map_err(|e| OptionsError::new("readPreference", mode.as_str(), e.to_string()))
}

/// The `writeConcern` document of `w`, `wTimeoutMS` and `journal`, if any is set.
fn write_concern(cs: &ConnectionString) -> Option<Document> {
    let mut wc = Document::new();
    match cs.option("w") {
        Some(OptionValue::Int(w)) => {
            wc.insert("w", i32::try_from(*w).map_or(Bson::Int64(*w), Bson::Int32));
        }
        Some(OptionValue::Str(w)) => {
            wc.insert("w", w.as_str());
        }
        _ => {}
    }
    if let Some(OptionValue::Int(ms)) = cs.option("wTimeoutMS") {
        wc.insert("wtimeout", *ms);
    }
    if let Some(OptionValue::Bool(j)) = cs.option("journal") {
        wc.insert("j", *j);
    }
    (!wc.is_empty()).then_some(wc)
}

/// A seed from the OS: std's `RandomState` keys come from the OS's randomness.
pub(crate) fn os_seed() -> u64 {
    std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option_name_is_parsed_case_insensitively() {
        let options = ClientOptions::parse(
            "mongodb://127.0.0.1:1,localhost/db?retryReads=false&RETRYWRITES=false&maxAdaptiveRetries=1\
             &enableOverloadRetargeting=true&loadBalanced=false&timeoutMS=250\
             &serverSelectionTimeoutMS=1000&localThresholdMS=5&heartbeatFrequencyMS=600\
             &appName=retry%20lab&directConnection=false",
        )
        .unwrap();
        assert_eq!(options.hosts.len(), 2);
        assert_eq!(options.hosts[0].port(), 1);
        assert_eq!(options.hosts[1].port(), 27017);
        assert!(!options.retry_reads && !options.retry_writes);
        assert_eq!(options.max_adaptive_retries, 1);
        assert!(options.enable_overload_retargeting);
        assert_eq!(options.timeout, Some(Duration::from_millis(250)));
        assert_eq!(options.server_selection_timeout, Duration::from_secs(1));
        assert_eq!(options.local_threshold, Duration::from_millis(5));
        assert_eq!(options.heartbeat_frequency, Duration::from_millis(600));
        assert_eq!(options.app_name.as_deref(), Some("retry lab"));
        let engine = options.engine_options().unwrap();
        assert_eq!(engine.heartbeat_frequency, Duration::from_millis(600));
        assert_eq!(engine.selection.local_threshold, Duration::from_millis(5));
    }

    #[test]
    fn bad_uris_and_unsupported_features_name_the_option_and_the_value() {
        let cases = [
            ("http://x", "uri", "http://x"),
            ("mongodb+srv://x.example.com", "uri", "mongodb+srv"),
            ("mongodb://u@x", "userinfo", "<redacted>"),
            (
                "mongodb://u:p@x/?authMechanism=PLAIN",
                "authMechanism",
                "PLAIN",
            ),
            ("mongodb://", "host", ""),
            ("mongodb://x:notaport", "host", "x:notaport"),
            ("mongodb://%2Ftmp%2Fm.sock", "host", "/tmp/m.sock"),
            (
                "mongodb://x/?tlsCertificateKeyFilePassword=secret",
                "tlsCertificateKeyFilePassword",
                "<redacted>",
            ),
            ("mongodb://x/?proxyHost=p", "proxyHost", "p"),
            ("mongodb://x/?loadBalanced", "option", "loadBalanced"),
            ("mongodb://x/?=1", "option", "=1"),
            ("mongodb://x/?appName=%FF", "appName", "%FF"),
            ("mongodb://x/?appName=%ZZ", "appName", "%ZZ"),
            (
                "mongodb://x/?maxStalenessSeconds=0&readPreference=secondary",
                "readPreference",
                "secondary",
            ),
        ];
        for (uri, option, value) in cases {
            let error = ClientOptions::parse(uri).unwrap_err();
            assert_eq!((error.option(), error.value()), (option, value), "{uri}");
            let message = error.to_string();
            assert!(
                message.contains(option) && message.contains(value),
                "{message}"
            );
        }
    }

    #[test]
    fn tl1_tl2_tls_options_turn_tls_on_and_tls_false_turns_it_off() {
        let tls = |uri: &str| ClientOptions::parse(uri).unwrap().tls;
        assert_eq!(tls("mongodb://x/"), None);
        assert_eq!(tls("mongodb://x/?tls=true"), Some(TlsOptions::default()));
        assert_eq!(tls("mongodb://x/?ssl=true"), Some(TlsOptions::default()));
        assert_eq!(tls("mongodb://x/?tls=false&tlsCAFile=ca.pem"), None);
        let implicit = tls("mongodb://x/?tlsCAFile=ca.pem&tlsCertificateKeyFile=me.pem").unwrap();
        assert_eq!(implicit.ca_file, Some("ca.pem".into()));
        assert_eq!(implicit.certificate_key_file, Some("me.pem".into()));
        assert_eq!(
            tls("mongodb://x/?tls=true&tlsInsecure=true"),
            Some(TlsOptions::insecure())
        );
        let hostnames = tls("mongodb://x/?tls=true&tlsAllowInvalidHostnames=true").unwrap();
        assert!(hostnames.allow_invalid_hostnames && !hostnames.allow_invalid_certificates);
        let certificates = tls("mongodb://x/?tls=true&tlsAllowInvalidCertificates=true").unwrap();
        assert!(certificates.allow_invalid_certificates && !certificates.allow_invalid_hostnames);
        // URI-11: conflicts are errors by presence.
        assert!(ClientOptions::parse(
            "mongodb://x/?tlsInsecure=true&tlsAllowInvalidHostnames=false"
        )
        .is_err());
        assert!(ClientOptions::parse("mongodb://x/?tls=true&ssl=false").is_err());
    }

    #[test]
    fn uri7_bad_values_warn_and_keep_the_default_but_set_refuses_them() {
        for uri in [
            "mongodb://x/?retryReads=maybe",
            "mongodb://x/?maxAdaptiveRetries=-1",
            "mongodb://x/?timeoutMS=soon",
            "mongodb://x/?heartbeatFrequencyMS=10",
            "mongodb://x/?compressors=zlib",
            "mongodb://x/?unknownOption=1",
        ] {
            let options = ClientOptions::parse(uri).unwrap();
            assert_eq!(options.warnings.len(), 1, "{uri}: {:?}", options.warnings);
            assert!(options.retry_reads && options.timeout.is_none());
            assert_eq!(options.heartbeat_frequency, Duration::from_secs(10));
        }
        let mut options = ClientOptions::new(vec![ServerAddress::new("x", 1)]);
        assert!(options.set("heartbeatFrequencyMS", "10").is_err());
        assert!(options.set("nope", "1").is_err());
        // Options read as a whole are set through their fields, never silently dropped.
        assert!(options.set("readPreference", "secondary").is_err());
        assert!(options.set("w", "1").is_err());
        options.set("heartbeatFrequencyMS", "600").unwrap();
        assert_eq!(options.heartbeat_frequency, Duration::from_millis(600));
    }

    /// Review32 R1 (URI-7, URI-8, URI-9, URI-10, house rule 11): what `parse` ignores with a
    /// warning, `parse_strict` refuses, naming the option and the value as written; `parse`
    /// still accepts the URI and keeps the warning.
    #[test]
    fn review32_r1_parse_strict_refuses_what_parse_ignores_with_a_warning() {
        for (query, option, value, reason) in [
            ("bogus=1", "bogus", REDACTED, "unknown option (URI-7)"),
            (
                "maxAdaptiveRetries=-1",
                "maxAdaptiveRetries",
                "-1",
                "expected an integer from 0 to 2147483647",
            ),
            (
                "timeoutMS=-5",
                "timeoutMS",
                "-5",
                "expected an integer from 0 to 9223372036854775807",
            ),
            (
                "compressors=zlib",
                "compressors",
                "zlib",
                "compression is not supported by this client (URI-9)",
            ),
            (
                "wtimeout=5&wTimeoutMS=6",
                "wtimeout",
                "5",
                "a deprecated spelling of 'wTimeoutMS', which is given too (URI-10)",
            ),
            (
                "appName=a&appName=b",
                "appName",
                "b",
                "given more than once",
            ),
        ] {
            let uri = format!("mongodb://127.0.0.1/?{query}");
            let lenient = ClientOptions::parse(&uri).unwrap();
            let deprecated = usize::from(query.starts_with("wtimeout"));
            assert_eq!(
                lenient.warnings.len(),
                1 + deprecated,
                "{uri}: {:?}",
                lenient.warnings
            );
            let error = ClientOptions::parse_strict(&uri).unwrap_err();
            assert_eq!(
                (error.option(), error.value(), error.reason()),
                (option, value, reason),
                "{uri}"
            );
        }
        // Several warnings: the first one, and the others' texts.
        let error =
            ClientOptions::parse_strict("mongodb://127.0.0.1/?timeoutMS=-5&compressors=zlib")
                .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid timeoutMS \"-5\": expected an integer from 0 to 9223372036854775807; and 1 \
             more: 'compressors' ignored: compression is not supported by this client"
        );
        assert!(ClientOptions::parse_strict("mongodb://127.0.0.1/?timeoutMS=5").is_ok());
    }

    /// Review34 Y3: a deprecated spelling that `parse` applies in full (URI-8's legacy booleans,
    /// URI-10's deprecated names with no replacement given) is accepted by `parse_strict`, with
    /// the same value, and its warning kept; refused only beside what was dropped, which is
    /// named first. Fails if every warning is refused.
    #[test]
    fn review34_y3_parse_strict_accepts_deprecated_spellings_it_applies() {
        for query in [
            "retryReads=1",
            "journal=yes",
            "wtimeout=5000",
            "retryWrites=n",
        ] {
            let uri = format!("mongodb://127.0.0.1/?{query}");
            let lenient = ClientOptions::parse(&uri).unwrap();
            assert_eq!(lenient.warnings.len(), 1, "{uri}: {:?}", lenient.warnings);
            let strict = ClientOptions::parse_strict(&uri).unwrap();
            assert_eq!(format!("{strict:?}"), format!("{lenient:?}"), "{uri}");
        }
        let error =
            ClientOptions::parse_strict("mongodb://127.0.0.1/?journal=yes&bogus=1").unwrap_err();
        assert_eq!(error.option(), "bogus");
        assert!(!error.to_string().contains("more"), "{error}");
        let mut options = ClientOptions::new(vec![ServerAddress::new("x", 1)]);
        assert!(options.set("retryReads", "0").is_ok());
    }

    /// Review36 V4 (URI-10): a deprecated spelling given twice drops its earlier value, so
    /// `parse_strict` refuses it as any repeated option; `parse` warns and uses the last.
    #[test]
    fn review36_v4_a_repeated_deprecated_spelling_is_refused_by_parse_strict() {
        let uri = "mongodb://127.0.0.1/?wtimeout=1&wtimeout=2";
        let error = ClientOptions::parse_strict(uri).unwrap_err();
        assert_eq!(error.option(), "wtimeout");
        assert!(
            error.to_string().contains("given more than once"),
            "{error}"
        );
        let lenient = ClientOptions::parse(uri).unwrap();
        assert!(
            lenient.warnings.iter().any(|w| w.contains("repeated")),
            "{:?}",
            lenient.warnings
        );
    }

    /// Review32 R16: `set` refuses a value the URI would ignore with the reason alone (no
    /// "; ignored"), under the name as the caller wrote it; a conflict of the hosts names the
    /// option and its value, not "uri" and "".
    #[test]
    fn review32_r16_errors_name_what_the_user_wrote() {
        let mut options = ClientOptions::new(vec![ServerAddress::new("x", 1)]);
        let error = options.set("timeoutMS", "-5").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid timeoutMS \"-5\": expected an integer from 0 to 9223372036854775807"
        );
        let error = options.set("TIMEOUTms", "soon").unwrap_err();
        assert_eq!(
            (error.option(), error.value(), error.reason()),
            ("TIMEOUTms", "soon", "expected an integer")
        );
        let error = options.set("compressors", "zlib").unwrap_err();
        assert_eq!(error.option(), "compressors");
        assert!(options.set("serverSelectionTryOnce", "false").is_err());

        let error = ClientOptions::parse("mongodb://a:1,b:2/?directConnection=true").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid directConnection \"true\": needs exactly one host and mongodb://, not 2 \
             hosts (URI-11)"
        );
        let error = ClientOptions::parse("mongodb://a/?minPoolSize=5&maxPoolSize=2").unwrap_err();
        assert_eq!(error.option(), "minPoolSize");
        assert_eq!(error.value(), "5");
        assert_eq!(error.conflicting(), Some(("maxPoolSize", "2")));
        let error = ClientOptions::parse("mongodb://a/?readPreferenceTags=dc:ny").unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid readPreferenceTags \"dc:ny\" with readPreference \"primary (the \
             default)\": cannot be used with read preference primary (SS-2)"
        );
        let error = ClientOptions::parse("mongodb://a/?proxyPassword=s3cr3t").unwrap_err();
        assert_eq!((error.option(), error.value()), ("proxyPassword", REDACTED));
        assert!(!error.to_string().contains("s3cr3t"), "{error}");
    }

    #[test]
    fn uri_options_the_engine_supports_reach_the_engine() {
        let options = ClientOptions::parse(
            "mongodb://a,b/?replicaSet=rs0&readPreference=secondaryPreferred\
             &readPreferenceTags=dc:ny&readPreferenceTags=&maxStalenessSeconds=120\
             &w=majority&wTimeoutMS=500&journal=true&readConcernLevel=local\
             &connectTimeoutMS=2500&socketTimeoutMS=0&maxPoolSize=5&minPoolSize=1\
             &maxConnecting=3&maxIdleTimeMS=1000&waitQueueTimeoutMS=200\
             &serverMonitoringMode=poll&tls=false",
        )
        .unwrap();
        assert!(options.warnings.is_empty(), "{:?}", options.warnings);
        assert_eq!(options.replica_set.as_deref(), Some("rs0"));
        let rp = &options.read_preference;
        assert_eq!(rp.mode(), ReadPreferenceMode::SecondaryPreferred);
        assert_eq!(rp.tag_sets().len(), 2);
        assert_eq!(rp.max_staleness(), Some(Duration::from_secs(120)));
        assert_eq!(
            options.write_concern,
            Some(bson::doc! { "w": "majority", "wtimeout": 500_i64, "j": true })
        );
        assert_eq!(options.read_concern_level.as_deref(), Some("local"));
        assert_eq!(options.server_monitoring_mode, ServerMonitoringMode::Poll);
        let engine = options.engine_options().unwrap();
        assert_eq!(engine.connect_timeout, Duration::from_millis(2500));
        assert_eq!(engine.socket_timeout, None);
        assert_eq!(engine.topology.replica_set.as_deref(), Some("rs0"));
        let pool = &engine.topology.pool;
        assert_eq!(
            (pool.max_pool_size, pool.min_pool_size, pool.max_connecting),
            (5, 1, 3)
        );
        assert_eq!(pool.max_idle_time, Some(Duration::from_secs(1)));
        assert_eq!(pool.wait_queue_timeout, Some(Duration::from_millis(200)));
        let socket = ClientOptions::parse("mongodb://a/?socketTimeoutMS=750").unwrap();
        assert_eq!(
            socket.engine_options().unwrap().socket_timeout,
            Some(Duration::from_millis(750))
        );
    }

    /// Issue 12: a service config reaches the engine; an invalid one is an error naming its field.
    #[test]
    fn a6_a_service_config_is_validated_and_reaches_the_engine() {
        let mut options = ClientOptions::new(vec![ServerAddress::new("127.0.0.1", 1)]);
        let hedged = bson::doc! { "methodConfig": [{
        "name": [{ "service": "mongodb", "method": "find" }],
        "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0.01s" } }] };
        options.set_service_config(&hedged).unwrap();
        let engine = options.engine_options().unwrap();
        let policy = engine
            .service_config
            .as_ref()
            .and_then(|c| c.policy_for("find"));
        assert!(
            matches!(policy, Some(retry_core::service_config::MethodPolicy::Hedging(p)) if p.max_attempts() == 3),
            "{policy:?}"
        );
        let bad = bson::doc! { "methodConfig": [{
        "name": [{ "service": "mongodb", "method": "find" }],
        "hedgingPolicy": { "maxAttempts": 1 } }] };
        let error = options.set_service_config(&bad).unwrap_err();
        assert_eq!(
            error.option(),
            "serviceConfig.methodConfig[0].hedgingPolicy.maxAttempts"
        );
        assert_eq!(error.value(), "1");
        assert!(error.reason().contains("at least 2"), "{error}");
        assert!(options.service_config.is_some(), "the valid config stays");
    }

    /// URI-3 (review item 1): no error or warning of a URI, and no `Debug` of what it parses
    /// into, shows a password or a secret option's value, however the URI is malformed.
    #[test]
    fn uri3_secrets_never_show_in_errors_warnings_or_debug() {
        let leaks = |text: &str| text.contains("s3cr") || text.contains("3tPW");
        let failing = [
            "mongodb:/u:s3cr3tPW@h",
            "mongodb+srv://u:s3cr3tPW@a.example.com,b.example.com/",
            "mongodb+srv://u:s3cr3tPW@a.example.com:27018",
            "mongodb://u:s3cr/3tPW@h/db",
            "mongodb://u:s3cr?3tPW@h",
            "mongodb://u:12/s3cr3tPW@h/db",
            "mongodb://u:12/s3cr%ZZ3tPW@h",
            "mongodb://u:s3cr3tPW:x@h",
            "mongodb://u:s3cr3tPW@h/?tlsCertificateKeyFilePassword=%ZZs3cr3tPW",
            "mongodb://h/?proxyHost=p&proxyUsername=u&proxyPassword=s3cr3tPW&proxyPassword=s3cr3tPW",
            "mongodb://h/?tlsCertificateKeyFilePassword=s3cr3tPW",
        ];
        for uri in failing {
            let error = ClientOptions::parse(uri).unwrap_err();
            let printed = format!(
                "{error} {error:?} {}",
                crate::ConnectError::from(error.clone())
            );
            assert!(!leaks(&printed), "{uri}: {printed}");
        }
        let warning = [
            "mongodb://h/?tlsCertificateKeyFilePasword=s3cr3tPW",
            "mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN:s3cr3tPW,broken",
        ];
        for uri in warning {
            let cs = ConnectionString::parse(uri).unwrap();
            assert!(!cs.warnings().is_empty(), "{uri}");
            let printed = format!("{:?} {cs:?}", cs.warnings());
            assert!(!leaks(&printed), "{uri}: {printed}");
            let options = ClientOptions::parse(uri).unwrap();
            assert!(!leaks(&format!("{options:?}")), "{uri}");
        }
        let mut options = ClientOptions::new(vec![ServerAddress::new("127.0.0.1", 1)]);
        for name in [
            "proxyPassword",
            "PROXYPASSWORD",
            "tlsCertificateKeyFilePassword",
            "tlsCertificateKeyFilePasword",
            "authMechanismProperties",
        ] {
            let error = options.set(name, "s3cr3tPW").unwrap_err();
            assert!(!leaks(&format!("{error} {error:?}")), "{name}: {error}");
        }
    }

    #[test]
    fn a_given_seed_is_used_and_os_seeds_differ() {
        let mut options = ClientOptions::new(vec![ServerAddress::new("127.0.0.1", 1)]);
        options.seed = Some(42);
        assert_eq!(options.engine_options().unwrap().seed, 42);
        options.seed = None;
        let seeds: std::collections::BTreeSet<u64> = (0..8)
            .map(|_| options.engine_options().unwrap().seed)
            .collect();
        assert!(seeds.len() > 1, "OS seeds repeat: {seeds:?}");
    }

    #[test]
    fn au1_au3_uri_credentials_reach_the_engine_redacted() {
        let options =
            ClientOptions::parse("mongodb://al%3Aice:s3cr%40t@x/db?authSource=admin").unwrap();
        let credential = options.credential.as_ref().unwrap();
        assert_eq!(credential.username.as_deref(), Some("al:ice"));
        assert_eq!(credential.password.as_deref(), Some("s3cr@t"));
        assert_eq!(credential.source, "admin");
        let engine = options.engine_options().unwrap();
        let printed = format!(
            "{options:?} {engine:?} {:?}",
            ConnectionString::parse("mongodb://al%3Aice:s3cr%40t@x").unwrap()
        );
        assert!(
            !printed.contains("s3cr")
                && !printed.contains("al:ice")
                && !printed.contains("al%3Aice"),
            "{printed}"
        );
        assert!(format!("{:?}", engine.auth).contains("SCRAM-SHA-256"));
        let mut set = ClientOptions::new(vec![ServerAddress::new("x", 1)]);
        assert!(
            set.set("authSource", "admin").is_err(),
            "set `credential` instead"
        );
        let bad = ClientOptions::parse("mongodb://u:bad%40pass:word@x")
            .unwrap_err()
            .to_string();
        assert!(!bad.contains("bad"), "{bad}");
    }

    proptest::proptest! {
        #[test]
        fn no_uri_panics(rest in "[a-zA-Z0-9:/?&=,.%@\\[\\]-]{0,60}") {
            let uri = format!("mongodb://{rest}");
            if let Err(error) = ClientOptions::parse(&uri) {
                proptest::prop_assert!(!error.option().is_empty());
            }
        }
    }

    /// Versioned-api spec, `MongoClient` changes and "Sending Declared API Version": a declared
    /// version reaches the engine's handshake options (from which the engine puts it on every
    /// command); `strict` / `deprecationErrors` only when set; none by default.
    #[test]
    fn stable_api_declaration_reaches_the_engine_options() {
        let mut options = ClientOptions::new(vec![ServerAddress::new("127.0.0.1", 1)]);
        assert_eq!(options.engine_options().unwrap().handshake.server_api, None);
        options.server_api = Some(ServerApi::new(ServerApiVersion::V1).with_strict(true));
        let api = options.engine_options().unwrap().handshake.server_api;
        let expected = retry_core::handshake::ServerApi {
            version: "1".into(),
            strict: Some(true),
            deprecation_errors: None,
        };
        assert_eq!(api, Some(expected));
        options.server_api =
            Some(ServerApi::new(ServerApiVersion::V1).with_deprecation_errors(false));
        let api = options
            .engine_options()
            .unwrap()
            .handshake
            .server_api
            .unwrap();
        assert_eq!((api.strict, api.deprecation_errors), (None, Some(false)));
    }

    /// Versioned-api spec, "ServerApiVersion enumeration": an unknown version is a client-side
    /// error that names the option and the value; and no API option through the connection
    /// string ("No URI Options").
    #[test]
    fn stable_api_unknown_version_is_an_error_and_no_uri_option_declares_one() {
        assert_eq!("1".parse::<ServerApiVersion>(), Ok(ServerApiVersion::V1));
        for unknown in ["2", "", "1.0", "v1"] {
            let error = unknown.parse::<ServerApiVersion>().unwrap_err();
            assert_eq!(
                (error.option(), error.value()),
                ("serverApi.version", unknown)
            );
            assert!(
                error.to_string().contains("unknown Stable API version"),
                "{error}"
            );
        }
        let mut options = ClientOptions::new(Vec::new());
        for name in ["serverApi", "apiVersion", "apiStrict"] {
            assert!(options.set(name, "1").is_err(), "{name}");
        }
        if let Ok(parsed) = ClientOptions::parse("mongodb://127.0.0.1/?serverApi=1&apiVersion=1") {
            assert_eq!(parsed.server_api, None);
        }
    }

    /// Leftovers12 item 7 (LB-7, versioned-api "Command Syntax"; the engine's
    /// `EngineError::LoadBalancedStrictApi`): load-balanced mode with a strict Stable API is
    /// refused where the options are built, with an error naming both options and values, so a
    /// client fails at `connect` before its engine; `apiStrict` false or unset, or no load
    /// balancer, builds.
    #[test]
    fn item7_load_balanced_with_a_strict_server_api_names_both_options() {
        let mut options = ClientOptions::parse("mongodb://127.0.0.1/?loadBalanced=true").unwrap();
        options.server_api = Some(ServerApi::new(ServerApiVersion::V1).with_strict(true));
        let error = options.validate().unwrap_err();
        assert_eq!((error.option(), error.value()), ("loadBalanced", "true"));
        assert_eq!(error.conflicting(), Some(("apiStrict", "true")));
        assert!(
            error
                .to_string()
                .starts_with("invalid loadBalanced \"true\" with apiStrict \"true\": "),
            "{error}"
        );
        assert_eq!(options.engine_options().unwrap_err(), error);
        for strict in [None, Some(false)] {
            let api = ServerApi::new(ServerApiVersion::V1);
            options.server_api = Some(strict.map_or(api, |s| api.with_strict(s)));
            assert_eq!(options.validate(), Ok(()), "{strict:?}");
            let engine = options.engine_options().unwrap();
            let engine = retry_core::engine::Engine::new(engine, retry_core::time::Instant::ZERO);
            assert!(engine.is_ok(), "{strict:?}");
        }
        let mut direct = ClientOptions::new(vec![ServerAddress::new("127.0.0.1", 1)]);
        direct.server_api = Some(ServerApi::new(ServerApiVersion::V1).with_strict(true));
        assert_eq!(direct.validate(), Ok(()));
        assert_eq!(
            ClientOptions::parse("mongodb://a,b/?loadBalanced=true")
                .unwrap_err()
                .conflicting(),
            None
        );
    }
}
