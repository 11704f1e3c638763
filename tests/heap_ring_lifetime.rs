//! Heap-ring allocations used after their scope ended.

mod common;

use common::*;
use simpler::__private::Backing; // where an allocation lives (internal), to see a block reused
use simpler::{DataType, TaskArgs, Tensor};

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
#[test]
fn a_task_naming_an_allocation_whose_scope_ended_is_refused() {
    if !in_own_process() {
        return;
    }
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
