//! The heap rings and the task window: `orch.alloc` by scope depth, reclamation, and
//! back-pressure that times out with a clear error.

use super::*;

fn slab(t: &Tensor) -> u64 {
    match t.desc().backing() {
        Backing::HeapSlab { addr, .. } => addr,
        other => panic!("orch.alloc gave {other:?}"),
    }
}

#[test]
fn alloc_uses_the_ring_of_its_scope_depth_and_is_reclaimed() {
    let rig = Rig::manual(cfg(1, 0));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    for depth in 0..6usize {
        let t = orch.alloc(&[256], DataType::Float32).unwrap();
        let ring = depth.min(HEAP_RINGS - 1);
        assert!(
            rig.rings.ring(ring).contains(slab(&t), t.desc().nbytes()),
            "depth {depth} allocates from ring {ring}"
        );
        assert!(rig.rings.ring(ring).used() >= 1024);
        orch.scope_begin().unwrap();
    }
    for _ in 0..6 {
        orch.scope_end().unwrap();
    }
    for r in 1..HEAP_RINGS {
        assert_eq!(
            rig.rings.ring(r).used(),
            0,
            "ring {r}: unreferenced allocations are reclaimed at scope end"
        );
    }
    assert!(rig.rings.ring(0).used() > 0, "the outer scope still holds its allocation");

    // An allocation named by a running task outlives its scope until that task is done.
    orch.scope_begin().unwrap();
    let t = orch.alloc(&[16], DataType::Float32).unwrap();
    orch.submit_next_level(&rig.chip, args(1, &[(&t, Tag::Input)]), cc(), 0).unwrap();
    orch.scope_end().unwrap();
    assert!(rig.rings.ring(1).used() > 0, "retained by its running consumer");
    rig.nl[0].finish(Outcome::Success);
    rig.drive("the allocation to be reclaimed before the run ends", || rig.rings.ring(1).used() == 0);
    assert!(!run.is_done());
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

#[test]
fn alloc_waits_for_reclamation_and_times_out_with_a_clear_error() {
    let mut c = cfg(1, 0);
    c.heap_ring_size = 4096;
    c.backpressure_timeout = Duration::from_millis(100);
    let rig = Rig::manual(c);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    // Ring 1 is full and its allocation is held by a task that has ended but not been drained:
    // only back-pressure (driving the scheduler) can make room.
    orch.scope_begin().unwrap();
    let t = orch.alloc(&[1024], DataType::Float32).unwrap();
    orch.submit_next_level(&rig.chip, args(1, &[(&t, Tag::InOut)]), cc(), 0).unwrap();
    orch.scope_end().unwrap();
    rig.nl[0].finish(Outcome::Success);
    orch.scope_begin().unwrap();
    let t2 = orch.alloc(&[1024], DataType::Float32).unwrap();
    assert_eq!(slab(&t2), slab(&t), "the same bytes, reclaimed");
    orch.scope_end().unwrap();
    // Ring 0: held by the outer scope until the run ends: times out.
    let _keep = orch.alloc(&[1024], DataType::Float32).unwrap();
    let e = err_of(orch.alloc(&[1], DataType::Float32));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("heap_ring_size"), "{e}");
    let e = err_of(orch.alloc(&[2048], DataType::Float32));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "larger than a ring fails at once: {e}");
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

#[test]
fn small_task_window_completes_many_scoped_tasks() {
    let script = Script::new();
    let mut c = cfg(2, 0);
    c.task_window = 2;
    let rig = Rig::threaded(c, &script);
    let x = buffer(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    for i in 0..10u64 {
        orch.scope(|o| {
            o.submit_next_level(&rig.chip, args(i + 1, &[(&whole(x), Tag::InOut)]), cc(), (i % 2) as u32)?;
            Ok(())
        })
        .unwrap();
        assert!(rig.eng.window.live() <= 2);
    }
    orch.finish(None);
    rig.wait(&run).unwrap();
    assert_eq!(run.stats().unwrap().tasks, 10);
    // InOut chains them: each ran after the previous one ended.
    let ev = script.events();
    for w in ev.windows(2) {
        if let [Ev::Start(_, a, _), second] = w {
            assert_eq!(*second, Ev::End(LaneKind::NextLevel(((*a - 1) % 2) as u32), *a, 0), "{ev:?}");
        }
    }
    rig.assert_clean();
}

#[test]
fn full_task_window_in_the_outer_scope_times_out_with_a_clear_error() {
    // Outer-scope tasks hold their window place until the run ends, so a flat run cannot have
    // more tasks than the window (current design; upstream has no slot window).
    let script = Script::new();
    let mut c = cfg(1, 0);
    c.task_window = 2;
    c.backpressure_timeout = Duration::from_millis(100);
    let rig = Rig::threaded(c, &script);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.submit_next_level(&rig.chip, args(2, &[]), cc(), 0).unwrap();
    let e = err_of(orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 0));
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert!(e.message().contains("task_window"), "{e}");
    orch.finish(None);
    rig.wait(&run).unwrap();
    assert_eq!(run.stats().unwrap().tasks, 2);
    rig.assert_clean();
}
