//! Scope rules (the 64-frame limit, `orch.scope` on error) and the task window.

mod common;

use std::time::Duration;

use common::*;
use simpler::{DataType, ErrorKind, MAX_SCOPE_DEPTH, TaskArgs};

/// Opens scopes inside scopes until one is refused, then uses the deepest one: an allocation
/// and two tasks. Returns the depth at which the next scope was refused.
fn nest_to_the_limit(
    o: &mut simpler::Orchestrator<'_>,
    fill: &simpler::CallableHandle,
    out: &simpler::Tensor,
) -> simpler::Result<usize> {
    let depth = o.scope_depth();
    if depth == MAX_SCOPE_DEPTH - 1 {
        // 63 nested frames plus the run's outer scope: the limit.
        expect_err(o.scope(|_| Ok(())), ErrorKind::InvalidState, &["Orchestrator::scope", "64"]);
        assert_eq!(o.scope_depth(), depth, "a refused scope changes nothing");
        // The deepest scope still works, allocations included.
        let t = o.alloc(&[16], DataType::Uint64)?;
        let mut a = TaskArgs::new();
        a.output(&t)?.scalar(1);
        o.submit_sub(fill, a)?;
        let mut a = TaskArgs::new();
        a.output(out)?.scalar(7);
        o.submit_sub(fill, a)?;
        return Ok(depth);
    }
    o.scope(|o| {
        assert_eq!(o.scope_depth(), depth + 1);
        nest_to_the_limit(o, fill, out)
    })
}

#[isolated_test]
fn scopes_nest_at_most_64_frames() {
    assert_eq!(MAX_SCOPE_DEPTH, 64);
    let (rig, [fill]) = Rig::start(subs(1), [("fill", fill)]);
    let out = u64_buffer(&rig, 2);
    rig.run(|orch| {
        assert_eq!(nest_to_the_limit(orch, &fill, &u64s(&out, 0, 1))?, MAX_SCOPE_DEPTH - 1);
        assert_eq!(orch.scope_depth(), 0);
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![7]);
}

#[isolated_test]
fn a_scope_ends_when_its_closure_returns_also_on_error() {
    let (rig, [fill]) = Rig::start(subs(1), [("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    rig.run(|orch| {
        assert_eq!(orch.scope_depth(), 0);
        orch.scope(|o| {
            assert_eq!(o.scope_depth(), 1);
            o.scope(|o| {
                assert_eq!(o.scope_depth(), 2);
                Ok(())
            })?;
            assert_eq!(o.scope_depth(), 1);
            Ok(())
        })?;
        assert_eq!(orch.scope_depth(), 0);
        let r: simpler::Result<()> = orch.scope(|o| {
            o.scope(|o| {
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, 0, 1))?.scalar(8);
                o.submit_sub(&fill, a)?;
                Err(simpler::Error::new(ErrorKind::InvalidArgument, "user error inside a scope"))
            })
        });
        expect_err(r, ErrorKind::InvalidArgument, &["user error inside a scope"]);
        assert_eq!(orch.scope_depth(), 0, "both scopes ended with the error");
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 1), vec![8], "the task submitted inside the scope ran");
}

#[isolated_test]
fn small_task_window_with_many_scoped_tasks() {
    const N: usize = 200;
    let (rig, [affine]) = Rig::start(subs(2).task_window(4), [("affine", affine)]);
    let chain = u64_buffer(&rig, N + 1);
    chain.write(0, &[1u64]).unwrap();
    let run = rig
        .submit(|orch| {
            for i in 0..N {
                // A task leaves the window once its scope ended and it completed.
                orch.scope(|o| {
                    let mut a = TaskArgs::new();
                    a.input(&u64s(&chain, i, 1))?.output(&u64s(&chain, i + 1, 1))?.scalar(1).scalar(i as u64);
                    o.submit_sub(&affine, a).map(|_| ())
                })?;
            }
            Ok(())
        })
        .expect("200 tasks pass a window of 4");
    run.wait().unwrap();
    let mut expect = vec![1u64];
    for i in 0..N as u64 {
        expect.push(expect.last().unwrap() + i);
    }
    assert_eq!(read_u64(&chain, 0, N + 1), expect);
    assert_eq!(run.stats().unwrap().tasks, N as u64);
}

#[isolated_test]
fn full_task_window_in_the_outer_scope_times_out() {
    let timeout = Duration::from_millis(200);
    let (rig, [fill]) = Rig::start(subs(1).task_window(4).backpressure_timeout(timeout), [("fill", fill)]);
    let out = u64_buffer(&rig, 8);
    let mut submitted = 0;
    let err = rig
        .submit(|orch| {
            for i in 0..8 {
                if i == 4 {
                    // The admitted tasks run (the engine drives them in the background)...
                    wait_for("the admitted tasks to run", Duration::from_secs(10), || {
                        read_u64(&out, 0, 4) == [1; 4]
                    });
                }
                // ...but stay live: the fifth submit finds the window full.
                let mut a = TaskArgs::new();
                a.output(&u64s(&out, i, 1))?.scalar(1);
                orch.submit_sub(&fill, a)?;
                submitted += 1;
            }
            Ok(())
        })
        .expect_err("outer-scope tasks stay live until the run's scope ends");
    assert_err(&err, ErrorKind::Timeout, &["task window", "task_window", "orch.scope"]);
    assert_eq!(submitted, 4);
    assert_eq!(read_u64(&out, 0, 8), vec![1, 1, 1, 1, 0, 0, 0, 0]);
}
