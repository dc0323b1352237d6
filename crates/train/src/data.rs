//! Training data: the tutorials' presets, data files (safetensors and CSV), the held-out
//! evaluation part and each epoch's sample order.
//!
//! Everything a user hands in is checked here, once, so that training never meets a NaN in the
//! inputs, a ragged row or a class index the model cannot output: every problem with a file is
//! an [`Error::File`] that names the file and says where in it (the line and column of a CSV,
//! the tensor and element of a safetensors file), and no input makes this module panic or
//! allocate more than the file's own size warrants.

use crate::error::{Error, Result};
use gpukit_tensor::codec::{bytes_of, decode_f32, decode_f64};
use gpukit_types::{shown, DType};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use std::fmt::Display;
use std::path::Path;

/// One more than the largest class index a data file may hold. A label is also the width of
/// the model's last layer, so a stray 4000000000 in a label column would otherwise ask for a
/// layer of billions of outputs; a million classes is far beyond any real classifier here.
const MAX_CLASSES: usize = 1 << 20;

/// What the targets are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Regression,
    Classification,
}

/// The targets of a data set.
#[derive(Debug, Clone, PartialEq)]
pub enum Targets {
    /// Regression: `width` values per sample, row-major.
    Values { width: usize, data: Vec<f32> },
    /// Classification: one class index per sample, each below `classes` (classes >= 2).
    Classes { classes: usize, data: Vec<u32> },
}

impl Targets {
    /// Samples the targets cover.
    fn len(&self) -> usize {
        match self {
            Targets::Values { width, data } => data.len().checked_div(*width).unwrap_or(0),
            Targets::Classes { data, .. } => data.len(),
        }
    }

    /// Removes the samples from `at` on and returns them.
    fn split_off(&mut self, at: usize) -> Targets {
        match self {
            Targets::Values { width, data } => Targets::Values {
                width: *width,
                data: data.split_off(at * *width),
            },
            Targets::Classes { classes, data } => Targets::Classes {
                classes: *classes,
                data: data.split_off(at),
            },
        }
    }
}

/// Samples as rows: `x` holds len() x features values, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    pub features: usize,
    pub x: Vec<f32>,
    pub y: Targets,
}

impl Dataset {
    /// Number of samples.
    pub fn len(&self) -> usize {
        self.y.len()
    }

    /// True when there is no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Values per sample the model must output: `width` for Values, `classes` for Classes
    /// (one logit per class, as cross-entropy reads them).
    pub fn outputs(&self) -> usize {
        match self.y {
            Targets::Values { width, .. } => width,
            Targets::Classes { classes, .. } => classes,
        }
    }

    /// Whether the targets are values to fit or classes to predict.
    pub fn task(&self) -> Task {
        match self.y {
            Targets::Values { .. } => Task::Regression,
            Targets::Classes { .. } => Task::Classification,
        }
    }
    /// Values a sample's target holds on the device: its width, or 1 for a class label.
    pub fn target_width(&self) -> usize {
        match &self.y {
            Targets::Values { width, .. } => *width,
            Targets::Classes { .. } => 1,
        }
    }

    /// Holds out the LAST round(len * eval_fraction) samples (file order) for evaluation, so
    /// that the held-out part does not depend on the seed and a user can put the samples they
    /// want evaluated at the end of the file. `eval_fraction` must be in [0, 1) (an error
    /// naming `--eval-fraction` otherwise), and the training part must keep a sample. None
    /// when nothing is held out.
    pub fn split(mut self, eval_fraction: f64) -> Result<(Dataset, Option<Dataset>)> {
        if !(0.0..1.0).contains(&eval_fraction) {
            return Err(Error::Setting(format!(
                "--eval-fraction must be at least 0 and below 1, not {eval_fraction}"
            )));
        }
        let len = self.len();
        let held = held_out(len, eval_fraction);
        if held == 0 {
            return Ok((self, None));
        }
        let train = len.saturating_sub(held);
        if train == 0 {
            return Err(Error::Setting(format!(
                "--eval-fraction {eval_fraction} holds out all {len} samples, leaving none to \
                 train on"
            )));
        }
        let eval = Dataset {
            features: self.features,
            x: self.x.split_off(train * self.features),
            y: self.y.split_off(train),
        };
        Ok((self, Some(eval)))
    }

    /// The samples at `idx`, in that order: (x rows, targets). A batch is gathered into its
    /// own buffers so that the model reads contiguous rows whatever the shuffle.
    ///
    /// # Panics
    ///
    /// If an index is not below `len()` (the indices come from [`batch_order`], not a file).
    pub fn gather(&self, idx: &[usize]) -> (Vec<f32>, Targets) {
        let x = rows(&self.x, self.features, idx);
        let y = match &self.y {
            Targets::Values { width, data } => Targets::Values {
                width: *width,
                data: rows(data, *width, idx),
            },
            Targets::Classes { classes, data } => Targets::Classes {
                classes: *classes,
                data: rows(data, 1, idx),
            },
        };
        (x, y)
    }

    /// Writes x (F32 [n, features]) and y (F32 [n] or [n, width] for Values when width > 1,
    /// I64 [n] for Classes, as PyTorch stores labels) as safetensors, whole or not at all
    /// (see [`gpukit_types::files`]), so that [`load`] reads back the same data set.
    pub fn save(&self, path: &Path) -> Result<()> {
        let bytes = self
            .encode()
            .map_err(|why| Error::Failed(format!("{}: cannot be saved: {why}", path.display())))?;
        gpukit_types::files::write_atomically(path, &bytes).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The safetensors bytes of the data set, or why its parts do not fit together.
    fn encode(&self) -> Result<Vec<u8>, String> {
        let n = self.len();
        if n.checked_mul(self.features) != Some(self.x.len()) {
            return Err(format!(
                "x holds {} values, not {n} samples of {} features",
                self.x.len(),
                self.features
            ));
        }
        let labels: Vec<i64>;
        let (y_dtype, y_shape, y_bytes) = match &self.y {
            Targets::Values { width: 1, data } => (Dtype::F32, vec![n], bytes_of(data)),
            Targets::Values { width, data } => (Dtype::F32, vec![n, *width], bytes_of(data)),
            Targets::Classes { data, .. } => {
                labels = data.iter().map(|&c| i64::from(c)).collect();
                (Dtype::I64, vec![n], bytes_of(&labels))
            }
        };
        let x = TensorView::new(Dtype::F32, vec![n, self.features], bytes_of(&self.x));
        let y = TensorView::new(y_dtype, y_shape, y_bytes);
        let views = [
            ("x", x.map_err(|e| e.to_string())?),
            ("y", y.map_err(|e| e.to_string())?),
        ];
        safetensors::serialize(views, None).map_err(|e| e.to_string())
    }
}

/// The rows of `data` (rows of `width` values) at `idx`, in that order.
fn rows<T: Copy>(data: &[T], width: usize, idx: &[usize]) -> Vec<T> {
    idx.iter()
        .flat_map(|&i| &data[i * width..(i + 1) * width])
        .copied()
        .collect()
}

/// The seed of a preset's targets: another stream than its inputs' (a plain `seed + 1` would
/// make one seed's targets the next seed's inputs).
pub(crate) fn targets_seed(seed: u64) -> u64 {
    seed ^ 0x9E37_79B9_7F4A_7C15
}

/// A preset's inputs: samples x features standard normal values.
fn preset_x(samples: usize, features: usize, seed: u64) -> Vec<f32> {
    let n = samples
        .checked_mul(features)
        .expect("samples x features overflows usize");
    gpukit_tensor::random::normal_f32(n, seed)
}

/// The tutorial's regression data: x ~ N(0,1) of samples x features, y ~ N(0,1) of width 1
/// (PyTorch's `torch.randn`), the same for the same seed so that runs can be compared.
///
/// # Panics
///
/// If samples x features overflows usize.
pub fn regression_preset(samples: usize, features: usize, seed: u64) -> Dataset {
    Dataset {
        features,
        x: preset_x(samples, features, seed),
        y: Targets::Values {
            width: 1,
            data: gpukit_tensor::random::normal_f32(samples, targets_seed(seed)),
        },
    }
}

/// Samples [`Dataset::split`] holds out of `len` for evaluation (len x fraction, rounded; at
/// most `len`, as the fraction is below 1).
pub fn held_out(len: usize, eval_fraction: f64) -> usize {
    ((len as f64 * eval_fraction).round() as usize).min(len)
}

/// The tutorial's classification data: x ~ N(0,1), labels uniform over {0, 1} (PyTorch's
/// `torch.randint(0, 2, ...)`), classes = 2; the same for the same seed.
///
/// # Panics
///
/// If samples x features overflows usize.
pub fn classification_preset(samples: usize, features: usize, seed: u64) -> Dataset {
    let mut rng = ChaCha8Rng::seed_from_u64(targets_seed(seed));
    Dataset {
        features,
        x: preset_x(samples, features, seed),
        y: Targets::Classes {
            classes: 2,
            data: (0..samples).map(|_| rng.random_range(0..2)).collect(),
        },
    }
}

/// Sample order of one epoch: a permutation of 0..n, or 0..n in order when `!shuffle`. The
/// seed picks a ChaCha8 generator and the epoch its stream, so the order depends on (seed,
/// epoch) alone and a resumed run shuffles exactly as the uninterrupted one did.
pub fn batch_order(n: usize, epoch: u64, seed: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(epoch);
        order.shuffle(&mut rng);
    }
    order
}

/// Loads a data file for `task`, by extension (case ignored):
///
/// - `.safetensors`: tensor `x` [n, features] (or [n]: one feature) of F32, F64, F16 or BF16;
///   tensor `y`, for Regression [n] or [n, width] of those dtypes, for Classification [n] of
///   I64, I32, U8 or a float dtype holding whole numbers. Other tensors are ignored.
/// - `.csv`: a header row, then one sample a row, every field a number; the last column is
///   the target, the others the features. For Classification the target is a class index.
///
/// Classes are 0..=max label (at least 2, as a classifier needs). Every value must be finite.
/// Anything else is an error naming the file and the problem.
pub fn load(path: &Path, task: Task) -> Result<Dataset> {
    if path.is_dir() {
        return Err(Error::file(path, "is a directory, not a data file"));
    }
    let format = Format::of(path).ok_or_else(|| {
        Error::file(
            path,
            "is neither .safetensors nor .csv; gpukit trains on a .safetensors file (tensors x \
             and y) or a .csv file (a header row, then the features and the target last)",
        )
    })?;
    let bytes = std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match format {
        Format::Safetensors => from_safetensors(&bytes, task),
        Format::Csv => from_csv(&bytes, task),
    }
    .map_err(|why| Error::file(path, why))
}

/// The data file formats [`load`] reads.
enum Format {
    Safetensors,
    Csv,
}

impl Format {
    /// The format `path`'s extension names, if it is one of ours.
    fn of(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "safetensors" => Some(Format::Safetensors),
            "csv" => Some(Format::Csv),
            _ => None,
        }
    }
}

/// A label as a class index, or why it is not one. `shown` is the label as the file wrote it;
/// the reason continues a text naming where the label is ("line 5, column \"label\"").
fn class_index(value: f64, shown: &dyn Display) -> Result<u32, String> {
    if !value.is_finite() {
        return Err(format!(" is {shown}"));
    }
    if value < 0.0 || value.fract() != 0.0 {
        return Err(format!(
            ": {shown} is not a class index (a non-negative integer)"
        ));
    }
    if value >= MAX_CLASSES as f64 {
        return Err(format!(
            ": {shown} is above the largest class index gpukit trains, {}",
            MAX_CLASSES - 1
        ));
    }
    Ok(value as u32)
}

/// Classification targets of `labels`: classes = max label + 1, at least 2.
fn classes_of(labels: Vec<u32>) -> Targets {
    let max = labels.iter().copied().max().unwrap_or(0) as usize;
    Targets::Classes {
        classes: (max + 1).max(2),
        data: labels,
    }
}

/// The data set of a CSV file (see [`load`]), or why the file cannot be one.
fn from_csv(bytes: &[u8], task: Task) -> Result<Dataset, String> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err("empty file".to_string());
    }
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(bytes);
    let header: Vec<String> = reader
        .byte_headers()
        .map_err(|e| e.to_string())?
        .iter()
        .map(|name| shown(&String::from_utf8_lossy(name)))
        .collect();
    if header.len() < 2 {
        return Err(format!(
            "needs at least 2 columns (features, then the target); the header has {}",
            fields(header.len())
        ));
    }
    let mut table = CsvTable::new(header, task);
    let mut record = csv::ByteRecord::new();
    while reader
        .read_byte_record(&mut record)
        .map_err(|e| e.to_string())?
    {
        table.push(&record)?;
    }
    table.finish()
}

/// "1 field", "3 fields".
fn fields(n: usize) -> String {
    match n {
        1 => "1 field".to_string(),
        n => format!("{n} fields"),
    }
}

/// The rows of a CSV file read so far.
struct CsvTable {
    header: Vec<String>,
    x: Vec<f32>,
    y: CsvTargets,
}

/// The target column read so far, as the task reads it.
enum CsvTargets {
    Values(Vec<f32>),
    Classes(Vec<u32>),
}

impl CsvTable {
    fn new(header: Vec<String>, task: Task) -> CsvTable {
        let y = match task {
            Task::Regression => CsvTargets::Values(Vec::new()),
            Task::Classification => CsvTargets::Classes(Vec::new()),
        };
        CsvTable {
            header,
            x: Vec::new(),
            y,
        }
    }

    /// Adds one data row, or says what is wrong with it.
    fn push(&mut self, record: &csv::ByteRecord) -> Result<(), String> {
        let line = record.position().map_or(0, csv::Position::line);
        if record.len() != self.header.len() {
            return Err(format!(
                "line {line} has {}, the header has {}",
                fields(record.len()),
                self.header.len()
            ));
        }
        let at = |name: &String, why: String| format!("line {line}, column {name:?}{why}");
        let mut cells = record.iter().zip(&self.header);
        for (field, name) in cells.by_ref().take(self.header.len() - 1) {
            self.x.push(csv_value(field).map_err(|why| at(name, why))?);
        }
        if let Some((field, name)) = cells.next() {
            match &mut self.y {
                CsvTargets::Values(v) => v.push(csv_value(field).map_err(|why| at(name, why))?),
                CsvTargets::Classes(c) => c.push(csv_class(field).map_err(|why| at(name, why))?),
            }
        }
        Ok(())
    }

    /// The data set of the rows read, or an error when there were none.
    fn finish(self) -> Result<Dataset, String> {
        let y = match self.y {
            CsvTargets::Values(data) => Targets::Values { width: 1, data },
            CsvTargets::Classes(data) => classes_of(data),
        };
        if y.len() == 0 {
            return Err("no data rows after the header".to_string());
        }
        Ok(Dataset {
            features: self.header.len() - 1,
            x: self.x,
            y,
        })
    }
}

/// The text of a CSV field, or that it is not a number (not UTF-8).
fn csv_text(field: &[u8]) -> Result<&str, String> {
    std::str::from_utf8(field).map_err(|_| not_a_number(&String::from_utf8_lossy(field)))
}

/// Why `text` is refused: it is not a number. Continues "line 3, column \"age\"".
fn not_a_number(text: &str) -> String {
    format!(": {:?} is not a number", shown(text))
}

/// A CSV field as a finite f32 (parsed straight to f32: one rounding, as PyTorch reads it).
fn csv_value(field: &[u8]) -> Result<f32, String> {
    let text = csv_text(field)?;
    match text.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) if text.parse::<f64>().is_ok_and(f64::is_finite) => {
            Err(format!(": {} is beyond f32's range", shown(text)))
        }
        Ok(v) => Err(format!(" is {v}")),
        Err(_) => Err(not_a_number(text)),
    }
}

/// A CSV field as a class index.
fn csv_class(field: &[u8]) -> Result<u32, String> {
    let text = csv_text(field)?;
    let value: f64 = text.parse().map_err(|_| not_a_number(text))?;
    if value.is_finite() {
        class_index(value, &shown(text))
    } else {
        class_index(value, &value)
    }
}

/// The data set of a safetensors file (see [`load`]), or why the file cannot be one.
fn from_safetensors(bytes: &[u8], task: Task) -> Result<Dataset, String> {
    let file = SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a valid safetensors file: {e}"))?;
    let x = tensor(&file, "x")?;
    let (n, features) = match *x.shape() {
        [n, f] => (n, f),
        [n] => (n, 1),
        ref s => return Err(format!("x must be [n, features] or [n], not {s:?}")),
    };
    if features == 0 {
        return Err(format!("x has no features (its shape is {:?})", x.shape()));
    }
    let y = tensor(&file, "y")?;
    let (rows, width) = y_shape(&y, task)?;
    if rows != n {
        return Err(format!("x has {n} rows but y has {rows}"));
    }
    if n == 0 {
        return Err("holds no samples (x and y have 0 rows)".to_string());
    }
    let x = floats(&x, "x")?;
    let y = match task {
        Task::Regression => Targets::Values {
            width,
            data: floats(&y, "y")?,
        },
        Task::Classification => class_targets(&y)?,
    };
    Ok(Dataset { features, x, y })
}

/// The tensor `name` of `file`, or that it is missing and what the file has instead.
pub(crate) fn tensor<'a>(file: &SafeTensors<'a>, name: &str) -> Result<TensorView<'a>, String> {
    const LISTED: usize = 8;
    file.tensor(name).map_err(|_| {
        let mut names = file.names();
        names.sort_unstable();
        let mut list: Vec<String> = names.iter().take(LISTED).map(|n| shown(n)).collect();
        if names.len() > LISTED {
            list.push(format!("and {} more", names.len() - LISTED));
        }
        if list.is_empty() {
            format!("has no tensor named {name:?} (it has none)")
        } else {
            format!("has no tensor named {name:?} (it has: {})", list.join(", "))
        }
    })
}

/// The gpukit dtype of a floating-point safetensors dtype that [`decode_f32`] reads.
fn float_dtype(d: Dtype) -> Option<DType> {
    match d {
        Dtype::F32 => Some(DType::F32),
        Dtype::F64 => Some(DType::F64),
        Dtype::F16 => Some(DType::F16),
        Dtype::BF16 => Some(DType::Bf16),
        _ => None,
    }
}

/// Element `i` of a tensor of `shape` as numpy writes it: `x[5, 2]`, or `y[5]` for [n].
fn element(name: &str, shape: &[usize], i: usize) -> String {
    match *shape {
        [_, width] if width > 0 => format!("{name}[{}, {}]", i / width, i % width),
        _ => format!("{name}[{i}]"),
    }
}

/// (rows, values a sample) of `y`: [n] or [n, width] for Regression, [n] for Classification.
fn y_shape(y: &TensorView, task: Task) -> Result<(usize, usize), String> {
    let (rows, width) = match (task, y.shape()) {
        (Task::Regression, &[n, w]) => (n, w),
        (_, &[n]) => (n, 1),
        (Task::Regression, s) => return Err(format!("y must be [n, width] or [n], not {s:?}")),
        (Task::Classification, s) => {
            return Err(format!(
                "y must be [n] (one class index a sample), not {s:?}"
            ))
        }
    };
    if width == 0 {
        return Err(format!(
            "y has no values a sample (its shape is {:?})",
            y.shape()
        ));
    }
    Ok((rows, width))
}

/// The values of a float tensor as f32, each checked finite (after the conversion: an F64
/// value beyond f32's range is refused too).
pub(crate) fn floats(t: &TensorView, name: &str) -> Result<Vec<f32>, String> {
    let dtype = float_dtype(t.dtype()).ok_or_else(|| {
        format!(
            "{name} has dtype {}; expected F32, F64, F16 or BF16",
            t.dtype()
        )
    })?;
    let values = decode_f32(t.data(), dtype);
    check_count(t, name, values.len())?;
    match values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        None => Ok(values),
        Some((i, v)) => {
            let at = element(name, t.shape(), i);
            Err(match wide_value(t, dtype, i) {
                Some(wide) if wide.is_finite() => format!("{at} is {wide:e}, beyond f32's range"),
                _ => format!("{at} is {v}"),
            })
        }
    }
}

/// Element `i` of an F64 tensor, exactly (to tell a value beyond f32's range from an
/// infinity); None for other dtypes.
fn wide_value(t: &TensorView, dtype: DType, i: usize) -> Option<f64> {
    if dtype != DType::F64 {
        return None;
    }
    let bytes = t
        .data()
        .get(i.checked_mul(8)?..i.checked_add(1)?.checked_mul(8)?)?;
    decode_f64(bytes, dtype).first().copied()
}

/// An error unless `t` decoded to as many values as its shape has elements (safetensors has
/// checked the byte length already; this keeps a mismatch from going further if it did not).
fn check_count(t: &TensorView, name: &str, found: usize) -> Result<(), String> {
    let count = t
        .shape()
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match count {
        Some(c) if c == found => Ok(()),
        _ => Err(format!(
            "{name} holds {found} values, but its shape {:?} needs {}",
            t.shape(),
            count.map_or("more than fit in memory".to_string(), |c| c.to_string())
        )),
    }
}

/// Classification targets of `y` [n] holding class indices.
pub(crate) fn class_targets(y: &TensorView) -> Result<Targets, String> {
    let labels = labels(y)?;
    check_count(y, "y", labels.len())?;
    let data = labels
        .iter()
        .enumerate()
        .map(|(i, label)| class_index(label.value(), label).map_err(|why| format!("y[{i}]{why}")))
        .collect::<Result<Vec<u32>, String>>()?;
    Ok(classes_of(data))
}

/// A label as a safetensors file holds it: integer dtypes are checked as integers and float
/// ones exactly (an F64 label is not rounded to f32 before the integer check).
#[derive(Clone, Copy)]
enum Label {
    Int(i64),
    Float(f64),
}

impl Label {
    /// The label as f64 (an i64 beyond 2^53 rounds, but is far beyond any class index).
    fn value(self) -> f64 {
        match self {
            Label::Int(i) => i as f64,
            Label::Float(v) => v,
        }
    }
}

impl Display for Label {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Label::Int(i) => write!(f, "{i}"),
            Label::Float(v) => write!(f, "{v}"),
        }
    }
}

/// The labels of `y`, or that its dtype cannot hold class indices.
fn labels(y: &TensorView) -> Result<Vec<Label>, String> {
    let data = y.data();
    Ok(match y.dtype() {
        Dtype::I64 => le_ints::<8>(data, i64::from_le_bytes),
        Dtype::I32 => le_ints::<4>(data, |b| i64::from(i32::from_le_bytes(b))),
        Dtype::U8 => data.iter().map(|&b| Label::Int(i64::from(b))).collect(),
        d => match float_dtype(d) {
            Some(dtype) => decode_f64(data, dtype)
                .into_iter()
                .map(Label::Float)
                .collect(),
            None => {
                return Err(format!(
                    "y has dtype {d}; expected class indices as I64, I32, U8 or a float dtype \
                     (F32, F64, F16, BF16)"
                ))
            }
        },
    })
}

/// The little-endian integers of `N` bytes in `data` (a trailing partial one is ignored).
fn le_ints<const N: usize>(data: &[u8], read: impl Fn([u8; N]) -> i64) -> Vec<Label> {
    data.chunks_exact(N)
        .flat_map(<[u8; N]>::try_from)
        .map(|b| Label::Int(read(b)))
        .collect()
}

#[cfg(test)]
mod tests;
