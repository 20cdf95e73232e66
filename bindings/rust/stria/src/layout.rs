//! Token layouts: which global positions each rank holds, moving tokens between a full sequence
//! and a rank's shard, and how evenly a layout spreads causal work over the ring.

use std::os::raw::c_int;

use stria_sys as sys;

use crate::error::{check, Error, Result, Status};
use crate::tensor::{Input, Output};

/// How the global sequence of length S is cut into world_size shards of L = S / N tokens
/// (DESIGN.md, "Layouts").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Rank r holds positions r·L .. r·L + L − 1 (S % N == 0). Unbalanced under causal masking.
    Contiguous,
    /// Rank r holds positions r, r + N, r + 2N, ... (S % N == 0). Balanced (Striped Attention).
    Striped,
    /// Rank r holds chunk r and chunk 2N − 1 − r of 2N chunks (S % 2N == 0). Balanced.
    Zigzag,
}

impl Layout {
    /// Every layout.
    pub const ALL: [Layout; 3] = [Layout::Contiguous, Layout::Striped, Layout::Zigzag];

    pub(crate) fn raw(self) -> sys::stria_layout_t {
        match self {
            Layout::Contiguous => sys::STRIA_LAYOUT_CONTIGUOUS,
            Layout::Striped => sys::STRIA_LAYOUT_STRIPED,
            Layout::Zigzag => sys::STRIA_LAYOUT_ZIGZAG,
        }
    }

    /// The lower-case name ("contiguous", "striped", "zigzag").
    pub fn name(self) -> &'static str {
        match self {
            Layout::Contiguous => "contiguous",
            Layout::Striped => "striped",
            Layout::Zigzag => "zigzag",
        }
    }

    /// The global position of each of rank `rank`'s `seq_len / world_size` tokens (for RoPE
    /// position ids and labels).
    ///
    /// ```
    /// use stria::Layout;
    /// assert_eq!(Layout::Striped.positions(8, 2, 1).unwrap(), [1, 3, 5, 7]);
    /// assert_eq!(Layout::Zigzag.positions(8, 2, 0).unwrap(), [0, 1, 6, 7]);
    /// assert_eq!(Layout::Contiguous.positions(8, 2, 1).unwrap(), [4, 5, 6, 7]);
    /// ```
    pub fn positions(self, seq_len: i64, world_size: i32, rank: i32) -> Result<Vec<i64>> {
        // Arguments first, before any allocation (a huge seq_len with a rank out of range is that
        // error, not an out-of-memory): the library checks them before its destination, so a call
        // with none fails for what is wrong with them, or else only for the missing destination.
        // SAFETY: a NULL destination, refused before anything is written.
        let probe = unsafe { sys::stria_layout_positions(self.raw(), seq_len, world_size, rank, std::ptr::null_mut()) };
        if let Err(err) = check(probe) {
            if err.message() != "positions is NULL" {
                return Err(err);
            }
        }
        let n = if world_size > 0 && seq_len > 0 {
            (seq_len / i64::from(world_size)) as usize
        } else {
            0
        };
        let mut positions = try_vec::<i64>(n)?;
        // SAFETY: room for n = seq_len / world_size values, all the library writes on success.
        check(unsafe { sys::stria_layout_positions(self.raw(), seq_len, world_size, rank, positions.as_mut_ptr()) })?;
        // SAFETY: the call succeeded, so it wrote all n values.
        unsafe { positions.set_len(n) };
        Ok(positions)
    }
}

impl Layout {
    /// The global position of each of rank `rank`'s `seq_len / world_size` tokens on a grid of
    /// all-to-all groups of `ulysses` ranks ([`Context::set_grid`](crate::Context::set_grid)):
    /// rank g·U + u holds the u-th of U contiguous pieces of the tokens this layout gives rank g of
    /// a ring of world_size / U. `ulysses` 1 is [`positions`](Layout::positions).
    ///
    /// ```
    /// use stria::Layout;
    /// // Two groups of two: group 1 holds positions 1, 3, 5, 7 (striped over 2), cut in two.
    /// assert_eq!(Layout::Striped.grid_positions(8, 4, 2, 2).unwrap(), [1, 3]);
    /// assert_eq!(Layout::Striped.grid_positions(8, 4, 2, 3).unwrap(), [5, 7]);
    /// ```
    pub fn grid_positions(self, seq_len: i64, world_size: i32, ulysses: i32, rank: i32) -> Result<Vec<i64>> {
        // Arguments first, as in positions: a call without a destination fails for them, if any.
        // SAFETY: a NULL destination, refused before anything is written.
        let probe =
            unsafe { sys::stria_grid_positions(self.raw(), seq_len, world_size, ulysses, rank, std::ptr::null_mut()) };
        if let Err(err) = check(probe) {
            if err.message() != "positions is NULL" {
                return Err(err);
            }
        }
        let n = (seq_len / i64::from(world_size)) as usize;
        let mut positions = try_vec::<i64>(n)?;
        // SAFETY: room for n = seq_len / world_size values, all the library writes on success.
        check(unsafe {
            sys::stria_grid_positions(self.raw(), seq_len, world_size, ulysses, rank, positions.as_mut_ptr())
        })?;
        // SAFETY: the call succeeded, so it wrote all n values.
        unsafe { positions.set_len(n) };
        Ok(positions)
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name()) // honours width and alignment, for tables
    }
}

/// An empty vector with room for `n` values, or an out-of-memory error instead of an abort.
pub(crate) fn try_vec<T>(n: usize) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| Error::new(Status::OutOfMemory, format!("cannot allocate {n} values")))?;
    Ok(v)
}

/// Copies rank `rank`'s tokens out of `full` into `local` along `seq_dim` (negative: counted
/// from the end). Any dtype; `local` has `full`'s shape with `seq_dim` divided by `world_size`.
///
/// ```
/// use stria::{Layout, Tensor};
/// let full = Tensor::new((0..6).map(|x| x as f32).collect(), &[1, 6]).unwrap();
/// let mut local = Tensor::<f32>::zeros(&[1, 2]).unwrap();
/// stria::shard(Layout::Striped, 3, 2, 1, &full, &mut local).unwrap();
/// assert_eq!(local.as_slice(), &[2.0, 5.0]);
/// // A local tensor of the wrong length is the library's error, with its explanation:
/// let mut wrong = Tensor::<f32>::zeros(&[1, 3]).unwrap();
/// let err = stria::shard(Layout::Striped, 3, 2, 1, &full, &mut wrong).unwrap_err();
/// assert_eq!(err.status(), stria::Status::InvalidArgument);
/// ```
pub fn shard(
    layout: Layout,
    world_size: i32,
    rank: i32,
    seq_dim: i32,
    full: &impl Input,
    local: &mut impl Output,
) -> Result<()> {
    let full = full.dl_tensor();
    let mut local = local.dl_tensor_mut();
    // SAFETY: both DLTensors describe memory their owners lend for this call (checked views, or
    // from_raw's promise); the library reads `full` and writes only `local`.
    check(unsafe {
        sys::stria_shard(
            layout.raw(),
            world_size,
            rank,
            seq_dim,
            &full,
            &mut local,
            std::ptr::null_mut(),
        )
    })
}

/// The inverse of [`shard`]: copies rank `rank`'s `local` tokens into their places in `full`.
pub fn unshard(
    layout: Layout,
    world_size: i32,
    rank: i32,
    seq_dim: i32,
    local: &impl Input,
    full: &mut impl Output,
) -> Result<()> {
    let local = local.dl_tensor();
    let mut full = full.dl_tensor_mut();
    // SAFETY: as in shard, with the roles swapped.
    check(unsafe {
        sys::stria_unshard(
            layout.raw(),
            world_size,
            rank,
            seq_dim,
            &local,
            &mut full,
            std::ptr::null_mut(),
        )
    })
}

/// [`shard`] for rank `rank` of a grid of all-to-all groups of `ulysses` ranks
/// ([`Layout::grid_positions`]).
pub fn grid_shard(
    layout: Layout,
    world_size: i32,
    ulysses: i32,
    rank: i32,
    seq_dim: i32,
    full: &impl Input,
    local: &mut impl Output,
) -> Result<()> {
    let full = full.dl_tensor();
    let mut local = local.dl_tensor_mut();
    // SAFETY: as in shard.
    check(unsafe {
        sys::stria_grid_shard(
            layout.raw(),
            world_size,
            ulysses,
            rank,
            seq_dim,
            &full,
            &mut local,
            std::ptr::null_mut(),
        )
    })
}

/// The inverse of [`grid_shard`].
pub fn grid_unshard(
    layout: Layout,
    world_size: i32,
    ulysses: i32,
    rank: i32,
    seq_dim: i32,
    local: &impl Input,
    full: &mut impl Output,
) -> Result<()> {
    let local = local.dl_tensor();
    let mut full = full.dl_tensor_mut();
    // SAFETY: as in shard, with the roles swapped.
    check(unsafe {
        sys::stria_grid_unshard(
            layout.raw(),
            world_size,
            ulysses,
            rank,
            seq_dim,
            &local,
            &mut full,
            std::ptr::null_mut(),
        )
    })
}

/// The work of one attention call under a layout ([`analyze_balance`]) or a plan
/// ([`Plan::analyze_balance`](crate::Plan::analyze_balance)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Balance {
    /// (q, k) pairs computed, all ranks, all steps (at tile granularity).
    pub total_work: f64,
    /// Sum over ring steps of the busiest rank's work.
    pub ring_latency: f64,
    /// total_work / ring_latency: N is perfect.
    pub speedup: f64,
    /// ring_latency / (total_work / N): 1 is perfect.
    pub imbalance: f64,
    /// One device's work on the whole sequence at the same tile size, over N, each document
    /// starting its own tiles (a variable-length kernel): the latency no ring can beat.
    /// `ideal_latency / ring_latency` is the ring's fraction of ideal.
    pub ideal_latency: f64,
    /// K/V token rows one forward call sends, over all ranks, steps and batch rows: a layout's
    /// whole blocks at every step but the last; a plan's blocks trimmed to the rows that ranks
    /// further along the ring see, in whole tiles.
    pub kv_rows_sent: f64,
}

impl Balance {
    /// An output struct for the library, with its struct_size set.
    pub(crate) fn raw_out() -> sys::stria_balance_t {
        sys::stria_balance_t {
            struct_size: std::mem::size_of::<sys::stria_balance_t>(),
            total_work: 0.0,
            ring_latency: 0.0,
            speedup: 0.0,
            imbalance: 0.0,
            ideal_latency: 0.0,
            kv_rows_sent: 0.0,
        }
    }

    pub(crate) fn from_raw(b: &sys::stria_balance_t) -> Balance {
        Balance {
            total_work: b.total_work,
            ring_latency: b.ring_latency,
            speedup: b.speedup,
            imbalance: b.imbalance,
            ideal_latency: b.ideal_latency,
            kv_rows_sent: b.kv_rows_sent,
        }
    }
}

/// How evenly `layout` spreads the work of one attention call over a ring of `world_size`
/// ranks, counting visible (q, k) pairs at `tile` granularity (1: exact pairs).
///
/// ```
/// use stria::{analyze_balance, Layout};
/// let striped = analyze_balance(Layout::Striped, true, 4096, 8, 1).unwrap();
/// let contiguous = analyze_balance(Layout::Contiguous, true, 4096, 8, 1).unwrap();
/// assert!(striped.imbalance < 1.01 && contiguous.imbalance > 1.5);
/// assert_eq!(striped.total_work, 4096.0 * 4097.0 / 2.0); // every causal pair, once
/// assert_eq!(striped.ideal_latency, striped.total_work / 8.0); // exact pairs: no tile to waste
/// ```
pub fn analyze_balance(layout: Layout, causal: bool, seq_len: i64, world_size: i32, tile: i64) -> Result<Balance> {
    let mut out = Balance::raw_out();
    // SAFETY: `out` is a stria_balance_t with its struct_size set.
    check(unsafe {
        sys::stria_analyze_balance(layout.raw(), c_int::from(causal), seq_len, world_size, tile, &mut out)
    })?;
    Ok(Balance::from_raw(&out))
}

/// [`analyze_balance`] for a grid of all-to-all groups of `ulysses` ranks: the ring of
/// `world_size / ulysses` groups, each member computing a `ulysses`-th of the heads.
///
/// ```
/// use stria::{analyze_balance, grid_analyze_balance, Layout};
/// let ring = analyze_balance(Layout::Zigzag, true, 96, 2, 4).unwrap();
/// let grid = grid_analyze_balance(Layout::Zigzag, true, 96, 8, 4, 4).unwrap();
/// assert_eq!(grid.ring_latency, ring.ring_latency / 4.0);
/// ```
pub fn grid_analyze_balance(
    layout: Layout,
    causal: bool,
    seq_len: i64,
    world_size: i32,
    ulysses: i32,
    tile: i64,
) -> Result<Balance> {
    let mut out = Balance::raw_out();
    // SAFETY: `out` is a stria_balance_t with its struct_size set.
    check(unsafe {
        sys::stria_grid_analyze_balance(
            layout.raw(),
            c_int::from(causal),
            seq_len,
            world_size,
            ulysses,
            tile,
            &mut out,
        )
    })?;
    Ok(Balance::from_raw(&out))
}

/// The per-step, per-rank work behind [`analyze_balance`]: `work[s * world_size + r]` is the
/// work of rank r at ring step s.
///
/// ```
/// use stria::{balance_steps, Layout};
/// let work = balance_steps(Layout::Contiguous, true, 8, 2, 1).unwrap();
/// // Step 0: each rank's own causal block (10 pairs); step 1: rank 1 sees all of rank 0's keys.
/// assert_eq!(work, [10.0, 10.0, 0.0, 16.0]);
/// ```
pub fn balance_steps(layout: Layout, causal: bool, seq_len: i64, world_size: i32, tile: i64) -> Result<Vec<f64>> {
    // Validate first (the same checks), so a huge world_size is an error, not an allocation.
    analyze_balance(layout, causal, seq_len, world_size, tile)?;
    let n = world_size as usize * world_size as usize;
    let mut work = try_vec::<f64>(n)?;
    // SAFETY: room for world_size² values, which the library writes on success.
    check(unsafe {
        sys::stria_analyze_balance_steps(
            layout.raw(),
            c_int::from(causal),
            seq_len,
            world_size,
            tile,
            work.as_mut_ptr(),
        )
    })?;
    // SAFETY: the call succeeded and wrote them all.
    unsafe { work.set_len(n) };
    Ok(work)
}
