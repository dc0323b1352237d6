//! gpukit's rendezvous protocol on the wire. A connecting rank first sends a preamble (the 8
//! bytes `gpukitRZ` and the protocol version, u32 big-endian), then frames flow both ways: a u32
//! big-endian length, then that many bytes: one [`Frame`] in postcard's encoding (serde, varint
//! integers and lengths, byte strings as their length and the bytes themselves). Frames over
//! [`MAX_FRAME`] are refused, and so is a connection whose preamble is not gpukit's (an HTTP
//! client, a port scanner): it is no rank.
//!
//! The encoding follows the order of the types' fields and variants, [`ErrorKind`]'s included:
//! reordering any of them, or adding a variant anywhere but at the end, changes the bytes, and
//! [`VERSION`] must change with it.
//!
//! To use: [`write_preamble`] / [`read_preamble`] once per connection, then [`write_frame`] and
//! [`read_frame`].

use gpukit_types::ErrorKind;
use serde::ser::{SerializeSeq, SerializeStructVariant, Serializer};
use serde::{Deserialize, Deserializer, Serialize};
use std::io::{self, Read, Write};

/// What every connection to rank 0 starts with.
pub const MAGIC: [u8; 8] = *b"gpukitRZ";
/// The protocol version, sent in the preamble; ranks of different versions refuse each other.
/// Version 1 encoded the fields by hand, big-endian; version 2 is postcard's encoding.
pub const VERSION: u32 = 2;
/// The largest frame either side sends or accepts (64 MiB): an all_gather's result included.
pub const MAX_FRAME: usize = 64 << 20;

/// A rank's introduction to rank 0.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub rank: u64,
    pub world_size: u64,
    pub pid: u32,
    pub hostname: String,
}

/// One message of the protocol. Byte strings go through `serde_bytes`: serde's default would
/// encode a `Vec<u8>` one element at a time, the same bytes but far slower for an all_gather.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// A rank to rank 0, right after the preamble.
    Hello(Hello),
    /// Rank 0 to each rank once every rank arrived: who rank 0 is, and the blob.
    Welcome {
        pid: u32,
        hostname: String,
        #[serde(with = "serde_bytes")]
        blob: Vec<u8>,
    },
    /// Rank 0 to a rank: the rendezvous failed, for this reason.
    Refused { kind: ErrorKind, message: String },
    /// A rank's contribution to all_gather number `seq`, to rank 0.
    Gather {
        seq: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Rank 0 to each rank: every rank's contribution to all_gather `seq`, in rank order.
    Gathered {
        seq: u64,
        #[serde(serialize_with = "parts_out", deserialize_with = "parts_in")]
        parts: Vec<Vec<u8>>,
    },
    /// "Still here", about once a second each way.
    Heartbeat,
    /// The sender is done: its connection closing next is no failure.
    Finish,
    /// The sender failed, or (from rank 0) some rank did: every rank stops with this message.
    Abort { message: String },
}

/// The frames' names in the order of [`Frame`]'s variants: the encoding starts with the index.
const FRAME_NAMES: [&str; 8] = [
    "Hello",
    "Welcome",
    "Refused",
    "Gather",
    "Gathered",
    "Heartbeat",
    "Finish",
    "Abort",
];
/// [`Frame::Gathered`]'s index, for [`encode_gathered`].
const GATHERED: u32 = 4;

/// Why a frame could not be read.
#[derive(Debug)]
pub enum WireError {
    /// The other side closed the connection, or it was reset.
    Closed,
    /// Nothing arrived within the socket's read timeout.
    TimedOut,
    /// Another I/O error.
    Io(io::Error),
    /// The bytes are not gpukit's protocol; the text says how.
    Protocol(String),
}

impl From<io::Error> for WireError {
    fn from(error: io::Error) -> Self {
        use io::ErrorKind as K;
        match error.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                WireError::Closed
            }
            K::WouldBlock | K::TimedOut => WireError::TimedOut,
            _ => WireError::Io(error),
        }
    }
}

/// Sends the preamble that makes a connection a rank's.
pub fn write_preamble(out: &mut impl Write) -> io::Result<()> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&VERSION.to_be_bytes());
    out.write_all(&bytes)
}

/// Reads the preamble and returns the peer's protocol version; anything but gpukit's magic is a
/// [`WireError::Protocol`] that shows what was sent.
pub fn read_preamble(input: &mut impl Read) -> Result<u32, WireError> {
    let mut magic = [0u8; 8];
    input.read_exact(&mut magic)?;
    if magic != MAGIC {
        return Err(WireError::Protocol(format!(
            "it sent \"{}\", not gpukit's rendezvous preamble",
            magic.escape_ascii()
        )));
    }
    let mut version = [0u8; 4];
    input.read_exact(&mut version)?;
    Ok(u32::from_be_bytes(version))
}

/// The frame as bytes, length prefix included; an error when it would exceed [`MAX_FRAME`].
pub fn encode(frame: &Frame) -> Result<Vec<u8>, String> {
    encode_value(frame)
}

/// A [`Frame::Gathered`] as bytes, from borrowed parts (rank 0 keeps its copy of the result):
/// the same bytes as [`encode`] gives, without copying the parts into a frame first.
pub fn encode_gathered(seq: u64, parts: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    encode_value(&GatheredRef { seq, parts })
}

/// Sizes the body first, so that a frame over the cap is refused before its buffer exists, and
/// one under it is written into a buffer of its exact size.
fn encode_value(value: &impl Serialize) -> Result<Vec<u8>, String> {
    let body = postcard::serialize_with_flavor(value, postcard::ser_flavors::Size::default())
        .map_err(|e| format!("a frame: {e}"))?;
    if body > MAX_FRAME {
        return Err(format!(
            "a message of {body} bytes is more than the {} MiB gpukit's rendezvous carries",
            MAX_FRAME >> 20
        ));
    }
    let mut out = Vec::with_capacity(4 + body);
    out.extend_from_slice(&(body as u32).to_be_bytes());
    postcard::to_extend(value, out).map_err(|e| format!("a frame: {e}"))
}

/// Writes one frame (whole, so that frames from two threads never interleave when the caller
/// holds the stream's lock).
pub fn write_frame(out: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let bytes = encode(frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    out.write_all(&bytes)
}

/// Reads one frame. The length is checked against [`MAX_FRAME`] before the body's buffer is
/// allocated.
pub fn read_frame(input: &mut impl Read) -> Result<Frame, WireError> {
    let mut length = [0u8; 4];
    input.read_exact(&mut length)?;
    let length = u32::from_be_bytes(length) as usize;
    if length > MAX_FRAME {
        return Err(WireError::Protocol(format!(
            "a frame of {length} bytes announced, more than the {} MiB allowed",
            MAX_FRAME >> 20
        )));
    }
    let mut body = vec![0u8; length];
    input.read_exact(&mut body)?;
    decode(&body).map_err(WireError::Protocol)
}

/// A frame from its body (without the length); the error names the frame and what was wrong.
fn decode(body: &[u8]) -> Result<Frame, String> {
    // The variant index is a varint: one byte below 128. Checked here, since serde reports an
    // unknown index to postcard as a bare "custom error".
    let name = match body.first() {
        None => return Err("an empty frame".into()),
        Some(&index) => match FRAME_NAMES.get(usize::from(index)) {
            Some(name) => *name,
            None => return Err(format!("unknown frame type {index}")),
        },
    };
    let (frame, rest) = postcard::take_from_bytes::<Frame>(body).map_err(|error| {
        let why = match error {
            postcard::Error::DeserializeUnexpectedEnd => "it ends early".to_string(),
            postcard::Error::DeserializeBadUtf8 => "a text field is not UTF-8".to_string(),
            postcard::Error::DeserializeBadVarint => "a length or integer is malformed".to_string(),
            postcard::Error::SerdeDeCustom => "a field holds a value out of range".to_string(),
            other => other.to_string(),
        };
        format!("a malformed {name} frame ({} bytes): {why}", body.len())
    })?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes left over after a {name} frame",
            rest.len()
        ));
    }
    Ok(frame)
}

/// [`Frame::Gathered`] with borrowed parts, serialised exactly as the owned frame is (a test
/// holds the two to the same bytes).
struct GatheredRef<'a> {
    seq: u64,
    parts: &'a [Vec<u8>],
}

impl Serialize for GatheredRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut variant = serializer.serialize_struct_variant("Frame", GATHERED, "Gathered", 2)?;
        variant.serialize_field("seq", &self.seq)?;
        variant.serialize_field("parts", &Parts(self.parts))?;
        variant.end()
    }
}

/// A list of byte strings, each as bytes rather than a sequence of numbers.
struct Parts<'a>(&'a [Vec<u8>]);

impl Serialize for Parts<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for part in self.0 {
            seq.serialize_element(serde_bytes::Bytes::new(part))?;
        }
        seq.end()
    }
}

fn parts_out<S: Serializer>(parts: &[Vec<u8>], serializer: S) -> Result<S::Ok, S::Error> {
    Parts(parts).serialize(serializer)
}

fn parts_in<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Vec<u8>>, D::Error> {
    let parts = Vec::<serde_bytes::ByteBuf>::deserialize(deserializer)?;
    Ok(parts
        .into_iter()
        .map(serde_bytes::ByteBuf::into_vec)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_frame() -> Vec<Frame> {
        let mut frames = vec![
            Frame::Hello(Hello {
                rank: 3,
                world_size: 8,
                pid: 4242,
                hostname: "gpu-07.example".into(),
            }),
            Frame::Welcome {
                pid: 1,
                hostname: "héad".into(),
                blob: (0..128).collect(),
            },
        ];
        for kind in [
            ErrorKind::BadInput,
            ErrorKind::Unavailable,
            ErrorKind::Failed,
        ] {
            frames.push(Frame::Refused {
                kind,
                message: "rank 1 says WORLD_SIZE=4 but rank 0 has 3".into(),
            });
        }
        frames.extend([
            Frame::Gather {
                seq: u64::MAX,
                data: vec![],
            },
            Frame::Gather {
                seq: 1 << 40,
                data: (0..=255).collect(),
            },
            Frame::Gathered {
                seq: 7,
                parts: vec![vec![1, 2], vec![], vec![3; 1000]],
            },
            Frame::Gathered {
                seq: 0,
                parts: vec![],
            },
            Frame::Heartbeat,
            Frame::Finish,
            Frame::Abort {
                message: "rank 2 failed: out of memory".into(),
            },
        ]);
        frames
    }

    fn body_of(frame: &Frame) -> Vec<u8> {
        encode(frame).unwrap_or_else(|e| panic!("{frame:?}: {e}"))[4..].to_vec()
    }

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(body);
        bytes
    }

    fn protocol_error(bytes: &[u8]) -> String {
        match read_frame(&mut &bytes[..]) {
            Err(WireError::Protocol(message)) => message,
            other => panic!("{bytes:?}: {other:?}"),
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for frame in every_frame() {
            let bytes = encode(&frame).unwrap_or_else(|e| panic!("{frame:?}: {e}"));
            let back =
                read_frame(&mut bytes.as_slice()).unwrap_or_else(|e| panic!("{frame:?}: {e:?}"));
            assert_eq!(back, frame);
        }
    }

    #[test]
    fn the_frame_names_follow_the_variants() {
        for frame in every_frame() {
            let name = FRAME_NAMES[usize::from(body_of(&frame)[0])];
            assert!(format!("{frame:?}").starts_with(name), "{name}: {frame:?}");
        }
    }

    #[test]
    fn a_borrowed_result_encodes_as_the_owned_frame() {
        let parts = vec![vec![1, 2], vec![], vec![3; 300]];
        for parts in [parts, vec![]] {
            let owned = encode(&Frame::Gathered {
                seq: 9,
                parts: parts.clone(),
            })
            .unwrap();
            assert_eq!(encode_gathered(9, &parts).unwrap(), owned);
        }
    }

    #[test]
    fn byte_strings_travel_as_bytes() {
        let part = 1 << 20;
        let parts = vec![vec![0xa5; part]; 4];
        let bytes = encode_gathered(1, &parts).unwrap();
        // Length prefix, variant, seq, count and a 3-byte varint length per part.
        assert_eq!(bytes.len(), 4 + 1 + 1 + 1 + 4 * (3 + part));
    }

    #[test]
    fn frames_follow_each_other_on_one_stream() {
        let mut bytes = Vec::new();
        write_preamble(&mut bytes).unwrap();
        write_frame(&mut bytes, &Frame::Heartbeat).unwrap();
        write_frame(&mut bytes, &Frame::Finish).unwrap();
        let mut input = bytes.as_slice();
        assert_eq!(read_preamble(&mut input).ok(), Some(VERSION));
        assert_eq!(read_frame(&mut input).ok(), Some(Frame::Heartbeat));
        assert_eq!(read_frame(&mut input).ok(), Some(Frame::Finish));
        assert!(matches!(read_frame(&mut input), Err(WireError::Closed)));
    }

    #[test]
    fn a_stray_http_client_is_not_a_rank() {
        let mut input: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        match read_preamble(&mut input) {
            Err(WireError::Protocol(message)) => {
                assert!(message.contains("GET / HT"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        // Its first four bytes read as a length are far over the cap.
        let message = protocol_error(b"GET / HTTP/1.1\r\n\r\n");
        assert!(message.contains("64 MiB"), "{message}");
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        // Only the length is there: a reader that went on to allocate and read the body would
        // report the stream closed, not the length refused.
        for length in [MAX_FRAME as u32 + 1, u32::MAX] {
            let message = protocol_error(&length.to_be_bytes());
            assert!(message.contains("64 MiB"), "{message}");
        }
        let big = Frame::Gather {
            seq: 0,
            data: vec![0; MAX_FRAME],
        };
        let error = encode(&big).unwrap_err();
        assert!(error.contains("64 MiB"), "{error}");
        let error = encode_gathered(0, &[vec![0; MAX_FRAME / 2], vec![0; MAX_FRAME / 2]]);
        assert!(error.unwrap_err().contains("64 MiB"));
        // A frame of exactly the cap still goes.
        let data = vec![7; MAX_FRAME - 1 - 1 - 4];
        let bytes = encode(&Frame::Gather { seq: 0, data }).unwrap();
        assert_eq!(bytes.len(), 4 + MAX_FRAME);
        assert!(read_frame(&mut bytes.as_slice()).is_ok());
    }

    #[test]
    fn malformed_bodies_are_protocol_errors_that_say_what_was_wrong() {
        let cases: [(&[u8], &str); 9] = [
            (&[], "empty"),
            (&[99], "unknown frame type 99"),
            (&[0x80, 0x01], "unknown frame type 128"),
            (&[3, 0x80], "Gather frame (2 bytes): it ends early"),
            (&[7, 9, b'a'], "Abort frame (3 bytes): it ends early"),
            (
                &[7, 1, 0xff],
                "Abort frame (3 bytes): a text field is not UTF-8",
            ),
            (&[5, 1], "1 bytes left over after a Heartbeat frame"),
            (
                &[2, 9, 0],
                "Refused frame (3 bytes): a field holds a value out of range",
            ),
            (
                &[
                    3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0,
                ],
                "Gather",
            ),
        ];
        for (body, expected) in cases {
            let message = protocol_error(&framed(body));
            assert!(message.contains(expected), "{body:?}: {message}");
        }
    }

    #[test]
    fn a_lying_count_of_parts_is_refused() {
        // Four thousand million parts announced in a few bytes.
        let message = protocol_error(&framed(&[4, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2]));
        assert!(message.contains("Gathered frame"), "{message}");
        // Each part's length is beyond the frame's end.
        let message = protocol_error(&framed(&[4, 0, 2, 0xff, 0xff, 0x03, 1]));
        assert!(message.contains("ends early"), "{message}");
    }

    #[test]
    fn every_truncated_frame_is_a_protocol_error() {
        for frame in every_frame() {
            let body = body_of(&frame);
            for end in 0..body.len() {
                // Sampled through long bodies: the decoder sees each field boundary anyway.
                if end > 64 && end % 97 != 0 {
                    continue;
                }
                let message = protocol_error(&framed(&body[..end]));
                assert!(!message.is_empty(), "{frame:?} cut at {end}");
            }
        }
    }

    #[test]
    fn a_truncated_stream_reads_as_closed() {
        let bytes = encode(&Frame::Abort {
            message: "x".repeat(10),
        })
        .unwrap();
        let mut input = &bytes[..bytes.len() - 3];
        assert!(matches!(read_frame(&mut input), Err(WireError::Closed)));
    }

    /// xorshift64*: deterministic, so that a failure replays.
    struct Noise(u64);

    impl Noise {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Whatever arrives, reading never panics; and whatever decodes encodes back to itself.
    #[test]
    fn random_bytes_never_panic() {
        let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
        let valid: Vec<Vec<u8>> = every_frame().iter().map(body_of).collect();
        let mut decoded = 0;
        for round in 0..50_000 {
            let body: Vec<u8> = match round % 3 {
                // Pure noise, mostly short, its first byte often a real frame type.
                0 => {
                    let mut body: Vec<u8> =
                        (0..noise.below(40)).map(|_| noise.next() as u8).collect();
                    if let Some(first) = body.first_mut() {
                        if noise.below(4) > 0 {
                            *first %= FRAME_NAMES.len() as u8;
                        }
                    }
                    body
                }
                // A real frame with a few bytes changed.
                1 => {
                    let mut body = valid[noise.below(valid.len())].clone();
                    for _ in 0..=noise.below(3) {
                        let at = noise.below(body.len());
                        body[at] = noise.next() as u8;
                    }
                    body
                }
                // A real frame cut short or run long.
                _ => {
                    let mut body = valid[noise.below(valid.len())].clone();
                    if noise.below(2) == 0 {
                        body.truncate(noise.below(body.len() + 1));
                    } else {
                        body.extend((0..=noise.below(8)).map(|_| noise.next() as u8));
                    }
                    body
                }
            };
            if let Ok(frame) = read_frame(&mut framed(&body).as_slice()) {
                decoded += 1;
                let again = encode(&frame).expect("a decoded frame encodes");
                assert_eq!(read_frame(&mut again.as_slice()).ok(), Some(frame));
            }
            // And as a raw stream, its first bytes taken for the length.
            let _ = read_frame(&mut body.as_slice());
        }
        // The mutations keep some frames valid: the loop exercised the decoder's success path.
        assert!(decoded > 100, "{decoded}");
    }
}
