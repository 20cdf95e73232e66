//! The ring demo in Rust: N CPU ranks in one process (a local group, one thread each) run a
//! causal forward and backward over a long sequence in each layout. For every layout it prints
//! the wall time, the ring latency modelled from measured per-step compute (sum over steps of
//! the slowest rank: what N dedicated machines would see), the contiguous/layout latency ratio
//! beside the analytical one, and the error against a float64 reference on sampled rows.
//! Exits 1 if an error is outside the dtype's tolerance.
//!
//! Run from bindings/rust (see examples/rust/README.md):
//!     cargo run --release --example ring_demo -- --world 4 --seq 4096 --dtype bf16

use std::process::exit;
use std::time::Instant;

use stria::half::{bf16, f16};
use stria::{
    analyze_balance, AttentionParams, Config, Element, Layout, LocalGroup, StepTime, Tensor,
};

struct Options {
    world: usize,
    seq: usize,
    heads: usize,
    kv_heads: usize,
    dim: usize,
    dtype: String,
    samples: usize,
}

const USAGE: &str = "usage: ring_demo [--world N] [--seq S] [--heads H] [--kv-heads H] [--dim D] \
                     [--dtype f32|bf16|f16] [--samples R]";

fn parse() -> Result<Options, String> {
    let mut o = Options {
        world: 4,
        seq: 4096,
        heads: 4,
        kv_heads: 2,
        dim: 64,
        dtype: "f32".into(),
        samples: 16,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let (flag, value) = match pair {
            [flag, value] => (flag.as_str(), value.as_str()),
            _ => return Err(format!("{} needs a value", pair[0])),
        };
        let number = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag} {value}: not a count"))
        };
        match flag {
            "--world" => o.world = number()?,
            "--seq" => o.seq = number()?,
            "--heads" => o.heads = number()?,
            "--kv-heads" => o.kv_heads = number()?,
            "--dim" => o.dim = number()?,
            "--samples" => o.samples = number()?,
            "--dtype" => o.dtype = value.into(),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if [o.world, o.seq, o.heads, o.kv_heads, o.dim, o.samples].contains(&0) {
        return Err("every size must be positive".into());
    }
    if o.seq % (2 * o.world) != 0 {
        return Err(format!(
            "--seq must be a multiple of 2 x world ({}) so every layout applies",
            2 * o.world
        ));
    }
    Ok(o)
}

/// The demo's element types, with the conversions it needs.
trait Float: Element {
    const TOLERANCE: f64;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Float for f32 {
    const TOLERANCE: f64 = 1e-5;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self.into()
    }
}

impl Float for bf16 {
    const TOLERANCE: f64 = 2e-2;
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}

impl Float for f16 {
    const TOLERANCE: f64 = 2e-2;
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}

/// A SplitMix64 stream (the demo needs no random-number crate).
fn splitmix(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed;
    move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Normal samples (Box-Muller).
fn normals(seed: u64, n: usize) -> Vec<f64> {
    let mut next = splitmix(seed);
    let mut uniform = move || ((next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    (0..n)
        .map(|_| (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos())
        .collect()
}

/// A tensor's values as f64.
fn values<T: Float>(t: &Tensor<T>) -> Vec<f64> {
    t.as_slice().iter().map(|&x| x.to_f64()).collect()
}

/// The full-sequence inputs, [1, S, H, D].
struct Inputs<T: Element> {
    q: Tensor<T>,
    k: Tensor<T>,
    v: Tensor<T>,
    dout: Tensor<T>,
}

/// The ring's outputs gathered back into global token order.
struct Outputs<T: Element> {
    out: Tensor<T>,
    lse: Tensor<f32>,
    dq: Tensor<T>,
    dk: Tensor<T>,
    dv: Tensor<T>,
}

#[derive(Default)]
struct LayoutResult {
    fwd_wall: f64,
    bwd_wall: f64,
    fwd_model: f64, // sum over steps of the slowest rank's compute (CPU seconds)
    bwd_model: f64,
    errors: [f64; 5], // out, lse, dq, dk, dv
}

/// One rank: its shards in, its outputs back, when it finished each pass, and its step times.
struct RankRun<T: Element> {
    out: Tensor<T>,
    lse: Tensor<f32>,
    dq: Tensor<T>,
    dk: Tensor<T>,
    dv: Tensor<T>,
    fwd_end: Instant,
    bwd_end: Instant,
    fwd_steps: Vec<StepTime>,
    bwd_steps: Vec<StepTime>,
}

fn run_layout<T: Float>(
    o: &Options,
    layout: Layout,
    inputs: &Inputs<T>,
) -> stria::Result<(LayoutResult, Outputs<T>)> {
    let n = o.world as i32;
    // One thread per rank: a step's CPU time is then the rank's own compute.
    let mut group = LocalGroup::new(o.world, &Config::new().num_threads(1))?;
    let params = AttentionParams {
        layout,
        causal: true,
        ..Default::default()
    };
    let started = Instant::now();
    let runs = group.run(0..n, |ctx, rank| -> stria::Result<RankRun<T>> {
        let shard = |t: &Tensor<T>| t.shard(layout, n, rank, 1);
        let (q, k, v, dout) = (
            shard(&inputs.q)?,
            shard(&inputs.k)?,
            shard(&inputs.v)?,
            shard(&inputs.dout)?,
        );
        let mut out = Tensor::zeros(q.shape())?;
        let mut lse = Tensor::zeros(&[1, o.heads as i64, q.shape()[1]])?;
        ctx.forward(&params, &q, &k, &v, &mut out, &mut lse)?;
        let fwd_end = Instant::now();
        let fwd_steps = ctx.step_times()?;
        let (mut dq, mut dk, mut dv) = (
            Tensor::zeros(q.shape())?,
            Tensor::zeros(k.shape())?,
            Tensor::zeros(k.shape())?,
        );
        ctx.backward(
            &params, &q, &k, &v, &out, &lse, &dout, &mut dq, &mut dk, &mut dv,
        )?;
        Ok(RankRun {
            out,
            lse,
            dq,
            dk,
            dv,
            fwd_end,
            bwd_end: Instant::now(),
            fwd_steps,
            bwd_steps: ctx.step_times()?,
        })
    });
    let runs = runs.into_iter().collect::<stria::Result<Vec<_>>>()?;

    let fwd_done = runs.iter().map(|r| r.fwd_end).max().unwrap();
    let bwd_done = runs.iter().map(|r| r.bwd_end).max().unwrap();
    let slowest = |steps: fn(&RankRun<T>) -> &Vec<StepTime>| -> f64 {
        (0..o.world)
            .map(|s| {
                runs.iter()
                    .map(|r| steps(r)[s].compute_cpu_s)
                    .fold(0.0, f64::max)
            })
            .sum()
    };
    let result = LayoutResult {
        fwd_wall: (fwd_done - started).as_secs_f64(),
        bwd_wall: (bwd_done - fwd_done).as_secs_f64(),
        fwd_model: slowest(|r| &r.fwd_steps),
        bwd_model: slowest(|r| &r.bwd_steps),
        errors: [0.0; 5],
    };
    let gather = |pick: fn(&RankRun<T>) -> &Tensor<T>| {
        let shards: Vec<Tensor<T>> = runs.iter().map(|r| pick(r).clone()).collect();
        Tensor::unshard(&shards, layout, 1)
    };
    let lse_shards: Vec<Tensor<f32>> = runs.iter().map(|r| r.lse.clone()).collect();
    let got = Outputs {
        out: gather(|r| &r.out)?,
        lse: Tensor::unshard(&lse_shards, layout, 2)?,
        dq: gather(|r| &r.dq)?,
        dk: gather(|r| &r.dk)?,
        dv: gather(|r| &r.dv)?,
    };
    Ok((result, got))
}

/// sqrt(Σ(got − want)² / Σwant²) over pairs added; NaN anywhere makes it NaN (never passes).
#[derive(Default)]
struct ErrAcc {
    num: f64,
    den: f64,
}

impl ErrAcc {
    fn add(&mut self, got: f64, want: f64) {
        self.num += (got - want) * (got - want);
        self.den += want * want;
    }
    fn value(&self) -> f64 {
        if self.den > 0.0 {
            (self.num / self.den).sqrt()
        } else {
            self.num.sqrt()
        }
    }
}

/// Checks sampled rows against float64: for each sampled position p, query row p (out, lse, dq:
/// from the reference alone) and key row p (dk, dv: these sum over every later query, so they
/// use the ring's own lse and out for those rows, which the sampled forward check vouches for).
fn check_rows<T: Float>(
    o: &Options,
    inputs: &Inputs<T>,
    got: &Outputs<T>,
    rows: &[usize],
) -> [f64; 5] {
    let (s, hq, hkv, d) = (o.seq, o.heads, o.kv_heads, o.dim);
    let group = hq / hkv;
    let scale = 1.0 / (d as f64).sqrt();
    let (q, k, v, g) = (
        values(&inputs.q),
        values(&inputs.k),
        values(&inputs.v),
        values(&inputs.dout),
    );
    let (out, dq, dk, dv) = (
        values(&got.out),
        values(&got.dq),
        values(&got.dk),
        values(&got.dv),
    );
    let lse: Vec<f64> = got.lse.as_slice().iter().map(|&x| f64::from(x)).collect();
    let qrow = |i: usize, h: usize| &q[(i * hq + h) * d..][..d];
    let krow = |j: usize, h: usize| &k[(j * hkv + h) * d..][..d];
    let vrow = |j: usize, h: usize| &v[(j * hkv + h) * d..][..d];
    let grow = |i: usize, h: usize| &g[(i * hq + h) * d..][..d];
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let mut err: [ErrAcc; 5] = Default::default();
    for &i in rows {
        for h in 0..hq {
            let hk = h / group;
            let scores: Vec<f64> = (0..=i)
                .map(|j| scale * dot(qrow(i, h), krow(j, hk)))
                .collect();
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l = mx + scores.iter().map(|x| (x - mx).exp()).sum::<f64>().ln();
            let p: Vec<f64> = scores.iter().map(|x| (x - l).exp()).collect();
            let mut o_row = vec![0.0; d];
            for (j, pj) in p.iter().enumerate() {
                for (e, x) in o_row.iter_mut().enumerate() {
                    *x += pj * vrow(j, hk)[e];
                }
            }
            err[1].add(lse[h * s + i], l);
            for e in 0..d {
                err[0].add(out[(i * hq + h) * d + e], o_row[e]);
            }
            let delta = dot(grow(i, h), &o_row);
            let mut acc = vec![0.0; d];
            for (j, pj) in p.iter().enumerate() {
                let ds = pj * (dot(grow(i, h), vrow(j, hk)) - delta) * scale;
                for (e, x) in acc.iter_mut().enumerate() {
                    *x += ds * krow(j, hk)[e];
                }
            }
            for e in 0..d {
                err[2].add(dq[(i * hq + h) * d + e], acc[e]);
            }
        }
        // Key row j = i: dK_j = Σ_queries scale·P(dP − δ)·Q, dV_j = Σ P·dO.
        let j = i;
        for hk in 0..hkv {
            let (mut gk, mut gv) = (vec![0.0; d], vec![0.0; d]);
            for h in hk * group..(hk + 1) * group {
                for qi in j..s {
                    let pij = (scale * dot(qrow(qi, h), krow(j, hk)) - lse[h * s + qi]).exp();
                    let delta = dot(grow(qi, h), &out[(qi * hq + h) * d..][..d]);
                    let ds = pij * (dot(grow(qi, h), vrow(j, hk)) - delta) * scale;
                    for e in 0..d {
                        gk[e] += ds * qrow(qi, h)[e];
                        gv[e] += pij * grow(qi, h)[e];
                    }
                }
            }
            for e in 0..d {
                err[3].add(dk[(j * hkv + hk) * d + e], gk[e]);
                err[4].add(dv[(j * hkv + hk) * d + e], gv[e]);
            }
        }
    }
    [
        err[0].value(),
        err[1].value(),
        err[2].value(),
        err[3].value(),
        err[4].value(),
    ]
}

fn run<T: Float>(o: &Options) -> stria::Result<bool> {
    let (s, hq, hkv, d) = (
        o.seq as i64,
        o.heads as i64,
        o.kv_heads as i64,
        o.dim as i64,
    );
    let tensor = |seed: u64, h: i64| {
        let x = normals(seed, (s * h * d) as usize);
        Tensor::new(x.into_iter().map(T::from_f64).collect(), &[1, s, h, d])
    };
    let inputs = Inputs {
        q: tensor(1, hq)?,
        k: tensor(2, hkv)?,
        v: tensor(3, hkv)?,
        dout: tensor(4, hq)?,
    };
    let mut next = splitmix(7);
    let mut rows: Vec<usize> = (0..o.samples)
        .map(|_| (next() % o.seq as u64) as usize)
        .collect();
    rows[0] = 0; // the first token sees only itself
    if o.samples > 1 {
        rows[1] = o.seq - 1; // the last sees everything
    }

    let layouts = [Layout::Contiguous, Layout::Zigzag, Layout::Striped];
    let mut results = Vec::new();
    for (li, &layout) in layouts.iter().enumerate() {
        print!(
            "[{}/3] {:<10} forward + backward on {} ranks ... ",
            li + 1,
            layout,
            o.world
        );
        flush();
        let (mut r, got) = run_layout(o, layout, &inputs)?;
        print!(
            "{:.2} s; checking {} sampled rows against float64 ... ",
            r.fwd_wall + r.bwd_wall,
            o.samples
        );
        flush();
        r.errors = check_rows(o, &inputs, &got, &rows);
        println!("done");
        results.push(r);
    }

    let balance = layouts
        .iter()
        .map(|&l| analyze_balance(l, true, s, o.world as i32, 64))
        .collect::<stria::Result<Vec<_>>>()?;
    println!(
        "\n{:<10} | {:>9} {:>9} | {:>12} {:>12} | {:>9} {:>10} | {:>9} {:>9} {:>9} {:>9} {:>9}",
        "layout",
        "fwd wall",
        "bwd wall",
        "ring fwd",
        "ring bwd",
        "speedup",
        "analytic",
        "err out",
        "err lse",
        "err dq",
        "err dk",
        "err dv"
    );
    println!(
        "{:<10} | {:>9} {:>9} | {:>12} {:>12} | {:>9} {:>10} |",
        "", "(s)", "(s)", "model (s)", "model (s)", "vs contig", "(tile 64)"
    );
    let mut ok = true;
    for (li, r) in results.iter().enumerate() {
        let measured = (results[0].fwd_model + results[0].bwd_model) / (r.fwd_model + r.bwd_model);
        let analytic = balance[0].ring_latency / balance[li].ring_latency;
        let e = r.errors;
        println!(
            "{:<10} | {:>9.2} {:>9.2} | {:>12.3} {:>12.3} | {:>8.2}x {:>9.2}x | {:>9.1e} {:>9.1e} {:>9.1e} {:>9.1e} {:>9.1e}",
            layouts[li], r.fwd_wall, r.bwd_wall, r.fwd_model, r.bwd_model, measured, analytic, e[0], e[1], e[2], e[3], e[4]
        );
        ok &= [e[0], e[2], e[3], e[4]].iter().all(|&x| x < T::TOLERANCE) && e[1] < 1e-5;
    }
    println!(
        "\nstriped balance: speedup {:.2} of an ideal {} (imbalance {:.3}); contiguous: {:.2} (imbalance {:.3})",
        balance[2].speedup, o.world, balance[2].imbalance, balance[0].speedup, balance[0].imbalance
    );
    println!(
        "{}: relative errors {} the {} tolerance ({:.0e})",
        if ok { "OK" } else { "FAILED" },
        if ok { "within" } else { "outside" },
        o.dtype,
        T::TOLERANCE
    );
    Ok(ok)
}

fn flush() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

fn main() {
    let o = parse().unwrap_or_else(|e| {
        eprintln!("{e}\n{USAGE}");
        exit(2);
    });
    println!(
        "stria {} ring demo (Rust): {} CPU ranks in one process, causal, S={}, B=1, Hq={}, Hkv={}, D={}, {}",
        stria::version(),
        o.world,
        o.seq,
        o.heads,
        o.kv_heads,
        o.dim,
        o.dtype
    );
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "({cores} hardware threads: ranks share them, so wall time is the sum of all ranks' work; the modelled ring \
         latency is what {} dedicated machines would take)\n",
        o.world
    );
    let outcome = match o.dtype.as_str() {
        "f32" | "float32" => run::<f32>(&o),
        "bf16" | "bfloat16" => run::<bf16>(&o),
        "f16" | "float16" => run::<f16>(&o),
        other => {
            eprintln!("unknown dtype {other}\n{USAGE}");
            exit(2);
        }
    };
    match outcome {
        Ok(true) => {}
        Ok(false) => exit(1),
        Err(e) => {
            eprintln!("{e}");
            exit(1);
        }
    }
}
