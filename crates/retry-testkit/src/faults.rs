//! Random faults injected into replies, for soak tests: a reset mid-frame, a stall, garbage bytes
//! and an oversized length header, each with its own probability, drawn from a seeded generator.

use core::time::Duration;

use rand_core::RngCore;
use retry_core::rng::EngineRng;
use retry_core::wire::{HEADER_LEN, OP_COMPRESSED, OP_MSG};

use crate::config::MAX_MESSAGE_SIZE_BYTES;

/// How often each fault replaces a reply. Probabilities are in `[0, 1]`; one uniform draw per
/// reply picks at most one fault, in the order of the fields, so their sum should not exceed 1
/// (past it, the later faults get what is left). All zero by default.
///
/// Faults apply to every reply, handshakes included, except `configureFailPoint`'s, so a test can
/// always set up its fail points over the wire.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Write the first half of the reply, then reset the connection (`SO_LINGER` 0).
    pub reset_mid_frame: f64,
    /// Hold the reply for [`stall_for`](FaultConfig::stall_for), then send it.
    pub stall: f64,
    /// Send 16 to 64 random bytes that cannot be framed as OP_MSG, then close.
    pub garbage: f64,
    /// Send a header whose `messageLength` is one past `maxMessageSizeBytes`, then close.
    pub oversized_length: f64,
    /// How long a stall holds its reply.
    pub stall_for: Duration,
}

/// How long a stall holds its reply by default: past any deadline a test sets.
pub const DEFAULT_STALL: Duration = Duration::from_secs(10);

impl Default for FaultConfig {
    fn default() -> FaultConfig {
        FaultConfig {
            reset_mid_frame: 0.0,
            stall: 0.0,
            garbage: 0.0,
            oversized_length: 0.0,
            stall_for: DEFAULT_STALL,
        }
    }
}

/// One injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Half a reply, then a reset.
    ResetMidFrame,
    /// The reply, late.
    Stall,
    /// Unframeable bytes, then a close.
    Garbage,
    /// A header announcing a message longer than `maxMessageSizeBytes`, then a close.
    OversizedLength,
}

impl FaultConfig {
    /// Draws the fault for one reply, if any.
    pub(crate) fn choose(&self, rng: &mut EngineRng) -> Option<Fault> {
        // 53 random bits: a uniform value in [0, 1) with every bit of an f64 mantissa.
        let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let mut threshold = 0.0;
        for (probability, fault) in [
            (self.reset_mid_frame, Fault::ResetMidFrame),
            (self.stall, Fault::Stall),
            (self.garbage, Fault::Garbage),
            (self.oversized_length, Fault::OversizedLength),
        ] {
            if probability > 0.0 {
                threshold += probability;
            }
            if draw < threshold {
                return Some(fault);
            }
        }
        None
    }
}

/// A connection's generator: derived from the server seed and the connection id, so faults on one
/// connection do not depend on the others.
pub(crate) fn connection_rng(seed: u64, connection_id: i32) -> EngineRng {
    let id = u64::from(connection_id.unsigned_abs());
    EngineRng::from_seed_u64(seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// 16 to 64 random bytes whose header no decoder accepts: the opcode is never OP_MSG (2013) nor
/// OP_COMPRESSED (2012).
pub(crate) fn garbage(rng: &mut EngineRng) -> Vec<u8> {
    let len = HEADER_LEN + (rng.next_u32() % 49) as usize;
    let mut bytes = vec![0; len];
    rng.fill_bytes(&mut bytes);
    let op_code = i32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    if op_code == OP_MSG || op_code == OP_COMPRESSED {
        // The sign bit: a negative opcode is no opcode at all.
        bytes[15] ^= 0x80;
    }
    bytes
}

/// A well-formed OP_MSG header whose `messageLength` is one past `maxMessageSizeBytes` (WP-7).
pub(crate) fn oversized_header(response_to: i32) -> [u8; HEADER_LEN] {
    let mut header = [0; HEADER_LEN];
    for (i, field) in [MAX_MESSAGE_SIZE_BYTES + 1, 0, response_to, OP_MSG]
        .iter()
        .enumerate()
    {
        header[4 * i..4 * i + 4].copy_from_slice(&field.to_le_bytes());
    }
    header
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_core::wire::{DecodeError, FrameDecoder, DEFAULT_MAX_MESSAGE_SIZE_BYTES};

    #[test]
    fn no_fault_by_default() {
        let mut rng = EngineRng::from_seed_u64(1);
        let config = FaultConfig::default();
        assert!((0..1000).all(|_| config.choose(&mut rng).is_none()));
    }

    #[test]
    fn probability_one_always_injects_that_fault() {
        let mut rng = EngineRng::from_seed_u64(2);
        let config = FaultConfig {
            garbage: 1.0,
            ..FaultConfig::default()
        };
        assert!((0..1000).all(|_| config.choose(&mut rng) == Some(Fault::Garbage)));
    }

    #[test]
    fn faults_follow_their_probabilities_and_the_seed() {
        let config = FaultConfig {
            reset_mid_frame: 0.1,
            stall: 0.1,
            garbage: 0.1,
            oversized_length: 0.1,
            ..FaultConfig::default()
        };
        let draws = |seed| {
            let mut rng = connection_rng(seed, 3);
            (0..10_000)
                .map(|_| config.choose(&mut rng))
                .collect::<Vec<_>>()
        };
        let first = draws(7);
        assert_eq!(first, draws(7), "the same seed gives the same faults");
        assert_ne!(first, draws(8));
        for fault in [
            Fault::ResetMidFrame,
            Fault::Stall,
            Fault::Garbage,
            Fault::OversizedLength,
        ] {
            let n = first.iter().filter(|f| **f == Some(fault)).count();
            assert!((800..1200).contains(&n), "{fault:?}: {n} of 10000");
        }
    }

    #[test]
    fn garbage_never_frames() {
        let mut rng = EngineRng::from_seed_u64(4);
        for _ in 0..1000 {
            let bytes = garbage(&mut rng);
            assert!((16..=64).contains(&bytes.len()));
            let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
            assert!(decoder.decode(&bytes).is_err());
        }
    }

    #[test]
    fn oversized_header_is_rejected_before_the_body() {
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let result = decoder.decode(&oversized_header(9));
        assert!(matches!(result, Err(DecodeError::BadLength { .. })));
    }
}
