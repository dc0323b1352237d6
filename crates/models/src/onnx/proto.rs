//! The subset of ONNX's `onnx.proto` that gpukit reads and writes, as `prost` messages.
//!
//! Field numbers are those of onnx.proto (ONNX 1.17+). Repeated scalars are declared as proto2
//! writes them (unpacked for `dims`, `ints`, `floats`; packed for the `*_data` fields, which
//! onnx.proto marks `[packed = true]`); prost's decoder takes either wire form for any repeated
//! scalar, so models written by proto3 writers (PyTorch's exporter packs everything) decode
//! too (see `tests::repeated_scalars_decode_packed_or_unpacked`). Fields gpukit has no use for
//! are skipped by the decoder.

use prost::Message;

/// ONNX's `ModelProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ModelProto {
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    #[prost(string, tag = "2")]
    pub producer_name: String,
    #[prost(string, tag = "3")]
    pub producer_version: String,
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
}

/// ONNX's `OperatorSetIdProto`.
#[derive(Clone, PartialEq, Message)]
pub struct OperatorSetIdProto {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// ONNX's `GraphProto`.
#[derive(Clone, PartialEq, Message)]
pub struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
    #[prost(message, repeated, tag = "13")]
    pub value_info: Vec<ValueInfoProto>,
}

/// ONNX's `NodeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(string, tag = "4")]
    pub op_type: String,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    #[prost(string, tag = "7")]
    pub domain: String,
}

/// `AttributeProto.AttributeType` values.
pub mod attribute_type {
    /// FLOAT.
    pub const FLOAT: i32 = 1;
    /// INT.
    pub const INT: i32 = 2;
    /// STRING.
    pub const STRING: i32 = 3;
    /// TENSOR.
    pub const TENSOR: i32 = 4;
    /// FLOATS.
    pub const FLOATS: i32 = 6;
    /// INTS.
    pub const INTS: i32 = 7;
    /// STRINGS.
    pub const STRINGS: i32 = 8;
}

/// `TensorProto.DataType` values gpukit reads.
pub mod data_type {
    /// FLOAT (f32).
    pub const FLOAT: i32 = 1;
    /// INT32.
    pub const INT32: i32 = 6;
    /// INT64.
    pub const INT64: i32 = 7;
    /// DOUBLE (f64).
    pub const DOUBLE: i32 = 11;
}

/// `TensorProto.DataLocation`: EXTERNAL (the data is in another file).
pub const DATA_LOCATION_EXTERNAL: i32 = 1;

/// ONNX's `AttributeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct AttributeProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(float, optional, tag = "2")]
    pub f: Option<f32>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    #[prost(bytes = "vec", optional, tag = "4")]
    pub s: Option<Vec<u8>>,
    #[prost(message, optional, tag = "5")]
    pub t: Option<TensorProto>,
    #[prost(float, repeated, packed = "false", tag = "7")]
    pub floats: Vec<f32>,
    #[prost(int64, repeated, packed = "false", tag = "8")]
    pub ints: Vec<i64>,
    #[prost(bytes = "vec", repeated, tag = "9")]
    pub strings: Vec<Vec<u8>>,
    #[prost(int32, tag = "20")]
    pub r#type: i32,
}

/// ONNX's `TensorProto`: values in `raw_data` (little-endian), in the typed field of their
/// type, or in an external file (`data_location` EXTERNAL, described by `external_data`).
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    #[prost(float, repeated, packed = "true", tag = "4")]
    pub float_data: Vec<f32>,
    #[prost(int32, repeated, packed = "true", tag = "5")]
    pub int32_data: Vec<i32>,
    #[prost(int64, repeated, packed = "true", tag = "7")]
    pub int64_data: Vec<i64>,
    #[prost(string, tag = "8")]
    pub name: String,
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
    #[prost(double, repeated, packed = "true", tag = "10")]
    pub double_data: Vec<f64>,
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    #[prost(int32, tag = "14")]
    pub data_location: i32,
}

/// ONNX's `StringStringEntryProto` (a key and its value: `location`, `offset`, `length` of
/// external data).
#[derive(Clone, PartialEq, Message)]
pub struct StringStringEntryProto {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// ONNX's `ValueInfoProto`.
#[derive(Clone, PartialEq, Message)]
pub struct ValueInfoProto {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// ONNX's `TypeProto`, tensor types only (a sequence or map type decodes as no tensor type).
#[derive(Clone, PartialEq, Message)]
pub struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// ONNX's `TypeProto.Tensor`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorTypeProto {
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// ONNX's `TensorShapeProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorShapeProto {
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// ONNX's `TensorShapeProto.Dimension`: a number or a named (symbolic) size.
#[derive(Clone, PartialEq, Message)]
pub struct Dimension {
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same values of a repeated int64 field, unpacked (one tag per value, proto2) and
    /// packed (one length-delimited run, proto3): `dims` is tag 1, `int64_data` tag 7.
    #[test]
    fn repeated_scalars_decode_packed_or_unpacked() {
        // dims unpacked: 08 02 08 03; int64_data packed: 3A 02 05 06
        let proto2 = [0x08, 2, 0x08, 3, 0x3A, 2, 5, 6];
        // dims packed: 0A 02 02 03; int64_data unpacked: 38 05 38 06
        let proto3 = [0x0A, 2, 2, 3, 0x38, 5, 0x38, 6];
        for bytes in [&proto2[..], &proto3[..]] {
            let t = TensorProto::decode(bytes).unwrap();
            assert_eq!(
                (t.dims.as_slice(), t.int64_data.as_slice()),
                (&[2, 3][..], &[5, 6][..])
            );
        }
        // floats (attribute tag 7) packed as proto3 writes them: 3A 08 <1.0f> <2.0f>
        let mut packed = vec![0x3A, 8];
        packed.extend(1f32.to_le_bytes());
        packed.extend(2f32.to_le_bytes());
        let a = AttributeProto::decode(packed.as_slice()).unwrap();
        assert_eq!(a.floats, [1.0, 2.0]);
        // and unpacked, float_data (tensor tag 4, fixed32): 25 <1.0f>
        let mut unpacked = vec![0x25];
        unpacked.extend(1f32.to_le_bytes());
        assert_eq!(
            TensorProto::decode(unpacked.as_slice()).unwrap().float_data,
            [1.0]
        );
    }
}
