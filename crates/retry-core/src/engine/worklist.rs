//! The worklist and the timer queue: which machine runs next, and which is due when.
//!
//! A machine goes on the worklist when something was handed to it (an input, another machine's
//! output); it is on it at most once, and the list is first in, first out, so the order in which
//! machines run depends only on the order of the inputs. Draining a machine hands its outputs to
//! their consumers and registers the machine's next deadline in [`Timers`], an ordered set of
//! `(deadline, machine)`: `poll_timeout` reads its head and `handle_timeout` takes only what is due.

use alloc::collections::{BTreeSet, VecDeque};
use alloc::vec::Vec;

use super::{ConnId, Engine, OpId, Operation, ServerId};
use crate::pool::{CheckoutId, ConnectionId};
use crate::time::Instant;

/// A machine the engine drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) enum Machine {
    /// The SDAM topology (its events and actions; its pools are [`Machine::Pool`]).
    Topology,
    /// A server's monitor.
    Monitor(ServerId),
    /// A server's pool.
    Pool(ServerId),
    /// A socket's connection machine.
    Socket(ConnId),
    /// An operation's retry machine and selection.
    Operation(OpId),
}

/// A checkout its pool answered at once, with nothing else on the worklist (issue 9): the pool's
/// turn would be the next one, so it runs right after the current turn
/// ([`Engine::run_served`]) instead of through the worklist and the table of pending checkouts.
/// Meanwhile the pool counts as queued, so nothing else gives it a turn of its own first.
#[derive(Clone, Copy, Debug)]
pub(super) struct Served {
    pub(super) server: ServerId,
    pub(super) checkout: CheckoutId,
    pub(super) connection: ConnectionId,
    /// The operation slot that checked out.
    pub(super) op: OpId,
    pub(super) slot: usize,
}

/// Every registered deadline, ordered. Each machine has at most one entry; its own copy of the
/// deadline (the `timer` fields) finds the entry to replace.
#[derive(Default)]
pub(super) struct Timers {
    queue: BTreeSet<(Instant, Machine)>,
}

impl Timers {
    /// Makes `at` the deadline of `machine`, whose current one is in `slot`. Nearly always it is
    /// the one registered (none, mostly): that check is inlined, the change is not (issue 9:
    /// about four calls per round trip, each paying the change's entry and exit for nothing).
    #[inline(always)]
    pub(super) fn set(
        &mut self,
        machine: Machine,
        slot: &mut Option<Instant>,
        at: Option<Instant>,
    ) {
        if *slot != at {
            self.replace(machine, slot, at);
        }
    }

    /// [`Timers::set`] when the deadline changes.
    #[inline(never)]
    fn replace(&mut self, machine: Machine, slot: &mut Option<Instant>, at: Option<Instant>) {
        if let Some(old) = slot.take() {
            self.queue.remove(&(old, machine));
        }
        if let Some(at) = at {
            self.queue.insert((at, machine));
        }
        *slot = at;
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Takes the earliest entry if it is due at `now`; its machine must clear its slot.
    pub(super) fn pop_due(&mut self, now: Instant) -> Option<Machine> {
        match self.queue.first() {
            Some((at, _)) if *at <= now => self.queue.pop_first().map(|(_, machine)| machine),
            _ => None,
        }
    }
}

/// [`Engine::schedule`] of `server`'s pool, from the parts it touches (issue 9: callers with an
/// operation at hand schedule a pool without a borrow of the whole engine).
#[inline(always)]
pub(super) fn schedule_pool(
    servers: &mut [super::Server],
    work: &mut VecDeque<Machine>,
    server: ServerId,
) {
    if let Some(entry) = servers.get_mut(server.0 as usize) {
        if !entry.pool_queued {
            entry.pool_queued = true;
            work.push_back(Machine::Pool(server));
        }
    }
}

impl Engine {
    /// Puts `machine` on the worklist unless it is there already (or gone).
    pub(super) fn schedule(&mut self, machine: Machine) {
        let queued = match machine {
            Machine::Topology => Some(&mut self.topology_queued),
            Machine::Monitor(server) => self
                .servers
                .get_mut(server.0 as usize)
                .and_then(|s| s.monitor.as_mut())
                .map(|m| &mut m.queued),
            Machine::Pool(server) => {
                return schedule_pool(&mut self.servers, &mut self.work, server)
            }
            Machine::Socket(conn) => self.sockets.get_mut(&conn).map(|s| &mut s.queued),
            Machine::Operation(op) if self.draining == Some(op) => None,
            Machine::Operation(op) => self.ops.get_mut(&op).map(|o| &mut o.queued),
        };
        if let Some(queued) = queued {
            if !*queued {
                *queued = true;
                self.work.push_back(machine);
            }
        }
    }

    /// Every pool of the topology, after a change that may have touched any of them.
    pub(super) fn schedule_every_pool(&mut self) {
        let addresses: Vec<_> = self.topology.pools().map(|p| p.address().clone()).collect();
        for address in addresses {
            let server = self.server_id(&address);
            self.schedule(crate::engine::worklist::Machine::Pool(server));
        }
    }

    /// One machine's turn, off the worklist: its outputs routed to their consumers, its next
    /// deadline registered, then the pool turns of the checkouts it served at once (`Served`),
    /// which come first after it.
    #[inline]
    fn turn(&mut self, machine: Machine, now: Instant) {
        match machine {
            Machine::Topology => self.drain_topology(now),
            Machine::Monitor(server) => self.drain_monitor(server, now),
            Machine::Pool(server) => self.drain_pool(server, now),
            // The last two register their own deadlines (issue 9: with the socket or the
            // operation at hand).
            Machine::Socket(conn) => self.drain_socket(conn, now),
            Machine::Operation(op) => self.drain_operation(op, now),
        }
        self.refresh_timer(machine);
        while let Some(served) = self.served.take() {
            self.run_served(served, now);
        }
    }

    /// After an input handed to `machine` (not queued): its turn, then the worklist. With
    /// nothing on the worklist its turn would be the only one there, so it runs without
    /// entering it (issue 9: no queueing and no lookups of its flag for nothing).
    pub(super) fn run_input(&mut self, machine: Machine, now: Instant) {
        match self.work.is_empty() {
            true => self.turn(machine, now),
            false => self.schedule(machine),
        }
        self.run(now);
    }

    /// Runs the worklist until no machine has anything left to do.
    pub(super) fn run(&mut self, now: Instant) {
        // Each machine runs a bounded number of times per input; a loop that does not settle is a
        // bug, and fails loudly in tests.
        let bound = 64 * (self.ops.len() + self.sockets.len() + self.servers.len() + 16);
        let mut steps = 0usize;
        while let Some(machine) = self.work.pop_front() {
            steps += 1;
            debug_assert!(steps <= bound, "the engine's worklist does not settle");
            self.unqueue(machine);
            self.turn(machine, now);
        }
        debug_assert!(self.served.is_none(), "a served checkout outside a turn");
        // SE-15: the last `endSessions` of `close` ended; the pools close now.
        if self.ending_sessions && self.ops.is_empty() {
            self.ending_sessions = false;
            self.close_pools(now);
        }
    }

    /// Clears `machine`'s flag as it comes off the worklist. Inlined (issue 9): an operation's
    /// costs nothing here.
    #[inline(always)]
    pub(super) fn unqueue(&mut self, machine: Machine) {
        match machine {
            Machine::Topology => self.topology_queued = false,
            Machine::Monitor(server) => {
                if let Some(state) = self.server_mut(server).monitor.as_mut() {
                    state.queued = false;
                }
            }
            Machine::Pool(server) => self.server_mut(server).pool_queued = false,
            Machine::Socket(conn) => {
                if let Some(socket) = self.sockets.get_mut(&conn) {
                    socket.queued = false;
                }
            }
            // Cleared by the first lookup of its turn (`Engine::drain_operation`, issue 9).
            Machine::Operation(_) => {}
        }
    }

    /// Registers the pool's next deadline.
    #[inline]
    pub(super) fn refresh_pool_timer(&mut self, server: ServerId) {
        let at = self.pool(server).and_then(|p| p.poll_timeout());
        let slot = &mut self.servers[server.0 as usize].pool_timer;
        self.timers.set(Machine::Pool(server), slot, at);
    }

    /// Registers the operation's next deadline (after a turn that did not settle it itself).
    pub(super) fn refresh_operation_timer(&mut self, op: OpId) {
        if let Some(operation) = self.ops.get_mut(&op) {
            let at = operation.next_deadline();
            self.timers
                .set(Machine::Operation(op), &mut operation.timer, at);
        }
    }

    /// Registers the machine's next deadline.
    #[inline(always)]
    fn refresh_timer(&mut self, machine: Machine) {
        match machine {
            Machine::Topology => {}
            Machine::Monitor(server) => {
                if let Some(state) = self.servers[server.0 as usize].monitor.as_mut() {
                    let at = state.monitor.poll_timeout();
                    self.timers.set(machine, &mut state.timer, at);
                }
            }
            Machine::Pool(server) => self.refresh_pool_timer(server),
            // Registered by their turns (`Engine::drain_socket`, `Engine::drain_operation`).
            Machine::Socket(_) | Machine::Operation(_) => {}
        }
    }
}

impl Operation {
    /// The operation's next deadline: its machine's, or a waiting selection's wake-up.
    #[inline(always)]
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let wakes = self.slots.iter().filter_map(|s| s.wake);
        self.machine.poll_timeout().into_iter().chain(wakes).min()
    }
}
