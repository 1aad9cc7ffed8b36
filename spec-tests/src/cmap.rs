//! The CMAP format tests (`connection-monitoring-and-pooling/tests/cmap-format`) against
//! [`retry_core::pool::Pool`], in virtual time.
//!
//! Unit files run as the format's README says, with connections that establish at once. The
//! integration files need a server only for their `failCommand` fail point on `hello`; here the
//! fail point is applied to the simulated handshakes instead: `blockConnection` + `blockTimeMS`
//! delays establishment, `errorCode` fails it (and, as SDAM does for an unlabelled handshake error,
//! clears the pool first), with the `times` / `alwaysOn` modes. Threads are checkouts that have not
//! been answered yet; `wait`, `waitForEvent` and `waitForThread` advance the virtual clock.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use retry_core::address::ServerAddress;
use retry_core::error::OperationError;
use retry_core::pool::{
    CheckoutError, CheckoutId, ConnectionId, Pool, PoolAction, PoolEvent, PoolOptions, Purpose,
};
use retry_core::time::Instant;
use serde_json::{json, Map, Value};

use crate::corpus;

/// How long `waitForEvent` and `waitForThread` wait (virtual time) when the file gives no timeout.
const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The most clock steps one wait may take.
const MAX_STEPS: usize = 100_000;

/// Runs one CMAP format file.
pub fn run_file(path: &Path) -> Result<(), String> {
    let test = corpus::read_json(path)?;
    let mut runner = Runner::new(&test)?;
    let operations = test["operations"].as_array().ok_or("no operations")?;
    let mut main_error = None;
    for op in operations {
        if let Err(error) = runner.operation(op)? {
            main_error = Some(error);
            break;
        }
    }
    match (&test["error"], main_error) {
        (Value::Null, None) => {}
        (Value::Null, Some(e)) => return Err(format!("unexpected error: {e}")),
        (expected, None) => return Err(format!("expected error {expected}, got none")),
        (expected, Some(actual)) => matches(&actual, expected, "error")?,
    }
    let ignore: Vec<&str> = test["ignore"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let actual: Vec<Value> = runner
        .events
        .iter()
        .filter(|e| !ignore.contains(&e["type"].as_str().unwrap_or_default()))
        .cloned()
        .collect();
    let expected = test["events"].as_array().ok_or("no events")?;
    for (i, want) in expected.iter().enumerate() {
        let got = actual.get(i).ok_or_else(|| {
            format!(
                "event {i}: expected {want}, but only {} events: {actual:?}",
                actual.len()
            )
        })?;
        matches(got, want, &format!("event {i}"))
            .map_err(|e| format!("{e}\nall events: {actual:#?}"))?;
    }
    Ok(())
}

/// The simulated `failCommand` fail point on `hello`.
struct FailPoint {
    remaining: Option<u64>,
    block: Duration,
    error_code: Option<i32>,
}

/// A checkout not yet answered: the thread that asked, or the main thread.
struct Pending {
    thread: Option<String>,
    label: Option<String>,
}

struct Runner {
    pool: Pool,
    address: ServerAddress,
    now: Instant,
    events: Vec<Value>,
    labels: BTreeMap<String, ConnectionId>,
    pending: BTreeMap<CheckoutId, Pending>,
    /// Checkouts that finished with an error, by thread.
    thread_errors: BTreeMap<String, Value>,
    main_result: BTreeMap<CheckoutId, Result<(), Value>>,
    /// Handshakes in progress: when they finish, and whether they fail.
    establishing: Vec<(Instant, ConnectionId, Option<i32>)>,
    fail_point: Option<FailPoint>,
}

impl Runner {
    fn new(test: &Value) -> Result<Runner, String> {
        let address = ServerAddress::new("cmap-test", 27017);
        let options = pool_options(&test["poolOptions"])?;
        let fail_point = match &test["failPoint"] {
            Value::Null => None,
            fp => Some(fail_point(fp)?),
        };
        let mut runner = Runner {
            pool: Pool::new(address.clone(), options),
            address,
            now: Instant::ZERO,
            events: Vec::new(),
            labels: BTreeMap::new(),
            pending: BTreeMap::new(),
            thread_errors: BTreeMap::new(),
            main_result: BTreeMap::new(),
            establishing: Vec::new(),
            fail_point,
        };
        runner.settle();
        Ok(runner)
    }

    /// Runs one operation; the inner `Err` is an error thrown on the main thread.
    fn operation(&mut self, op: &Value) -> Result<Result<(), Value>, String> {
        let name = op["name"].as_str().ok_or("operation without a name")?;
        let thread = op["thread"].as_str().map(str::to_string);
        match name {
            "start" => {}
            "ready" => self.pool.ready(self.now),
            "clear" => {
                let interrupt = op["interruptInUseConnections"].as_bool().unwrap_or(false);
                self.pool.clear(None, interrupt, "test clear", self.now);
            }
            "close" => self.pool.close(self.now),
            "checkIn" => {
                let label = op["connection"]
                    .as_str()
                    .ok_or("checkIn without a connection")?;
                let id = *self
                    .labels
                    .get(label)
                    .ok_or_else(|| format!("unknown label {label}"))?;
                self.pool.check_in(id, true, self.now);
            }
            "checkOut" => {
                let label = op["label"].as_str().map(str::to_string);
                let checkout = self.pool.check_out(Purpose::Other, None, self.now);
                let is_main = thread.is_none();
                self.pending.insert(checkout, Pending { thread, label });
                self.settle();
                if is_main {
                    self.advance_until(DEFAULT_WAIT, |r| r.main_result.contains_key(&checkout))?;
                    if let Some(Err(e)) = self.main_result.remove(&checkout) {
                        return Ok(Err(e));
                    }
                }
            }
            "wait" => {
                let ms = op["ms"].as_u64().ok_or("wait without ms")?;
                let until = self.now.saturating_add(Duration::from_millis(ms));
                self.advance_to(until);
            }
            "waitForEvent" => {
                let event = op["event"]
                    .as_str()
                    .ok_or("waitForEvent without event")?
                    .to_string();
                let count = op["count"].as_u64().ok_or("waitForEvent without count")? as usize;
                let timeout = op["timeout"]
                    .as_u64()
                    .map_or(DEFAULT_WAIT, Duration::from_millis);
                self.advance_until(timeout, |r| {
                    r.events
                        .iter()
                        .filter(|e| e["type"] == event.as_str())
                        .count()
                        >= count
                })
                .map_err(|e| format!("waiting for {count} {event}: {e}"))?;
            }
            "waitForThread" => {
                let target = op["target"]
                    .as_str()
                    .ok_or("waitForThread without target")?
                    .to_string();
                self.advance_until(DEFAULT_WAIT, |r| {
                    !r.pending
                        .values()
                        .any(|p| p.thread.as_deref() == Some(target.as_str()))
                })
                .map_err(|e| format!("waiting for {target}: {e}"))?;
                if let Some(error) = self.thread_errors.remove(&target) {
                    return Ok(Err(error));
                }
            }
            other => return Err(format!("unknown operation {other}")),
        }
        self.settle();
        Ok(Ok(()))
    }

    /// Advances the clock until `done` holds, or fails after `limit` of virtual time.
    fn advance_until(
        &mut self,
        limit: Duration,
        done: impl Fn(&Runner) -> bool,
    ) -> Result<(), String> {
        let deadline = self.now.saturating_add(limit);
        for _ in 0..MAX_STEPS {
            if done(self) {
                return Ok(());
            }
            match self.next_wakeup().filter(|t| *t <= deadline) {
                Some(t) => self.step_to(t),
                None => return Err(format!("not done after {limit:?} of virtual time")),
            }
        }
        Err("too many steps".into())
    }

    /// Advances the clock to `until`, handling every timer and handshake due on the way.
    fn advance_to(&mut self, until: Instant) {
        for _ in 0..MAX_STEPS {
            match self.next_wakeup().filter(|t| *t <= until) {
                Some(t) => self.step_to(t),
                None => break,
            }
        }
        self.now = self.now.max(until);
        self.pool.handle_timeout(self.now);
        self.settle();
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let handshakes = self.establishing.iter().map(|(t, _, _)| *t);
        handshakes.chain(self.pool.poll_timeout()).min()
    }

    fn step_to(&mut self, t: Instant) {
        self.now = self.now.max(t);
        let (due, later): (Vec<_>, Vec<_>) =
            self.establishing.drain(..).partition(|(at, _, _)| *at <= t);
        self.establishing = later;
        for (_, connection, error) in due {
            self.finish_handshake(connection, error);
        }
        self.pool.handle_timeout(self.now);
        self.settle();
    }

    fn finish_handshake(&mut self, connection: ConnectionId, error_code: Option<i32>) {
        match error_code {
            None => self.pool.handle_established(connection, None, self.now),
            Some(code) => {
                let reply = bson::doc! { "ok": 0, "code": code, "errmsg": "failpoint" };
                let error = OperationError::from_reply(&reply, &self.address)
                    .unwrap_or_else(|| OperationError::server_selection("unreachable"));
                // SDAM clears the pool for an unlabelled handshake error before the connection closes.
                if !error.is_overload() {
                    self.pool.clear(None, false, "handshake failed", self.now);
                }
                self.pool
                    .handle_establish_failed(connection, error, self.now);
            }
        }
    }

    /// Drains the pool: records events, answers checkouts, starts handshakes.
    fn settle(&mut self) {
        for _ in 0..MAX_STEPS {
            let mut progressed = false;
            while let Some(event) = self.pool.poll_event() {
                let json = self.event_json(event);
                self.events.push(json);
                progressed = true;
            }
            while let Some(action) = self.pool.poll_action() {
                progressed = true;
                match action {
                    PoolAction::Establish { connection } => {
                        let (delay, error) = self.handshake_outcome();
                        if delay.is_zero() {
                            self.finish_handshake(connection, error);
                        } else {
                            self.establishing.push((
                                self.now.saturating_add(delay),
                                connection,
                                error,
                            ));
                        }
                    }
                    PoolAction::Close { connection, .. } => {
                        self.establishing.retain(|(_, c, _)| *c != connection);
                    }
                    // CM-4: whatever used the interrupted connection fails and gives it back.
                    PoolAction::Interrupt { connection } => {
                        self.pool.check_in(connection, false, self.now);
                    }
                    PoolAction::CheckedOut {
                        checkout,
                        connection,
                    } => {
                        if let Some(p) = self.pending.remove(&checkout) {
                            if let Some(label) = p.label {
                                self.labels.insert(label, connection);
                            }
                            if p.thread.is_none() {
                                self.main_result.insert(checkout, Ok(()));
                            }
                        }
                    }
                    PoolAction::CheckoutFailed { checkout, error } => {
                        if let Some(p) = self.pending.remove(&checkout) {
                            let json = error_json(&error);
                            match p.thread {
                                Some(thread) => {
                                    self.thread_errors.insert(thread, json);
                                }
                                None => {
                                    self.main_result.insert(checkout, Err(json));
                                }
                            }
                        }
                    }
                }
            }
            if !progressed {
                return;
            }
        }
    }

    /// What the fail point does to the next handshake.
    fn handshake_outcome(&mut self) -> (Duration, Option<i32>) {
        let Some(fp) = &mut self.fail_point else {
            return (Duration::ZERO, None);
        };
        match &mut fp.remaining {
            Some(0) => return (Duration::ZERO, None),
            Some(n) => *n -= 1,
            None => {}
        }
        (fp.block, fp.error_code)
    }

    fn event_json(&self, event: PoolEvent) -> Value {
        let address = Value::String(self.address.to_string());
        let ms = |d: Duration| json!(d.as_secs_f64() * 1000.0);
        let id = |c: ConnectionId| json!(c.0);
        match event {
            PoolEvent::PoolCreated => json!({ "type": "ConnectionPoolCreated", "address": address,
                "options": options_json(self.pool.options()) }),
            PoolEvent::PoolReady => json!({ "type": "ConnectionPoolReady", "address": address }),
            PoolEvent::PoolCleared {
                interrupt_in_use_connections,
                service_id,
            } => {
                let mut e = json!({ "type": "ConnectionPoolCleared", "address": address,
                    "interruptInUseConnections": interrupt_in_use_connections });
                if let Some(s) = service_id {
                    e["serviceId"] = json!(s.to_hex());
                }
                e
            }
            PoolEvent::PoolClosed => json!({ "type": "ConnectionPoolClosed", "address": address }),
            PoolEvent::ConnectionCreated { connection } => {
                json!({ "type": "ConnectionCreated", "address": address, "connectionId": id(connection) })
            }
            PoolEvent::ConnectionReady {
                connection,
                duration,
            } => json!({ "type": "ConnectionReady",
                "address": address, "connectionId": id(connection), "duration": ms(duration) }),
            PoolEvent::ConnectionClosed { connection, reason } => {
                json!({ "type": "ConnectionClosed",
                "address": address, "connectionId": id(connection), "reason": reason.as_str() })
            }
            PoolEvent::CheckOutStarted { .. } => {
                json!({ "type": "ConnectionCheckOutStarted", "address": address })
            }
            PoolEvent::CheckOutFailed {
                reason, duration, ..
            } => json!({ "type": "ConnectionCheckOutFailed",
                "address": address, "reason": reason.as_str(), "duration": ms(duration) }),
            PoolEvent::CheckedOut {
                connection,
                duration,
                ..
            } => json!({ "type": "ConnectionCheckedOut",
                "address": address, "connectionId": id(connection), "duration": ms(duration) }),
            PoolEvent::CheckedIn { connection } => {
                json!({ "type": "ConnectionCheckedIn", "address": address, "connectionId": id(connection) })
            }
        }
    }
}

fn error_json(error: &CheckoutError) -> Value {
    let kind = match error {
        CheckoutError::PoolCleared(_) => "PoolClearedError",
        CheckoutError::PoolClosed => "PoolClosedError",
        CheckoutError::WaitQueueTimeout(_) => "WaitQueueTimeoutError",
        CheckoutError::Establishment(_) => "ConnectionError",
    };
    json!({ "type": kind, "message": error.to_string() })
}

fn pool_options(value: &Value) -> Result<PoolOptions, String> {
    let mut options = PoolOptions::default();
    let Some(map) = value.as_object() else {
        return Ok(options);
    };
    let u32_of = |v: &Value, key: &str| -> Result<u32, String> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("poolOptions.{key}: {v}"))
    };
    for (key, v) in map {
        match key.as_str() {
            "maxPoolSize" => options.max_pool_size = u32_of(v, key)?,
            "minPoolSize" => options.min_pool_size = u32_of(v, key)?,
            "maxConnecting" => options.max_connecting = u32_of(v, key)?,
            "maxIdleTimeMS" => {
                options.max_idle_time = Some(Duration::from_millis(u64::from(u32_of(v, key)?)))
            }
            "waitQueueTimeoutMS" => {
                options.wait_queue_timeout = Some(Duration::from_millis(u64::from(u32_of(v, key)?)))
            }
            // The pool has no background thread (minPoolSize and idle expiry are driven by inputs
            // and timers), so the README lets the runner ignore the interval; appName only selects
            // connections for a real server's fail point.
            "backgroundThreadIntervalMS" | "appName" => {}
            other => return Err(format!("unsupported pool option {other}")),
        }
    }
    Ok(options)
}

fn options_json(options: &PoolOptions) -> Value {
    let mut map = Map::new();
    map.insert("maxPoolSize".into(), json!(options.max_pool_size));
    map.insert("minPoolSize".into(), json!(options.min_pool_size));
    map.insert("maxConnecting".into(), json!(options.max_connecting));
    if let Some(idle) = options.max_idle_time {
        map.insert("maxIdleTimeMS".into(), json!(idle.as_millis() as u64));
    }
    if let Some(wait) = options.wait_queue_timeout {
        map.insert("waitQueueTimeoutMS".into(), json!(wait.as_millis() as u64));
    }
    Value::Object(map)
}

fn fail_point(fp: &Value) -> Result<FailPoint, String> {
    let data = &fp["data"];
    let commands: Vec<&str> = data["failCommands"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !commands.iter().all(|c| *c == "hello" || *c == "isMaster") {
        return Err(format!(
            "fail point on {commands:?}: only hello can be simulated"
        ));
    }
    let remaining = match &fp["mode"] {
        Value::String(s) if s == "alwaysOn" => None,
        mode => Some(
            mode["times"]
                .as_u64()
                .ok_or_else(|| format!("unsupported fail point mode {mode}"))?,
        ),
    };
    let block = if data["blockConnection"].as_bool().unwrap_or(false) {
        Duration::from_millis(data["blockTimeMS"].as_u64().unwrap_or(0))
    } else {
        Duration::ZERO
    };
    let error_code = data["errorCode"]
        .as_i64()
        .and_then(|c| i32::try_from(c).ok());
    if data["closeConnection"].as_bool().unwrap_or(false) {
        return Err("closeConnection on hello is not simulated".into());
    }
    Ok(FailPoint {
        remaining,
        block,
        error_code,
    })
}

/// The format README's MATCH: `expected` is a subset of `actual`; 42 and "42" match any value.
fn matches(actual: &Value, expected: &Value, at: &str) -> Result<(), String> {
    if expected == &json!(42) || expected == &json!("42") {
        return if actual.is_null() {
            Err(format!("{at}: missing"))
        } else {
            Ok(())
        };
    }
    match (expected, actual) {
        (Value::Object(want), Value::Object(got)) => {
            for (key, value) in want {
                matches(
                    got.get(key).unwrap_or(&Value::Null),
                    value,
                    &format!("{at}.{key}"),
                )?;
            }
            Ok(())
        }
        (Value::Array(want), Value::Array(got)) => {
            for (i, value) in want.iter().enumerate() {
                matches(
                    got.get(i).unwrap_or(&Value::Null),
                    value,
                    &format!("{at}[{i}]"),
                )?;
            }
            Ok(())
        }
        (Value::Number(want), Value::Number(got)) if want.as_f64() == got.as_f64() => Ok(()),
        _ if expected == actual => Ok(()),
        _ => Err(format!("{at}: expected {expected}, got {actual}")),
    }
}
