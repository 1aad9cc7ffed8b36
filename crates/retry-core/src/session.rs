//! Server sessions: ids, the client's pool, transaction numbers, `$clusterTime` gossip and which
//! commands carry them (SE-*).
//!
//! Everything here is pure. [`SessionPool`] is the client's deque of [`ServerSession`]s with the
//! acquire and release rules of SE-4..SE-6; a session id is a UUID v4 drawn from the caller's RNG
//! (SE-3); [`ServerSession::next_txn_number`] allocates `txnNumber`s (RW-6); [`ClusterClock`] keeps
//! the highest `$clusterTime` seen (SE-16..SE-19); [`attaches_session`] and
//! [`gossips_cluster_time`] say which commands get `lsid` and `$clusterTime` (SE-13, SE-19);
//! [`end_sessions_commands`] batches the ids for `endSessions` at close (SE-15).
//!
//! The engine (not this module) decides when. For one operation without an explicit session:
//!
//! ```text
//! after checkout:   if connection_supports_sessions(conn's handshake reply, lb)          (SE-7, SE-8)
//!                   && attaches_session(name, is_unacknowledged(write concern))          (SE-13)
//!                       session = pool.acquire(SessionTimeout::new(topology lsTimeout, lb), rng, now)
//!                       txn = session.next_txn_number() for a retryable write            (RW-6)
//! every attempt:    the copy gets session.id()'s lsid, txn (same on retries, RW-7) and,
//!                     if gossips_cluster_time(name),
//!                     ClusterTime::greater(client clock, session clock)                  (SE-17)
//!                   session.mark_used(now)                                               (SE-2)
//! every reply:      if gossips_cluster_time(name):
//!                     client_clock.advance(ClusterTime::from_reply(reply))               (SE-16)
//! network error:    session.mark_dirty()                                                 (SE-12)
//! operation ends:   pool.release(session, timeout, now) (a cursor's session: at cursor id 0, SE-14)
//! client close:     for each pool.drain_end_sessions(): run on admin, primaryPreferred,
//!                   ignoring errors                                                      (SE-15)
//! ```

use alloc::collections::VecDeque;
use alloc::vec::Vec;
use core::cmp::Ordering;
use core::time::Duration;

use bson::spec::BinarySubtype;
use bson::{Binary, Bson, Document, RawDocument, Timestamp};
use rand_core::RngCore;

use crate::handshake::HandshakeReply;
use crate::time::Instant;

/// SE-4, SE-5: a pooled session is reused only with at least this much time left before the
/// server may consider it stale.
pub const STALE_MARGIN: Duration = Duration::from_secs(60);

/// SE-15: at most this many ids per `endSessions` command.
pub const END_SESSIONS_BATCH: usize = 10_000;

/// SE-8: the client error for an explicit session used on a connection without session support.
pub const SESSIONS_UNSUPPORTED: &str = "Sessions are not supported by this MongoDB deployment";

/// SE-8, LB-5: whether a connection supports sessions, judged by its *own* handshake reply (a
/// `logicalSessionTimeoutMinutes`), never by the topology; always in load-balanced mode. An
/// implicit session on a connection without support is dropped (no `lsid`); an explicit one
/// fails with [`SESSIONS_UNSUPPORTED`].
pub(crate) fn connection_supports_sessions(reply: &HandshakeReply, load_balanced: bool) -> bool {
    load_balanced || reply.description.logical_session_timeout.is_some()
}

/// A server session id: an RFC 4122 version 4 UUID (SE-3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId([u8; 16]);

impl SessionId {
    /// A random version 4, variant 1 UUID from `rng` (SE-3: generated locally).
    pub fn generate(rng: &mut (impl RngCore + ?Sized)) -> SessionId {
        let mut bytes = [0; 16];
        rng.fill_bytes(&mut bytes);
        bytes[6] = (bytes[6] & 0x0f) | 0x40;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        SessionId(bytes)
    }

    /// The UUID's 16 bytes.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// The `lsid` document: `{id: <UUID as BSON binary subtype 4>}` (SE-3).
    pub fn lsid(&self) -> Document {
        let mut lsid = Document::new();
        lsid.insert(
            "id",
            Binary {
                subtype: BinarySubtype::Uuid,
                bytes: self.0.to_vec(),
            },
        );
        lsid
    }
}

/// A server session (SE-2): its id, when it was last sent, its last `txnNumber` and whether a
/// network error made it unusable for later operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSession {
    id: SessionId,
    last_use: Instant,
    txn_number: i64,
    dirty: bool,
}

impl ServerSession {
    /// A new session with a fresh id, last used `now`.
    pub fn new(rng: &mut (impl RngCore + ?Sized), now: Instant) -> ServerSession {
        ServerSession {
            id: SessionId::generate(rng),
            last_use: now,
            txn_number: 0,
            dirty: false,
        }
    }

    /// Its id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// When its id was last sent (SE-2).
    pub fn last_use(&self) -> Instant {
        self.last_use
    }

    /// SE-2: the id was sent at `now`; call once per command that carries the `lsid`.
    pub fn mark_used(&mut self, now: Instant) {
        self.last_use = self.last_use.max(now);
    }

    /// The last `txnNumber` allocated, 0 before the first.
    pub fn txn_number(&self) -> i64 {
        self.txn_number
    }

    /// RW-6, TX-1: allocates the next `txnNumber` (1, 2, ...), kept across reuse from the pool.
    /// A retry reuses the number it was given (RW-7); only a new write or transaction calls this.
    pub fn next_txn_number(&mut self) -> i64 {
        self.txn_number = self.txn_number.saturating_add(1);
        self.txn_number
    }

    /// SE-12: a network error (socket timeout included) on a command with this session. The
    /// session still serves the operation's retries but is discarded at release.
    pub fn mark_dirty(&mut self) {
        self.dirty = true;
    }

    /// Whether a network error marked it (SE-12).
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// SE-6: whether less than [`STALE_MARGIN`] is left before the server may drop it.
    fn about_to_expire(&self, timeout: SessionTimeout, now: Instant) -> bool {
        match timeout {
            SessionTimeout::Minutes(minutes) => {
                let expires = self
                    .last_use
                    .saturating_add(Duration::from_secs(u64::from(minutes) * 60));
                expires.saturating_duration_since(now) < STALE_MARGIN
            }
            SessionTimeout::Never => false,
        }
    }
}

/// How long the server keeps an idle session, as the pool needs it (SE-6, LB-5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionTimeout {
    /// The topology's `logicalSessionTimeoutMinutes`.
    Minutes(u32),
    /// Load-balanced mode, which ignores the value and never prunes (LB-5). Also what a caller
    /// passes while the topology reports no value: without a timeout nothing can be judged
    /// stale (our reading of SE-6, which leaves this case open).
    Never,
}

impl SessionTimeout {
    /// The timeout for a topology whose `logicalSessionTimeoutMinutes` is `minutes`, in
    /// load-balanced mode or not (SE-6, LB-5).
    pub fn new(logical_session_timeout: Option<Duration>, load_balanced: bool) -> SessionTimeout {
        match logical_session_timeout {
            Some(d) if !load_balanced => {
                SessionTimeout::Minutes(u32::try_from(d.as_secs() / 60).unwrap_or(u32::MAX))
            }
            _ => SessionTimeout::Never,
        }
    }
}

/// The client's pool of server sessions (SE-1, SE-4, SE-5): a deque whose front holds the most
/// recently released sessions. It has no size cap.
#[derive(Clone, Debug, Default)]
pub struct SessionPool {
    sessions: VecDeque<ServerSession>,
}

impl SessionPool {
    /// An empty pool.
    pub fn new() -> SessionPool {
        SessionPool::default()
    }

    /// How many sessions are pooled.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// SE-4: pops sessions from the front, discarding those with less than a minute left (none in
    /// load-balanced mode), and returns the first usable one, or a new one from `rng`.
    pub fn acquire(
        &mut self,
        timeout: SessionTimeout,
        rng: &mut (impl RngCore + ?Sized),
        now: Instant,
    ) -> ServerSession {
        while let Some(session) = self.sessions.pop_front() {
            if !session.about_to_expire(timeout, now) {
                return session;
            }
        }
        ServerSession::new(rng, now)
    }

    /// SE-5: first discards, from the back, sessions with less than a minute left (stopping at the
    /// first that has more); then pushes `session` to the front unless it is dirty (SE-12) or
    /// itself about to expire.
    pub fn release(&mut self, session: ServerSession, timeout: SessionTimeout, now: Instant) {
        while self
            .sessions
            .back()
            .is_some_and(|s| s.about_to_expire(timeout, now))
        {
            self.sessions.pop_back();
        }
        if !session.is_dirty() && !session.about_to_expire(timeout, now) {
            self.sessions.push_front(session);
        }
    }

    /// SE-15: empties the pool and returns the `endSessions` commands for its sessions (dirty
    /// sessions never reach the pool).
    pub fn drain_end_sessions(&mut self) -> Vec<Document> {
        end_sessions_commands(self.sessions.drain(..).map(|s| s.id))
    }
}

/// SE-15: `{endSessions: [lsid, ...]}` commands of at most [`END_SESSIONS_BATCH`] ids each, in
/// order. Each goes to the `admin` database with read preference `primaryPreferred`; their errors
/// are ignored.
pub fn end_sessions_commands(ids: impl IntoIterator<Item = SessionId>) -> Vec<Document> {
    let mut commands = Vec::new();
    let mut batch = Vec::new();
    for id in ids {
        batch.push(Bson::Document(id.lsid()));
        if batch.len() == END_SESSIONS_BATCH {
            commands.push(end_sessions(core::mem::take(&mut batch)));
        }
    }
    if !batch.is_empty() {
        commands.push(end_sessions(batch));
    }
    commands
}

fn end_sessions(batch: Vec<Bson>) -> Document {
    let mut command = Document::new();
    command.insert("endSessions", batch);
    command
}

/// Commands that must not carry an `lsid` or `$clusterTime` whatever the deployment: handshake,
/// monitoring and authentication commands (SE-13, SE-19) and `parallelCollectionScan`.
const SESSIONLESS_COMMANDS: [&str; 7] = [
    "hello",
    "isMaster",
    "ismaster",
    "saslStart",
    "saslContinue",
    "authenticate",
    "parallelCollectionScan",
];

/// SE-13: whether a command named `command_name` gets an `lsid` when the connection supports
/// sessions. Never handshake, monitoring or authentication commands (`hello`, legacy hello,
/// `saslStart`, `saslContinue`, `authenticate`), never `parallelCollectionScan`, and never an
/// unacknowledged write (`unacknowledged`: its write concern has `w: 0` without `j: true` or
/// `journal: true`, as the engine reads it: `classify::is_unacknowledged`; RW-4).
pub fn attaches_session(command_name: &str, unacknowledged: bool) -> bool {
    !unacknowledged && !sessionless(command_name.as_bytes())
}

/// SE-13, SE-19: whether the command named `command_name` (its key's bytes) never carries an
/// `lsid` nor `$clusterTime` ([`attaches_session`], [`gossips_cluster_time`] in one check).
pub(crate) fn sessionless(command_name: &[u8]) -> bool {
    SESSIONLESS_COMMANDS
        .iter()
        .any(|name| name.as_bytes() == command_name)
}

/// SE-19: whether a command named `command_name` sends `$clusterTime`, and whether its reply may
/// advance the client's cluster time. Never for SDAM commands (`hello`, legacy hello) nor
/// authentication commands.
pub fn gossips_cluster_time(command_name: &str) -> bool {
    !sessionless(command_name.as_bytes())
}

/// A `$clusterTime` document as a server sent it, with its timestamp for comparison (SE-16).
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterTime {
    timestamp: Timestamp,
    document: Document,
}

impl ClusterTime {
    /// The top-level `$clusterTime` of a reply, if it has a well-formed one
    /// (`{clusterTime: Timestamp, ...}`); the whole document is kept, signature included (SE-17).
    pub fn from_reply(reply: &Document) -> Option<ClusterTime> {
        // Looked up without `get_document`, whose miss builds an error (an allocation per reply
        // from a server that does not gossip).
        let Some(Bson::Document(document)) = reply.get("$clusterTime") else {
            return None;
        };
        ClusterTime::from_document(document.clone())
    }

    /// A `$clusterTime` document (`{clusterTime: Timestamp, ...}`), if well formed; kept whole,
    /// signature included (SE-17).
    pub fn from_document(document: Document) -> Option<ClusterTime> {
        let Some(Bson::Timestamp(timestamp)) = document.get("clusterTime") else {
            return None;
        };
        Some(ClusterTime {
            timestamp: *timestamp,
            document,
        })
    }

    /// The `clusterTime` timestamp of an encoded `$clusterTime` document that a decoder
    /// validated ([`crate::wire::FrameDecoder::decode_raw`]), read in place (the last
    /// occurrence, as [`ClusterTime::from_document`] reads the converted document): for
    /// comparing (SE-16) before anything is converted.
    pub fn timestamp_of(document: &RawDocument) -> Option<Timestamp> {
        let mut timestamp = None;
        let mut elements = crate::bson_read::Elements::of(document);
        for (key, tag, value) in elements.by_ref() {
            if key == b"clusterTime" {
                timestamp = crate::bson_read::timestamp(tag, value);
            }
        }
        timestamp.filter(|_| !elements.broken())
    }

    /// The timestamp compared by SE-16: seconds, then increment.
    pub fn timestamp(&self) -> Timestamp {
        self.timestamp
    }

    /// The document to send as `$clusterTime`, exactly as received (SE-17).
    pub fn document(&self) -> &Document {
        &self.document
    }

    fn cmp_time(&self, other: &ClusterTime) -> Ordering {
        (self.timestamp.time, self.timestamp.increment)
            .cmp(&(other.timestamp.time, other.timestamp.increment))
    }

    /// SE-17: the greater of two optional cluster times (the client's and the session's).
    pub fn greater<'a>(
        a: Option<&'a ClusterTime>,
        b: Option<&'a ClusterTime>,
    ) -> Option<&'a ClusterTime> {
        match (a, b) {
            (Some(a), Some(b)) => Some(if b.cmp_time(a) == Ordering::Greater {
                b
            } else {
                a
            }),
            (a, b) => a.or(b),
        }
    }
}

/// The highest `$clusterTime` seen, by a client or by one session (SE-16, SE-18). Starts empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterClock {
    current: Option<ClusterTime>,
}

impl ClusterClock {
    /// An empty clock.
    pub fn new() -> ClusterClock {
        ClusterClock::default()
    }

    /// The highest cluster time seen, if any.
    pub fn current(&self) -> Option<&ClusterTime> {
        self.current.as_ref()
    }

    /// SE-16: advances to `time` if it is strictly greater than the current one.
    pub fn advance(&mut self, time: ClusterTime) {
        if self
            .current
            .as_ref()
            .is_none_or(|c| time.cmp_time(c) == Ordering::Greater)
        {
            self.current = Some(time);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::EngineRng;
    use bson::doc;

    const THIRTY: SessionTimeout = SessionTimeout::Minutes(30);

    fn rng() -> EngineRng {
        EngineRng::from_seed_u64(7)
    }

    fn minutes(m: u64) -> Instant {
        Instant::from_millis(m * 60_000)
    }

    #[test]
    fn se3_session_ids_are_uuid_v4_in_binary_subtype_4() {
        let mut rng = rng();
        let id = SessionId::generate(&mut rng);
        assert_eq!(id.as_bytes()[6] >> 4, 4, "version 4");
        assert_eq!(id.as_bytes()[8] >> 6, 0b10, "RFC 4122 variant");
        let lsid = id.lsid();
        match lsid.get("id") {
            Some(Bson::Binary(b)) => {
                assert_eq!(b.subtype, BinarySubtype::Uuid);
                assert_eq!(b.bytes, id.as_bytes().to_vec());
            }
            other => panic!("{other:?}"),
        }
        assert_ne!(SessionId::generate(&mut rng), id);
        // Deterministic from the seed.
        assert_eq!(SessionId::generate(&mut EngineRng::from_seed_u64(7)), id);
    }

    /// SE-5 (prose 2); also SE-1: the uncapped pool keeps every released session and shrinks
    /// only as sessions are taken out.
    #[test]
    fn se5_prose_2_the_pool_is_lifo() {
        let mut rng = rng();
        let mut pool = SessionPool::new();
        let a = pool.acquire(THIRTY, &mut rng, minutes(0));
        let b = pool.acquire(THIRTY, &mut rng, minutes(0));
        let (a_id, b_id) = (a.id(), b.id());
        pool.release(a, THIRTY, minutes(1));
        pool.release(b, THIRTY, minutes(1));
        assert_eq!(pool.acquire(THIRTY, &mut rng, minutes(2)).id(), b_id);
        assert_eq!(pool.acquire(THIRTY, &mut rng, minutes(2)).id(), a_id);
        assert!(pool.is_empty());
    }

    /// SE-4; also SE-2, SE-6: time left is `lastUse` (set by `mark_used`) + the topology's
    /// session timeout − now.
    #[test]
    fn se4_acquire_discards_sessions_with_less_than_a_minute_left() {
        let mut rng = rng();
        let mut pool = SessionPool::new();
        let mut s = pool.acquire(THIRTY, &mut rng, minutes(0));
        s.mark_used(minutes(0));
        let old = s.id();
        pool.release(s, THIRTY, minutes(0));
        // 29 minutes later exactly one minute is left: still usable.
        let s = pool.acquire(THIRTY, &mut rng, minutes(29));
        assert_eq!(s.id(), old);
        pool.release(s, THIRTY, minutes(29));
        // A nanosecond later it has less than a minute: discarded, a new one is made.
        let later = minutes(29).saturating_add(Duration::from_nanos(1));
        assert_ne!(pool.acquire(THIRTY, &mut rng, later).id(), old);
        assert!(pool.is_empty());
    }

    /// LB-5; also SE-6: load-balanced mode ignores the session timeout and never prunes.
    #[test]
    fn lb5_load_balanced_pools_never_prune() {
        let mut rng = rng();
        let mut pool = SessionPool::new();
        let s = pool.acquire(SessionTimeout::Never, &mut rng, minutes(0));
        let id = s.id();
        pool.release(s, SessionTimeout::Never, minutes(600));
        assert_eq!(
            pool.acquire(SessionTimeout::Never, &mut rng, minutes(6000))
                .id(),
            id
        );
        assert_eq!(
            SessionTimeout::new(Some(Duration::from_secs(1800)), true),
            SessionTimeout::Never
        );
        assert_eq!(
            SessionTimeout::new(Some(Duration::from_secs(1800)), false),
            THIRTY
        );
    }

    /// SE-5, SE-12; also SE-2: a refreshed `lastUse` keeps a session, an old one is pruned.
    #[test]
    fn se5_release_prunes_the_back_first_and_drops_dirty_or_expiring_sessions() {
        let mut rng = rng();
        let mut pool = SessionPool::new();
        let old = pool.acquire(THIRTY, &mut rng, minutes(0));
        pool.release(old, THIRTY, minutes(0));
        let mut fresh = ServerSession::new(&mut rng, minutes(20));
        fresh.mark_used(minutes(20));
        // At minute 29.5 the pooled one (last used at 0) has under a minute: pruned from the back.
        pool.release(
            fresh.clone(),
            THIRTY,
            minutes(29).saturating_add(Duration::from_secs(30)),
        );
        assert_eq!(pool.len(), 1);
        assert_eq!(pool.acquire(THIRTY, &mut rng, minutes(30)).id(), fresh.id());
        // SE-12: a dirty session is never pooled.
        let mut dirty = ServerSession::new(&mut rng, minutes(30));
        dirty.mark_dirty();
        pool.release(dirty, THIRTY, minutes(30));
        assert!(pool.is_empty());
    }

    #[test]
    fn rw6_txn_numbers_increase_and_survive_reuse() {
        let mut rng = rng();
        let mut pool = SessionPool::new();
        let mut s = pool.acquire(THIRTY, &mut rng, minutes(0));
        assert_eq!(s.next_txn_number(), 1);
        assert_eq!(s.next_txn_number(), 2);
        pool.release(s, THIRTY, minutes(0));
        let mut s = pool.acquire(THIRTY, &mut rng, minutes(0));
        assert_eq!(s.txn_number(), 2);
        assert_eq!(s.next_txn_number(), 3);
    }

    #[test]
    fn se15_end_sessions_batches_of_ten_thousand() {
        let mut rng = rng();
        let ids: Vec<SessionId> = (0..END_SESSIONS_BATCH + 1)
            .map(|_| SessionId::generate(&mut rng))
            .collect();
        let commands = end_sessions_commands(ids.iter().copied());
        assert_eq!(commands.len(), 2);
        assert_eq!(commands[0].get_array("endSessions").unwrap().len(), 10_000);
        assert_eq!(commands[1].get_array("endSessions").unwrap().len(), 1);
        assert_eq!(
            commands[1].get_array("endSessions").unwrap()[0],
            Bson::Document(ids[10_000].lsid())
        );
        assert!(end_sessions_commands([]).is_empty());

        let mut pool = SessionPool::new();
        let s = pool.acquire(THIRTY, &mut rng, minutes(0));
        pool.release(s, THIRTY, minutes(0));
        assert_eq!(pool.drain_end_sessions().len(), 1);
        assert!(pool.is_empty());
    }

    #[test]
    fn se13_se19_which_commands_carry_lsid_and_cluster_time() {
        for name in [
            "hello",
            "isMaster",
            "ismaster",
            "saslStart",
            "saslContinue",
            "authenticate",
        ] {
            assert!(!attaches_session(name, false), "{name}");
            assert!(!gossips_cluster_time(name), "{name}");
        }
        assert!(!attaches_session("parallelCollectionScan", false));
        for name in [
            "find",
            "insert",
            "getMore",
            "killCursors",
            "ping",
            "endSessions",
        ] {
            assert!(attaches_session(name, false), "{name}");
            assert!(gossips_cluster_time(name), "{name}");
        }
        // Unacknowledged writes never get an lsid.
        assert!(!attaches_session("insert", true));
    }

    fn reply_at(time: u32, increment: u32) -> Document {
        doc! { "ok": 1, "$clusterTime": {
        "clusterTime": Timestamp { time, increment },
        "signature": { "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![1; 20] },
                       "keyId": 7_i64 } } }
    }

    #[test]
    fn se16_the_clock_keeps_the_highest_cluster_time_by_seconds_then_increment() {
        let mut clock = ClusterClock::new();
        assert!(clock.current().is_none());
        assert!(ClusterTime::from_reply(&doc! { "ok": 1 }).is_none());
        let mut observe = |reply: &Document| {
            clock.advance(ClusterTime::from_reply(reply).expect("a $clusterTime"));
        };
        observe(&reply_at(10, 5));
        observe(&reply_at(10, 4));
        observe(&reply_at(9, 99));
        assert_eq!(
            clock.current().unwrap().timestamp(),
            Timestamp {
                time: 10,
                increment: 5
            }
        );
        clock.advance(ClusterTime::from_reply(&reply_at(10, 6)).unwrap());
        assert_eq!(clock.current().unwrap().timestamp().increment, 6);
        // SE-17: the document is sent exactly as received, signature included.
        assert_eq!(
            clock.current().unwrap().document(),
            reply_at(10, 6).get_document("$clusterTime").unwrap()
        );
    }

    #[test]
    fn se17_the_greater_of_client_and_session_times_is_sent() {
        let a = ClusterTime::from_reply(&reply_at(1, 1)).unwrap();
        let b = ClusterTime::from_reply(&reply_at(1, 2)).unwrap();
        assert_eq!(ClusterTime::greater(Some(&a), Some(&b)), Some(&b));
        assert_eq!(ClusterTime::greater(Some(&b), Some(&a)), Some(&b));
        assert_eq!(ClusterTime::greater(None, Some(&a)), Some(&a));
        assert_eq!(ClusterTime::greater(None, None), None);
    }

    #[test]
    fn se8_support_comes_from_the_connections_own_handshake_reply() {
        let address = crate::address::ServerAddress::new("a", 27017);
        let reply = |extra: Document| {
            let mut hello = doc! { "ok": 1, "isWritablePrimary": true, "setName": "rs",
            "hosts": ["a:27017"], "maxWireVersion": 25, "minWireVersion": 0 };
            hello.extend(extra);
            crate::handshake::validate_reply(&hello, &address, false, Duration::ZERO, Instant::ZERO)
                .unwrap()
        };
        let with = reply(doc! { "logicalSessionTimeoutMinutes": 30 });
        let without = reply(doc! {});
        assert!(connection_supports_sessions(&with, false));
        assert!(!connection_supports_sessions(&without, false));
        // LB-5: always supported in load-balanced mode.
        assert!(connection_supports_sessions(&without, true));
    }

    proptest::proptest! {
        /// SE-4, SE-5, SE-12 under any interleaving: an acquired pooled session always has at
        /// least a minute left, dirty sessions never come back, ids are never shared by two
        /// sessions out of the pool at once, and the pool never holds a session twice.
        #[test]
        fn se4_se5_pool_invariants(steps in proptest::collection::vec((0u8..3, 0u64..600_000, proptest::bool::ANY), 1..60)) {
            let mut rng = rng();
            let mut pool = SessionPool::new();
            let mut out: Vec<ServerSession> = Vec::new();
            let mut dirty_ids = Vec::new();
            let mut now = Instant::ZERO;
            for (op, advance_ms, flag) in steps {
                now = now.saturating_add(Duration::from_millis(advance_ms));
                match op {
                    0 => {
                        let s = pool.acquire(THIRTY, &mut rng, now);
                        let left = s.last_use()
                            .saturating_add(Duration::from_secs(1800))
                            .saturating_duration_since(now);
                        proptest::prop_assert!(left >= STALE_MARGIN);
                        proptest::prop_assert!(!dirty_ids.contains(&s.id()));
                        proptest::prop_assert!(out.iter().all(|o| o.id() != s.id()));
                        out.push(s);
                    }
                    1 if !out.is_empty() => {
                        let mut s = out.remove(0);
                        if flag {
                            s.mark_dirty();
                            dirty_ids.push(s.id());
                        } else {
                            s.mark_used(now);
                        }
                        pool.release(s, THIRTY, now);
                    }
                    _ => {}
                }
                let mut ids: Vec<SessionId> = pool.sessions.iter().map(|s| s.id()).collect();
                ids.sort();
                ids.dedup();
                proptest::prop_assert_eq!(ids.len(), pool.len());
            }
        }
    }
}
