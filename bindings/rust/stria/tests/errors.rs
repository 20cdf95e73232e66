//! Bad inputs through the safe API: each becomes an `Err` carrying the library's status and
//! message (or this crate's own, for what it rejects before the call), never a crash; a
//! rejected call leaves the contexts usable, checked by a correct ring afterwards.

mod common;

use std::time::{Duration, Instant};

use common::*;
use stria::half::f16;
use stria::{
    analyze_balance, balance_steps, AttentionParams, Config, Context, Device, Documents, Layout, LocalGroup, Status,
    Tensor, TensorView, TensorViewMut, Transport,
};

/// Asserts `r` failed with `status` and a message containing `needle`.
#[track_caller]
fn expect_err<T: std::fmt::Debug>(r: stria::Result<T>, status: Status, needle: &str) {
    let e = r.expect_err("the call should have failed");
    assert_eq!(e.status(), status, "{e}");
    assert!(
        e.message().contains(needle),
        "message {:?} lacks {:?}",
        e.message(),
        needle
    );
    assert!(e.to_string().contains(&e.status().to_string()), "{e}");
}

const B: i64 = 1;
const L: i64 = 8;
const HQ: i64 = 2;
const HKV: i64 = 1;
const D: i64 = 16;

/// One rank's good f32 tensors of [B, L, HQ, D] / [B, L, HKV, D].
struct Rank {
    q: Tensor<f32>,
    k: Tensor<f32>,
    v: Tensor<f32>,
    out: Tensor<f32>,
    lse: Tensor<f32>,
    dout: Tensor<f32>,
    dq: Tensor<f32>,
    dk: Tensor<f32>,
    dv: Tensor<f32>,
}

impl Rank {
    fn new(seed: u64) -> Rank {
        let mut rng = Rng::new(seed);
        let mut t = |shape: &[i64]| {
            let n = shape.iter().product::<i64>() as usize;
            Tensor::new(to_t::<f32>(&rng.normals(n)), shape).unwrap()
        };
        Rank {
            q: t(&[B, L, HQ, D]),
            k: t(&[B, L, HKV, D]),
            v: t(&[B, L, HKV, D]),
            out: t(&[B, L, HQ, D]),
            lse: t(&[B, HQ, L]),
            dout: t(&[B, L, HQ, D]),
            dq: t(&[B, L, HQ, D]),
            dk: t(&[B, L, HKV, D]),
            dv: t(&[B, L, HKV, D]),
        }
    }

    fn forward(&mut self, ctx: &mut Context, params: &AttentionParams) -> stria::Result<()> {
        ctx.forward(params, &self.q, &self.k, &self.v, &mut self.out, &mut self.lse)
    }
}

fn tensor<T: stria::Element>(shape: &[i64]) -> Tensor<T> {
    Tensor::zeros(shape).unwrap()
}

/// Checks that the ring still computes the right thing: a causal striped forward on every
/// context, compared with the float64 reference.
fn expect_correct_forward(contexts: &mut [Context]) {
    let n = contexts.len();
    let s = L as usize * n;
    let mut rng = Rng::new(99);
    let dims = Dims {
        b: 1,
        s,
        hq: HQ as usize,
        hkv: HKV as usize,
        d: D as usize,
    };
    let q = quantize::<f32>(&rng.normals(s * dims.hq * dims.d));
    let k = quantize::<f32>(&rng.normals(s * dims.hkv * dims.d));
    let v = quantize::<f32>(&rng.normals(s * dims.hkv * dims.d));
    let want = dense_attention(&q, &k, &v, &q, dims, true, 1.0 / (D as f64).sqrt());
    let params = AttentionParams::default();
    let layout = params.layout;
    let outs: Vec<Vec<f64>> = std::thread::scope(|scope| {
        let threads: Vec<_> = contexts
            .iter_mut()
            .enumerate()
            .map(|(r, ctx)| {
                let (q, k, v) = (&q, &k, &v);
                scope.spawn(move || {
                    let split = Split {
                        layout,
                        world: n,
                        b: 1,
                        s,
                    };
                    let cut = |x: &[f64], h: i64| {
                        Tensor::new(to_t::<f32>(&split.gather(x, (h * D) as usize, r)), &[B, L, h, D]).unwrap()
                    };
                    let mut out = Tensor::full(&[B, L, HQ, D], f32::NAN).unwrap();
                    let mut lse = tensor::<f32>(&[B, HQ, L]);
                    ctx.forward(&params, &cut(q, HQ), &cut(k, HKV), &cut(v, HKV), &mut out, &mut lse)
                        .unwrap();
                    to_f64(out.as_slice())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let split = Split {
        layout,
        world: n,
        b: 1,
        s,
    };
    let mut got = vec![f64::NAN; want.out.len()];
    for (r, out) in outs.iter().enumerate() {
        split.scatter(out, &mut got, (HQ * D) as usize, r);
    }
    let err = rel_error(&got, &want.out);
    assert!(err < 1e-5, "forward after a rejected call: relative error {err:e}");
}

/// A bad attention call, made identically on a context of one rank and on both ranks of a
/// group of two; each must fail with `status` and `needle`, and leave the contexts usable.
fn expect_bad_call(
    name: &str,
    status: Status,
    needle: &str,
    call: impl Fn(&mut Context, &mut Rank) -> stria::Result<()> + Sync,
) {
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(20));
    let mut single = Context::new(&config).unwrap();
    let e = call(&mut single, &mut Rank::new(1)).expect_err(name);
    assert_eq!(e.status(), status, "{name}: {e}");
    assert!(
        e.message().contains(needle),
        "{name}: {:?} lacks {needle:?}",
        e.message()
    );
    expect_correct_forward(std::slice::from_mut(&mut single));

    let mut group = LocalGroup::new(2, &config).unwrap();
    let started = Instant::now();
    let results = group.run(0..2u64, |ctx, seed| call(ctx, &mut Rank::new(seed)));
    for (r, res) in results.into_iter().enumerate() {
        let e = res.expect_err(name);
        assert_eq!(e.status(), status, "{name}, rank {r} of 2: {e}");
        assert!(
            e.message().contains(needle),
            "{name}, rank {r}: {:?} lacks {needle:?}",
            e.message()
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{name}: the group took too long to fail"
    );
    expect_correct_forward(group.contexts_mut());
}

#[test]
fn bad_attention_shapes() {
    let p = AttentionParams::default();
    expect_bad_call("k has another L", Status::InvalidArgument, "k has shape", |c, t| {
        t.k = tensor(&[B, L / 2, HKV, D]);
        t.forward(c, &p)
    });
    expect_bad_call("v has more heads", Status::InvalidArgument, "v has shape", |c, t| {
        t.v = tensor(&[B, L, 2, D]);
        t.forward(c, &p)
    });
    expect_bad_call("out has another D", Status::InvalidArgument, "out has shape", |c, t| {
        t.out = tensor(&[B, L, HQ, D / 2]);
        t.forward(c, &p)
    });
    expect_bad_call("lse has another L", Status::InvalidArgument, "lse has shape", |c, t| {
        t.lse = tensor(&[B, HQ, L / 2]);
        t.forward(c, &p)
    });
    expect_bad_call("lse is 2-d", Status::InvalidArgument, "ndim", |c, t| {
        t.lse = tensor(&[B * HQ, L]);
        t.forward(c, &p)
    });
    expect_bad_call("Hq not a multiple of Hkv", Status::InvalidArgument, "divide", |c, t| {
        t.q = tensor(&[B, L, 3, D]);
        t.out = tensor(&[B, L, 3, D]);
        t.lse = tensor(&[B, 3, L]);
        t.k = tensor(&[B, L, 2, D]);
        t.v = tensor(&[B, L, 2, D]);
        t.forward(c, &p)
    });
    expect_bad_call("dk has another D", Status::InvalidArgument, "dk has shape", |c, t| {
        t.dk = tensor(&[B, L, HKV, D / 2]);
        c.backward(
            &p, &t.q, &t.k, &t.v, &t.out, &t.lse, &t.dout, &mut t.dq, &mut t.dk, &mut t.dv,
        )
    });
    expect_bad_call(
        "dout has another L",
        Status::InvalidArgument,
        "dout has shape",
        |c, t| {
            t.dout = tensor(&[B, L / 2, HQ, D]);
            c.backward(
                &p, &t.q, &t.k, &t.v, &t.out, &t.lse, &t.dout, &mut t.dq, &mut t.dk, &mut t.dv,
            )
        },
    );
}

#[test]
fn bad_attention_dtypes_and_strides() {
    let p = AttentionParams::default();
    expect_bad_call("k is f16, q f32", Status::InvalidArgument, "dtype", |c, t| {
        let k16 = tensor::<f16>(&[B, L, HKV, D]);
        c.forward(&p, &t.q, &k16, &t.v, &mut t.out, &mut t.lse)
    });
    expect_bad_call("lse is f16", Status::InvalidArgument, "float32", |c, t| {
        let mut lse16 = tensor::<f16>(&[B, HQ, L]);
        c.forward(&p, &t.q, &t.k, &t.v, &mut t.out, &mut lse16)
    });
    expect_bad_call("all f64", Status::Unsupported, "float64", |c, _| {
        let (q, k) = (tensor::<f64>(&[B, L, HQ, D]), tensor::<f64>(&[B, L, HKV, D]));
        let (mut out, mut lse) = (tensor::<f64>(&[B, L, HQ, D]), tensor::<f32>(&[B, HQ, L]));
        c.forward(&p, &q, &k, &k, &mut out, &mut lse)
    });
    expect_bad_call("q's last dim strided", Status::InvalidArgument, "stride", |c, t| {
        let wide = vec![0.0f32; (B * L * HQ * 2 * D) as usize];
        let strides = [L * HQ * 2 * D, HQ * 2 * D, 2 * D, 2];
        let q = TensorView::with_strides(&wide, &[B, L, HQ, D], &strides).unwrap();
        c.forward(&p, &q, &t.k, &t.v, &mut t.out, &mut t.lse)
    });
    expect_bad_call("head dim 600", Status::Unsupported, "512", |c, _| {
        let (q, k) = (tensor::<f32>(&[B, L, HQ, 600]), tensor::<f32>(&[B, L, HKV, 600]));
        let (mut out, mut lse) = (tensor::<f32>(&[B, L, HQ, 600]), tensor::<f32>(&[B, HQ, L]));
        c.forward(&p, &q, &k, &k, &mut out, &mut lse)
    });
    expect_bad_call(
        "a CUDA tensor on a CPU context",
        Status::InvalidArgument,
        "cuda",
        |c, t| {
            let mut dl = stria::Input::dl_tensor(&t.q);
            dl.device = stria::sys::DLDevice {
                device_type: stria::sys::kDLCUDA,
                device_id: 0,
            };
            // SAFETY: the shape is t.q's, and validation rejects the device before any access.
            let q = unsafe { TensorView::from_raw(&dl) };
            c.forward(&p, &q, &t.k, &t.v, &mut t.out, &mut t.lse)
        },
    );
}

#[test]
fn ranks_that_disagree_all_fail_then_agree() {
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(20));
    let mut group = LocalGroup::new(3, &config).unwrap();
    let started = Instant::now();
    let results = group.run(0..3, |ctx, r| {
        let params = AttentionParams {
            causal: r != 2,
            ..Default::default()
        };
        Rank::new(r as u64).forward(ctx, &params)
    });
    for (r, res) in results.into_iter().enumerate() {
        expect_err(
            res.map_err(|e| {
                assert!(e.message().contains("rank 2"), "rank {r}: {e}");
                e
            }),
            Status::InvalidArgument,
            "causal",
        );
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    expect_correct_forward(group.contexts_mut());
}

#[test]
fn deterministic_backward_repeats_its_bits() {
    let mut ctx = Context::new(&Config::new().num_threads(1)).unwrap();
    let params = AttentionParams::default();
    let mut runs = Vec::new();
    for on in [true, false] {
        ctx.set_deterministic(on).unwrap();
        let mut t = Rank::new(7);
        t.forward(&mut ctx, &params).unwrap();
        ctx.backward(
            &params, &t.q, &t.k, &t.v, &t.out, &t.lse, &t.dout, &mut t.dq, &mut t.dk, &mut t.dv,
        )
        .unwrap();
        let bits: Vec<u32> = [&t.dq, &t.dk, &t.dv]
            .iter()
            .flat_map(|x| x.as_slice().iter().map(|v| v.to_bits()))
            .collect();
        assert!(bits.iter().all(|b| !f32::from_bits(*b).is_nan()));
        runs.push(bits);
    }
    // The CPU backend is deterministic either way.
    assert_eq!(runs[0], runs[1]);
}

#[test]
fn calls_tagged_differently_fail_instead_of_pairing() {
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(20));
    let mut group = LocalGroup::new(2, &config).unwrap();
    let params = AttentionParams::default();
    // Alike, then rank 1 tags its call 0xb2 and rank 0 0xa1: both fail, naming both tags.
    let results = group.run(0..2, |ctx, r| {
        ctx.set_call_tag(5)?;
        Rank::new(r as u64).forward(ctx, &params)?;
        ctx.set_call_tag(if r == 0 { 0xa1 } else { 0xb2 })?;
        Rank::new(r as u64).forward(ctx, &params)
    });
    for (r, res) in results.into_iter().enumerate() {
        expect_err(
            res.map_err(|e| {
                assert!(
                    e.message().contains("0xa1") && e.message().contains("0xb2"),
                    "rank {r}: {e}"
                );
                e
            }),
            Status::InvalidArgument,
            "paired different calls",
        );
    }
    expect_correct_forward(group.contexts_mut()); // untagged: the failed calls took their tags
}

#[test]
fn a_group_on_devices_is_a_local_group() {
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(20));
    let mut group = LocalGroup::on_devices(&[Device::Cpu; 3], &config).unwrap();
    assert_eq!(group.world_size(), 3);
    expect_correct_forward(group.contexts_mut());
}

#[test]
fn bad_contexts() {
    expect_err(
        LocalGroup::new(0, &Config::new()),
        Status::InvalidArgument,
        "world_size 0",
    );
    expect_err(
        LocalGroup::new(5000, &Config::new()),
        Status::InvalidArgument,
        "out of range",
    );
    expect_err(
        LocalGroup::new(2, &Config::new().transport(Transport::Ucx, None)),
        Status::InvalidArgument,
        "local transport",
    );
    expect_err(
        LocalGroup::on_devices(&[Device::Cpu, Device::Cuda(0)], &Config::new()),
        Status::InvalidArgument,
        "devices[1] is cuda:0 but devices[0] is cpu:0",
    );
    expect_err(
        LocalGroup::on_devices(&[], &Config::new()),
        Status::InvalidArgument,
        "world_size 0",
    );
    expect_err(
        Context::new(&Config::new().rank(2, 2)),
        Status::InvalidArgument,
        "rank 2",
    );
    expect_err(
        Context::new(&Config::new().rank(0, 0)),
        Status::InvalidArgument,
        "world_size 0",
    );
    expect_err(
        Context::new(&Config::new().device(Device::Cuda(-1))),
        Status::InvalidArgument,
        "negative",
    );
    expect_err(
        Context::new(&Config::new().num_threads(usize::MAX)),
        Status::InvalidArgument,
        "num_threads",
    );
    // Without the CUDA module (the CPU-only build) a CUDA context is unsupported, and says why.
    if let Err(e) = Context::new(&Config::new().device(Device::Cuda(0))) {
        assert_eq!(e.status(), Status::Unsupported, "{e}");
        assert!(e.message().to_lowercase().contains("cuda"), "{e}");
    }
}

#[test]
fn bad_layout_arguments() {
    use Layout::*;
    expect_err(Striped.positions(10, 3, 0), Status::InvalidArgument, "divisible by 3");
    expect_err(Zigzag.positions(12, 4, 0), Status::InvalidArgument, "divisible by 8");
    expect_err(Striped.positions(12, 3, 3), Status::InvalidArgument, "rank 3");
    expect_err(Striped.positions(12, 3, -1), Status::InvalidArgument, "rank -1");
    expect_err(Striped.positions(12, 0, 0), Status::InvalidArgument, "world_size 0");
    expect_err(Striped.positions(0, 2, 0), Status::InvalidArgument, "seq_len 0");
    expect_err(Contiguous.positions(-4, 2, 0), Status::InvalidArgument, "seq_len -4");

    let full = Tensor::new((0..24).map(|x| x as f32).collect(), &[2, 12]).unwrap();
    expect_err(full.shard(Striped, 3, 0, 2), Status::InvalidArgument, "seq_dim 2");
    expect_err(full.shard(Striped, 5, 0, 1), Status::InvalidArgument, "12");
    expect_err(full.shard(Striped, 3, 7, 1), Status::InvalidArgument, "rank 7");
    let mut wrong_dtype = tensor::<f64>(&[2, 4]);
    expect_err(
        stria::shard(Striped, 3, 0, 1, &full, &mut wrong_dtype),
        Status::InvalidArgument,
        "float64",
    );
    let mut wrong_len = tensor::<f32>(&[2, 5]);
    expect_err(
        stria::shard(Striped, 3, 0, 1, &full, &mut wrong_len),
        Status::InvalidArgument,
        "local",
    );
    let shards: Vec<Tensor<f32>> = vec![tensor(&[2, 4]), tensor(&[2, 5])];
    assert_eq!(
        Tensor::unshard(&shards, Striped, 1).unwrap_err().status(),
        Status::InvalidArgument
    );
    expect_err(
        Tensor::<f32>::unshard(&[], Striped, 1),
        Status::InvalidArgument,
        "no shards",
    );

    expect_err(
        analyze_balance(Striped, true, 64, 4, 0),
        Status::InvalidArgument,
        "tile 0",
    );
    expect_err(
        analyze_balance(Zigzag, true, 64, 3, 1),
        Status::InvalidArgument,
        "divisible",
    );
    // The arguments are checked before the positions are allocated: a huge length with a rank
    // out of range is that error, not an out-of-memory one.
    expect_err(Striped.positions(1 << 40, 1, 5), Status::InvalidArgument, "rank 5");
    // A huge ring is refused before its world_size² table is allocated.
    expect_err(
        balance_steps(Striped, true, 1 << 40, 1 << 20, 1),
        Status::InvalidArgument,
        "maximum",
    );
}

#[test]
fn views_that_do_not_fit_their_slice() {
    let mut data = vec![0.0f32; 24];
    expect_err(TensorView::new(&data, &[2, 3, 5]), Status::InvalidArgument, "24");
    expect_err(TensorView::new(&data, &[2, -3, 4]), Status::InvalidArgument, "negative");
    expect_err(
        TensorView::new(&data, &[i64::MAX, 4]),
        Status::InvalidArgument,
        "too many",
    );
    expect_err(
        TensorView::with_strides(&data, &[2, 3, 4], &[13, 4, 1]),
        Status::InvalidArgument,
        "reaches element 24",
    );
    expect_err(
        TensorView::with_strides(&data, &[3, 4], &[-4, 1]),
        Status::InvalidArgument,
        "negative",
    );
    expect_err(
        TensorView::with_strides(&data, &[3, 4], &[4]),
        Status::InvalidArgument,
        "differ",
    );
    // Writable views may not overlap themselves (the library's threads would race).
    expect_err(
        TensorViewMut::with_strides(&mut data, &[3, 4], &[2, 1]),
        Status::InvalidArgument,
        "overlap",
    );
    expect_err(
        TensorViewMut::with_strides(&mut data, &[3, 4], &[0, 1]),
        Status::InvalidArgument,
        "overlap",
    );
    // Read-only views may (a broadcast), and empty ones address nothing.
    assert!(TensorView::with_strides(&data, &[3, 4], &[0, 1]).is_ok());
    assert!(TensorView::with_strides(&data[..0], &[0, 4], &[4, 1]).is_ok());
    assert!(TensorViewMut::with_strides(&mut data, &[4, 3], &[6, 2]).is_ok());
    expect_err(Tensor::new(vec![0.0f32; 5], &[2, 3]), Status::InvalidArgument, "5");
    // An empty shape is empty whatever the order of its dimensions.
    assert!(TensorView::new(&data[..0], &[1 << 62, 1 << 62, 0]).is_ok());
    assert!(TensorView::new(&data[..0], &[0, 1 << 62, 1 << 62]).is_ok());
    // A stride of a size-1 dimension never moves, whatever its sign (torch gives such views).
    assert!(TensorView::with_strides(&data, &[1, 8], &[-8, 1]).is_ok());
}

#[test]
fn allocations_too_large_are_errors_not_aborts() {
    expect_err(Tensor::<f32>::zeros(&[1 << 44]), Status::OutOfMemory, "cannot allocate");
    expect_err(Tensor::<f32>::zeros(&[1 << 62]), Status::OutOfMemory, "cannot allocate");
    expect_err(Tensor::<f32>::zeros(&[1 << 62, 8]), Status::InvalidArgument, "too many");
}

#[test]
fn a_raw_view_without_a_shape_is_refused_by_the_library() {
    let mut full = tensor::<f32>(&[2, 4]);
    let raw = stria::sys::DLTensor {
        data: full.as_mut_slice().as_mut_ptr().cast(),
        device: stria::sys::DLDevice {
            device_type: stria::sys::kDLCPU,
            device_id: 0,
        },
        ndim: 2,
        dtype: stria::sys::DLDataType {
            code: stria::sys::kDLFloat as u8,
            bits: 32,
            lanes: 1,
        },
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    };
    // SAFETY: a NULL shape (which from_raw passes on); the data is valid for the call.
    let view = unsafe { TensorView::from_raw(&raw) };
    let mut local = tensor::<f32>(&[2, 2]);
    expect_err(
        stria::shard(Layout::Striped, 2, 0, 1, &view, &mut local),
        Status::InvalidArgument,
        "has a NULL shape",
    );
}

#[test]
fn bad_documents() {
    // A ring of one rank: S = L. The crate checks what the library cannot (whole rows of the
    // slice); the library checks the boundaries themselves.
    const ONE: &[i64] = &[L];
    const SHORT: &[i64] = &[0, L - 1];
    const DOWN: &[i64] = &[0, 3, 2, L];
    const GOOD: &[i64] = &[0, 2, L];
    let mut ctx = Context::new(&Config::new().num_threads(1)).unwrap();
    let mut rank = Rank::new(5);
    let with = |docs: Documents<'static>| AttentionParams {
        documents: Some(docs),
        ..Default::default()
    };
    expect_err(
        rank.forward(&mut ctx, &with(Documents::shared(ONE))),
        Status::InvalidArgument,
        "two boundaries",
    );
    expect_err(
        rank.forward(&mut ctx, &with(Documents::shared(SHORT))),
        Status::InvalidArgument,
        "sequence length",
    );
    expect_err(
        rank.forward(&mut ctx, &with(Documents::per_row(DOWN))),
        Status::InvalidArgument,
        "decreases",
    );
    // The context stays usable.
    rank.forward(&mut ctx, &with(Documents::shared(GOOD))).unwrap();
}

#[test]
fn bad_windows() {
    let mut ctx = Context::new(&Config::new().num_threads(1)).unwrap();
    let mut rank = Rank::new(6);
    let window = |w: (i64, i64)| AttentionParams {
        window: Some(w),
        ..Default::default()
    };
    expect_err(
        rank.forward(&mut ctx, &window((-2, 0))),
        Status::InvalidArgument,
        "window_left -2",
    );
    expect_err(
        rank.forward(&mut ctx, &window((3, -7))),
        Status::InvalidArgument,
        "window_right -7",
    );
    rank.forward(&mut ctx, &window((3, -1))).unwrap();
    rank.forward(&mut ctx, &window((-1, -1))).unwrap(); // no window: the plain call
}
