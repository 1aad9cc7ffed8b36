//! The MongoDB connection string, parsed and validated exactly as the connection-string and
//! URI-options specs say (URI-1..URI-13), independently of what this client supports.
//!
//! [`ConnectionString::parse`] splits the URI (URI-2), checks and percent-decodes the userinfo
//! (URI-3), the hosts (URI-4) and the database (URI-5), reads every option of the URI-options
//! table with its type and range (URI-6..URI-9), and applies the spec's conflicts (URI-11,
//! URI-12). Unknown options, out-of-range values and empty values are warnings, and the option is
//! ignored (URI-7); structural errors and conflicts fail the parse. What the client then does with
//! the options — including refusing features it does not have — is
//! [`crate::ClientOptions::from_connection_string`]'s business.

use std::collections::BTreeMap;
use std::fmt;

use crate::credential::{self, UriAuth};
use crate::options::OptionsError;
use retry_core::auth::Credential;

/// The kind of a host in the seed list (URI-4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostKind {
    /// A dotted IPv4 address.
    Ipv4,
    /// An IP literal written in brackets (reported without them).
    IpLiteral,
    /// A host name (including `256.0.0.1`, which is not an IPv4 address).
    Hostname,
    /// A Unix domain socket path (percent-encoded in the URI, ending in `.sock`).
    Unix,
}

/// One host of the seed list.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Host {
    /// The host, percent-decoded, without IP-literal brackets.
    pub host: String,
    /// The port if one was written (URI-4: 1..=65535); the default is 27017.
    pub port: Option<u16>,
    /// What kind of host it is.
    pub kind: HostKind,
}

/// An option's value, typed as the URI-options table says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionValue {
    /// A boolean option.
    Bool(bool),
    /// An integer option (int32 or int64 by the table).
    Int(i64),
    /// A string option.
    Str(String),
    /// A comma-separated list (`compressors`).
    List(Vec<String>),
    /// A `key:value,...` option (`authMechanismProperties`).
    Map(Vec<(String, String)>),
    /// The ordered tag sets of the repeated `readPreferenceTags` (URI-9).
    TagSets(Vec<Vec<(String, String)>>),
}

/// A parsed connection string (see the module docs). `Debug` redacts the user name and password.
#[derive(Clone, PartialEq)]
#[non_exhaustive]
pub struct ConnectionString {
    /// Whether the scheme is `mongodb+srv` (SRV-1).
    pub srv: bool,
    /// The seed list, in order.
    pub hosts: Vec<Host>,
    /// The user name, when the URI has userinfo (URI-3).
    pub username: Option<String>,
    /// The password: `None` without `:`, `Some("")` for `user:@`.
    pub password: Option<String>,
    /// The database of the path (the default auth database), percent-decoded (URI-5).
    pub database: Option<String>,
    options: BTreeMap<&'static str, OptionValue>,
    pub(crate) warnings: Warnings,
    /// AU-1: the credential the userinfo and auth options describe.
    credential: Option<Credential>,
    /// SRV-6: a `mongodb+srv` string whose seed list came from its DNS records.
    seedlist_resolved: bool,
    /// What SRV polling needs of a resolved `mongodb+srv` string (set by
    /// [`crate::apply_seedlist`]).
    pub(crate) srv_polling: Option<crate::srv::SrvPolling>,
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |v: &Option<String>| v.as_ref().map(|_| "<redacted>");
        f.debug_struct("ConnectionString")
            .field("srv", &self.srv)
            .field("hosts", &self.hosts)
            .field("username", &redacted(&self.username))
            .field("password", &redacted(&self.password))
            .field("database", &self.database)
            .field("options", &RedactedOptions(&self.options))
            .field("warnings", &self.warnings.texts)
            .field("credential", &self.credential)
            .finish()
    }
}

/// What a URI warned about (URI-7, URI-8, URI-10): each warning's text, for the application to
/// log ([`ConnectionString::warnings`], [`crate::ClientOptions::warnings`]), and the same
/// warning as an error naming the option and the value as written, for the callers that refuse
/// what was dropped ([`crate::ClientOptions::parse_strict`], [`crate::Client::with_uri`];
/// review32 R1). A warning about a deprecated spelling that is applied in full (URI-8's legacy
/// booleans, URI-10's deprecated names when their replacement is absent) is only logged: nothing
/// of the URI was lost (review34 Y3).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Warnings {
    texts: Vec<String>,
    /// Each warning as an error, and whether its option and value were applied anyway.
    errors: Vec<(OptionsError, bool)>,
}

impl Warnings {
    /// Warns with `text` about what `error` names, which was dropped (ignored).
    pub(crate) fn push(&mut self, error: OptionsError, text: String) {
        self.texts.push(text);
        self.errors.push((error, false));
    }

    /// Warns with `text` about a deprecated spelling that `error` names, applied all the same.
    pub(crate) fn push_applied(&mut self, error: OptionsError, text: String) {
        self.texts.push(text);
        self.errors.push((error, true));
    }

    /// The warnings' texts, in order.
    pub(crate) fn texts(&self) -> &[String] {
        &self.texts
    }

    /// Appends `more`'s warnings.
    pub(crate) fn extend(&mut self, more: Warnings) {
        self.texts.extend(more.texts);
        self.errors.extend(more.errors);
    }

    /// House rule 11 (review32 R1): nothing dropped, or the first dropped option or value as an
    /// error, its reason followed by the other dropped ones' texts (`; and 2 more: ...`). The
    /// deprecated spellings applied all the same are not refused (review34 Y3).
    pub(crate) fn refuse(&self) -> Result<(), OptionsError> {
        let mut dropped = self
            .errors
            .iter()
            .zip(&self.texts)
            .filter(|((_, applied), _)| !applied);
        let Some(((first, _), _)) = dropped.next() else {
            return Ok(());
        };
        let mut error = first.clone();
        let more: Vec<&str> = dropped.map(|(_, text)| text.as_str()).collect();
        if !more.is_empty() {
            error.append_reason(&format!("; and {} more: {}", more.len(), more.join("; ")));
        }
        Err(error)
    }
}

/// Options whose values are secrets, left out of `Debug`, errors and warnings
/// (`authMechanismProperties` may hold `AWS_SESSION_TOKEN`).
const SECRET_OPTIONS: [&str; 3] = [
    "tlsCertificateKeyFilePassword",
    "proxyPassword",
    "authMechanismProperties",
];

/// The text that stands for a secret in errors, warnings and `Debug`.
pub(crate) const REDACTED: &str = "<redacted>";

/// `value` as errors and warnings may show it: [`REDACTED`] for the value of a secret option
/// (any spelling of its name), or of an option whose name is unknown (it may be a mistyped
/// secret).
pub(crate) fn shown<'a>(name: &str, value: &'a str) -> &'a str {
    match canonical(name) {
        Some((name, _)) if !SECRET_OPTIONS.contains(&name) => value,
        _ => REDACTED,
    }
}

/// `uri` as errors may show it: everything between the scheme's `://` and the last `@`
/// (the userinfo, however malformed the URI) is replaced by [`REDACTED`].
pub(crate) fn redact_uri(uri: &str) -> String {
    let Some(at) = uri.rfind('@') else {
        return uri.to_string();
    };
    let keep = uri
        .find("://")
        .map(|i| i + 3)
        .filter(|&i| i <= at)
        .unwrap_or(0);
    format!("{}{REDACTED}{}", &uri[..keep], &uri[at..])
}

/// The option map for `Debug`, with [`SECRET_OPTIONS`] redacted.
struct RedactedOptions<'a>(&'a BTreeMap<&'static str, OptionValue>);

impl fmt::Debug for RedactedOptions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.iter().map(|(name, value)| {
                let value: &dyn fmt::Debug = if SECRET_OPTIONS.contains(name) {
                    &REDACTED
                } else {
                    value
                };
                (name, value)
            }))
            .finish()
    }
}

/// How an option's value is read.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Kind {
    Bool,
    /// An integer in `min..=max`.
    Int(i64, i64),
    Str,
    /// A string that must not be empty (an empty value is an error, AU-10 / URI-12).
    NonEmpty,
    /// One of the listed values (compared ignoring ASCII case), stored as listed.
    OneOf(&'static [&'static str]),
    List,
    Map,
    Tags,
    /// `w`: a non-negative integer or a string (URI-12: negative is an error).
    W,
}

const I32: i64 = i32::MAX as i64;

/// The URI-options table: canonical name and how the value is read.
const OPTIONS: &[(&str, Kind)] = &[
    ("appName", Kind::Str),
    (
        "authMechanism",
        Kind::OneOf(&[
            "SCRAM-SHA-1",
            "SCRAM-SHA-256",
            "MONGODB-X509",
            "GSSAPI",
            "PLAIN",
            "MONGODB-AWS",
            "MONGODB-OIDC",
        ]),
    ),
    ("authMechanismProperties", Kind::Map),
    ("authSource", Kind::NonEmpty),
    ("compressors", Kind::List),
    ("connectTimeoutMS", Kind::Int(0, I32)),
    ("directConnection", Kind::Bool),
    ("enableOverloadRetargeting", Kind::Bool),
    ("heartbeatFrequencyMS", Kind::Int(500, I32)),
    ("journal", Kind::Bool),
    ("loadBalanced", Kind::Bool),
    ("localThresholdMS", Kind::Int(0, I32)),
    ("maxAdaptiveRetries", Kind::Int(0, I32)),
    ("maxConnecting", Kind::Int(1, I32)),
    ("maxIdleTimeMS", Kind::Int(0, I32)),
    ("maxPoolSize", Kind::Int(0, I32)),
    ("maxStalenessSeconds", Kind::Int(-1, I32)),
    ("minPoolSize", Kind::Int(0, I32)),
    ("proxyHost", Kind::Str),
    ("proxyPassword", Kind::NonEmpty),
    ("proxyPort", Kind::Int(0, 65_535)),
    ("proxyUsername", Kind::NonEmpty),
    ("readConcernLevel", Kind::Str),
    (
        "readPreference",
        Kind::OneOf(&[
            "primary",
            "primaryPreferred",
            "secondary",
            "secondaryPreferred",
            "nearest",
        ]),
    ),
    ("readPreferenceTags", Kind::Tags),
    ("replicaSet", Kind::Str),
    ("retryReads", Kind::Bool),
    ("retryWrites", Kind::Bool),
    (
        "serverMonitoringMode",
        Kind::OneOf(&["stream", "poll", "auto"]),
    ),
    ("serverSelectionTimeoutMS", Kind::Int(0, I32)),
    ("serverSelectionTryOnce", Kind::Bool),
    ("socketTimeoutMS", Kind::Int(0, I32)),
    ("srvMaxHosts", Kind::Int(0, I32)),
    ("srvServiceName", Kind::NonEmpty),
    // `ssl` is an alias of `tls`, kept apart until the two are compared (URI-11).
    ("ssl", Kind::Bool),
    ("timeoutMS", Kind::Int(0, i64::MAX)),
    ("tls", Kind::Bool),
    ("tlsAllowInvalidCertificates", Kind::Bool),
    ("tlsAllowInvalidHostnames", Kind::Bool),
    ("tlsCAFile", Kind::Str),
    ("tlsCertificateKeyFile", Kind::Str),
    ("tlsCertificateKeyFilePassword", Kind::Str),
    ("tlsDisableCertificateRevocationCheck", Kind::Bool),
    ("tlsDisableOCSPEndpointCheck", Kind::Bool),
    ("tlsInsecure", Kind::Bool),
    ("w", Kind::W),
    ("waitQueueTimeoutMS", Kind::Int(0, I32)),
    ("wTimeoutMS", Kind::Int(0, i64::MAX)),
    ("zlibCompressionLevel", Kind::Int(-1, 9)),
];

/// Deprecated names and the option that replaces them (URI-10).
const DEPRECATED: &[(&str, &str)] = &[("wtimeout", "wTimeoutMS")];

/// Options that are errors when repeated (URI-12: SOCKS5).
const NO_REPEAT: &[&str] = &["proxyHost", "proxyPort", "proxyUsername", "proxyPassword"];

/// Options that may not be given together (URI-11), whatever their values.
const TLS_CONFLICTS: &[(&str, &str)] = &[
    ("tlsInsecure", "tlsAllowInvalidCertificates"),
    ("tlsInsecure", "tlsAllowInvalidHostnames"),
    ("tlsInsecure", "tlsDisableOCSPEndpointCheck"),
    ("tlsInsecure", "tlsDisableCertificateRevocationCheck"),
    ("tlsAllowInvalidCertificates", "tlsDisableOCSPEndpointCheck"),
    (
        "tlsAllowInvalidCertificates",
        "tlsDisableCertificateRevocationCheck",
    ),
    (
        "tlsDisableOCSPEndpointCheck",
        "tlsDisableCertificateRevocationCheck",
    ),
];

fn lookup(name: &str) -> Option<(&'static str, Kind)> {
    OPTIONS
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .copied()
}

impl ConnectionString {
    /// Parses and validates `uri` (see the module docs). The error names the part or option at
    /// fault and the value.
    pub fn parse(uri: &str) -> Result<ConnectionString, OptionsError> {
        let uri_error = |reason: &str| OptionsError::new("uri", &redact_uri(uri), reason);
        let (srv, rest) = if let Some(rest) = uri.strip_prefix("mongodb://") {
            (false, rest)
        } else if let Some(rest) = uri.strip_prefix("mongodb+srv://") {
            (true, rest)
        } else {
            return Err(uri_error("must start with mongodb:// or mongodb+srv://"));
        };
        // URI-2: the host part ends at the first '/' or '?'.
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (path, query) = match tail.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (tail, None),
        };
        let (userinfo, hosts_part) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        // An unescaped '/' or '?' in a password ends the authority early, so the hosts and the
        // database may hold part of it: their errors then show no value.
        let may_hold_userinfo = tail.contains('@');
        let part_error = |part: &str, e: OptionsError| match may_hold_userinfo {
            true => OptionsError::new(part, REDACTED, e.reason()),
            false => e,
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let (user, password) = parse_userinfo(userinfo)?;
                (Some(user), password)
            }
        };
        if hosts_part.is_empty() {
            return Err(OptionsError::new(
                "host",
                hosts_part,
                "at least one host is required",
            ));
        }
        let hosts = hosts_part
            .split(',')
            .map(parse_host)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| part_error("host", e))?;
        if srv && (hosts.len() != 1 || hosts[0].port.is_some()) {
            return Err(uri_error(
                "mongodb+srv takes exactly one host name and no port (SRV-1)",
            ));
        }
        let database = match path.strip_prefix('/') {
            None | Some("") => None,
            Some(db) => {
                let db = percent_decode(db)
                    .map_err(|r| part_error("database", OptionsError::new("database", db, r)))?;
                if db.contains(['/', '\\', ' ', '"', '$']) {
                    return Err(part_error(
                        "database",
                        OptionsError::new(
                            "database",
                            &db,
                            "must not contain '/', '\\', ' ', '\"' or '$'",
                        ),
                    ));
                }
                Some(db)
            }
        };
        let mut parsed = ConnectionString {
            srv,
            hosts,
            username,
            password,
            database,
            options: BTreeMap::new(),
            warnings: Warnings::default(),
            credential: None,
            seedlist_resolved: false,
            srv_polling: None,
        };
        if let Some(query) = query {
            parsed.parse_options(query)?;
        }
        parsed.validate()?;
        parsed.credential = parsed.uri_credential()?;
        Ok(parsed)
    }

    /// The value of an option, by any spelling of its name (URI-6: case-insensitive; `ssl` is
    /// reported as `tls`, deprecated names as their replacement).
    pub fn option(&self, name: &str) -> Option<&OptionValue> {
        let (canonical, _) = canonical(name)?;
        self.options
            .get(if canonical == "ssl" { "tls" } else { canonical })
    }

    /// Every option that was set, by canonical name.
    pub fn options(&self) -> impl Iterator<Item = (&'static str, &OptionValue)> {
        self.options.iter().map(|(k, v)| (*k, v))
    }

    /// AU-1: the credential of the userinfo and the auth options, checked by the auth spec's
    /// rules for its mechanism (AU-10, AU-13); `None` when the URI has neither
    /// userinfo nor `authMechanism`.
    pub fn credential(&self) -> Option<&Credential> {
        self.credential.as_ref()
    }

    fn uri_credential(&self) -> Result<Option<Credential>, OptionsError> {
        let text = |name: &str| match self.options.get(name) {
            Some(OptionValue::Str(s)) => Some(s.as_str()),
            _ => None,
        };
        let properties = match self.options.get("authMechanismProperties") {
            Some(OptionValue::Map(pairs)) => pairs.as_slice(),
            _ => &[],
        };
        credential::from_uri(UriAuth {
            username: self.username.as_deref(),
            password: self.password.as_deref(),
            database: self.database.as_deref(),
            mechanism: text("authMechanism"),
            source: text("authSource"),
            properties,
        })
    }

    /// Whether this is a `mongodb+srv` string whose seed list came from DNS
    /// ([`crate::resolve_seedlist`]); `false` for `mongodb://`.
    pub fn seedlist_resolved(&self) -> bool {
        self.seedlist_resolved
    }

    /// SRV-5, SRV-6: this `mongodb+srv` string with `hosts` as its seed list and the options of
    /// its TXT record (`txt`, already restricted to the allowed keys) under its own, checked
    /// again as a whole.
    pub(crate) fn with_seedlist(
        &self,
        hosts: Vec<Host>,
        txt: Option<&str>,
    ) -> Result<ConnectionString, OptionsError> {
        let mut resolved = self.clone();
        resolved.hosts = hosts;
        resolved.seedlist_resolved = true;
        if let Some(txt) = txt {
            let mut from_txt = ConnectionString {
                options: BTreeMap::new(),
                warnings: Warnings::default(),
                ..self.clone()
            };
            from_txt.parse_options(txt)?;
            for (name, value) in from_txt.options {
                resolved.options.entry(name).or_insert(value);
            }
            resolved.warnings.extend(from_txt.warnings);
        }
        resolved.validate()?;
        resolved.credential = resolved.uri_credential()?;
        Ok(resolved)
    }

    /// The warnings (URI-7, URI-8, URI-10): unknown options, ignored values, deprecated names.
    pub fn warnings(&self) -> &[String] {
        self.warnings.texts()
    }

    fn parse_options(&mut self, query: &str) -> Result<(), OptionsError> {
        let mut seen: Vec<&'static str> = Vec::new();
        let mut deprecated: Vec<(&str, &'static str, OptionValue)> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let Some((raw_name, raw_value)) = pair.split_once('=').filter(|(n, _)| !n.is_empty())
            else {
                return Err(OptionsError::new(
                    "option",
                    pair,
                    "expected name=value (URI-6)",
                ));
            };
            let value = percent_decode(raw_value).map_err(|reason| {
                OptionsError::new(raw_name, shown(raw_name, raw_value), reason)
            })?;
            let replacement = DEPRECATED
                .iter()
                .find(|(old, _)| old.eq_ignore_ascii_case(raw_name));
            let Some((name, kind)) =
                lookup(raw_name).or_else(|| replacement.and_then(|r| lookup(r.1)))
            else {
                // No value: an unknown name may be a mistyped secret option.
                self.warnings.push(
                    OptionsError::new(raw_name, shown(raw_name, &value), "unknown option (URI-7)"),
                    format!("Unsupported option '{raw_name}' ignored"),
                );
                continue;
            };
            let Some(parsed) = read_value(name, kind, &value, &mut self.warnings)? else {
                continue;
            };
            if let Some((old, new)) = replacement {
                // Applied unless its replacement is given too (then a second warning, below).
                self.warnings.push_applied(
                    OptionsError::new(
                        raw_name,
                        shown(name, &value),
                        format!("a deprecated name; use '{new}' (URI-10)"),
                    ),
                    format!("option '{old}' is deprecated; use '{new}'"),
                );
                deprecated.push((raw_name, name, parsed));
                continue;
            }
            if seen.contains(&name) {
                if NO_REPEAT.contains(&name) {
                    return Err(OptionsError::new(
                        raw_name,
                        shown(name, &value),
                        "may be given only once",
                    ));
                }
                if !matches!(kind, Kind::Tags) {
                    self.warnings.push(
                        OptionsError::new(raw_name, shown(name, &value), "given more than once"),
                        format!("option '{name}' is repeated; the last value is used"),
                    );
                }
            }
            seen.push(name);
            match (self.options.get_mut(name), parsed) {
                (Some(OptionValue::TagSets(sets)), OptionValue::TagSets(more)) => sets.extend(more),
                (_, parsed) => {
                    self.options.insert(name, parsed);
                }
            }
        }
        // URI-10: a deprecated name counts only when its replacement is absent.
        let mut applied: Vec<&str> = Vec::new();
        for (raw_name, name, value) in deprecated {
            if applied.contains(&name) {
                // Review36 V4: a deprecated spelling given twice: the last value is used, the
                // earlier one dropped, as for any repeated option.
                self.warnings.push(
                    OptionsError::new(
                        raw_name,
                        shown(name, &value.to_string()),
                        "given more than once",
                    ),
                    format!("option '{raw_name}' is repeated; the last value is used"),
                );
            }
            if seen.contains(&name) {
                self.warnings.push(
                    OptionsError::new(
                        raw_name,
                        shown(name, &value.to_string()),
                        format!("a deprecated spelling of '{name}', which is given too (URI-10)"),
                    ),
                    format!("a deprecated spelling of '{name}' is ignored because '{name}' is set"),
                );
            } else {
                self.options.insert(name, value);
                applied.push(name);
            }
        }
        Ok(())
    }

    fn flag(&self, name: &str) -> Option<bool> {
        match self.options.get(name) {
            Some(OptionValue::Bool(b)) => Some(*b),
            _ => None,
        }
    }

    fn int(&self, name: &str) -> Option<i64> {
        match self.options.get(name) {
            Some(OptionValue::Int(v)) => Some(*v),
            _ => None,
        }
    }

    /// The value of option `name` as errors show it ([`shown`]).
    fn written(&self, name: &str) -> String {
        let value = self.options.get(name).map(ToString::to_string);
        shown(name, &value.unwrap_or_default()).to_string()
    }

    /// The conflicts of URI-11 and URI-12 (and SRV-1, SRV-6, LB-2 where no DNS is needed).
    /// Each error names the option and the value as written, and the other option of a pair
    /// ([`OptionsError::conflicting`]; review32 R16).
    fn validate(&mut self) -> Result<(), OptionsError> {
        let written = |name: &str| self.written(name);
        let one = |name: &str, reason: &str| Err(OptionsError::new(name, &written(name), reason));
        let pair = |a: &str, b: &str, reason: &str| {
            Err(OptionsError::conflict(
                (a, &written(a)),
                (b, &written(b)),
                reason,
            ))
        };
        let has = |name: &str| self.options.contains_key(name);
        for (a, b) in TLS_CONFLICTS {
            if has(a) && has(b) {
                return pair(a, b, "may not be given together (URI-11)");
            }
        }
        if let (Some(tls), Some(ssl)) = (self.flag("tls"), self.flag("ssl")) {
            if tls != ssl {
                return pair("tls", "ssl", "'tls' and 'ssl' disagree (URI-11)");
            }
        }
        if self.flag("directConnection") == Some(true) && (self.hosts.len() > 1 || self.srv) {
            let what = if self.srv {
                "mongodb+srv".to_string()
            } else {
                format!("{} hosts", self.hosts.len())
            };
            return one(
                "directConnection",
                &format!("needs exactly one host and mongodb://, not {what} (URI-11)"),
            );
        }
        if self.flag("loadBalanced") == Some(true) {
            if self.hosts.len() > 1 {
                return one(
                    "loadBalanced",
                    &format!("takes exactly one host, not {} (LB-2)", self.hosts.len()),
                );
            }
            if has("replicaSet") {
                return pair(
                    "loadBalanced",
                    "replicaSet",
                    "may not be given together (LB-2)",
                );
            }
            if self.flag("directConnection") == Some(true) {
                return pair(
                    "loadBalanced",
                    "directConnection",
                    "may not both be true (LB-2)",
                );
            }
        }
        if !self.srv {
            for name in ["srvServiceName", "srvMaxHosts"] {
                if has(name) {
                    return one(name, "needs mongodb+srv (SRV-1)");
                }
            }
        }
        if self.int("srvMaxHosts").is_some_and(|n| n > 0) {
            if has("replicaSet") {
                return pair(
                    "srvMaxHosts",
                    "replicaSet",
                    "may not be given together (SRV-6)",
                );
            }
            if self.flag("loadBalanced") == Some(true) {
                return pair(
                    "srvMaxHosts",
                    "loadBalanced",
                    "may not be given with loadBalanced=true (SRV-6)",
                );
            }
        }
        if !has("proxyHost") {
            for name in ["proxyPort", "proxyUsername", "proxyPassword"] {
                if has(name) {
                    return one(name, "needs proxyHost (URI-12)");
                }
            }
        }
        if has("proxyUsername") != has("proxyPassword") {
            let (given, missing) = if has("proxyUsername") {
                ("proxyUsername", "proxyPassword")
            } else {
                ("proxyPassword", "proxyUsername")
            };
            return one(given, &format!("needs {missing} too (URI-12)"));
        }
        if self.int("w") == Some(0) && self.flag("journal") == Some(true) {
            return pair("w", "journal", "w=0 cannot be used with journal=true");
        }
        let primary = match self.options.get("readPreference") {
            Some(OptionValue::Str(mode)) => mode == "primary",
            _ => true,
        };
        if primary {
            let tags = matches!(self.options.get("readPreferenceTags"),
                Some(OptionValue::TagSets(sets)) if sets.iter().any(|s| !s.is_empty()));
            let staleness = self.int("maxStalenessSeconds").is_some_and(|s| s > 0);
            if tags || staleness {
                let name = if tags {
                    "readPreferenceTags"
                } else {
                    "maxStalenessSeconds"
                };
                let mode = match has("readPreference") {
                    true => written("readPreference"),
                    false => "primary (the default)".to_string(),
                };
                return Err(OptionsError::conflict(
                    (name, &written(name)),
                    ("readPreference", &mode),
                    "cannot be used with read preference primary (SS-2)",
                ));
            }
        }
        if let (Some(min), Some(max)) = (self.int("minPoolSize"), self.int("maxPoolSize")) {
            if max > 0 && min > max {
                return pair(
                    "minPoolSize",
                    "maxPoolSize",
                    "minPoolSize is larger than maxPoolSize",
                );
            }
        }
        // The alias now folds into `tls`.
        if let Some(ssl) = self.options.remove("ssl") {
            self.options.entry("tls").or_insert(ssl);
        }
        Ok(())
    }
}

/// The canonical name and kind of an option, by any spelling of its name (URI-6), deprecated
/// names included (URI-10); `None` for an unknown option.
pub(crate) fn canonical(name: &str) -> Option<(&'static str, Kind)> {
    lookup(name).or_else(|| {
        DEPRECATED
            .iter()
            .find(|(old, _)| old.eq_ignore_ascii_case(name))
            .and_then(|(_, new)| lookup(new))
    })
}

/// Reads one value of option `name`; `Ok(None)` (with a warning pushed) when it is ignored
/// (URI-7, URI-8).
pub(crate) fn read_value(
    name: &'static str,
    kind: Kind,
    value: &str,
    warnings: &mut Warnings,
) -> Result<Option<OptionValue>, OptionsError> {
    let ignored = |warnings: &mut Warnings, reason: String| {
        let value = shown(name, value);
        let text = format!("Unsupported value for '{name}': {value:?} ({reason}); ignored");
        warnings.push(OptionsError::new(name, value, reason), text);
        Ok(None)
    };
    let parsed = match kind {
        Kind::Bool => match value {
            "true" => OptionValue::Bool(true),
            "false" => OptionValue::Bool(false),
            // URI-8: legacy spellings work with a deprecation warning.
            "1" | "yes" | "y" | "t" | "0" | "-1" | "no" | "n" | "f" => {
                let b = matches!(value, "1" | "yes" | "y" | "t");
                warnings.push_applied(
                    OptionsError::new(
                        name,
                        value,
                        format!("a deprecated spelling of '{b}' (URI-8)"),
                    ),
                    format!("'{name}={value}' is a deprecated spelling of '{b}'"),
                );
                OptionValue::Bool(b)
            }
            _ => return ignored(warnings, "expected true or false".into()),
        },
        Kind::Int(min, max) => match value.parse::<i64>() {
            Ok(v) if (min..=max).contains(&v) && !value.starts_with('+') => OptionValue::Int(v),
            Ok(_) => return ignored(warnings, format!("expected an integer from {min} to {max}")),
            Err(_) => return ignored(warnings, "expected an integer".into()),
        },
        Kind::Str => OptionValue::Str(value.into()),
        Kind::NonEmpty if value.is_empty() => {
            return Err(OptionsError::new(
                name,
                shown(name, value),
                "must not be empty",
            ))
        }
        Kind::NonEmpty => OptionValue::Str(value.into()),
        Kind::OneOf(values) => match values.iter().find(|v| v.eq_ignore_ascii_case(value)) {
            Some(v) => OptionValue::Str((*v).into()),
            None if name == "authMechanism" => {
                return Err(OptionsError::new(
                    name,
                    value,
                    format!("expected one of {}", values.join(", ")),
                ))
            }
            None => return ignored(warnings, format!("expected one of {}", values.join(", "))),
        },
        Kind::List => OptionValue::List(
            value
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        ),
        Kind::Map | Kind::Tags => match key_values(value) {
            Some(pairs) if matches!(kind, Kind::Map) => OptionValue::Map(pairs),
            Some(pairs) => OptionValue::TagSets(vec![pairs]),
            None => return ignored(warnings, "expected key:value pairs separated by ','".into()),
        },
        Kind::W => match value.parse::<i64>() {
            Ok(w) if w >= 0 => OptionValue::Int(w),
            Ok(_) => return Err(OptionsError::new(name, value, "must not be negative")),
            Err(_) if value.is_empty() => return ignored(warnings, "empty".into()),
            Err(_) => OptionValue::Str(value.into()),
        },
    };
    Ok(Some(parsed))
}

/// URI-3: `user[:password]`, percent-decoded; an unescaped `@` or a second `:` is an error, as is
/// any character outside RFC 3986 userinfo. Errors never show the userinfo (it holds the
/// password).
fn parse_userinfo(userinfo: &str) -> Result<(String, Option<String>), OptionsError> {
    let bad = |reason: &str| OptionsError::new("userinfo", REDACTED, reason);
    if userinfo.contains('@') {
        return Err(bad(
            "an '@' in the user name or password must be escaped as %40",
        ));
    }
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=%:".contains(c) || !c.is_ascii();
    if !userinfo.chars().all(allowed) {
        return Err(bad(
            "characters outside RFC 3986 userinfo must be percent-encoded",
        ));
    }
    let (user, password) = match userinfo.split_once(':') {
        Some((_, password)) if password.contains(':') => {
            return Err(bad("a ':' in the password must be escaped as %3A"))
        }
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    let user = percent_decode(user).map_err(|r| bad(&r))?;
    if user.is_empty() {
        return Err(bad("the user name is empty"));
    }
    let password = password
        .map(percent_decode)
        .transpose()
        .map_err(|r| bad(&r))?;
    Ok((user, password))
}

/// URI-4: one host of the seed list.
fn parse_host(raw: &str) -> Result<Host, OptionsError> {
    let bad = |reason: &str| OptionsError::new("host", raw, reason);
    let port = |p: &str| -> Result<u16, OptionsError> {
        match p.parse::<u16>() {
            Ok(port) if port > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Ok(port),
            _ => Err(bad("port must be an integer from 1 to 65535")),
        }
    };
    if let Some(rest) = raw.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
        let port = match after {
            "" => None,
            _ => Some(port(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| bad("expected ':' after ']'"))?,
            )?),
        };
        if host.is_empty() {
            return Err(bad("empty IP literal"));
        }
        return Ok(Host {
            host: host.into(),
            port,
            kind: HostKind::IpLiteral,
        });
    }
    let (host, port) = match raw.split_once(':') {
        Some((host, p)) => (host, Some(port(p)?)),
        None => (raw, None),
    };
    let host = percent_decode(host).map_err(|r| bad(&r))?;
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let kind = if host.contains('/') {
        if !host.ends_with(".sock") {
            return Err(bad("a Unix domain socket path must end in .sock"));
        }
        HostKind::Unix
    } else if host.parse::<std::net::Ipv4Addr>().is_ok() {
        HostKind::Ipv4
    } else {
        HostKind::Hostname
    };
    Ok(Host { host, port, kind })
}

/// URI-9: `k:v,k:v` split at the first ':' of each pair (after percent-decoding); `None` for a
/// broken pair. An empty value is the empty tag set.
fn key_values(value: &str) -> Option<Vec<(String, String)>> {
    if value.is_empty() {
        return Some(Vec::new());
    }
    value
        .split(',')
        .map(|pair| {
            pair.split_once(':')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// Strict percent-decoding: `%` must be followed by two hex digits (the `percent-encoding` crate
/// passes a bad escape through unchanged, so it is checked first) and the result must be UTF-8.
pub(crate) fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    if let Some(at) = bytes.iter().enumerate().position(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
    }) {
        return Err(format!(
            "bad percent-escape at byte {at}: '%' must be followed by two hex digits"
        ));
    }
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| "not UTF-8 once percent-decoded".to_string())
}

impl fmt::Display for OptionValue {
    /// The value as a URI would write it (before percent-encoding).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs = |f: &mut fmt::Formatter<'_>, pairs: &[(String, String)]| {
            let joined: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}:{v}")).collect();
            f.write_str(&joined.join(","))
        };
        match self {
            OptionValue::Bool(b) => write!(f, "{b}"),
            OptionValue::Int(v) => write!(f, "{v}"),
            OptionValue::Str(s) => f.write_str(s),
            OptionValue::List(items) => f.write_str(&items.join(",")),
            OptionValue::Map(map) => pairs(f, map),
            OptionValue::TagSets(sets) => {
                for (i, set) in sets.iter().enumerate() {
                    if i > 0 {
                        f.write_str("&")?;
                    }
                    pairs(f, set)?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for HostKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostKind::Ipv4 => "ipv4",
            HostKind::IpLiteral => "ip_literal",
            HostKind::Hostname => "hostname",
            HostKind::Unix => "unix",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(uri: &str) -> ConnectionString {
        ConnectionString::parse(uri).unwrap_or_else(|e| panic!("{uri}: {e}"))
    }

    #[test]
    fn uri2_uri3_userinfo_hosts_database_and_options() {
        let cs = parse(
            "mongodb://%40l%3Ace:p%3Aw@[::1]:27018,127.0.0.1,Example.com:1/my%3Ddb?w=majority",
        );
        assert_eq!(cs.username.as_deref(), Some("@l:ce"));
        assert_eq!(cs.password.as_deref(), Some("p:w"));
        assert_eq!(cs.database.as_deref(), Some("my=db"));
        let kinds: Vec<HostKind> = cs.hosts.iter().map(|h| h.kind).collect();
        assert_eq!(
            kinds,
            [HostKind::IpLiteral, HostKind::Ipv4, HostKind::Hostname]
        );
        assert_eq!(cs.hosts[0].host, "::1");
        assert_eq!(cs.hosts[1].port, None);
        assert_eq!(cs.option("W"), Some(&OptionValue::Str("majority".into())));
        let socket = parse("mongodb://%2Ftmp%2Fmongodb-27017.sock/");
        assert_eq!(socket.hosts[0].kind, HostKind::Unix);
    }

    #[test]
    fn uri1_uri3_uri4_uri6_structural_errors() {
        for uri in [
            "",
            "mongo://x",
            "mongodb://",
            "mongodb://localhost::27017",
            "mongodb://localhost:0",
            "mongodb://localhost:65536",
            "mongodb://[::1]:foo",
            "mongodb://example.com/?w",
            "mongodb://alice:foo:bar@127.0.0.1",
            "mongodb://alice@@127.0.0.1",
            "mongodb://alice%foo:bar@127.0.0.1",
            "mongodb://alice/@localhost/db",
            "mongodb:///tmp/mongodb-27017.sock/",
            "mongodb+srv://a.example.com,b.example.com",
            "mongodb+srv://a.example.com:27018",
            "mongodb://x/?appName=%ZZ",
            "mongodb://x/?appName=%F",
        ] {
            assert!(ConnectionString::parse(uri).is_err(), "{uri:?}");
        }
    }

    #[test]
    fn uri7_uri8_unknown_options_and_bad_values_warn_and_are_ignored() {
        for uri in [
            "mongodb://x/?foo=bar",
            "mongodb://x/?connectTimeoutMS=-2",
            "mongodb://x/?maxIdleTimeMS=",
            "mongodb://x/?journal=invalid",
            "mongodb://x/?maxConnecting=0",
            "mongodb://x/?readPreferenceTags=invalid",
            "mongodb://x/?serverMonitoringMode=invalid",
            "mongodb://x/?heartbeatFrequencyMS=10",
        ] {
            let cs = parse(uri);
            assert_eq!(cs.warnings().len(), 1, "{uri}: {:?}", cs.warnings());
            assert_eq!(cs.options().count(), 0, "{uri}");
        }
        let legacy = parse("mongodb://x/?loadBalanced=1");
        assert_eq!(
            legacy.option("loadbalanced"),
            Some(&OptionValue::Bool(true))
        );
        assert_eq!(legacy.warnings().len(), 1);
    }

    #[test]
    fn uri9_uri10_lists_tags_and_deprecated_names() {
        let cs = parse("mongodb://x/?readPreference=secondary&readPreferenceTags=dc:ny,rack:1&readPreferenceTags=&compressors=zlib,snappy");
        assert_eq!(
            cs.option("readPreferenceTags"),
            Some(&OptionValue::TagSets(vec![
                vec![("dc".into(), "ny".into()), ("rack".into(), "1".into())],
                vec![]
            ]))
        );
        assert_eq!(
            cs.option("compressors"),
            Some(&OptionValue::List(vec!["zlib".into(), "snappy".into()]))
        );
        let cs = parse("mongodb://x/?wtimeout=5&wtimeoutMS=10");
        assert_eq!(cs.option("wtimeoutms"), Some(&OptionValue::Int(10)));
        assert!(!cs.warnings().is_empty());
        let cs = parse("mongodb://x/?wtimeout=5");
        assert_eq!(cs.option("wTimeoutMS"), Some(&OptionValue::Int(5)));
    }

    #[test]
    fn uri11_uri12_conflicts_are_errors() {
        for uri in [
            "mongodb://x/?tlsInsecure=true&tlsAllowInvalidCertificates=false",
            "mongodb://x/?tls=true&ssl=false",
            "mongodb://a,b/?directConnection=true",
            "mongodb://a,b/?loadBalanced=true",
            "mongodb://a/?loadBalanced=true&replicaSet=rs",
            "mongodb://a/?loadBalanced=true&directConnection=true",
            "mongodb://a/?srvMaxHosts=2",
            "mongodb://a/?proxyPort=1080",
            "mongodb://a/?proxyHost=h&proxyHost=i",
            "mongodb://a/?proxyHost=h&proxyUsername=u",
            "mongodb://a/?authSource=",
            "mongodb://a/?w=-2",
            "mongodb://a/?w=0&journal=true",
            "mongodb://a/?readPreferenceTags=dc:ny",
            "mongodb://a/?maxStalenessSeconds=120",
            "mongodb://a/?minPoolSize=5&maxPoolSize=2",
        ] {
            assert!(ConnectionString::parse(uri).is_err(), "{uri}");
        }
        let fine = parse("mongodb://a/?tls=true&ssl=true&loadBalanced=true&directConnection=false");
        assert_eq!(fine.option("ssl"), Some(&OptionValue::Bool(true)));
    }

    #[test]
    fn uri6_percent_escapes_are_strict() {
        assert_eq!(percent_decode("a%41%c3%bcb").as_deref(), Ok("aAüb"));
        assert_eq!(percent_decode("plain").as_deref(), Ok("plain"));
        for bad in ["%", "%4", "a%zz", "%4g", "%FF"] {
            assert!(percent_decode(bad).is_err(), "{bad}");
        }
    }

    /// The initial TopologyType and set name of the topology a client of `cs` starts (URI-13):
    /// `cs` through the client's options and the engine's options to the SDAM topology.
    fn initial_topology(
        cs: &ConnectionString,
    ) -> (retry_core::topology::TopologyType, Option<String>) {
        let options = crate::ClientOptions::from_connection_string(cs)
            .unwrap_or_else(|e| panic!("{cs:?}: {e}"));
        let engine = options.engine_options().expect("valid engine options");
        let topology =
            retry_core::topology::Topology::new(engine.topology, retry_core::time::Instant::ZERO)
                .expect("valid topology settings");
        let description = topology.description();
        (description.topology_type, description.set_name.clone())
    }

    /// URI-13 (SDAM initial TopologyType): `directConnection=true` → Single (with `replicaSet`,
    /// the set name to check); unset, as `false`, → Unknown, or ReplicaSetNoPrimary with
    /// `replicaSet`, whatever the number of hosts (one host does not make it Single);
    /// `loadBalanced=true` → LoadBalanced (LB-3).
    #[test]
    fn uri13_the_initial_topology_type_of_a_mongodb_uri() {
        use retry_core::topology::TopologyType::*;
        let rs = || Some("rs".to_string());
        for (uri, expected) in [
            ("mongodb://a/", (Unknown, None)),
            ("mongodb://a/?directConnection=false", (Unknown, None)),
            ("mongodb://a,b/", (Unknown, None)),
            ("mongodb://a/?directConnection=true", (Single, None)),
            (
                "mongodb://a/?directConnection=true&replicaSet=rs",
                (Single, rs()),
            ),
            ("mongodb://a/?replicaSet=rs", (ReplicaSetNoPrimary, rs())),
            ("mongodb://a,b/?replicaSet=rs", (ReplicaSetNoPrimary, rs())),
            (
                "mongodb://a,b/?replicaSet=rs&directConnection=false",
                (ReplicaSetNoPrimary, rs()),
            ),
            ("mongodb://a/?loadBalanced=true", (LoadBalanced, None)),
        ] {
            assert_eq!(initial_topology(&parse(uri)), expected, "{uri}");
        }
    }

    /// URI-13 for `mongodb+srv`: without `directConnection` or `replicaSet` the topology starts
    /// Unknown, never inferred from the number of hosts the SRV records give (one or three);
    /// `replicaSet` (from the URI or a TXT record, SRV-5) makes it ReplicaSetNoPrimary and
    /// `loadBalanced=true` in a TXT record LoadBalanced.
    #[test]
    fn uri13_a_mongodb_srv_uri_starts_unknown_whatever_its_host_count() {
        use crate::srv::{apply_seedlist, SrvRecord};
        use retry_core::topology::TopologyType::*;
        let record = |host: &str| SrvRecord {
            target: format!("{host}.test.build.10gen.cc"),
            port: 27017,
            ttl: None,
        };
        let one = || vec![record("a")];
        let three = || vec![record("a"), record("b"), record("c")];
        let srv = |uri: &str, records: Vec<SrvRecord>, txt: &[Vec<String>]| {
            let cs = parse(uri);
            initial_topology(&apply_seedlist(&cs, records, txt, 7).expect("resolved"))
        };
        let plain = "mongodb+srv://test1.test.build.10gen.cc/";
        assert_eq!(srv(plain, one(), &[]), (Unknown, None), "one host");
        assert_eq!(srv(plain, three(), &[]), (Unknown, None), "three hosts");
        let rs = Some("rs".to_string());
        let named = "mongodb+srv://test1.test.build.10gen.cc/?replicaSet=rs";
        assert_eq!(srv(named, one(), &[]), (ReplicaSetNoPrimary, rs.clone()));
        let txt = [vec!["replicaSet=rs".to_string()]];
        assert_eq!(srv(plain, one(), &txt), (ReplicaSetNoPrimary, rs));
        let txt = [vec!["loadBalanced=true".to_string()]];
        assert_eq!(srv(plain, one(), &txt), (LoadBalanced, None));
    }

    /// TO-11 (MO-4): `timeoutMS` is for operations only. The client keeps it for each operation's
    /// deadline, but the engine's monitoring timeouts (`connectTimeoutMS` for monitoring and RTT
    /// connections and their checks, `heartbeatFrequencyMS` on top for awaited replies) and the
    /// pooled connections' `socketTimeoutMS` are the same with it as without it.
    #[test]
    fn to11_timeout_ms_changes_no_monitoring_timeout() {
        for (without, with) in [
            ("mongodb://a/", "mongodb://a/?timeoutMS=100"),
            (
                "mongodb://a/?connectTimeoutMS=2500&heartbeatFrequencyMS=700",
                "mongodb://a/?connectTimeoutMS=2500&heartbeatFrequencyMS=700&timeoutMS=100",
            ),
            (
                "mongodb://a/?socketTimeoutMS=750",
                "mongodb://a/?socketTimeoutMS=750&timeoutMS=100",
            ),
        ] {
            let without = crate::ClientOptions::parse(without).unwrap();
            let with = crate::ClientOptions::parse(with).unwrap();
            assert_eq!(without.timeout, None);
            assert_eq!(with.timeout, Some(std::time::Duration::from_millis(100)));
            let (without, with) = (
                without.engine_options().unwrap(),
                with.engine_options().unwrap(),
            );
            assert_eq!(with.connect_timeout, without.connect_timeout);
            assert_eq!(with.heartbeat_frequency, without.heartbeat_frequency);
            assert_eq!(with.socket_timeout, without.socket_timeout);
            assert_eq!(with.server_monitoring_mode, without.server_monitoring_mode);
            assert_eq!(with.selection, without.selection);
        }
    }
}
