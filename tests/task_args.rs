//! Task arguments: tensor validation, tag versus access, aliasing inside one task, scalars.

mod common;

use common::*;
use simpler::{
    DataType, ErrorKind, HostArgs, HostResult, Tag, TaskArgs, Tensor, memory::Access,
    memory::MAX_TENSOR_DIMS, memory::TensorView,
};

#[isolated_test]
fn bad_views_are_rejected_with_what_is_wrong() {
    let (rig, [_fill]) = Rig::start(subs(1), [("fill", fill)]);
    let buf = rig.create_buffer(64).unwrap();
    // Past the end of the buffer: 16 f32 from byte 4 end at byte 68.
    let past = TensorView::new(4, &[16], None, DataType::Float32).unwrap();
    expect_err(buf.view(past), ErrorKind::InvalidArgument, &["past the end", "64-byte buffer"]);
    expect_err(buf.tensor(&[17], DataType::Float32), ErrorKind::InvalidArgument, &["past the end"]);
    let strided = TensorView::new(0, &[4, 4], Some(&[5, 1]), DataType::Float32).unwrap(); // ends at 19 * 4
    expect_err(buf.view(strided), ErrorKind::InvalidArgument, &["past the end"]);
    // Zero dimensions, too many, a zero extent or stride.
    expect_err(
        TensorView::new(0, &[], None, DataType::Float32),
        ErrorKind::InvalidArgument,
        &["dimensions", "got 0"],
    );
    let six = [1u32; MAX_TENSOR_DIMS + 1];
    expect_err(
        TensorView::new(0, &six, None, DataType::Float32),
        ErrorKind::InvalidArgument,
        &["dimensions", "got 6"],
    );
    expect_err(
        TensorView::new(0, &[4, 0], None, DataType::Float32),
        ErrorKind::InvalidArgument,
        &["shape[1]"],
    );
    expect_err(
        TensorView::new(0, &[4], Some(&[0]), DataType::Float32),
        ErrorKind::InvalidArgument,
        &["stride[0]"],
    );
    expect_err(
        TensorView::new(0, &[4], Some(&[1, 1]), DataType::Float32),
        ErrorKind::InvalidArgument,
        &["strides"],
    );
    // Misaligned for the element type.
    expect_err(
        TensorView::new(2, &[4], None, DataType::Float32),
        ErrorKind::InvalidArgument,
        &["byte offset 2", "element size 4"],
    );
    assert!(TensorView::new(2, &[4], None, DataType::Int16).is_ok(), "2 is aligned for i16");
}

#[isolated_test]
fn views_whose_elements_overlap_are_refused_and_reads_are_checked_before_allocating() {
    let (rig, [_fill]) = Rig::start(subs(1), [("fill", fill)]);
    // 65535^5 elements in 327 671 bytes: the count would overflow u64.
    expect_err(
        TensorView::new(0, &[65535; 5], Some(&[1; 5]), DataType::Uint8),
        ErrorKind::InvalidArgument,
        &["more elements than fit in u64"],
    );
    // 10^15 elements in 4 996 bytes: a copy loop over them would never end.
    expect_err(
        TensorView::new(0, &[1000; 5], Some(&[1; 5]), DataType::Uint8),
        ErrorKind::InvalidArgument,
        &["overlap"],
    );
    // Two rows that share their middle element.
    expect_err(
        TensorView::new(0, &[2, 3], Some(&[2, 1]), DataType::Float32),
        ErrorKind::InvalidArgument,
        &["overlap"],
    );
    // Disjoint strided views stay fine, whatever the order of their strides.
    assert!(TensorView::new(0, &[2, 3], Some(&[3, 1]), DataType::Float32).is_ok());
    assert!(TensorView::new(0, &[3, 2], Some(&[1, 3]), DataType::Float32).is_ok(), "a transposed view");
    assert!(
        TensorView::new(0, &[1, 3], Some(&[1, 1]), DataType::Float32).is_ok(),
        "size-1 dimensions do not count"
    );

    let buf = rig.create_buffer(64).unwrap();
    for len in [usize::MAX, 1 << 40, 65] {
        expect_err(buf.read::<u8>(0, len), ErrorKind::InvalidArgument, &["past the end", "64-byte buffer"]);
    }
    expect_err(buf.read::<u64>(usize::MAX / 4, 1), ErrorKind::InvalidArgument, &["overflows"]);
    assert_eq!(buf.read::<u8>(60, 4).unwrap().len(), 4);
}

#[isolated_test]
fn tensor_after_scalar_is_rejected() {
    let (rig, [_fill]) = Rig::start(subs(1), [("fill", fill)]);
    let buf = u64_buffer(&rig, 4);
    let t = u64s(&buf, 0, 4);
    let mut a = TaskArgs::new();
    a.input(&t).unwrap().scalar(1);
    expect_err(a.output(&t).map(|_| ()), ErrorKind::InvalidArgument, &["after a scalar"]);
    expect_err(a.untracked(&t).map(|_| ()), ErrorKind::InvalidArgument, &["after a scalar"]);
    assert_eq!(
        (a.tensor_count(), a.scalar_count()),
        (1, 1),
        "a refused tensor leaves the arguments unchanged"
    );
}

/// `t` with its descriptor's access narrowed to `access`.
fn with_access(t: &Tensor, access: Access) -> Tensor {
    t.narrowed(access).unwrap()
}

#[isolated_test]
fn tag_needing_more_access_than_granted_is_rejected() {
    let (rig, [fill, sum]) = Rig::start(subs(1), [("fill", fill), ("sum", sum)]);
    let buf = u64_buffer(&rig, 4);
    let out = u64_buffer(&rig, 4);
    buf.write(0, &[1u64, 2, 3, 4]).unwrap();
    let read_only = with_access(&u64s(&buf, 0, 4), Access::Read);
    let write_only = with_access(&u64s(&out, 0, 4), Access::Write);
    rig.run(|orch| {
        for tag in [Tag::Output, Tag::InOut, Tag::OutputExisting] {
            let mut a = TaskArgs::new();
            a.add_tensor(&read_only, tag)?.scalar(1);
            let err = orch.submit_sub(&fill, a).expect_err("a read-only buffer cannot be written");
            assert_err(&err, ErrorKind::InvalidArgument, &["fill", "tensor 0", &format!("{tag:?}"), "Read"]);
        }
        let mut a = TaskArgs::new();
        a.input(&write_only)?.output(&u64s(&out, 0, 4))?;
        let err = orch.submit_sub(&sum, a).expect_err("a write-only buffer cannot be read");
        assert_err(&err, ErrorKind::InvalidArgument, &["sum", "tensor 0", "Input", "Write"]);
        assert_eq!(orch.task_count(), 0);
        // What the access grants is fine: read a read-only buffer, write a write-only one.
        let mut a = TaskArgs::new();
        a.input(&read_only)?.output(&write_only)?;
        orch.submit_sub(&sum, a)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 4), vec![1, 2, 3, 4]);
}

#[isolated_test]
fn overlapping_tensors_of_one_task_are_rejected_when_one_is_written() {
    let (rig, [affine]) = Rig::start(subs(1), [("affine", affine)]);
    let buf = u64_buffer(&rig, 12);
    rig.run(|orch| {
        for (tag0, tag1) in [(Tag::Input, Tag::Output), (Tag::InOut, Tag::Input), (Tag::Output, Tag::NoDep)] {
            let mut a = TaskArgs::new();
            a.add_tensor(&u64s(&buf, 0, 8), tag0)?;
            if tag1 == Tag::NoDep {
                a.untracked(&u64s(&buf, 4, 8))?;
            } else {
                a.add_tensor(&u64s(&buf, 4, 8), tag1)?;
            }
            a.scalar(1).scalar(1);
            let err = orch.submit_sub(&affine, a).expect_err("aliasing a written tensor");
            assert_err(&err, ErrorKind::InvalidArgument, &["affine", "tensors 0 and 1 overlap"]);
        }
        // Disjoint views of one buffer are fine.
        let mut a = TaskArgs::new();
        a.input(&u64s(&buf, 0, 4))?.output(&u64s(&buf, 4, 4))?.scalar(2).scalar(1);
        orch.submit_sub(&affine, a)?;
        Ok(())
    })
    .unwrap();
    assert_eq!(read_u64(&buf, 4, 4), vec![1; 4]);
}

fn echo_scalars(args: &HostArgs<'_>) -> HostResult {
    let out = args.output::<u64>(0)?;
    if out.len() < args.scalar_count() + 1 {
        return Err("echo_scalars: output too small".into());
    }
    out[0] = args.scalar_count() as u64;
    out[1..=args.scalar_count()].copy_from_slice(args.scalars());
    // f32 scalars travel as their bits; the function reads them back.
    if args.scalar_f32(2)? != 1.5 {
        return Err(format!("scalar 2 is {}, not 1.5", args.scalar_f32(2)?).into());
    }
    let past = args.scalar(args.scalar_count()).expect_err("past the last scalar");
    let missing = args.input::<u64>(5).expect_err("past the last tensor");
    let wrong_type = args.input::<f32>(0).expect_err("the tensor holds u64");
    out[5] = u64::from(past.to_string().contains("out of range"));
    out[6] = u64::from(missing.to_string().contains("out of range"));
    out[7] = u64::from(wrong_type.to_string().contains("not f32"));
    Ok(())
}

#[isolated_test]
fn scalars_reach_the_host_function_in_order() {
    let (rig, [echo]) = Rig::start(subs(1), [("echo_scalars", echo_scalars)]);
    let out = u64_buffer(&rig, 8);
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.add_tensor(&u64s(&out, 0, 8), Tag::InOut)?.scalar(u64::MAX).scalar(0).scalar_f32(1.5);
        orch.submit_sub(&echo, a).map(|_| ())
    })
    .unwrap();
    assert_eq!(read_u64(&out, 0, 8), vec![3, u64::MAX, 0, u64::from(1.5f32.to_bits()), 0, 1, 1, 1]);
}

fn write_input(args: &HostArgs<'_>) -> HostResult {
    args.output::<u64>(0)?.fill(1);
    Ok(())
}

fn read_output(args: &HostArgs<'_>) -> HostResult {
    args.input::<u64>(0)?;
    Ok(())
}

#[isolated_test]
fn host_functions_get_only_the_access_their_tags_grant() {
    let (rig, [w, r]) = Rig::start(subs(1), [("write_input", write_input), ("read_output", read_output)]);
    let buf = u64_buffer(&rig, 4);
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.input(&u64s(&buf, 0, 4))?;
            orch.submit_sub(&w, a).map(|_| ())
        })
        .expect_err("an Input tensor is read-only in the host function");
    assert_err(&err, ErrorKind::TaskFailed, &["write_input", "tensor 0", "read-only"]);
    assert_eq!(read_u64(&buf, 0, 4), vec![0; 4]);
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            a.output(&u64s(&buf, 0, 4))?;
            orch.submit_sub(&r, a).map(|_| ())
        })
        .expect_err("an Output tensor is write-only in the host function");
    assert_err(&err, ErrorKind::TaskFailed, &["read_output", "tensor 0", "write-only"]);
}

#[isolated_test]
fn arguments_too_large_for_the_mailbox_are_refused_at_submit() {
    let (rig, [noop, fill]) = Rig::start(subs(1), [("noop", noop), ("fill", fill)]);
    let out = u64_buffer(&rig, 1);
    let err = rig
        .run(|orch| {
            let mut a = TaskArgs::new();
            for i in 0..10_000 {
                a.scalar(i);
            }
            orch.submit_sub(&noop, a).map(|_| ())
        })
        .expect_err("80 KB of scalars do not fit a task frame");
    assert_err(
        &err,
        ErrorKind::InvalidArgument,
        &["noop", "10000 scalars", "63808 bytes a worker's mailbox holds"],
    );
    rig.run(|orch| {
        let mut a = TaskArgs::new();
        a.output(&u64s(&out, 0, 1))?.scalar(1);
        orch.submit_sub(&fill, a).map(|_| ())
    })
    .expect("the worker is fine afterwards");
    assert_eq!(read_u64(&out, 0, 1), vec![1]);
}

/// A run's `Input` argument arrives read-only in its orchestration function, as one sent down
/// from a Worker above does: passed where a task writes it, the submit is refused, also after
/// typing it again as a writable `TensorOf`.
#[isolated_test]
fn a_runs_input_argument_cannot_be_written_by_its_orchestration() {
    let (rig, [fill]) = Rig::start(subs(1), [("fill", fill)]);
    let buf = u64_buffer(&rig, 4);
    buf.write(0, &[1u64, 2, 3, 4]).unwrap();
    let mut args = TaskArgs::new();
    args.input(&u64s(&buf, 0, 4)).unwrap();
    let options = simpler::RunOptions::new().args(args);
    let err = rig
        .run_with(options, |orch, args, _| {
            let t = args.tensor(0).expect("the argument");
            assert_eq!(t.desc().access(), Access::Read, "an input arrives read-only");
            let retyped = simpler::dsl::TensorOf::<u64>::new(t.clone())?; // a writable handle type
            let mut a = TaskArgs::new();
            a.output(retyped.tensor())?.scalar(9);
            orch.submit_sub(&fill, a).map(|_| ())
        })
        .unwrap_err();
    assert_err(&err, ErrorKind::InvalidArgument, &["fill", "tensor 0", "Output", "Read"]);
    assert_eq!(read_u64(&buf, 0, 4), vec![1, 2, 3, 4], "nothing was written");
}
