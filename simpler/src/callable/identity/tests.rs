use super::*;

/// sha256 of the descriptor built in `host_fn_descriptor_matches_canonical_bytes`, computed
/// independently with:
///
/// ```text
/// python3 -c 'import hashlib,struct
/// u=lambda v: struct.pack("<I",v)
/// s=lambda b: u(len(b))+b
/// b=u(1)+u(2)+u(1)+s(b"double")+s(b"my_crate::double")+s(struct.pack("<Q",0x0123456789abcdef))
/// print(hashlib.sha256(b).hexdigest())'
/// ```
const HOST_FN_DIGEST: &str = "sha256:9bdb05460e575faa5d7d05b349cd3b3c7dbd3746c774fe708ecb2ad72e856310";

/// As [`HOST_FN_DIGEST`], for
/// `b=u(1)+u(3)+u(1)+s(b"main")+s(b"app::main")+s(struct.pack("<Q",42))`.
const ORCH_FN_DIGEST: &str = "sha256:c381873c393c8a7df4b15de8f6abf80d12ceb81953614327770e4287a3219813";

fn le(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}

/// The canonical bytes, built by hand from the documented encoding.
fn expected_fn_bytes(kind: u32, name: &str, type_name: &str, type_hash: u64) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&le(1)); // schema_version
    b.extend_from_slice(&le(kind));
    b.extend_from_slice(&le(1)); // payload_format_version
    b.extend_from_slice(&le(name.len() as u32));
    b.extend_from_slice(name.as_bytes());
    b.extend_from_slice(&le(type_name.len() as u32));
    b.extend_from_slice(type_name.as_bytes());
    b.extend_from_slice(&le(8));
    b.extend_from_slice(&type_hash.to_le_bytes());
    b
}

#[test]
fn host_fn_descriptor_matches_canonical_bytes() {
    let d = host_fn_descriptor("double", "my_crate::double", 0x0123_4567_89ab_cdef);
    let expected = expected_fn_bytes(2, "double", "my_crate::double", 0x0123_4567_89ab_cdef);
    assert_eq!(d.bytes(), &expected[..]);
    assert_eq!(
        hex_of(d.bytes()),
        "01000000020000000100000006000000646f75626c65100000006d795f63726174653a3a646f75626c65\
         08000000efcdab8967452301"
    );
    assert_eq!(d.kind(), CallableKind::HostFn);
    assert_eq!(d.digest().to_string(), HOST_FN_DIGEST);
    assert_eq!(d.digest(), Digest::parse(HOST_FN_DIGEST).unwrap());
}

#[test]
fn orch_fn_descriptor_matches_canonical_bytes() {
    let d = orch_fn_descriptor("main", "app::main", 42);
    assert_eq!(d.bytes(), &expected_fn_bytes(3, "main", "app::main", 42)[..]);
    assert_eq!(d.kind(), CallableKind::Orch);
    assert_eq!(d.digest().to_string(), ORCH_FN_DIGEST);
}

#[test]
fn descriptors_differ_by_kind_and_fields() {
    let a = host_fn_descriptor("f", "t", 1);
    assert_ne!(a.digest(), orch_fn_descriptor("f", "t", 1).digest());
    assert_ne!(a.digest(), host_fn_descriptor("f", "t", 2).digest());
    // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
    assert_ne!(host_fn_descriptor("ab", "c", 0).digest(), host_fn_descriptor("a", "bc", 0).digest());
    assert_eq!(a, host_fn_descriptor("f", "t", 1));
}

#[test]
fn writer_encodes_every_field_type() {
    let mut w = DescriptorWriter::new(CallableKind::Chip);
    w.u32(0xdead_beef).str("hi").bytes(&[9, 8]).u8(1).u32(2);
    let d = w.finish();
    let mut expected = vec![1, 0, 0, 0, 1, 0, 0, 0];
    expected.extend_from_slice(&[0xef, 0xbe, 0xad, 0xde]);
    expected.extend_from_slice(&[2, 0, 0, 0, b'h', b'i']);
    expected.extend_from_slice(&[2, 0, 0, 0, 9, 8]);
    expected.push(1);
    expected.extend_from_slice(&[2, 0, 0, 0]);
    assert_eq!(d.bytes(), &expected[..]);
    assert_eq!(d.kind(), CallableKind::Chip);
    assert_eq!(d.digest(), Digest::of(&expected));
}

fn hex_of(bytes: &[u8]) -> String {
    let mut s = String::new();
    push_hex(&mut s, bytes);
    s
}

#[test]
fn display_parse_round_trip() {
    let d = Digest::of(b"round trip");
    let text = d.to_string();
    assert!(text.starts_with("sha256:"));
    assert_eq!(text.len(), 7 + 64);
    assert_eq!(format!("{d:?}"), text);
    assert_eq!(Digest::parse(&text).unwrap(), d);
    assert_eq!(text.parse::<Digest>().unwrap(), d);
    assert_eq!(d.short(), text[..7 + 12]);

    let all = Digest::from_bytes(std::array::from_fn(|i| (i * 8 + 3) as u8));
    assert_eq!(Digest::parse(&all.to_string()).unwrap(), all);
    assert_eq!(all.as_bytes()[31], 31 * 8 + 3);
}

#[test]
fn display_respects_padding() {
    let d = Digest::from_bytes([0; 32]);
    assert_eq!(format!("{d:>75}").len(), 75);
}

fn assert_format_invalid(s: &str) {
    let err = Digest::parse(s).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{s:?}");
    assert!(err.message().starts_with("HASHID_FORMAT_INVALID: "), "{err}");
}

#[test]
fn parse_rejects_malformed() {
    let good = Digest::of(b"x").to_string();
    let hex = &good[7..];
    // Uppercase.
    assert_format_invalid(&good.to_uppercase());
    assert_format_invalid(&format!("sha256:{}", hex.to_uppercase()));
    // Wrong prefix.
    assert_format_invalid(&format!("sha512:{hex}"));
    assert_format_invalid(&format!("SHA256:{hex}"));
    assert_format_invalid(hex);
    assert_format_invalid(&format!(" {good}"));
    // Wrong length.
    assert_format_invalid(&good[..good.len() - 1]);
    assert_format_invalid(&format!("{good}0"));
    assert_format_invalid("sha256:");
    assert_format_invalid("");
    // Non-hex.
    assert_format_invalid(&format!("sha256:{}g", &hex[..63]));
    assert_format_invalid(&format!("sha256:{}é", &hex[..62]));
    assert_format_invalid(&format!("sha256:{}-1", &hex[..62]));
}

#[test]
fn parse_error_message_is_bounded() {
    let huge = "é".repeat(10_000);
    let err = Digest::parse(&huge).unwrap_err();
    assert!(err.message().len() < 400, "{}", err.message().len());
}

#[test]
fn kinds_and_namespaces() {
    for (v, kind, ns) in [
        (1, CallableKind::Chip, Namespace::LocalChip),
        (2, CallableKind::HostFn, Namespace::LocalHost),
        (3, CallableKind::Orch, Namespace::LocalHost),
    ] {
        assert_eq!(CallableKind::from_u32(v).unwrap(), kind);
        assert_eq!(kind as u32, v);
        assert_eq!(kind.namespace(), ns);
    }
    for v in [0, 4, u32::MAX] {
        let err = CallableKind::from_u32(v).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Callable);
        assert!(err.message().starts_with("CALLABLE_KIND_UNSUPPORTED: "), "{err}");
    }
    assert_eq!(CallableKind::Chip.name(), "chip");
    assert_eq!(CallableKind::HostFn.name(), "host function");
    assert_eq!(CallableKind::Orch.name(), "orchestration");
}

#[test]
fn descriptor_from_bytes_round_trip() {
    let d = host_fn_descriptor("double", "my_crate::double", 7);
    let back = Descriptor::from_bytes(d.bytes().to_vec()).unwrap();
    assert_eq!(back, d);
    // The header alone is accepted: the payload is opaque.
    let header = Descriptor::from_bytes(vec![1, 0, 0, 0, 1, 0, 0, 0]).unwrap();
    assert_eq!(header.kind(), CallableKind::Chip);
}

#[test]
fn descriptor_from_bytes_rejects_bad_headers() {
    let mut schema2 = host_fn_descriptor("f", "t", 0).bytes().to_vec();
    schema2[0] = 2;
    let err = Descriptor::from_bytes(schema2).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode);
    assert!(err.message().contains("schema version 2"), "{err}");

    let mut unknown = host_fn_descriptor("f", "t", 0).bytes().to_vec();
    unknown[4] = 7;
    let err = Descriptor::from_bytes(unknown).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Callable);
    assert!(err.message().starts_with("CALLABLE_KIND_UNSUPPORTED: "), "{err}");

    for len in 0..8 {
        let truncated = host_fn_descriptor("f", "t", 0).bytes()[..len].to_vec();
        let err = Descriptor::from_bytes(truncated).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Decode);
        assert!(err.message().contains("truncated"), "{err}");
    }
}

#[test]
fn handle_accessors_and_formatting() {
    let d = host_fn_descriptor("double", "my_crate::double", 0x0123_4567_89ab_cdef);
    let h = CallableHandle::new(d.digest(), d.kind(), "double");
    assert_eq!(h.digest(), d.digest());
    assert_eq!(h.kind(), CallableKind::HostFn);
    assert_eq!(h.namespace(), Namespace::LocalHost);
    assert_eq!(h.name(), "double");
    assert_eq!(h.to_string(), "`double` (sha256:9bdb05460e57)");
    assert_eq!(
        format!("{h:?}"),
        format!("CallableHandle {{ name: \"double\", kind: HostFn, digest: {HOST_FN_DIGEST} }}")
    );
    assert_eq!(h.clone(), h);
}

#[test]
fn handle_is_send_sync() {
    fn assert_bounds<T: Send + Sync + 'static>() {}
    assert_bounds::<CallableHandle>();
    assert_bounds::<Digest>();
}
