//! A [`GpuResNet`]'s state between the host and the device: the model's parameters and
//! running statistics (filters permuted to KRSC and padded where the trainer holds them so),
//! the optimizer's moments and step state, the loss scale, and the gradients read back.

use super::*;

impl GpuResNet {
    /// Parameter-shaped tensors in the CPU model's order and shapes moved to the device's
    /// (filters KRSC when channels-last, the stem's over 2x2 blocks), or back from it (an error
    /// where a blocked stem's unused tap is not zero).
    fn reorder(&self, tensors: Vec<Vec<f32>>, to_device: bool) -> Result<Vec<Vec<f32>>> {
        let permute = if to_device {
            channels_last
        } else {
            channels_first
        };
        tensors
            .into_iter()
            .zip(&self.filters)
            .map(|(t, f)| match *f {
                Some(DeviceFilter::Krsc { k, c, taps, wide }) if to_device => {
                    pad_rows(&permute(&t, (k, c, taps))?, (k * taps, c, wide))
                }
                Some(DeviceFilter::Krsc { k, c, taps, wide }) => {
                    permute(&unpad_rows(&t, (k * taps, c, wide))?, (k, c, taps))
                }
                Some(DeviceFilter::Blocks { k }) if to_device => stem::filter_to_blocks(&t, k),
                Some(DeviceFilter::Blocks { k }) => stem::filter_from_blocks(&t, k),
                None => Ok(t),
            })
            .collect()
    }

    /// A flat f32 buffer of parameter-shaped tensors read back in the CPU model's order.
    fn download_params(&self, buf: &DeviceBuffer) -> Result<Vec<Vec<f32>>> {
        let flat = decode_f32(&self.gpu.download(buf)?, F32);
        self.reorder(self.params_layout.unpack(&flat)?, false)
    }

    /// Parameter-shaped tensors in the CPU model's order packed into a flat buffer's layout.
    fn pack_params<'a>(&self, tensors: impl IntoIterator<Item = &'a [f32]>) -> Result<Vec<f32>> {
        let device = self.reorder(tensors.into_iter().map(<[f32]>::to_vec).collect(), true)?;
        self.params_layout.pack(device.iter().map(Vec::as_slice))
    }

    /// Uploads the model's parameters, running statistics and batch count, and starts the
    /// optimizer afresh.
    pub fn load(&mut self, model: &ResNet<f32>) -> Result<()> {
        if model.depth != self.depth || model.classes != self.classes {
            return Err(Error::Setting(format!(
                "a {:?} of {} classes loaded into a GPU {:?} of {}",
                model.depth, model.classes, self.depth, self.classes
            )));
        }
        let g = &self.gpu;
        let params = self.pack_params(model.params.iter().map(|p| p.data.as_slice()))?;
        g.upload_into(self.params.view(), bytes_of(&params))?;
        let stats = self
            .stats_layout
            .pack(model.buffers.iter().map(|b| b.data.as_slice()))?;
        g.upload_into(self.stats.view(), bytes_of(&stats))?;
        if let Some(h) = &self.half {
            let n = self.params_layout.total;
            self.k
                .cast(self.params.view(), h.weights.view(), self.dtype(), n)?;
        }
        self.batches_tracked = model.batches_tracked;
        self.load_optimizer(&CnnOptimizer::new(self.opt))
    }

    /// Uploads an optimizer's state (its configuration must be this trainer's); fp16's loss
    /// scale starts again at GradScaler's 65536.
    pub fn load_optimizer(&mut self, opt: &CnnOptimizer<f32>) -> Result<()> {
        if opt.config != self.opt {
            return Err(Error::Setting(format!(
                "optimizer state of {:?} loaded into a trainer of {:?}",
                opt.config, self.opt
            )));
        }
        let g = &self.gpu;
        for (buf, saved) in [(&self.m, &opt.m), (&self.v, &opt.v)] {
            let Some(buf) = buf else { continue };
            let flat = if opt.step == 0 || saved.is_empty() {
                vec![0f32; self.params_layout.total]
            } else {
                self.pack_params(saved.iter().map(Vec::as_slice))?
            };
            g.upload_into(buf.view(), bytes_of(&flat))?;
        }
        g.fill(self.grads.view(), 0)?;
        let t = (opt.step + 1) as f64;
        let st = StepState {
            scale: if self.precision.scaled() {
                INITIAL_SCALE as f32
            } else {
                1.0
            },
            step_size: (self.opt.lr / (1.0 - BETA1.powf(t))) as f32,
            bc2_sqrt: (1.0 - BETA2.powf(t)).sqrt() as f32,
            found_inf: false,
            step: u32::try_from(opt.step)
                .map_err(|_| Error::Failed("more than 2^32 updates".into()))?,
            growth: 0,
            skipped: 0,
        };
        g.upload_into(self.state.view(), &st.to_bytes())?;
        Ok(())
    }

    /// The step state: updates applied and skipped, and (fp16) the loss scale and the clean
    /// updates since it last moved.
    pub fn scaler(&self) -> Result<StepState> {
        Ok(StepState::from_bytes(&self.gpu.download(&self.state)?)?)
    }

    /// Sets fp16's loss scale (positive and finite; GradScaler's `init_scale` is a power of
    /// two) and restarts its growth count; an error in other precisions.
    pub fn set_loss_scale(&mut self, scale: f32) -> Result<()> {
        if !self.precision.scaled() {
            return Err(Error::Setting(format!(
                "a loss scale for {}: only fp16 scales its loss",
                self.precision.name()
            )));
        }
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::Setting(format!(
                "loss scale {scale}: must be positive and finite"
            )));
        }
        let st = StepState {
            scale,
            growth: 0,
            ..self.scaler()?
        };
        self.gpu.upload_into(self.state.view(), &st.to_bytes())?;
        Ok(())
    }

    /// Reads the parameters, running statistics and batch count back into `model` (a model of
    /// this depth and class count).
    pub fn store(&self, model: &mut ResNet<f32>) -> Result<()> {
        if model.depth != self.depth || model.classes != self.classes {
            return Err(Error::Setting(format!(
                "a GPU {:?} of {} classes stored into a {:?} of {}",
                self.depth, self.classes, model.depth, model.classes
            )));
        }
        let g = &self.gpu;
        let params = self.download_params(&self.params)?;
        for (p, data) in model.params.iter_mut().zip(params) {
            p.data = data;
        }
        let stats = self
            .stats_layout
            .unpack(&decode_f32(&g.download(&self.stats)?, F32))?;
        for (b, data) in model.buffers.iter_mut().zip(stats) {
            b.data = data;
        }
        model.batches_tracked = self.batches_tracked;
        Ok(())
    }

    /// Reads the optimizer's state back (step count and moment buffers).
    pub fn store_optimizer(&self, opt: &mut CnnOptimizer<f32>) -> Result<()> {
        let st = self.scaler()?;
        opt.config = self.opt;
        opt.step = u64::from(st.step);
        let read = |buf: &Option<DeviceBuffer>| -> Result<Vec<Vec<f32>>> {
            match buf {
                Some(b) if st.step > 0 => self.download_params(b),
                _ => Ok(Vec::new()),
            }
        };
        opt.m = read(&self.m)?;
        opt.v = read(&self.v)?;
        Ok(())
    }

    /// The gradients of the last step, in [`ResNet::params`] order (fp16: times the loss scale
    /// the step ran at).
    pub fn gradients(&self) -> Result<Vec<Vec<f32>>> {
        self.download_params(&self.grads)
    }
}
