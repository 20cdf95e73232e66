//! Ring attention, forward and backward (DESIGN.md, "Tensors" and "The ring").

use std::fmt;
use std::marker::PhantomData;
use std::os::raw::{c_int, c_void};

use stria_sys as sys;

use crate::context::Context;
use crate::error::{check, invalid, Result};
use crate::layout::Layout;
use crate::plan::Plan;
use crate::tensor::{Input, Output};

/// Packed documents (a document mask): several documents share the sequence, and a query sees
/// only the keys of its own document (when causal, those at or before it). Boundaries are global
/// positions, the same on every rank: `[0, s1, …, S]` with S = L·N, never decreasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Documents<'a> {
    boundaries: &'a [i64],
    per_row: bool,
}

impl<'a> Documents<'a> {
    /// The same documents in every batch row: `[0, s1, …, S]`.
    pub fn shared(boundaries: &'a [i64]) -> Self {
        Documents {
            boundaries,
            per_row: false,
        }
    }

    /// Each batch row's own documents: B rows of `n + 1` positions back to back (a row with
    /// fewer documents repeats S at its end).
    pub fn per_row(boundaries: &'a [i64]) -> Self {
        Documents {
            boundaries,
            per_row: true,
        }
    }

    /// The library's form for `batch` rows: B rows of n + 1, and n.
    fn rows(&self, batch: usize) -> Result<(Vec<i64>, i64)> {
        let len = self.boundaries.len();
        let per = if self.per_row {
            if batch == 0 || len % batch != 0 {
                return Err(invalid(format!(
                    "Documents::per_row has {len} boundaries: not a whole row of n + 1 for each of q's {batch} batch rows"
                )));
            }
            len / batch
        } else {
            len
        };
        if per < 2 {
            return Err(invalid(format!(
                "documents need at least two boundaries per batch row ([0, S] is one document), got {per}"
            )));
        }
        let rows = if self.per_row {
            self.boundaries.to_vec()
        } else {
            self.boundaries.repeat(batch)
        };
        Ok((rows, (per - 1) as i64))
    }
}

/// Attention-sink logits (gpt-oss's `sinks`): a float32 `[Hq]` tensor, one logit z per query head,
/// in the context's memory. Head h's z joins the softmax denominator of each of its rows once,
/// whatever the ring, and carries no value: out = Σ e^s·v / (e^z + Σ e^s); the LSE includes it,
/// and a row that sees no key gets out 0 and LSE z. Every rank passes the same values.
#[derive(Clone, Copy)]
pub struct Sinks<'a> {
    dl: sys::DLTensor,
    logits: PhantomData<&'a ()>,
}

impl<'a> Sinks<'a> {
    /// The logits in `logits` (borrowed while the params are used; the library checks the shape
    /// and dtype).
    pub fn new(logits: &'a impl Input) -> Self {
        Sinks {
            dl: logits.dl_tensor(),
            logits: PhantomData,
        }
    }
}

impl Sinks<'_> {
    /// The logits' DLTensor, for a call's params.
    pub(crate) fn dl(&self) -> sys::DLTensor {
        self.dl
    }
}

impl fmt::Debug for Sinks<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sinks").field("data", &self.dl.data).finish()
    }
}

impl PartialEq for Sinks<'_> {
    /// The same logits: the same memory.
    fn eq(&self, other: &Self) -> bool {
        self.dl.data == other.dl.data && self.dl.byte_offset == other.dl.byte_offset
    }
}

// SAFETY: a Sinks is a read-only view of memory borrowed (for 'a) from an `Input`, which the
// library only reads during a call; sharing or sending that view between threads is as safe as
// sharing the borrow `&'a impl Input` it came from.
unsafe impl Send for Sinks<'_> {}
unsafe impl Sync for Sinks<'_> {}

/// The descales of a forward's FP8 inputs (q, k and v of [`DType::E4M3`](crate::DType::E4M3)):
/// the attention sees q·q_descale, k·k_descale and v·v_descale. Each is unset (1) or a float32
/// tensor in the context's memory of shape `[1]` (the tensor's) or `[H]` (one per head: Hq for
/// q, Hkv for k and v); the library checks them, and refuses descales with other inputs.
#[derive(Clone, Copy, Default)]
pub struct Descales<'a> {
    q: Option<sys::DLTensor>,
    k: Option<sys::DLTensor>,
    v: Option<sys::DLTensor>,
    tensors: PhantomData<&'a ()>,
}

impl<'a> Descales<'a> {
    /// No descale (every input at scale 1).
    pub fn none() -> Self {
        Descales::default()
    }
    /// With q's descale from `t` (borrowed while the params are used).
    pub fn q(mut self, t: &'a impl Input) -> Self {
        self.q = Some(t.dl_tensor());
        self
    }
    /// With k's descale.
    pub fn k(mut self, t: &'a impl Input) -> Self {
        self.k = Some(t.dl_tensor());
        self
    }
    /// With v's descale.
    pub fn v(mut self, t: &'a impl Input) -> Self {
        self.v = Some(t.dl_tensor());
        self
    }
}

impl fmt::Debug for Descales<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let at = |t: &Option<sys::DLTensor>| t.map(|t| t.data);
        f.debug_struct("Descales")
            .field("q", &at(&self.q))
            .field("k", &at(&self.k))
            .field("v", &at(&self.v))
            .finish()
    }
}

impl PartialEq for Descales<'_> {
    /// The same descales: the same memory.
    fn eq(&self, other: &Self) -> bool {
        let at = |t: &Option<sys::DLTensor>| t.map(|t| (t.data, t.byte_offset));
        at(&self.q) == at(&other.q) && at(&self.k) == at(&other.k) && at(&self.v) == at(&other.v)
    }
}

// SAFETY: as for Sinks: read-only views of memory borrowed for 'a from `Input`s, which the
// library only reads during a call.
unsafe impl Send for Descales<'_> {}
unsafe impl Sync for Descales<'_> {}

/// The settings every rank of a call must share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams<'a> {
    /// How the sequence is spread over the ranks (must match how the tensors were sharded); not
    /// used with a `plan`.
    pub layout: Layout,
    /// Causal masking on global positions: a query at p sees keys at p' ≤ p.
    pub causal: bool,
    /// The factor on QKᵀ; `None` is 1/√D. (`Some(0.0)` also means 1/√D to the library.)
    pub softmax_scale: Option<f32>,
    /// Packed documents; `None` attends over the whole sequence.
    pub documents: Option<Documents<'a>>,
    /// A sliding window `(left, right)`: the query at global position i sees the keys at
    /// i − left ..= i + right (when causal, up to i), each side ≥ 0 or −1 for unbounded; within
    /// its document when `documents` is set. `None` (or `(-1, -1)`): no window.
    pub window: Option<(i64, i64)>,
    /// A document plan for the ring to run on instead of `layout`: every rank passes a plan made
    /// from the same boundaries and [`PlanConfig`](crate::PlanConfig), and its tensors hold the
    /// plan's [`local_len`](Plan::local_len) slots
    /// ([`Tensor::shard_by_plan`](crate::Tensor::shard_by_plan)). The document mask is then the
    /// plan's boundaries: `documents` may stay `None`, and if set must be the same boundaries.
    /// `window` applies as without a plan.
    pub plan: Option<&'a Plan>,
    /// Logit softcapping (Gemma 2's `attn_logit_softcapping`): a score s = scale·q·k becomes
    /// cap·tanh(s / cap) before the mask; `None` (or 0): none.
    pub softcap: Option<f32>,
    /// Attention sinks; `None`: none. Their gradient comes from
    /// [`backward_with_sinks_grad`](Context::backward_with_sinks_grad).
    pub sinks: Option<Sinks<'a>>,
    /// The descales of FP8 inputs (the forward only); [`Descales::none`] for any other call.
    pub descales: Descales<'a>,
}

impl Default for AttentionParams<'_> {
    /// The library's defaults: striped, causal, 1/√D, one document, no window, no plan, no
    /// softcap, no sinks, no descales.
    fn default() -> Self {
        AttentionParams {
            layout: Layout::Striped,
            causal: true,
            softmax_scale: None,
            documents: None,
            window: None,
            plan: None,
            softcap: None,
            sinks: None,
            descales: Descales::none(),
        }
    }
}

impl AttentionParams<'_> {
    /// The whole call in the library's struct: the mask (`documents`, the rows documents_for
    /// made, which must outlive the call; the window) and the scores' modifications with it, so
    /// that every call is one stria_attention_forward or _backward. `sinks` and `sinks_grad` point
    /// at DLTensors that must outlive the call too.
    pub(crate) fn raw(
        &self,
        documents: &Option<(Vec<i64>, i64)>,
        sinks: Option<&sys::DLTensor>,
        sinks_grad: Option<&mut sys::DLTensor>,
    ) -> sys::stria_attention_params_t {
        // Every field set here, struct_size from this crate's own struct: stria_attention_params_init
        // writes the loaded library's sizeof, and a newer library's struct may have grown past
        // this one (stria.h lets it), so it would write, and then read, past the end.
        let (cu_seqlens, num_seqs) = documents
            .as_ref()
            .map_or((std::ptr::null(), 0), |(rows, n)| (rows.as_ptr(), *n));
        let (window_left, window_right) = self.window.unwrap_or((-1, -1));
        sys::stria_attention_params_t {
            struct_size: std::mem::size_of::<sys::stria_attention_params_t>(),
            layout: self.layout.raw(),
            causal: c_int::from(self.causal),
            softmax_scale: self.softmax_scale.unwrap_or(0.0),
            plan: self.plan.map_or(std::ptr::null_mut(), Plan::raw),
            cu_seqlens,
            num_seqs,
            window_left,
            window_right,
            softcap: self.softcap.unwrap_or(0.0),
            sinks: sinks.map_or(std::ptr::null(), |t| t as *const sys::DLTensor),
            dsinks: sinks_grad.map_or(std::ptr::null_mut(), |t| t as *mut sys::DLTensor),
            q_descale: self
                .descales
                .q
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const sys::DLTensor),
            k_descale: self
                .descales
                .k
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const sys::DLTensor),
            v_descale: self
                .descales
                .v
                .as_ref()
                .map_or(std::ptr::null(), |t| t as *const sys::DLTensor),
        }
    }

    /// The document boundaries as the library reads them for a call whose q is `q` (B rows of
    /// n + 1, and n), or `None` for the plain call.
    fn documents_for(&self, q: &sys::DLTensor) -> Result<Option<(Vec<i64>, i64)>> {
        let docs = match &self.documents {
            Some(docs) => docs,
            None => return Ok(None),
        };
        // The library reads B rows: B comes from q, checked here because the library cannot
        // know how long the slice is.
        let batch = if q.ndim == 4 && !q.shape.is_null() {
            // SAFETY: a 4-dimensional DLTensor of this crate points at its 4 sizes.
            usize::try_from(unsafe { *q.shape }).unwrap_or(0)
        } else {
            0
        };
        docs.rows(batch).map(Some)
    }
}

impl Context {
    /// The forward pass, collectively with the ring's other ranks (each calls it on its own
    /// thread, with the same shapes and `params`).
    ///
    /// - `q`: `[B, L, Hq, D]`, `k`, `v`: `[B, L, Hkv, D]` with Hq a multiple of Hkv (GQA/MQA): this
    ///   rank's L = S / N tokens in `params.layout`, or the L = local_len slots of `params.plan`;
    /// - `out` (written): like `q`; `lse` (written): `[B, Hq, L]` `f32`, the natural log of each
    ///   row's softmax denominator (−∞ for a row that sees no key).
    ///
    /// All of q, k, v, out share one dtype: `f32`, `f16` or `bf16`. A failure on any rank (a bad
    /// shape, a peer gone, a timeout) is an error on every rank.
    ///
    /// ```
    /// use half::f16;
    /// use stria::{AttentionParams, Context, Tensor};
    /// let mut ctx = Context::new(&stria::Config::new()).unwrap(); // a ring of one
    /// // 4 tokens, 2 query heads sharing 1 key/value head of dimension 8. Keys are all zero, so
    /// // every visible key gets the same weight: causal output i is the mean of values 0..=i.
    /// let q = Tensor::full(&[1, 4, 2, 8], f16::from_f32(0.5)).unwrap();
    /// let k = Tensor::<f16>::zeros(&[1, 4, 1, 8]).unwrap();
    /// let v = Tensor::new((0..32).map(|x| f16::from_f32(x as f32)).collect(), &[1, 4, 1, 8]).unwrap();
    /// let mut out = Tensor::<f16>::zeros(&[1, 4, 2, 8]).unwrap();
    /// let mut lse = Tensor::<f32>::zeros(&[1, 2, 4]).unwrap();
    /// ctx.forward(&AttentionParams::default(), &q, &k, &v, &mut out, &mut lse).unwrap();
    /// for i in 0..4 {
    ///     let mean_row = i as f32 / 2.0; // the mean of rows 0..=i
    ///     assert_eq!(out.as_slice()[i * 16 + 8 + 3].to_f32(), mean_row * 8.0 + 3.0); // head 1, d 3
    ///     assert!((lse.as_slice()[i] - ((i + 1) as f32).ln()).abs() < 1e-6);
    /// }
    /// ```
    pub fn forward(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &mut impl Output,
        lse: &mut impl Output,
    ) -> Result<()> {
        // SAFETY: a null stream is what CPU contexts require (CUDA ones: the default stream).
        unsafe { self.forward_on_stream(params, q, k, v, out, lse, std::ptr::null_mut()) }
    }

    /// [`forward`](Context::forward) on a CUDA stream.
    ///
    /// # Safety
    /// `stream` is NULL or a live `cudaStream_t` of the context's device, and the tensors'
    /// memory stays valid until the work queued on it completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn forward_on_stream(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &mut impl Output,
        lse: &mut impl Output,
        stream: *mut c_void,
    ) -> Result<()> {
        let (q, k, v) = (q.dl_tensor(), k.dl_tensor(), v.dl_tensor());
        let documents = params.documents_for(&q)?;
        let sinks = params.sinks.map(|z| z.dl);
        let params = params.raw(&documents, sinks.as_ref(), None);
        let (mut out, mut lse) = (out.dl_tensor_mut(), lse.dl_tensor_mut());
        // The DLTensors describe memory borrowed for this call: inputs read, outputs written
        // (distinct from the inputs, or the borrows would not have compiled).
        check(sys::stria_attention_forward(
            self.raw(),
            &params,
            &q,
            &k,
            &v,
            &mut out,
            &mut lse,
            stream,
        ))
    }

    /// The backward pass, collectively: from the forward's `q`, `k`, `v`, `out`, `lse` and the
    /// gradient `dout` (like `out`), writes `dq` (like `q`), `dk` and `dv` (like `k`).
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &impl Input,
        lse: &impl Input,
        dout: &impl Input,
        dq: &mut impl Output,
        dk: &mut impl Output,
        dv: &mut impl Output,
    ) -> Result<()> {
        // SAFETY: as in forward.
        unsafe { self.backward_on_stream(params, q, k, v, out, lse, dout, dq, dk, dv, std::ptr::null_mut()) }
    }

    /// [`backward`](Context::backward) on a CUDA stream.
    ///
    /// # Safety
    /// As [`forward_on_stream`](Context::forward_on_stream).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn backward_on_stream(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &impl Input,
        lse: &impl Input,
        dout: &impl Input,
        dq: &mut impl Output,
        dk: &mut impl Output,
        dv: &mut impl Output,
        stream: *mut c_void,
    ) -> Result<()> {
        self.backward_raw(params, q, k, v, out, lse, dout, dq, dk, dv, None, stream)
    }

    /// [`backward`](Context::backward) that also writes `dsinks` (float32 `[Hq]`, like the sinks):
    /// this rank's part of the gradient of `params.sinks`, summed over its rows and batch. The sum
    /// over the ranks is the whole gradient, as for any weight every rank holds.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_with_sinks_grad(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &impl Input,
        lse: &impl Input,
        dout: &impl Input,
        dq: &mut impl Output,
        dk: &mut impl Output,
        dv: &mut impl Output,
        dsinks: &mut impl Output,
    ) -> Result<()> {
        // SAFETY: as in forward.
        unsafe {
            self.backward_raw(
                params,
                q,
                k,
                v,
                out,
                lse,
                dout,
                dq,
                dk,
                dv,
                Some(dsinks.dl_tensor_mut()),
                std::ptr::null_mut(),
            )
        }
    }

    /// [`backward_with_sinks_grad`](Context::backward_with_sinks_grad) on a CUDA stream.
    ///
    /// # Safety
    /// As [`forward_on_stream`](Context::forward_on_stream).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn backward_with_sinks_grad_on_stream(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &impl Input,
        lse: &impl Input,
        dout: &impl Input,
        dq: &mut impl Output,
        dk: &mut impl Output,
        dv: &mut impl Output,
        dsinks: &mut impl Output,
        stream: *mut c_void,
    ) -> Result<()> {
        self.backward_raw(
            params,
            q,
            k,
            v,
            out,
            lse,
            dout,
            dq,
            dk,
            dv,
            Some(dsinks.dl_tensor_mut()),
            stream,
        )
    }

    /// The backward with an optional sinks' gradient: one stria_attention_backward.
    ///
    /// # Safety
    /// As [`forward_on_stream`](Context::forward_on_stream); `dsinks` describes memory borrowed
    /// mutably for the call.
    #[allow(clippy::too_many_arguments)]
    unsafe fn backward_raw(
        &mut self,
        params: &AttentionParams,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &impl Input,
        lse: &impl Input,
        dout: &impl Input,
        dq: &mut impl Output,
        dk: &mut impl Output,
        dv: &mut impl Output,
        mut dsinks: Option<sys::DLTensor>,
        stream: *mut c_void,
    ) -> Result<()> {
        let (q, k, v) = (q.dl_tensor(), k.dl_tensor(), v.dl_tensor());
        let documents = params.documents_for(&q)?;
        let sinks = params.sinks.map(|z| z.dl);
        let params = params.raw(&documents, sinks.as_ref(), dsinks.as_mut());
        let (out, lse, dout) = (out.dl_tensor(), lse.dl_tensor(), dout.dl_tensor());
        let (mut dq, mut dk, mut dv) = (dq.dl_tensor_mut(), dk.dl_tensor_mut(), dv.dl_tensor_mut());
        check(sys::stria_attention_backward(
            self.raw(),
            &params,
            &q,
            &k,
            &v,
            &out,
            &lse,
            &dout,
            &mut dq,
            &mut dk,
            &mut dv,
            stream,
        ))
    }
}
