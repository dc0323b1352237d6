//! The launch checks, without a GPU: arguments are encoded against signatures read from
//! sources, with views that name a device but no memory.

use super::*;

const SRC: &str = r#"
struct Dims { int rank; long long shape[6]; };
#define INSTANCES(T, TAG) \
extern "C" __global__ void scale_##TAG(T* y, const T* x, long n, float k, int relu) {} \
extern "C" __global__ void copy_##TAG(const T* a, T* y, Dims d, long long n) {}
INSTANCES(float, f32)
extern "C" __global__ void advance(unsigned* st, int scaled, double lr, unsigned u,
                                   unsigned long long seed) {}
"#;

fn sig(name: &str, struct_size: Option<usize>) -> Signature {
    let declared = signature::kernels(SRC)[name].clone().unwrap();
    let sizes = declared
        .iter()
        .map(|d| d.param.size().or(struct_size))
        .collect();
    Signature { declared, sizes }
}

fn words(slot: &Slot) -> Vec<u64> {
    slot.0.clone()
}

#[test]
fn matching_arguments_encode_in_the_declared_widths() {
    let (y, x) = (View::fake(0x1000, 64, 0), View::fake(0x2000, 64, 0));
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(x),
        Arg::Size(16),
        Arg::F32(0.5),
        Arg::Bool(true),
    ];
    let slots = encode("scale_f32", &sig("scale_f32", None), 0, &args).unwrap();
    assert_eq!(words(&slots[0]), [0x1000]);
    assert_eq!(words(&slots[1]), [0x2000]);
    assert_eq!(words(&slots[2]), [16]);
    assert_eq!(slots[3].0[0] as u32, 0.5f32.to_bits());
    assert_eq!(slots[4].0[0] as u32, 1);
    // optional pointers, exact kinds
    let args = [
        Arg::opt(None),
        Arg::I32(1),
        Arg::F64(1e-3),
        Arg::U32(7),
        Arg::U64(u64::MAX),
    ];
    let slots = encode("advance", &sig("advance", None), 0, &args).unwrap();
    assert_eq!(words(&slots[0]), [0]);
    assert_eq!(words(&slots[2]), [1e-3f64.to_bits()]);
    assert_eq!(words(&slots[4]), [u64::MAX]);
}

#[test]
fn a_wrong_count_is_an_error() {
    let e = encode("advance", &sig("advance", None), 0, &[Arg::Null]).err();
    assert_eq!(
        e,
        Some(KernelError::Count {
            kernel: "advance".into(),
            declared: 5,
            given: 1
        })
    );
}

#[test]
fn a_wrong_kind_is_an_error_naming_the_parameter() {
    let y = View::fake(0x1000, 64, 0);
    let cases: [(usize, [Arg<'_>; 5]); 4] = [
        // an integer where a pointer is declared
        (
            0,
            [
                Arg::Size(1),
                Arg::Ptr(y),
                Arg::Size(1),
                Arg::F32(1.0),
                Arg::I32(0),
            ],
        ),
        // an i32 where a long is declared (widths are not widened silently)
        (
            2,
            [
                Arg::Ptr(y),
                Arg::Ptr(y),
                Arg::I32(1),
                Arg::F32(1.0),
                Arg::I32(0),
            ],
        ),
        // a double where a float is declared
        (
            3,
            [
                Arg::Ptr(y),
                Arg::Ptr(y),
                Arg::I64(1),
                Arg::F64(1.0),
                Arg::I32(0),
            ],
        ),
        // a pointer where an int is declared
        (
            4,
            [
                Arg::Ptr(y),
                Arg::Ptr(y),
                Arg::I64(1),
                Arg::F32(1.0),
                Arg::Ptr(y),
            ],
        ),
    ];
    for (bad, args) in cases {
        match encode("scale_f32", &sig("scale_f32", None), 0, &args) {
            Err(KernelError::Kind { index, param, .. }) => {
                assert_eq!(index, bad);
                let names = ["y", "x", "n", "k", "relu"];
                assert_eq!(param, names[bad]);
            }
            other => panic!("argument {bad}: {:?}", other.err()),
        }
    }
    // unsigned where int is declared, and the reverse
    let s = sig("advance", None);
    let args = [
        Arg::Null,
        Arg::U32(1),
        Arg::F64(0.0),
        Arg::U32(0),
        Arg::U64(0),
    ];
    assert!(matches!(
        encode("advance", &s, 0, &args),
        Err(KernelError::Kind { index: 1, .. })
    ));
    let args = [
        Arg::Null,
        Arg::I32(1),
        Arg::F64(0.0),
        Arg::I32(0),
        Arg::U64(0),
    ];
    assert!(matches!(
        encode("advance", &s, 0, &args),
        Err(KernelError::Kind { index: 3, .. })
    ));
}

#[test]
fn sizes_that_do_not_fit_are_errors_not_truncations() {
    let y = View::fake(0x1000, 64, 0);
    let s = sig("scale_f32", None);
    // relu is an int: 2^31 does not fit
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Size(1),
        Arg::F32(1.0),
        Arg::Size(1 << 31),
    ];
    match encode("scale_f32", &s, 0, &args) {
        Err(KernelError::Range { index, value, .. }) => {
            assert_eq!((index, value.as_str()), (4, "2147483648"));
        }
        other => panic!("{:?}", other.err()),
    }
    // the largest that fits does
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Size(usize::MAX >> 1),
        Arg::F32(1.0),
        Arg::Size(i32::MAX as usize),
    ];
    let slots = encode("scale_f32", &s, 0, &args).unwrap();
    assert_eq!(words(&slots[2]), [i64::MAX as u64]);
    // a long takes no more than i64::MAX
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Size(usize::MAX),
        Arg::F32(1.0),
        Arg::I32(0),
    ];
    assert!(matches!(
        encode("scale_f32", &s, 0, &args),
        Err(KernelError::Range { index: 2, .. })
    ));
    // an unsigned takes 2^32 - 1, not 2^32
    let a = sig("advance", None);
    let ok = [
        Arg::Null,
        Arg::I32(0),
        Arg::F64(0.0),
        Arg::Size(u32::MAX as usize),
        Arg::Size(usize::MAX),
    ];
    assert!(encode("advance", &a, 0, &ok).is_ok());
    let too_big = [
        Arg::Null,
        Arg::I32(0),
        Arg::F64(0.0),
        Arg::Size(1 << 32),
        Arg::U64(0),
    ];
    assert!(matches!(
        encode("advance", &a, 0, &too_big),
        Err(KernelError::Range { index: 3, .. })
    ));
}

#[test]
fn memory_of_another_device_is_an_error() {
    let (here, there) = (View::fake(0x1000, 64, 1), View::fake(0x2000, 64, 0));
    let args = [
        Arg::Ptr(here),
        Arg::Ptr(there),
        Arg::I64(1),
        Arg::F32(1.0),
        Arg::I32(0),
    ];
    assert_eq!(
        encode("scale_f32", &sig("scale_f32", None), 1, &args).err(),
        Some(KernelError::Device {
            kernel: "scale_f32".into(),
            index: 1,
            param: "x".into(),
            memory: 0,
            module: 1
        })
    );
}

#[test]
fn structs_must_have_the_declared_name_and_the_compiled_size() {
    let y = View::fake(0x1000, 64, 0);
    let dims = [0u8; 56];
    let s = sig("copy_f32", Some(56));
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Struct("Dims", &dims),
        Arg::I64(3),
    ];
    let slots = encode("copy_f32", &s, 0, &args).unwrap();
    assert_eq!(slots[2].0.len(), 7);
    let short = [0u8; 48];
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Struct("Dims", &short),
        Arg::I64(3),
    ];
    assert!(matches!(
        encode("copy_f32", &s, 0, &args),
        Err(KernelError::StructSize {
            declared: 56,
            given: 48,
            ..
        })
    ));
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Struct("Other", &dims),
        Arg::I64(3),
    ];
    assert!(matches!(
        encode("copy_f32", &s, 0, &args),
        Err(KernelError::Kind { index: 2, .. })
    ));
    // without the driver's size a struct cannot be checked, so it is refused
    let unknown = sig("copy_f32", None);
    let args = [
        Arg::Ptr(y),
        Arg::Ptr(y),
        Arg::Struct("Dims", &dims),
        Arg::I64(3),
    ];
    assert!(matches!(
        encode("copy_f32", &unknown, 0, &args),
        Err(KernelError::Signature { .. })
    ));
}

#[test]
fn launch_shapes_are_checked() {
    assert_eq!(grid_for(0), Launch::new((1, 1, 1), (256, 1, 1)));
    assert_eq!(grid_for(257), Launch::new((2, 1, 1), (256, 1, 1)));
    assert_eq!(grid_for(usize::MAX).grid.0, 65_535 * 8);
    assert!(check_shape("k", Launch::new((1, 1, 1), (1024, 1, 1))).is_ok());
    assert!(check_shape("k", Launch::new((1, 1, 1), (32, 32, 2))).is_err());
    assert!(check_shape("k", Launch::new((0, 1, 1), (32, 1, 1))).is_err());
}

#[test]
fn half_and_tag_are_what_every_module_shares() {
    assert_eq!(tag(DType::Tf32), "f32");
    assert_eq!(tag(DType::Bf16), "bf16");
    assert!(HALF.contains("struct H") && HALF.contains("from_f<B>"));
}

#[test]
fn signature_differences_name_every_mismatch_and_every_unexpected_kernel() {
    let source = KernelSource {
        stem: "t",
        source: "extern \"C\" __global__ void a(float* x, int n) {}\n\
                 extern \"C\" __global__ void b(double s) {}\n"
            .into(),
        names: vec!["a".into(), "b".into()],
    };
    assert!(source
        .signature_differences(&[("a", "p i"), ("b", "d")], &[])
        .is_empty());
    let d = source.signature_differences(&[("a", "p l")], &[]);
    assert_eq!(d.len(), 2, "{d:?}");
    assert!(d[0].starts_with("a:"), "{d:?}");
    assert_eq!(d[1], "b: no expected signature");
    let d = source.signature_differences(&[("a", "p x"), ("b", "d")], &[]);
    assert!(d[0].contains("unknown parameter letter"), "{d:?}");
    // a kernel of the source that the module does not load is named
    let unloaded = KernelSource {
        names: vec!["a".into()],
        ..source
    };
    let d = unloaded.signature_differences(&[("a", "p i")], &[]);
    assert_eq!(
        d,
        ["b: declared in the source but not among the names t loads"],
        "{d:?}"
    );
}
