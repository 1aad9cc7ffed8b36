//! The driver's maps from the engine's ids (`OpId`, `ConnId`) to its own state: hash maps with
//! a multiplicative hash. The ids are integers the engine counts up, never chosen by a peer, so
//! a keyed hash buys nothing; with 64 operations in flight a lookup costs a multiply and a probe
//! instead of a walk down two B-tree levels (issue 9).

use core::hash::{BuildHasherDefault, Hasher};
use std::collections::HashMap;

/// A map keyed by one of the engine's ids.
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of a `u64` id: consecutive ids spread over the table's high bits, which
/// the table's control bytes use.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = (self.0 ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    /// Other keys than ids: their bytes, eight at a time.
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_core::engine::OpId;

    /// Consecutive ids get distinct hashes and distinct top bits (the table's control bytes).
    #[test]
    fn consecutive_ids_spread_over_the_high_bits() {
        let hash = |id: u64| {
            let mut hasher = IdHasher::default();
            core::hash::Hash::hash(&OpId(id), &mut hasher);
            hasher.finish()
        };
        let tops: std::collections::BTreeSet<u64> = (0..128).map(|id| hash(id) >> 57).collect();
        assert!(tops.len() > 64, "{} distinct top-7-bit values", tops.len());
        let mut map: IdMap<OpId, u64> = IdMap::default();
        for id in 0..1_000 {
            map.insert(OpId(id), id);
        }
        assert!((0..1_000).all(|id| map.get(&OpId(id)) == Some(&id)));
        assert_eq!(map.remove(&OpId(500)), Some(500));
        assert_eq!(map.get(&OpId(500)), None);
    }
}
