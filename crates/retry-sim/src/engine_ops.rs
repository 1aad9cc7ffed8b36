//! The engine benchmark's workloads, shared by `benches/engine.rs` (criterion) and the examples
//! `engine_calls` and `engine_scaling` (valgrind counts): one whole operation in the simulated
//! driver, and the baseline of the same OP_MSG round trip through the codec alone.

use bson::{doc, Document};
use retry_core::wire::{FrameDecoder, MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

use retry_core::engine::EngineEvent;
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};

use crate::{address, Role, Sim, SimServer};

/// Operations run before measuring, so that every mongos is discovered and has a pooled
/// connection, and the driver's buffers have their steady-state capacity.
const WARM_UP: usize = 30;

/// Three healthy mongos, discovered and warmed up.
pub fn three_mongos() -> Sim {
    let servers = ["m1", "m2", "m3"]
        .into_iter()
        .map(|host| (address(host), SimServer::new(Role::Mongos)))
        .collect();
    let mut sim = Sim::new(servers, |_| {});
    for _ in 0..WARM_UP {
        one_operation(&mut sim);
    }
    sim
}

/// One read from start to final event: select among the three mongos, check a connection out,
/// encode the command, the server decodes it and encodes `{ok: 1}`, decode the reply, check the
/// connection in, finish. Returns the reply's field count so the work is not optimized away.
pub fn one_operation(sim: &mut Sim) -> usize {
    let op = sim.read(doc! { "find": "c" });
    let reply = sim.run(op).expect("a healthy mongos answers");
    // Only the last operation's events are kept, so the driver's memory stays flat.
    sim.events.clear();
    reply.len()
}

/// The command and the reply of [`one_operation`], as the engine and the server build them.
pub fn round_trip_messages() -> (OpMsg, OpMsg) {
    let request = OpMsg::command(2, doc! { "find": "c", "$db": "test" });
    let reply = OpMsg {
        request_id: 0,
        response_to: 2,
        flags: MsgFlags::NONE,
        body: doc! { "ok": 1 },
        sequences: Vec::new(),
    };
    (request, reply)
}

/// The baseline: the codec work of one round trip alone (encode and decode the command, encode
/// and decode the reply), which [`one_operation`] also does.
pub fn codec_round_trip(request: &OpMsg, reply: &OpMsg) -> usize {
    let mut total = 0;
    for message in [request, reply] {
        let mut bytes = Vec::new();
        message
            .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
            .expect("encodable");
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let decoded: Document = match decoder.decode(&bytes) {
            Ok((_, Some(m))) => m.body,
            _ => Document::new(),
        };
        total += decoded.len();
    }
    total
}

/// Starts `n` reads at once (read preference primary), then runs the driver until all of them
/// have finished, each successfully. Returns the number of replies' fields, so the work is not
/// optimized away. The driver's event log is emptied as it goes, so its memory stays flat.
///
/// Panics if an operation fails or the burst does not finish within 10 minutes of virtual time.
pub fn burst(sim: &mut Sim, n: usize) -> usize {
    burst_with(sim, n, &[crate::primary()])
}

/// Eight read preferences (the five modes, and three of them with a tag set), which
/// [`burst_with`] takes in rotation: more than the engine's selection cache keeps per topology
/// revision (review9 finding 3).
pub fn eight_read_preferences() -> Vec<SelectionCriteria> {
    use ReadPreferenceMode::*;
    let tags = || vec![[("dc", "ny")].into_iter().collect()];
    [
        (Primary, vec![]),
        (PrimaryPreferred, vec![]),
        (Secondary, vec![]),
        (SecondaryPreferred, vec![]),
        (Nearest, vec![]),
        (Secondary, tags()),
        (SecondaryPreferred, tags()),
        (Nearest, tags()),
    ]
    .into_iter()
    .map(|(mode, tag_sets)| {
        SelectionCriteria::Read(ReadPreference::new(mode, tag_sets, None).expect("valid"))
    })
    .collect()
}

/// [`burst`] with the reads' criteria taken from `criteria` in rotation.
pub fn burst_with(sim: &mut Sim, n: usize, criteria: &[SelectionCriteria]) -> usize {
    sim.events.clear();
    for criteria in criteria.iter().cycle().take(n) {
        let command = doc! { "find": "c" };
        sim.start(command, OperationKind::Read, criteria.clone());
    }
    let limit = sim.now.saturating_add(std::time::Duration::from_secs(600));
    let mut finished = 0;
    let mut fields = 0;
    loop {
        for (_, event) in sim.events.drain(..) {
            if let EngineEvent::OperationFinished { result, .. } = event {
                fields += result.expect("a healthy mongos answers").iter().count();
                finished += 1;
            }
        }
        if finished == n {
            return fields;
        }
        assert!(
            sim.step(limit),
            "the burst of {n} did not finish by {limit}"
        );
    }
}
