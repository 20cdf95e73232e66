//! Contexts: one rank of a ring. Created alone ([`Context::new`]) or as an in-process group
//! ([`LocalGroup`]), destroyed on drop.

use std::os::raw::c_int;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stria_sys as sys;

use crate::error::{check, invalid, Error, Result, Status};
use crate::launch::Launch;
use crate::tensor::Device;

/// How ranks exchange K/V blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Threads of one process ([`LocalGroup`], or a world of one).
    Local,
    /// UCX, across processes and hosts (needs the UCX module).
    Ucx,
    /// NCCL, between CUDA devices (needs the NCCL module).
    Nccl,
}

/// Rank 0's rendezvous identity, handed by the caller to every rank (like `ncclUniqueId`).
#[derive(Clone, Copy)]
pub struct UniqueId(sys::stria_unique_id_t);

impl UniqueId {
    /// Opens rank 0's rendezvous (UCX and NCCL transports) and describes it.
    pub fn new() -> Result<UniqueId> {
        let mut id = sys::stria_unique_id_t { internal: [0; 128] };
        // SAFETY: `id` is a valid stria_unique_id_t to fill.
        check(unsafe { sys::stria_get_unique_id(&mut id) })?;
        Ok(UniqueId(id))
    }

    /// The 128 bytes to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// The id another rank sent.
    pub fn from_bytes(bytes: &[u8; 128]) -> UniqueId {
        UniqueId(sys::stria_unique_id_t {
            internal: bytes.map(|b| b as _),
        })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// How to create a context: `Config::new()` gives the library's defaults (rank 0 of 1, CPU,
/// local transport, 300 s timeout, all threads); the methods change one setting each.
///
/// ```
/// use std::time::Duration;
/// let config = stria::Config::new().num_threads(1).timeout(Duration::from_secs(30));
/// let ctx = stria::Context::new(&config).unwrap(); // a world of one rank
/// assert_eq!((ctx.rank(), ctx.world_size()), (0, 1));
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Config {
    rank: i32,
    world_size: i32,
    device: Device,
    transport: Transport,
    unique_id: Option<UniqueId>,
    timeout: Option<Duration>,
    num_threads: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            rank: 0,
            world_size: 1,
            device: Device::Cpu,
            transport: Transport::Local,
            unique_id: None,
            timeout: None,
            num_threads: 0,
        }
    }
}

impl Config {
    /// The defaults.
    pub fn new() -> Config {
        Config::default()
    }

    /// This process's configuration in a job started by torchrun or mpirun: its rank and world
    /// size from the launcher's variables ([`Launch::from_env`]) and the UCX transport without a
    /// [`UniqueId`], so the ranks meet at STRIA_ROOT=host:port (rank 0 listens there, the others
    /// connect), authenticated with STRIA_SECRET (hex) when set; the library reads both. For a
    /// GPU, add `.device(Device::Cuda(Launch::from_env()?.local_rank))`.
    pub fn from_env() -> Result<Config> {
        let launch = Launch::from_env()?;
        if std::env::var_os("STRIA_ROOT").map_or(true, |v| v.is_empty()) {
            return Err(invalid(
                "STRIA_ROOT is not set: export STRIA_ROOT=host:port on every rank (rank 0 listens \
                 there and the others connect; under torchrun e.g. STRIA_ROOT=$MASTER_ADDR:29600), \
                 and optionally STRIA_SECRET=<hex> to authenticate the peers",
            ));
        }
        Ok(Config::new()
            .rank(launch.rank, launch.world_size)
            .transport(Transport::Ucx, None))
    }

    /// This process's rank and the ring's size ([`Context::new`]; a [`LocalGroup`] sets them).
    pub fn rank(mut self, rank: i32, world_size: i32) -> Config {
        self.rank = rank;
        self.world_size = world_size;
        self
    }

    /// The device the context computes on (tensors must live there).
    pub fn device(mut self, device: Device) -> Config {
        self.device = device;
        self
    }

    /// The transport, and for UCX/NCCL rank 0's [`UniqueId`].
    pub fn transport(mut self, transport: Transport, unique_id: Option<UniqueId>) -> Config {
        self.transport = transport;
        self.unique_id = unique_id;
        self
    }

    /// A wait longer than this fails with [`Status::Timeout`].
    pub fn timeout(mut self, timeout: Duration) -> Config {
        self.timeout = Some(timeout);
        self
    }

    /// CPU threads per context; 0 means all (a local group shares them out).
    pub fn num_threads(mut self, num_threads: usize) -> Config {
        self.num_threads = num_threads;
        self
    }

    fn raw(&self) -> Result<sys::stria_context_config_t> {
        // Start from the library's own defaults: struct_size and any field this crate does not set.
        // SAFETY: stria_context_config_init fills the whole struct; it is zeroed first anyway.
        let mut raw: sys::stria_context_config_t = unsafe { std::mem::zeroed() };
        check(unsafe { sys::stria_context_config_init(&mut raw) })?;
        raw.rank = self.rank;
        raw.world_size = self.world_size;
        raw.device = self.device.dl();
        raw.transport = match self.transport {
            Transport::Local => sys::STRIA_TRANSPORT_LOCAL,
            Transport::Ucx => sys::STRIA_TRANSPORT_UCX,
            Transport::Nccl => sys::STRIA_TRANSPORT_NCCL,
        };
        if let Some(id) = self.unique_id {
            raw.unique_id = id.0;
        }
        // Duration::ZERO would mean "the default" to the library: keep it an (instant) timeout.
        raw.timeout_s = self.timeout.map_or(0.0, |t| t.as_secs_f64().max(1e-9));
        raw.num_threads = c_int::try_from(self.num_threads)
            .map_err(|_| invalid(format!("num_threads {} is too large", self.num_threads)))?;
        Ok(raw)
    }
}

/// The handle's token, shared with [`AbortHandle`]s. The flag, cleared under the lock when the
/// context is destroyed, keeps a late abort from reaching whatever context might get the same
/// token afterwards.
struct Shared {
    token: usize,
    live: Mutex<bool>,
}

/// One rank of a ring: it runs attention collectively with the other ranks' contexts.
///
/// A context is [`Send`] but not [`Sync`]: it is driven by one thread at a time (its calls take
/// `&mut self`), and different contexts run concurrently. Dropping it destroys it; the other
/// ranks of its ring then see it leave, so a peer waiting for it fails instead of hanging.
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<stria::Context>(); // not Sync
/// ```
pub struct Context {
    raw: sys::stria_context_t,
    shared: Arc<Shared>,
    rank: i32,
    world_size: i32,
}

// SAFETY: the library allows any thread to drive a context as long as only one does at a time,
// which `&mut self` on every call (and no Sync) guarantees.
unsafe impl Send for Context {}

impl Context {
    /// A context for one rank (`config.rank(r, n)`); with the UCX or NCCL transport, every rank
    /// of the ring creates its own with rank 0's [`UniqueId`].
    pub fn new(config: &Config) -> Result<Context> {
        let raw_config = config.raw()?;
        let mut raw: sys::stria_context_t = std::ptr::null_mut();
        // SAFETY: a complete config and a place for the handle.
        check(unsafe { sys::stria_context_create(&raw_config, &mut raw) })?;
        // SAFETY: `raw` is a live context that nothing else owns.
        unsafe { Context::adopt(raw) }
    }

    /// A context for one rank of an NCCL ring on a communicator the caller already has
    /// (`stria_context_create_with_nccl_comm`): `config` says `Transport::Nccl`, a CUDA device,
    /// and the communicator's rank and size; its unique id is not used. stria never destroys
    /// the communicator.
    ///
    /// # Safety
    /// `nccl_comm` is a live `ncclComm_t` that outlives the context.
    ///
    /// ```
    /// // Refused before the (here made-up) communicator is touched: not the NCCL transport.
    /// let err = unsafe { stria::Context::with_nccl_comm(&stria::Config::new(), 0x1234 as *mut _) };
    /// assert_eq!(err.unwrap_err().status(), stria::Status::InvalidArgument);
    /// ```
    pub unsafe fn with_nccl_comm(config: &Config, nccl_comm: *mut std::ffi::c_void) -> Result<Context> {
        let raw_config = config.raw()?;
        let mut raw: sys::stria_context_t = std::ptr::null_mut();
        // SAFETY: a complete config, the caller's communicator and a place for the handle.
        check(sys::stria_context_create_with_nccl_comm(
            &raw_config,
            nccl_comm,
            &mut raw,
        ))?;
        // SAFETY: `raw` is a live context that nothing else owns.
        Context::adopt(raw)
    }

    /// Takes ownership of a live handle; destroys it if its rank cannot be read.
    ///
    /// # Safety
    /// `raw` is a live context owned by nobody else.
    unsafe fn adopt(raw: sys::stria_context_t) -> Result<Context> {
        let (mut rank, mut world_size) = (0, 0);
        let queried = check(sys::stria_context_get_rank(raw, &mut rank))
            .and_then(|()| check(sys::stria_context_get_world_size(raw, &mut world_size)));
        if let Err(e) = queried {
            sys::stria_context_destroy(raw);
            return Err(e);
        }
        Ok(Context {
            raw,
            shared: Arc::new(Shared {
                token: raw as usize,
                live: Mutex::new(true),
            }),
            rank,
            world_size,
        })
    }

    /// This context's rank in its ring.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// The number of ranks in its ring.
    pub fn world_size(&self) -> i32 {
        self.world_size
    }

    /// A handle that aborts this context from any thread.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Tags this context's next [`forward`](Context::forward) or [`backward`](Context::backward),
    /// which takes the tag whatever its outcome (an untagged call's is 0). Ranks whose calls pair
    /// up with different tags all fail with `InvalidArgument` before any block moves, instead of
    /// exchanging blocks of different calls: for callers whose ranks may make independent calls
    /// of the same shapes in different orders (`stria_context_set_call_tag`).
    pub fn set_call_tag(&mut self, tag: u64) -> Result<()> {
        // SAFETY: a live handle; `&mut self` keeps this context's calls on one thread.
        check(unsafe { sys::stria_context_set_call_tag(self.raw, tag) })
    }

    /// Makes this context's backward calls give the same bits on every run
    /// (`stria_context_set_deterministic`; off by default). CPU contexts always do; on CUDA the
    /// Hopper TMA kernels then add dQ in a fixed order in the same pass, and the other
    /// tensor-core kernels compute dQ in a pass of its own instead of with float atomics, at the
    /// cost of recomputing the scores (7 tile products per tile pair instead of 5).
    pub fn set_deterministic(&mut self, on: bool) -> Result<()> {
        // SAFETY: a live handle; `&mut self` keeps this context's calls on one thread.
        check(unsafe { sys::stria_context_set_deterministic(self.raw, c_int::from(on)) })
    }

    /// Makes this context's ranks a grid of all-to-all groups of `ulysses` consecutive ranks
    /// within a ring of `world_size / ulysses` groups (`stria_context_set_grid`; 1, the plain ring,
    /// by default). A call then swaps sequence shards for head shards within the group, runs the
    /// ring across the groups and swaps back; `ulysses` must divide the query heads, and divide the
    /// K/V heads or be a multiple of them. Tokens are placed by
    /// [`Layout::grid_positions`](crate::Layout::grid_positions) ([`grid_shard`](crate::grid_shard)).
    /// Every rank sets the same value, between calls.
    pub fn set_grid(&mut self, ulysses: i32) -> Result<()> {
        // SAFETY: a live handle; `&mut self` keeps this context's calls on one thread.
        check(unsafe { sys::stria_context_set_grid(self.raw, ulysses) })
    }

    /// The size of this context's all-to-all groups ([`set_grid`](Context::set_grid)).
    pub fn grid(&mut self) -> Result<i32> {
        let mut ulysses: c_int = 0;
        // SAFETY: a live handle and a valid output pointer.
        check(unsafe { sys::stria_context_get_grid(self.raw, &mut ulysses) })?;
        Ok(ulysses)
    }

    /// Where the time of this context's last attention call went, one entry per ring step.
    pub fn step_times(&mut self) -> Result<Vec<StepTime>> {
        let mut steps: c_int = 0;
        // SAFETY: capacity 0 asks only for the count.
        check(unsafe { sys::stria_context_get_step_times(self.raw, std::ptr::null_mut(), 0, &mut steps) })?;
        let mut raw = vec![
            sys::stria_step_time_t {
                compute_s: 0.0,
                compute_cpu_s: 0.0,
                wait_s: 0.0
            };
            steps.max(0) as usize
        ];
        // SAFETY: room for `steps` entries; `&mut self` keeps another call from changing them.
        check(unsafe { sys::stria_context_get_step_times(self.raw, raw.as_mut_ptr(), steps, &mut steps) })?;
        raw.truncate(steps.max(0) as usize);
        Ok(raw
            .iter()
            .map(|s| StepTime {
                compute_s: s.compute_s,
                compute_cpu_s: s.compute_cpu_s,
                wait_s: s.wait_s,
            })
            .collect())
    }

    /// What this rank sent over its transport in this context's last attention call. A call on a
    /// document plan sends only the K/V rows that ranks further along the ring see.
    pub fn traffic(&mut self) -> Result<Traffic> {
        let mut t = sys::stria_traffic_t {
            struct_size: std::mem::size_of::<sys::stria_traffic_t>(),
            kv_bytes: 0,
            dkv_bytes: 0,
            messages: 0,
            all_to_all_bytes: 0,
        };
        // SAFETY: a live handle and an output struct with its struct_size set.
        check(unsafe { sys::stria_context_get_traffic(self.raw, &mut t) })?;
        Ok(Traffic {
            kv_bytes: t.kv_bytes,
            dkv_bytes: t.dkv_bytes,
            messages: t.messages,
            all_to_all_bytes: t.all_to_all_bytes,
        })
    }

    pub(crate) fn raw(&self) -> sys::stria_context_t {
        self.raw
    }
}

impl Drop for Context {
    /// Destroys the context. No call can be running on it (they borrow it), so there is nothing
    /// to abort first; the library's destroy tells the ring's other ranks that this one left.
    fn drop(&mut self) {
        let mut live = self.shared.live.lock().unwrap_or_else(|e| e.into_inner());
        *live = false;
        // SAFETY: the handle is live and owned by this Context; it is not used again. It cannot
        // fail for a live handle, and a drop has nobody to report to.
        unsafe { sys::stria_context_destroy(self.raw) };
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

/// Aborts a context from any thread: a call in progress on it returns [`Status::Aborted`], and
/// so does every later call (an aborted context can only be dropped). Its peers see it leave.
///
/// ```
/// use std::time::Duration;
/// let mut group = stria::LocalGroup::new(2, &stria::Config::new()).unwrap();
/// let handle = group.contexts()[0].abort_handle();
/// handle.abort().unwrap();
/// // Rank 0 is aborted; rank 1 fails too, since its peer is gone.
/// let q = stria::Tensor::<f32>::zeros(&[1, 4, 1, 8]).unwrap();
/// let results = group.run(0..2, |ctx, _| {
///     let (mut out, mut lse) = (q.clone(), stria::Tensor::<f32>::zeros(&[1, 1, 4]).unwrap());
///     ctx.forward(&Default::default(), &q, &q, &q, &mut out, &mut lse)
/// });
/// assert_eq!(results[0].as_ref().unwrap_err().status(), stria::Status::Aborted);
/// assert!(results[1].is_err());
/// ```
#[derive(Clone)]
pub struct AbortHandle {
    shared: Arc<Shared>,
}

impl AbortHandle {
    /// Aborts the context; does nothing once it has been dropped.
    pub fn abort(&self) -> Result<()> {
        let live = self.shared.live.lock().unwrap_or_else(|e| e.into_inner());
        if !*live {
            return Ok(());
        }
        // SAFETY: the context is live (destroy waits for the lock); abort may come from any
        // thread, even during a call on another.
        check(unsafe { sys::stria_context_abort(self.shared.token as sys::stria_context_t) })
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle(..)")
    }
}

/// The time of one ring step of a context's last attention call, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTime {
    /// Wall time of this rank's compute in the step.
    pub compute_s: f64,
    /// CPU time of the compute threads divided by their number: the compute on dedicated cores.
    pub compute_cpu_s: f64,
    /// Time blocked on the ring's transfers after the compute.
    pub wait_s: f64,
}

/// What a rank sent in its context's last attention call ([`Context::traffic`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes of K/V blocks.
    pub kv_bytes: u64,
    /// Bytes of dK/dV partials (backward calls).
    pub dkv_bytes: u64,
    /// Ring messages (and a grid's all-to-all messages).
    pub messages: u64,
    /// Bytes a grid's all-to-all sent to the other members of the group.
    pub all_to_all_bytes: u64,
}

/// `world_size` contexts in this process, joined by the in-process transport: rank r is
/// `contexts()[r]`. Each must be driven by its own thread, since attention is collective:
/// [`run`](LocalGroup::run) does that, or [`into_contexts`](LocalGroup::into_contexts) hands them
/// out to threads of your own.
///
/// ```
/// use stria::{AttentionParams, Layout, LocalGroup, Tensor};
/// // The whole sequence: S = 8 tokens, 1 batch, 2 heads of dimension 4.
/// let (s, h, d) = (8, 2, 4);
/// let x: Vec<f32> = (0..s * h * d).map(|i| (i as f32 * 0.37).sin()).collect();
/// let full = Tensor::new(x, &[1, s, h, d]).unwrap();
/// let params = AttentionParams { layout: Layout::Zigzag, ..Default::default() };
///
/// // Attention over the whole sequence on one rank, and as a ring of 2.
/// let ring = |n: i32| {
///     let mut group = LocalGroup::new(n as usize, &stria::Config::new()).unwrap();
///     let outs = group.run(0..n, |ctx, rank| {
///         let q = full.shard(params.layout, n, rank, 1)?;
///         let mut out = Tensor::zeros(q.shape())?;
///         let mut lse = Tensor::<f32>::zeros(&[1, h, s / n as i64])?;
///         ctx.forward(&params, &q, &q, &q, &mut out, &mut lse)?;
///         Ok::<_, stria::Error>(out)
///     });
///     let outs: Vec<Tensor<f32>> = outs.into_iter().collect::<Result<_, _>>().unwrap();
///     Tensor::unshard(&outs, params.layout, 1).unwrap()
/// };
/// let (one, two) = (ring(1), ring(2));
/// for (a, b) in one.as_slice().iter().zip(two.as_slice()) {
///     assert!((a - b).abs() < 1e-5);
/// }
/// ```
#[derive(Debug)]
pub struct LocalGroup {
    contexts: Vec<Context>,
}

impl LocalGroup {
    /// Creates the group (`config`'s rank and world size are not used; its transport must be
    /// [`Transport::Local`], the default).
    pub fn new(world_size: usize, config: &Config) -> Result<LocalGroup> {
        let raw_config = config.raw()?;
        let n = c_int::try_from(world_size).map_err(|_| invalid(format!("world_size {world_size} is too large")))?;
        // SAFETY: the callee writes at most world_size handles into `out`.
        Self::create(world_size, |out| unsafe {
            sys::stria_context_create_local_group(&raw_config, n, out)
        })
    }

    /// Creates the group with rank `r` on `devices[r]`: a ring over the GPUs of this process, each
    /// rank on its own (`config`'s device, rank and world size are not used; its transport must
    /// be [`Transport::Local`]). The ranks
    /// are all CPU or all CUDA; blocks move GPU to GPU.
    pub fn on_devices(devices: &[Device], config: &Config) -> Result<LocalGroup> {
        let raw_config = config.raw()?;
        let world_size = devices.len();
        let n = c_int::try_from(world_size).map_err(|_| invalid(format!("{world_size} devices are too many")))?;
        let raw_devices: Vec<sys::DLDevice> = devices.iter().map(|d| d.dl()).collect();
        Self::create(world_size, |out| {
            // SAFETY: one device per rank, and room for as many handles.
            unsafe { sys::stria_context_create_local_group_on_devices(&raw_config, raw_devices.as_ptr(), n, out) }
        })
    }

    // Calls `create` with room for world_size handles (at least one, which a rejected call may
    // clear) and adopts what it made.
    fn create(
        world_size: usize,
        create: impl FnOnce(*mut sys::stria_context_t) -> sys::stria_status_t,
    ) -> Result<LocalGroup> {
        let mut raw = Vec::new();
        raw.try_reserve_exact(world_size.max(1))
            .map_err(|_| Error::new(Status::OutOfMemory, format!("cannot allocate {world_size} handles")))?;
        raw.resize(world_size.max(1), std::ptr::null_mut());
        check(create(raw.as_mut_ptr()))?;
        raw.truncate(world_size);
        // Adopt every handle even after a failure, so that none leaks.
        let adopted: Vec<Result<Context>> = raw
            .into_iter()
            // SAFETY: each handle is live and ours alone.
            .map(|handle| unsafe { Context::adopt(handle) })
            .collect();
        let contexts = adopted.into_iter().collect::<Result<Vec<_>>>()?;
        Ok(LocalGroup { contexts })
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.contexts.len()
    }

    /// The contexts, rank r at index r.
    pub fn contexts(&self) -> &[Context] {
        &self.contexts
    }

    /// The contexts, writable.
    pub fn contexts_mut(&mut self) -> &mut [Context] {
        &mut self.contexts
    }

    /// The contexts, to move into threads of your own (each is `Send`).
    pub fn into_contexts(self) -> Vec<Context> {
        self.contexts
    }

    /// Runs `f(context, input)` for every rank at once, each on its own thread, and returns the
    /// results in rank order; `per_rank` gives one input per rank (rank r gets the r-th).
    ///
    /// If `f` panics on a rank, that rank's context is aborted, so ranks waiting for it in a
    /// collective fail instead of waiting out the timeout; the panic then resumes here. A rank
    /// that returns early without the collective its peers make (an `Err` before the call) leaves
    /// them waiting until their timeout: abort its context first (`ctx.abort_handle().abort()`), or
    /// panic.
    ///
    /// # Panics
    /// If `per_rank` does not yield exactly one input per rank, or `f` panics.
    pub fn run<T, R, F>(&mut self, per_rank: impl IntoIterator<Item = T>, f: F) -> Vec<R>
    where
        T: Send,
        R: Send,
        F: Fn(&mut Context, T) -> R + Sync,
    {
        let inputs: Vec<T> = per_rank.into_iter().collect();
        assert_eq!(
            inputs.len(),
            self.contexts.len(),
            "LocalGroup::run needs one input per rank"
        );
        let f = &f;
        std::thread::scope(|scope| {
            let threads: Vec<_> = self
                .contexts
                .iter_mut()
                .zip(inputs)
                .map(|(ctx, input)| {
                    std::thread::Builder::new()
                        .name(format!("stria-rank-{}", ctx.rank()))
                        .spawn_scoped(scope, move || {
                            let _guard = AbortOnPanic(ctx.abort_handle());
                            f(ctx, input)
                        })
                        .expect("spawn a rank's thread")
                })
                .collect();
            let joined: Vec<_> = threads.into_iter().map(|t| t.join()).collect();
            joined
                .into_iter()
                .map(|r| r.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
                .collect()
        })
    }
}

/// Aborts a context if its thread unwinds, so that its peers stop waiting for it.
struct AbortOnPanic(AbortHandle);

impl Drop for AbortOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = self.0.abort();
        }
    }
}
