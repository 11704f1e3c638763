//! Function addresses that cross to a child: [`FnAddress`], the one way a function pointer
//! becomes a `u64` on the wire and back.
//!
//! A child runs the same binary image as its parent: a fork of it, or an exec of the same file
//! (`/proc/self/exe`, see `sys::spawn`). The image may be loaded at another base address (ASLR),
//! but every function keeps its offset from every other function of the image. So the wire
//! carries a function's offset from an anchor function of this crate, and the child adds its
//! own anchor's address back: the same code, even when the parent took the address after the
//! child started (a registration after `init`).
//!
//! An [`FnAddress`] is built safely only from a function ([`FnAddress::of`]) and read back only
//! through the `unsafe` [`FnAddress::from_wire`]. [`FnPointer`] is implemented for
//! `HostFnPtr` (`callable/host.rs`), `OrchFnPtr` (`engine/orch_fn.rs`) and `ChipBackendFn`
//! (`chip/sim.rs`): the function types a control frame or a start spec carries.
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! * **FA1 (fn pointer types only).** [`FnPointer`] is implemented only for plain `fn` pointer
//!   types: non-null, pointer-sized values with no padding, any of whose addresses, read back as
//!   that type in this binary image, is a valid value of it.
//! * **FA2 (built from a function).** A [`FnAddress<F>`] holds an address taken from a value of
//!   `F`: by [`FnAddress::of`] in this process, or by [`FnAddress::from_wire`], whose caller
//!   vouches that the word came from [`FnAddress::to_wire`] of an `FnAddress<F>` with the same
//!   `F`, in this process or in a process running the same binary file (its parent, forked or
//!   exec'd from `/proc/self/exe`).
//! * **FA3 (one image).** [`FnAddress::of`] accepts only functions of the image the anchor is
//!   in (the program's executable, where Rust links every crate); one of another shared object
//!   (a Rust `dylib`) is refused with a panic, since its offset would name other code in a child.

#![expect(unsafe_code, reason = "reading a fn pointer's bits as an address and back; rules FA1-FA3")]

use std::marker::PhantomData;
use std::num::NonZeroUsize;

/// A plain `fn` pointer type, whose address may be sent to a forked child (rule FA1).
///
/// # Safety
///
/// Implement it only for `fn` pointer types (rule FA1): [`FnAddress`] reads their bits as a
/// `usize` and rebuilds them from one.
pub(crate) unsafe trait FnPointer: Copy + Send + Sync + 'static {}

/// The address of a function of type `F`, as carried in a control frame (rule FA2).
///
/// Built safely only from a function ([`of`](FnAddress::of)); read back from the wire only
/// through the one `unsafe` constructor, [`from_wire`](FnAddress::from_wire).
pub(crate) struct FnAddress<F: FnPointer> {
    addr: NonZeroUsize,
    _f: PhantomData<F>,
}

impl<F: FnPointer> Clone for FnAddress<F> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<F: FnPointer> Copy for FnAddress<F> {}

impl<F: FnPointer> std::fmt::Debug for FnAddress<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FnAddress({:#x})", self.addr)
    }
}

impl<F: FnPointer> FnAddress<F> {
    /// Compile-time check of the size half of rule FA1.
    const POINTER_SIZED: () = assert!(size_of::<F>() == size_of::<usize>());

    /// The address of `f`.
    ///
    /// # Panics
    ///
    /// If `f` lies in another shared object than this crate's code (rule FA3): a child could
    /// not find it at the same offset.
    pub(crate) fn of(f: F) -> FnAddress<F> {
        let () = Self::POINTER_SIZED;
        // SAFETY: rule FA1 — `F` is a `fn` pointer type, pointer-sized with no padding, so its
        // bits are an initialized `usize`.
        let addr: usize = unsafe { std::mem::transmute_copy::<F, usize>(&f) };
        assert!(
            same_image(addr),
            "function at {addr:#x} is not in the program's executable (a dynamic library?): a worker process cannot call it"
        );
        FnAddress { addr: NonZeroUsize::new(addr).expect("a fn pointer is never null"), _f: PhantomData }
    }

    /// The function again.
    pub(crate) fn get(self) -> F {
        let () = Self::POINTER_SIZED;
        // SAFETY: rules FA1, FA2 — the address was taken from a value of `F` of this binary
        // image (here or in the process this one was forked from), so it is a valid `F`.
        unsafe { std::mem::transmute_copy::<usize, F>(&self.addr.get()) }
    }

    /// The word a control frame carries: the offset from the anchor.
    pub(crate) fn to_wire(self) -> u64 {
        self.addr.get().wrapping_sub(anchor_address()) as u64
    }

    /// The function a control frame carried; `None` for a word that gives address 0 or is
    /// wider than an address.
    ///
    /// # Safety
    ///
    /// `word` came from [`to_wire`](FnAddress::to_wire) of an `FnAddress<F>` with this same
    /// `F`, in this process or in a process of the same binary file (rule FA2).
    pub(crate) unsafe fn from_wire(word: u64) -> Option<FnAddress<F>> {
        let offset = usize::try_from(word).ok()?;
        let addr = NonZeroUsize::new(anchor_address().wrapping_add(offset))?;
        Some(FnAddress { addr, _f: PhantomData })
    }
}

/// The function every wire word is an offset from.
#[inline(never)]
fn anchor() {}

fn anchor_address() -> usize {
    anchor as fn() as usize
}

/// True when `addr` lies in the same loaded object as [`anchor`] (or when the loader cannot
/// say, as in a statically linked program, which has one image).
fn same_image(addr: usize) -> bool {
    let base = |a: usize| {
        let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
        // SAFETY: rule FA3 — dladdr only reads the loader's tables and writes `info`.
        let found = unsafe { libc::dladdr(a as *const libc::c_void, info.as_mut_ptr()) };
        // SAFETY: zero-initialized above and written by dladdr when it succeeds; only a pointer
        // field is read.
        (found != 0).then(|| unsafe { info.assume_init() }.dli_fbase as usize)
    };
    match (base(anchor_address()), base(addr)) {
        (Some(a), Some(b)) => a == b,
        (None, _) => true,
        (Some(_), None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Double = fn(u32) -> u32;
    // SAFETY: rule FA1 — a plain `fn` pointer type.
    unsafe impl FnPointer for Double {}

    fn double(x: u32) -> u32 {
        2 * x
    }

    #[test]
    fn an_address_round_trips_through_the_wire() {
        let a = FnAddress::<Double>::of(double);
        assert_eq!(a.to_wire(), (double as Double as usize).wrapping_sub(anchor_address()) as u64);
        assert_eq!((a.get())(21), 42);
        // SAFETY: rule FA2 — the word comes from `to_wire` of an `FnAddress<Double>` here.
        let back = unsafe { FnAddress::<Double>::from_wire(a.to_wire()) }.unwrap();
        assert_eq!((back.get())(4), 8);
    }

    #[test]
    fn zero_is_refused() {
        let null = 0usize.wrapping_sub(anchor_address()) as u64;
        // SAFETY: a word naming address 0 is refused before any function is built from it.
        assert!(unsafe { FnAddress::<Double>::from_wire(null) }.is_none());
    }
}
