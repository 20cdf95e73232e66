//! Tensors as the library sees them: DLPack `DLTensor`s, built here from Rust slices.
//!
//! Three ways in, from the most to the least checked:
//! - [`Tensor`]: owned, compact row-major storage of an [`Element`] type with a shape;
//! - [`TensorView`] / [`TensorViewMut`]: borrow a slice (compact, or with strides) and check that
//!   every element the shape and strides address lies inside it;
//! - [`TensorView::from_raw`] / [`TensorViewMut::from_raw`] (`unsafe`): any DLTensor, e.g. one a
//!   framework exported, or device memory.
//!
//! Attention, shard and unshard take tensors as [`Input`] (read) or [`Output`] (written), which
//! all three implement.

use std::marker::PhantomData;
use std::os::raw::c_void;

use half::{bf16, f16};
use stria_sys as sys;

use crate::error::{invalid, Error, Result, Status};
use crate::layout::Layout;
use crate::plan::Plan;

mod sealed {
    pub trait Sealed {}
}

/// An element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// `f32`
    F32,
    /// IEEE half precision ([`half::f16`]).
    F16,
    /// bfloat16 ([`half::bf16`]).
    BF16,
    /// `f64` (shard/unshard only: attention takes F32, F16 and BF16).
    F64,
    /// `i32` (shard/unshard only).
    I32,
    /// `i64` (shard/unshard only; token ids, labels).
    I64,
    /// float8_e4m3fn ([`F8E4M3`]): the forward's FP8 q, k and v (with
    /// [`Descales`](crate::Descales)); shard/unshard too.
    E4M3,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::E4M3 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
        }
    }

    pub(crate) fn dl(self) -> sys::DLDataType {
        let code = match self {
            DType::F32 | DType::F16 | DType::F64 => sys::kDLFloat,
            DType::BF16 => sys::kDLBfloat,
            DType::I32 | DType::I64 => sys::kDLInt,
            DType::E4M3 => sys::STRIA_DL_FLOAT8_E4M3FN as _,
        };
        sys::DLDataType {
            code: code as u8,
            bits: (self.size() * 8) as u8,
            lanes: 1,
        }
    }
}

/// A Rust type that a [`Tensor`] or a slice view may hold: `f32`, [`half::f16`],
/// [`half::bf16`] (attention's dtypes), [`F8E4M3`] (the forward's FP8 inputs), and `f64`, `i32`,
/// `i64` (for shard/unshard).
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// Its DLPack dtype.
    const DTYPE: DType;
    /// Zero, for [`Tensor::zeros`].
    const ZERO: Self;
}

macro_rules! element {
    ($t:ty, $dtype:ident, $zero:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$dtype;
            const ZERO: Self = $zero;
        }
    };
}
element!(f32, F32, 0.0);
element!(f16, F16, f16::ZERO);
element!(bf16, BF16, bf16::ZERO);
element!(f64, F64, 0.0);
element!(i32, I32, 0);
element!(i64, I64, 0);
element!(F8E4M3, E4M3, F8E4M3(0));

/// A float8_e4m3fn value by its code, as `torch.float8_e4m3fn` stores it: 1 sign bit, 4 exponent
/// bits of bias 7, 3 mantissa bits; no infinities, 448 the largest magnitude, S.1111.111 NaN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

impl F8E4M3 {
    /// The value this code stands for (exact in `f32`).
    pub fn to_f32(self) -> f32 {
        let (sign, exp, mant) = (self.0 >> 7, (self.0 >> 3) & 15, self.0 & 7);
        let magnitude = if exp == 15 && mant == 7 {
            f32::NAN
        } else if exp == 0 {
            f32::from(mant) / 512.0
        } else {
            (1.0 + f32::from(mant) / 8.0) * 2f32.powi(i32::from(exp) - 7)
        };
        if sign == 1 {
            -magnitude
        } else {
            magnitude
        }
    }

    /// The nearest code to `x` (ties to the even code), saturating at ±448; NaN gives NaN.
    pub fn from_f32(x: f32) -> Self {
        if x.is_nan() {
            return F8E4M3(0x7f | if x.is_sign_negative() { 0x80 } else { 0 });
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = x.abs().min(448.0);
        // The non-negative finite codes in increasing order: the first whose value is past `a`,
        // then the nearer of it and the one before (the even one on a tie).
        let mut hi = 0u8;
        while hi < 126 && F8E4M3(hi).to_f32() < a {
            hi += 1;
        }
        let code = if hi == 0 {
            0
        } else {
            let (below, above) = (F8E4M3(hi - 1).to_f32(), F8E4M3(hi).to_f32());
            let (d_below, d_above) = (a - below, above - a);
            if d_below < d_above || (d_below == d_above && (hi - 1) % 2 == 0) {
                hi - 1
            } else {
                hi
            }
        };
        F8E4M3(code | sign)
    }
}

/// Where a tensor's memory (or a context) lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Host memory.
    Cpu,
    /// The CUDA device of this ordinal.
    Cuda(i32),
}

impl Device {
    pub(crate) fn dl(self) -> sys::DLDevice {
        match self {
            Device::Cpu => sys::DLDevice {
                device_type: sys::kDLCPU,
                device_id: 0,
            },
            Device::Cuda(ordinal) => sys::DLDevice {
                device_type: sys::kDLCUDA,
                device_id: ordinal,
            },
        }
    }
}

/// A tensor the library reads (q, k, v, and out, lse, dout in the backward pass). Implemented by
/// [`Tensor`], [`TensorView`] and [`TensorViewMut`].
pub trait Input: sealed::Sealed {
    /// The DLTensor; its shape and strides point into `self`, so it is used only while `self` is
    /// borrowed.
    #[doc(hidden)]
    fn dl_tensor(&self) -> sys::DLTensor;
}

/// A tensor the library writes (out, lse, dq, dk, dv, a shard). Implemented by [`Tensor`] and
/// [`TensorViewMut`].
pub trait Output: Input {
    /// As [`Input::dl_tensor`], with a data pointer that may be written through.
    #[doc(hidden)]
    fn dl_tensor_mut(&mut self) -> sys::DLTensor;
}

/// What a view describes; its DLTensor points into `shape` and `strides`.
#[derive(Debug, Clone)]
struct Raw {
    data: *mut c_void,
    device: sys::DLDevice,
    dtype: sys::DLDataType,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    byte_offset: u64,
    /// from_raw of a DLTensor with a NULL shape and this ndim (not 0): passed on as it came.
    null_shape: Option<i32>,
}

impl Raw {
    fn from_slice<T: Element>(data: *mut T, shape: &[i64], strides: Option<&[i64]>) -> Raw {
        Raw {
            data: data.cast(),
            device: Device::Cpu.dl(),
            dtype: T::DTYPE.dl(),
            shape: shape.to_vec(),
            strides: strides.map(<[i64]>::to_vec),
            byte_offset: 0,
            null_shape: None,
        }
    }

    /// Copies a DLTensor's description (its shape and strides arrays too).
    ///
    /// # Safety
    /// `dl.shape` (and `dl.strides` unless NULL) point to `dl.ndim` readable values.
    unsafe fn from_dl(dl: &sys::DLTensor) -> Raw {
        let ndim = dl.ndim.max(0) as usize;
        let copy = |p: *const i64| (!p.is_null()).then(|| std::slice::from_raw_parts(p, ndim).to_vec());
        Raw {
            data: dl.data,
            device: dl.device,
            dtype: dl.dtype,
            // A NULL shape stays NULL (see dl()), for the library to refuse by name.
            shape: copy(dl.shape).unwrap_or_default(),
            null_shape: (dl.shape.is_null() && dl.ndim != 0).then_some(dl.ndim),
            strides: copy(dl.strides),
            byte_offset: dl.byte_offset,
        }
    }

    fn dl(&self) -> sys::DLTensor {
        let (ndim, shape) = match self.null_shape {
            Some(ndim) => (ndim, std::ptr::null_mut()),
            None => (self.shape.len() as i32, self.shape.as_ptr() as *mut i64),
        };
        sys::DLTensor {
            data: self.data,
            device: self.device,
            ndim,
            dtype: self.dtype,
            shape,
            strides: self
                .strides
                .as_ref()
                .map_or(std::ptr::null_mut(), |s| s.as_ptr() as *mut i64),
            byte_offset: self.byte_offset,
        }
    }
}

/// The number of elements of `shape`, checking that no dimension is negative and nothing
/// overflows.
fn numel(shape: &[i64]) -> Result<usize> {
    if shape.iter().any(|&d| d < 0) {
        return Err(invalid(format!("shape {shape:?} has a negative dimension")));
    }
    if shape.contains(&0) {
        return Ok(0); // empty, whatever the other dimensions (as the library counts it)
    }
    shape.iter().try_fold(1usize, |n, &d| {
        let d = usize::try_from(d).map_err(|_| invalid(format!("shape {shape:?} has a negative dimension")))?;
        n.checked_mul(d)
            .ok_or_else(|| invalid(format!("shape {shape:?} has too many elements")))
    })
}

/// Checks that compact storage of `len` elements holds exactly `shape`.
fn check_compact(len: usize, shape: &[i64]) -> Result<()> {
    let n = numel(shape)?;
    if n != len {
        return Err(invalid(format!(
            "shape {shape:?} has {n} elements but the slice holds {len}"
        )));
    }
    Ok(())
}

/// Checks that every element `shape` and `strides` (in elements) address lies in `len`.
fn check_strided(len: usize, shape: &[i64], strides: &[i64]) -> Result<()> {
    if shape.len() != strides.len() {
        return Err(invalid(format!(
            "shape {shape:?} and strides {strides:?} differ in length"
        )));
    }
    if numel(shape)? == 0 {
        return Ok(()); // nothing is addressed
    }
    let mut last = 0usize; // offset of the last element
    for (&d, &s) in shape.iter().zip(strides) {
        if d == 1 {
            continue; // a stride that never moves, whatever its sign (DLPack and torch give such)
        }
        let s = usize::try_from(s).map_err(|_| {
            invalid(format!(
                "strides {strides:?}: a view of a slice takes no negative stride (use from_raw)"
            ))
        })?;
        last = (d as usize - 1)
            .checked_mul(s)
            .and_then(|x| x.checked_add(last))
            .ok_or_else(|| invalid(format!("strides {strides:?} overflow")))?;
    }
    if last >= len {
        return Err(invalid(format!(
            "shape {shape:?} with strides {strides:?} reaches element {last} but the slice holds {len}"
        )));
    }
    Ok(())
}

/// Checks that no two elements of a strided view share memory (so the library's writes cannot
/// race): ordered by stride, each dimension must step over everything the smaller ones span.
fn check_no_overlap(shape: &[i64], strides: &[i64]) -> Result<()> {
    let mut dims: Vec<(i64, i64)> = strides
        .iter()
        .copied()
        .zip(shape.iter().copied())
        .filter(|&(_, d)| d > 1)
        .collect();
    dims.sort_unstable();
    let mut span = 1i64; // elements covered by the dimensions so far
    for (s, d) in dims {
        if s < span {
            return Err(invalid(format!(
                "shape {shape:?} with strides {strides:?} makes elements overlap: a written tensor needs distinct elements"
            )));
        }
        span = s * d; // no overflow: check_strided bounded (d-1)*s by the slice length
    }
    Ok(())
}

/// A read-only tensor borrowed from a slice (or described by a raw DLTensor).
///
/// ```
/// use stria::TensorView;
/// let data = vec![0.0f32; 2 * 3 * 4];
/// let t = TensorView::new(&data, &[2, 3, 4]).unwrap();
/// assert_eq!(t.shape(), &[2, 3, 4]);
/// // Every element must lie in the slice:
/// assert!(TensorView::new(&data, &[2, 3, 5]).is_err());
/// // Strides (in elements): the first 2 of every 4 values, as a [6, 2] tensor.
/// let s = TensorView::with_strides(&data, &[6, 2], &[4, 1]).unwrap();
/// assert_eq!(s.strides(), Some(&[4i64, 1][..]));
/// ```
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    raw: Raw,
    _borrow: PhantomData<&'a [u8]>,
}

// SAFETY: a view is a shared borrow of its elements (Element types are Sync), or for `from_raw`
// memory whose caller vouched for it; the view itself only holds owned copies of shape/strides.
unsafe impl Send for TensorView<'_> {}
unsafe impl Sync for TensorView<'_> {}

impl<'a> TensorView<'a> {
    /// Compact row-major `shape` over exactly `data.len()` elements.
    pub fn new<T: Element>(data: &'a [T], shape: &[i64]) -> Result<Self> {
        check_compact(data.len(), shape)?;
        Ok(Self::wrap(Raw::from_slice(data.as_ptr() as *mut T, shape, None)))
    }

    /// `shape` with `strides` counted in elements (not bytes), as in DLPack; every addressed
    /// element must lie in `data`. The library wants the last stride to be 1.
    pub fn with_strides<T: Element>(data: &'a [T], shape: &[i64], strides: &[i64]) -> Result<Self> {
        check_strided(data.len(), shape, strides)?;
        Ok(Self::wrap(Raw::from_slice(
            data.as_ptr() as *mut T,
            shape,
            Some(strides),
        )))
    }

    /// A view of any DLTensor (the shape and strides arrays are copied; the data is not).
    ///
    /// # Safety
    /// `dl.shape` (and `dl.strides` unless NULL) must point to `dl.ndim` values, and the memory
    /// the tensor describes must stay valid and unwritten by others for `'a`, on its device,
    /// from any thread that uses the view. On a GPU, stria queues its kernels on the stream
    /// (here the default stream) and returns before they finish: the memory must stay valid
    /// until that work completes (synchronize the device or the stream), not only for `'a`.
    pub unsafe fn from_raw(dl: &sys::DLTensor) -> Self {
        Self::wrap(Raw::from_dl(dl))
    }

    fn wrap(raw: Raw) -> Self {
        TensorView {
            raw,
            _borrow: PhantomData,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape
    }

    /// The strides in elements, `None` for compact row-major.
    pub fn strides(&self) -> Option<&[i64]> {
        self.raw.strides.as_deref()
    }
}

impl sealed::Sealed for TensorView<'_> {}
impl Input for TensorView<'_> {
    fn dl_tensor(&self) -> sys::DLTensor {
        self.raw.dl()
    }
}

/// A tensor the library may write, borrowed mutably from a slice (or a raw DLTensor).
///
/// ```
/// use stria::TensorViewMut;
/// let mut lse = vec![0.0f32; 2 * 8];
/// let view = TensorViewMut::new(&mut lse, &[1, 2, 8]).unwrap();
/// assert_eq!(view.shape(), &[1, 2, 8]);
/// ```
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    raw: Raw,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: an exclusive borrow of Send + Sync elements (or `from_raw` memory vouched for); shared
// references to the view only read.
unsafe impl Send for TensorViewMut<'_> {}
unsafe impl Sync for TensorViewMut<'_> {}

impl<'a> TensorViewMut<'a> {
    /// Compact row-major `shape` over exactly `data.len()` elements.
    pub fn new<T: Element>(data: &'a mut [T], shape: &[i64]) -> Result<Self> {
        check_compact(data.len(), shape)?;
        Ok(Self::wrap(Raw::from_slice(data.as_mut_ptr(), shape, None)))
    }

    /// `shape` with `strides` in elements; every element must lie in `data`, and no two may
    /// share memory.
    pub fn with_strides<T: Element>(data: &'a mut [T], shape: &[i64], strides: &[i64]) -> Result<Self> {
        check_strided(data.len(), shape, strides)?;
        check_no_overlap(shape, strides)?;
        Ok(Self::wrap(Raw::from_slice(data.as_mut_ptr(), shape, Some(strides))))
    }

    /// A writable view of any DLTensor (shape and strides copied, data not).
    ///
    /// # Safety
    /// As [`TensorView::from_raw`], and the memory must be writable and not accessed by anyone
    /// else for `'a`.
    pub unsafe fn from_raw(dl: &sys::DLTensor) -> Self {
        Self::wrap(Raw::from_dl(dl))
    }

    fn wrap(raw: Raw) -> Self {
        TensorViewMut {
            raw,
            _borrow: PhantomData,
        }
    }

    /// The dimensions.
    pub fn shape(&self) -> &[i64] {
        &self.raw.shape
    }

    /// The strides in elements, `None` for compact row-major.
    pub fn strides(&self) -> Option<&[i64]> {
        self.raw.strides.as_deref()
    }
}

impl sealed::Sealed for TensorViewMut<'_> {}
impl Input for TensorViewMut<'_> {
    fn dl_tensor(&self) -> sys::DLTensor {
        self.raw.dl()
    }
}
impl Output for TensorViewMut<'_> {
    fn dl_tensor_mut(&mut self) -> sys::DLTensor {
        self.raw.dl()
    }
}

/// An owned, compact row-major tensor.
///
/// ```
/// use half::bf16;
/// use stria::Tensor;
/// let t = Tensor::new(vec![bf16::from_f32(1.5); 6], &[2, 3]).unwrap();
/// assert_eq!(t.shape(), &[2, 3]);
/// assert_eq!(t.as_slice()[5].to_f32(), 1.5);
/// assert!(Tensor::new(vec![0.0f32; 5], &[2, 3]).is_err()); // 5 values are not a 2 x 3 tensor
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor<T: Element> {
    data: Vec<T>,
    shape: Vec<i64>,
}

impl<T: Element> Tensor<T> {
    /// Takes `data` as a compact row-major tensor of `shape`.
    pub fn new(data: Vec<T>, shape: &[i64]) -> Result<Self> {
        check_compact(data.len(), shape)?;
        Ok(Tensor {
            data,
            shape: shape.to_vec(),
        })
    }

    /// Copies `data`.
    pub fn from_slice(data: &[T], shape: &[i64]) -> Result<Self> {
        Self::new(data.to_vec(), shape)
    }

    /// Every element `value`. Memory that cannot be had is an [`Status::OutOfMemory`] error,
    /// not an abort.
    pub fn full(shape: &[i64], value: T) -> Result<Self> {
        let n = numel(shape)?;
        let mut data = Vec::new();
        data.try_reserve_exact(n).map_err(|_| {
            Error::new(
                Status::OutOfMemory,
                format!("cannot allocate a tensor of shape {shape:?}"),
            )
        })?;
        data.resize(n, value);
        Self::new(data, shape)
    }

    /// Every element zero.
    pub fn zeros(shape: &[i64]) -> Result<Self> {
        Self::full(shape, T::ZERO)
    }

    /// The dimensions.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The elements in row-major order.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// The elements in row-major order, writable.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// The storage.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// A read-only view.
    pub fn view(&self) -> TensorView<'_> {
        TensorView::wrap(Raw::from_slice(self.data.as_ptr() as *mut T, &self.shape, None))
    }

    /// A writable view.
    pub fn view_mut(&mut self) -> TensorViewMut<'_> {
        TensorViewMut::wrap(Raw::from_slice(self.data.as_mut_ptr(), &self.shape, None))
    }

    /// This rank's tokens of a full-sequence tensor: [`shard`](crate::shard) into a new tensor
    /// whose `seq_dim` (negative: from the end) is `1/world_size` as long.
    ///
    /// ```
    /// use stria::{Layout, Tensor};
    /// let full = Tensor::new((0..8).map(|x| x as f32).collect(), &[8, 1]).unwrap();
    /// let local = full.shard(Layout::Striped, 2, 1, 0).unwrap();
    /// assert_eq!(local.as_slice(), &[1.0, 3.0, 5.0, 7.0]);
    /// ```
    pub fn shard(&self, layout: Layout, world_size: i32, rank: i32, seq_dim: i32) -> Result<Tensor<T>> {
        let mut shape = self.shape.clone();
        if let (Some(dim), true) = (resolve_dim(seq_dim, shape.len()), world_size > 0) {
            shape[dim] /= i64::from(world_size); // an uneven split is the library's to report
        }
        let mut local = Tensor::zeros(&shape)?;
        crate::layout::shard(layout, world_size, rank, seq_dim, self, &mut local)?;
        Ok(local)
    }

    /// Puts every rank's shard (`shards[r]` from rank r) back into one full-sequence tensor.
    ///
    /// ```
    /// use stria::{Layout, Tensor};
    /// let full = Tensor::new((0..12).map(|x| x as i64).collect(), &[1, 12]).unwrap();
    /// let shards: Vec<_> = (0..3).map(|r| full.shard(Layout::Zigzag, 3, r, -1).unwrap()).collect();
    /// assert_eq!(shards[0].as_slice(), &[0, 1, 10, 11]);
    /// assert_eq!(Tensor::unshard(&shards, Layout::Zigzag, -1).unwrap(), full);
    /// ```
    pub fn unshard(shards: &[Tensor<T>], layout: Layout, seq_dim: i32) -> Result<Tensor<T>> {
        let first = shards.first().ok_or_else(|| invalid("unshard of no shards"))?;
        let world_size = i32::try_from(shards.len()).map_err(|_| invalid("too many shards"))?;
        let mut shape = first.shape.clone();
        if let Some(dim) = resolve_dim(seq_dim, shape.len()) {
            shape[dim] = shape[dim]
                .checked_mul(i64::from(world_size))
                .ok_or_else(|| invalid("the full sequence is too long"))?;
        }
        let mut full = Tensor::zeros(&shape)?;
        for (rank, shard) in shards.iter().enumerate() {
            crate::layout::unshard(layout, world_size, rank as i32, seq_dim, shard, &mut full)?;
        }
        Ok(full)
    }

    /// This rank's slots of a full-sequence tensor under a document plan: [`Plan::shard`] into a
    /// new tensor whose `seq_dim` (negative: from the end) is the plan's
    /// [`local_len`](Plan::local_len) long, zero in the padding slots.
    pub fn shard_by_plan(&self, plan: &Plan, rank: i32, seq_dim: i32) -> Result<Tensor<T>> {
        let mut shape = self.shape.clone();
        if let Some(dim) = resolve_dim(seq_dim, shape.len()) {
            shape[dim] = plan.local_len(); // a full tensor of the wrong length is the library's to report
        }
        let mut local = Tensor::zeros(&shape)?;
        plan.shard(rank, seq_dim, self, &mut local)?;
        Ok(local)
    }

    /// Puts every rank's slots (`shards[r]` from rank r, one per rank of the plan) back into one
    /// full-sequence tensor of the plan's seq_len along `seq_dim`.
    pub fn unshard_by_plan(shards: &[Tensor<T>], plan: &Plan, seq_dim: i32) -> Result<Tensor<T>> {
        let first = shards.first().ok_or_else(|| invalid("unshard of no shards"))?;
        if shards.len() != plan.world_size() as usize {
            return Err(invalid(format!(
                "{} shards for a plan of world_size {}: one per rank",
                shards.len(),
                plan.world_size()
            )));
        }
        let mut shape = first.shape.clone();
        if let Some(dim) = resolve_dim(seq_dim, shape.len()) {
            shape[dim] = plan.info().seq_len;
        }
        let mut full = Tensor::zeros(&shape)?;
        for (rank, shard) in shards.iter().enumerate() {
            plan.unshard(rank as i32, seq_dim, shard, &mut full)?;
        }
        Ok(full)
    }
}

/// `seq_dim` as an index, counting a negative one from the end; `None` when out of range (the
/// library then says so).
fn resolve_dim(seq_dim: i32, ndim: usize) -> Option<usize> {
    let ndim = i64::try_from(ndim).ok()?;
    let d = if seq_dim < 0 {
        i64::from(seq_dim) + ndim
    } else {
        i64::from(seq_dim)
    };
    (0..ndim).contains(&d).then_some(d as usize)
}

impl<T: Element> sealed::Sealed for Tensor<T> {}
impl<T: Element> Input for Tensor<T> {
    fn dl_tensor(&self) -> sys::DLTensor {
        compact_dl(self.data.as_ptr() as *mut T, &self.shape)
    }
}
impl<T: Element> Output for Tensor<T> {
    fn dl_tensor_mut(&mut self) -> sys::DLTensor {
        compact_dl(self.data.as_mut_ptr(), &self.shape)
    }
}

/// The DLTensor of compact host storage; it points into `shape`, which must outlive its use.
fn compact_dl<T: Element>(data: *mut T, shape: &[i64]) -> sys::DLTensor {
    sys::DLTensor {
        data: data.cast(),
        device: Device::Cpu.dl(),
        ndim: shape.len() as i32,
        dtype: T::DTYPE.dl(),
        shape: shape.as_ptr() as *mut i64,
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    }
}
