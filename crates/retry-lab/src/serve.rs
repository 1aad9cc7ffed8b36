//! `retry-lab serve`: the fault-injecting test server (retry-testkit) from the command line, so
//! that any driver's test suite can use it. It listens on 127.0.0.1 only, prints a URI that
//! reaches it (never a password) and runs until Ctrl-C. See `docs/testkit.md`.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};
use retry_testkit::{
    FailCommand, IngressLimit, RateLimit, ReplicaSetMember, Role, ScramUser, ServerConfig,
    ServerTls, TestCa, TestServer,
};

/// `retry-lab serve`'s options.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct ServeArgs {
    /// What the server says it is in its hello reply.
    #[arg(long, value_enum, default_value_t = ServeRole::Standalone)]
    pub role: ServeRole,
    /// The replica set name of `--role primary`.
    #[arg(long, default_value = "rs0")]
    pub set_name: String,
    /// The port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Serve TLS with a certificate for 127.0.0.1 and localhost from a CA generated now; the
    /// CA is written to `--tls-ca-file` for clients' `tlsCAFile`.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls: bool,
    /// Where `--tls` writes the generated CA certificate (PEM); default: a file in the
    /// system's temporary directory, named in the printed URI.
    #[arg(long, value_name = "FILE", requires = "tls")]
    pub tls_ca_file: Option<PathBuf>,
    /// Serve TLS with this PEM certificate chain (leaf first) instead of a generated one.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// A SCRAM user of `admin` (SCRAM-SHA-256 and SCRAM-SHA-1), as NAME:PASSWORD; repeat for
    /// more. With any user, commands other than the handshake, ping and buildInfo need
    /// authentication.
    #[arg(long = "user", value_name = "NAME:PASSWORD", value_parser = parse_user)]
    pub users: Vec<ScramUser>,
    /// A JSON file with a `configureFailPoint: "failCommand"` command, set at start.
    #[arg(long, value_name = "FILE")]
    pub fail_point: Option<PathBuf>,
    /// Requests per second the ingress limiter admits; rejected requests get code 462 with both
    /// overload labels. No limiter when absent.
    #[arg(long, value_name = "PER_SECOND")]
    pub ingress_rate: Option<f64>,
    /// The ingress limiter's burst.
    #[arg(long, default_value_t = 1, requires = "ingress_rate")]
    pub ingress_burst: u32,
    /// New connections per second the connection limiter admits; others are reset before the
    /// handshake. No limiter when absent.
    #[arg(long, value_name = "PER_SECOND")]
    pub connection_rate: Option<f64>,
    /// The connection limiter's burst.
    #[arg(long, default_value_t = 1, requires = "connection_rate")]
    pub connection_burst: u32,
}

/// The roles `retry-lab serve` offers.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeRole {
    /// A standalone `mongod`.
    Standalone,
    /// A `mongos` router.
    Mongos,
    /// The primary of a one-member replica set (`--set-name`).
    Primary,
    /// A load balancer in front of a `mongos` (adds `serviceId` for `loadBalanced=true`).
    LoadBalancer,
}

fn parse_user(text: &str) -> Result<ScramUser, String> {
    match text.split_once(':') {
        Some((name, password)) if !name.is_empty() => Ok(ScramUser::new(name, password)),
        _ => Err("expected NAME:PASSWORD".to_string()),
    }
}

/// Why the server could not start.
#[derive(Debug)]
pub enum ServeError {
    /// A file could not be read or written, or the port could not be bound.
    Io(String, io::Error),
    /// The fail point file is not a valid `configureFailPoint` command.
    FailPoint(String),
    /// A certificate could not be generated.
    Certificate(String),
}

impl fmt::Display for ServeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServeError::Io(what, e) => write!(f, "{what}: {e}"),
            ServeError::FailPoint(reason) => write!(f, "--fail-point: {reason}"),
            ServeError::Certificate(reason) => write!(f, "cannot generate a certificate: {reason}"),
        }
    }
}

impl std::error::Error for ServeError {}

/// A started server and the URI that reaches it.
#[derive(Debug)]
pub struct Served {
    /// The server.
    pub server: TestServer,
    /// A `mongodb://` URI for it, without credentials.
    pub uri: String,
}

/// Reads a fail point file: one `configureFailPoint: "failCommand"` command as JSON.
fn read_fail_point(path: &Path) -> Result<Option<FailCommand>, ServeError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ServeError::Io(format!("--fail-point {}", path.display()), e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ServeError::FailPoint(format!("{}: {e}", path.display())))?;
    let bson::Bson::Document(command) = to_bson(json) else {
        return Err(ServeError::FailPoint(format!(
            "{}: not a JSON object",
            path.display()
        )));
    };
    FailCommand::from_command(&command)
        .map_err(|e| ServeError::FailPoint(format!("{}: {e}", path.display())))
}

/// JSON as BSON: integers as int32 when they fit, else int64; other numbers as doubles.
fn to_bson(json: serde_json::Value) -> bson::Bson {
    use serde_json::Value;
    match json {
        Value::Null => bson::Bson::Null,
        Value::Bool(b) => bson::Bson::Boolean(b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => i32::try_from(i).map_or(bson::Bson::Int64(i), bson::Bson::Int32),
            None => bson::Bson::Double(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => bson::Bson::String(s),
        Value::Array(items) => bson::Bson::Array(items.into_iter().map(to_bson).collect()),
        Value::Object(map) => {
            bson::Bson::Document(map.into_iter().map(|(k, v)| (k, to_bson(v))).collect())
        }
    }
}

/// Starts the server `args` describe (inside a tokio runtime).
pub async fn start(args: &ServeArgs) -> Result<Served, ServeError> {
    let role = match args.role {
        ServeRole::Standalone => Role::Standalone,
        ServeRole::Mongos => Role::Mongos,
        ServeRole::Primary => Role::ReplicaSetMember(ReplicaSetMember::primary(&args.set_name)),
        ServeRole::LoadBalancer => Role::LoadBalancer { service_id: true },
    };
    let mut config = ServerConfig::new(role);
    config.port = args.port;
    config.users = args.users.clone();
    config.ingress_limit = args
        .ingress_rate
        .map(|rate| IngressLimit::new(RateLimit::new(rate, args.ingress_burst)));
    config.connection_limit = args
        .connection_rate
        .map(|rate| RateLimit::new(rate, args.connection_burst));
    let mut query = Vec::new();
    let mut ca_path = None;
    if args.tls {
        let ca = TestCa::new().map_err(|e| ServeError::Certificate(e.to_string()))?;
        config.tls = Some(
            ca.server_tls(&retry_testkit::ServerCertificate::Valid)
                .map_err(|e| ServeError::Certificate(e.to_string()))?,
        );
        ca_path = Some((ca, args.tls_ca_file.clone()));
    } else if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(
            ServerTls::from_pem_files(cert, key)
                .map_err(|e| ServeError::Io(format!("--tls-cert {}", cert.display()), e))?,
        );
        query.push("tls=true".to_string());
    }
    let fail_point = match &args.fail_point {
        Some(path) => read_fail_point(path)?,
        None => None,
    };
    let server = TestServer::start(config)
        .await
        .map_err(|e| ServeError::Io(format!("127.0.0.1:{}", args.port), e))?;
    let address = server.address();
    if let Some((ca, path)) = ca_path {
        let path = path.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("retry-lab-serve-ca-{}.pem", address.port()))
        });
        ca.write_ca_file(&path)
            .map_err(|e| ServeError::Io(format!("--tls-ca-file {}", path.display()), e))?;
        query.push("tls=true".to_string());
        query.push(format!("tlsCAFile={}", path.display()));
    }
    server.handle().set_fail_command(fail_point);
    match args.role {
        ServeRole::Primary => query.push(format!("replicaSet={}", args.set_name)),
        ServeRole::LoadBalancer => query.push("loadBalanced=true".to_string()),
        ServeRole::Standalone | ServeRole::Mongos => {}
    }
    let mut uri = format!("mongodb://{address}/");
    if !query.is_empty() {
        uri.push('?');
        uri.push_str(&query.join("&"));
    }
    Ok(Served { server, uri })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServeArgs, clap::Error> {
        Wrapper::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .map(|w| w.args)
    }

    #[test]
    fn users_tls_and_limiters_parse_and_conflicts_are_refused() {
        let args = parse(&[
            "--role",
            "primary",
            "--user",
            "alice:pw:with:colons",
            "--tls",
            "--ingress-rate",
            "5",
        ])
        .unwrap();
        assert_eq!(args.role, ServeRole::Primary);
        assert_eq!(args.users[0].name, "alice");
        assert_eq!(args.users[0].password, "pw:with:colons");
        assert!(args.tls);
        assert_eq!(args.ingress_rate, Some(5.0));
        assert!(parse(&["--user", "nopassword"]).is_err());
        assert!(parse(&["--tls", "--tls-cert", "c.pem", "--tls-key", "k.pem"]).is_err());
        assert!(parse(&["--tls-cert", "c.pem"]).is_err());
        assert!(parse(&["--ingress-burst", "3"]).is_err());
    }

    #[tokio::test]
    async fn the_uri_names_tls_the_ca_file_and_the_role_and_the_fail_point_is_set() {
        let dir = std::env::temp_dir();
        let fail = dir.join(format!("retry-lab-serve-fp-{}.json", std::process::id()));
        std::fs::write(
            &fail,
            r#"{"configureFailPoint": "failCommand", "mode": {"times": 1},
                "data": {"failCommands": ["ping"], "errorCode": 91}}"#,
        )
        .unwrap();
        let ca = dir.join(format!(
            "retry-lab-serve-ca-test-{}.pem",
            std::process::id()
        ));
        let args = parse(&[
            "--role",
            "primary",
            "--tls",
            "--tls-ca-file",
            ca.to_str().unwrap(),
            "--fail-point",
            fail.to_str().unwrap(),
        ])
        .unwrap();
        let served = start(&args).await.unwrap();
        let port = served.server.address().port();
        assert_eq!(
            served.uri,
            format!(
                "mongodb://127.0.0.1:{port}/?tls=true&tlsCAFile={}&replicaSet=rs0",
                ca.display()
            )
        );
        assert!(std::fs::read_to_string(&ca)
            .unwrap()
            .starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(served.server.handle().fail_command().is_some());
        served.server.shutdown().await;
        let _ = std::fs::remove_file(&ca);
        std::fs::write(&fail, "{\"configureFailPoint\": \"failCommand\"").unwrap();
        let bad = parse(&["--fail-point", fail.to_str().unwrap()]).unwrap();
        assert!(matches!(
            start(&bad).await.unwrap_err(),
            ServeError::FailPoint(_)
        ));
        let _ = std::fs::remove_file(&fail);
    }
}
