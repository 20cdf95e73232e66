//! Exact ring attention over a sequence sharded across ranks: safe Rust bindings to libstria.
//!
//! A sequence of S tokens is spread over N ranks (threads, processes or GPUs), L = S / N each,
//! in a [`Layout`] (contiguous, striped or zigzag). Every rank calls
//! [`Context::forward`] (and [`Context::backward`]) with its own tokens; K/V blocks travel
//! around the ring, and each rank gets exactly softmax(scale·QKᵀ + mask)·V over the whole
//! sequence for its tokens.
//!
//! - [`LocalGroup`]: N contexts in this process, one thread each ([`LocalGroup::run`]);
//!   [`Context::new`] for one rank of a multi-process ring, with [`Config::from_env`] under
//!   torchrun or mpirun ([`Launch`]).
//! - Tensors: [`Tensor`] (owned), [`TensorView`]/[`TensorViewMut`] (borrowed slices, optional
//!   strides), or any DLPack `DLTensor` through `from_raw`; elements `f32`, [`half::f16`],
//!   [`half::bf16`].
//! - [`Layout::positions`], [`shard`]/[`unshard`] (and [`Tensor::shard`]/[`Tensor::unshard`]),
//!   [`analyze_balance`].
//! - Packed documents of uneven lengths: a [`Plan`] ([`PlanConfig`]) places the tokens so that
//!   every rank does about the same work at every ring step ([`AttentionParams::plan`]).
//! - Serving: [`Context::decode`] attends new tokens to a KV cache sharded over the ranks
//!   ([`KvCache`], contiguous or paged), merging the ranks' partial results exactly;
//!   [`Context::prefill`] does it for new tokens sharded over the ranks ([`PrefillMode`]).
//! - Every failure is an [`Error`]: a [`Status`] and the library's message.
//!
//! ```
//! use stria::{AttentionParams, Layout, LocalGroup, Tensor};
//! let (s, n) = (16i64, 4i32); // 16 tokens on a ring of 4 ranks
//! let shape = [1, s, 2, 8]; // [batch, tokens, heads, head dim]
//! let x: Vec<f32> = (0..32 * 8).map(|i| (i as f32).cos()).collect();
//! let q = Tensor::new(x, &shape).unwrap();
//! let params = AttentionParams { layout: Layout::Striped, causal: true, ..Default::default() };
//!
//! let mut group = LocalGroup::new(n as usize, &stria::Config::new()).unwrap();
//! let outs = group.run(0..n, |ctx, rank| -> stria::Result<Tensor<f32>> {
//!     let q = q.shard(params.layout, n, rank, 1)?; // this rank's 4 tokens
//!     let mut out = Tensor::zeros(q.shape())?;
//!     let mut lse = Tensor::<f32>::zeros(&[1, 2, s / n as i64])?;
//!     ctx.forward(&params, &q, &q, &q, &mut out, &mut lse)?;
//!     Ok(out)
//! });
//! let outs = outs.into_iter().collect::<stria::Result<Vec<_>>>().unwrap();
//! let out = Tensor::unshard(&outs, params.layout, 1).unwrap();
//! // Causal: the first token sees only itself, so its output is its own value row.
//! assert!((out.as_slice()[3] - q.as_slice()[3]).abs() < 1e-6);
//! println!("stria {}", stria::version());
//! ```

mod attention;
mod context;
mod error;
mod launch;
mod layout;
mod plan;
mod serving;
mod tensor;

pub use attention::{AttentionParams, Descales, Documents, Sinks};
pub use context::{AbortHandle, Config, Context, LocalGroup, StepTime, Traffic, Transport, UniqueId};
pub use error::{Error, Result, Status};
pub use half;
pub use launch::Launch;
pub use layout::{
    analyze_balance, balance_steps, grid_analyze_balance, grid_shard, grid_unshard, shard, unshard, Balance, Layout,
};
pub use plan::{Plan, PlanConfig, PlanInfo, PlanStrategy};
pub use serving::{KvCache, NewTokens, PrefillMode};
pub use stria_sys as sys;
pub use tensor::{DType, Device, Element, Input, Output, Tensor, TensorView, TensorViewMut, F8E4M3};

/// A library version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible ABI changes (the SONAME carries it).
    pub major: u32,
    /// Additions.
    pub minor: u32,
    /// Fixes.
    pub patch: u32,
}

impl Version {
    /// The version of the header these bindings were generated from.
    pub const HEADER: Version = Version {
        major: sys::STRIA_VERSION_MAJOR,
        minor: sys::STRIA_VERSION_MINOR,
        patch: sys::STRIA_VERSION_PATCH,
    };
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The version of the libstria that is loaded (which may be newer than [`Version::HEADER`]).
///
/// ```
/// let v = stria::version();
/// assert_eq!(v.major, stria::Version::HEADER.major); // the SONAME guarantees it
/// assert!(v >= stria::Version::HEADER || v.minor < stria::Version::HEADER.minor);
/// ```
pub fn version() -> Version {
    // SAFETY: no arguments, no state.
    let v = unsafe { sys::stria_get_version() }.max(0) as u32;
    Version {
        major: v / 10000,
        minor: v / 100 % 100,
        patch: v % 100,
    }
}
