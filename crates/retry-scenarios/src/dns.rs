//! A DNS server on 127.0.0.1 for the adapters' real resolvers (SRV-2..SRV-6 through hickory, not a
//! stub): [`DnsServer`] answers SRV, TXT and A queries from a zone the scenario edits, and
//! [`srv_seedlist_through_a_dns_server`] points a runtime at it with
//! [`retry_driver::Nameservers::Fixed`]; [`srv_polling_follows_the_records`] rescans through it on
//! an [`Accelerated`] clock.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bson::doc;
use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::{A, SRV, TXT};
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use retry_core::retry::OperationKind;
use retry_driver::{Client, Nameservers, Runtime};
use retry_testkit::Role;

use crate::{bounded, Server, SCENARIO_LIMIT};

/// The records of one name.
#[derive(Clone, Debug, Default)]
pub struct DnsRecords {
    /// SRV records: target, port and TTL in seconds.
    pub srv: Vec<(String, u16, u32)>,
    /// TXT records, each as its strings.
    pub txt: Vec<Vec<String>>,
    /// A records.
    pub a: Vec<Ipv4Addr>,
}

type Zone = BTreeMap<String, DnsRecords>;

/// A UDP DNS server on 127.0.0.1, answering from its zone on a thread of its own until dropped
/// (or [`SCENARIO_LIMIT`] has passed). Names it does not know get NXDOMAIN.
pub struct DnsServer {
    address: SocketAddr,
    zone: Arc<Mutex<Zone>>,
    queries: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DnsServer {
    /// Starts a server with an empty zone.
    pub fn start() -> DnsServer {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket on 127.0.0.1");
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .expect("a read timeout");
        let address = socket.local_addr().expect("its address");
        let zone = Arc::new(Mutex::new(Zone::new()));
        let queries = Arc::new(AtomicU32::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (zone, queries, stop) = (zone.clone(), queries.clone(), stop.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) && started.elapsed() < SCENARIO_LIMIT {
                    let Ok((len, from)) = socket.recv_from(&mut buf) else {
                        continue;
                    };
                    queries.fetch_add(1, Ordering::Relaxed);
                    let zone = zone.lock().unwrap_or_else(PoisonError::into_inner).clone();
                    if let Some(reply) = answer(&zone, &buf[..len]) {
                        let _ = socket.send_to(&reply, from);
                    }
                }
            })
        };
        DnsServer {
            address,
            zone,
            queries,
            stop,
            thread: Some(thread),
        }
    }

    /// Where the resolver must send its queries.
    pub fn nameservers(&self) -> Nameservers {
        Nameservers::Fixed(vec![self.address])
    }

    /// Sets the records of `name` (without the trailing dot).
    pub fn set(&self, name: &str, records: DnsRecords) {
        self.zone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(name.to_ascii_lowercase(), records);
    }

    /// How many queries arrived.
    pub fn queries(&self) -> u32 {
        self.queries.load(Ordering::Relaxed)
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The reply to one query, or `None` for bytes that are no DNS query.
fn answer(zone: &Zone, query: &[u8]) -> Option<Vec<u8>> {
    let request = Message::from_vec(query).ok()?;
    let question = request.queries.first()?.clone();
    let mut reply = Message::response(request.metadata.id, request.metadata.op_code);
    reply.metadata.message_type = MessageType::Response;
    reply.metadata.authoritative = true;
    reply.metadata.recursion_desired = request.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    reply.add_query(question.clone());
    let name = question.name().to_ascii();
    let key = name.trim_end_matches('.').to_ascii_lowercase();
    match zone.get(&key) {
        None => reply.metadata.response_code = ResponseCode::NXDomain,
        Some(records) => {
            let owner = question.name().clone();
            let rdata: Vec<(u32, RData)> = match question.query_type() {
                RecordType::SRV => records
                    .srv
                    .iter()
                    .map(|(target, port, ttl)| {
                        let target = Name::from_ascii(format!("{}.", target.trim_end_matches('.')))
                            .expect("a target name");
                        (*ttl, RData::SRV(SRV::new(0, 0, *port, target)))
                    })
                    .collect(),
                RecordType::TXT => records
                    .txt
                    .iter()
                    .map(|strings| (300, RData::TXT(TXT::new(strings.clone()))))
                    .collect(),
                RecordType::A => records.a.iter().map(|ip| (300, RData::A(A(*ip)))).collect(),
                _ => Vec::new(),
            };
            for (ttl, data) in rdata {
                reply.add_answer(Record::from_rdata(owner.clone(), ttl, data));
            }
        }
    }
    reply.to_vec().ok()
}

/// SRV-2, SRV-3, SRV-5: `Client::with_uri_async_on` a runtime whose resolver asks a DNS server on
/// 127.0.0.1 (`runtime` makes it with those name servers): the SRV, TXT and A answers bring the
/// client to its mongos; a name without records, two TXT records and a target outside the domain
/// are errors that name their cause, and nothing connects.
pub async fn srv_seedlist_through_a_dns_server<R: Runtime>(runtime: impl Fn(Nameservers) -> R) {
    bounded(SCENARIO_LIMIT, async {
        let dns = DnsServer::start();
        let server = Server::with_role(Role::Mongos).await;
        let port = server.address.port();
        dns.set(
            "_mongodb._tcp.cluster0.test.local",
            DnsRecords {
                srv: vec![("node.test.local".into(), port, 300)],
                ..DnsRecords::default()
            },
        );
        dns.set(
            "cluster0.test.local",
            DnsRecords {
                txt: vec![vec!["authSource=".into(), "admin".into()]],
                ..DnsRecords::default()
            },
        );
        dns.set(
            "node.test.local",
            DnsRecords {
                a: vec![Ipv4Addr::LOCALHOST],
                ..DnsRecords::default()
            },
        );
        let uri = "mongodb+srv://cluster0.test.local/?tls=false&serverSelectionTimeoutMS=5000";
        let client = Client::with_uri_async_on(runtime(dns.nameservers()), uri)
            .await
            .expect("the seedlist resolves through the DNS server");
        client
            .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
            .await
            .expect("ping the SRV target");
        client.shutdown().await;
        // SRV, TXT, and the target's A record at least.
        assert!(dns.queries() >= 3, "{} queries", dns.queries());
        let accepted = server.handle.counters().connections_accepted;

        // SRV-2: no SRV records at all.
        let error = Client::with_uri_async_on(
            runtime(dns.nameservers()),
            "mongodb+srv://cluster9.test.local/?tls=false",
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("_mongodb._tcp.cluster9.test.local"),
            "{error}"
        );
        // SRV-5: two TXT records.
        dns.set(
            "cluster0.test.local",
            DnsRecords {
                txt: vec![vec!["authSource=admin".into()], vec!["replicaSet=a".into()]],
                ..DnsRecords::default()
            },
        );
        let error = Client::with_uri_async_on(runtime(dns.nameservers()), uri)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("SRV-5"), "{error}");
        // SRV-3: a target outside the domain.
        dns.set("cluster0.test.local", DnsRecords::default());
        dns.set(
            "_mongodb._tcp.cluster0.test.local",
            DnsRecords {
                srv: vec![("node.elsewhere.example".into(), port, 300)],
                ..DnsRecords::default()
            },
        );
        let error = Client::with_uri_async_on(runtime(dns.nameservers()), uri)
            .await
            .unwrap_err()
            .to_string();
        assert!(error.contains("SRV-3"), "{error}");
        assert_eq!(server.handle.counters().connections_accepted, accepted);
        server.stop().await;
    })
    .await;
}

/// How many times faster [`Accelerated`]'s clock runs: SRV polling's 60 s floor (SP-2) passes in
/// 3 s.
const ACCELERATION: u64 = 20;

/// The polling client's `connectTimeoutMS` and `serverSelectionTimeoutMS` in wall-clock seconds
/// (times [`ACCELERATION`] on its clock). Only the client's clock runs fast: the test server
/// holds an awaitable `hello` for `maxAwaitTimeMS` (500) of wall time, 10 s on the client's
/// clock, and with the default `connectTimeoutMS` (10 s) each streamed reply was due within
/// `connectTimeoutMS + heartbeatFrequencyMS` = 10.5 s (MO-4): 25 ms of wall time to spare, so a
/// starved process failed the check (MO-11), cleared the pool and interrupted a ping in flight
/// (`PoolCleared`); the default server selection timeout (30 s) was 1.5 s of wall time. No
/// assertion depends on these deadlines.
const WALL_DEADLINE_SECS: u64 = 30;

/// `R` with its clock and timers running 20 times faster, so SRV polling's
/// minutes pass in seconds end to end. Every other call goes to `R`; made from a started `R`
/// ([`Runtime::start`] is refused).
#[derive(Debug)]
pub struct Accelerated<R>(pub R);

impl<R: Runtime> Runtime for Accelerated<R> {
    fn start() -> std::io::Result<Self> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "an accelerated runtime wraps a started one",
        ))
    }

    fn now(&self) -> retry_core::time::Instant {
        let real = self.0.now().as_nanos();
        retry_core::time::Instant::from_nanos(real.saturating_mul(ACCELERATION))
    }

    fn new_timer(
        &self,
        at: retry_core::time::Instant,
    ) -> core::pin::Pin<Box<dyn retry_driver::AsyncTimer>> {
        Box::pin(AcceleratedTimer(self.0.new_timer(slow(at))))
    }

    fn spawns(&self) -> bool {
        self.0.spawns()
    }

    fn spawn(&self, future: retry_driver::BoxFuture<()>) -> std::io::Result<()> {
        self.0.spawn(future)
    }

    fn connect(
        &self,
        host: String,
        port: u16,
    ) -> retry_driver::BoxFuture<std::io::Result<core::pin::Pin<Box<dyn retry_driver::Socket>>>>
    {
        self.0.connect(host, port)
    }

    fn resolve_srv(
        &self,
        name: String,
    ) -> retry_driver::BoxFuture<std::io::Result<Vec<retry_driver::SrvRecord>>> {
        self.0.resolve_srv(name)
    }

    fn resolve_txt(
        &self,
        name: String,
    ) -> retry_driver::BoxFuture<std::io::Result<Vec<Vec<String>>>> {
        self.0.resolve_txt(name)
    }
}

/// An accelerated instant on the inner runtime's clock.
fn slow(at: retry_core::time::Instant) -> retry_core::time::Instant {
    retry_core::time::Instant::from_nanos(at.as_nanos() / ACCELERATION)
}

#[derive(Debug)]
struct AcceleratedTimer(core::pin::Pin<Box<dyn retry_driver::AsyncTimer>>);

impl retry_driver::AsyncTimer for AcceleratedTimer {
    fn reset(mut self: core::pin::Pin<&mut Self>, at: retry_core::time::Instant) {
        self.0.as_mut().reset(slow(at));
    }

    fn poll(
        mut self: core::pin::Pin<&mut Self>,
        cx: &mut core::task::Context<'_>,
    ) -> core::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

/// SP-1..SP-6 end to end (prose 1 and 2 of the polling tests): a sharded `mongodb+srv` client
/// rescans its SRV name through the runtime's resolver (accelerated: 60 s pass in 3 s) and its
/// topology follows the records: a mongos added to them joins (`ServerOpening`), one removed
/// leaves (`ServerClosed`), and operations then run on the one left.
pub async fn srv_polling_follows_the_records<R: Runtime>(runtime: impl Fn(Nameservers) -> R) {
    bounded(SCENARIO_LIMIT, async {
        let dns = DnsServer::start();
        let a = Server::with_role(Role::Mongos).await;
        let b = Server::with_role(Role::Mongos).await;
        let (port_a, port_b) = (a.address.port(), b.address.port());
        let records = |ports: &[u16]| DnsRecords {
            srv: ports
                .iter()
                .map(|p| ("node.test.local".to_string(), *p, 1))
                .collect(),
            ..DnsRecords::default()
        };
        dns.set("_mongodb._tcp.poll.test.local", records(&[port_a]));
        dns.set(
            "node.test.local",
            DnsRecords {
                a: vec![Ipv4Addr::LOCALHOST],
                ..DnsRecords::default()
            },
        );
        let deadline_ms = WALL_DEADLINE_SECS * 1000 * ACCELERATION;
        let uri = format!(
            "mongodb+srv://poll.test.local/?tls=false&heartbeatFrequencyMS=500\
             &connectTimeoutMS={deadline_ms}&serverSelectionTimeoutMS={deadline_ms}"
        );
        let client = Client::with_uri_async_on(Accelerated(runtime(dns.nameservers())), &uri)
            .await
            .expect("the seedlist resolves");
        let mut events = client.events();
        let ping = || client.run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand);
        ping().await.expect("ping the first mongos");
        let node = |port| retry_core::address::ServerAddress::new("node.test.local", port);
        // Prose 1: a record is added.
        dns.set("_mongodb._tcp.poll.test.local", records(&[port_a, port_b]));
        crate::wait_for(&mut events, |e| {
            matches!(e, retry_core::topology::SdamEvent::ServerOpening { address } if *address == node(port_b))
        })
        .await;
        // Prose 2: a record is removed.
        dns.set("_mongodb._tcp.poll.test.local", records(&[port_b]));
        crate::wait_for(&mut events, |e| {
            matches!(e, retry_core::topology::SdamEvent::ServerClosed { address } if *address == node(port_a))
        })
        .await;
        let pings_on_a = a.handle.counters().command("ping").executed;
        ping().await.expect("ping the mongos left");
        assert_eq!(a.handle.counters().command("ping").executed, pings_on_a);
        assert_eq!(b.handle.counters().command("ping").executed, 1);
        client.shutdown().await;
        a.stop().await;
        b.stop().await;
    })
    .await;
}
