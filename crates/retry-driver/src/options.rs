//! Client options under the names of the MongoDB URI options, and `mongodb://` URIs.

use core::fmt;
use core::time::Duration;
use std::hash::BuildHasher;

use retry_core::address::ServerAddress;
use retry_core::engine::EngineOptions;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::policy::{RetryOptions, RetryPolicy, DEFAULT_MAX_ADAPTIVE_RETRIES};
use retry_core::selection::SelectionSettings;
use retry_core::topology::TopologySettings;

/// SDAM: the smallest `heartbeatFrequencyMS`.
const MIN_HEARTBEAT_FREQUENCY: Duration = Duration::from_millis(500);

/// An option, or a URI, that could not be used: which option, what value, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionsError {
    option: String,
    value: String,
    reason: String,
}

impl OptionsError {
    fn new(option: &str, value: &str, reason: impl Into<String>) -> OptionsError {
        OptionsError {
            option: option.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }

    /// The option's name as written (`uri` for the URI as a whole, `host` for a host).
    pub fn option(&self) -> &str {
        &self.option
    }

    /// The value given.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid {} {:?}: {}",
            self.option, self.value, self.reason
        )
    }
}

impl std::error::Error for OptionsError {}

/// What a client is configured with. Field names follow the URI options; [`ClientOptions::set`]
/// takes them by those names.
#[derive(Clone, Debug)]
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
    /// `timeoutMS`: `None` leaves CSOT off; `Some(0)` turns it on without a limit.
    pub timeout: Option<Duration>,
    /// `serverSelectionTimeoutMS` (default 30 s).
    pub server_selection_timeout: Duration,
    /// `localThresholdMS` (default 15 ms).
    pub local_threshold: Duration,
    /// `heartbeatFrequencyMS` (default 10 s, at least 500 ms).
    pub heartbeat_frequency: Duration,
    /// `appName`.
    pub app_name: Option<String>,
    /// The retry policy (not a URI option); the current spec's by default.
    pub policy: RetryPolicy,
    /// The seed of the engine's RNG (not a URI option); `None` draws one from the OS.
    pub seed: Option<u64>,
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
            timeout: None,
            server_selection_timeout: selection.server_selection_timeout,
            local_threshold: selection.local_threshold,
            heartbeat_frequency: selection.heartbeat_frequency,
            app_name: None,
            policy: RetryPolicy::Current,
            seed: None,
        }
    }

    /// Parses `mongodb://host[:port][,host[:port]...][/[database]][?name=value[&name=value...]]`.
    /// Values are percent-decoded; option names are case-insensitive; credentials, `mongodb+srv` and options this client does
    /// not support are errors that name them.
    pub fn parse(uri: &str) -> Result<ClientOptions, OptionsError> {
        let rest = uri.strip_prefix("mongodb://").ok_or_else(|| {
            OptionsError::new(
                "uri",
                uri,
                "must start with mongodb:// (mongodb+srv is not supported)",
            )
        })?;
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let hosts_part = authority.split_once('/').map_or(authority, |(h, _)| h);
        if hosts_part.contains('@') {
            return Err(OptionsError::new(
                "uri",
                uri,
                "credentials are not supported (no authentication)",
            ));
        }
        if hosts_part.is_empty() {
            return Err(OptionsError::new(
                "host",
                hosts_part,
                "at least one host is required",
            ));
        }
        let hosts = hosts_part
            .split(',')
            .map(|h| {
                h.parse::<ServerAddress>()
                    .map_err(|e| OptionsError::new("host", h, e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut options = ClientOptions::new(hosts);
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .filter(|(name, _)| !name.is_empty())
                .ok_or_else(|| OptionsError::new("option", pair, "expected name=value"))?;
            let decoded = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| OptionsError::new(name, value, "not UTF-8 once percent-decoded"))?;
            options.set(name, &decoded)?;
        }
        Ok(options)
    }

    /// Sets the URI option `name` (case-insensitive) from its string `value`.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), OptionsError> {
        let boolean = || match value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(OptionsError::new(name, value, "expected true or false")),
        };
        let millis = || {
            value
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| {
                    OptionsError::new(
                        name,
                        value,
                        "expected a non-negative integer of milliseconds",
                    )
                })
        };
        match name.to_ascii_lowercase().as_str() {
            "retryreads" => self.retry_reads = boolean()?,
            "retrywrites" => self.retry_writes = boolean()?,
            "maxadaptiveretries" => {
                self.max_adaptive_retries = value.parse().map_err(|_| {
                    OptionsError::new(name, value, "expected a non-negative integer")
                })?
            }
            "enableoverloadretargeting" => self.enable_overload_retargeting = boolean()?,
            "loadbalanced" => self.load_balanced = boolean()?,
            "directconnection" => self.direct_connection = boolean()?,
            "timeoutms" => self.timeout = Some(millis()?),
            "serverselectiontimeoutms" => self.server_selection_timeout = millis()?,
            "localthresholdms" => self.local_threshold = millis()?,
            "heartbeatfrequencyms" => {
                let frequency = millis()?;
                if frequency < MIN_HEARTBEAT_FREQUENCY {
                    return Err(OptionsError::new(name, value, "must be at least 500"));
                }
                self.heartbeat_frequency = frequency;
            }
            "appname" => {
                // The engine's metadata rules decide what an application name may be.
                ClientMetadata::new("", "")
                    .with_application_name(value)
                    .map_err(|e| OptionsError::new(name, value, e.to_string()))?;
                self.app_name = Some(value.to_string());
            }
            _ => {
                return Err(OptionsError::new(
                    name,
                    value,
                    "unknown or unsupported option",
                ))
            }
        }
        Ok(())
    }

    /// The engine's options; the RNG seed is [`ClientOptions::seed`] or one from the OS.
    pub fn engine_options(&self) -> Result<EngineOptions, OptionsError> {
        let mut topology = TopologySettings::new(self.hosts.clone());
        topology.load_balanced = self.load_balanced;
        topology.direct_connection = self.direct_connection;
        let mut metadata = ClientMetadata::new("retry-driver", env!("CARGO_PKG_VERSION"));
        if let Some(name) = &self.app_name {
            metadata = metadata
                .with_application_name(name.clone())
                .map_err(|e| OptionsError::new("appName", name, e.to_string()))?;
        }
        let mut handshake = HandshakeOptions::new();
        handshake.metadata = metadata;
        handshake.load_balanced = self.load_balanced;
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
        options.seed = self.seed.unwrap_or_else(os_seed);
        Ok(options)
    }
}

/// A seed from the OS: std's `RandomState` keys come from the OS's randomness.
fn os_seed() -> u64 {
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
    fn bad_uris_and_values_name_the_option_and_the_value() {
        let cases = [
            ("http://x", "uri", "http://x"),
            ("mongodb+srv://x", "uri", "mongodb+srv://x"),
            ("mongodb://u:p@x", "uri", "mongodb://u:p@x"),
            ("mongodb://", "host", ""),
            ("mongodb://x:notaport", "host", "x:notaport"),
            ("mongodb://x/?retryReads=yes", "retryReads", "yes"),
            (
                "mongodb://x/?maxAdaptiveRetries=-1",
                "maxAdaptiveRetries",
                "-1",
            ),
            ("mongodb://x/?timeoutMS=soon", "timeoutMS", "soon"),
            (
                "mongodb://x/?heartbeatFrequencyMS=10",
                "heartbeatFrequencyMS",
                "10",
            ),
            ("mongodb://x/?tls=true", "tls", "true"),
            ("mongodb://x/?loadBalanced", "option", "loadBalanced"),
            ("mongodb://x/?=1", "option", "=1"),
            ("mongodb://x/?appName=%FF", "appName", "%FF"),
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

    proptest::proptest! {
        #[test]
        fn no_uri_panics(rest in "[a-zA-Z0-9:/?&=,.%@\\[\\]-]{0,60}") {
            let uri = format!("mongodb://{rest}");
            if let Err(error) = ClientOptions::parse(&uri) {
                proptest::prop_assert!(!error.option().is_empty());
            }
        }
    }
}
