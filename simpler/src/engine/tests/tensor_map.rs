//! Dependency inference: the TensorMap's edges (read after write, write after write, write
//! after read), explicit deps, and the cost of many readers of one tensor.

use super::*;

#[test]
fn tensor_map_infers_exactly_the_documented_edges() {
    let script = Script::new();
    let rig = Rig::threaded(cfg(2, 0), &script);
    let [a, b, c, d, e, f, g, h] = [1, 2, 3, 4, 5, 6, 7, 8].map(buffer);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let mut n = 0u64;
    let mut sub = |orch: &mut Orchestrator<'_>, tensors: &[(&Tensor, Tag)]| -> TaskHandle {
        n += 1;
        orch.submit_next_level(&rig.chip, args(n, tensors), cc(), (n % 2) as u32).unwrap()
    };
    // RaW.
    let t0 = sub(&mut orch, &[(&whole(a), Tag::Output)]);
    let t1 = sub(&mut orch, &[(&whole(a), Tag::Input)]);
    // WaW by Output: waits for the writer; the covering write replaces the old writer.
    let t2 = sub(&mut orch, &[(&whole(b), Tag::Output)]);
    let t3 = sub(&mut orch, &[(&whole(b), Tag::Output)]);
    let t4 = sub(&mut orch, &[(&whole(b), Tag::Input)]);
    // InOut waits for the writer and becomes it.
    let t5 = sub(&mut orch, &[(&whole(c), Tag::Output)]);
    let t6 = sub(&mut orch, &[(&whole(c), Tag::InOut)]);
    let t7 = sub(&mut orch, &[(&whole(c), Tag::Input)]);
    // NoDep neither waits nor becomes the writer.
    let t8 = sub(&mut orch, &[(&whole(d), Tag::Output)]);
    let _t9 = sub(&mut orch, &[(&whole(d), Tag::NoDep)]);
    let t10 = sub(&mut orch, &[(&whole(d), Tag::Input)]);
    // OutputExisting: like Output.
    let t11 = sub(&mut orch, &[(&whole(e), Tag::Output)]);
    let t12 = sub(&mut orch, &[(&whole(e), Tag::OutputExisting)]);
    let t13 = sub(&mut orch, &[(&whole(e), Tag::Input)]);
    // Disjoint views: no edge; overlapping views: edge.
    let t14 = sub(&mut orch, &[(&view(f, 0, 8), Tag::Output)]);
    let _t15 = sub(&mut orch, &[(&view(f, 8, 8), Tag::Input)]);
    let t16 = sub(&mut orch, &[(&view(f, 4, 8), Tag::Input)]);
    // A partially covered writer stays a writer of the bytes it still owns.
    let t17 = sub(&mut orch, &[(&whole(g), Tag::Output)]);
    let t18 = sub(&mut orch, &[(&view(g, 0, 8), Tag::Output)]);
    let t19 = sub(&mut orch, &[(&whole(g), Tag::Input)]);
    let t20 = sub(&mut orch, &[(&view(g, 8, 8), Tag::Input)]);
    // Readers never order each other; a writer waits for the writer (WaW) and the readers (WaR).
    let t21 = sub(&mut orch, &[(&whole(a), Tag::Input)]);
    let t22 = sub(&mut orch, &[(&whole(a), Tag::Output)]);
    // Explicit dependencies.
    let t23 = sub(&mut orch, &[(&whole(h), Tag::NoDep)]);
    let mut x = args(100, &[]);
    x.add_dep(t23);
    let t24 = orch.submit_next_level(&rig.chip, x, cc(), 0).unwrap();
    let mut x = args(101, &[]);
    x.add_dep_wait(t23);
    let t25 = orch.submit_next_level(&rig.chip, x, cc(), 1).unwrap();
    orch.finish(None);
    rig.wait(&run).unwrap();

    let tensor = |arg: u32, buf: BufferDesc| EdgeReason::Tensor { arg, buffer: buf.identity() };
    let waw = |arg: u32, buf: BufferDesc| EdgeReason::WriteAfterWrite { arg, buffer: buf.identity() };
    let war = |arg: u32, buf: BufferDesc| EdgeReason::WriteAfterRead { arg, buffer: buf.identity() };
    let want: BTreeSet<(u32, u32, String)> = [
        (t0, t1, tensor(0, a)),
        (t2, t3, waw(0, b)),
        (t3, t4, tensor(0, b)),
        (t5, t6, tensor(0, c)),
        (t6, t7, tensor(0, c)),
        (t8, t10, tensor(0, d)),
        (t11, t12, waw(0, e)),
        (t12, t13, tensor(0, e)),
        (t14, t16, tensor(0, f)),
        (t17, t18, waw(0, g)),
        (t17, t19, tensor(0, g)),
        (t18, t19, tensor(0, g)),
        (t17, t20, tensor(0, g)),
        (t0, t21, tensor(0, a)),
        (t0, t22, waw(0, a)),
        (t1, t22, war(0, a)),
        (t21, t22, war(0, a)),
        (t23, t24, EdgeReason::Explicit { retain: true }),
        (t23, t25, EdgeReason::Explicit { retain: false }),
    ]
    .into_iter()
    .map(|(p, q, r)| (p.index(), q.index(), format!("{r:?}")))
    .collect();
    let dag = rig.dag(&run);
    let gr = dag.graph();
    let got: BTreeSet<(u32, u32, String)> = gr
        .edge_indices()
        .map(|ix| {
            let (p, q) = gr.edge_endpoints(ix).unwrap();
            (gr[p].index, gr[q].index, format!("{:?}", gr[ix]))
        })
        .collect();
    assert_eq!(got, want);
    rig.assert_clean();
}

#[test]
fn consumers_wait_for_their_producers_and_writers_for_writers_and_readers() {
    let rig = Rig::manual(cfg(3, 0));
    let (x, y, z) = (buffer(1), buffer(2), buffer(3));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    let submit = |orch: &mut Orchestrator<'_>, id: u64, t: Tensor, tag: Tag, lane: u32| {
        orch.submit_next_level(&rig.chip, args(id, &[(&t, tag)]), cc(), lane).unwrap();
    };
    // WaW: an Output after an Output starts only after the first completes.
    submit(&mut orch, 1, whole(x), Tag::Output, 0);
    submit(&mut orch, 2, whole(x), Tag::Output, 1);
    assert!(rig.nl[0].running().is_some_and(|s| s.id() == 1));
    assert!(
        !rig.drive_briefly(|| rig.was_dispatched(2)),
        "WaW: the second writer started before the first ended"
    );
    rig.nl[0].finish(Outcome::Success); // task 1
    rig.drive("task 2 to start", || rig.nl[1].running().is_some());
    // WaR: a writer after a reader starts only after the reader completes.
    submit(&mut orch, 3, whole(y), Tag::Input, 2);
    submit(&mut orch, 4, whole(y), Tag::Output, 0);
    assert!(rig.nl[2].running().is_some_and(|s| s.id() == 3));
    assert!(!rig.drive_briefly(|| rig.was_dispatched(4)), "WaR: the writer started before the reader ended");
    rig.nl[2].finish(Outcome::Success); // task 3
    rig.drive("task 4 to start", || rig.nl[0].running().is_some());
    rig.nl[1].finish(Outcome::Success); // task 2
    rig.drive("task 2 drained", || rig.in_flight() == 1);
    // Disjoint views of one buffer: two writers run at once.
    submit(&mut orch, 5, view(z, 0, 8), Tag::Output, 1);
    submit(&mut orch, 6, view(z, 8, 8), Tag::Output, 2);
    rig.drive("tasks 5 and 6 at once", || rig.nl[1].running().is_some() && rig.nl[2].running().is_some());
    rig.nl[0].finish(Outcome::Success); // task 4
    rig.drive("task 4 drained", || rig.in_flight() == 2);
    // NoDep is untracked: it runs beside the running writers of the same bytes.
    submit(&mut orch, 7, whole(z), Tag::NoDep, 0);
    rig.drive("task 7 beside 5 and 6", || rig.nl[0].running().is_some());
    for lane in 0..3 {
        rig.nl[lane].finish(Outcome::Success);
    }
    orch.finish(None);
    rig.wait(&run).unwrap();
    assert_eq!(ids(&rig.dispatched()), vec![1, 2, 3, 4, 5, 6, 7]);
    rig.assert_clean();
}

#[test]
fn add_dep_retains_the_producer_and_add_dep_wait_only_orders() {
    let rig = Rig::manual(cfg(2, 0));
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    // Order only: the producer is reclaimed as soon as it completes and its scope ended.
    orch.scope_begin().unwrap();
    let p1 = orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.scope_end().unwrap();
    let mut a = args(2, &[]);
    a.add_dep_wait(p1);
    orch.submit_next_level(&rig.chip, a, cc(), 1).unwrap();
    assert!(rig.nl[1].running().is_none(), "add_dep_wait does not order");
    assert_eq!(rig.eng.window.live(), 2);
    rig.nl[0].finish(Outcome::Success);
    rig.drive("the waiting task to start", || rig.nl[1].running().is_some());
    assert_eq!(rig.eng.window.live(), 1, "an order-only producer is not retained by its consumer");
    rig.nl[1].finish(Outcome::Success);
    rig.drive("drained", || rig.in_flight() == 0);

    // Retain: the producer stays live until its consumer completes.
    orch.scope_begin().unwrap();
    let p2 = orch.submit_next_level(&rig.chip, args(3, &[]), cc(), 0).unwrap();
    orch.scope_end().unwrap();
    let mut a = args(4, &[]);
    a.add_dep(p2);
    orch.submit_next_level(&rig.chip, a, cc(), 1).unwrap();
    assert!(rig.nl[1].running().is_none(), "add_dep does not order");
    rig.nl[0].finish(Outcome::Success);
    rig.drive("the retaining task to start", || rig.nl[1].running().is_some());
    assert_eq!(rig.eng.window.live(), 3, "the retained producer is still live");
    rig.nl[1].finish(Outcome::Success);
    rig.drive("drained", || rig.in_flight() == 0);
    assert_eq!(rig.eng.window.live(), 2, "released when its consumer completed");
    orch.finish(None);
    rig.wait(&run).unwrap();
    rig.assert_clean();
}

#[test]
fn explicit_dependencies_must_name_submitted_tasks_of_the_same_run() {
    let rig = Rig::manual(cfg(1, 0));
    let run1 = rig.begin();
    let mut orch = rig.orch(&run1);
    let t = orch.submit_next_level(&rig.chip, args(1, &[]), cc(), 0).unwrap();
    orch.finish(None);
    rig.nl[0].finish(Outcome::Success);
    rig.wait(&run1).unwrap();

    let run2 = rig.begin();
    let mut orch = rig.orch(&run2);
    let mut a = args(2, &[]);
    a.add_dep(t);
    let e = err_of(orch.submit_next_level(&rig.chip, a, cc(), 0));
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("same run"), "{e}");
    let mut a = args(3, &[]);
    a.add_dep_wait(TaskHandle { run: run2.id, index: 5 });
    let e = err_of(orch.submit_next_level(&rig.chip, a, cc(), 0));
    assert!(e.message().contains("has not been submitted"), "{e}");
    assert_eq!(orch.task_count(), 0);
    orch.finish(None);
    assert!(run2.is_done(), "an empty run is done when its building ends");
    rig.wait(&run2).unwrap();
    assert_eq!(rig.dispatched().len(), 1);
    rig.assert_clean();
}

// ---------------------------------------------------------------------------------- scaling

/// Submitting and consuming `n` readers of one tensor, all waiting for one writer, looks at a
/// number of TensorMap footprints linear in `n`, at most a short list each (it was quadratic: each reader scanned every
/// live reader before it, and each consumed reader searched them all again), and every reader
/// still waits for the writer.
#[test]
fn readers_of_one_tensor_cost_linear_work() {
    const N: u64 = 20_000;
    let script = Script::new();
    let mut c = cfg(0, 2);
    c.task_window = N as usize + 16;
    let rig = Rig::threaded(c, &script);
    let b = buffer(1);
    script.hold(1);
    let run = rig.begin();
    let mut orch = rig.orch(&run);
    orch.submit_sub(&rig.host, args(1, &[(&whole(b), Tag::Output)])).unwrap();
    for id in 2..N + 2 {
        orch.submit_sub(&rig.host, args(id, &[(&whole(b), Tag::Input)])).unwrap();
    }
    let submitted = rig.eng.tensor_map.scanned.load(Ordering::Relaxed);
    assert!(submitted <= 24 * N as usize, "{N} readers looked at {submitted} footprints to submit");
    orch.finish(None);
    assert!(!rig.drive_briefly(|| script.started(2)), "a reader started before its writer ended");
    script.release(1);
    rig.wait(&run).unwrap();
    let total = rig.eng.tensor_map.scanned.load(Ordering::Relaxed);
    assert!(total <= 32 * N as usize, "{N} readers looked at {total} footprints in all");
    let first_reader = script.pos(|e| matches!(e, Ev::Start(_, id, _) if *id >= 2));
    assert!(script.pos(|e| matches!(e, Ev::End(_, 1, _))) < first_reader, "readers after the writer");
    rig.assert_clean();
}
