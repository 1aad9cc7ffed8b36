//! What the server did, so a test can prove, for example, that a non-retryable write ran once.

use std::collections::BTreeMap;

use crate::faults::Fault;

/// Per command name: what happened to the requests that named it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandCounts {
    /// Requests received.
    pub received: u64,
    /// Requests whose command actually ran: not rejected by the ingress limiter, not replaced by a
    /// fail point's error or `closeConnection`. A `writeConcernError` fail point runs it.
    pub executed: u64,
    /// Retries of a retryable write that already ran (same `lsid` and `txnNumber`): answered with
    /// the first reply, not run again.
    pub replayed: u64,
    /// Replies with `ok: 1` (a `writeConcernError` included), before any random fault.
    pub succeeded: u64,
    /// Replies with `ok: 0`, before any random fault.
    pub failed: u64,
}

/// How many of each random fault were injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounts {
    /// [`Fault::ResetMidFrame`].
    pub reset_mid_frame: u64,
    /// [`Fault::Stall`].
    pub stall: u64,
    /// [`Fault::Garbage`].
    pub garbage: u64,
    /// [`Fault::OversizedLength`].
    pub oversized_length: u64,
}

impl FaultCounts {
    pub(crate) fn record(&mut self, fault: Fault) {
        let count = match fault {
            Fault::ResetMidFrame => &mut self.reset_mid_frame,
            Fault::Stall => &mut self.stall,
            Fault::Garbage => &mut self.garbage,
            Fault::OversizedLength => &mut self.oversized_length,
        };
        *count += 1;
    }

    /// All faults injected.
    pub fn total(&self) -> u64 {
        self.reset_mid_frame + self.stall + self.garbage + self.oversized_length
    }
}

/// A snapshot of the server's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Per command name (the first key of the request body).
    pub commands: BTreeMap<String, CommandCounts>,
    /// Sockets accepted, including those the connection limiter then closed.
    pub connections_accepted: u64,
    /// Sockets closed, by either side, including those the connection limiter closed.
    pub connections_closed: u64,
    /// Sockets the connection limiter closed before their handshake.
    pub connections_rejected: u64,
    /// Commands the ingress limiter answered with code 462.
    pub ingress_rejected: u64,
    /// Times the `failCommand` fail point fired.
    pub fail_points_triggered: u64,
    /// Random faults injected.
    pub faults: FaultCounts,
    /// Connections closed because the client sent bytes that are not a valid OP_MSG.
    pub protocol_errors: u64,
    /// Accepted sockets whose TLS handshake failed (the client refused the certificate, or did
    /// not speak TLS).
    pub tls_handshakes_failed: u64,
}

impl Counters {
    /// The counts of command `name`, zero if it was never received.
    pub fn command(&self, name: &str) -> CommandCounts {
        self.commands.get(name).copied().unwrap_or_default()
    }

    /// The counts of command `name`, to update (no allocation once the name was seen).
    pub(crate) fn command_mut(&mut self, name: &str) -> &mut CommandCounts {
        if !self.commands.contains_key(name) {
            self.commands
                .insert(name.to_owned(), CommandCounts::default());
        }
        self.commands.get_mut(name).expect("inserted above")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_commands_count_zero_and_faults_add_up() {
        let mut counters = Counters::default();
        assert_eq!(counters.command("find"), CommandCounts::default());
        counters.command_mut("find").received += 1;
        counters.command_mut("find").received += 1;
        assert_eq!(counters.command("find").received, 2);
        for fault in [Fault::ResetMidFrame, Fault::Stall, Fault::Stall] {
            counters.faults.record(fault);
        }
        assert_eq!(counters.faults.stall, 2);
        assert_eq!(counters.faults.total(), 3);
    }
}
