//! The canonical descriptor of a `#[callable]` and its sha256 digest, computed at compile time.
//!
//! Layout (all integers little-endian `u32`; a string or byte array is its `u32` length then its
//! bytes):
//!
//! ```text
//! u32 schema_version = 1
//! u32 kind                     1 chip, 2 host function, 3 orchestration
//! u32 payload_format_version = 2
//! str path                     "<crate>::<fn name>"
//! u32 subkind                  0, or for chip callables 1 kernel / 2 chip orchestration /
//!                              3 kernel with OpenCL source (`opencl = "file.cl"`)
//! u32 param_count
//!   per parameter: str name, u32 mode (1 In, 2 Out, 3 InOut, 4 scalar), str type
//! bytes token_hash             sha256 of the item's token text (32 bytes)
//! subkind 3 only:
//!   str language               "opencl-c"
//!   str entry                  the kernel function's name in the source
//!   bytes source_hash          sha256 of the source text (32 bytes)
//! ```
//!
//! The trailer of sub-kind 3 makes the digest cover the device source: editing only the `.cl`
//! file gives another callable. Descriptors of every other sub-kind are as they were.

use sha2::{Digest as _, Sha256};

use crate::model::Param;

/// The canonical bytes and their digest.
pub(crate) struct Descriptor {
    pub(crate) bytes: Vec<u8>,
    pub(crate) digest: [u8; 32],
}

fn u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

/// The language tag of OpenCL C sources (as `simpler::chip::KernelSource` names it).
const OPENCL_C: &str = "opencl-c";

/// Builds the descriptor of a callable.
pub(crate) fn build(kind: u32, path: &str, subkind: u32, params: &[Param], tokens: &str) -> Descriptor {
    build_with_source(kind, path, subkind, params, tokens, None)
}

/// Builds the descriptor of a callable; a kernel with OpenCL C `source` (`(entry, text)`,
/// sub-kind 3) gets the trailer that covers it.
pub(crate) fn build_with_source(
    kind: u32,
    path: &str,
    subkind: u32,
    params: &[Param],
    tokens: &str,
    source: Option<(&str, &str)>,
) -> Descriptor {
    let mut out = Vec::with_capacity(128);
    u32(&mut out, 1);
    u32(&mut out, kind);
    u32(&mut out, 2);
    bytes(&mut out, path.as_bytes());
    u32(&mut out, subkind);
    u32(&mut out, params.len() as u32);
    for p in params {
        bytes(&mut out, p.ident.to_string().as_bytes());
        u32(&mut out, p.mode_code());
        bytes(&mut out, p.type_name().as_bytes());
    }
    let token_hash: [u8; 32] = Sha256::digest(tokens.as_bytes()).into();
    bytes(&mut out, &token_hash);
    if let Some((entry, text)) = source {
        bytes(&mut out, OPENCL_C.as_bytes());
        bytes(&mut out, entry.as_bytes());
        let source_hash: [u8; 32] = Sha256::digest(text.as_bytes()).into();
        bytes(&mut out, &source_hash);
    }
    let digest: [u8; 32] = Sha256::digest(&out).into();
    Descriptor { bytes: out, digest }
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;
    use crate::ctxt::Ctxt;
    use crate::model::classify;

    fn params(sig: proc_macro2::TokenStream) -> Vec<Param> {
        let f: syn::ItemFn = syn::parse2(quote!(fn f(#sig) {})).unwrap();
        let mut cx = Ctxt::default();
        f.sig
            .inputs
            .iter()
            .map(|a| {
                let syn::FnArg::Typed(pt) = a else { panic!() };
                let syn::Pat::Ident(pi) = &*pt.pat else { panic!() };
                Param {
                    ident: pi.ident.clone(),
                    ty: classify(&mut cx, &pt.ty).unwrap(),
                    decl: (*pt.ty).clone(),
                }
            })
            .collect()
    }

    #[test]
    fn same_input_same_digest() {
        let a = build(2, "c::f", 0, &params(quote!(x: In<f32>, n: u64)), "fn f() {}");
        let b = build(2, "c::f", 0, &params(quote!(x: In<f32>, n: u64)), "fn f() {}");
        assert_eq!(a.digest, b.digest);
        assert_eq!(a.bytes, b.bytes);
    }

    #[test]
    fn body_signature_and_kind_change_the_digest() {
        let base = build(2, "c::f", 0, &params(quote!(x: In<f32>)), "fn f() {}");
        let body = build(2, "c::f", 0, &params(quote!(x: In<f32>)), "fn f() { 1 }");
        let elem = build(2, "c::f", 0, &params(quote!(x: In<i32>)), "fn f() {}");
        let mode = build(2, "c::f", 0, &params(quote!(x: InOut<f32>)), "fn f() {}");
        let kind = build(1, "c::f", 1, &params(quote!(x: In<f32>)), "fn f() {}");
        for other in [&body, &elem, &mode, &kind] {
            assert_ne!(base.digest, other.digest);
        }
    }

    #[test]
    fn the_opencl_source_text_and_entry_change_the_digest() {
        let p = || params(quote!(x: InOut<f32>, k: f32));
        let src = "__kernel void f(__global float* x, float k) { x[get_global_id(0)] *= k; }";
        let with = |entry, text| build_with_source(1, "c::f", 3, &p(), "fn f() {}", Some((entry, text)));
        let base = with("f", src);
        assert_eq!(base.bytes, with("f", src).bytes, "deterministic");
        let edited_src = src.replace("*=", "+=");
        let edited = with("f", &edited_src);
        assert_ne!(base.bytes, edited.bytes, "only the .cl text differs");
        assert_ne!(base.digest, edited.digest);
        assert_ne!(base.digest, with("g", src).digest, "the entry counts");
        // Without source (sub-kind 1), the descriptor is the one `build` always wrote.
        let plain = build(1, "c::f", 1, &p(), "fn f() {}");
        assert_eq!(plain.bytes, build_with_source(1, "c::f", 1, &p(), "fn f() {}", None).bytes);
        assert_ne!(base.digest, plain.digest);
        // The trailer is language, entry and the text's sha256, after the token hash.
        let mut tail = Vec::new();
        bytes(&mut tail, b"opencl-c");
        bytes(&mut tail, b"f");
        bytes(&mut tail, &Sha256::digest(src.as_bytes()));
        assert!(base.bytes.ends_with(&tail));
        assert_eq!(base.bytes[..base.bytes.len() - tail.len()].len(), plain.bytes.len());
    }

    #[test]
    fn layout_is_the_documented_one() {
        let d = build(2, "c::f", 0, &params(quote!(x: In<f32>)), "t");
        let mut want = Vec::new();
        for v in [1u32, 2, 2, 4] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        want.extend_from_slice(b"c::f");
        want.extend_from_slice(&0u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(b"x");
        want.extend_from_slice(&1u32.to_le_bytes());
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(b"f32");
        want.extend_from_slice(&32u32.to_le_bytes());
        want.extend_from_slice(&Sha256::digest(b"t"));
        assert_eq!(d.bytes, want);
        assert_eq!(d.digest, <[u8; 32]>::from(Sha256::digest(&want)));
    }
}
