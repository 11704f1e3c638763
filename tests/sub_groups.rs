//! SUB groups (`submit_sub_group`): all members at once on distinct workers, one task for
//! dependencies.

mod common;

use common::*;
use simpler::{DataType, ErrorKind, RunOptions, Tag, TaskArgs, memory::TensorView};

const HOLD_US: u64 = 15_000;

/// Member `i` of a group of `n`: rendezvous on `scratch`, then its worker index into `who[i]`
/// (tagged `tag`); member 0 holds `hold0_us` first.
fn member_args(
    scratch: &simpler::Buffer,
    who: &simpler::Buffer,
    i: usize,
    n: usize,
    tag: Tag,
    hold0_us: u64,
) -> TaskArgs {
    let slot = who.view(TensorView::new(4 * i as u64, &[1], None, DataType::Uint32).unwrap()).unwrap();
    let mut a = TaskArgs::new();
    a.untracked(&words_of(scratch)).unwrap().add_tensor(&slot, tag).unwrap();
    a.scalar(n as u64).scalar(5_000).scalar(if i == 0 { hold0_us } else { 0 });
    a
}

#[isolated_test]
fn members_run_at_once_on_distinct_workers_and_consumers_wait_for_all() {
    let (rig, [member, snapshot]) = Rig::start(subs(3), [("member", member), ("snapshot", snapshot)]);
    let scratch = u32_buffer(&rig, 1);
    let who = u32_buffer(&rig, 3);
    who.write(0, &[u32::MAX; 3]).unwrap();
    let seen = u32_buffer(&rig, 3);
    let run = rig
        .submit_with(RunOptions::new().capture_dag(), |orch, _, _| {
            // Member 0 finishes last: it holds after the rendezvous.
            let members = (0..3).map(|i| member_args(&scratch, &who, i, 3, Tag::Output, HOLD_US)).collect();
            orch.submit_sub_group(&member, members)?;
            let mut c = TaskArgs::new(); // reads every member's output
            c.input(&words_of(&who))?.output(&words_of(&seen))?;
            orch.submit_sub(&snapshot, c)?;
            Ok(())
        })
        .unwrap();
    run.wait().expect("all three members meet, so they ran at the same time");
    let mut w = read_u32(&who, 0, 3);
    w.sort_unstable();
    assert_eq!(w, vec![0, 1, 2], "each member ran on a distinct SUB worker");
    assert_eq!(read_u32(&seen, 0, 3), read_u32(&who, 0, 3), "the consumer saw every member's write");
    let dag = run.dag().unwrap();
    assert_eq!(dag.graph().node_count(), 2);
    assert!(dag.has_edge(0, 1), "{}", dag.to_dot());
    let g = dag.node(0).unwrap();
    assert_eq!(dag.graph()[g].members, 3);
    assert_eq!(dag.graph()[g].callable, "member");
    assert_eq!(run.stats().unwrap().tasks, 2, "a group is one task");
}

#[isolated_test]
fn groups_and_singles_interleave() {
    let (rig, [member, fill]) = Rig::start(subs(2), [("member", member), ("fill", fill)]);
    const ROUNDS: usize = 8;
    let scratch: Vec<_> = (0..ROUNDS).map(|_| u32_buffer(&rig, 1)).collect();
    let who = u32_buffer(&rig, 2 * ROUNDS);
    let out = u64_buffer(&rig, ROUNDS);
    rig.run(|orch| {
        for (r, scratch) in scratch.iter().enumerate() {
            let members = (0..2)
                .map(|i| {
                    let slot =
                        who.view(TensorView::new(4 * (2 * r + i) as u64, &[1], None, DataType::Uint32)?)?;
                    let mut a = TaskArgs::new();
                    a.untracked(&words_of(scratch))?.output(&slot)?;
                    a.scalar(2).scalar(5_000).scalar(0);
                    Ok(a)
                })
                .collect::<simpler::Result<Vec<_>>>()?;
            orch.submit_sub_group(&member, members)?;
            let mut s = TaskArgs::new();
            s.output(&u64s(&out, r, 1))?.scalar(r as u64 + 1);
            orch.submit_sub(&fill, s)?;
        }
        Ok(())
    })
    .unwrap();
    let who = read_u32(&who, 0, 2 * ROUNDS);
    for r in 0..ROUNDS {
        let mut pair = [who[2 * r], who[2 * r + 1]];
        pair.sort_unstable();
        assert_eq!(pair, [0, 1], "round {r}: members on distinct workers ({who:?})");
    }
    assert_eq!(read_u64(&out, 0, ROUNDS), (1..=ROUNDS as u64).collect::<Vec<_>>());
}

#[isolated_test]
fn failing_member_fails_the_group_and_poisons_its_consumers() {
    let (rig, [fail, fill]) =
        Rig::start(subs(2), [("fail_once_released", fail_once_released), ("fill", fill)]);
    let flag = u32_buffer(&rig, 2);
    let data = u64_buffer(&rig, 2);
    let after = u64_buffer(&rig, 1);
    let run = rig
        .submit(|orch| {
            // The members fail only once released, after every task is submitted: a failure
            // before that would refuse the later submits (the run has failed).
            let members = (0..2)
                .map(|i| {
                    let mut a = TaskArgs::new();
                    a.untracked(&words_of(&flag))?.output(&u64s(&data, i, 1))?.scalar(40 + i as u64);
                    Ok(a)
                })
                .collect::<simpler::Result<Vec<_>>>()?;
            orch.submit_sub_group(&fail, members)?;
            let mut c = TaskArgs::new();
            c.inout(&u64s(&data, 0, 2))?.scalar(1);
            orch.submit_sub(&fill, c)?;
            let mut d = TaskArgs::new(); // independent
            d.output(&u64s(&after, 0, 1))?.scalar(5);
            orch.submit_sub(&fill, d)?;
            Ok(())
        })
        .unwrap();
    release(&flag);
    let err = run.wait().expect_err("the group failed");
    assert_err(&err, ErrorKind::TaskFailed, &["fail", "sub worker", "boom 4"]);
    assert_eq!(read_u64(&data, 0, 2), vec![0, 0], "the consumer of the failed group never ran");
    assert_eq!(read_u64(&after, 0, 1), vec![5], "independent work still ran");
    let stats = run.stats().unwrap();
    assert_eq!((stats.tasks, stats.failed), (3, 2));
}

#[isolated_test]
fn group_larger_than_the_pool_is_rejected() {
    let (rig, [member]) = Rig::start(subs(2), [("member", member)]);
    let scratch = u32_buffer(&rig, 1);
    let who = u32_buffer(&rig, 3);
    rig.run(|orch| {
        let members = (0..3).map(|i| member_args(&scratch, &who, i, 3, Tag::Output, 0)).collect();
        expect_err(
            orch.submit_sub_group(&member, members),
            ErrorKind::InvalidArgument,
            &["member", "needs 3 SUB workers", "has 2"],
        );
        expect_err(
            orch.submit_sub_group(&member, Vec::new()),
            ErrorKind::InvalidArgument,
            &["member", "empty"],
        );
        assert_eq!(orch.task_count(), 0);
        Ok(())
    })
    .unwrap();
}

#[isolated_test]
fn members_that_write_bytes_another_member_names_are_refused() {
    let (rig, [member]) = Rig::start(subs(2), [("member", member)]);
    let scratch = u32_buffer(&rig, 1);
    let who = u32_buffer(&rig, 2);
    rig.run(|orch| {
        // Both members write slot 0 of `who`: they would run at once over the same bytes.
        let same = (0..2).map(|_| member_args(&scratch, &who, 0, 2, Tag::Output, 0)).collect();
        expect_err(
            orch.submit_sub_group(&member, same),
            ErrorKind::InvalidArgument,
            &["member", "group members 0 and 1 overlap", "writes"],
        );
        // One reads what the other writes: refused too.
        let mixed = vec![
            member_args(&scratch, &who, 0, 2, Tag::Output, 0),
            member_args(&scratch, &who, 0, 2, Tag::Input, 0),
        ];
        expect_err(orch.submit_sub_group(&member, mixed), ErrorKind::InvalidArgument, &["overlap"]);
        assert_eq!(orch.task_count(), 0);
        // Disjoint slots (and the untracked scratch word they share through atomics) are fine.
        let disjoint = (0..2).map(|i| member_args(&scratch, &who, i, 2, Tag::Output, 0)).collect();
        orch.submit_sub_group(&member, disjoint)?;
        Ok(())
    })
    .unwrap();
}
