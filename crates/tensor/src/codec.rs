//! The one codec between values and the bytes of a dtype's storage (machine byte order, which is
//! what the GPU reads): f32/f64 values in, storage bytes out, and back. Byte views go through
//! `bytemuck` (with `half`'s f16 and bf16), so no caller writes its own `to_ne_bytes` loop.

use crate::DType;
use half::{bf16, f16};

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
        _ => f64::from(bytemuck::pod_read_unaligned::<f32>(b)),
    }
}

/// Values of `dtype` storage as f64 (exact for every dtype).
pub fn decode_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype.storage() {
        DType::F64 => elems::<f64>(bytes).into_owned(),
        DType::F16 => elems::<f16>(bytes).iter().map(|v| v.to_f64()).collect(),
        DType::Bf16 => elems::<bf16>(bytes).iter().map(|v| v.to_f64()).collect(),
        _ => elems::<f32>(bytes).iter().map(|&v| f64::from(v)).collect(),
    }
}

/// Values of `dtype` storage as f32 (f64 rounded to nearest).
pub fn decode_f32(bytes: &[u8], dtype: DType) -> Vec<f32> {
    match dtype.storage() {
        DType::F64 => elems::<f64>(bytes).iter().map(|&v| v as f32).collect(),
        DType::F16 => elems::<f16>(bytes).iter().map(|v| v.to_f32()).collect(),
        DType::Bf16 => elems::<bf16>(bytes).iter().map(|v| v.to_f32()).collect(),
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
        _ => {
            let v: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            bytes_of(&v).to_vec()
        }
    }
}

/// `values` stored as `dtype`, each rounded to nearest (ties to even).
pub fn encode_f32(values: &[f32], dtype: DType) -> Vec<u8> {
    match dtype.storage() {
        DType::F64 => {
            let v: Vec<f64> = values.iter().map(|&v| f64::from(v)).collect();
            bytes_of(&v).to_vec()
        }
        DType::F16 => {
            let v: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            bytes_of(&v).to_vec()
        }
        DType::Bf16 => {
            let v: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
            bytes_of(&v).to_vec()
        }
        _ => bytes_of(values).to_vec(),
    }
}

/// Each value rounded to `dtype`'s storage and back to f32 (the values a GPU row of that dtype
/// actually multiplies).
pub fn round_f32(values: &[f32], dtype: DType) -> Vec<f32> {
    match dtype.storage() {
        DType::F16 | DType::Bf16 => decode_f32(&encode_f32(values, dtype), dtype),
        _ => values.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codec_round_trips_and_reads_unaligned_bytes() {
        let x = [1.0f32, -2.5, 0.375, 1024.0];
        for d in DType::ALL {
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
        assert_eq!(round_f32(&[1.0 + 1e-4], DType::F16), vec![1.0]);
        let b = encode_f32(&[0.5, -1.5, 3.0], DType::Bf16);
        assert_eq!(element_f64(&b, DType::Bf16, 1), -1.5);
    }
}
