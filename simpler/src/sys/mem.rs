//! Shared mappings of nameless memory (memfd), and byte views of element slices.
//!
//! A [`SharedRegion`] is a `MAP_SHARED` mapping of a memfd: memory with no name anywhere, freed
//! when the last process that maps it or holds its descriptor is gone, so nothing can outlive
//! the process tree. The mailboxes live in one, and so do the heap rings that `orch.alloc`
//! carves tensors from. A child started by exec receives the memfd as an inherited descriptor
//! and maps it at an address of its own ([`SharedRegion::map_fd`]); a forked child inherits
//! the mapping at the same address. Either way all of them see one set of pages. An address a
//! descriptor carries (a heap slab) is an address in the *creating* process, which a child
//! translates with [`SharedSpan::local`]. Such an address means something only together with
//! the region's identity (the memfd's inode, [`SharedRegion::ino`]): a child started by exec
//! maps regions of its own wherever its kernel puts them, so one of its own addresses may also
//! be an address inside a region its parent created, and two processes' rings may sit at the
//! same addresses. A [`SharedSpan`] (`origin`, `region`) is therefore found by the inode.
//! The chip's simulated device memory (`chip::arena`) is a region too.
//!
//! # Rules
//!
//! * **R1 (ownership of the mapping).** `ptr..ptr + len` is a live read-write mapping created by
//!   [`SharedRegion::new`] or [`SharedRegion::map_fd`] and owned by that value alone: nothing else unmaps it, and `Drop`
//!   unmaps it exactly once. (A forked child owns its own copy of the value, whose drop would
//!   unmap only the child's view; children leave through `_exit` anyway.)
//! * **R2 (shared, zeroed, aligned).** The mapping is `MAP_SHARED` of a memfd at least `len`
//!   bytes long (checked with `fstat` before mapping one received from a parent), zero-filled
//!   by the kernel when created, and page-aligned; `lazy` adds `MAP_NORESERVE`, so pages are backed on first
//!   touch. Types for which all-zero bytes are a valid value may be laid over it by the modules
//!   that own its contents (the mailbox, rule M1 there; the heap rings).
//! * **R3 (no references here).** A [`SharedRegion`] hands out only addresses and raw pointers;
//!   it never creates a reference to its contents. Whoever dereferences them follows the
//!   protocol of the module that lays out the bytes. That is why the value itself may be
//!   `Send + Sync`: sharing it shares an address, not access.
//! * **R4 (plain old data).** [`Pod`] is implemented here, and only here, for `f32`, `f64`,
//!   `i8`..`i64` and `u8`..`u64`: no padding, no invalid bit patterns, alignment at least that
//!   of `u8`. A slice of them may therefore be viewed as its bytes, and any bytes written
//!   through the view are valid elements. (The data layer's `Element` requires `Pod`.)
//!
//! # Memory ordering
//!
//! This module performs no atomic operations. A region is made before any child that uses it
//! starts (children inherit it with the fork's or the exec's own synchronization); ordering of
//! the contents is the business of the module that lays them out.

#![expect(unsafe_code, reason = "memfd, mmap/munmap and the POD byte casts of element slices; rules R1-R4")]

use std::fmt;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

use crate::error::{Error, Result};

/// A `MAP_SHARED` mapping of a memfd, which children map too (forked: at the same address;
/// started by exec: from the inherited descriptor, wherever their kernel puts it).
///
/// Zero-filled. `lazy` adds `MAP_NORESERVE` (for large heap rings backed on first touch).
/// `Send + Sync` (rule R3). Dropping it unmaps the region and closes the descriptor.
pub(crate) struct SharedRegion {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    /// The memfd's inode number: the region's identity in every process that maps it.
    ino: u64,
}

/// A shared region as a descriptor names it: `origin` is its base address in the process that
/// created it (the address heap-slab descriptors carry, beside the region's inode), `region` its
/// mapping here.
#[derive(Clone, Debug)]
pub(crate) struct SharedSpan {
    pub(crate) origin: u64,
    pub(crate) region: Arc<SharedRegion>,
}

impl SharedSpan {
    /// A span of a region created in this process.
    pub(crate) fn here(region: Arc<SharedRegion>) -> SharedSpan {
        SharedSpan { origin: region.addr(), region }
    }

    /// The length of the region in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.region.len() as u64
    }

    /// The local address of the `n` bytes at creator address `addr` of the region with inode
    /// `ino`, if this span is that region and they lie inside.
    pub(crate) fn local(&self, ino: u64, addr: u64, n: u64) -> Option<*mut u8> {
        if self.region.ino != ino {
            return None;
        }
        let offset = addr.checked_sub(self.origin)?;
        let end = offset.checked_add(n)?;
        if end > self.len() {
            return None;
        }
        // In bounds: `offset + n <= len`, so the pointer stays inside the mapping.
        Some(self.region.as_ptr().wrapping_add(offset as usize))
    }
}

// SAFETY: rule R3 — the value holds only the address of a mapping it owns (R1); it never creates
// references to the contents, so moving it to another thread moves nothing but that address.
unsafe impl Send for SharedRegion {}
// SAFETY: rule R3 — every method reads only `ptr` and `len`, which never change; access to the
// contents is governed by the module that lays them out.
unsafe impl Sync for SharedRegion {}

impl SharedRegion {
    /// Maps `len` zero-filled bytes `MAP_SHARED | MAP_ANONYMOUS`, read-write; `lazy` adds
    /// `MAP_NORESERVE`.
    ///
    /// Fails with [`ErrorKind::InvalidArgument`](crate::error::ErrorKind::InvalidArgument) for
    /// `len == 0` and with [`ErrorKind::Os`](crate::error::ErrorKind::Os), naming the size, when
    /// the kernel refuses the mapping.
    pub(crate) fn new(len: usize, lazy: bool) -> Result<SharedRegion> {
        if len == 0 {
            return Err(Error::invalid("shared region: length must be greater than 0"));
        }
        let what = || format!("creating {len} bytes of shared memory");
        // SAFETY: rule R1 — memfd_create takes a NUL-terminated name and flags; it returns a new
        // descriptor that nothing else owns, or -1.
        let raw = unsafe { libc::memfd_create(c"simpler".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(Error::os(&what(), std::io::Error::last_os_error()));
        }
        // SAFETY: rule R1 — `raw` is the new descriptor memfd_create returned, owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        nix::unistd::ftruncate(&fd, len as libc::off_t).map_err(|e| Error::os(&what(), e))?;
        SharedRegion::map(fd, len, lazy)
    }

    /// Maps `len` bytes of the memfd `fd` a parent passed to this process (rule R2: `fd` must
    /// be at least `len` bytes long, checked here).
    pub(crate) fn map_fd(fd: OwnedFd, len: usize, lazy: bool) -> Result<SharedRegion> {
        SharedRegion::map(fd, len, lazy)
    }

    /// Maps `len` bytes of memfd `fd`, after checking (one `fstat`, which also gives the inode
    /// that names the region) that it holds them.
    fn map(fd: OwnedFd, len: usize, lazy: bool) -> Result<SharedRegion> {
        let length = NonZeroUsize::new(len)
            .ok_or_else(|| Error::invalid("shared region: length must be greater than 0"))?;
        let st =
            nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| Error::os("fstat of a shared region", e))?;
        if u64::try_from(st.st_size).unwrap_or(0) < len as u64 {
            return Err(Error::invalid(format!(
                "a shared region has {} bytes, fewer than the {len} its descriptor names",
                st.st_size
            )));
        }
        let ino = st.st_ino;
        let mut flags = MapFlags::MAP_SHARED;
        if lazy {
            flags |= MapFlags::MAP_NORESERVE;
        }
        // SAFETY: rules R1, R2 — a new mapping at an address the kernel chooses aliases no
        // existing memory of this process; the memfd holds at least `len` bytes (created so, or
        // checked above); the returned range is owned by the SharedRegion built from it.
        let ptr = unsafe { mmap(None, length, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, flags, &fd, 0) }
            .map_err(|e| Error::os(&format!("mapping {len} bytes of shared memory (lazy: {lazy})"), e))?;
        Ok(SharedRegion { ptr: ptr.cast(), len, fd, ino })
    }

    /// The memfd behind the mapping (what a child started by exec inherits).
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The base address of the mapping (page-aligned).
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The length of the mapping in bytes (never 0).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The memfd's inode number (non-zero): which region this is, in every process that maps
    /// it (what a heap-slab descriptor carries beside an address).
    pub(crate) fn ino(&self) -> u64 {
        self.ino
    }

    /// The base address as an integer (what a heap-slab descriptor carries).
    pub(crate) fn addr(&self) -> u64 {
        self.ptr.as_ptr() as usize as u64
    }

    #[cfg(test)] // only tests need it
    /// True when the byte range `[addr, addr + len)` lies inside the mapping.
    ///
    /// Overflow-safe: a range whose end does not fit in a `u64` is never contained. An empty
    /// range is contained when `addr` lies in `[base, base + self.len()]`.
    pub(crate) fn contains(&self, addr: u64, len: u64) -> bool {
        let Some(offset) = addr.checked_sub(self.addr()) else {
            return false;
        };
        let size = self.len as u64;
        offset <= size && len <= size - offset
    }
}

impl Drop for SharedRegion {
    fn drop(&mut self) {
        // SAFETY: rule R1 — `ptr..ptr + len` is the mapping this value owns, unmapped only here.
        // Nothing can still borrow the contents: references into the region are tied to a
        // borrow of this value (or, for raw addresses, to the owner's protocol).
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

impl fmt::Debug for SharedRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .finish()
    }
}

/// Plain old data: types with no padding and no invalid bit patterns, whose slices may be
/// viewed as bytes and written through such a view (rule R4).
///
/// # Safety
///
/// Implemented only in this module, for the primitive numeric types; an implementation for any
/// other type would break rule R4.
pub unsafe trait Pod: Copy + 'static {}

macro_rules! pod {
    ($($t:ty),*) => {$(
        // SAFETY: rule R4 — a primitive number: no padding, every bit pattern valid.
        unsafe impl Pod for $t {}
    )*};
}

pod!(f32, f64, i8, i16, i32, i64, u8, u16, u32, u64);

/// Views a slice of elements as its bytes (native endianness).
pub(crate) fn as_bytes<T: Pod>(v: &[T]) -> &[u8] {
    // SAFETY: rule R4 — `T` is plain old data without padding, so every byte of the slice is
    // initialized; the view covers exactly `size_of_val(v)` bytes of the same allocation, u8
    // needs no alignment, and the shared borrow of `v` is carried over to the result.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), size_of_val(v)) }
}

/// Views a mutable slice of elements as its bytes (native endianness).
pub(crate) fn as_bytes_mut<T: Pod>(v: &mut [T]) -> &mut [u8] {
    let len = size_of_val(v);
    // SAFETY: rule R4 — `T` has no padding and no invalid bit patterns, so any bytes written
    // through the view leave valid elements; the view covers exactly the slice's bytes, u8 needs
    // no alignment, and the exclusive borrow of `v` is carried over to the result.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sys::test_fork::fork_child;

    #[test]
    fn region_is_zeroed_and_page_aligned() {
        let r = SharedRegion::new(10_000, false).unwrap();
        assert_eq!(r.len(), 10_000);
        assert_eq!(r.addr() % 4096, 0);
        // SAFETY: rule R1 — the mapping is live and 10 000 bytes long; nothing else accesses it.
        let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) };
        assert!(bytes.iter().all(|b| *b == 0));
    }

    #[test]
    fn zero_length_is_rejected() {
        assert!(SharedRegion::new(0, false).unwrap_err().kind() == crate::error::ErrorKind::InvalidArgument);
    }

    #[crate::test_support::isolated_test(crate = crate)] // rule T1
    fn region_is_shared_with_a_forked_child() {
        let r = SharedRegion::new(1 << 20, false).unwrap();
        let base = r.as_ptr();
        let mut child = fork_child(|| {
            for i in 0..(1 << 20) {
                // SAFETY: rule R2 — the child sees the parent's mapping at the same address;
                // `i` is in bounds and the parent does not touch the region until we exit.
                unsafe { base.add(i).write((i % 251) as u8) };
            }
            0
        });
        assert_eq!(child.wait_timeout(Duration::from_secs(10)), 0);
        // SAFETY: rule R2 — the child has exited, so the parent alone accesses the shared pages.
        let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr(), r.len()) };
        assert!(bytes.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }

    #[test]
    fn lazy_gigabyte_mapping_is_backed_on_touch() {
        let len = 1usize << 30;
        let r = SharedRegion::new(len, true).unwrap();
        for offset in [0, len / 2, len - 1] {
            // SAFETY: rule R1 — `offset < len`, the mapping is live and this thread alone uses it.
            unsafe {
                assert_eq!(r.as_ptr().add(offset).read(), 0);
                r.as_ptr().add(offset).write(0xA5);
                assert_eq!(r.as_ptr().add(offset).read(), 0xA5);
            }
        }
    }

    #[test]
    fn contains_is_overflow_safe() {
        let r = SharedRegion::new(4096, false).unwrap();
        let base = r.addr();
        assert!(r.contains(base, 4096));
        assert!(r.contains(base + 4095, 1));
        assert!(r.contains(base + 4096, 0));
        assert!(!r.contains(base + 4096, 1));
        assert!(!r.contains(base - 1, 1));
        assert!(!r.contains(base, 4097));
        assert!(!r.contains(base + 1, u64::MAX));
        assert!(!r.contains(u64::MAX, u64::MAX));
        assert!(!r.contains(0, 0));
    }

    #[test]
    fn element_byte_views_round_trip() {
        let v = [1.5f32, -2.0];
        let bytes = as_bytes(&v);
        assert_eq!(bytes.len(), 8);
        assert_eq!(&bytes[..4], &1.5f32.to_ne_bytes());
        let mut w = [0u64; 2];
        as_bytes_mut(&mut w)[8..].copy_from_slice(&7u64.to_ne_bytes());
        assert_eq!(w, [0, 7]);
        assert!(as_bytes::<i16>(&[]).is_empty());
    }
}
