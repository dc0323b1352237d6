//! cuDNN's backend (graph) API at its lowest: descriptors that destroy themselves, and the
//! operation graph `y = act(conv(x, w) + bias [+ z])` (or the bare convolution; f32 arithmetic
//! inside, the storage type outside) built and finalized on a handle. Planning on it is
//! `backend`'s; the engine lists `engines`'. This file uses neither.

use super::{ok, Act, Conv};
use crate::error::Result;
use cudarc::cudnn::sys as dn;
use dn::cudnnBackendAttributeName_t as A;
use dn::cudnnBackendAttributeType_t as T;
use dn::cudnnBackendDescriptorType_t as D;
use gpukit_types::Layout;
use std::ffi::c_void;

/// An owned backend descriptor.
pub(super) struct Desc(pub(super) dn::cudnnBackendDescriptor_t);

// SAFETY: a backend descriptor is host memory cuDNN allocated; it may move to another thread
// (a helper thread finalizes a plan, the planner uses it), as long as no two threads use it at
// once, which ownership ensures (Desc is not Sync).
unsafe impl Send for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by cudnnBackendCreateDescriptor, destroyed only here.
            unsafe { dn::cudnnBackendDestroyDescriptor(self.0) };
        }
    }
}

impl Desc {
    pub(super) fn new(ty: D) -> Result<Desc> {
        let mut d = std::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        ok("cudnnBackendCreateDescriptor", unsafe {
            dn::cudnnBackendCreateDescriptor(ty, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Sets an attribute to `values` (`T` must be the C type that `ty` names).
    pub(super) fn set<V>(&self, name: A, ty: T, values: &[V]) -> Result<&Self> {
        // SAFETY: `values` is a live slice of the element type `ty` names (each caller pairs
        // them); cuDNN copies the values before returning.
        ok("cudnnBackendSetAttribute", unsafe {
            dn::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        })?;
        Ok(self)
    }

    pub(super) fn set_desc(&self, name: A, other: &[&Desc]) -> Result<&Self> {
        let raw: Vec<dn::cudnnBackendDescriptor_t> = other.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    pub(super) fn finalize(&self) -> Result<()> {
        // SAFETY: a live descriptor with its required attributes set.
        ok("cudnnBackendFinalize", unsafe {
            dn::cudnnBackendFinalize(self.0)
        })
    }
}

pub(super) const UID_X: i64 = 1;
pub(super) const UID_W: i64 = 2;
pub(super) const UID_B: i64 = 3;
pub(super) const UID_Z: i64 = 4;
pub(super) const UID_Y: i64 = 5;
/// The per-filter scale of an fp8 convolution ([`build_fp8_graph`]).
pub(super) const UID_S: i64 = 6;
pub(super) const UID_CONV: i64 = 10;
pub(super) const UID_BIASED: i64 = 11;

fn tensor(
    uid: i64,
    dims: [usize; 4],
    layout: Layout,
    dt: dn::cudnnDataType_t,
    is_virtual: bool,
) -> Result<Desc> {
    let strides = layout.strides(dims).map(|v| v as i64);
    let d = Desc::new(D::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[dt],
    )?
    .set(
        A::CUDNN_ATTR_TENSOR_DIMENSIONS,
        T::CUDNN_TYPE_INT64,
        &dims.map(|v| v as i64),
    )?
    .set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, &strides)?
    .set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[uid])?
    .set(
        A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        T::CUDNN_TYPE_INT64,
        &[16i64],
    )?
    .set(
        A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
        T::CUDNN_TYPE_BOOLEAN,
        &[is_virtual],
    )?;
    d.finalize()?;
    Ok(d)
}

fn pointwise(mode: dn::cudnnPointwiseMode_t) -> Result<Desc> {
    let d = Desc::new(D::CUDNN_BACKEND_POINTWISE_DESCRIPTOR)?;
    d.set(
        A::CUDNN_ATTR_POINTWISE_MODE,
        T::CUDNN_TYPE_POINTWISE_MODE,
        &[mode],
    )?
    .set(
        A::CUDNN_ATTR_POINTWISE_MATH_PREC,
        T::CUDNN_TYPE_DATA_TYPE,
        &[dn::cudnnDataType_t::CUDNN_DATA_FLOAT],
    )?;
    d.finalize()?;
    Ok(d)
}

/// The pointwise descriptor of an epilogue's activation.
fn activation(act: Act) -> Result<Desc> {
    use dn::cudnnPointwiseMode_t as M;
    pointwise(match act {
        Act::Relu => M::CUDNN_POINTWISE_RELU_FWD,
        Act::Swish => M::CUDNN_POINTWISE_SWISH_FWD,
        Act::Gelu => M::CUDNN_POINTWISE_GELU_FWD,
        Act::Sigmoid => M::CUDNN_POINTWISE_SIGMOID_FWD,
    })
}

fn pointwise_op(pw: &Desc, x: &Desc, b: Option<&Desc>, y: &Desc) -> Result<Desc> {
    let d = Desc::new(D::CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)?;
    d.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, &[pw])?
        .set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_XDESC, &[x])?
        .set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_YDESC, &[y])?;
    if let Some(b) = b {
        d.set_desc(A::CUDNN_ATTR_OPERATION_POINTWISE_BDESC, &[b])?;
    }
    d.finalize()?;
    Ok(d)
}

/// An operation graph and every descriptor it was built from (kept alive beside it).
pub(super) struct Built {
    pub graph: Desc,
    pub parts: Vec<Desc>,
}

impl Built {
    /// Every descriptor a plan finalized from this graph keeps alive: the graph, its parts, its
    /// engine configurations' descriptors and the heuristics that gave them.
    pub fn kept_with(self, configs: impl IntoIterator<Item = Desc>, heurs: Vec<Desc>) -> Vec<Desc> {
        let mut kept: Vec<Desc> = configs.into_iter().collect();
        kept.extend(heurs);
        kept.push(self.graph);
        kept.extend(self.parts);
        kept
    }
}

/// Builds and finalizes the operation graph `y = act(conv(x, w) + bias [+ z])` (each part of
/// the epilogue only when asked for; none: the bare convolution) on `handle`. The buffers do
/// not enter: a graph depends on shapes, layout and dtype only.
pub(super) fn build_graph(
    handle: dn::cudnnHandle_t,
    conv: Conv,
    bias: bool,
    residual: bool,
    act: Option<Act>,
) -> Result<Built> {
    let sh = conv.shape;
    let dt = conv.data_type()?;
    let f32t = dn::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let layout = conv.layout;
    let (p, q) = sh.out_hw();
    let out = [sh.n, sh.k, p, q];
    let (tx, tw) = operands(sh, layout, dt)?;
    // the epilogue in order: +bias, +residual, the activation; the conv's own output is a
    // virtual f32 tensor unless nothing follows it
    let epilogue = usize::from(bias) + usize::from(residual) + usize::from(act.is_some());
    let ty_out = tensor(UID_Y, out, layout, dt, false)?;
    let tconv = if epilogue == 0 {
        None
    } else {
        Some(tensor(UID_CONV, out, layout, f32t, true)?)
    };
    let tb = bias
        .then(|| tensor(UID_B, [1, sh.k, 1, 1], layout, dt, false))
        .transpose()?;
    let tz = residual
        .then(|| tensor(UID_Z, out, layout, dt, false))
        .transpose()?;
    let mut virtuals = Vec::new();
    for i in 0..epilogue.saturating_sub(1) {
        virtuals.push(tensor(UID_BIASED + i as i64, out, layout, f32t, true)?);
    }

    let desc = conv_desc(sh)?;
    let forward = conv_op(&tx, &tw, tconv.as_ref().unwrap_or(&ty_out), &desc)?;

    let add = pointwise(dn::cudnnPointwiseMode_t::CUDNN_POINTWISE_ADD)?;
    let act_pw = act.map(activation).transpose()?;
    let mut ops = vec![forward];
    if let Some(first) = &tconv {
        // each step reads the previous output; the last writes the real output tensor
        let outputs: Vec<&Desc> = virtuals.iter().chain(std::iter::once(&ty_out)).collect();
        let mut cur = first;
        let mut step = 0;
        for (pw, operand) in [(&add, tb.as_ref()), (&add, tz.as_ref())] {
            if let Some(b) = operand {
                ops.push(pointwise_op(pw, cur, Some(b), outputs[step])?);
                cur = outputs[step];
                step += 1;
            }
        }
        if let Some(pw) = &act_pw {
            ops.push(pointwise_op(pw, cur, None, outputs[step])?);
        }
    }

    let graph = operation_graph(handle, &ops.iter().collect::<Vec<_>>())?;
    let mut parts = vec![tx, tw, ty_out, desc, add];
    parts.extend(act_pw);
    parts.extend(tconv);
    parts.extend(tb);
    parts.extend(tz);
    parts.extend(virtuals);
    parts.extend(ops);
    Ok(Built { graph, parts })
}

/// The convolution's descriptor: cross-correlation in f32 with the shape's stride and padding.
fn conv_desc(sh: gpukit_types::ConvShape) -> Result<Desc> {
    let f32t = dn::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let desc = Desc::new(D::CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)?;
    let two = |v: usize| [v as i64, v as i64];
    desc.set(
        A::CUDNN_ATTR_CONVOLUTION_COMP_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[f32t],
    )?
    .set(
        A::CUDNN_ATTR_CONVOLUTION_CONV_MODE,
        T::CUDNN_TYPE_CONVOLUTION_MODE,
        &[dn::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION],
    )?
    .set(
        A::CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS,
        T::CUDNN_TYPE_INT64,
        &[2i64],
    )?
    .set(
        A::CUDNN_ATTR_CONVOLUTION_DILATIONS,
        T::CUDNN_TYPE_INT64,
        &two(1),
    )?
    .set(
        A::CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
        T::CUDNN_TYPE_INT64,
        &two(sh.stride),
    )?
    .set(
        A::CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS,
        T::CUDNN_TYPE_INT64,
        &two(sh.pad),
    )?
    .set(
        A::CUDNN_ATTR_CONVOLUTION_POST_PADDINGS,
        T::CUDNN_TYPE_INT64,
        &two(sh.pad),
    )?;
    desc.finalize()?;
    Ok(desc)
}

/// The forward convolution operation `y = conv(x, w)` (alpha 1, beta 0).
fn conv_op(tx: &Desc, tw: &Desc, ty: &Desc, desc: &Desc) -> Result<Desc> {
    let op = Desc::new(D::CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)?;
    op.set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, &[tx])?
        .set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, &[tw])?
        .set_desc(A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, &[ty])?
        .set_desc(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
            &[desc],
        )?
        .set(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
            T::CUDNN_TYPE_FLOAT,
            &[1f32],
        )?
        .set(
            A::CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA,
            T::CUDNN_TYPE_FLOAT,
            &[0f32],
        )?;
    op.finalize()?;
    Ok(op)
}

/// Builds and finalizes `y = conv(x, w) * scale` on `handle`, cuDNN's fp8 pattern: `x` and `w`
/// E4M3 (NHWC, the filters KRSC), sums in f32 into a virtual tensor, `scale` one f32 a
/// filter (the input's per-tensor scale times the filter's), `y` in `out` (a 16-bit type).
pub(super) fn build_fp8_graph(
    handle: dn::cudnnHandle_t,
    sh: gpukit_types::ConvShape,
    out: dn::cudnnDataType_t,
) -> Result<Built> {
    let f8 = dn::cudnnDataType_t::CUDNN_DATA_FP8_E4M3;
    let f32t = dn::cudnnDataType_t::CUDNN_DATA_FLOAT;
    let nhwc = Layout::Nhwc;
    let (p, q) = sh.out_hw();
    let dims_y = [sh.n, sh.k, p, q];
    let (tx, tw) = operands(sh, nhwc, f8)?;
    let tconv = tensor(UID_CONV, dims_y, nhwc, f32t, true)?;
    let ts = tensor(UID_S, [1, sh.k, 1, 1], nhwc, f32t, false)?;
    let ty = tensor(UID_Y, dims_y, nhwc, out, false)?;
    let desc = conv_desc(sh)?;
    let conv = conv_op(&tx, &tw, &tconv, &desc)?;
    let mul = pointwise(dn::cudnnPointwiseMode_t::CUDNN_POINTWISE_MUL)?;
    let scaled = pointwise_op(&mul, &tconv, Some(&ts), &ty)?;
    let graph = operation_graph(handle, &[&conv, &scaled])?;
    Ok(Built {
        graph,
        parts: vec![tx, tw, tconv, ts, ty, desc, mul, conv, scaled],
    })
}

/// The input and filter tensors of a convolution: grouped, each filter reads c / groups
/// channels (the backend infers the groups from it).
fn operands(
    sh: gpukit_types::ConvShape,
    layout: Layout,
    dt: dn::cudnnDataType_t,
) -> Result<(Desc, Desc)> {
    let tx = tensor(UID_X, [sh.n, sh.c, sh.h, sh.w], layout, dt, false)?;
    let tw = tensor(
        UID_W,
        [sh.k, sh.group_channels(), sh.r, sh.s],
        layout,
        dt,
        false,
    )?;
    Ok((tx, tw))
}

/// The finalized operation graph of `ops` on `handle`.
fn operation_graph(handle: dn::cudnnHandle_t, ops: &[&Desc]) -> Result<Desc> {
    let graph = Desc::new(D::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set_desc(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, ops)?.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    graph.finalize()?;
    Ok(graph)
}

/// A finalized variant pack: the buffers of `uids` at `ptrs`, and the workspace.
pub(super) fn variant_pack(uids: &[i64], ptrs: &[*mut c_void], ws: *mut c_void) -> Result<Desc> {
    let pack = Desc::new(D::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
    pack.set(
        A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
        T::CUDNN_TYPE_INT64,
        uids,
    )?
    .set(
        A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
        T::CUDNN_TYPE_VOID_PTR,
        ptrs,
    )?
    .set(
        A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
        T::CUDNN_TYPE_VOID_PTR,
        &[ws],
    )?;
    pack.finalize()?;
    Ok(pack)
}
