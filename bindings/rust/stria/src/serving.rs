//! Serving over a KV cache sharded across the ranks (stria.h, `stria_attention_decode`).
//!
//! Each rank holds its share of every sequence's cache, placed by the params' layout: striped
//! keeps cached position t on rank t mod N at slot t / N, so the shares grow evenly as generation
//! goes on. A decode call gives every rank the same new queries; each attends them to its share,
//! and the partial results are merged exactly across the ranks, the same bits on every rank.

use std::ffi::c_void;
use std::marker::PhantomData;

use crate::attention::AttentionParams;
use crate::context::Context;
use crate::error::{check, invalid, Result};
use crate::sys;
use crate::tensor::{Input, Output};

/// One rank's share of a KV cache, borrowed for a decode call (which writes the new tokens into
/// it).
pub struct KvCache<'a> {
    k: sys::DLTensor,
    v: sys::DLTensor,
    block_table: Option<sys::DLTensor>,
    lens: &'a [i64],
    borrow: PhantomData<&'a mut ()>,
}

impl<'a> KvCache<'a> {
    /// A contiguous cache: `k`, `v` are `[B, C, Hkv, D]` (C: the slots of each sequence on this
    /// rank), `lens` the tokens cached per sequence before the call (the same on every rank).
    pub fn contiguous(k: &'a mut impl Output, v: &'a mut impl Output, lens: &'a [i64]) -> Self {
        KvCache {
            k: k.dl_tensor_mut(),
            v: v.dl_tensor_mut(),
            block_table: None,
            lens,
            borrow: PhantomData,
        }
    }

    /// A paged cache, as vLLM and SGLang keep theirs: `k`, `v` are pools
    /// `[num_blocks, block_size, Hkv, D]`, and `block_table` (`i32` `[B, max_blocks]`) names the
    /// block of each sequence's slots: slot s of sequence b is row s mod block_size of block
    /// `block_table[b][s / block_size]`.
    pub fn paged(k: &'a mut impl Output, v: &'a mut impl Output, block_table: &'a impl Input, lens: &'a [i64]) -> Self {
        KvCache {
            k: k.dl_tensor_mut(),
            v: v.dl_tensor_mut(),
            block_table: Some(block_table.dl_tensor()),
            lens,
            borrow: PhantomData,
        }
    }
}

/// The new tokens of a decode call: keys and values `[B, T, Hkv, D]`, stored into the cache by the
/// ranks that hold their positions before the queries attend.
pub struct NewTokens<'a> {
    /// The new keys.
    pub k: &'a dyn Input,
    /// The new values.
    pub v: &'a dyn Input,
}

/// How a prefill's ranks meet (see [`Context::prefill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefillMode {
    /// Whichever moves fewer bytes per ring step.
    #[default]
    Auto,
    /// Each rank's keys and values (its cache share and new tokens) travel the ring.
    PassKv,
    /// The new tokens' queries travel; each partial result goes home to be merged.
    PassQ,
}

impl PrefillMode {
    fn raw(self) -> sys::stria_prefill_t {
        match self {
            PrefillMode::Auto => sys::STRIA_PREFILL_AUTO,
            PrefillMode::PassKv => sys::STRIA_PREFILL_PASS_KV,
            PrefillMode::PassQ => sys::STRIA_PREFILL_PASS_Q,
        }
    }
}

/// The library's cache struct over a borrowed [`KvCache`] (its pointers valid while `cache` is).
fn raw_cache(cache: &mut KvCache, table: &Option<sys::DLTensor>) -> sys::stria_kv_cache_t {
    sys::stria_kv_cache_t {
        struct_size: std::mem::size_of::<sys::stria_kv_cache_t>(),
        k: &mut cache.k,
        v: &mut cache.v,
        block_table: table.as_ref().map_or(std::ptr::null(), |t| t as *const sys::DLTensor),
        lens: cache.lens.as_ptr(),
    }
}

/// The lengths must be one per sequence of q (the library cannot see the slice's end).
fn check_lengths(cache: &KvCache, q: &sys::DLTensor) -> Result<()> {
    if q.ndim == 4 && !q.shape.is_null() {
        // SAFETY: a 4-dimensional DLTensor of this crate points at its 4 sizes.
        let batch = unsafe { *q.shape };
        if cache.lens.len() as i64 != batch {
            return Err(invalid(format!(
                "the cache has {} lengths but q has {} sequences: one length each",
                cache.lens.len(),
                batch
            )));
        }
    }
    Ok(())
}

impl Context {
    /// Prefill with a sharded cache, collectively: P new tokens per sequence sharded by
    /// `params.layout` as [`forward`](Context::forward) takes a sequence (`q` `[B, L, Hq, D]`, `k`,
    /// `v` `[B, L, Hkv, D]`, L = P / N; local token i at chunk position
    /// [`Layout::positions`](crate::Layout::positions)`(P, N, rank)[i]`, which is position
    /// `lens[b] + that`), attend to the whole cache and causally to each other; their keys and
    /// values are stored where the layout puts their positions (advance the lengths by P
    /// afterwards). Writes `out` (like `q`) and, if given, `lse` (`[B, Hq, L]`).
    #[allow(clippy::too_many_arguments)]
    pub fn prefill(
        &mut self,
        params: &AttentionParams,
        cache: &mut KvCache,
        mode: PrefillMode,
        q: &impl Input,
        k: &impl Input,
        v: &impl Input,
        out: &mut impl Output,
        lse: Option<&mut dyn Output>,
    ) -> Result<()> {
        let q = q.dl_tensor();
        check_lengths(cache, &q)?;
        if params.documents.is_some() || params.plan.is_some() {
            return Err(invalid(
                "a prefill attends each sequence to its own cache: params.documents and params.plan must be None"
                    .to_string(),
            ));
        }
        let sinks = params.sinks.map(|z| z.dl());
        let raw = params.raw(&None, sinks.as_ref(), None);
        let table = cache.block_table;
        let raw_cache = raw_cache(cache, &table);
        let (k, v) = (k.dl_tensor(), v.dl_tensor());
        let mut out = out.dl_tensor_mut();
        let mut lse = lse.map(|l| l.dl_tensor_mut());
        let lse_ptr = lse.as_mut().map_or(std::ptr::null_mut(), |l| l as *mut sys::DLTensor);
        // SAFETY: every pointer is to memory borrowed for this call; a null stream is what CPU
        // contexts require (CUDA ones: the default stream).
        check(unsafe {
            sys::stria_attention_prefill(
                self.raw(),
                &raw,
                &raw_cache,
                mode.raw(),
                &q,
                &k,
                &v,
                &mut out,
                lse_ptr,
                std::ptr::null_mut(),
            )
        })
    }

    /// Decode over a sharded cache, collectively with the other ranks (each on its own thread,
    /// the same `q`, `new`, lengths and `params`): attention of `q` (`[B, T, Hq, D]`, query t of
    /// sequence b at position `lens[b] + t`) to the whole cache, every rank's share. With `new`,
    /// the new tokens are stored first and seen by the queries (causally unless `params.causal` is
    /// false); advance the lengths by T afterwards. Writes `out` (like `q`) and, if given, `lse`
    /// (`[B, Hq, T]` `f32`). `params.layout` places the cache; `params.window` takes a left bound
    /// only (`(left, -1)`); documents and plans do not apply.
    pub fn decode(
        &mut self,
        params: &AttentionParams,
        cache: &mut KvCache,
        q: &impl Input,
        new: Option<NewTokens>,
        out: &mut impl Output,
        lse: Option<&mut dyn Output>,
    ) -> Result<()> {
        // SAFETY: a null stream is what CPU contexts require (CUDA ones: the default stream).
        unsafe { self.decode_on_stream(params, cache, q, new, out, lse, std::ptr::null_mut()) }
    }

    /// [`decode`](Context::decode) on a CUDA stream.
    ///
    /// # Safety
    /// `stream` is NULL or a live `cudaStream_t` of the context's device, and the tensors' memory
    /// stays valid until the work queued on it completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn decode_on_stream(
        &mut self,
        params: &AttentionParams,
        cache: &mut KvCache,
        q: &impl Input,
        new: Option<NewTokens>,
        out: &mut impl Output,
        lse: Option<&mut dyn Output>,
        stream: *mut c_void,
    ) -> Result<()> {
        let q = q.dl_tensor();
        check_lengths(cache, &q)?;
        if params.documents.is_some() || params.plan.is_some() {
            return Err(invalid(
                "a decode call attends each sequence to its own cache: params.documents and params.plan must be None"
                    .to_string(),
            ));
        }
        let sinks = params.sinks.map(|z| z.dl());
        let raw = params.raw(&None, sinks.as_ref(), None);
        let table = cache.block_table;
        let raw_cache = raw_cache(cache, &table);
        let new = new.map(|n| (n.k.dl_tensor(), n.v.dl_tensor()));
        let (k_new, v_new) = new.as_ref().map_or((std::ptr::null(), std::ptr::null()), |(k, v)| {
            (k as *const sys::DLTensor, v as *const sys::DLTensor)
        });
        let mut out = out.dl_tensor_mut();
        let mut lse = lse.map(|l| l.dl_tensor_mut());
        let lse_ptr = lse.as_mut().map_or(std::ptr::null_mut(), |l| l as *mut sys::DLTensor);
        check(sys::stria_attention_decode(
            self.raw(),
            &raw,
            &raw_cache,
            &q,
            k_new,
            v_new,
            &mut out,
            lse_ptr,
            stream,
        ))
    }
}
