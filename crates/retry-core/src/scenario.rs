//! A scripted, bounded driver for one [`RetryMachine`] in virtual time: what the retry machine
//! does against a list of servers and a script of attempt outcomes, recorded as a [`Trace`].
//!
//! It stands in for a real driver in tests, examples and benchmarks. Server selection is the
//! simplest one the deprioritization rule allows: the first listed server that is not
//! deprioritized, else the first listed server. Each attempt takes the step's latency of virtual
//! time; backoffs advance the clock to [`RetryMachine::poll_timeout`]. The run is bounded by
//! [`MAX_STEPS`], so a script that never lets the operation finish still ends.

use alloc::vec::Vec;
use core::time::Duration;
use rand_core::RngCore;

use crate::error::OperationError;
use crate::retry::{Action, AttemptServer, DenyReason, RetryEvent, RetryMachine, RetryReason};
use crate::time::Instant;

/// The most machine inputs one run makes before it gives up.
pub const MAX_STEPS: usize = 10_000;

/// How one attempt (or the selection before it) ends.
#[derive(Clone, Debug, PartialEq)]
pub enum StepOutcome {
    /// The command is sent and succeeds.
    Succeed,
    /// The command is sent and fails with this error.
    Fail(OperationError),
    /// The attempt fails before the command is written (checkout, connect, handshake).
    FailBeforeSend(OperationError),
    /// Server selection fails with this error.
    SelectionFails(OperationError),
}

/// One scripted step: an outcome and how much virtual time it takes.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// How the step ends.
    pub outcome: StepOutcome,
    /// The virtual time from dispatch to the outcome.
    pub latency: Duration,
}

/// The outcomes of successive attempts. After the last step, the last step repeats (a fail point
/// in `alwaysOn` mode); an empty script always succeeds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Script {
    steps: Vec<Step>,
}

impl Script {
    /// An empty script: every attempt succeeds at once.
    pub fn new() -> Script {
        Script::default()
    }

    /// Appends a step with zero latency.
    pub fn then(self, outcome: StepOutcome) -> Script {
        self.then_after(Duration::ZERO, outcome)
    }

    /// Appends a step that takes `latency`.
    pub fn then_after(mut self, latency: Duration, outcome: StepOutcome) -> Script {
        self.steps.push(Step { outcome, latency });
        self
    }

    /// The step for the `index`-th attempt (0-based).
    pub fn step(&self, index: usize) -> Step {
        self.steps
            .get(index)
            .or(self.steps.last())
            .cloned()
            .unwrap_or(Step {
                outcome: StepOutcome::Succeed,
                latency: Duration::ZERO,
            })
    }
}

/// Everything a run did, with the virtual time of each item.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Every action the machine emitted, in order.
    pub actions: Vec<(Instant, Action)>,
    /// Every event the machine emitted, in order.
    pub events: Vec<(Instant, RetryEvent)>,
}

impl Trace {
    /// The operation's result, if it finished.
    pub fn result(&self) -> Option<&Result<(), OperationError>> {
        self.actions.iter().find_map(|(_, a)| match a {
            Action::Finished(r) => Some(r),
            _ => None,
        })
    }

    /// When the operation finished, if it did.
    pub fn finished_at(&self) -> Option<Instant> {
        self.actions
            .iter()
            .find_map(|(t, a)| matches!(a, Action::Finished(_)).then_some(*t))
    }

    /// The attempts dispatched, in order.
    pub fn dispatches(&self) -> impl Iterator<Item = &crate::retry::Attempt> {
        self.actions.iter().filter_map(|(_, a)| match a {
            Action::Dispatch(attempt) => Some(attempt),
            _ => None,
        })
    }

    /// How many commands were started (the spec tests' `commandStartedEvent` count).
    pub fn commands_started(&self) -> usize {
        self.events
            .iter()
            .filter(|(_, e)| matches!(e, RetryEvent::CommandStarted { .. }))
            .count()
    }

    /// The retries scheduled, in order, with their backoff and reason.
    pub fn retries_scheduled(&self) -> impl Iterator<Item = (Duration, RetryReason)> + '_ {
        self.events.iter().filter_map(|(_, e)| match e {
            RetryEvent::RetryScheduled { delay, reason, .. } => Some((*delay, *reason)),
            _ => None,
        })
    }

    /// Why retries were denied, in order.
    pub fn denials(&self) -> impl Iterator<Item = DenyReason> + '_ {
        self.events.iter().filter_map(|(_, e)| match e {
            RetryEvent::RetryDenied { reason, .. } => Some(*reason),
            _ => None,
        })
    }

    /// The backoffs waited, in order.
    pub fn waits(&self) -> impl Iterator<Item = Duration> + '_ {
        self.actions.iter().filter_map(|(t, a)| match a {
            Action::Wait { until } => Some(until.saturating_duration_since(*t)),
            _ => None,
        })
    }
}

/// Runs `machine` against `servers` and `script`, starting at `start`, until it finishes or
/// [`MAX_STEPS`] inputs were made. `servers` must not be empty for any attempt to run; with no
/// servers every selection fails.
pub fn run<R: RngCore>(
    machine: &mut RetryMachine<R>,
    servers: &[AttemptServer],
    script: &Script,
    start: Instant,
) -> Trace {
    let mut trace = Trace::default();
    let mut now = start;
    let mut next_step = 0;
    for _ in 0..MAX_STEPS {
        let Some(action) = machine.poll_action() else {
            drain_events(machine, &mut trace, now);
            match machine.poll_timeout() {
                Some(at) => {
                    now = now.max(at);
                    machine.handle_timeout(now);
                    continue;
                }
                None => break,
            }
        };
        trace.actions.push((now, action.clone()));
        // Inputs that do not fit are ignored by the machine; a well-formed script never makes one.
        let _ = match action {
            Action::SelectServer => {
                let step = script.step(next_step);
                match (step.outcome, choose(servers, machine.deprioritized())) {
                    (StepOutcome::SelectionFails(error), _) => {
                        next_step += 1;
                        now = now.saturating_add(step.latency);
                        machine.handle_selection_failed(error, now)
                    }
                    (_, None) => machine.handle_selection_failed(
                        OperationError::server_selection("no servers"),
                        now,
                    ),
                    (_, Some(server)) => machine.handle_server_selected(server.clone(), now),
                }
            }
            Action::Dispatch(_) => {
                let step = script.step(next_step);
                next_step += 1;
                match step.outcome {
                    StepOutcome::FailBeforeSend(error) => {
                        now = now.saturating_add(step.latency);
                        machine.handle_failed(error, now)
                    }
                    outcome => {
                        let _ = machine.handle_sent(now);
                        drain_events(machine, &mut trace, now);
                        now = now.saturating_add(step.latency);
                        match outcome {
                            StepOutcome::Fail(error) | StepOutcome::SelectionFails(error) => {
                                machine.handle_failed(error, now)
                            }
                            _ => machine.handle_succeeded(now),
                        }
                    }
                }
            }
            Action::ReleaseConnection { .. } | Action::Wait { .. } => Ok(()),
            Action::Finished(_) => {
                drain_events(machine, &mut trace, now);
                break;
            }
        };
        drain_events(machine, &mut trace, now);
    }
    trace
}

fn drain_events<R: RngCore>(machine: &mut RetryMachine<R>, trace: &mut Trace, now: Instant) {
    while let Some(event) = machine.poll_event() {
        trace.events.push((now, event));
    }
}

/// The first server not deprioritized, else the first server (SS deprioritization, simplified).
fn choose<'a>(
    servers: &'a [AttemptServer],
    deprioritized: &[crate::address::ServerAddress],
) -> Option<&'a AttemptServer> {
    servers
        .iter()
        .find(|s| !deprioritized.contains(&s.address))
        .or(servers.first())
}
