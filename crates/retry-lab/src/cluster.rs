//! The demo's servers: test `mongos` routers on 127.0.0.1, each behind an ingress rate limiter.

use std::io;
use std::net::SocketAddr;

use retry_core::address::ServerAddress;
use retry_testkit::{IngressLimit, RateLimit, Role, ServerConfig, TestServer};

/// What the routers saw of one command, added up over all of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerTotals {
    /// Requests of the command received.
    pub received: u64,
    /// Requests of the command that ran.
    pub executed: u64,
    /// Requests (of any command) rejected by the ingress limiters with code 462.
    pub shed: u64,
}

/// Test `mongos` routers, started together and stopped together.
#[derive(Debug)]
pub struct Cluster {
    servers: Vec<TestServer>,
}

impl Cluster {
    /// Starts `count` routers on ephemeral ports of 127.0.0.1, each with an ingress limiter that
    /// admits `capacity` requests a second (0: never refills), `burst` at once; rejected requests get code 462 with
    /// both overload labels (BP-3). Each router's fault injector is seeded from `seed` and its
    /// index (no faults are configured; the seed only keeps the servers reproducible).
    pub async fn start(count: u32, capacity: u32, burst: u32, seed: u64) -> io::Result<Cluster> {
        let mut servers = Vec::with_capacity(count as usize);
        for index in 0..count {
            let mut config = ServerConfig::new(Role::Mongos);
            config.ingress_limit = Some(IngressLimit::new(RateLimit::new(
                f64::from(capacity),
                burst,
            )));
            config.seed = seed.wrapping_add(u64::from(index));
            servers.push(TestServer::start(config).await?);
        }
        Ok(Cluster { servers })
    }

    /// The routers' socket addresses.
    pub fn socket_addresses(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(TestServer::address).collect()
    }

    /// The routers' addresses as a client's seed list.
    pub fn seed_list(&self) -> Vec<ServerAddress> {
        self.socket_addresses()
            .into_iter()
            .map(|a| ServerAddress::new(&a.ip().to_string(), a.port()))
            .collect()
    }

    /// What the routers counted of `command`, added up.
    pub fn totals(&self, command: &str) -> ServerTotals {
        self.servers
            .iter()
            .map(|server| server.handle().counters())
            .fold(ServerTotals::default(), |sum, counters| {
                let counts = counters.command(command);
                ServerTotals {
                    received: sum.received + counts.received,
                    executed: sum.executed + counts.executed,
                    shed: sum.shed + counters.ingress_rejected,
                }
            })
    }

    /// Stops every router and waits for them.
    pub async fn shutdown(self) {
        for server in self.servers {
            server.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use retry_testkit::RawClient;

    #[tokio::test]
    async fn routers_shed_past_their_burst_and_the_totals_add_up() {
        // A rate of 0 never refills: exactly the burst is admitted, whatever the timing.
        let cluster = Cluster::start(2, 0, 2, 9).await.unwrap();
        let addresses = cluster.socket_addresses();
        assert_eq!(addresses.len(), 2);
        assert!(addresses.iter().all(|a| a.ip().is_loopback()));
        assert_eq!(
            cluster.seed_list()[1],
            ServerAddress::new("127.0.0.1", addresses[1].port())
        );
        let ping = doc! { "ping": 1, "$db": "admin" };
        let mut codes = Vec::new();
        for address in &addresses {
            let mut client = RawClient::connect(*address).await.unwrap();
            let hello = client
                .command(doc! { "hello": 1, "$db": "admin" })
                .await
                .unwrap();
            assert_eq!(hello.get_str("msg").ok(), Some("isdbgrid"));
            for _ in 0..3 {
                let reply = client.command(ping.clone()).await.unwrap();
                codes.push(reply.get_i32("code").ok());
            }
        }
        assert_eq!(codes.iter().filter(|c| **c == Some(462)).count(), 2);
        assert_eq!(
            cluster.totals("ping"),
            ServerTotals {
                received: 6,
                executed: 4,
                shed: 2
            }
        );
        cluster.shutdown().await;
    }
}
