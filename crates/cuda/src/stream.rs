//! Streams and CUDA graphs, as gpukit's own types: everything above this crate orders its work
//! through a [`Stream`] and replays captured work through a [`Graph`], never through cudarc.
//!
//! To use: [`crate::driver::Gpu::stream`] is the device's work stream;
//! [`crate::driver::Gpu::new_stream`] makes another (copies in both directions at once);
//! [`crate::driver::Gpu::capture`] records what a closure enqueues as a [`Graph`].

use crate::error::{Error, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{sys, CudaEvent, CudaGraph, CudaStream};
use std::sync::Arc;

/// A CUDA stream: work queued on it runs in order.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<CudaStream>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stream")
    }
}

impl Stream {
    pub(crate) fn new(inner: Arc<CudaStream>) -> Stream {
        Stream { inner }
    }

    /// Waits until everything queued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.inner.synchronize()?)
    }

    pub(crate) fn raw(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    pub(crate) fn cu(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }
}

/// A point in a stream's work: other streams can wait for it, the host can wait for it.
pub struct Event {
    inner: CudaEvent,
}

impl Event {
    /// Waits until the stream has passed the point.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.inner.synchronize()?)
    }

    /// Device milliseconds from this mark to `later` (both from [`Stream::record_timed`], both
    /// passed).
    pub fn elapsed_ms(&self, later: &Event) -> Result<f64> {
        Ok(f64::from(self.inner.elapsed_ms(&later.inner)?))
    }
}

impl Stream {
    /// Marks the point after everything queued so far.
    pub fn record(&self) -> Result<Event> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        Ok(Event {
            inner: self.inner.record_event(flags)?,
        })
    }

    /// Marks the point with a timestamp: [`Event::elapsed_ms`] between two such marks, of this
    /// stream or of any stream of the same device, is device time.
    pub fn record_timed(&self) -> Result<Event> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        Ok(Event {
            inner: self.inner.record_event(flags)?,
        })
    }

    /// Makes work queued on this stream from now on wait for `event` (no host wait).
    pub fn wait(&self, event: &Event) -> Result<()> {
        Ok(self.inner.wait(&event.inner)?)
    }
}

/// Work captured once from a stream, replayed with one launch.
pub struct Graph {
    inner: CudaGraph,
}

impl Graph {
    /// Enqueues the captured work on the stream it was captured from (no synchronisation).
    pub fn launch(&self) -> Result<()> {
        Ok(self.inner.launch()?)
    }
}

impl Stream {
    /// As [`crate::driver::Gpu::capture`], on this stream.
    pub fn capture<E: From<Error>>(
        &self,
        enqueue: impl FnOnce() -> Result<(), E>,
    ) -> Result<Graph, E> {
        let stream = self.raw();
        stream.synchronize().map_err(Error::from)?;
        stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(Error::from)?;
        let enqueued = enqueue();
        let ended = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        enqueued?;
        let graph = ended
            .map_err(Error::from)?
            .ok_or_else(|| Error::Invalid("the captured graph is empty".into()))?;
        graph.upload().map_err(Error::from)?;
        Ok(Graph { inner: graph })
    }
}

/// Where work captured on a stream attaches in the graph being recorded: the nodes the next
/// captured work depends on, and their edges' data ([`Stream::capture_point`]).
#[derive(Debug, Clone)]
pub struct CapturePoint {
    nodes: Vec<sys::CUgraphNode>,
    edges: Vec<sys::CUgraphEdgeData>,
}

impl Stream {
    /// While the stream is capturing, where the next captured work would attach; None when it
    /// is not capturing.
    pub fn capture_point(&self) -> Result<Option<CapturePoint>> {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut id, mut graph) = (0u64, std::ptr::null_mut());
        let (mut deps, mut data, mut count) = (std::ptr::null(), std::ptr::null(), 0usize);
        // SAFETY: every out-pointer is a live local; the arrays returned stay valid until the
        // next call on the stream and are copied before it.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                self.cu(),
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut data,
                &mut count,
            )
        }
        .result()?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Ok(None);
        }
        let nodes = match count {
            0 => Vec::new(),
            // SAFETY: `count` nodes at `deps` (see above)
            _ => unsafe { std::slice::from_raw_parts(deps, count) }.to_vec(),
        };
        let edges = match data.is_null() || count == 0 {
            // SAFETY: all-zero edge data is the default edge
            true => vec![unsafe { std::mem::zeroed() }; count],
            // SAFETY: `count` edges' data at `data` (see above)
            false => unsafe { std::slice::from_raw_parts(data, count) }.to_vec(),
        };
        Ok(Some(CapturePoint { nodes, edges }))
    }

    /// Makes the next work captured on this stream attach at `point` alone (`join` false: a
    /// branch of the graph starts there) or at `point` as well as where it would have
    /// (`join` true: the branch's end and the stream's meet).
    pub fn attach_capture(&self, point: &CapturePoint, join: bool) -> Result<()> {
        let flags = match join {
            true => {
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES
            }
            false => {
                sys::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES
            }
        };
        let mut nodes = point.nodes.clone();
        // SAFETY: `nodes` and `edges` hold `nodes.len()` entries each and outlive the call
        unsafe {
            sys::cuStreamUpdateCaptureDependencies_v2(
                self.cu(),
                nodes.as_mut_ptr(),
                point.edges.as_ptr(),
                nodes.len(),
                flags as std::ffi::c_uint,
            )
        }
        .result()?;
        Ok(())
    }
}
