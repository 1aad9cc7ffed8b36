//! What a test server is: its role, wire versions, batch size, limiters, faults and seed.

use crate::auth::{ScramUser, ScramVersion};
use crate::faults::FaultConfig;
use crate::tls::ServerTls;

/// The kind of server the test server pretends to be; it shapes the hello reply (HS-4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// A standalone `mongod`.
    Standalone,
    /// A `mongos` router: the hello reply says `msg: "isdbgrid"`.
    Mongos,
    /// A replica-set member: `setName`, `hosts`, `primary`, `me` in the hello reply.
    ReplicaSetMember(ReplicaSetMember),
    /// A `mongos` behind a load balancer (LB-7, LB-8).
    LoadBalancer {
        /// Whether a hello that carries `loadBalanced: true` gets a `serviceId`. Off, the server
        /// behaves like a `mongos` that does not support load-balanced mode, so a client fails
        /// its handshake with the LB-8 message.
        service_id: bool,
    },
}

impl Role {
    /// Whether it is a router: a `mongos`, alone or behind a load balancer (the router's
    /// refusals and replies differ from a `mongod`'s).
    pub fn is_router(&self) -> bool {
        matches!(self, Role::Mongos | Role::LoadBalancer { .. })
    }
}

/// The replica-set fields of a member's hello reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSetMember {
    /// `setName`.
    pub set_name: String,
    /// Whether this member is the primary (`isWritablePrimary`) or a secondary.
    pub primary: bool,
    /// `hosts`, as `host:port` strings; empty means this server alone.
    pub hosts: Vec<String>,
    /// The `primary` a secondary reports; a primary always reports itself.
    pub primary_host: Option<String>,
}

impl ReplicaSetMember {
    /// The primary of a one-member set named `set_name`.
    pub fn primary(set_name: impl Into<String>) -> ReplicaSetMember {
        ReplicaSetMember {
            set_name: set_name.into(),
            primary: true,
            hosts: Vec::new(),
            primary_host: None,
        }
    }

    /// A secondary of the set named `set_name`, with no primary known.
    pub fn secondary(set_name: impl Into<String>) -> ReplicaSetMember {
        ReplicaSetMember {
            primary: false,
            ..ReplicaSetMember::primary(set_name)
        }
    }
}

/// A token-bucket rate: `per_second` tokens are added per second, up to `burst`; each admission
/// takes one. A new bucket starts full. A rate of 0 (or a negative or NaN rate) never refills, so
/// exactly `burst` admissions succeed: the deterministic choice for tests on real time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    /// Tokens added per second.
    pub per_second: f64,
    /// The bucket's capacity.
    pub burst: u32,
}

impl RateLimit {
    /// `per_second` tokens a second, up to `burst`.
    pub fn new(per_second: f64, burst: u32) -> RateLimit {
        RateLimit { per_second, burst }
    }
}

/// The ingress request rate limiter: admission of every command but the handshake (BP-6) takes
/// a token; without one the command fails with code 462 and both overload labels (BP-3).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IngressLimit {
    /// The admission rate.
    pub rate: RateLimit,
    /// `baseBackoffMS` in each rejection, when set (BP-15).
    pub base_backoff_ms: Option<u32>,
}

impl IngressLimit {
    /// Admission at `rate`, rejections without `baseBackoffMS`.
    pub fn new(rate: RateLimit) -> IngressLimit {
        IngressLimit {
            rate,
            base_backoff_ms: None,
        }
    }
}

/// How a [`TestServer`](crate::TestServer) starts. Everything but the seed and the wire versions
/// can be changed later through its [`ServerHandle`](crate::ServerHandle).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// The role, which shapes the hello reply.
    pub role: Role,
    /// `minWireVersion` in the hello reply.
    pub min_wire_version: i32,
    /// `maxWireVersion` in the hello reply (25: MongoDB 8.0).
    pub max_wire_version: i32,
    /// Documents per `find` / `getMore` / `aggregate` batch when the command gives no
    /// `batchSize`: 101 by default, as a real server's first batch (TK-*).
    pub batch_size: u32,
    /// The ingress request rate limiter, if any.
    pub ingress_limit: Option<IngressLimit>,
    /// The connection rate limiter, if any: an accepted socket that finds no token is reset
    /// before any byte of its handshake is answered.
    pub connection_limit: Option<RateLimit>,
    /// Random faults injected into replies.
    pub faults: FaultConfig,
    /// The seed of the fault injector; each connection draws from its own generator derived from
    /// it, so a connection's faults do not depend on how other connections are scheduled.
    pub seed: u64,
    /// TLS on every connection: `None` serves plain TCP.
    pub tls: Option<ServerTls>,
    /// The port to listen on, on 127.0.0.1; 0 (the default) picks a free one.
    pub port: u16,
    /// SCRAM users (AU-*): when any is set, a connection must authenticate before it may run
    /// anything but the handshake, `saslStart` / `saslContinue`, `ping` and `buildInfo` (13
    /// `Unauthorized`), as on a `mongod` with access control.
    pub users: Vec<ScramUser>,
    /// The `requireApiVersion` server parameter at start (versioned-api spec): while it is on,
    /// every command without `apiVersion` is refused (498870), hellos included. `setParameter`
    /// and [`ServerHandle::set_require_api_version`](crate::ServerHandle::set_require_api_version)
    /// change it later. Off by default.
    pub require_api_version: bool,
    /// HS-3: whether the server offers `hello` (on by default). Off, it plays a server that does
    /// not support `hello` (before 4.4.2): its legacy hello (`isMaster` / `ismaster`) reply never
    /// says `helloOk: true`, even to a request carrying `helloOk: true`, and `hello` is
    /// CommandNotFound (59), as a real server refuses a command it does not know, before any
    /// other check (awaitable or not). A client must then keep the legacy hello for its
    /// monitoring. [`ServerConfig::without_hello`] turns it off.
    pub offers_hello: bool,
}

impl ServerConfig {
    /// HS-3: this configuration for a server that does not offer `hello`
    /// ([`ServerConfig::offers_hello`] off).
    pub fn without_hello(mut self) -> ServerConfig {
        self.offers_hello = false;
        self
    }

    /// A server in `role` with the defaults for everything else.
    pub fn new(role: Role) -> ServerConfig {
        ServerConfig {
            role,
            ..ServerConfig::default()
        }
    }

    /// Adds a user of `admin` with credentials for `mechanisms` (all SCRAM mechanisms when
    /// empty).
    pub fn with_user(
        mut self,
        name: impl Into<String>,
        password: impl Into<String>,
        mechanisms: &[ScramVersion],
    ) -> ServerConfig {
        let mut user = ScramUser::new(name, password);
        if !mechanisms.is_empty() {
            user.mechanisms = mechanisms.to_vec();
        }
        self.users.push(user);
        self
    }
}

impl Default for ServerConfig {
    /// A standalone, wire versions 0..=25, batches of 101, no limiters, no faults, seed 0,
    /// `hello` offered.
    fn default() -> ServerConfig {
        ServerConfig {
            role: Role::Standalone,
            min_wire_version: 0,
            max_wire_version: 25,
            batch_size: 101,
            ingress_limit: None,
            connection_limit: None,
            faults: FaultConfig::default(),
            seed: 0,
            tls: None,
            port: 0,
            users: Vec::new(),
            require_api_version: false,
            offers_hello: true,
        }
    }
}

/// `maxBsonObjectSize` in the hello reply.
pub const MAX_BSON_OBJECT_SIZE: i32 = 16 * 1024 * 1024;
/// `maxMessageSizeBytes` in the hello reply, and the largest request the server reads.
pub const MAX_MESSAGE_SIZE_BYTES: i32 = 48_000_000;
/// `maxWriteBatchSize` in the hello reply.
pub const MAX_WRITE_BATCH_SIZE: i32 = 100_000;
/// `logicalSessionTimeoutMinutes` in the hello reply.
pub const LOGICAL_SESSION_TIMEOUT_MINUTES: i32 = 30;
