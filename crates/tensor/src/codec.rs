//! The one codec between values and the bytes of a dtype's storage (machine byte order, which is
//! what the GPU reads): f32/f64 values in, storage bytes out, and back. Byte views go through
//! `bytemuck` (with `half`'s f16 and bf16), so no caller writes its own `to_ne_bytes` loop.
//! fp8 E4M3 is one byte an element, encoded here ([`e4m3_from_f64`], [`e4m3_to_f64`]).

use crate::DType;
use half::{bf16, f16};
use rayon::prelude::*;

/// Arrays of at least this many values are converted on every core (a ResNet-50 batch's maps
/// are tens of millions: one thread's conversion was a benchmark row's tenth of a second).
const PAR_MIN: usize = 1 << 20;
/// Values a task converts.
const PART: usize = 1 << 16;

/// `f` of each value, in order: on every core for a large array (the same values either way).
fn map_all<A: Sync, B: Send + Copy + Default>(src: &[A], f: impl Fn(&A) -> B + Sync) -> Vec<B> {
    if src.len() < PAR_MIN {
        return src.iter().map(f).collect();
    }
    let mut out = vec![B::default(); src.len()];
    out.par_chunks_mut(PART)
        .zip(src.par_chunks(PART))
        .for_each(|(o, s)| o.iter_mut().zip(s).for_each(|(d, x)| *d = f(x)));
    out
}

/// `v` rounded to f32 "to odd": exact values stay, inexact ones become the neighbour whose last
/// bit is odd. Rounding that to nearest in a format of at most 22 significant bits (f16, bf16)
/// gives the correctly rounded value of `v` itself; half's own f64 conversions do not (they
/// drop the low mantissa bits or round through f32 first).
pub(crate) fn f64_to_f32_round_odd(v: f64) -> f32 {
    let r = v as f32;
    if v.is_nan() || f64::from(r) == v || r.to_bits() & 1 == 1 {
        return r;
    }
    // r is the even neighbour: step one unit of the magnitude toward v (an infinity steps to
    // the largest finite value, a zero to the smallest subnormal, signs kept).
    let bits = if f64::from(r).abs() > v.abs() {
        r.to_bits() - 1
    } else {
        r.to_bits() + 1
    };
    f32::from_bits(bits)
}

/// The largest finite E4M3 value.
pub const E4M3_MAX: f64 = 448.0;

/// `v` as fp8 E4M3 ("fn": no infinities; 0x7f and 0xff are NaN), rounded to nearest with ties
/// to even; a magnitude beyond 448 (infinity too) saturates to ±448, NaN stays NaN.
pub fn e4m3_from_f64(v: f64) -> u8 {
    let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
    if v.is_nan() {
        return sign | 0x7f;
    }
    let a = v.abs();
    if a >= E4M3_MAX {
        return sign | 0x7e;
    }
    // below 2^-6 the values are subnormal: multiples of 2^-9 (8 of them make 2^-6, exponent 1)
    if a < 2f64.powi(-6) {
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // a normal f64 here: its unbiased exponent e is in -6..=8; 8 steps of 2^(e-3) per octave
    let e = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    // 2^(3-e) built from its bits (3-e is in -5..=9): exact, and no powi in a loop drawing
    // hundreds of millions of operands
    let scale = f64::from_bits(((1023 + 3 - e) as u64) << 52);
    let q = (a * scale).round_ties_even() as u32; // 8..=16, exact scaling
    let (e, q) = if q == 16 { (e + 1, 8) } else { (e, q) };
    // 448 < a rounds down to 448 (handled above), so the code stays below the NaN pattern
    sign | (((e + 7) as u8) << 3) | (q - 8) as u8
}

/// The value of the fp8 E4M3 byte `b` (exact in f64; NaN for 0x7f and 0xff).
pub fn e4m3_to_f64(b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let mant = f64::from(b & 0x07);
    if exp == 15 && mant == 7.0 {
        return f64::NAN;
    }
    if exp == 0 {
        sign * mant * 2f64.powi(-9)
    } else {
        sign * (1.0 + mant / 8.0) * 2f64.powi(exp - 7)
    }
}

/// The elements of `bytes` as `T` (copied when `bytes` is not aligned for `T`; a trailing
/// partial element is ignored).
fn elems<T: bytemuck::Pod>(bytes: &[u8]) -> std::borrow::Cow<'_, [T]> {
    let whole = bytes.len() / std::mem::size_of::<T>() * std::mem::size_of::<T>();
    match bytemuck::try_cast_slice(&bytes[..whole]) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(bytemuck::pod_collect_to_vec(&bytes[..whole])),
    }
}

/// The bytes of a slice of plain values.
pub fn bytes_of<T: bytemuck::Pod>(values: &[T]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// Element `i` of `dtype` storage as f64 (exact), without decoding the rest.
///
/// # Panics
///
/// If `bytes` holds fewer than `i + 1` elements.
pub fn element_f64(bytes: &[u8], dtype: DType, i: usize) -> f64 {
    let e = dtype.size_bytes();
    let b = &bytes[i * e..(i + 1) * e];
    match dtype.storage() {
        DType::F64 => bytemuck::pod_read_unaligned::<f64>(b),
        DType::F16 => bytemuck::pod_read_unaligned::<f16>(b).to_f64(),
        DType::Bf16 => bytemuck::pod_read_unaligned::<bf16>(b).to_f64(),
        DType::F8E4M3 => e4m3_to_f64(b[0]),
        _ => f64::from(bytemuck::pod_read_unaligned::<f32>(b)),
    }
}

/// Values of `dtype` storage as f64 (exact for every dtype).
pub fn decode_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype.storage() {
        DType::F64 => elems::<f64>(bytes).into_owned(),
        DType::F16 => elems::<f16>(bytes).iter().map(|v| v.to_f64()).collect(),
        DType::Bf16 => elems::<bf16>(bytes).iter().map(|v| v.to_f64()).collect(),
        DType::F8E4M3 => bytes.iter().map(|&b| e4m3_to_f64(b)).collect(),
        _ => elems::<f32>(bytes).iter().map(|&v| f64::from(v)).collect(),
    }
}

/// Values of `dtype` storage as f32 (f64 rounded to nearest).
pub fn decode_f32(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype.storage() {
        DType::F64 => map_all(&elems::<f64>(bytes), |&v| v as f32),
        DType::F16 => map_all(&elems::<f16>(bytes), |v| v.to_f32()),
        DType::Bf16 => map_all(&elems::<bf16>(bytes), |v| v.to_f32()),
        // every E4M3 value is exact in f32
        DType::F8E4M3 => map_all(bytes, |&b| e4m3_to_f64(b) as f32),
        _ => elems::<f32>(bytes).into_owned(),
    }
}

/// Values of `dtype` storage as f16 (wider types rounded to nearest; no f64 detour, so an f16
/// operand is read at its own size).
pub fn decode_f16(bytes: &[u8], dtype: DType) -> Vec<f16> {
    match dtype.storage() {
        DType::F16 => elems::<f16>(bytes).into_owned(),
        DType::F64 => elems::<f64>(bytes)
            .iter()
            .map(|&v| f16::from_f64(v))
            .collect(),
        DType::Bf16 => elems::<bf16>(bytes)
            .iter()
            .map(|v| f16::from_f32(v.to_f32()))
            .collect(),
        // every E4M3 value is exact in f16
        DType::F8E4M3 => bytes
            .iter()
            .map(|&b| f16::from_f64(e4m3_to_f64(b)))
            .collect(),
        _ => elems::<f32>(bytes)
            .iter()
            .map(|&v| f16::from_f32(v))
            .collect(),
    }
}

/// `values` stored as `dtype`, each rounded once to nearest (ties to even).
pub fn encode_f64(values: &[f64], dtype: DType) -> Vec<u8> {
    match dtype.storage() {
        DType::F64 => bytes_of(values).to_vec(),
        DType::F16 => {
            let v: Vec<f16> = values
                .iter()
                .map(|&v| f16::from_f32(f64_to_f32_round_odd(v)))
                .collect();
            bytes_of(&v).to_vec()
        }
        DType::Bf16 => {
            let v: Vec<bf16> = values
                .iter()
                .map(|&v| bf16::from_f32(f64_to_f32_round_odd(v)))
                .collect();
            bytes_of(&v).to_vec()
        }
        DType::F8E4M3 => values.iter().map(|&v| e4m3_from_f64(v)).collect(),
        _ => {
            let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            bytes_of(&v).to_vec()
        }
    }
}

/// `values` stored as `dtype`, each rounded to nearest (ties to even).
pub fn encode_f32(values: &[f32], dtype: DType) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * dtype.storage().size_bytes()];
    // the length is exactly the storage's, so the encoding always takes place
    encode_f32_into(values, dtype, &mut out);
    out
}

/// [`encode_f32`] written into `out`, which must hold exactly `values.len()` elements of
/// `dtype`'s storage (a reused or page-locked staging buffer: nothing is allocated); on every
/// core for a large array. False, `out` untouched, when its length does not match.
pub fn encode_f32_into(values: &[f32], dtype: DType, out: &mut [u8]) -> bool {
    let storage = dtype.storage();
    let size = storage.size_bytes();
    if Some(out.len()) != values.len().checked_mul(size) {
        return false;
    }
    let write = |o: &mut [u8], s: &[f32]| match storage {
        DType::F64 => o
            .chunks_exact_mut(8)
            .zip(s)
            .for_each(|(d, &v)| d.copy_from_slice(&f64::from(v).to_ne_bytes())),
        DType::F16 => o
            .chunks_exact_mut(2)
            .zip(s)
            .for_each(|(d, &v)| d.copy_from_slice(&f16::from_f32(v).to_ne_bytes())),
        DType::Bf16 => o
            .chunks_exact_mut(2)
            .zip(s)
            .for_each(|(d, &v)| d.copy_from_slice(&bf16::from_f32(v).to_ne_bytes())),
        DType::F8E4M3 => o
            .iter_mut()
            .zip(s)
            .for_each(|(d, &v)| *d = e4m3_from_f64(f64::from(v))),
        _ => o.copy_from_slice(bytes_of(s)),
    };
    if values.len() < PAR_MIN {
        write(out, values);
    } else {
        out.par_chunks_mut(PART * size)
            .zip(values.par_chunks(PART))
            .for_each(|(o, s)| write(o, s));
    }
    true
}

/// Each value rounded to `dtype`'s storage and back to f32 (the values a GPU row of that dtype
/// actually multiplies).
pub fn round_f32(values: &[f32], dtype: DType) -> Vec<f32> {
    match dtype.storage() {
        DType::F16 | DType::Bf16 | DType::F8E4M3 => decode_f32(&encode_f32(values, dtype), dtype),
        _ => values.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A large array, converted on every core, gives the values one thread's element-by-element
    /// conversion gives (specials, subnormals and ties among them), in order.
    #[test]
    fn large_arrays_convert_as_one_thread_does() {
        let n = PAR_MIN + PART + 12_345;
        let specials = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            65504.0,
            1.0 + f32::EPSILON,
        ];
        let x: Vec<f32> = (0..n)
            .map(|i| match i % 97 {
                k if k < specials.len() => specials[k],
                _ => ((i as f32) * 0.618_034).sin() * 3.0e4 / (1 + i % 1000) as f32,
            })
            .collect();
        for d in [DType::F64, DType::F16, DType::Bf16, DType::F8E4M3] {
            let one: Vec<u8> = match d {
                DType::F64 => x.iter().flat_map(|&v| f64::from(v).to_le_bytes()).collect(),
                DType::F16 => x
                    .iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
                DType::Bf16 => x
                    .iter()
                    .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                    .collect(),
                _ => x.iter().map(|&v| e4m3_from_f64(f64::from(v))).collect(),
            };
            let got = encode_f32(&x, d);
            assert!(got == one, "{d:?}: the encoded bytes differ");
            // into a buffer: the same bytes; a buffer of the wrong length is left alone
            let mut into = vec![0xa5u8; got.len()];
            assert!(encode_f32_into(&x, d, &mut into));
            assert!(into == one, "{d:?}: the bytes encoded into a buffer differ");
            let mut short = vec![0xa5u8; got.len() - 1];
            assert!(!encode_f32_into(&x, d, &mut short));
            assert!(short.iter().all(|&b| b == 0xa5));
            let back = decode_f32(&got, d);
            let want: Vec<u32> = match d {
                DType::F64 => x.iter().map(|v| v.to_bits()).collect(),
                DType::F16 => x
                    .iter()
                    .map(|&v| f16::from_f32(v).to_f32().to_bits())
                    .collect(),
                DType::Bf16 => x
                    .iter()
                    .map(|&v| bf16::from_f32(v).to_f32().to_bits())
                    .collect(),
                _ => x
                    .iter()
                    .map(|&v| (e4m3_to_f64(e4m3_from_f64(f64::from(v))) as f32).to_bits())
                    .collect(),
            };
            let got_bits: Vec<u32> = back.iter().map(|v| v.to_bits()).collect();
            assert!(got_bits == want, "{d:?}: the decoded values differ");
        }
    }

    #[test]
    fn codec_round_trips_and_reads_unaligned_bytes() {
        // all exact in every dtype, fp8 included (E4M3 tops out at 448)
        let x = [1.0f32, -2.5, 0.375, 256.0];
        for d in DType::MATMUL {
            assert_eq!(decode_f32(&encode_f32(&x, d), d), x, "{d}");
            assert_eq!(
                decode_f64(&encode_f64(&[0.5, -3.0], d), d),
                vec![0.5, -3.0],
                "{d}"
            );
        }
        // bytes that start at an odd address still decode
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(bytes_of(&[1.5f32, 2.0]));
        assert_eq!(decode_f32(&bytes[1..], DType::F32), vec![1.5, 2.0]);
        assert_eq!(encode_f32(&[1.0], DType::F16), 0x3c00u16.to_ne_bytes());
        for d in [DType::F32, DType::Tf32, DType::F16, DType::Bf16] {
            let mut small = vec![0u8; x.len() * d.size_bytes()];
            assert!(encode_f32_into(&x, d, &mut small));
            assert_eq!(small, encode_f32(&x, d), "{d}");
        }
        assert_eq!(round_f32(&[1.0 + 1e-4], DType::F16), vec![1.0]);
        let b = encode_f32(&[0.5, -1.5, 3.0], DType::Bf16);
        assert_eq!(element_f64(&b, DType::Bf16, 1), -1.5);
    }

    #[test]
    fn e4m3_encodes_hand_computed_values() {
        // (value, byte): sign | exponent (4 bits, bias 7) | mantissa (3 bits)
        let cases = [
            (0.0, 0x00),
            (-0.0, 0x80),
            (1.0, 0x38), // 2^0: exponent 7
            (-1.0, 0xb8),
            (448.0, 0x7e), // 1.75 * 2^8, the largest finite
            (-448.0, 0xfe),
            (0.1015625, 0x1d),           // 1.625 * 2^-4: exponent 3, mantissa 5
            (2f64.powi(-9), 0x01),       // the smallest subnormal
            (7.0 * 2f64.powi(-9), 0x07), // the largest subnormal
            (2f64.powi(-6), 0x08),       // the smallest normal
            (1.75, 0x3e),
            (2.0, 0x40),
        ];
        for (v, b) in cases {
            assert_eq!(e4m3_from_f64(v), b, "encode {v}");
            assert_eq!(e4m3_to_f64(b), v, "decode {b:#04x}");
        }
        assert!(e4m3_to_f64(0x7f).is_nan() && e4m3_to_f64(0xff).is_nan());
        assert_eq!(e4m3_from_f64(f64::NAN) & 0x7f, 0x7f);
        // saturation: beyond 448 (and infinity) gives ±448, never NaN
        assert_eq!(e4m3_from_f64(449.0), 0x7e);
        assert_eq!(e4m3_from_f64(1e6), 0x7e);
        assert_eq!(e4m3_from_f64(f64::INFINITY), 0x7e);
        assert_eq!(e4m3_from_f64(f64::NEG_INFINITY), 0xfe);
        // ties to even: 1 + 1/16 is halfway between 1 (mantissa 0) and 1.125 (mantissa 1)
        assert_eq!(e4m3_from_f64(1.0625), 0x38);
        // 1.1875 is halfway between 1.125 (odd) and 1.25 (even)
        assert_eq!(e4m3_from_f64(1.1875), 0x3a);
        // just above a tie rounds up
        assert_eq!(e4m3_from_f64(1.0625 + 1e-9), 0x39);
        // subnormal ties: 1.5 * 2^-9 goes to 2 * 2^-9, 0.5 * 2^-9 to zero
        assert_eq!(e4m3_from_f64(1.5 * 2f64.powi(-9)), 0x02);
        assert_eq!(e4m3_from_f64(0.5 * 2f64.powi(-9)), 0x00);
        // the largest subnormal rounds up into the smallest normal (7.5 -> 8 steps of 2^-9)
        assert_eq!(e4m3_from_f64(7.5 * 2f64.powi(-9)), 0x08);
        // 15.5 (between 15 and 16 with step 1) rounds to 16, carrying into the next octave
        assert_eq!(e4m3_from_f64(15.5), 0x58);
        // every byte but NaN decodes and encodes back to itself
        for b in 0..=255u8 {
            if b & 0x7f != 0x7f {
                assert_eq!(e4m3_from_f64(e4m3_to_f64(b)), b, "{b:#04x}");
            }
        }
        // through the codec, one byte an element
        let bytes = encode_f32(&[0.1015625, -448.0, 500.0], DType::F8E4M3);
        assert_eq!(bytes, vec![0x1d, 0xfe, 0x7e]);
        assert_eq!(element_f64(&bytes, DType::F8E4M3, 1), -448.0);
        assert_eq!(round_f32(&[0.1], DType::F8E4M3), vec![0.1015625]);
    }
}
