//! The layers of a ResNet, each a forward and a backward over [`Tensor`]s, parameters passed
//! in as slices (the model owns them by name):
//! - [`Conv2d`]: no bias, any kernel, stride and padding. The whole batch is unfolded into one
//!   matrix (im2col: rows channel x kernel position, columns image x output position), so a
//!   layer is one product forward (`W col`), one for the filter's gradient (`dY col^T`) and
//!   one for the data's (`W^T dY`, folded back by col2im), on the gemm crate.
//! - [`BatchNorm2d`]: training mode normalises by the batch's mean and biased variance and
//!   moves the running statistics by `momentum` towards the mean and the unbiased variance
//!   (PyTorch's rule); eval mode uses the running statistics.
//! - ReLU, max pooling (the gradient goes to the first largest value of each window, as
//!   PyTorch's CPU kernel picks it; NaN wins), global average pooling, linear, residual add.
//!
//! Sums over a batch (batch-norm statistics and their gradients) accumulate in f64 whatever
//! the element type.

use super::Tensor;
use crate::real::Real;
use gpukit_tensor::cpu::gemm_t;
use rayon::prelude::*;

/// A 2-D convolution without bias: weight (out, in, k, k) as PyTorch stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2d {
    pub in_channels: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl Conv2d {
    /// Elements of the weight.
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.in_channels * self.kernel * self.kernel
    }

    /// Output height and width for an input of `h` x `w`.
    pub fn out_size(&self, h: usize, w: usize) -> (usize, usize) {
        let o = |s: usize| (s + 2 * self.padding - self.kernel) / self.stride + 1;
        (o(h), o(w))
    }

    /// The batch unfolded: (in * k * k) rows of n * oh * ow, row `(c, ky, kx)`, column
    /// `(image, oy, ox)`; positions in the padding read zero.
    fn im2col<T: Real>(&self, x: &Tensor<T>) -> Vec<T> {
        let [n, c, h, w] = x.shape;
        assert_eq!(c, self.in_channels, "conv input channels");
        let (oh, ow) = self.out_size(h, w);
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let cols = n * oh * ow;
        let mut col = vec![T::ZERO; c * k * k * cols];
        if cols == 0 {
            return col;
        }
        col.par_chunks_mut(cols).enumerate().for_each(|(row, out)| {
            let (ci, ky, kx) = (row / (k * k), (row / k) % k, row % k);
            for (img, out) in out.chunks_exact_mut(oh * ow).enumerate() {
                let plane = &x.data[(img * c + ci) * h * w..][..h * w];
                for oy in 0..oh {
                    let iy = (oy * s + ky) as isize - p as isize;
                    if iy < 0 || iy >= h as isize {
                        continue;
                    }
                    let src = &plane[iy as usize * w..][..w];
                    let dst = &mut out[oy * ow..][..ow];
                    for (ox, d) in dst.iter_mut().enumerate() {
                        let ix = (ox * s + kx) as isize - p as isize;
                        if ix >= 0 && ix < w as isize {
                            *d = src[ix as usize];
                        }
                    }
                }
            }
        });
        col
    }

    /// The inverse gather of [`Conv2d::im2col`]: sums each column entry back onto the input
    /// position it was read from.
    fn col2im<T: Real>(&self, col: &[T], shape: [usize; 4]) -> Tensor<T> {
        let [n, c, h, w] = shape;
        let (oh, ow) = self.out_size(h, w);
        let (k, s, p) = (self.kernel, self.stride, self.padding);
        let cols = n * oh * ow;
        let mut dx = Tensor::zeros(shape);
        if h * w == 0 {
            return dx;
        }
        dx.data
            .par_chunks_mut(h * w)
            .enumerate()
            .for_each(|(idx, plane)| {
                let (img, ci) = (idx / c, idx % c);
                for ky in 0..k {
                    for kx in 0..k {
                        let row = (ci * k + ky) * k + kx;
                        let src = &col[row * cols + img * oh * ow..][..oh * ow];
                        for oy in 0..oh {
                            let iy = (oy * s + ky) as isize - p as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            let dst = &mut plane[iy as usize * w..][..w];
                            for ox in 0..ow {
                                let ix = (ox * s + kx) as isize - p as isize;
                                if ix >= 0 && ix < w as isize {
                                    dst[ix as usize] += src[oy * ow + ox];
                                }
                            }
                        }
                    }
                }
            });
        dx
    }

    /// `y = conv(x, weight)`.
    pub fn forward<T: Real>(&self, weight: &[T], x: &Tensor<T>) -> Tensor<T> {
        assert_eq!(weight.len(), self.weight_len(), "conv weight size");
        let [n, _, h, w] = x.shape;
        let (oh, ow) = self.out_size(h, w);
        let col = self.im2col(x);
        let (o, ckk, cols) = (
            self.out_channels,
            self.in_channels * self.kernel * self.kernel,
            n * oh * ow,
        );
        let mut yt = vec![T::ZERO; o * cols];
        gemm_t((false, false), (o, cols, ckk), weight, &col, &mut yt);
        // (out, image, position) -> (image, out, position)
        let mut y = Tensor::zeros([n, o, oh, ow]);
        let plane = oh * ow;
        for (oc, row) in yt.chunks_exact(cols.max(1)).enumerate() {
            for img in 0..n {
                y.data[(img * o + oc) * plane..][..plane]
                    .copy_from_slice(&row[img * plane..][..plane]);
            }
        }
        y
    }

    /// Backward from `dy`: adds the filter's gradient to `dweight`, and returns the input's
    /// gradient when `need_dx` (a network's first layer has no use for it).
    pub fn backward<T: Real>(
        &self,
        weight: &[T],
        x: &Tensor<T>,
        dy: &Tensor<T>,
        dweight: &mut [T],
        need_dx: bool,
    ) -> Option<Tensor<T>> {
        let [n, o, oh, ow] = dy.shape;
        let plane = oh * ow;
        let (ckk, cols) = (self.in_channels * self.kernel * self.kernel, n * plane);
        let mut dyt = vec![T::ZERO; o * cols];
        for (oc, row) in dyt.chunks_exact_mut(cols.max(1)).enumerate() {
            for img in 0..n {
                row[img * plane..][..plane]
                    .copy_from_slice(&dy.data[(img * o + oc) * plane..][..plane]);
            }
        }
        let col = self.im2col(x);
        let mut dw = vec![T::ZERO; o * ckk];
        gemm_t((false, true), (o, ckk, cols), &dyt, &col, &mut dw);
        for (a, &d) in dweight.iter_mut().zip(&dw) {
            *a += d;
        }
        if !need_dx {
            return None;
        }
        let mut dcol = col;
        gemm_t((true, false), (ckk, cols, o), weight, &dyt, &mut dcol);
        Some(self.col2im(&dcol, x.shape))
    }
}

/// Batch normalisation over (n, h, w) a channel, with PyTorch's defaults: eps 1e-5,
/// momentum 0.1, affine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchNorm2d {
    pub channels: usize,
    pub eps: f64,
    pub momentum: f64,
}

/// What training-mode batch norm keeps for backward: the normalised input and each channel's
/// 1 / sqrt(var + eps).
#[derive(Debug, Clone)]
pub struct BnCache<T> {
    pub xhat: Tensor<T>,
    pub invstd: Vec<T>,
}

impl BatchNorm2d {
    pub fn new(channels: usize) -> BatchNorm2d {
        BatchNorm2d {
            channels,
            eps: 1e-5,
            momentum: 0.1,
        }
    }

    /// Training mode: normalises by the batch statistics and updates the running mean and
    /// variance (`r = (1 - momentum) r + momentum stat`, the variance's statistic unbiased:
    /// times m / (m - 1) for m values a channel).
    pub fn forward_train<T: Real>(
        &self,
        (gamma, beta): (&[T], &[T]),
        (running_mean, running_var): (&mut [T], &mut [T]),
        x: &Tensor<T>,
    ) -> (Tensor<T>, BnCache<T>) {
        let [n, c, _, _] = x.shape;
        assert_eq!(c, self.channels, "batch norm channels");
        let plane = x.plane();
        let m = (n * plane) as f64;
        let mut y = Tensor::zeros(x.shape);
        let mut xhat = Tensor::zeros(x.shape);
        let mut invstd = vec![T::ZERO; c];
        for ci in 0..c {
            let values = || (0..n).flat_map(move |img| &x.data[(img * c + ci) * plane..][..plane]);
            let mean = values().map(|v| v.to_f64()).sum::<f64>() / m;
            let var = values().map(|v| (v.to_f64() - mean).powi(2)).sum::<f64>() / m;
            let inv = 1.0 / (var + self.eps).sqrt();
            invstd[ci] = T::from_f64(inv);
            let (meant, invt) = (T::from_f64(mean), T::from_f64(inv));
            for img in 0..n {
                let at = (img * c + ci) * plane;
                for ((yv, hv), &xv) in y.data[at..at + plane]
                    .iter_mut()
                    .zip(&mut xhat.data[at..at + plane])
                    .zip(&x.data[at..at + plane])
                {
                    *hv = (xv - meant) * invt;
                    *yv = *hv * gamma[ci] + beta[ci];
                }
            }
            let mom = self.momentum;
            let unbiased = if m > 1.0 { var * m / (m - 1.0) } else { var };
            running_mean[ci] = T::from_f64((1.0 - mom) * running_mean[ci].to_f64() + mom * mean);
            running_var[ci] = T::from_f64((1.0 - mom) * running_var[ci].to_f64() + mom * unbiased);
        }
        (y, BnCache { xhat, invstd })
    }

    /// Eval mode: `(x - running_mean) / sqrt(running_var + eps) * gamma + beta`.
    pub fn forward_eval<T: Real>(
        &self,
        (gamma, beta): (&[T], &[T]),
        (running_mean, running_var): (&[T], &[T]),
        x: &Tensor<T>,
    ) -> Tensor<T> {
        let c = x.shape[1];
        let plane = x.plane();
        let mut y = x.clone();
        for (idx, chunk) in y.data.chunks_exact_mut(plane.max(1)).enumerate() {
            let ci = idx % c;
            let inv = T::from_f64(1.0 / (running_var[ci].to_f64() + self.eps).sqrt());
            for v in chunk {
                *v = (*v - running_mean[ci]) * inv * gamma[ci] + beta[ci];
            }
        }
        y
    }

    /// Training-mode backward: adds `sum(dy xhat)` to `dgamma` and `sum(dy)` to `dbeta`, and
    /// returns `dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat))`.
    pub fn backward<T: Real>(
        &self,
        gamma: &[T],
        cache: &BnCache<T>,
        dy: &Tensor<T>,
        (dgamma, dbeta): (&mut [T], &mut [T]),
    ) -> Tensor<T> {
        let [n, c, _, _] = dy.shape;
        let plane = dy.plane();
        let m = (n * plane) as f64;
        let mut dx = Tensor::zeros(dy.shape);
        for ci in 0..c {
            let (mut sum, mut dot) = (0.0, 0.0);
            for img in 0..n {
                let at = (img * c + ci) * plane;
                for (&d, &h) in dy.data[at..at + plane]
                    .iter()
                    .zip(&cache.xhat.data[at..at + plane])
                {
                    sum += d.to_f64();
                    dot += (d * h).to_f64();
                }
            }
            dgamma[ci] += T::from_f64(dot);
            dbeta[ci] += T::from_f64(sum);
            let k = gamma[ci] * cache.invstd[ci];
            let (mean_dy, mean_dot) = (T::from_f64(sum / m), T::from_f64(dot / m));
            for img in 0..n {
                let at = (img * c + ci) * plane;
                for ((o, &d), &h) in dx.data[at..at + plane]
                    .iter_mut()
                    .zip(&dy.data[at..at + plane])
                    .zip(&cache.xhat.data[at..at + plane])
                {
                    *o = k * (d - mean_dy - h * mean_dot);
                }
            }
        }
        dx
    }
}

/// ReLU in place; a NaN stays NaN.
pub fn relu_inplace<T: Real>(x: &mut Tensor<T>) {
    for v in &mut x.data {
        if *v < T::ZERO {
            *v = T::ZERO;
        }
    }
}

/// ReLU's backward from its output: `dy` where the output is positive, zero elsewhere.
pub fn relu_backward<T: Real>(out: &Tensor<T>, dy: &mut Tensor<T>) {
    for (d, &o) in dy.data.iter_mut().zip(&out.data) {
        if o.partial_cmp(&T::ZERO) != Some(std::cmp::Ordering::Greater) {
            *d = T::ZERO;
        }
    }
}

/// `a += b`, the residual connection (its backward hands the same gradient to both).
pub fn add_inplace<T: Real>(a: &mut Tensor<T>, b: &Tensor<T>) {
    assert_eq!(a.shape, b.shape, "residual add shapes");
    for (x, &y) in a.data.iter_mut().zip(&b.data) {
        *x += y;
    }
}

/// Max pooling (floor mode, padding never chosen).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2d {
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl MaxPool2d {
    pub fn out_size(&self, h: usize, w: usize) -> (usize, usize) {
        let o = |s: usize| (s + 2 * self.padding - self.kernel) / self.stride + 1;
        (o(h), o(w))
    }

    /// The pooled maps and, for each output, the index in its input plane of the value taken
    /// (the first largest in row-major window order; a NaN is taken).
    pub fn forward<T: Real>(&self, x: &Tensor<T>) -> (Tensor<T>, Vec<u32>) {
        let [n, c, h, w] = x.shape;
        let (oh, ow) = self.out_size(h, w);
        let mut y = Tensor::zeros([n, c, oh, ow]);
        let mut arg = vec![0u32; y.data.len()];
        let (k, s, p) = (
            self.kernel as isize,
            self.stride as isize,
            self.padding as isize,
        );
        for idx in 0..n * c {
            let plane = &x.data[idx * h * w..][..h * w];
            for oy in 0..oh {
                for ox in 0..ow {
                    // PyTorch's CPU kernel: from -inf, take a value larger than the best or a
                    // NaN; the index starts at the window's first in-bounds position
                    let mut best = T::from_f64(f64::NEG_INFINITY);
                    let mut at = None;
                    for ky in 0..k {
                        let iy = oy as isize * s - p + ky;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        for kx in 0..k {
                            let ix = ox as isize * s - p + kx;
                            if ix < 0 || ix >= w as isize {
                                continue;
                            }
                            let i = iy as usize * w + ix as usize;
                            let v = plane[i];
                            at.get_or_insert(i);
                            #[allow(clippy::eq_op)] // v != v: NaN
                            if v > best || v != v {
                                best = v;
                                at = Some(i);
                            }
                        }
                    }
                    let o = (idx * oh + oy) * ow + ox;
                    y.data[o] = best;
                    arg[o] = at.unwrap_or(0) as u32;
                }
            }
        }
        (y, arg)
    }

    /// Each output's gradient added to the input position it took.
    pub fn backward<T: Real>(
        &self,
        in_shape: [usize; 4],
        arg: &[u32],
        dy: &Tensor<T>,
    ) -> Tensor<T> {
        let mut dx = Tensor::zeros(in_shape);
        let plane_in = in_shape[2] * in_shape[3];
        let plane_out = dy.plane();
        for (o, (&d, &a)) in dy.data.iter().zip(arg).enumerate() {
            dx.data[(o / plane_out.max(1)) * plane_in + a as usize] += d;
        }
        dx
    }
}

/// Global average pooling: (n, c, h, w) to n rows of c means.
pub fn avgpool_forward<T: Real>(x: &Tensor<T>) -> Vec<T> {
    let plane = x.plane();
    let inv = T::from_f64(1.0 / plane as f64);
    x.data
        .chunks_exact(plane)
        .map(|p| {
            let mut s = T::ZERO;
            for &v in p {
                s += v;
            }
            s * inv
        })
        .collect()
}

/// Average pooling's backward: each row's gradient spread evenly over its plane.
pub fn avgpool_backward<T: Real>(in_shape: [usize; 4], dy: &[T]) -> Tensor<T> {
    let plane = in_shape[2] * in_shape[3];
    let inv = T::from_f64(1.0 / plane as f64);
    let mut dx = Tensor::zeros(in_shape);
    for (p, &d) in dx.data.chunks_exact_mut(plane).zip(dy) {
        p.fill(d * inv);
    }
    dx
}

/// A linear layer `y = x W^T + b` over n rows: weight (outputs, inputs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    pub inputs: usize,
    pub outputs: usize,
}

impl Linear {
    pub fn forward<T: Real>(&self, (weight, bias): (&[T], &[T]), x: &[T]) -> Vec<T> {
        let n = x.len() / self.inputs;
        let mut y = vec![T::ZERO; n * self.outputs];
        gemm_t(
            (false, true),
            (n, self.outputs, self.inputs),
            x,
            weight,
            &mut y,
        );
        for row in y.chunks_exact_mut(self.outputs) {
            for (v, &b) in row.iter_mut().zip(bias) {
                *v += b;
            }
        }
        y
    }

    /// Adds `dy^T x` to `dweight` and the column sums of `dy` to `dbias`; returns `dy W`.
    pub fn backward<T: Real>(
        &self,
        weight: &[T],
        x: &[T],
        dy: &[T],
        (dweight, dbias): (&mut [T], &mut [T]),
    ) -> Vec<T> {
        let n = x.len() / self.inputs;
        let mut dw = vec![T::ZERO; weight.len()];
        gemm_t(
            (true, false),
            (self.outputs, self.inputs, n),
            dy,
            x,
            &mut dw,
        );
        for (a, &d) in dweight.iter_mut().zip(&dw) {
            *a += d;
        }
        for row in dy.chunks_exact(self.outputs) {
            for (a, &d) in dbias.iter_mut().zip(row) {
                *a += d;
            }
        }
        let mut dx = vec![T::ZERO; x.len()];
        gemm_t(
            (false, false),
            (n, self.inputs, self.outputs),
            dy,
            weight,
            &mut dx,
        );
        dx
    }
}
