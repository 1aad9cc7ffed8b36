//! Sorting the latencies of a run: a radix sort, since they are many `u32`s.

/// Bits per digit: three passes cover a `u32`, and latencies under 2^22 µs (about 70 minutes)
/// need two.
const DIGIT_BITS: usize = 11;
const DIGITS: usize = 1 << DIGIT_BITS;

/// Sorts `values` (a least-significant-digit radix sort, 11 bits per pass; passes whose digit is
/// the same for every value are skipped). The same result as `sort_unstable`, in linear time.
pub(crate) fn sort_u32(values: &mut Vec<u32>) {
    let mut counts = vec![[0usize; DIGITS]; 3];
    let mask = (DIGITS - 1) as u32;
    for &v in values.iter() {
        for (pass, count) in counts.iter_mut().enumerate() {
            count[((v >> (pass * DIGIT_BITS)) & mask) as usize] += 1;
        }
    }
    let mut scratch = vec![0u32; values.len()];
    let mut next = vec![0usize; DIGITS];
    for (pass, count) in counts.iter().enumerate() {
        if count.contains(&values.len()) {
            continue;
        }
        let mut total = 0;
        for (slot, &c) in next.iter_mut().zip(count) {
            *slot = total;
            total += c;
        }
        for &v in values.iter() {
            let digit = ((v >> (pass * DIGIT_BITS)) & mask) as usize;
            scratch[next[digit]] = v;
            next[digit] += 1;
        }
        std::mem::swap(values, &mut scratch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::RngCore;
    use retry_core::rng::EngineRng;

    #[test]
    fn radix_sort_matches_sort_unstable() {
        let mut rng = EngineRng::from_seed_u64(3);
        for len in [0usize, 1, 2, 17, 1000, 40_000] {
            for spread in [1u64, 300, 70_000, 1 << 32] {
                let values: Vec<u32> = (0..len).map(|_| (rng.next_u64() % spread) as u32).collect();
                let mut expected = values.clone();
                expected.sort_unstable();
                let mut sorted = values;
                sort_u32(&mut sorted);
                assert_eq!(sorted, expected, "len {len}, spread {spread}");
            }
        }
    }
}
