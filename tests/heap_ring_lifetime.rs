//! Heap-ring allocations used after their scope ended.

mod common;

use common::*;
use simpler::__private::Backing; // where an allocation lives (internal), to see a block reused
use simpler::{DataType, ErrorKind, TaskArgs, Tensor};

fn addr(t: &Tensor) -> u64 {
    match t.desc().backing() {
        Backing::HeapSlab { addr, .. } => addr,
        other => panic!("not a heap slab: {other:?}"),
    }
}

/// An `orch.alloc` tensor outlives its scope as a value (`Tensor: Clone`). Once the scope ends
/// and its writers finish, the creator slot is consumed, its TensorMap entry erased and the heap
/// block reclaimed; the ring hands the same bytes to the next allocation. A later submit that
/// still names the old tensor is accepted with no dependency at all, so it reads and writes a
/// live allocation it never asked for.
#[isolated_test]
fn a_task_naming_an_allocation_whose_scope_ended_is_refused() {
    let (rig, [fill_h]) = Rig::start(subs(1).heap_ring_size(1024), [("fill", fill)]);
    let out = u64_buffer(&rig, 128);
    let out_t = u64s(&out, 0, 128);
    let _ = &out_t;
    let mut accepted = None;
    rig.run(|orch| {
        // Scope 1 (ring 1): allocate and fill.
        let old = orch.scope(|o| {
            let t = o.alloc(&[128], DataType::Uint64)?;
            let mut a = TaskArgs::new();
            a.output(&t)?.scalar(7);
            o.submit_sub(&fill_h, a)?;
            Ok(t)
        })?;
        // Scope 2 (ring 1 again): the ring holds one block, so this waits for scope 1's
        // block to be reclaimed and gets the very same bytes.
        orch.scope(|o| {
            let fresh = o.alloc(&[128], DataType::Uint64)?;
            assert_eq!(addr(&fresh), addr(&old), "the reclaimed block is handed out again");
            let mut a = TaskArgs::new();
            a.output(&fresh)?.scalar(9);
            o.submit_sub(&fill_h, a)?;
            // Writes to the dead allocation = writes into `fresh`, with no ordering at all.
            let mut b = TaskArgs::new();
            b.output(&old)?.scalar(666);
            accepted = Some(o.submit_sub(&fill_h, b).is_ok());
            Ok(())
        })
    })
    .unwrap();
    assert_eq!(accepted, Some(false), "a submit naming a reclaimed allocation must be refused");
}

/// The liveness check and the task window: a submit checks that an allocation is live, then
/// waits for room in the full window, driving the scheduler; meanwhile the allocation's last
/// task completes (its scope ended already), so its creator is consumed and its block
/// reclaimed. The submit must not go on holding nothing: the next allocation may get the same
/// bytes, and nothing would order the two tasks.
///
/// Deterministic: the allocation's task (`T1`) is released by another thread, but its
/// completion is handled only by a thread that drives the scheduler, and the only one here is
/// the orchestration thread, from inside the waiting submit.
#[isolated_test]
fn an_allocation_reclaimed_while_a_submit_waits_for_the_window_fails_that_submit() {
    let (rig, [block_h, fill_h]) = Rig::start(
        subs(2).task_window(8).heap_ring_size(8192),
        [("block_on_flag", block_on_flag), ("fill", fill)],
    );
    let (gate1, gate2) = (u32_buffer(&rig, 2), u32_buffer(&rig, 2));
    let (g1, g2) = (words_of(&gate1), words_of(&gate2));
    let mut second = None;
    std::thread::scope(|s| {
        let gate1 = &gate1;
        s.spawn(move || {
            wait_blocked(gate1);
            release(gate1);
        });
        rig.run(|orch| {
            // Window: the allocation and T1 (2), then six fillers (8 of 8).
            let x = orch.scope(|o| {
                let x = o.alloc(&[512], DataType::Uint64)?;
                let mut a = TaskArgs::new();
                a.untracked(&g1)?.inout(&x)?.scalar(10_000).scalar(1);
                o.submit_sub(&block_h, a)?;
                Ok(x)
            })?;
            orch.scope(|o| {
                for _ in 0..6 {
                    let mut a = TaskArgs::new();
                    a.untracked(&g2)?.scalar(10_000);
                    o.submit_sub(&block_h, a)?;
                }
                Ok(())
            })?;
            // Checks x live (T1 still holds it), then waits for the window, handling T1's
            // completion: x's creator is consumed, its block reclaimed.
            let mut a = TaskArgs::new();
            a.inout(&x)?.scalar(2);
            second = Some(orch.submit_sub(&fill_h, a));
            release(&gate2);
            Ok(())
        })
        .unwrap();
    });
    let err =
        second.expect("the second submit ran").expect_err("a submit naming a reclaimed allocation must fail");
    assert_err(&err, ErrorKind::InvalidArgument, &["fill", "tensor 0", "not live"]);
}
