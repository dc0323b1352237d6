//! gpukit's rendezvous protocol on the wire. A connecting rank first sends a preamble (the 8
//! bytes `gpukitRZ` and the protocol version, u32 big-endian), then frames flow both ways: a u32
//! big-endian length, then that many bytes: a one-byte tag and the frame's fields (integers
//! big-endian, byte strings and text as a u32 length and the bytes). Frames over [`MAX_FRAME`]
//! are refused, and so is a connection whose preamble is not gpukit's (an HTTP client, a port
//! scanner): it is no rank.
//!
//! To use: [`write_preamble`] / [`read_preamble`] once per connection, then [`write_frame`] and
//! [`read_frame`].

use gpukit_types::ErrorKind;
use std::io::{self, Read, Write};

/// What every connection to rank 0 starts with.
pub const MAGIC: [u8; 8] = *b"gpukitRZ";
/// The protocol version, sent in the preamble; ranks of different versions refuse each other.
pub const VERSION: u32 = 1;
/// The largest frame either side sends or accepts (64 MiB): an all_gather's result included.
pub const MAX_FRAME: usize = 64 << 20;

/// A rank's introduction to rank 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub rank: u64,
    pub world_size: u64,
    pub pid: u32,
    pub hostname: String,
}

/// One message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A rank to rank 0, right after the preamble.
    Hello(Hello),
    /// Rank 0 to each rank once every rank arrived: who rank 0 is, and the blob.
    Welcome {
        pid: u32,
        hostname: String,
        blob: Vec<u8>,
    },
    /// Rank 0 to a rank: the rendezvous failed, for this reason.
    Refused { kind: ErrorKind, message: String },
    /// A rank's contribution to all_gather number `seq`, to rank 0.
    Gather { seq: u64, data: Vec<u8> },
    /// Rank 0 to each rank: every rank's contribution to all_gather `seq`, in rank order.
    Gathered { seq: u64, parts: Vec<Vec<u8>> },
    /// "Still here", about once a second each way.
    Heartbeat,
    /// The sender is done: its connection closing next is no failure.
    Finish,
    /// The sender failed, or (from rank 0) some rank did: every rank stops with this message.
    Abort { message: String },
}

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

mod tag {
    pub const HELLO: u8 = 1;
    pub const WELCOME: u8 = 2;
    pub const REFUSED: u8 = 3;
    pub const GATHER: u8 = 4;
    pub const GATHERED: u8 = 5;
    pub const HEARTBEAT: u8 = 6;
    pub const FINISH: u8 = 7;
    pub const ABORT: u8 = 8;
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
    let mut out = vec![0u8; 4];
    match frame {
        Frame::Hello(hello) => {
            out.push(tag::HELLO);
            out.extend_from_slice(&hello.rank.to_be_bytes());
            out.extend_from_slice(&hello.world_size.to_be_bytes());
            out.extend_from_slice(&hello.pid.to_be_bytes());
            put_bytes(&mut out, hello.hostname.as_bytes())?;
        }
        Frame::Welcome {
            pid,
            hostname,
            blob,
        } => {
            out.push(tag::WELCOME);
            out.extend_from_slice(&pid.to_be_bytes());
            put_bytes(&mut out, hostname.as_bytes())?;
            put_bytes(&mut out, blob)?;
        }
        Frame::Refused { kind, message } => {
            out.push(tag::REFUSED);
            out.push(kind_code(*kind));
            put_bytes(&mut out, message.as_bytes())?;
        }
        Frame::Gather { seq, data } => {
            out.push(tag::GATHER);
            out.extend_from_slice(&seq.to_be_bytes());
            put_bytes(&mut out, data)?;
        }
        Frame::Gathered { seq, parts } => return encode_gathered(*seq, parts),
        Frame::Heartbeat => out.push(tag::HEARTBEAT),
        Frame::Finish => out.push(tag::FINISH),
        Frame::Abort { message } => {
            out.push(tag::ABORT);
            put_bytes(&mut out, message.as_bytes())?;
        }
    }
    with_length(out)
}

/// A [`Frame::Gathered`] as bytes, from borrowed parts (rank 0 keeps its copy of the result).
pub fn encode_gathered(seq: u64, parts: &[Vec<u8>]) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; 4];
    out.push(tag::GATHERED);
    out.extend_from_slice(&seq.to_be_bytes());
    put_len(&mut out, parts.len())?;
    for part in parts {
        put_bytes(&mut out, part)?;
    }
    with_length(out)
}

/// Fills in the length prefix (the first four bytes) once the body is known to fit.
fn with_length(mut out: Vec<u8>) -> Result<Vec<u8>, String> {
    let body = out.len() - 4;
    if body > MAX_FRAME {
        return Err(format!(
            "a message of {body} bytes is more than the {} MiB gpukit's rendezvous carries",
            MAX_FRAME >> 20
        ));
    }
    let length = (body as u32).to_be_bytes();
    out[..4].copy_from_slice(&length);
    Ok(out)
}

/// Writes one frame (whole, so that frames from two threads never interleave when the caller
/// holds the stream's lock).
pub fn write_frame(out: &mut impl Write, frame: &Frame) -> io::Result<()> {
    let bytes = encode(frame).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    out.write_all(&bytes)
}

/// Reads one frame.
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

/// A frame from its body (tag and fields, without the length).
fn decode(body: &[u8]) -> Result<Frame, String> {
    let mut cursor = Cursor { rest: body };
    let frame = match cursor.u8()? {
        tag::HELLO => Frame::Hello(Hello {
            rank: cursor.u64()?,
            world_size: cursor.u64()?,
            pid: cursor.u32()?,
            hostname: cursor.text()?,
        }),
        tag::WELCOME => Frame::Welcome {
            pid: cursor.u32()?,
            hostname: cursor.text()?,
            blob: cursor.bytes()?.to_vec(),
        },
        tag::REFUSED => Frame::Refused {
            kind: kind_from_code(cursor.u8()?),
            message: cursor.text()?,
        },
        tag::GATHER => Frame::Gather {
            seq: cursor.u64()?,
            data: cursor.bytes()?.to_vec(),
        },
        tag::GATHERED => {
            let seq = cursor.u64()?;
            let count = cursor.u32()? as usize;
            // Each part takes at least its 4-byte length: a count beyond that is a lie.
            if count > cursor.rest.len() / 4 {
                return Err(format!(
                    "a result announces {count} parts in {} bytes",
                    body.len()
                ));
            }
            let parts = (0..count)
                .map(|_| cursor.bytes().map(<[u8]>::to_vec))
                .collect::<Result<_, _>>()?;
            Frame::Gathered { seq, parts }
        }
        tag::HEARTBEAT => Frame::Heartbeat,
        tag::FINISH => Frame::Finish,
        tag::ABORT => Frame::Abort {
            message: cursor.text()?,
        },
        other => return Err(format!("unknown frame type {other}")),
    };
    if !cursor.rest.is_empty() {
        return Err(format!(
            "{} bytes left over after a frame",
            cursor.rest.len()
        ));
    }
    Ok(frame)
}

fn kind_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::BadInput => 0,
        ErrorKind::Unavailable => 1,
        ErrorKind::Failed => 2,
    }
}

fn kind_from_code(code: u8) -> ErrorKind {
    match code {
        0 => ErrorKind::BadInput,
        1 => ErrorKind::Unavailable,
        _ => ErrorKind::Failed,
    }
}

fn put_len(out: &mut Vec<u8>, len: usize) -> Result<(), String> {
    let len = u32::try_from(len).map_err(|_| format!("{len} is too long for a frame"))?;
    out.extend_from_slice(&len.to_be_bytes());
    Ok(())
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) -> Result<(), String> {
    put_len(out, bytes.len())?;
    out.extend_from_slice(bytes);
    Ok(())
}

/// Reads fields off a frame's body.
struct Cursor<'a> {
    rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!(
                "a frame ends early: {n} more bytes expected, {} left",
                self.rest.len()
            ));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(N)?);
        Ok(array)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn text(&mut self) -> Result<String, String> {
        let bytes = self.bytes()?;
        String::from_utf8(bytes.to_vec()).map_err(|_| "a text field is not UTF-8".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(frame: Frame) {
        let bytes = encode(&frame).unwrap_or_else(|e| panic!("{frame:?}: {e}"));
        let back = read_frame(&mut bytes.as_slice()).unwrap_or_else(|e| panic!("{frame:?}: {e:?}"));
        assert_eq!(back, frame);
    }

    #[test]
    fn every_frame_round_trips() {
        round_trip(Frame::Hello(Hello {
            rank: 3,
            world_size: 8,
            pid: 4242,
            hostname: "gpu-07.example".into(),
        }));
        round_trip(Frame::Welcome {
            pid: 1,
            hostname: "héad".into(),
            blob: (0..128).collect(),
        });
        for kind in [
            ErrorKind::BadInput,
            ErrorKind::Unavailable,
            ErrorKind::Failed,
        ] {
            round_trip(Frame::Refused {
                kind,
                message: "rank 1 says WORLD_SIZE=4 but rank 0 has 3".into(),
            });
        }
        round_trip(Frame::Gather {
            seq: u64::MAX,
            data: vec![],
        });
        round_trip(Frame::Gathered {
            seq: 7,
            parts: vec![vec![1, 2], vec![], vec![3; 1000]],
        });
        round_trip(Frame::Gathered {
            seq: 0,
            parts: vec![],
        });
        round_trip(Frame::Heartbeat);
        round_trip(Frame::Finish);
        round_trip(Frame::Abort {
            message: "rank 2 failed: out of memory".into(),
        });
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
        let mut input: &[u8] = b"GET / HTTP/1.1\r\n\r\n";
        assert!(matches!(
            read_frame(&mut input),
            Err(WireError::Protocol(_))
        ));
    }

    #[test]
    fn oversized_frames_are_refused_both_ways() {
        let mut header = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        header.push(tag::HEARTBEAT);
        match read_frame(&mut header.as_slice()) {
            Err(WireError::Protocol(message)) => assert!(message.contains("64 MiB"), "{message}"),
            other => panic!("{other:?}"),
        }
        let big = Frame::Gather {
            seq: 0,
            data: vec![0; MAX_FRAME],
        };
        let error = encode(&big).unwrap_err();
        assert!(error.contains("64 MiB"), "{error}");
    }

    #[test]
    fn malformed_bodies_are_protocol_errors() {
        let cases: [&[u8]; 6] = [
            &[],                             // no tag
            &[99],                           // unknown tag
            &[tag::GATHER, 0, 0],            // truncated integer
            &[tag::ABORT, 0, 0, 0, 9, b'a'], // text shorter than announced
            &[tag::ABORT, 0, 0, 0, 1, 0xff], // not UTF-8
            &[tag::HEARTBEAT, 1],            // trailing bytes
        ];
        for body in cases {
            let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
            bytes.extend_from_slice(body);
            assert!(
                matches!(
                    read_frame(&mut bytes.as_slice()),
                    Err(WireError::Protocol(_))
                ),
                "{body:?}"
            );
        }
        let lying_count = [
            tag::GATHERED,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            0xff,
            0xff,
            0xff,
            0xff,
        ];
        let mut bytes = (lying_count.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&lying_count);
        assert!(matches!(
            read_frame(&mut bytes.as_slice()),
            Err(WireError::Protocol(_))
        ));
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
}
