//! A counting global allocator proves that the happy path (one attempt that succeeds) allocates
//! nothing: creating the machine, selecting, dispatching, the events and the finish; and that
//! server selection allocates nothing on topologies of up to `INLINE_SERVERS` servers.

#![allow(unsafe_code)] // The counting allocator below forwards to `System`; nothing else is unsafe.

mod support;
#[path = "../benches/support/topologies.rs"]
mod topologies;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use retry_core::policy::RetryOptions;
use retry_core::retry::{Action, OperationKind, OperationSpec, RetryMachine};
use retry_core::rng::EngineRng;
use retry_core::selection::{SelectionSettings, SelectionStep, ServerSelection, INLINE_SERVERS};
use retry_core::time::{Instant, OperationTimeout};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a
// const-initialised thread-local without a destructor, so touching it never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

fn one_successful_operation(
    kind: OperationKind,
    options: &RetryOptions,
    server: &retry_core::retry::AttemptServer,
) {
    let spec = OperationSpec::new(kind).with_txn_number(1);
    let mut m = RetryMachine::new(spec, options, 42, Instant::ZERO);
    assert_eq!(m.poll_action(), Some(Action::SelectServer));
    m.handle_server_selected(server.clone(), Instant::ZERO)
        .unwrap();
    assert!(matches!(m.poll_action(), Some(Action::Dispatch(_))));
    m.handle_sent(Instant::from_nanos(10)).unwrap();
    m.handle_succeeded(Instant::from_nanos(20)).unwrap();
    assert_eq!(
        m.poll_action(),
        Some(Action::ReleaseConnection { close: false })
    );
    assert_eq!(m.poll_action(), Some(Action::Finished(Ok(()))));
    while m.poll_event().is_some() {}
}

#[test]
fn happy_path_allocates_nothing() {
    let options = RetryOptions::default();
    let server = support::primary();
    // Warm up anything lazily initialised by the test harness itself.
    one_successful_operation(OperationKind::Read, &options, &server);
    for kind in [
        OperationKind::Read,
        OperationKind::RetryableWrite,
        OperationKind::RunCommand,
    ] {
        let n = allocations_during(|| one_successful_operation(kind, &options, &server));
        assert_eq!(n, 0, "{kind:?} allocated {n} times");
    }
}

#[test]
fn the_counter_sees_allocations() {
    // Guards the test above against a counter that never counts.
    let n = allocations_during(|| drop(std::hint::black_box(vec![1u8; 16])));
    assert_eq!(n, 1);
}

/// One selection loop that selects at once, as the retry machine's `SelectServer` runs it.
fn one_selection(case: &topologies::Case, rng: &mut EngineRng) {
    let mut selection = ServerSelection::new(
        case.criteria.clone(),
        &case.deprioritized,
        SelectionSettings::default(),
        OperationTimeout::Off,
        Instant::ZERO,
    );
    let step = selection.poll(
        &case.topology,
        topologies::operation_count,
        rng,
        Instant::ZERO,
    );
    assert!(matches!(step, SelectionStep::Selected(s) if !case.deprioritized.contains(&s.address)));
}

#[test]
fn selection_on_small_topologies_allocates_nothing() {
    let mut rng = EngineRng::from_seed_u64(9);
    for n in [topologies::SIZES[0], INLINE_SERVERS] {
        for case in [topologies::replica_set_with_tags(n), topologies::sharded(n)] {
            // SS-11, SS-13, SS-15 with one deprioritized address and a tagged read preference.
            let allocations = allocations_during(|| one_selection(&case, &mut rng));
            assert_eq!(
                allocations, 0,
                "{} on {n} servers allocated {allocations} times",
                case.shape
            );
        }
    }
}
