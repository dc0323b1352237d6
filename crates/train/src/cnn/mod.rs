//! Convolutional networks on the CPU, NCHW, in f32 (training) and f64 (the reference the
//! gradient checks use): the layers of a ResNet with forward and backward ([`layers`]),
//! cross-entropy with label smoothing ([`loss`]), ResNet-18/34/50 as torchvision builds them
//! with its state-dict names ([`resnet`]), SGD (momentum, Nesterov, weight decay) and AdamW
//! over the named parameters ([`optim`]). This path is the reference the GPU path ([`gpu`],
//! cuDNN) is tested against, and is itself compared with PyTorch (`scripts/cnn_reference.py`).

pub mod data;
pub mod gpu;
pub mod init;
pub mod layers;
pub mod loss;
pub mod optim;
pub mod resnet;
pub mod run;

#[cfg(test)]
mod tests;

/// A batch of feature maps: `shape` is (n, channels, height, width), `data` row-major NCHW.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor<T> {
    pub shape: [usize; 4],
    pub data: Vec<T>,
}

impl<T: crate::real::Real> Tensor<T> {
    /// Zeros of `shape`.
    pub fn zeros(shape: [usize; 4]) -> Tensor<T> {
        Tensor {
            shape,
            data: vec![T::ZERO; shape.iter().product()],
        }
    }

    /// `data` as a tensor of `shape`.
    ///
    /// # Panics
    ///
    /// If `data` does not hold `shape`'s element count.
    pub fn from_vec(shape: [usize; 4], data: Vec<T>) -> Tensor<T> {
        assert_eq!(
            data.len(),
            shape.iter().product::<usize>(),
            "tensor data does not fit its shape {shape:?}"
        );
        Tensor { shape, data }
    }

    /// Elements of one image-channel plane (height x width).
    pub fn plane(&self) -> usize {
        self.shape[2] * self.shape[3]
    }
}

/// One training update: forward in training mode (the running statistics move), the smoothed
/// cross-entropy of the logits against `labels`, backward, and the optimizer's step. Returns
/// the batch's loss (before the update) and how many of its images were classified right.
pub fn train_step<T: crate::real::Real>(
    model: &mut resnet::ResNet<T>,
    opt: &mut optim::CnnOptimizer<T>,
    images: &Tensor<T>,
    labels: &[u32],
    smoothing: f64,
) -> (f64, usize) {
    micro_step(
        (model, opt),
        &mut Vec::new(),
        (images, labels),
        smoothing,
        (0, 1),
    )
}

/// Micro-batch `i` of `k` of one update with gradient accumulation, as PyTorch accumulates:
/// forward in training mode (the running statistics move with every micro-batch), backward of
/// the loss divided by `k`, the gradients added into `acc`; after the last, the optimizer's step
/// on their sum (and `acc` emptied). `k = 1` is [`train_step`]. Returns the micro-batch's loss
/// and how many of its images were classified right.
pub fn micro_step<T: crate::real::Real>(
    (model, opt): (&mut resnet::ResNet<T>, &mut optim::CnnOptimizer<T>),
    acc: &mut Vec<Vec<T>>,
    (images, labels): (&Tensor<T>, &[u32]),
    smoothing: f64,
    (i, k): (usize, usize),
) -> (f64, usize) {
    let (logits, tape) = model.forward(images, resnet::Mode::Train);
    let mut dlogits = Vec::new();
    let (loss, correct) =
        loss::cross_entropy_smoothed(&logits, model.classes, labels, smoothing, &mut dlogits);
    if k > 1 {
        let inv = T::from_f64(1.0 / k as f64);
        for d in &mut dlogits {
            *d *= inv;
        }
    }
    let mut grads = model.zero_grads();
    model.backward(
        &tape.expect("training mode keeps a tape"),
        &dlogits,
        &mut grads,
    );
    if i == 0 || acc.len() != grads.len() {
        *acc = grads;
    } else {
        for (a, g) in acc.iter_mut().zip(&grads) {
            for (x, &y) in a.iter_mut().zip(g) {
                *x += y;
            }
        }
    }
    if i + 1 >= k {
        opt.update(model.params.iter_mut().map(|p| &mut p.data), acc);
        acc.clear();
    }
    (loss, correct)
}
