//! `retry-lab probe <uri>`: connect to a server, run a ping with retries, print every event.
//! A `mongodb+srv` URI is resolved first (SRV-2..SRV-6) and the seed list it gives is printed.

use std::fmt;
use std::io::{self, Write};

use bson::doc;
use retry_core::engine::{CommandEvent, EngineEvent};
use retry_core::error::ErrorSummary;
use retry_core::retry::{OperationKind, RetryEvent};
use retry_core::time::Instant;
use retry_core::topology::SdamEvent;
use retry_driver::{resolve_seedlist, ConnectionString, Runtime};
use retry_tokio::{Client, ClientOptions, ConnectError, OptionsError, TokioRuntime};

/// Why a probe could not run.
#[derive(Debug)]
pub enum ProbeError {
    /// The URI or one of its options is invalid; the message names the option and the value.
    Options(OptionsError),
    /// The URI has values a driver would only warn about and ignore (URI-7): the probe refuses
    /// them, so that what it checks is the URI as written. Each message names the option.
    Ignored(Vec<String>),
    /// The client could not be created.
    Connect(ConnectError),
    /// The output could not be written.
    Output(io::Error),
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Options(e) => e.fmt(f),
            ProbeError::Ignored(warnings) => {
                write!(
                    f,
                    "the URI would be used only in part: {}",
                    warnings.join("; ")
                )
            }
            ProbeError::Connect(e) => e.fmt(f),
            ProbeError::Output(e) => write!(f, "cannot write the output: {e}"),
        }
    }
}

impl std::error::Error for ProbeError {}

impl From<io::Error> for ProbeError {
    fn from(e: io::Error) -> ProbeError {
        ProbeError::Output(e)
    }
}

/// Parses `uri` (refusing values a driver would ignore with a warning), connects, runs `{ping: 1}` on `admin` as a generic command (retried on overload
/// as the client's options say, BP-11), and writes each event to `out` as it arrives, then the
/// ping's result. Returns whether the ping succeeded. Must run inside a tokio runtime.
pub async fn probe(uri: &str, out: &mut impl Write) -> Result<bool, ProbeError> {
    let runtime =
        TokioRuntime::start().map_err(|e| ProbeError::Connect(ConnectError::Runtime(e)))?;
    probe_on(runtime, uri, out).await
}

/// [`probe`] on `runtime` (e.g. one whose DNS queries go to given name servers,
/// [`TokioRuntime::with_nameservers`]). A `mongodb+srv` URI's SRV and TXT records are looked up
/// through it first (SRV-2); a failed lookup or a seed list the rules refuse (SRV-3..SRV-6) is
/// [`ProbeError::Options`], naming the DNS name or the option.
pub async fn probe_on(
    runtime: TokioRuntime,
    uri: &str,
    out: &mut impl Write,
) -> Result<bool, ProbeError> {
    let mut cs = ConnectionString::parse(uri).map_err(ProbeError::Options)?;
    if cs.srv {
        // SRV-4: srvMaxHosts draws from a fresh seed on every probe.
        let seed =
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        cs = resolve_seedlist(&runtime, &cs, seed)
            .await
            .map_err(ProbeError::Options)?;
        let seeds: Vec<String> = cs
            .hosts
            .iter()
            .map(|h| format!("{}:{}", h.host, h.port.unwrap_or(27017)))
            .collect();
        writeln!(out, "seed list from DNS: {}", seeds.join(", "))?;
    }
    let options = ClientOptions::from_connection_string(&cs).map_err(ProbeError::Options)?;
    if !options.warnings.is_empty() {
        return Err(ProbeError::Ignored(options.warnings));
    }
    let client = Client::connect_on(runtime, options).map_err(ProbeError::Connect)?;
    let mut events = client.events();
    let ping = client.run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
    tokio::pin!(ping);
    // Prints events while the ping runs; the ping ends by its reply, its retries' end or the
    // server selection timeout, and the event stream only ends after it (at shutdown).
    let result = loop {
        tokio::select! {
            biased;
            Some((at, event)) = events.next_event() => writeln!(out, "{}", line(at, &event))?,
            result = &mut ping => break result,
        }
    };
    client.shutdown().await;
    for (at, event) in events.drain() {
        writeln!(out, "{}", line(at, &event))?;
    }
    match &result {
        Ok(reply) => writeln!(out, "ping succeeded: {reply}")?,
        Err(error) => {
            writeln!(out, "ping failed: {error}")?;
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                writeln!(out, "  caused by: {cause}")?;
                source = cause.source();
            }
        }
    }
    Ok(result.is_ok())
}

/// One event as a line: the time since the client started, then what happened.
pub fn line(at: Instant, event: &EngineEvent) -> String {
    let millis = at.since_origin().as_secs_f64() * 1000.0;
    format!("{millis:>10.3} ms  {}", describe(event))
}

/// An error summary in words: its class, its code if any, its labels.
fn summary(error: &ErrorSummary) -> String {
    let code = error
        .code
        .map_or_else(String::new, |c| format!(" code {c}"));
    format!("{:?} error{code}, labels {:?}", error.class, error.labels)
}

/// One event in words.
pub fn describe(event: &EngineEvent) -> String {
    match event {
        EngineEvent::OperationFinished { op, result, .. } => match result {
            Ok(reply) => match retry_core::wire::to_document(reply) {
                Ok(reply) => format!("operation {} finished: {reply}", op.0),
                Err(e) => format!("operation {} finished: {e}", op.0),
            },
            Err(error) => format!("operation {} failed: {error}", op.0),
        },
        EngineEvent::Operation { op, event } => {
            let op = op.0;
            match event {
                RetryEvent::CommandStarted { attempt, address } => {
                    format!("operation {op}: attempt {attempt} started on {address}")
                }
                RetryEvent::CommandSucceeded {
                    attempt,
                    address,
                    duration,
                } => format!(
                    "operation {op}: attempt {attempt} succeeded on {address} in {duration:?}"
                ),
                RetryEvent::CommandFailed {
                    attempt,
                    address,
                    duration,
                    error,
                } => format!(
                    "operation {op}: attempt {attempt} failed on {address} in {duration:?}: {}",
                    summary(error)
                ),
                RetryEvent::RetryScheduled {
                    retry,
                    delay,
                    reason,
                    deprioritized,
                } => {
                    let avoiding = deprioritized
                        .as_ref()
                        .map_or_else(String::new, |a| format!(", deprioritizing {a}"));
                    format!("operation {op}: retry {retry} in {delay:?} ({reason}){avoiding}")
                }
                RetryEvent::RetryDenied { reason, error } => {
                    format!("operation {op}: no retry ({reason}): {}", summary(error))
                }
            }
        }
        EngineEvent::Pool { address, event } => format!("pool {address}: {event:?}"),
        EngineEvent::Heartbeat { address, event } => format!("heartbeat {address}: {event:?}"),
        EngineEvent::Topology(event) => match event {
            SdamEvent::ServerDescriptionChanged {
                address,
                previous,
                new,
            } => {
                // Item 7: an Unknown server says why (the I/O error or decoder reason kept).
                let why = new
                    .error
                    .as_ref()
                    .map_or_else(String::new, |e| format!(" ({e})"));
                format!(
                    "server {address}: {:?} -> {:?}{why}",
                    previous.server_type, new.server_type
                )
            }
            SdamEvent::TopologyDescriptionChanged { new, .. } => format!("topology: {new}"),
            SdamEvent::ServerOpening { address } => format!("server {address}: opening"),
            SdamEvent::ServerClosed { address } => format!("server {address}: closed"),
            other => format!("topology: {other:?}"),
        },
        EngineEvent::CursorOpened { op, cursor } => {
            format!("operation {}: cursor {} opened", op.0, cursor.0)
        }
        EngineEvent::Command(event) => command(event),
        other => format!("{other:?}"),
    }
}

/// A command event in one line: its name, request id and, once it ended, its duration (EV-2).
fn command(event: &CommandEvent) -> String {
    match event {
        CommandEvent::Started { info, .. } => format!(
            "command {} request {} started on {}",
            info.command_name, info.request_id, info.address
        ),
        CommandEvent::Succeeded { info, duration, .. } => format!(
            "command {} request {} succeeded in {duration:?}",
            info.command_name, info.request_id
        ),
        CommandEvent::Failed {
            info,
            duration,
            failure,
        } => format!(
            "command {} request {} failed in {duration:?}: {failure}",
            info.command_name, info.request_id
        ),
        other => format!("{other:?}"),
    }
}
