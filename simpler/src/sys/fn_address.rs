//! Function addresses that cross a fork: [`FnAddress`], the one way a function pointer becomes
//! a `u64` on the wire and back.
//!
//! A child is a fork of its parent: the same binary image at the same addresses, so the address
//! of a function taken in the parent names the same code in the child, even when the parent
//! took it after the fork (a registration after `init`).
//!
//! Rules (cited by the `SAFETY` comments below):
//!
//! * **FA1 (fn pointer types only).** [`FnPointer`] is implemented only for plain `fn` pointer
//!   types: non-null, pointer-sized values with no padding, any of whose addresses, read back as
//!   that type in this binary image, is a valid value of it.
//! * **FA2 (built from a function).** A [`FnAddress<F>`] holds an address taken from a value of
//!   `F`: by [`FnAddress::of`] in this process, or by [`FnAddress::from_wire`], whose caller
//!   vouches that the word came from [`FnAddress::to_wire`] of an `FnAddress<F>` with the same
//!   `F`, in this process or in the process this one was forked from.

#![expect(unsafe_code, reason = "reading a fn pointer's bits as an address and back; rules FA1-FA2")]

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
    pub(crate) fn of(f: F) -> FnAddress<F> {
        let () = Self::POINTER_SIZED;
        // SAFETY: rule FA1 — `F` is a `fn` pointer type, pointer-sized with no padding, so its
        // bits are an initialized `usize`.
        let addr: usize = unsafe { std::mem::transmute_copy::<F, usize>(&f) };
        FnAddress { addr: NonZeroUsize::new(addr).expect("a fn pointer is never null"), _f: PhantomData }
    }

    /// The function again.
    pub(crate) fn get(self) -> F {
        let () = Self::POINTER_SIZED;
        // SAFETY: rules FA1, FA2 — the address was taken from a value of `F` of this binary
        // image (here or in the process this one was forked from), so it is a valid `F`.
        unsafe { std::mem::transmute_copy::<usize, F>(&self.addr.get()) }
    }

    /// The word a control frame carries.
    pub(crate) fn to_wire(self) -> u64 {
        self.addr.get() as u64
    }

    /// The address a control frame carried; `None` for 0 or a word wider than an address.
    ///
    /// # Safety
    ///
    /// `word` came from [`to_wire`](FnAddress::to_wire) of an `FnAddress<F>` with this same
    /// `F`, in this process or in the process this one was forked from (rule FA2).
    pub(crate) unsafe fn from_wire(word: u64) -> Option<FnAddress<F>> {
        let addr = NonZeroUsize::new(usize::try_from(word).ok()?)?;
        Some(FnAddress { addr, _f: PhantomData })
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
        assert_eq!(a.to_wire(), double as Double as usize as u64);
        assert_eq!((a.get())(21), 42);
        // SAFETY: rule FA2 — the word comes from `to_wire` of an `FnAddress<Double>` here.
        let back = unsafe { FnAddress::<Double>::from_wire(a.to_wire()) }.unwrap();
        assert_eq!((back.get())(4), 8);
    }

    #[test]
    fn zero_is_refused() {
        // SAFETY: 0 is refused before any function is built from it.
        assert!(unsafe { FnAddress::<Double>::from_wire(0) }.is_none());
    }
}
