//! NCCL: communicators over several GPUs and the collectives gpukit measures and trains with,
//! taking device [`View`]s and gpukit's [`DType`], never cudarc's types.
//!
//! To use:
//! - one process driving every GPU: [`Comm::init_all`] with the opened [`Gpu`]s, then issue one
//!   call per GPU inside [`group`] (NCCL needs the calls of one collective grouped when one thread
//!   issues them all);
//! - one process per GPU: rank 0 makes a [`UniqueId`], the launcher's rendezvous carries its
//!   bytes to every rank, each calls [`Comm::init_rank`].
//!
//! Collectives queue on the communicator's stream and return at once. A peer that dies leaves
//! them spinning on the GPU: the caller's watchdog (the dist crate) ends the process.

use crate::driver::Gpu;
use crate::error::{Error, Result};
use crate::loader::{Discovery, Lib};
use crate::memory::View;
use crate::stream::Stream;
use cudarc::nccl::sys;
use gpukit_types::DType;
use std::ffi::c_void;

/// NCCL's unique id: 128 opaque bytes rank 0 makes and every rank must receive.
#[derive(Clone)]
pub struct UniqueId(sys::ncclUniqueId);

impl UniqueId {
    /// A fresh id (honours NCCL_COMM_ID=host:port, with which every rank derives the same id).
    pub fn new() -> Result<UniqueId> {
        let mut id = sys::ncclUniqueId { internal: [0; 128] };
        // SAFETY: `id` is a live local of the type NCCL writes.
        check("ncclGetUniqueId", unsafe { sys::ncclGetUniqueId(&mut id) })?;
        Ok(UniqueId(id))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.0.internal.iter().map(|c| *c as u8).collect()
    }

    /// The id another rank made, from its bytes (exactly 128).
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let mut internal = [0 as std::ffi::c_char; 128];
        if bytes.len() != internal.len() {
            return Err(Error::Invalid(format!(
                "an NCCL unique id has 128 bytes, got {}",
                bytes.len()
            )));
        }
        for (d, s) in internal.iter_mut().zip(bytes) {
            *d = *s as std::ffi::c_char;
        }
        Ok(UniqueId(sys::ncclUniqueId { internal }))
    }
}

/// The reductions gpukit offers (NCCL's built-in ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
}

impl RedOp {
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }

    pub fn parse(s: &str) -> Option<RedOp> {
        RedOp::ALL.into_iter().find(|r| r.name() == s)
    }

    fn raw(self) -> sys::ncclRedOp_t {
        match self {
            RedOp::Sum => sys::ncclRedOp_t::ncclSum,
            RedOp::Prod => sys::ncclRedOp_t::ncclProd,
            RedOp::Max => sys::ncclRedOp_t::ncclMax,
            RedOp::Min => sys::ncclRedOp_t::ncclMin,
            RedOp::Avg => sys::ncclRedOp_t::ncclAvg,
        }
    }
}

fn raw_dtype(d: DType) -> sys::ncclDataType_t {
    match d.storage() {
        DType::F64 => sys::ncclDataType_t::ncclFloat64,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        // never reached: `need` refuses fp8 before any call (a byte type would move the bytes
        // but sum them as integers)
        DType::F8E4M3 => sys::ncclDataType_t::ncclUint8,
        _ => sys::ncclDataType_t::ncclFloat32,
    }
}

/// NCCL's own words for a failed call (the last error it recorded, when it says one).
fn check(call: &'static str, rc: sys::ncclResult_t) -> Result<()> {
    match rc {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        rc => {
            // SAFETY: NCCL returns a static string for any status; a null comm asks for the
            // thread's last error.
            let detail = unsafe {
                let last = sys::ncclGetLastError(std::ptr::null_mut());
                if last.is_null() {
                    String::new()
                } else {
                    std::ffi::CStr::from_ptr(last)
                        .to_string_lossy()
                        .into_owned()
                }
            };
            let status = if detail.is_empty() {
                format!("{rc:?}")
            } else {
                format!("{rc:?} ({detail})")
            };
            Err(Error::Library {
                library: "NCCL",
                call,
                out_of_memory: false,
                status,
            })
        }
    }
}

/// An error naming what to install unless NCCL can be used.
pub fn require(discovery: &Discovery) -> Result<()> {
    // SAFETY: only asks the loader whether one of cudarc's candidate names opens.
    if discovery.usable(Lib::Nccl) && unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::MissingLibrary(discovery.missing_message(Lib::Nccl)))
    }
}

/// The NCCL version the library reports (`2.28.9`).
pub fn version() -> Result<String> {
    let mut v = 0;
    // SAFETY: `v` is a live local.
    check("ncclGetVersion", unsafe { sys::ncclGetVersion(&mut v) })?;
    Ok(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
}

/// Runs `issue` between ncclGroupStart and ncclGroupEnd (the group is ended whatever `issue`
/// returns). Needed when one thread issues a collective's calls for several GPUs, and to fuse
/// sends and receives.
pub fn group<T>(issue: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: no arguments; pairs with the End below.
    check("ncclGroupStart", unsafe { sys::ncclGroupStart() })?;
    let out = issue();
    // SAFETY: ends the group started above.
    let end = check("ncclGroupEnd", unsafe { sys::ncclGroupEnd() });
    let out = out?;
    end?;
    Ok(out)
}

extern "C" {
    fn _exit(status: std::ffi::c_int) -> !;
}

/// Ends the process at once with `code`, running no exit handlers: what a watchdog does when a
/// peer is gone. A collective waiting for that peer never finishes, and the CUDA driver's exit
/// handlers would wait for it forever; the kernel frees the process's GPU resources as it does
/// for a killed process. Whatever the process has to say must already be written (stderr is
/// unbuffered; nothing of stdout's buffer is kept).
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: _exit takes an int and never returns; no Rust state is touched afterwards.
    unsafe { _exit(code) }
}

/// One rank's communicator: its GPU's ordinal, its rank and the stream its collectives queue
/// on. Send but not Sync: it may move to the thread that drives it (one thread per GPU is how
/// one process keeps up with several GPUs' small collectives), never be used by two at once.
pub struct Comm {
    raw: sys::ncclComm_t,
    pub rank: usize,
    pub size: usize,
    pub ordinal: usize,
    stream: Stream,
    _not_sync: std::marker::PhantomData<std::cell::Cell<()>>,
}

// SAFETY: NCCL lets any thread drive a communicator as long as no two use it at once, which
// `Comm` not being Sync (and its methods taking &self on one thread) guarantees.
unsafe impl Send for Comm {}

impl Comm {
    /// Communicators for every GPU of this process (one per [`Gpu`], rank = position), each
    /// queueing on its GPU's work stream.
    pub fn init_all(gpus: &[&Gpu]) -> Result<Vec<Comm>> {
        if gpus.is_empty() {
            return Err(Error::Invalid("NCCL needs at least one GPU".into()));
        }
        let devs: Vec<i32> = gpus.iter().map(|g| g.ordinal as i32).collect();
        let mut raws = vec![std::ptr::null_mut(); gpus.len()];
        // SAFETY: `raws` has room for one communicator per device in `devs`.
        check("ncclCommInitAll", unsafe {
            sys::ncclCommInitAll(raws.as_mut_ptr(), devs.len() as i32, devs.as_ptr())
        })?;

        Ok(raws
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (raw, g))| Comm {
                raw,
                rank,
                size: gpus.len(),
                ordinal: g.ordinal,
                stream: g.stream().clone(),
                _not_sync: std::marker::PhantomData,
            })
            .collect())
    }

    /// This process's rank of `size`, on `gpu`, with the id every rank received. Blocks until
    /// every rank has called it (bounded by the caller's watchdog).
    pub fn init_rank(gpu: &Gpu, id: &UniqueId, rank: usize, size: usize) -> Result<Comm> {
        Comm::init_rank_on(gpu, gpu.stream().clone(), id, rank, size)
    }

    /// As [`Comm::init_rank`], its collectives queued on `stream` (a stream of `gpu`: a
    /// second stream lets them overlap the work stream's compute).
    pub fn init_rank_on(
        gpu: &Gpu,
        stream: Stream,
        id: &UniqueId,
        rank: usize,
        size: usize,
    ) -> Result<Comm> {
        if rank >= size {
            return Err(Error::Invalid(format!("rank {rank} of a world of {size}")));
        }
        gpu.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `raw` is a live local; the id is 128 bytes by type.
        check("ncclCommInitRank", unsafe {
            sys::ncclCommInitRank(&mut raw, size as i32, id.0, rank as i32)
        })?;

        Ok(Comm {
            raw,
            rank,
            size,
            ordinal: gpu.ordinal,
            stream,
            _not_sync: std::marker::PhantomData,
        })
    }

    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    fn need(view: &View<'_>, count: usize, dtype: DType, what: &str) -> Result<()> {
        if dtype.matmul_only() {
            return Err(Error::Invalid(format!(
                "{what}: gpukit's collectives take f64, f32, f16 and bf16, not {dtype}"
            )));
        }
        view.require(count * dtype.size_bytes(), what)
    }

    /// `recv = op over ranks of send` (`count` elements each; in place when both are the same).
    pub fn all_reduce(
        &self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dtype: DType,
        op: RedOp,
    ) -> Result<()> {
        Self::need(&send, count, dtype, "all_reduce send")?;
        Self::need(&recv, count, dtype, "all_reduce recv")?;
        // SAFETY: both views hold `count` elements of `dtype` (checked) on this comm's device.
        check("ncclAllReduce", unsafe {
            sys::ncclAllReduce(
                send.addr() as *const c_void,
                recv.addr() as *mut c_void,
                count,
                raw_dtype(dtype),
                op.raw(),
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// Every rank's `send_count` elements, concatenated in rank order into every rank's `recv`.
    pub fn all_gather(
        &self,
        send: View<'_>,
        recv: View<'_>,
        send_count: usize,
        dtype: DType,
    ) -> Result<()> {
        Self::need(&send, send_count, dtype, "all_gather send")?;
        Self::need(&recv, send_count * self.size, dtype, "all_gather recv")?;
        // SAFETY: sizes checked above.
        check("ncclAllGather", unsafe {
            sys::ncclAllGather(
                send.addr() as *const c_void,
                recv.addr() as *mut c_void,
                send_count,
                raw_dtype(dtype),
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// The reduction of every rank's `send` (recv_count x size elements), rank r keeping block r.
    pub fn reduce_scatter(
        &self,
        send: View<'_>,
        recv: View<'_>,
        recv_count: usize,
        dtype: DType,
        op: RedOp,
    ) -> Result<()> {
        Self::need(&send, recv_count * self.size, dtype, "reduce_scatter send")?;
        Self::need(&recv, recv_count, dtype, "reduce_scatter recv")?;
        // SAFETY: sizes checked above.
        check("ncclReduceScatter", unsafe {
            sys::ncclReduceScatter(
                send.addr() as *const c_void,
                recv.addr() as *mut c_void,
                recv_count,
                raw_dtype(dtype),
                op.raw(),
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// Root's `send` into every rank's `recv`.
    pub fn broadcast(
        &self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dtype: DType,
        root: usize,
    ) -> Result<()> {
        Self::need(&send, count, dtype, "broadcast send")?;
        Self::need(&recv, count, dtype, "broadcast recv")?;
        // SAFETY: sizes checked above.
        check("ncclBroadcast", unsafe {
            sys::ncclBroadcast(
                send.addr() as *const c_void,
                recv.addr() as *mut c_void,
                count,
                raw_dtype(dtype),
                root as i32,
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// The reduction of every rank's `send` into root's `recv`.
    pub fn reduce(
        &self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dtype: DType,
        op: RedOp,
        root: usize,
    ) -> Result<()> {
        Self::need(&send, count, dtype, "reduce send")?;
        Self::need(&recv, count, dtype, "reduce recv")?;
        // SAFETY: sizes checked above.
        check("ncclReduce", unsafe {
            sys::ncclReduce(
                send.addr() as *const c_void,
                recv.addr() as *mut c_void,
                count,
                raw_dtype(dtype),
                op.raw(),
                root as i32,
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// Sends `count` elements to `peer` (pair with the peer's [`Comm::recv`], inside a group
    /// when a rank both sends and receives).
    pub fn send(&self, buf: View<'_>, count: usize, dtype: DType, peer: usize) -> Result<()> {
        Self::need(&buf, count, dtype, "send")?;
        // SAFETY: size checked above.
        check("ncclSend", unsafe {
            sys::ncclSend(
                buf.addr() as *const c_void,
                count,
                raw_dtype(dtype),
                peer as i32,
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// Receives `count` elements from `peer`.
    pub fn recv(&self, buf: View<'_>, count: usize, dtype: DType, peer: usize) -> Result<()> {
        Self::need(&buf, count, dtype, "recv")?;
        // SAFETY: size checked above.
        check("ncclRecv", unsafe {
            sys::ncclRecv(
                buf.addr() as *mut c_void,
                count,
                raw_dtype(dtype),
                peer as i32,
                self.raw,
                self.stream.cu() as _,
            )
        })
    }

    /// Block p of `send` (`count` elements) to rank p, block p of `recv` from rank p: grouped
    /// sends and receives, as nccl-tests builds it (ncclAlltoAll is only in the newest NCCL).
    /// Call inside a [`group`] when several GPUs of one process take part; it groups itself
    /// otherwise.
    pub fn all_to_all(
        &self,
        send: View<'_>,
        recv: View<'_>,
        count: usize,
        dtype: DType,
    ) -> Result<()> {
        let block = count * dtype.size_bytes();
        Self::need(&send, count * self.size, dtype, "alltoall send")?;
        Self::need(&recv, count * self.size, dtype, "alltoall recv")?;
        group(|| {
            for peer in 0..self.size {
                self.send(send.sub(peer * block, block)?, count, dtype, peer)?;
                self.recv(recv.sub(peer * block, block)?, count, dtype, peer)?;
            }
            Ok(())
        })
    }

    /// An error NCCL recorded asynchronously (a peer's network failure, ...), if any.
    pub fn async_error(&self) -> Result<()> {
        let mut rc = sys::ncclResult_t::ncclSuccess;
        // SAFETY: the comm is live; `rc` is a live local.
        check("ncclCommGetAsyncError", unsafe {
            sys::ncclCommGetAsyncError(self.raw, &mut rc)
        })?;
        check("a collective (asynchronous error)", rc)
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // Outstanding work must be done before the communicator goes; a failure here leaves
        // nothing to clean up that the process's exit will not.
        let _ = self.stream.synchronize();
        // SAFETY: the comm is live and dropped once.
        unsafe {
            sys::ncclCommDestroy(self.raw);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_bytes_round_trip_and_length_is_checked() {
        let bytes: Vec<u8> = (0..128).map(|i| (i * 3) as u8).collect();
        let id = UniqueId::from_bytes(&bytes).unwrap();
        assert_eq!(id.to_bytes(), bytes);
        assert!(UniqueId::from_bytes(&bytes[..127]).is_err());
    }

    #[test]
    fn reductions_parse_by_name() {
        for r in RedOp::ALL {
            assert_eq!(RedOp::parse(r.name()), Some(r));
        }
        assert_eq!(RedOp::parse("mean"), None);
    }
}
