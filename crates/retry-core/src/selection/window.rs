//! The latency window (SS-13) and the power-of-two choice by operation count (SS-15).

use core::time::Duration;

use rand_core::RngCore;

use super::ServerList;
use crate::address::ServerAddress;
use crate::topology::ServerDescription;

/// SS-13: keeps the suitable servers whose average RTT is within `local_threshold` of the fastest
/// one, both ends inclusive. A server without an RTT (a load balancer is never monitored) counts as
/// 0 ms.
pub fn retain_latency_window(servers: &mut ServerList<'_>, local_threshold: Duration) {
    let rtt = |s: &ServerDescription| s.average_rtt.get().unwrap_or(Duration::ZERO);
    let all: &[&ServerDescription] = servers;
    let Some(fastest) = all.iter().map(|s| rtt(s)).min() else {
        return;
    };
    let slowest_allowed = fastest.saturating_add(local_threshold);
    // Most windows keep every server: then there is nothing to move.
    if all.iter().any(|s| rtt(s) > slowest_allowed) {
        servers.retain(|s| rtt(s) <= slowest_allowed);
    }
}

/// SS-15: picks one server of the latency window.
///
/// One server is taken as is. Otherwise two *distinct* servers are drawn uniformly from `rng` and
/// the one with the lower `operation_count` wins; on a tie the first drawn wins (the draw order is
/// itself random). Returns `None` for an empty window. Draws from `rng` only when there is a
/// choice to make.
pub fn choose_by_operation_count<'a>(
    window: &[&'a ServerDescription],
    operation_count: impl Fn(&ServerAddress) -> u32,
    rng: &mut (impl RngCore + ?Sized),
) -> Option<&'a ServerDescription> {
    choose_index(window.len(), |i| operation_count(&window[i].address), rng).map(|i| window[i])
}

/// SS-15 on a window of `n` servers known by position: the position chosen, from the operation
/// count of the server at each position (see [`choose_by_operation_count`]).
#[inline]
pub(super) fn choose_index(
    n: usize,
    operation_count: impl Fn(usize) -> u32,
    rng: &mut (impl RngCore + ?Sized),
) -> Option<usize> {
    match n {
        0 => None,
        1 => Some(0),
        n => {
            let first = index_below(rng, n);
            let mut second = index_below(rng, n - 1);
            if second >= first {
                second += 1;
            }
            Some(if operation_count(second) < operation_count(first) {
                second
            } else {
                first
            })
        }
    }
}

/// A uniform index in `0..n` from one 64-bit draw (multiply-shift; the bias is below `n / 2^64`).
#[inline]
fn index_below(rng: &mut (impl RngCore + ?Sized), n: usize) -> usize {
    let wide = u128::from(rng.next_u64()) * n as u128;
    // The high half of the product is below `n`, so it fits in usize.
    usize::try_from(wide >> 64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{EngineRng, FixedRng};
    use crate::topology::{AverageRtt, ServerType};
    use alloc::vec::Vec;

    fn server(host: &str, rtt_ms: u64) -> ServerDescription {
        ServerDescription {
            server_type: ServerType::Mongos,
            average_rtt: AverageRtt::from_duration(Duration::from_millis(rtt_ms)),
            ..ServerDescription::unknown(ServerAddress::new(host, 27017))
        }
    }

    #[test]
    fn ss13_the_window_is_inclusive_at_both_ends() {
        let servers = [server("a", 10), server("b", 25), server("c", 26)];
        let mut list: ServerList<'_> = servers.iter().collect();
        retain_latency_window(&mut list, Duration::from_millis(15));
        let hosts: Vec<_> = list.iter().map(|s| s.address.host()).collect();
        assert_eq!(hosts, ["a", "b"]);
        let mut zero: ServerList<'_> = servers.iter().collect();
        retain_latency_window(&mut zero, Duration::ZERO);
        assert_eq!(zero.len(), 1);
        let mut empty = ServerList::new();
        retain_latency_window(&mut empty, Duration::from_millis(15));
        assert!(empty.is_empty());
    }

    #[test]
    fn ss15_one_server_is_taken_without_drawing() {
        let servers = [server("a", 5)];
        let window: ServerList<'_> = servers.iter().collect();
        let mut rng = EngineRng::from_seed_u64(7);
        let before = rng.clone();
        let chosen = choose_by_operation_count(&window, |_| 0, &mut rng);
        assert_eq!(chosen.map(|s| s.address.host()), Some("a"));
        assert_eq!(rng, before);
        assert!(choose_by_operation_count(&[], |_| 0, &mut rng).is_none());
    }

    #[test]
    fn ss15_two_distinct_servers_are_compared_and_the_less_busy_wins() {
        let servers = [server("a", 5), server("b", 5)];
        let window: ServerList<'_> = servers.iter().collect();
        let busy_a = |a: &ServerAddress| if a.host() == "a" { 9 } else { 1 };
        // Both draws at the bottom: first = 0 (a), second = 0 → bumped to 1 (b): distinct.
        let chosen = choose_by_operation_count(&window, busy_a, &mut FixedRng(0));
        assert_eq!(chosen.map(|s| s.address.host()), Some("b"));
        // Both draws at the top: first = 1 (b), second = 0 (a).
        let chosen = choose_by_operation_count(&window, |_| 3, &mut FixedRng(u64::MAX));
        assert_eq!(
            chosen.map(|s| s.address.host()),
            Some("b"),
            "a tie keeps the first drawn"
        );
        let mut rng = EngineRng::from_seed_u64(1);
        for _ in 0..100 {
            let chosen = choose_by_operation_count(&window, busy_a, &mut rng);
            assert_eq!(chosen.map(|s| s.address.host()), Some("b"));
        }
    }

    #[test]
    fn ss15_the_busiest_of_many_is_never_chosen() {
        let servers: Vec<_> = ["a", "b", "c", "d"].iter().map(|h| server(h, 5)).collect();
        let window: ServerList<'_> = servers.iter().collect();
        let count = |a: &ServerAddress| u32::from(a.host().as_bytes()[0] - b'a');
        let mut rng = EngineRng::from_seed_u64(42);
        let mut seen = [0u32; 4];
        for _ in 0..1000 {
            let chosen = choose_by_operation_count(&window, count, &mut rng).unwrap();
            seen[count(&chosen.address) as usize] += 1;
        }
        assert_eq!(seen[3], 0);
        assert!(
            seen[0] > seen[1] && seen[1] > seen[2] && seen[2] > 0,
            "{seen:?}"
        );
    }
}
