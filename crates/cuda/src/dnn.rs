//! Convolution on the GPU through cuDNN, with the algorithm chosen by measurement
//! (`cudnnFindConvolutionForwardAlgorithmEx` runs every applicable algorithm on the real buffers).
//!
//! To use: [`Dnn::new`] on an open [`Gpu`]; [`Dnn::plan_conv`] describes one convolution and
//! measures its algorithms; [`Dnn::conv_forward`] runs the chosen one.

use crate::blas::DeviceBytes;
use crate::driver::{CudaError, Gpu};
use crate::loader::{Discovery, Lib};
use cudarc::cudnn::sys as dn;
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use std::ffi::c_void;
use std::sync::Arc;

/// Element type and arithmetic of a convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvType {
    /// f32 storage, f32 arithmetic (no tensor cores).
    F32,
    /// f32 storage, TF32 tensor cores allowed.
    Tf32,
    /// f16 storage, f32 accumulation, tensor cores.
    F16,
}

impl ConvType {
    pub fn elem_bytes(self) -> usize {
        match self {
            ConvType::F32 | ConvType::Tf32 => 4,
            ConvType::F16 => 2,
        }
    }

    fn data_type(self) -> dn::cudnnDataType_t {
        match self {
            ConvType::F32 | ConvType::Tf32 => dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
            ConvType::F16 => dn::cudnnDataType_t::CUDNN_DATA_HALF,
        }
    }

    fn math(self) -> dn::cudnnMathType_t {
        match self {
            // FMA_MATH forbids TF32, which cuDNN otherwise uses for f32 on Ampere and newer
            ConvType::F32 => dn::cudnnMathType_t::CUDNN_FMA_MATH,
            ConvType::Tf32 | ConvType::F16 => dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        }
    }
}

/// A 2-D convolution's shape: input N,C,H,W; filter K,C,R,S; no dilation, one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvDims {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub stride: usize,
    pub pad: usize,
    /// NHWC activations and KRSC filters; NCHW and KCRS otherwise.
    pub nhwc: bool,
}

impl ConvDims {
    pub fn out_hw(&self) -> (usize, usize) {
        (
            (self.h + 2 * self.pad - self.r) / self.stride + 1,
            (self.w + 2 * self.pad - self.s) / self.stride + 1,
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DnnError {
    #[error("{0}")]
    Cuda(#[from] CudaError),
    #[error("{call} failed: {status:?}")]
    Status {
        call: &'static str,
        status: dn::cudnnStatus_t,
    },
    #[error("cuDNN has no algorithm for this convolution ({0})")]
    NoAlgorithm(String),
}

fn ok(call: &'static str, status: dn::cudnnStatus_t) -> Result<(), DnnError> {
    if status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(DnnError::Status { call, status })
    }
}

/// Largest workspace an algorithm may use.
pub const CONV_WORKSPACE_BYTES: usize = 256 << 20;

/// A cuDNN handle on one stream, with its workspace.
pub struct Dnn {
    stream: Arc<CudaStream>,
    handle: dn::cudnnHandle_t,
    workspace: DeviceBytes,
}

/// Descriptors of one convolution and the algorithm measured fastest for it.
pub struct ConvPlan {
    x: dn::cudnnTensorDescriptor_t,
    w: dn::cudnnFilterDescriptor_t,
    y: dn::cudnnTensorDescriptor_t,
    conv: dn::cudnnConvolutionDescriptor_t,
    algo: dn::cudnnConvolutionFwdAlgo_t,
    workspace_bytes: usize,
    pub dims: ConvDims,
    pub ty: ConvType,
    /// The chosen algorithm's name and cuDNN's own time for it (ms).
    pub algo_name: String,
    pub algo_ms: f32,
}

impl Drop for ConvPlan {
    fn drop(&mut self) {
        // SAFETY: created in plan_conv, destroyed only here.
        unsafe {
            dn::cudnnDestroyTensorDescriptor(self.x);
            dn::cudnnDestroyTensorDescriptor(self.y);
            dn::cudnnDestroyFilterDescriptor(self.w);
            dn::cudnnDestroyConvolutionDescriptor(self.conv);
        }
    }
}

impl Dnn {
    pub fn new(discovery: &Discovery, gpu: &Gpu) -> Result<Dnn, DnnError> {
        if !discovery.usable(Lib::Cudnn) {
            return Err(CudaError::MissingLibrary(discovery.missing_message(Lib::Cudnn)).into());
        }
        // SAFETY: asks the loader only.
        if !unsafe { dn::is_culib_present() } {
            return Err(
                CudaError::MissingLibrary("cuDNN was found but did not load".into()).into(),
            );
        }
        gpu.ctx.bind_to_thread().map_err(CudaError::from)?;
        let workspace = gpu.alloc(CONV_WORKSPACE_BYTES)?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        ok("cudnnCreate", unsafe { dn::cudnnCreate(&mut handle) })?;
        // SAFETY: live handle; the stream outlives it (kept in self).
        if let Err(e) = ok("cudnnSetStream", unsafe {
            dn::cudnnSetStream(handle, gpu.stream.cu_stream() as _)
        }) {
            // SAFETY: created above.
            unsafe { dn::cudnnDestroy(handle) };
            return Err(e);
        }
        Ok(Dnn {
            stream: gpu.stream.clone(),
            handle,
            workspace,
        })
    }

    /// Describes the convolution and measures cuDNN's algorithms on the given buffers (which it
    /// overwrites: `y`), keeping the fastest one that succeeded.
    pub fn plan_conv(
        &self,
        dims: ConvDims,
        ty: ConvType,
        x: &DeviceBytes,
        w: &DeviceBytes,
        y: &mut DeviceBytes,
    ) -> Result<ConvPlan, DnnError> {
        let dt = ty.data_type();
        let fmt = if dims.nhwc {
            dn::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC
        } else {
            dn::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW
        };
        let (p, q) = dims.out_hw();
        let i = |v: usize| v as i32;
        let mut plan = ConvPlan {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: dn::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            workspace_bytes: 0,
            dims,
            ty,
            algo_name: String::new(),
            algo_ms: 0.0,
        };
        // SAFETY: each create writes a descriptor that `plan` owns and destroys on drop (also on
        // an early return, since the fields are set as they are created).
        unsafe {
            ok(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut plan.x),
            )?;
            ok(
                "cudnnCreateTensorDescriptor",
                dn::cudnnCreateTensorDescriptor(&mut plan.y),
            )?;
            ok(
                "cudnnCreateFilterDescriptor",
                dn::cudnnCreateFilterDescriptor(&mut plan.w),
            )?;
            ok(
                "cudnnCreateConvolutionDescriptor",
                dn::cudnnCreateConvolutionDescriptor(&mut plan.conv),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(
                    plan.x,
                    fmt,
                    dt,
                    i(dims.n),
                    i(dims.c),
                    i(dims.h),
                    i(dims.w),
                ),
            )?;
            ok(
                "cudnnSetFilter4dDescriptor",
                dn::cudnnSetFilter4dDescriptor(
                    plan.w,
                    dt,
                    fmt,
                    i(dims.k),
                    i(dims.c),
                    i(dims.r),
                    i(dims.s),
                ),
            )?;
            ok(
                "cudnnSetTensor4dDescriptor",
                dn::cudnnSetTensor4dDescriptor(plan.y, fmt, dt, i(dims.n), i(dims.k), i(p), i(q)),
            )?;
            ok(
                "cudnnSetConvolution2dDescriptor",
                dn::cudnnSetConvolution2dDescriptor(
                    plan.conv,
                    i(dims.pad),
                    i(dims.pad),
                    i(dims.stride),
                    i(dims.stride),
                    1,
                    1,
                    dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    dn::cudnnDataType_t::CUDNN_DATA_FLOAT,
                ),
            )?;
            ok(
                "cudnnSetConvolutionMathType",
                dn::cudnnSetConvolutionMathType(plan.conv, ty.math()),
            )?;
        }
        let e = ty.elem_bytes();
        for (have, need) in [
            (x.len(), dims.n * dims.c * dims.h * dims.w * e),
            (w.len(), dims.k * dims.c * dims.r * dims.s * e),
            (y.len(), dims.n * dims.k * p * q * e),
        ] {
            if have < need {
                return Err(CudaError::Invalid(format!(
                    "convolution buffer of {have} bytes, needs {need}"
                ))
                .into());
            }
        }
        let mut max = 0;
        // SAFETY: live handle, out-pointer to a local.
        ok("cudnnGetConvolutionForwardAlgorithmMaxCount", unsafe {
            dn::cudnnGetConvolutionForwardAlgorithmMaxCount(self.handle, &mut max)
        })?;
        // SAFETY: zeroed POD structs, overwritten by cuDNN.
        let mut perf: Vec<dn::cudnnConvolutionFwdAlgoPerfStruct> =
            vec![unsafe { std::mem::zeroed() }; max.max(1) as usize];
        let mut returned = 0;
        {
            let (px, _gx) = x.device_ptr(&self.stream);
            let (pw, _gw) = w.device_ptr(&self.stream);
            let (py, _gy) = y.device_ptr_mut(&self.stream);
            let (pws, _gws) = self.workspace.device_ptr(&self.stream);
            // SAFETY: descriptors match the buffers (sizes checked above); the workspace is ours.
            ok("cudnnFindConvolutionForwardAlgorithmEx", unsafe {
                dn::cudnnFindConvolutionForwardAlgorithmEx(
                    self.handle,
                    plan.x,
                    px as *const c_void,
                    plan.w,
                    pw as *const c_void,
                    plan.conv,
                    plan.y,
                    py as *mut c_void,
                    perf.len() as i32,
                    &mut returned,
                    perf.as_mut_ptr(),
                    pws as *mut c_void,
                    CONV_WORKSPACE_BYTES,
                )
            })?;
        }
        perf.truncate(returned.max(0) as usize);
        // cuDNN sorts by time; f32 must also not have slipped onto tensor cores
        let best = perf
            .iter()
            .filter(|r| r.status == dn::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
            .filter(|r| r.memory <= CONV_WORKSPACE_BYTES)
            .find(|r| {
                ty != ConvType::F32 || r.mathType != dn::cudnnMathType_t::CUDNN_TENSOR_OP_MATH
            })
            .ok_or_else(|| DnnError::NoAlgorithm(format!("{dims:?} {ty:?}")))?;
        plan.algo = best.algo;
        plan.workspace_bytes = best.memory;
        plan.algo_ms = best.time;
        plan.algo_name = format!("{:?}", best.algo)
            .trim_start_matches("CUDNN_CONVOLUTION_FWD_ALGO_")
            .to_string();
        // SAFETY: live descriptor; the chosen row's math type is what it was measured with.
        ok("cudnnSetConvolutionMathType", unsafe {
            dn::cudnnSetConvolutionMathType(plan.conv, best.mathType)
        })?;
        Ok(plan)
    }

    /// y = conv(x, w) with the plan's algorithm.
    pub fn conv_forward(
        &self,
        plan: &ConvPlan,
        x: &DeviceBytes,
        w: &DeviceBytes,
        y: &mut DeviceBytes,
    ) -> Result<(), DnnError> {
        let (alpha, beta) = (1f32, 0f32);
        let (px, _gx) = x.device_ptr(&self.stream);
        let (pw, _gw) = w.device_ptr(&self.stream);
        let (py, _gy) = y.device_ptr_mut(&self.stream);
        let (pws, _gws) = self.workspace.device_ptr(&self.stream);
        // SAFETY: the plan was built for buffers of these sizes (checked in plan_conv; callers
        // pass the same buffers or ones as large); scalars are f32 as cuDNN wants for
        // float/half data.
        ok("cudnnConvolutionForward", unsafe {
            dn::cudnnConvolutionForward(
                self.handle,
                &alpha as *const f32 as *const c_void,
                plan.x,
                px as *const c_void,
                plan.w,
                pw as *const c_void,
                plan.conv,
                plan.algo,
                pws as *mut c_void,
                plan.workspace_bytes,
                &beta as *const f32 as *const c_void,
                plan.y,
                py as *mut c_void,
            )
        })
    }
}

impl Drop for Dnn {
    fn drop(&mut self) {
        // SAFETY: created in new(), destroyed only here, after queued work finished.
        unsafe {
            let _ = self.stream.synchronize();
            dn::cudnnDestroy(self.handle);
        }
    }
}
