use super::*;
use crate::error::ErrorKind;

use DataType::{Float32, Int32, Uint8};
use Param::{Scalar, Tensor};

fn parse(text: &str, entry: &str) -> Option<Vec<Param>> {
    KernelSignature::parse_opencl(text, entry).map(|s| s.params().to_vec())
}

#[test]
fn plain_kernels_give_tensors_with_their_element_types_then_scalars() {
    let vadd = "__kernel void vadd(__global const float* a, __global const float* b, __global float* c) {}";
    assert_eq!(parse(vadd, "vadd"), Some(vec![Tensor(Some(Float32)); 3]));
    let saxpy = "kernel void saxpy(global const float *x, global float * restrict y, float a, int plus)\n{ }";
    assert_eq!(
        parse(saxpy, "saxpy"),
        Some(vec![Tensor(Some(Float32)), Tensor(Some(Float32)), Scalar, Scalar])
    );
    assert_eq!(parse("__kernel void k(void) {}", "k"), Some(vec![]));
    assert_eq!(parse("__kernel void k() {}", "k"), Some(vec![]));
    let types = "__kernel void t(__global uchar* a, __global unsigned char* b, __global int* c, __global unsigned int* d,
                 __global double* e, __global float4* f, __global void* g, __global half* h, __global ulong* i) {}";
    assert_eq!(
        parse(types, "t"),
        Some(vec![
            Tensor(Some(Uint8)),
            Tensor(Some(Uint8)),
            Tensor(Some(Int32)),
            Tensor(Some(DataType::Uint32)),
            Tensor(Some(DataType::Float64)),
            Tensor(None),
            Tensor(None),
            Tensor(Some(DataType::Float16)),
            Tensor(Some(DataType::Uint64)),
        ])
    );
}

#[test]
fn comments_attributes_literals_and_other_functions_are_read_past() {
    let text = r#"
        // __kernel void k(__global float* not_this) {}
        /* __kernel void k(int also_not_this) {} */
        #define TILE 64
        float helper(float x) { return k(x); /* a call, not the kernel */ }
        constant char* note = "k(// not a comment";
        __kernel __attribute__((reqd_work_group_size(TILE, 1, 1)))
        void k(__global float* x, /* the count */ uint n __attribute__((unused)), // trailing
               float scale) {
            x[0] = helper(scale);
        }"#;
    assert_eq!(parse(text, "k"), Some(vec![Tensor(Some(Float32)), Scalar, Scalar]));
    let s = KernelSignature::parse_opencl(text, "k").unwrap();
    assert_eq!(&*s.decls[1], "uint n __attribute__((unused))");
    // A prototype before the definition is no second opinion.
    let proto = "__kernel void k(__global float*, int);\n__kernel void k(__global float* x, int n) {}";
    assert_eq!(parse(proto, "k"), Some(vec![Tensor(Some(Float32)), Scalar]));
}

#[test]
fn what_it_cannot_tell_gives_no_signature() {
    for (text, why) in [
        ("__kernel void other(__global float* x) {}", "no such kernel"),
        ("void k(__global float* x) {}", "not a kernel"),
        ("#define ARGS __global float* x, int n\n__kernel void k(ARGS) {}", "a macro for the parameters"),
        ("__kernel void k(PARAMS) {}", "one word: a macro from an include"),
        ("#define REAL float\n__kernel void k(__global REAL* x) {}", "a macro in a parameter"),
        ("__kernel void k(__global float* x, __local float* tmp) {}", "a __local pointer"),
        ("__kernel void k(__constant float* x) {}", "a __constant pointer"),
        ("__kernel void k(__global float** x) {}", "a pointer to a pointer"),
        ("__kernel void k(float x[4]) {}", "an array"),
        (
            "#ifdef A\n__kernel void k(__global float* x) {}\n#else\n__kernel void k(__global int* x, int n) {}\n#endif",
            "two definitions that differ",
        ),
        ("__kernel void k(__global float* x", "unbalanced"),
        ("", "empty"),
    ] {
        assert_eq!(parse(text, "k"), None, "{why}: {text}");
    }
}

fn sig(text: &str, entry: &str) -> KernelSignature {
    KernelSignature::parse_opencl(text, entry).expect("a signature")
}

#[test]
fn a_matching_task_passes_and_a_mismatch_names_the_kernel_what_it_declares_and_what_was_passed() {
    let s =
        sig("__kernel void saxpy(__global const float* x, __global float* y, float a, int plus) {}", "saxpy");
    let who = "`saxpy` (sha256:0123456789ab)";
    s.check(&who, [Float32, Float32].into_iter(), 2).unwrap();

    let e = s.check(&who, [Float32].into_iter(), 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        e.message(),
        "kernel `saxpy` (sha256:0123456789ab): the task passed 1 tensor (f32) and 2 scalars, but its OpenCL C source declares `saxpy(__global const float* x, __global float* y, float a, int plus)`: 2 tensors (f32, f32), then 2 scalars"
    );
    let e = s.check(&who, [Float32, Float32].into_iter(), 3).unwrap_err();
    assert!(e.message().contains("passed 2 tensors (f32, f32) and 3 scalars"), "{e}");

    let e = s.check(&who, [Float32, Int32].into_iter(), 2).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        e.message(),
        "kernel `saxpy` (sha256:0123456789ab): tensor 1 holds i32 elements, but its OpenCL C source declares `saxpy(__global const float* x, __global float* y, float a, int plus)`, whose tensor 1 (`__global float* y`) holds f32"
    );
}

#[test]
fn untyped_and_byte_parameters_take_what_opencl_c_has_no_name_for() {
    let s = sig("__kernel void k(__global void* any, __global uchar* bytes, __global ushort* words) {}", "k");
    s.check(&"k", [Int32, DataType::Bool, DataType::BFloat16].into_iter(), 0).unwrap();
    s.check(&"k", [Float32, DataType::Fp8E4M3Fn, DataType::Uint16].into_iter(), 0).unwrap();
    let e = s.check(&"k", [Float32, Float32, DataType::Uint16].into_iter(), 0).unwrap_err();
    assert!(e.message().contains("tensor 1 holds f32"), "{e}");
    let e = s.check(&"k", [].into_iter(), 0).unwrap_err();
    assert!(
        e.message().contains("passed 0 tensors and 0 scalars")
            && e.message().contains("3 tensors (any, u8, u16)"),
        "{e}"
    );
}

#[test]
fn a_scalar_before_a_tensor_can_never_be_called() {
    let s = sig("__kernel void k(__global float* x, int n, __global float* y) {}", "k");
    assert_eq!(s.params(), [Tensor(Some(Float32)), Scalar, Tensor(Some(Float32))]);
    let e = s.check(&"`k`", [Float32, Float32].into_iter(), 1).unwrap_err();
    assert!(
        e.message().contains("scalar before a __global pointer")
            && e.message().contains("declare the __global pointers first"),
        "{e}"
    );
}

#[test]
fn any_text_parses_without_panicking() {
    let text = "#define A(x) \\\n  x\n/* é */ __kernel void k(__global float* x, 'c', \"s\\\"//\", \\ int n) { k(1); }\n// end 'é";
    for (cut, _) in text.char_indices() {
        for entry in ["k", "x", ""] {
            let _ = KernelSignature::parse_opencl(&text[..cut], entry);
            let _ = KernelSignature::parse_opencl(&text[cut..], entry);
        }
    }
}
