use super::*;
use crate::data::dtype::DataType;
use crate::sys::mem::as_bytes_mut;

/// The whole view, as a window of `copy_runs_in`.
const WHOLE: (u64, u64) = (0, u64::MAX);

#[test]
fn fenced_blocks_copy_beside_a_running_kernel_and_refuse_kernel_views() {
    let a = Arena::new(4096).unwrap();
    let staging = a.malloc(256).unwrap();
    let other = a.malloc(256).unwrap();
    a.fence(staging).unwrap();
    let view = TensorView::new(0, &[64], None, DataType::Float32).unwrap();
    let running = a.kernel_gate();
    assert!(a.tensor(other, view, Access::ReadWrite).is_ok());
    let err = a.tensor(staging, view, Access::Read).unwrap_err();
    assert!(err.message().contains("staging"), "{err}");
    let inside = TensorView::new(64, &[4], None, DataType::Float32).unwrap();
    assert!(a.tensor(staging, inside, Access::Read).is_err(), "an interior view too");
    // A copy into the fenced block does not wait for the running kernel (this would
    // deadlock otherwise: the gate is held on this thread).
    a.copy_to(staging + 8, &[1, 2, 3]).unwrap();
    let mut back = [0u8; 3];
    a.copy_from(staging + 8, &mut back).unwrap();
    assert_eq!(back, [1, 2, 3]);
    drop(running);
    a.unfence(staging).unwrap();
    let running = a.kernel_gate();
    assert!(a.tensor(staging, view, Access::Read).is_ok(), "unfenced: kernels may see it");
    drop(running);
    assert!(a.fence(other + 64).is_err(), "only a block's start can be fenced");
}

#[test]
fn alloc_is_first_fit_and_aligned() {
    let a = Arena::new(1024).unwrap();
    let p0 = a.malloc(1).unwrap();
    let p1 = a.malloc(65).unwrap();
    let p2 = a.malloc(64).unwrap();
    assert_eq!((p0, p1, p2), (0, 64, 192));
    assert!([p0, p1, p2].iter().all(|p| p % DEVICE_ALIGN == 0));
    assert_eq!(a.used(), 256);
    // A hole at 64..192 is reused first for a request that fits it.
    a.free(p1).unwrap();
    assert_eq!(a.malloc(100).unwrap(), 64);
    assert_eq!(a.malloc(10).unwrap(), 256);
}

#[test]
fn frees_coalesce_with_both_neighbours() {
    let a = Arena::new(4 * 64).unwrap();
    let p: Vec<u64> = (0..4).map(|_| a.malloc(64).unwrap()).collect();
    assert!(a.malloc(1).is_err(), "full");
    a.free(p[0]).unwrap();
    a.free(p[2]).unwrap();
    // Two separate 64-byte holes: 128 bytes do not fit.
    assert!(a.malloc(128).is_err());
    a.free(p[1]).unwrap(); // merges 0..64, 64..128 and 128..192
    assert_eq!(a.malloc(192).unwrap(), 0);
    a.free(0).unwrap();
    a.free(p[3]).unwrap();
    assert_eq!(a.used(), 0);
    assert_eq!(a.malloc(256).unwrap(), 0, "everything merged back into one block");
    let al = a.lock();
    assert_eq!(al.free.len(), 0);
}

#[test]
fn out_of_memory_names_the_size_and_the_request() {
    let a = Arena::new(1000).unwrap();
    let err = a.malloc(2000).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("2000") && err.message().contains("1000"), "{err}");
    // 1000 bytes cannot hold 1000 rounded up to 1024.
    assert!(a.malloc(1000).is_err());
    let _p = a.malloc(512).unwrap();
    let err = a.malloc(512).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState);
    assert!(err.message().contains("out of device memory"), "{err}");
    assert!(err.message().contains("512 bytes") && err.message().contains("1000 bytes"), "{err}");
    assert!(a.malloc(0).unwrap_err().message().contains("0 bytes"));
    assert!(a.malloc(u64::MAX).is_err(), "rounding must not overflow");
    assert!(Arena::new(0).is_err());
}

#[test]
fn bad_frees_say_what_is_wrong() {
    let a = Arena::new(4096).unwrap();
    let p = a.malloc(128).unwrap();
    let inner = a.free(p + 64).unwrap_err();
    assert!(inner.message().contains("inside the allocation"), "{inner}");
    a.free(p).unwrap();
    let double = a.free(p).unwrap_err();
    assert_eq!(double.kind(), ErrorKind::InvalidArgument);
    assert!(double.message().contains("double free"), "{double}");
    let never = a.free(2048).unwrap_err();
    assert!(never.message().contains("no live allocation"), "{never}");
    // Reusing the offset makes it live again; freeing it then is fine.
    assert_eq!(a.malloc(8).unwrap(), p);
    a.free(p).unwrap();
}

#[test]
fn liveness_is_the_requested_range_of_one_allocation() {
    let a = Arena::new(4096).unwrap();
    let p = a.malloc(100).unwrap();
    let q = a.malloc(100).unwrap();
    assert!(a.is_live(p, 100));
    assert!(a.is_live(p + 99, 1));
    assert!(a.is_live(p + 100, 0));
    assert!(!a.is_live(p, 101), "past the request (into the alignment slack)");
    assert!(!a.is_live(p + 50, 100), "across two allocations");
    assert!(a.is_live(q, 100));
    assert!(!a.is_live(3000, 1), "never allocated");
    assert!(!a.is_live(p, u64::MAX));
    a.free(p).unwrap();
    assert!(!a.is_live(p, 1), "freed");
}

#[test]
fn copies_are_bounds_checked() {
    let a = Arena::new(4096).unwrap();
    let p = a.malloc(16).unwrap();
    a.copy_to(p, &[7u8; 16]).unwrap();
    let mut back = [0u8; 16];
    a.copy_from(p, &mut back).unwrap();
    assert_eq!(back, [7; 16]);
    let err = a.copy_to(p + 8, &[0u8; 9]).unwrap_err();
    assert!(err.message().contains("live allocation"), "{err}");
    assert!(a.copy_from(p, &mut [0u8; 17]).is_err());
    assert!(a.copy_to(1024, &[1]).is_err(), "not allocated");
    a.free(p).unwrap();
    assert!(a.copy_from(p, &mut [0u8; 1]).is_err(), "freed");
    // Device memory is not cleared between allocations (as on a real device).
    let q = a.malloc(8).unwrap();
    let mut z = [1u8; 8];
    a.copy_from(q, &mut z).unwrap();
    assert_eq!(z, [7, 7, 7, 7, 7, 7, 7, 7], "reused bytes keep their old contents");
}

#[test]
fn strided_views_are_packed_on_the_device() {
    let a = Arena::new(4096).unwrap();
    // Host: 12 u32 as a 3x4 matrix; the view is column 1 (stride 4 elements), 3 elements.
    let mut host: Vec<u32> = (0..12).collect();
    let view = TensorView::new(4, &[3], Some(&[4]), DataType::Uint32).unwrap();
    let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::ReadWrite).unwrap();
    let p = a.malloc(16).unwrap();
    a.copy_to(p, &[0xff; 16]).unwrap();
    copy_runs_in(&m, p, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).unwrap();
    let mut dev = vec![0u8; 16];
    a.copy_from(p, &mut dev).unwrap();
    let words: Vec<u32> = dev.chunks(4).map(|c| u32::from_ne_bytes(c.try_into().unwrap())).collect();
    assert_eq!(words, vec![1, 5, 9, u32::MAX], "the elements, packed, and nothing past them");
    // Write new values on the device and copy back: only elements 1, 5, 9 change.
    let bytes: Vec<u8> = [100u32, 500, 900, 4242].iter().flat_map(|w| w.to_ne_bytes()).collect();
    a.copy_to(p, &bytes).unwrap();
    copy_runs_out(p, &m, |d, s| a.copy_from(d, s)).unwrap();
    assert_eq!(host, vec![0, 100, 2, 3, 4, 500, 6, 7, 8, 900, 10, 11]);
}

#[test]
fn a_view_copied_in_pieces_lands_as_if_copied_whole() {
    // A 3x5 window of rows 6 u16 apart (runs of 10 bytes, gaps of 2), copied in pieces of
    // every size from 1 byte (cutting elements and runs) to past the whole.
    let view = TensorView::new(2, &[3, 5], Some(&[6, 1]), DataType::Uint16).unwrap();
    let (start, end) = view.byte_range();
    let mut host: Vec<u16> = (0..18).map(|i| 1000 + i).collect();
    let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
    let a = Arena::new(4096).unwrap();
    let (whole, piecewise) = (a.malloc(end - start).unwrap(), a.malloc(end - start).unwrap());
    let read = |p: u64| {
        let mut dev = vec![0u8; (end - start) as usize];
        a.copy_from(p, &mut dev).unwrap();
        dev
    };
    a.copy_to(whole, &vec![0xee; (end - start) as usize]).unwrap();
    copy_runs_in(&m, whole, WHOLE, |d, s| a.copy_to(d, s)).map(|_| ()).unwrap();
    let elements = 3 * 5 * 2;
    for piece in 1..=elements + 3 {
        a.copy_to(piecewise, &vec![0xee; (end - start) as usize]).unwrap();
        let (mut from, mut calls) = (0, 0);
        loop {
            let n = copy_runs_in(&m, piecewise, (from, piece), |d, s| a.copy_to(d, s)).unwrap();
            assert!(n <= piece, "at most the budget");
            calls += 1;
            from += n;
            if n < piece {
                break;
            }
        }
        assert_eq!(from, elements, "every element byte once, in pieces of {piece}");
        assert_eq!(calls, elements / piece + 1, "pieces of {piece}");
        assert_eq!(read(piecewise), read(whole), "pieces of {piece}");
    }
}

/// Element runs (a transposed view) in pieces of every size; `from` at and past the end,
/// a budget of 0 and `from + budget` past `u64::MAX` copy nothing.
#[test]
fn a_transposed_view_in_pieces_and_empty_windows() {
    let view = TensorView::new(4, &[4, 3], Some(&[1, 4]), DataType::Uint16).unwrap();
    let dev_view = TensorView::new(0, &[4, 3], Some(&[1, 4]), DataType::Uint16).unwrap();
    let (s, e) = dev_view.byte_range();
    let mut host: Vec<u16> = (0..16).map(|i| 1000 + i).collect();
    let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
    let a = Arena::new(4096).unwrap();
    let (whole, part) = (a.malloc(e - s).unwrap(), a.malloc(e - s).unwrap());
    let read = |p: u64| {
        let mut d = vec![0u8; (e - s) as usize];
        a.copy_from(p, &mut d).unwrap();
        d
    };
    a.copy_to(whole, &vec![0xee; (e - s) as usize]).unwrap();
    copy_runs_in(&m, whole, WHOLE, |d, src| a.copy_to(d, src)).map(|_| ()).unwrap();
    let elements = 12 * 2;
    for piece in 1..=elements + 2 {
        a.copy_to(part, &vec![0xee; (e - s) as usize]).unwrap();
        let mut from = 0;
        loop {
            let n = copy_runs_in(&m, part, (from, piece), |d, src| a.copy_to(d, src)).unwrap();
            from += n;
            if n < piece {
                break;
            }
        }
        assert_eq!(from, elements);
        assert_eq!(read(part), read(whole), "pieces of {piece}");
    }
    let mut calls = 0;
    let mut none = |_: u64, _: &[u8]| {
        calls += 1;
        Ok(())
    };
    assert_eq!(copy_runs_in(&m, part, (elements, 10), &mut none).unwrap(), 0);
    assert_eq!(copy_runs_in(&m, part, (elements + 100, 10), &mut none).unwrap(), 0);
    assert_eq!(copy_runs_in(&m, part, (3, 0), &mut none).unwrap(), 0);
    assert_eq!(copy_runs_in(&m, part, (u64::MAX - 1, u64::MAX), &mut none).unwrap(), 0);
    assert_eq!(copy_runs_in(&m, part, (5, u64::MAX), |_, _| Ok(())).unwrap(), elements - 5);
    assert_eq!(calls, 0);
}

#[test]
fn run_copies_stop_at_the_first_error() {
    let a = Arena::new(4096).unwrap();
    let mut host = vec![0f32; 8];
    let view = TensorView::new(0, &[8], None, DataType::Float32).unwrap();
    let m = MappedTensor::from_slice(as_bytes_mut(&mut host), view, Access::Read).unwrap();
    let small = a.malloc(16).unwrap();
    assert!(
        copy_runs_in(&m, small, WHOLE, |d, s| a.copy_to(d, s)).is_err(),
        "32 bytes into a 16-byte allocation"
    );
    let p = a.malloc(32).unwrap();
    assert_eq!(copy_runs_in(&m, p, WHOLE, |d, s| a.copy_to(d, s)).unwrap(), 32);
}

#[test]
fn runs_of_a_row_strided_matrix() {
    // A 2x3 window of a 4x5 u8 matrix starting at (1, 1): rows of 3 bytes, 5 apart.
    let v = TensorView::new(6, &[2, 3], Some(&[5, 1]), DataType::Uint8).unwrap();
    let mut runs = Vec::new();
    v.for_each_run(|o, l| runs.push((o, l)));
    assert_eq!(runs, vec![(0, 3), (5, 3)]);
    let c = TensorView::new(0, &[2, 3], None, DataType::Int16).unwrap();
    let mut one = Vec::new();
    c.for_each_run(|o, l| one.push((o, l)));
    assert_eq!(one, vec![(0, 12)]);
}
