//! Document plans: which tokens of a packed sequence each rank holds, chosen so that every rank
//! does about the same work at every ring step (`stria_plan_create`).

use std::os::raw::c_int;

use stria_sys as sys;

use crate::error::{check, invalid, Result};
use crate::layout::{try_vec, Balance, Layout};
use crate::tensor::{Input, Output};

/// How a plan places the tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlanStrategy {
    /// The balancing solver: long documents cut into whole tiles spread over the ranks, short ones
    /// kept whole and spread by their cost.
    Balanced,
    /// A fixed layout's positions with the documents' masks, to compare against (S must suit the
    /// layout).
    Layout(Layout),
}

/// How to make a [`Plan`]: `PlanConfig::new(world_size)` gives the library's defaults (causal, no
/// window, 128-token tiles, the balancing solver, as many slots as the plan needs); the methods
/// change one setting each.
///
/// ```
/// use stria::PlanConfig;
/// // Two batch rows of 10 tokens over 3 ranks: row 0 packs documents of 4 and 6 tokens, row 1
/// // one of 10 (its second boundary repeats the end).
/// let plan = PlanConfig::new(3).tile(2).create(&[0, 4, 10, 0, 10, 10], 2, 2, 10).unwrap();
/// let l = plan.local_len(); // at least ceil(10 / 3)
/// assert!(l >= 4);
/// // Every position of a row is on exactly one rank; the other slots are padding (-1).
/// let mut seen = vec![0; 20];
/// for rank in 0..3 {
///     for (i, &p) in plan.positions(rank).unwrap().iter().enumerate() {
///         if p >= 0 {
///             seen[(i as i64 / l * 10 + p) as usize] += 1;
///         }
///     }
/// }
/// assert!(seen.iter().all(|&x| x == 1));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub struct PlanConfig {
    world_size: i32,
    causal: bool,
    window: Option<(i64, i64)>,
    tile: i64,
    strategy: PlanStrategy,
    local_len: i64,
}

impl PlanConfig {
    /// A plan for a ring of `world_size` ranks, with the library's defaults.
    pub fn new(world_size: i32) -> PlanConfig {
        PlanConfig {
            world_size,
            causal: true,
            window: None,
            tile: 128,
            strategy: PlanStrategy::Balanced,
            local_len: 0,
        }
    }

    /// The mask whose work the plan balances; the calls compute their own
    /// ([`AttentionParams::causal`](crate::AttentionParams::causal)) whatever the plan was made for.
    pub fn causal(mut self, causal: bool) -> PlanConfig {
        self.causal = causal;
        self
    }

    /// A sliding window `(left, right)` to balance for (−1: unbounded on that side; `None`: none).
    pub fn window(mut self, window: Option<(i64, i64)>) -> PlanConfig {
        self.window = window;
        self
    }

    /// The tile size of the kernels that will run the plan (0 means 128, the GPU kernels'; the
    /// CPU kernels' 64 divides it).
    pub fn tile(mut self, tile: i64) -> PlanConfig {
        self.tile = tile;
        self
    }

    /// The balancing solver (the default) or a fixed layout.
    pub fn strategy(mut self, strategy: PlanStrategy) -> PlanConfig {
        self.strategy = strategy;
        self
    }

    /// Slots per rank: 0 (the default) for what the plan needs, else at least that many (a fixed
    /// L keeps the shapes of compiled programs the same from batch to batch). Fewer than the plan
    /// needs is an error.
    pub fn local_len(mut self, local_len: i64) -> PlanConfig {
        self.local_len = local_len;
        self
    }

    /// [`Plan::new`] with this configuration.
    pub fn create(&self, boundaries: &[i64], num_seqs: i64, batch: i64, seq_len: i64) -> Result<Plan> {
        Plan::new(self, boundaries, num_seqs, batch, seq_len)
    }

    fn raw(&self) -> sys::stria_plan_config_t {
        // Every field set here, struct_size from this crate's own struct, for the reason
        // AttentionParams gives: stria_plan_config_init would write the loaded library's sizeof.
        let (window_left, window_right) = self.window.unwrap_or((-1, -1));
        let (strategy, layout) = match self.strategy {
            PlanStrategy::Balanced => (sys::STRIA_PLAN_BALANCED, Layout::Striped),
            PlanStrategy::Layout(layout) => (sys::STRIA_PLAN_LAYOUT, layout),
        };
        sys::stria_plan_config_t {
            struct_size: std::mem::size_of::<sys::stria_plan_config_t>(),
            world_size: self.world_size,
            causal: c_int::from(self.causal),
            window_left,
            window_right,
            tile: self.tile,
            strategy,
            layout: layout.raw(),
            local_len: self.local_len,
        }
    }
}

/// What a plan was made for ([`Plan::info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PlanInfo {
    /// The ranks of the ring.
    pub world_size: i32,
    /// Batch rows (the B of every rank's tensors).
    pub batch: i64,
    /// Documents per batch row.
    pub num_seqs: i64,
    /// Tokens per batch row, S.
    pub seq_len: i64,
    /// Slots per rank: the L of every rank's `[B, L, H, D]` tensors. ceil(S / N), or a few tiles
    /// more where the plan pads a document's last tile (or the configured local_len).
    pub local_len: i64,
}

/// A document plan: which global positions each rank's slots hold, for one set of document
/// boundaries and one ring size. Any S works with any N; a slot without a token is padding
/// (position −1) that attends to nothing and that nothing attends to.
///
/// Every rank makes the same plan from the same boundaries and [`PlanConfig`], shards its tensors
/// with it ([`Plan::shard`], [`Tensor::shard_by_plan`](crate::Tensor::shard_by_plan)) and passes
/// it to the calls ([`AttentionParams::plan`](crate::AttentionParams::plan)). A plan is immutable:
/// it is [`Send`] and [`Sync`], and one plan may serve any number of contexts and threads at
/// once. Dropping it destroys it; the calls borrow it, so none can be running then.
///
/// ```
/// use stria::{AttentionParams, LocalGroup, PlanConfig, Tensor};
/// let (s, n, h, d) = (10i64, 3i32, 2i64, 8i64); // 10 tokens on 3 ranks: S need not divide
/// let plan = PlanConfig::new(n).tile(2).create(&[0, 3, 10], 2, 1, s).unwrap();
/// let x: Vec<f32> = (0..s * h * d).map(|i| (i as f32 * 0.1).sin()).collect();
/// let q = Tensor::new(x, &[1, s, h, d]).unwrap();
/// let params = AttentionParams { plan: Some(&plan), ..Default::default() }; // documents: the plan's
///
/// let mut group = LocalGroup::new(n as usize, &stria::Config::new()).unwrap();
/// let outs = group.run(0..n, |ctx, rank| -> stria::Result<Tensor<f32>> {
///     let q = q.shard_by_plan(&plan, rank, 1)?; // [1, local_len, h, d]
///     let mut out = Tensor::zeros(q.shape())?;
///     let mut lse = Tensor::<f32>::zeros(&[1, h, plan.local_len()])?;
///     ctx.forward(&params, &q, &q, &q, &mut out, &mut lse)?;
///     Ok(out)
/// });
/// let outs = outs.into_iter().collect::<stria::Result<Vec<_>>>().unwrap();
/// let out = Tensor::unshard_by_plan(&outs, &plan, 1).unwrap();
/// // Token 3 starts the second document: it sees only itself.
/// assert!((out.as_slice()[3 * 16 + 5] - q.as_slice()[3 * 16 + 5]).abs() < 1e-6);
/// ```
pub struct Plan {
    raw: sys::stria_plan_t,
    info: PlanInfo,
}

// SAFETY: the library's plans are immutable once made and may be used from any thread at once
// (stria.h, "Document plans"); destroy needs ownership, which Drop has alone.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Plan {
    /// A plan for `batch` rows of `seq_len` tokens whose documents are `boundaries`: `batch` rows
    /// of `num_seqs + 1` global positions back to back, each row from 0 to `seq_len`, never
    /// decreasing (a row with fewer documents repeats `seq_len` at its end).
    pub fn new(config: &PlanConfig, boundaries: &[i64], num_seqs: i64, batch: i64, seq_len: i64) -> Result<Plan> {
        // The library reads batch·(num_seqs + 1) values once batch and num_seqs are positive, and
        // cannot know how long the slice is; with either not positive it reads none and says why.
        if batch > 0 && num_seqs > 0 {
            let needed = num_seqs.checked_add(1).and_then(|row| row.checked_mul(batch));
            if needed != i64::try_from(boundaries.len()).ok() {
                return Err(invalid(format!(
                    "boundaries has {} values, but batch {batch} rows of num_seqs + 1 = {} positions need {}",
                    boundaries.len(),
                    num_seqs.saturating_add(1),
                    needed.map_or_else(|| "more".to_string(), |n| n.to_string())
                )));
            }
        }
        let raw_config = config.raw();
        let cu = if boundaries.is_empty() {
            std::ptr::null()
        } else {
            boundaries.as_ptr()
        };
        let mut raw: sys::stria_plan_t = std::ptr::null_mut();
        // SAFETY: a complete config, boundaries as long as the library reads (checked above), and a
        // place for the handle.
        check(unsafe { sys::stria_plan_create(&raw_config, cu, num_seqs, batch, seq_len, &mut raw) })?;
        let mut info = sys::stria_plan_info_t {
            struct_size: std::mem::size_of::<sys::stria_plan_info_t>(),
            world_size: 0,
            batch: 0,
            num_seqs: 0,
            seq_len: 0,
            local_len: 0,
        };
        // SAFETY: a live plan and a stria_plan_info_t with its struct_size set.
        if let Err(err) = check(unsafe { sys::stria_plan_get_info(raw, &mut info) }) {
            // SAFETY: the plan is ours and not used again.
            unsafe { sys::stria_plan_destroy(raw) };
            return Err(err);
        }
        Ok(Plan {
            raw,
            info: PlanInfo {
                world_size: info.world_size,
                batch: info.batch,
                num_seqs: info.num_seqs,
                seq_len: info.seq_len,
                local_len: info.local_len,
            },
        })
    }

    /// What the plan was made for, and its local_len (read once: a plan never changes).
    pub fn info(&self) -> PlanInfo {
        self.info
    }

    /// Slots per rank: the L of every rank's tensors.
    pub fn local_len(&self) -> i64 {
        self.info.local_len
    }

    /// The ranks of the ring it is for.
    pub fn world_size(&self) -> i32 {
        self.info.world_size
    }

    /// The global position of each of rank `rank`'s slots, `batch · local_len` of them:
    /// `positions[b * local_len + i]` is slot i of batch row b, −1 for padding.
    pub fn positions(&self, rank: i32) -> Result<Vec<i64>> {
        // The rank first, so that a bad one is the library's error rather than an allocation.
        // SAFETY: a NULL destination, refused after the rank is checked and before anything is
        // written.
        let probe = unsafe { sys::stria_plan_positions(self.raw, rank, std::ptr::null_mut()) };
        if let Err(err) = check(probe) {
            if err.message() != "positions is NULL" {
                return Err(err);
            }
        }
        let n = (self.info.batch * self.info.local_len) as usize;
        let mut positions = try_vec::<i64>(n)?;
        // SAFETY: room for batch · local_len values, all the library writes on success.
        check(unsafe { sys::stria_plan_positions(self.raw, rank, positions.as_mut_ptr()) })?;
        // SAFETY: the call succeeded, so it wrote all n values.
        unsafe { positions.set_len(n) };
        Ok(positions)
    }

    /// Copies rank `rank`'s tokens out of `full` into `local` along `seq_dim` (negative: counted
    /// from the end): `local` has `full`'s shape with `seq_dim` [`local_len`](Plan::local_len)
    /// long, and gets zeros in its padding slots. With several batch rows, dimension 0 is the
    /// batch. Any dtype; host memory.
    ///
    /// ```
    /// use stria::{PlanConfig, Tensor};
    /// let plan = PlanConfig::new(2).tile(1).create(&[0, 2, 5], 2, 1, 5).unwrap();
    /// let full = Tensor::new((10..15).collect::<Vec<i64>>(), &[1, 5]).unwrap();
    /// let mut local = Tensor::<i64>::zeros(&[1, plan.local_len()]).unwrap();
    /// plan.shard(1, -1, &full, &mut local).unwrap();
    /// for (&p, &x) in plan.positions(1).unwrap().iter().zip(local.as_slice()) {
    ///     assert_eq!(x, if p < 0 { 0 } else { 10 + p });
    /// }
    /// ```
    pub fn shard(&self, rank: i32, seq_dim: i32, full: &impl Input, local: &mut impl Output) -> Result<()> {
        let full = full.dl_tensor();
        let mut local = local.dl_tensor_mut();
        // SAFETY: both DLTensors describe memory their owners lend for this call; the library reads
        // `full` and writes only `local`.
        check(unsafe { sys::stria_plan_shard(self.raw, rank, seq_dim, &full, &mut local, std::ptr::null_mut()) })
    }

    /// The inverse of [`shard`](Plan::shard): copies rank `rank`'s `local` tokens into their
    /// places in `full`, leaving the other ranks' positions as they are.
    pub fn unshard(&self, rank: i32, seq_dim: i32, local: &impl Input, full: &mut impl Output) -> Result<()> {
        let local = local.dl_tensor();
        let mut full = full.dl_tensor_mut();
        // SAFETY: as in shard, with the roles swapped.
        check(unsafe { sys::stria_plan_unshard(self.raw, rank, seq_dim, &local, &mut full, std::ptr::null_mut()) })
    }

    /// [`positions`](Plan::positions) for rank `rank` of a grid of all-to-all groups of `ulysses`
    /// ranks on this plan's ring ([`Context::set_grid`](crate::Context::set_grid)): rank g·U + u
    /// holds the u-th of U pieces of ring rank g's slots, `batch · local_len / ulysses` values.
    ///
    /// ```
    /// use stria::PlanConfig;
    /// let plan = PlanConfig::new(2).tile(1).local_len(4).create(&[0, 2, 7], 2, 1, 7).unwrap();
    /// let ring = plan.positions(1).unwrap();
    /// let mut pieces = plan.grid_positions(2, 2).unwrap();
    /// pieces.extend(plan.grid_positions(2, 3).unwrap());
    /// assert_eq!(pieces, ring);
    /// ```
    pub fn grid_positions(&self, ulysses: i32, rank: i32) -> Result<Vec<i64>> {
        // SAFETY: a NULL destination, refused after the arguments are checked.
        let probe = unsafe { sys::stria_plan_grid_positions(self.raw, ulysses, rank, std::ptr::null_mut()) };
        if let Err(err) = check(probe) {
            if err.message() != "positions is NULL" {
                return Err(err);
            }
        }
        let n = (self.info.batch * (self.info.local_len / i64::from(ulysses))) as usize;
        let mut positions = try_vec::<i64>(n)?;
        // SAFETY: room for batch · local_len / ulysses values, all the library writes on success.
        check(unsafe { sys::stria_plan_grid_positions(self.raw, ulysses, rank, positions.as_mut_ptr()) })?;
        // SAFETY: the call succeeded, so it wrote all n values.
        unsafe { positions.set_len(n) };
        Ok(positions)
    }

    /// [`shard`](Plan::shard) for rank `rank` of a grid of all-to-all groups of `ulysses` ranks
    /// ([`grid_positions`](Plan::grid_positions)).
    pub fn grid_shard(
        &self,
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
            sys::stria_plan_grid_shard(
                self.raw,
                ulysses,
                rank,
                seq_dim,
                &full,
                &mut local,
                std::ptr::null_mut(),
            )
        })
    }

    /// The inverse of [`grid_shard`](Plan::grid_shard).
    pub fn grid_unshard(
        &self,
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
            sys::stria_plan_grid_unshard(
                self.raw,
                ulysses,
                rank,
                seq_dim,
                &local,
                &mut full,
                std::ptr::null_mut(),
            )
        })
    }

    /// The balance of the plan's ring under the mask it was made for, at `tile` granularity (1:
    /// exact pairs), counted as the kernels compute; [`Balance::ideal_latency`] is the latency no
    /// ring can beat.
    ///
    /// ```
    /// use stria::{Layout, PlanConfig, PlanStrategy};
    /// // One long document and many short ones, on 4 ranks at the kernels' 16-token tiles here.
    /// let mut cu = vec![0, 1200];
    /// while *cu.last().unwrap() < 2048 {
    ///     cu.push((cu.last().unwrap() + 24).min(2048));
    /// }
    /// let docs = cu.len() as i64 - 1;
    /// let config = PlanConfig::new(4).tile(16);
    /// let plan = config.create(&cu, docs, 1, 2048).unwrap().analyze_balance(16).unwrap();
    /// let striped = config
    ///     .strategy(PlanStrategy::Layout(Layout::Striped))
    ///     .create(&cu, docs, 1, 2048)
    ///     .unwrap()
    ///     .analyze_balance(16)
    ///     .unwrap();
    /// let of_ideal = |b: stria::Balance| b.ideal_latency / b.ring_latency;
    /// assert!(of_ideal(plan) > of_ideal(striped));
    /// ```
    pub fn analyze_balance(&self, tile: i64) -> Result<Balance> {
        let mut out = Balance::raw_out();
        // SAFETY: `out` is a stria_balance_t with its struct_size set; no per-step table.
        check(unsafe { sys::stria_plan_analyze_balance(self.raw, tile, &mut out, std::ptr::null_mut()) })?;
        Ok(Balance::from_raw(&out))
    }

    /// The per-step, per-rank work behind [`analyze_balance`](Plan::analyze_balance):
    /// `work[s * world_size + r]` is the work of rank r at ring step s.
    pub fn balance_steps(&self, tile: i64) -> Result<Vec<f64>> {
        // Validate first (the same checks), so a huge world_size is the library's error, not an
        // allocation.
        self.analyze_balance(tile)?;
        let n = self.info.world_size as usize * self.info.world_size as usize;
        let mut work = try_vec::<f64>(n)?;
        let mut out = Balance::raw_out();
        // SAFETY: room for world_size² values, which the library writes on success.
        check(unsafe { sys::stria_plan_analyze_balance(self.raw, tile, &mut out, work.as_mut_ptr()) })?;
        // SAFETY: the call succeeded and wrote them all.
        unsafe { work.set_len(n) };
        Ok(work)
    }

    pub(crate) fn raw(&self) -> sys::stria_plan_t {
        self.raw
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: the handle is live and owned by this Plan; calls borrow the plan, so none is
        // using it. It cannot fail for a live handle, and a drop has nobody to report to.
        unsafe { sys::stria_plan_destroy(self.raw) };
    }
}

impl PartialEq for Plan {
    /// The same plan (one handle), not merely equal placements: [`AttentionParams`] compares its
    /// plan by identity.
    ///
    /// [`AttentionParams`]: crate::AttentionParams
    fn eq(&self, other: &Plan) -> bool {
        self.raw == other.raw
    }
}

impl Eq for Plan {}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan").field("info", &self.info).finish()
    }
}
