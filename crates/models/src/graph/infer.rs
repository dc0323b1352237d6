//! Shape inference: the output shapes and types of each operator on its inputs, every size
//! checked (no overflow, no tensor over [`MAX_ELEMENTS`]). Small i64 values computed from
//! constants (the shape arithmetic exporters write before a Reshape) are evaluated on the way
//! ([`evaluate`]), since a Reshape's output shape depends on them; the graph keeps their nodes
//! until constant folding. `builder` applies both node by node.

use super::{cpu, DType, Data, Op, OutType};

/// The most elements any one tensor may have (cuDNN and most kernels index with 32 bits).
pub const MAX_ELEMENTS: usize = i32::MAX as usize;

/// The most elements of an i64 value evaluated during inference: shape arithmetic is tiny.
const MAX_KNOWN_ELEMENTS: usize = 1 << 16;

/// What inference sees of one input: its type, its shape, and its elements when known.
#[derive(Clone, Copy)]
pub(crate) struct In<'a> {
    pub dtype: DType,
    pub shape: &'a [usize],
    pub known: Option<&'a Data>,
}

/// The element count of `shape`, or an error past [`MAX_ELEMENTS`].
pub(crate) fn element_count(shape: &[usize]) -> Result<usize, String> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| format!("shape {shape:?} has more than {MAX_ELEMENTS} elements"))
}

/// numpy's broadcast of two shapes.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        (i + s.len())
            .checked_sub(rank)
            .map_or(1, |j| s.get(j).copied().unwrap_or(1))
    };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

fn want_rank(what: &str, i: &In, rank: usize) -> Result<(), String> {
    if i.shape.len() == rank {
        Ok(())
    } else {
        Err(format!("{what} has shape {:?}; {rank}-D expected", i.shape))
    }
}

fn want_f32(what: &str, i: &In) -> Result<(), String> {
    if i.dtype == DType::F32 {
        Ok(())
    } else {
        Err(format!("{what} is {:?}; f32 expected", i.dtype))
    }
}

fn want_count(inputs: &[In], range: std::ops::RangeInclusive<usize>) -> Result<(), String> {
    if range.contains(&inputs.len()) {
        Ok(())
    } else if range.start() == range.end() {
        Err(format!(
            "takes {} inputs, has {}",
            range.start(),
            inputs.len()
        ))
    } else {
        Err(format!(
            "takes {} to {} inputs, has {}",
            range.start(),
            range.end(),
            inputs.len()
        ))
    }
}

/// One spatial output extent: `(len + pads - span) / stride + 1`, rounded down or (pooling's
/// ceil mode) up, a window starting in the end padding dropped.
pub(crate) fn out_extent(
    len: usize,
    (pad_begin, pad_end): (usize, usize),
    span: usize,
    stride: usize,
    ceil: bool,
) -> Result<usize, String> {
    if stride == 0 || span == 0 {
        return Err("stride and kernel must be at least 1".into());
    }
    let padded = len
        .checked_add(pad_begin)
        .and_then(|x| x.checked_add(pad_end))
        .ok_or("padding overflows")?;
    let room = padded
        .checked_sub(span)
        .ok_or_else(|| format!("a window of {span} is larger than the padded input of {padded}"))?;
    let mut out = if ceil {
        room.div_ceil(stride)
    } else {
        room / stride
    } + 1;
    if ceil && (out - 1).saturating_mul(stride) >= len.saturating_add(pad_begin) {
        out -= 1;
    }
    Ok(out)
}

fn pair(len: usize, a: usize, b: usize) -> String {
    format!("{a}x{b} (of {len})")
}

fn infer_conv(c: &super::Conv, inputs: &[In]) -> Result<Vec<OutType>, String> {
    want_count(inputs, c.input_count()..=c.input_count())?;
    let (x, w) = (&inputs[0], &inputs[1]);
    want_rank("input X", x, 4)?;
    want_rank("weight W", w, 4)?;
    want_f32("input X", x)?;
    want_f32("weight W", w)?;
    let [n, ch, h, wd] = [x.shape[0], x.shape[1], x.shape[2], x.shape[3]];
    let [k, cg, r, s] = [w.shape[0], w.shape[1], w.shape[2], w.shape[3]];
    let g = c.groups;
    if g == 0 || ch % g != 0 || k % g != 0 || cg * g != ch {
        return Err(format!(
            "group {g} does not fit {ch} input channels, weight {:?} (needs [k, c / group, r, s] with k and c multiples of group)",
            w.shape
        ));
    }
    if [r, s] != c.kernel {
        return Err(format!(
            "kernel_shape {:?} differs from the weight's {:?}",
            c.kernel,
            [r, s]
        ));
    }
    if c.dilations.contains(&0) {
        return Err("dilations must be at least 1".into());
    }
    if let Some(b) = c.bias.then(|| &inputs[2]) {
        if b.shape != [k] {
            return Err(format!("bias B has shape {:?}; [{k}] expected", b.shape));
        }
        want_f32("bias B", b)?;
    }
    let span = |k: usize, d: usize| (k - 1).checked_mul(d).map(|x| x + 1);
    let (sr, ss) = (
        span(r.max(1), c.dilations[0]).ok_or("dilation overflows")?,
        span(s.max(1), c.dilations[1]).ok_or("dilation overflows")?,
    );
    if r == 0 || s == 0 {
        return Err(format!("kernel {} is empty", pair(0, r, s)));
    }
    let p = out_extent(h, (c.pads[0], c.pads[2]), sr, c.strides[0], false)?;
    let q = out_extent(wd, (c.pads[1], c.pads[3]), ss, c.strides[1], false)?;
    let out = vec![n, k, p, q];
    element_count(&out)?;
    if let Some(i) = c.residual_input() {
        if inputs[i].shape != out.as_slice() {
            return Err(format!(
                "residual has shape {:?}; the output's is {out:?}",
                inputs[i].shape
            ));
        }
    }
    Ok(vec![(DType::F32, out)])
}

fn infer_pool(p: &super::Pool, x: &In) -> Result<Vec<OutType>, String> {
    want_rank("input X", x, 4)?;
    want_f32("input X", x)?;
    for (i, &k) in p.kernel.iter().enumerate() {
        if p.pads[i] >= k || p.pads[i + 2] >= k {
            return Err(format!(
                "pads {:?} must be smaller than the kernel {:?}",
                p.pads, p.kernel
            ));
        }
    }
    let oh = out_extent(
        x.shape[2],
        (p.pads[0], p.pads[2]),
        p.kernel[0],
        p.strides[0],
        p.ceil_mode,
    )?;
    let ow = out_extent(
        x.shape[3],
        (p.pads[1], p.pads[3]),
        p.kernel[1],
        p.strides[1],
        p.ceil_mode,
    )?;
    Ok(vec![(DType::F32, vec![x.shape[0], x.shape[1], oh, ow])])
}

fn infer_matmul(a: &In, b: &In) -> Result<Vec<OutType>, String> {
    want_f32("input A", a)?;
    want_f32("input B", b)?;
    if a.shape.is_empty() || b.shape.is_empty() {
        return Err("MatMul needs inputs of rank 1 or more".into());
    }
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, ka) = if ra == 1 {
        (None, a.shape[0])
    } else {
        (Some(a.shape[ra - 2]), a.shape[ra - 1])
    };
    let (kb, n) = if rb == 1 {
        (b.shape[0], None)
    } else {
        (b.shape[rb - 2], Some(b.shape[rb - 1]))
    };
    if ka != kb {
        return Err(format!(
            "A {:?} and B {:?}: inner dimensions {ka} and {kb} differ",
            a.shape, b.shape
        ));
    }
    let batch_a = &a.shape[..ra.saturating_sub(2)];
    let batch_b = &b.shape[..rb.saturating_sub(2)];
    let mut out = broadcast(batch_a, batch_b)?;
    out.extend(m);
    out.extend(n);
    element_count(&out)?;
    Ok(vec![(DType::F32, out)])
}

fn infer_gemm(g: &super::Gemm, inputs: &[In]) -> Result<Vec<OutType>, String> {
    want_count(inputs, 2..=3)?;
    want_rank("input A", &inputs[0], 2)?;
    want_rank("input B", &inputs[1], 2)?;
    want_f32("input A", &inputs[0])?;
    want_f32("input B", &inputs[1])?;
    let (a, b) = (inputs[0].shape, inputs[1].shape);
    let (m, ka) = if g.trans_a {
        (a[1], a[0])
    } else {
        (a[0], a[1])
    };
    let (kb, n) = if g.trans_b {
        (b[1], b[0])
    } else {
        (b[0], b[1])
    };
    if ka != kb {
        return Err(format!(
            "A {a:?} and B {b:?} (transA {}, transB {}): inner dimensions {ka} and {kb} differ",
            g.trans_a, g.trans_b
        ));
    }
    if let Some(c) = inputs.get(2) {
        want_f32("input C", c)?;
        if broadcast(c.shape, &[m, n])? != [m, n] {
            return Err(format!("C {:?} does not broadcast to [{m}, {n}]", c.shape));
        }
    }
    Ok(vec![(DType::F32, vec![m, n])])
}

fn infer_reshape(inputs: &[In]) -> Result<Vec<OutType>, String> {
    want_count(inputs, 2..=2)?;
    let (x, s) = (&inputs[0], &inputs[1]);
    if s.dtype != DType::I64 || s.shape.len() != 1 {
        return Err(format!(
            "shape input is {:?} {:?}; a 1-D i64 tensor expected",
            s.dtype, s.shape
        ));
    }
    let Some(target) = s.known.and_then(Data::as_i64) else {
        return Err("the target shape is not a constant (gpukit needs static shapes)".into());
    };
    let total = element_count(x.shape)?;
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    for (i, &d) in target.iter().enumerate() {
        out.push(match d {
            0 => *x.shape.get(i).ok_or_else(|| {
                format!("target {target:?}: 0 at axis {i} copies an axis the input lacks")
            })?,
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                1
            }
            d => usize::try_from(d).map_err(|_| format!("target {target:?}: {d} is not a size"))?,
        });
    }
    let known = element_count(&out)?;
    if let Some(i) = infer_at {
        if known == 0 || total % known != 0 {
            return Err(format!("cannot reshape {:?} to {target:?}", x.shape));
        }
        out[i] = total / known;
    }
    if element_count(&out)? != total {
        return Err(format!(
            "cannot reshape {:?} ({total} elements) to {target:?}",
            x.shape
        ));
    }
    Ok(vec![(x.dtype, out)])
}

fn infer_norm(op: &Op, inputs: &[In]) -> Result<Vec<OutType>, String> {
    let x = &inputs[0];
    want_f32("input X", x)?;
    match op {
        Op::BatchNorm { .. } => {
            want_count(inputs, 5..=5)?;
            let c = *x.shape.get(1).ok_or("input X needs an axis 1 (channels)")?;
            for (i, name) in ["scale", "B", "input_mean", "input_var"].iter().enumerate() {
                let p = &inputs[i + 1];
                want_f32(name, p)?;
                if p.shape != [c] {
                    return Err(format!("{name} has shape {:?}; [{c}] expected", p.shape));
                }
            }
        }
        Op::LayerNorm { axis, .. } => {
            want_count(inputs, 2..=3)?;
            let normalized = x
                .shape
                .get(*axis..)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| format!("axis {axis} is out of range for {:?}", x.shape))?;
            if element_count(normalized)? == 0 {
                return Err("normalizes over no elements".into());
            }
            for (p, name) in inputs[1..].iter().zip(["Scale", "B"]) {
                want_f32(name, p)?;
                if broadcast(p.shape, normalized)? != normalized {
                    return Err(format!(
                        "{name} {:?} does not broadcast to the normalized shape {normalized:?}",
                        p.shape
                    ));
                }
            }
        }
        _ => return Err("not a normalization".into()),
    }
    Ok(vec![(DType::F32, x.shape.to_vec())])
}

fn sorted_axes(axes: &[usize], rank: usize) -> Result<(), String> {
    if axes.windows(2).all(|w| w[0] < w[1]) && axes.iter().all(|&a| a < rank) {
        Ok(())
    } else {
        Err(format!(
            "axes {axes:?} must be distinct and below rank {rank}"
        ))
    }
}

fn infer_layout(op: &Op, inputs: &[In]) -> Result<Vec<OutType>, String> {
    let x = &inputs[0];
    let rank = x.shape.len();
    let shape = match op {
        Op::Flatten { axis } => {
            if *axis > rank {
                return Err(format!("axis {axis} is beyond rank {rank}"));
            }
            vec![
                element_count(&x.shape[..*axis])?,
                element_count(&x.shape[*axis..])?,
            ]
        }
        Op::Transpose { perm } => {
            let mut seen = vec![false; rank];
            if perm.len() != rank
                || !perm
                    .iter()
                    .all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
            {
                return Err(format!("perm {perm:?} is not a permutation of {rank} axes"));
            }
            perm.iter().map(|&p| x.shape[p]).collect()
        }
        Op::Concat { axis } => {
            if *axis >= rank {
                return Err(format!("axis {axis} is out of range for rank {rank}"));
            }
            let mut out = x.shape.to_vec();
            for (i, y) in inputs.iter().enumerate().skip(1) {
                let same = y.shape.len() == rank
                    && y.dtype == x.dtype
                    && (0..rank).all(|a| a == *axis || y.shape[a] == x.shape[a]);
                if !same {
                    return Err(format!(
                        "input {i} ({:?} {:?}) does not fit input 0 ({:?} {:?}) along axis {axis}",
                        y.dtype, y.shape, x.dtype, x.shape
                    ));
                }
                out[*axis] = out[*axis]
                    .checked_add(y.shape[*axis])
                    .ok_or("size overflows")?;
            }
            out
        }
        Op::ReduceMean { axes, keep_dims } => {
            want_f32("input", x)?;
            sorted_axes(axes, rank)?;
            if axes.iter().any(|&a| x.shape[a] == 0) {
                return Err("the mean of no elements".into());
            }
            (0..rank)
                .filter_map(|a| match (axes.contains(&a), keep_dims) {
                    (false, _) => Some(x.shape[a]),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect()
        }
        Op::Gather { axis } => {
            let idx = inputs.get(1).ok_or("needs indices")?;
            if idx.dtype != DType::I64 {
                return Err("indices must be i64".into());
            }
            if *axis >= rank {
                return Err(format!("axis {axis} is out of range for rank {rank}"));
            }
            let mut out = x.shape[..*axis].to_vec();
            out.extend_from_slice(idx.shape);
            out.extend_from_slice(&x.shape[axis + 1..]);
            out
        }
        Op::Unsqueeze { axes } => {
            let out_rank = rank + axes.len();
            sorted_axes(axes, out_rank)?;
            let mut rest = x.shape.iter();
            (0..out_rank)
                .map(|a| {
                    if axes.contains(&a) {
                        1
                    } else {
                        rest.next().copied().unwrap_or(1)
                    }
                })
                .collect()
        }
        Op::Squeeze { axes } => {
            sorted_axes(axes, rank)?;
            if let Some(&a) = axes.iter().find(|&&a| x.shape[a] != 1) {
                return Err(format!("axis {a} of {:?} is not of size 1", x.shape));
            }
            (0..rank)
                .filter(|a| !axes.contains(a))
                .map(|a| x.shape[a])
                .collect()
        }
        _ => return Err("not a layout operator".into()),
    };
    element_count(&shape)?;
    Ok(vec![(x.dtype, shape)])
}

/// The outputs' types and shapes of `op` on `inputs`, or what does not fit.
pub(crate) fn infer(op: &Op, inputs: &[In]) -> Result<Vec<OutType>, String> {
    let unary = |inputs: &[In], f32_only: bool| -> Result<Vec<OutType>, String> {
        want_count(inputs, 1..=1)?;
        if f32_only {
            want_f32("input", &inputs[0])?;
        }
        Ok(vec![(inputs[0].dtype, inputs[0].shape.to_vec())])
    };
    match op {
        Op::Constant { shape, value } => {
            want_count(inputs, 0..=0)?;
            if element_count(shape)? != value.len() {
                return Err(format!(
                    "value has {} elements; shape {shape:?} needs {}",
                    value.len(),
                    element_count(shape)?
                ));
            }
            Ok(vec![(value.dtype(), shape.clone())])
        }
        Op::Conv(c) => infer_conv(c, inputs),
        Op::Activation(_) | Op::Erf => unary(inputs, true),
        Op::Identity => unary(inputs, false),
        Op::Binary(_) => {
            want_count(inputs, 2..=2)?;
            if inputs[0].dtype != inputs[1].dtype {
                return Err(format!(
                    "inputs are {:?} and {:?}",
                    inputs[0].dtype, inputs[1].dtype
                ));
            }
            let out = broadcast(inputs[0].shape, inputs[1].shape)?;
            element_count(&out)?;
            Ok(vec![(inputs[0].dtype, out)])
        }
        Op::MatMul => {
            want_count(inputs, 2..=2)?;
            infer_matmul(&inputs[0], &inputs[1])
        }
        Op::Gemm(g) => infer_gemm(g, inputs),
        Op::MaxPool(p) | Op::AveragePool(p) => {
            want_count(inputs, 1..=1)?;
            infer_pool(p, &inputs[0])
        }
        Op::GlobalAveragePool => {
            want_count(inputs, 1..=1)?;
            let x = &inputs[0];
            want_f32("input X", x)?;
            if x.shape.len() < 3 || element_count(&x.shape[2..])? == 0 {
                return Err(format!(
                    "input X {:?} needs spatial axes with elements",
                    x.shape
                ));
            }
            let mut out = x.shape[..2].to_vec();
            out.resize(x.shape.len(), 1);
            Ok(vec![(DType::F32, out)])
        }
        Op::Reshape => infer_reshape(inputs),
        Op::BatchNorm { .. } | Op::LayerNorm { .. } => {
            want_count(inputs, 1..=5)?;
            infer_norm(op, inputs)
        }
        Op::Shape { start, end } => {
            want_count(inputs, 1..=1)?;
            if start > end || *end > inputs[0].shape.len() {
                return Err(format!(
                    "start {start} and end {end} do not fit rank {}",
                    inputs[0].shape.len()
                ));
            }
            Ok(vec![(DType::I64, vec![end - start])])
        }
        Op::Gather { .. } => {
            want_count(inputs, 2..=2)?;
            infer_layout(op, inputs)
        }
        Op::Concat { .. } => {
            if inputs.is_empty() {
                return Err("takes at least one input".into());
            }
            infer_layout(op, inputs)
        }
        Op::Flatten { .. }
        | Op::Transpose { .. }
        | Op::ReduceMean { .. }
        | Op::Unsqueeze { .. }
        | Op::Squeeze { .. } => {
            want_count(inputs, 1..=1)?;
            infer_layout(op, inputs)
        }
    }
}

/// The outputs of `op` when they can be known before running the graph: a Constant's value, a
/// Shape's, and any small i64 result of known inputs. Errors are the evaluation's (an index out
/// of range).
pub(crate) fn evaluate(
    op: &Op,
    inputs: &[In],
    outs: &[OutType],
) -> Result<Option<Vec<Data>>, String> {
    match op {
        Op::Constant { value, .. } => return Ok(Some(vec![value.clone()])),
        Op::Shape { start, end } => {
            let dims = inputs[0].shape[*start..*end]
                .iter()
                .map(|&d| d as i64)
                .collect();
            return Ok(Some(vec![Data::I64(dims)]));
        }
        _ => {}
    }
    let small_i64 = outs
        .iter()
        .all(|(t, s)| *t == DType::I64 && s.iter().product::<usize>() <= MAX_KNOWN_ELEMENTS);
    let views: Option<Vec<cpu::View>> = inputs
        .iter()
        .map(|i| i.known.map(|data| cpu::View::of(i.shape, data)))
        .collect();
    match views {
        Some(views) if small_i64 => cpu::run_op(op, &views, outs).map(Some),
        _ => Ok(None),
    }
}
