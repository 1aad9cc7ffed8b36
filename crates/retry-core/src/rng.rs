//! Randomness the engine owns: a small seeded generator, and jitter drawn from any
//! [`rand_core::RngCore`].
//!
//! retry-core never touches a global RNG. Each machine owns a generator seeded from its options, so
//! the same seed and the same inputs give the same delays bit for bit. [`EngineRng`] is SplitMix64:
//! its output sequence is fixed by this crate, not by a dependency's version, so recorded traces stay
//! reproducible across upgrades. Tests pin jitter with [`FixedRng`].

use core::time::Duration;
use rand_core::{RngCore, SeedableRng};

use crate::time::duration_nanos;

/// The engine's default generator: SplitMix64 (Steele, Lea and Flood, 2014), seeded from a `u64`.
///
/// Fast, 8 bytes of state, and good enough for jitter and the power-of-two server choice. It is not
/// a cryptographic generator and must not be used as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineRng {
    state: u64,
}

impl EngineRng {
    /// A generator whose whole output is determined by `seed`.
    pub fn from_seed_u64(seed: u64) -> EngineRng {
        EngineRng { state: seed }
    }
}

impl RngCore for EngineRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

impl SeedableRng for EngineRng {
    type Seed = [u8; 8];

    fn from_seed(seed: [u8; 8]) -> EngineRng {
        EngineRng::from_seed_u64(u64::from_le_bytes(seed))
    }

    fn seed_from_u64(seed: u64) -> EngineRng {
        EngineRng::from_seed_u64(seed)
    }
}

/// A "generator" that returns the same word forever: pins jitter in tests.
///
/// `FixedRng(0)` gives jitter 0; `FixedRng(u64::MAX)` gives [`Jitter::MAX_BELOW_ONE`], the largest
/// jitter below 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedRng(pub u64);

impl RngCore for FixedRng {
    fn next_u32(&mut self) -> u32 {
        (self.0 >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        self.0
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for chunk in dst.chunks_mut(8) {
            chunk.copy_from_slice(&self.0.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// A jitter factor uniform in `[0, 1)`, held exactly as a 53-bit binary fraction.
///
/// Scaling a duration by a jitter is done in integer arithmetic and rounds *up* to the nanosecond,
/// so a backoff is never shorter than the formula says (BP-17) and `MAX_BELOW_ONE` scales any
/// duration shorter than about 104 days to itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Jitter(u64);

const JITTER_BITS: u32 = 53;
const JITTER_ONE: u128 = 1 << JITTER_BITS;

impl Jitter {
    /// Jitter 0: no wait at all.
    pub const ZERO: Jitter = Jitter(0);
    /// The largest jitter below 1 (`1 - 2^-53`).
    pub const MAX_BELOW_ONE: Jitter = Jitter((1 << JITTER_BITS) - 1);

    /// Draws a jitter from `rng` (the top 53 bits of one `u64`).
    pub fn draw(rng: &mut (impl RngCore + ?Sized)) -> Jitter {
        Jitter(rng.next_u64() >> (64 - JITTER_BITS))
    }

    /// The jitter as a float in `[0, 1)`.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / JITTER_ONE as f64
    }

    /// `ceil(d × jitter)`, exactly.
    pub fn scale(self, d: Duration) -> Duration {
        scale_ceil(d, u128::from(self.0), JITTER_ONE)
    }

    /// `ceil(d × (lo + (hi − lo) × jitter))` for a range given in tenths (gRPC's `U(0.8, 1.2)` is
    /// `scale_between_tenths(d, 8, 12)`), exactly.
    pub fn scale_between_tenths(self, d: Duration, lo: u8, hi: u8) -> Duration {
        let num =
            u128::from(lo) * JITTER_ONE + u128::from(hi.saturating_sub(lo)) * u128::from(self.0);
        scale_ceil(d, num, 10 * JITTER_ONE)
    }
}

/// `ceil(d × num / den)` in nanoseconds, saturating at `u64::MAX` nanoseconds.
fn scale_ceil(d: Duration, num: u128, den: u128) -> Duration {
    let nanos = u128::from(duration_nanos(d));
    // nanos < 2^64 and num < 2^60, so the product fits in u128.
    let scaled = (nanos * num).div_ceil(den);
    Duration::from_nanos(u64::try_from(scaled).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_its_reference_sequence() {
        // Reference values for seed 1234567 from the published SplitMix64 algorithm.
        let mut rng = EngineRng::from_seed_u64(1234567);
        assert_eq!(rng.next_u64(), 6457827717110365317);
        assert_eq!(rng.next_u64(), 3203168211198807973);
        assert_eq!(rng.next_u64(), 9817491932198370423);
    }

    #[test]
    fn bp18_fixed_rng_pins_jitter_at_zero_and_just_below_one() {
        assert_eq!(Jitter::draw(&mut FixedRng(0)), Jitter::ZERO);
        assert_eq!(Jitter::draw(&mut FixedRng(u64::MAX)), Jitter::MAX_BELOW_ONE);
        assert!(Jitter::MAX_BELOW_ONE.as_f64() < 1.0);
        assert_eq!(Jitter::MAX_BELOW_ONE.as_f64(), 1.0 - f64::EPSILON / 2.0);
    }

    #[test]
    fn bp17_scaling_rounds_up_and_is_exact_at_the_ends() {
        let d = Duration::from_millis(200);
        assert_eq!(Jitter::ZERO.scale(d), Duration::ZERO);
        assert_eq!(Jitter::MAX_BELOW_ONE.scale(d), d);
        assert_eq!(Jitter(1 << 52).scale(d), Duration::from_millis(100));
        assert_eq!(Jitter(1).scale(d), Duration::from_nanos(1));
        // Past about 104 days the 2^-53 shortfall exceeds a nanosecond; it still cannot overflow.
        let huge = Jitter::MAX_BELOW_ONE.scale(Duration::MAX);
        assert_eq!(huge, Duration::from_nanos(u64::MAX - (u64::MAX >> 53)));
    }

    #[test]
    fn tenths_range_covers_grpc_jitter() {
        let d = Duration::from_millis(1000);
        assert_eq!(
            Jitter::ZERO.scale_between_tenths(d, 8, 12),
            Duration::from_millis(800)
        );
        assert_eq!(
            Jitter::MAX_BELOW_ONE.scale_between_tenths(d, 8, 12),
            Duration::from_millis(1200)
        );
        assert_eq!(
            Jitter(1 << 52).scale_between_tenths(d, 8, 12),
            Duration::from_millis(1000)
        );
    }

    #[test]
    fn same_seed_same_sequence_and_fill_bytes_agrees_with_next_u64() {
        let (mut a, mut b) = (EngineRng::seed_from_u64(7), EngineRng::seed_from_u64(7));
        let mut buf = [0u8; 12];
        a.fill_bytes(&mut buf);
        let first = b.next_u64().to_le_bytes();
        let second = b.next_u64().to_le_bytes();
        assert_eq!(&buf[..8], &first);
        assert_eq!(&buf[8..], &second[..4]);
    }
}
