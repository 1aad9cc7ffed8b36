//! The simulation's pending events, kept by where they come from, each source cheap for its own
//! shape: first-in first-out [`Lane`]s for fixed delays, a [`Few`] for the workers' completions
//! (at most one per worker) and a [`Timers`] wheel for backoffs and hedging delays.
//!
//! Every source answers the key of its earliest event, (time, sequence number) as one `u128`, and
//! gives that event up; the model takes the earliest of all sources, which is the order one queue
//! of every event would give.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The key of no event: above every real key.
pub(super) const NONE: u128 = u128::MAX;

/// What happens at an event; `u32`s of work are indices into the model's attempts.
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    Arrival,
    AtServer(u32),
    Completed(u32),
    Reply(u32),
    Timer { op: u32, serial: u32, gen: u32 },
    Deadline { op: u32, serial: u32 },
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Event {
    pub(super) time: u64,
    pub(super) seq: u64,
    pub(super) kind: Kind,
}

impl Event {
    /// (time, sequence) as one number: the order of events.
    #[inline]
    pub(super) fn key(&self) -> u128 {
        (u128::from(self.time) << 64) | u128::from(self.seq)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Event) -> bool {
        self.key() == other.key()
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Event) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Event {
    fn cmp(&self, other: &Event) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// Events pushed in key order (a fixed delay after they were scheduled): a vector read from a
/// moving head, with the key of the event at the head kept.
pub(super) struct Lane {
    events: Vec<Event>,
    head: usize,
    front: u128,
}

impl Default for Lane {
    fn default() -> Lane {
        Lane {
            events: Vec::new(),
            head: 0,
            front: NONE,
        }
    }
}

impl Lane {
    /// An empty lane with room for `events` before it grows.
    pub(super) fn with_capacity(events: usize) -> Lane {
        Lane {
            events: Vec::with_capacity(events),
            ..Lane::default()
        }
    }

    /// Appends `event`, which must not be earlier than any event in the lane.
    #[inline]
    pub(super) fn push(&mut self, event: Event) {
        debug_assert!(
            self.events
                .last()
                .is_none_or(|last| last.key() <= event.key()),
            "a lane's events come in key order"
        );
        if self.head == self.events.len() {
            self.events.clear();
            self.head = 0;
            self.front = event.key();
        } else if self.events.len() == self.events.capacity() && self.head * 2 >= self.events.len()
        {
            // Full and read at least halfway: drop the part already read instead of growing
            // (each event is moved at most once per event read before it).
            self.events.drain(..self.head);
            self.head = 0;
        }
        self.events.push(event);
    }

    #[inline]
    pub(super) fn min_key(&self) -> u128 {
        self.front
    }

    /// The earliest event, left in the lane.
    #[inline]
    pub(super) fn front(&self) -> Option<&Event> {
        self.events.get(self.head)
    }

    /// Takes the earliest event.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Event> {
        let event = self.events.get(self.head).copied()?;
        self.head += 1;
        self.front = self.events.get(self.head).map_or(NONE, Event::key);
        Some(event)
    }
}

/// A handful of events (the workers' completions: at most one per worker), sorted with the
/// earliest last: a push moves the later ones up one place, a pop takes the last.
pub(super) struct Few {
    events: Vec<Event>,
    min_key: u128,
}

impl Few {
    pub(super) fn new() -> Few {
        Few {
            events: Vec::with_capacity(64),
            min_key: NONE,
        }
    }

    #[inline]
    pub(super) fn push(&mut self, event: Event) {
        let key = event.key();
        insert_sorted(&mut self.events, event);
        self.min_key = self.min_key.min(key);
    }

    #[inline]
    pub(super) fn min_key(&self) -> u128 {
        self.min_key
    }

    /// Takes the earliest event.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<Event> {
        let event = self.events.pop();
        self.min_key = self.events.last().map_or(NONE, Event::key);
        event
    }
}

/// Adds `event` to `events`, which are sorted with the earliest last, moving the later ones up
/// one place (the vectors this sorts hold a handful).
#[inline]
fn insert_sorted(events: &mut Vec<Event>, event: Event) {
    let key = event.key();
    events.push(event);
    let mut i = events.len() - 1;
    while i > 0 && events[i - 1].key() < key {
        events.swap(i - 1, i);
        i -= 1;
    }
}

/// log2 of a wheel bucket's width in nanoseconds (about 131 µs: at the default run's highest
/// loads a bucket holds about one timer, so that sorting a bucket when the wheel reaches it moves
/// little).
const BUCKET_SHIFT: u32 = 17;
/// Buckets in the wheel: it spans about 2.1 s (a backoff or hedging delay within the default 2 s
/// operation timeout stays in the wheel). 64 × 64 × 4, for the two levels of bit sets.
const BUCKETS: usize = 16384;
/// Words of the bit set of occupied slots, and of its summary.
const WORDS: usize = BUCKETS / 64;
const SUMMARY_WORDS: usize = WORDS / 64;

/// Timers (backoffs, hedging delays): a timing wheel of 131 µs buckets over about 2 s, with a heap
/// for anything later. The current bucket is kept sorted (earliest last); the others are unsorted
/// lists in one slab until the wheel turns to them, and two levels of bit sets find the next one
/// that is not empty. A push and a pop cost about the same whether ten or ten thousand timers are
/// pending, and nothing is allocated once the slab holds the most timers pending at once.
pub(super) struct Timers {
    /// The bucket of `cursor` and every earlier time, sorted with the earliest last.
    current: Vec<Event>,
    /// Per ring slot, the first node of its list: bucket `b` (absolute, `time >> BUCKET_SHIFT`)
    /// for `cursor < b < cursor + BUCKETS` is at slot `b % BUCKETS`.
    heads: Box<[u32]>,
    /// The lists' nodes (an event and the next node), and the first free one.
    nodes: Vec<(Event, u32)>,
    free: u32,
    /// One bit per ring slot that is not empty, and one bit per word of those that is not zero.
    occupied: Box<[u64; WORDS]>,
    summary: [u64; SUMMARY_WORDS],
    /// Events in the ring.
    in_ring: usize,
    /// The absolute bucket of `current`.
    cursor: u64,
    /// Timers at or past `cursor + BUCKETS`.
    later: BinaryHeap<Reverse<Event>>,
    /// The key of the earliest timer.
    min: u128,
}

/// The end of a list.
const NIL: u32 = u32::MAX;

impl Timers {
    pub(super) fn new() -> Timers {
        Timers {
            current: Vec::new(),
            heads: vec![NIL; BUCKETS].into_boxed_slice(),
            nodes: Vec::new(),
            free: NIL,
            occupied: Box::new([0; WORDS]),
            summary: [0; SUMMARY_WORDS],
            in_ring: 0,
            cursor: 0,
            later: BinaryHeap::new(),
            min: NONE,
        }
    }

    /// Adds a timer at or after `now`.
    pub(super) fn push(&mut self, event: Event, now: u64) {
        if self.in_ring == 0 && self.current.is_empty() {
            // An empty wheel starts again at now, so that it spans the next seconds.
            self.cursor = self.cursor.max(now >> BUCKET_SHIFT);
        }
        let key = event.key();
        self.min = self.min.min(key);
        let bucket = event.time >> BUCKET_SHIFT;
        if bucket <= self.cursor {
            insert_sorted(&mut self.current, event);
        } else if bucket - self.cursor < BUCKETS as u64 {
            let slot = (bucket as usize) % BUCKETS;
            let next = self.heads[slot];
            let node = if self.free == NIL {
                self.nodes.push((event, next));
                (self.nodes.len() - 1) as u32
            } else {
                let node = self.free;
                self.free = self.nodes[node as usize].1;
                self.nodes[node as usize] = (event, next);
                node
            };
            self.heads[slot] = node;
            self.occupied[slot / 64] |= 1 << (slot % 64);
            self.summary[slot / 4096] |= 1 << (slot / 64 % 64);
            self.in_ring += 1;
        } else {
            self.later.push(Reverse(event));
        }
    }

    #[inline]
    pub(super) fn min_key(&self) -> u128 {
        self.min
    }

    /// The key of the earliest timer, found again; turns the wheel to the next bucket that is
    /// not empty when the current one is.
    fn find_min(&mut self) -> u128 {
        if self.current.is_empty() && self.in_ring > 0 {
            self.turn();
        }
        let wheel = self.current.last().map_or(NONE, Event::key);
        match self.later.peek() {
            Some(Reverse(e)) => wheel.min(e.key()),
            None => wheel,
        }
    }

    /// The first slot at or after `from` (wrapping around) that is not empty; the ring is not.
    fn next_occupied(&self, from: usize) -> usize {
        let word = from / 64;
        let bits = self.occupied[word] & (u64::MAX << (from % 64));
        if bits != 0 {
            return word * 64 + bits.trailing_zeros() as usize;
        }
        // The words after this one, then from the start (this one again included).
        let w = self.next_word((word + 1) % WORDS);
        w * 64 + self.occupied[w].trailing_zeros() as usize
    }

    /// The first word of `occupied` at or after `from` (wrapping around) that is not zero; the
    /// ring is not empty, so one is (the loop ends at the latest when it comes back round to
    /// `from`'s summary word, read whole).
    #[inline]
    fn next_word(&self, from: usize) -> usize {
        let mut s = from / 64;
        let mut bits = self.summary[s] & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return s * 64 + bits.trailing_zeros() as usize;
            }
            s = (s + 1) % SUMMARY_WORDS;
            bits = self.summary[s];
        }
    }

    /// Moves `cursor` to the next ring bucket that is not empty and sorts it into `current`
    /// (which is empty).
    fn turn(&mut self) {
        let slot = self.next_occupied((self.cursor as usize + 1) % BUCKETS);
        let ahead = (slot + BUCKETS - self.cursor as usize % BUCKETS) % BUCKETS;
        self.cursor += ahead as u64;
        self.occupied[slot / 64] &= !(1 << (slot % 64));
        if self.occupied[slot / 64] == 0 {
            self.summary[slot / 4096] &= !(1 << (slot / 64 % 64));
        }
        let mut node = std::mem::replace(&mut self.heads[slot], NIL);
        while node != NIL {
            let (event, next) = self.nodes[node as usize];
            insert_sorted(&mut self.current, event);
            self.nodes[node as usize].1 = self.free;
            self.free = node;
            node = next;
        }
        self.in_ring -= self.current.len();
    }

    /// Takes the earliest timer.
    pub(super) fn pop(&mut self) -> Option<Event> {
        if self.current.is_empty() && self.in_ring > 0 {
            self.turn();
        }
        let wheel = self.current.last().map_or(NONE, Event::key);
        let event = match self.later.peek() {
            Some(Reverse(e)) if e.key() < wheel => self.later.pop().map(|Reverse(e)| e),
            _ => self.current.pop(),
        };
        self.min = self.find_min();
        event
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::RngCore;
    use retry_core::rng::EngineRng;

    fn event(time: u64, seq: u64) -> Event {
        Event {
            time,
            seq,
            kind: Kind::Arrival,
        }
    }

    /// Every source gives its events in the order of one heap of them all, whatever the mix of
    /// pushes and pops (times from now to far past the wheel's span, ties included).
    #[test]
    fn sources_pop_in_heap_order() {
        let mut rng = EngineRng::from_seed_u64(7);
        for round in 0..40u64 {
            let mut timers = Timers::new();
            let mut few = Few::new();
            let mut heap = BinaryHeap::new();
            let mut few_heap = BinaryHeap::new();
            let (mut now, mut seq) = (round * 1_000_000_007, 0u64);
            for _ in 0..5_000 {
                if !rng.next_u64().is_multiple_of(3) || heap.is_empty() {
                    seq += 1;
                    let spread = [1u64, 1 << 20, 1 << 26, 1 << 33][(rng.next_u64() % 4) as usize];
                    let e = event(now + rng.next_u64() % spread, seq);
                    timers.push(e, now);
                    heap.push(Reverse(e));
                    if few_heap.len() < 12 {
                        few.push(e);
                        few_heap.push(Reverse(e));
                    }
                } else {
                    let Reverse(expected) = heap.pop().unwrap();
                    assert_eq!(timers.min_key(), expected.key());
                    assert_eq!(timers.pop().unwrap().key(), expected.key());
                    now = expected.time;
                }
                if let Some(Reverse(e)) = few_heap.peek() {
                    assert_eq!(few.min_key(), e.key());
                    if rng.next_u64().is_multiple_of(2) {
                        assert_eq!(few.pop().unwrap().key(), few_heap.pop().unwrap().0.key());
                    }
                } else {
                    assert_eq!(few.min_key(), NONE);
                }
            }
            while let Some(Reverse(expected)) = heap.pop() {
                assert_eq!(timers.min_key(), expected.key());
                assert_eq!(timers.pop().unwrap().key(), expected.key());
            }
            assert_eq!(timers.min_key(), NONE);
        }
    }

    #[test]
    fn a_lane_is_first_in_first_out() {
        let mut lane = Lane::default();
        let mut next = 0;
        for i in 0..10_000u64 {
            lane.push(event(i, i));
            if !i.is_multiple_of(3) {
                assert_eq!(lane.min_key(), event(next, next).key());
                assert_eq!(lane.pop().unwrap().time, next);
                next += 1;
            }
        }
        while lane.min_key() != NONE {
            assert_eq!(lane.pop().unwrap().time, next);
            next += 1;
        }
        assert_eq!(next, 10_000);
    }

    /// Review8 finding 8: popping an empty lane takes nothing and loses nothing pushed after.
    #[test]
    fn popping_an_empty_lane_loses_no_later_event() {
        let mut lane = Lane::default();
        assert!(lane.pop().is_none());
        lane.push(event(1, 1));
        assert_eq!(lane.pop().map(|e| e.time), Some(1));
        assert!(lane.pop().is_none() && lane.pop().is_none());
        lane.push(event(2, 2));
        assert_eq!(lane.min_key(), event(2, 2).key());
        assert_eq!(lane.pop().map(|e| e.time), Some(2));
    }
}
