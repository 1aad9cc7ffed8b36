//! UT-5, TK-12: the retry-testkit deployment a test runs on, started fresh on 127.0.0.1 for each
//! test, and the URIs its client entities connect with.

use std::io;

use retry_testkit::{DataStore, Role, ServerConfig, ServerHandle, TestServer};

/// The topologies the runner starts, in the order it tries them for a test (UT-5, §5).
pub const TOPOLOGIES: [Topology; 4] = [
    Topology::ReplicaSet,
    Topology::Sharded,
    Topology::LoadBalanced,
    Topology::Single,
];

/// A topology of the unified format's `runOnRequirements.topologies`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// `single`: one standalone.
    Single,
    /// `replicaset`: a primary and two secondaries sharing one store.
    ReplicaSet,
    /// `sharded` (and `sharded-replicaset`): two mongos sharing one store.
    Sharded,
    /// `load-balanced`: a load balancer in front of one mongos (`useMultipleMongoses: false`)
    /// and one in front of two (connections alternate between their `serviceId`s).
    LoadBalanced,
}

impl Topology {
    /// The name `runOnRequirements.topologies` uses.
    pub fn name(self) -> &'static str {
        match self {
            Topology::Single => "single",
            Topology::ReplicaSet => "replicaset",
            Topology::Sharded => "sharded",
            Topology::LoadBalanced => "load-balanced",
        }
    }
}

/// TK-1: the wire version the deployments report (8.2), with a consistent `buildInfo`.
pub const MAX_WIRE_VERSION: i32 = 27;

/// The server configuration every deployment starts from.
pub fn server_config(role: Role) -> ServerConfig {
    ServerConfig {
        max_wire_version: MAX_WIRE_VERSION,
        ..ServerConfig::new(role)
    }
}

/// The SCRAM user of a deployment that authenticates (UT-5: real SASL, never faked).
pub const USER: (&str, &str) = ("unified", "unified-password");

/// A started deployment.
pub struct Cluster {
    /// Its topology.
    pub topology: Topology,
    /// Whether its servers require authentication (as [`USER`]).
    pub auth: bool,
    servers: Vec<TestServer>,
}

impl Cluster {
    /// Starts `topology` on 127.0.0.1 with an empty shared store; with `auth`, every server
    /// requires [`USER`] to authenticate.
    pub async fn start(topology: Topology, auth: bool) -> io::Result<Cluster> {
        let server_config = move |role: Role| {
            let config = server_config(role);
            match auth {
                true => config.with_user(USER.0, USER.1, &[]),
                false => config,
            }
        };
        let start = async move {
            match topology {
                Topology::Single => Ok(vec![
                    TestServer::start(server_config(Role::Standalone)).await?,
                ]),
                Topology::ReplicaSet => {
                    TestServer::start_replica_set("rs", 3, server_config(Role::Standalone)).await
                }
                Topology::Sharded => {
                    TestServer::start_mongoses(2, server_config(Role::Mongos)).await
                }
                Topology::LoadBalanced => {
                    // TK-12: a single-mongos LB and one in front of two mongos, one store.
                    let data = DataStore::new();
                    let role = || server_config(Role::LoadBalancer { service_id: true });
                    let single = TestServer::start_with_data(role(), data.clone()).await?;
                    let multiple = TestServer::start_with_data(role(), data).await?;
                    multiple.handle().set_load_balanced_services(2);
                    Ok(vec![single, multiple])
                }
            }
        };
        let servers = server_thread()
            .spawn(start)
            .await
            .map_err(|e| io::Error::other(format!("the servers did not start: {e}")))??;
        Ok(Cluster {
            topology,
            auth,
            servers,
        })
    }
}

/// The runtime the test servers run on: one thread of their own per runner thread (each suite's
/// clients run on the runner thread's runtime). A server then answers like a separate process:
/// under load, its reply that was due before a client's deadline is written while the client's
/// thread waits, not after the client's timer in the same turn of one shared runtime (the flaky
/// sdam interruptInUse-pool-clear / hello-timeout tests: a streamed hello timed out with its
/// reply due but its server task not yet run).
fn server_thread() -> tokio::runtime::Handle {
    thread_local! {
        static SERVERS: tokio::runtime::Handle = {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the test servers");
            let handle = runtime.handle().clone();
            std::thread::Builder::new()
                .name("unified-servers".into())
                .spawn(move || runtime.block_on(core::future::pending::<()>()))
                .expect("a thread for the test servers");
            handle
        };
    }
    SERVERS.with(Clone::clone)
}

impl Cluster {
    /// UT-8: the base URI of a client; `multiple` is `useMultipleMongoses` (sharded: every
    /// mongos when true, always the same first one when false; load balanced: the LB in front of
    /// two mongos when true, the single-mongos one when false).
    pub fn uri(&self, multiple: bool) -> String {
        let hosts = self.hosts(multiple);
        let options = match self.topology {
            Topology::ReplicaSet => "?replicaSet=rs",
            Topology::LoadBalanced => "?loadBalanced=true",
            Topology::Single | Topology::Sharded => "?",
        };
        let credentials = match self.auth {
            true => format!("{}:{}@", USER.0, USER.1),
            false => String::new(),
        };
        format!("mongodb://{credentials}{}/{options}", hosts.join(","))
    }

    /// The hosts of [`Cluster::uri`]: every one a data-bearing server (or a load balancer) a
    /// client of the cluster keeps a pool for.
    pub fn hosts(&self, multiple: bool) -> Vec<String> {
        match self.topology {
            Topology::Sharded if multiple => self
                .servers
                .iter()
                .map(|s| s.address().to_string())
                .collect(),
            Topology::ReplicaSet => self
                .servers
                .iter()
                .map(|s| s.address().to_string())
                .collect(),
            Topology::LoadBalanced if multiple => vec![self.servers[1].address().to_string()],
            _ => vec![self.servers[0].address().to_string()],
        }
    }

    /// The server that holds the data and takes writes (the primary, or the first mongos).
    pub fn primary(&self) -> ServerHandle {
        self.servers[0].handle()
    }

    /// Every server's handle.
    pub fn handles(&self) -> Vec<ServerHandle> {
        self.servers.iter().map(TestServer::handle).collect()
    }

    /// Stops every server.
    pub async fn shutdown(self) {
        let servers = self.servers;
        let stopped = server_thread()
            .spawn(async move {
                for server in servers {
                    server.shutdown().await;
                }
            })
            .await;
        // A server's panic (its bug) fails the test, as `TestServer::shutdown` intends.
        if let Err(error) = stopped {
            if let Ok(panic) = error.try_into_panic() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}
