//! Document plans: positions that cover every token of a row once, shard and unshard round trips,
//! rings on a plan (S not divisible by N, random documents, causal and not, windows, a fixed
//! local_len, f32 and bf16) against the float64 dense reference, the balance analysis, and bad
//! boundaries or mismatched plans giving the library's errors. Ring outputs are gathered by the
//! plan's positions, not by its unshard, and poisoned with NaN first; padding slots must come back
//! as rows that saw nothing (out 0, lse −∞, dK and dV 0).

mod common;

use std::time::Duration;

use common::*;
use stria::half::bf16;
use stria::{AttentionParams, Config, Documents, Layout, LocalGroup, Plan, PlanConfig, PlanStrategy, Status, Tensor};

/// `batch` rows of `num_seqs + 1` boundaries from 0 to `s`, cut at random (documents may be empty).
fn random_documents(rng: &mut Rng, batch: usize, s: i64, num_seqs: usize) -> Vec<i64> {
    let mut cu = Vec::new();
    for _ in 0..batch {
        let mut cuts: Vec<i64> = (0..num_seqs - 1)
            .map(|_| (rng.next_u64() % (s as u64 + 1)) as i64)
            .collect();
        cuts.sort_unstable();
        cu.push(0);
        cu.extend(cuts);
        cu.push(s);
    }
    cu
}

#[test]
fn positions_cover_each_row_once_and_shard_round_trips() {
    let mut rng = Rng::new(11);
    let b = 2usize;
    for world in 1..=5i32 {
        for s in [1i64, 7, 29, 64] {
            for tile in [1i64, 4, 128] {
                for docs in [1usize, 3, 9] {
                    if docs as i64 > s {
                        continue;
                    }
                    let what = format!("N={world} S={s} tile={tile} docs={docs}");
                    let cu = random_documents(&mut rng, b, s, docs);
                    let plan = PlanConfig::new(world)
                        .tile(tile)
                        .create(&cu, docs as i64, b as i64, s)
                        .unwrap();
                    let info = plan.info();
                    assert_eq!(
                        (info.world_size, info.batch, info.num_seqs, info.seq_len),
                        (world, b as i64, docs as i64, s),
                        "{what}"
                    );
                    let l = plan.local_len();
                    assert!(l >= (s + world as i64 - 1) / world as i64, "{what}: local_len {l}");

                    // [B, S, 3] with unique values; the shard is [B, L, 3].
                    let values: Vec<i64> = (0..b as i64 * s * 3).map(|x| x + 1).collect();
                    let full = Tensor::new(values.clone(), &[b as i64, s, 3]).unwrap();
                    let mut seen = vec![0; b * s as usize];
                    let mut shards = Vec::new();
                    for rank in 0..world {
                        let pos = plan.positions(rank).unwrap();
                        assert_eq!(pos.len(), b * l as usize, "{what}");
                        let local = full.shard_by_plan(&plan, rank, 1).unwrap();
                        assert_eq!(local.shape(), &[b as i64, l, 3], "{what}");
                        for bi in 0..b {
                            for i in 0..l as usize {
                                let p = pos[bi * l as usize + i];
                                assert!((-1..s).contains(&p), "{what}: position {p}");
                                let got = &local.as_slice()[(bi * l as usize + i) * 3..][..3];
                                if p < 0 {
                                    assert_eq!(got, [0, 0, 0], "{what}: padding is zeros");
                                } else {
                                    seen[bi * s as usize + p as usize] += 1;
                                    assert_eq!(got, &values[(bi * s as usize + p as usize) * 3..][..3], "{what}");
                                }
                            }
                        }
                        // The same through Plan::shard, with the sequence counted from the end.
                        let mut again = Tensor::<i64>::full(&[b as i64, l, 3], -7).unwrap();
                        plan.shard(rank, -2, &full, &mut again).unwrap();
                        assert_eq!(again, local, "{what}");
                        shards.push(local);
                    }
                    assert!(seen.iter().all(|&x| x == 1), "{what}: not every token once");
                    assert_eq!(Tensor::unshard_by_plan(&shards, &plan, 1).unwrap(), full, "{what}");
                }
            }
        }
    }
}

/// One ring on a plan to check.
#[derive(Debug, Clone, Copy)]
struct Case {
    world: i32,
    causal: bool,
    dims: Dims,
    num_seqs: usize,
    tile: i64,
    window: Option<(i64, i64)>,
    /// Pass the boundaries to the calls too (they must be the plan's); else the plan's own apply.
    pass_documents: bool,
    /// A fixed local_len (0: what the plan needs).
    local_len: i64,
    seed: u64,
}

/// Runs one case; Err describes every mismatch.
fn run_case<T: Float>(c: Case) -> Result<(), String> {
    let Dims { b, s, hq, hkv, d } = c.dims;
    let mut rng = Rng::new(c.seed);
    let cu = random_documents(&mut rng, b, s as i64, c.num_seqs);
    let plan = PlanConfig::new(c.world)
        .causal(c.causal)
        .window(c.window)
        .tile(c.tile)
        .local_len(c.local_len)
        .create(&cu, c.num_seqs as i64, b as i64, s as i64)
        .map_err(|e| e.to_string())?;
    let l = plan.local_len() as usize;
    if c.local_len > 0 && l != c.local_len as usize {
        return Err(format!("local_len {l}, configured {}", c.local_len));
    }

    let q = quantize::<T>(&rng.normals(b * s * hq * d));
    let k = quantize::<T>(&rng.normals(b * s * hkv * d));
    let v = quantize::<T>(&rng.normals(b * s * hkv * d));
    let dout = quantize::<T>(&rng.normals(b * s * hq * d));
    let scale = 1.0 / (d as f64).sqrt();
    let want = dense_attention_documents(&q, &k, &v, &dout, c.dims, c.causal, scale, Some(&cu), c.window);

    let tensor = |x: &[f64], h: usize| Tensor::new(to_t::<T>(x), &[b as i64, s as i64, h as i64, d as i64]).unwrap();
    let (qf, kf, vf, df) = (tensor(&q, hq), tensor(&k, hkv), tensor(&v, hkv), tensor(&dout, hq));
    let params = AttentionParams {
        causal: c.causal,
        window: c.window,
        documents: if c.pass_documents {
            Some(Documents::per_row(&cu))
        } else {
            None
        },
        plan: Some(&plan),
        ..Default::default()
    };
    let nan = |h: usize| Tensor::full(&[b as i64, l as i64, h as i64, d as i64], T::nan()).unwrap();
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(60));
    let mut group = LocalGroup::new(c.world as usize, &config).map_err(|e| e.to_string())?;
    type Outputs<T> = (Tensor<T>, Tensor<f32>, Tensor<T>, Tensor<T>, Tensor<T>);
    let results = group.run(0..c.world, |ctx, rank| -> stria::Result<Outputs<T>> {
        let shard = |t: &Tensor<T>| t.shard_by_plan(&plan, rank, 1);
        let (q, k, v, dout) = (shard(&qf)?, shard(&kf)?, shard(&vf)?, shard(&df)?);
        let mut out = nan(hq);
        let mut lse = Tensor::full(&[b as i64, hq as i64, l as i64], f32::NAN)?;
        ctx.forward(&params, &q, &k, &v, &mut out, &mut lse)?;
        let (mut dq, mut dk, mut dv) = (nan(hq), nan(hkv), nan(hkv));
        ctx.backward(&params, &q, &k, &v, &out, &lse, &dout, &mut dq, &mut dk, &mut dv)?;
        Ok((out, lse, dq, dk, dv))
    });
    let mut outputs = Vec::new();
    for (r, res) in results.into_iter().enumerate() {
        outputs.push(res.map_err(|e| format!("rank {r}: {e}"))?);
    }

    // Every rank's slots to their global positions; padding slots must be empty rows.
    let mut failures = Vec::new();
    let (mut out, mut lse) = (vec![f64::NAN; want.out.len()], vec![f64::NAN; want.lse.len()]);
    let (mut dq, mut dk, mut dv) = (
        vec![f64::NAN; want.dq.len()],
        vec![f64::NAN; want.dk.len()],
        vec![f64::NAN; want.dv.len()],
    );
    for (r, (o, ls, gq, gk, gv)) in outputs.iter().enumerate() {
        let pos = plan.positions(r as i32).map_err(|e| e.to_string())?;
        let (o, ls) = (to_f64(o.as_slice()), ls.as_slice());
        let (gq, gk, gv) = (to_f64(gq.as_slice()), to_f64(gk.as_slice()), to_f64(gv.as_slice()));
        let mut padding_bad = 0;
        for bi in 0..b {
            for i in 0..l {
                let slot = bi * l + i;
                let p = pos[slot];
                let (qrow, krow) = (hq * d, hkv * d);
                if p < 0 {
                    padding_bad += o[slot * qrow..][..qrow].iter().filter(|&&x| x != 0.0).count();
                    padding_bad += gq[slot * qrow..][..qrow].iter().filter(|&&x| x != 0.0).count();
                    padding_bad += gk[slot * krow..][..krow].iter().filter(|&&x| x != 0.0).count();
                    padding_bad += gv[slot * krow..][..krow].iter().filter(|&&x| x != 0.0).count();
                    padding_bad += (0..hq)
                        .filter(|h| ls[(bi * hq + h) * l + i] != f32::NEG_INFINITY)
                        .count();
                    continue;
                }
                let t = bi * s + p as usize;
                out[t * qrow..][..qrow].copy_from_slice(&o[slot * qrow..][..qrow]);
                dq[t * qrow..][..qrow].copy_from_slice(&gq[slot * qrow..][..qrow]);
                dk[t * krow..][..krow].copy_from_slice(&gk[slot * krow..][..krow]);
                dv[t * krow..][..krow].copy_from_slice(&gv[slot * krow..][..krow]);
                for h in 0..hq {
                    lse[(bi * hq + h) * s + p as usize] = f64::from(ls[(bi * hq + h) * l + i]);
                }
            }
        }
        if padding_bad > 0 {
            failures.push(format!(
                "rank {r}: {padding_bad} values of padding slots are not empty rows"
            ));
        }
    }
    let tol = T::TOLERANCE;
    for (name, got, want, tol) in [
        ("out", &out, &want.out, tol),
        ("dq", &dq, &want.dq, tol),
        ("dk", &dk, &want.dk, tol),
        ("dv", &dv, &want.dv, tol),
        ("lse", &lse, &want.lse, 1e-5),
    ] {
        let err = rel_error(got, want);
        if err.is_nan() || err >= tol {
            failures.push(format!("{name}: relative error {err:.3e} (tolerance {tol:.0e})"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

fn run_all<T: Float>(cases: &[Case]) {
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|&c| run_case::<T>(c).err().map(|e| format!("{} {c:?}: {e}", T::NAME)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn case(world: i32, causal: bool, s: usize, seed: u64) -> Case {
    Case {
        world,
        causal,
        dims: Dims {
            b: 2,
            s,
            hq: 4,
            hkv: 2,
            d: 8,
        },
        num_seqs: 5,
        tile: 4,
        window: None,
        pass_documents: false,
        local_len: 0,
        seed,
    }
}

/// N = 3 with S = 29 (not divisible), causal and not, the plan's boundaries or the same ones
/// given to the calls; then other rank counts, a window, a fixed local_len and a tile larger than
/// the sequence.
#[test]
fn ring_on_a_plan_matches_reference() {
    let mut cases = Vec::new();
    for causal in [true, false] {
        for pass_documents in [false, true] {
            cases.push(Case {
                pass_documents,
                ..case(3, causal, 29, 100 + cases.len() as u64)
            });
        }
    }
    for world in [1, 2, 4] {
        cases.push(case(world, true, 31, 200 + world as u64));
    }
    cases.push(Case {
        window: Some((5, -1)),
        ..case(3, true, 40, 300)
    });
    cases.push(Case {
        window: Some((4, 3)),
        pass_documents: true,
        ..case(3, false, 40, 301)
    });
    cases.push(Case {
        local_len: 24,
        ..case(3, true, 29, 302)
    });
    cases.push(Case {
        tile: 128,
        num_seqs: 2,
        ..case(3, true, 23, 303)
    });
    run_all::<f32>(&cases);
    run_all::<bf16>(&cases[..2]);
}

#[test]
fn bad_boundaries_and_configs_are_the_librarys_errors() {
    let expect = |res: stria::Result<Plan>, text: &str| {
        let err = res.unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{err}");
        assert!(err.message().contains(text), "expected {text:?} in: {err}");
    };
    let config = PlanConfig::new(4).tile(16);
    expect(config.create(&[0, 5, 3, 10], 3, 1, 10), "decreases");
    expect(config.create(&[0, 5, 9], 2, 1, 10), "ends at 9");
    expect(config.create(&[1, 5, 10], 2, 1, 10), "starts at 1");
    expect(config.create(&[0, 10], 0, 1, 10), "num_seqs 0");
    expect(config.create(&[0, 10], 1, 0, 10), "batch 0");
    expect(config.create(&[], 1, 1, 10), "need 2");
    expect(PlanConfig::new(0).create(&[0, 10], 1, 1, 10), "world_size 0");
    expect(
        config.clone().window(Some((-3, -1))).create(&[0, 10], 1, 1, 10),
        "window_left -3",
    );
    expect(config.clone().local_len(2).create(&[0, 10], 1, 1, 10), "too small");
    let zigzag = config.clone().strategy(PlanStrategy::Layout(Layout::Zigzag));
    expect(zigzag.create(&[0, 10], 1, 1, 10), "10");
    // A slice that does not hold batch rows of num_seqs + 1 is refused before the library reads it.
    let err = config.create(&[0, 4, 10], 1, 2, 10).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("need 4"), "{err}");
    assert!(config.create(&[0, 4], i64::MAX, i64::MAX, 10).is_err());

    let plan = config.create(&[0, 4, 10], 2, 1, 10).unwrap();
    let err = plan.positions(4).unwrap_err();
    assert!(err.message().contains("rank 4"), "{err}");
    assert!(plan.positions(-1).is_err());
    assert!(plan.analyze_balance(0).unwrap_err().message().contains("tile 0"));
    assert!(plan.balance_steps(0).is_err());
    let full = Tensor::<f32>::zeros(&[1, 9, 2]).unwrap(); // 9 tokens for a plan of 10
    let err = full.shard_by_plan(&plan, 0, 1).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(!err.message().is_empty());
    let shards = vec![Tensor::<f32>::zeros(&[1, plan.local_len(), 2]).unwrap(); 3];
    assert!(Tensor::unshard_by_plan(&shards, &plan, 1)
        .unwrap_err()
        .message()
        .contains("3 shards"));
}

/// Calls whose plans do not fit them fail on every rank, and the contexts stay usable: the same
/// group then runs a correct call.
#[test]
fn mismatched_plans_fail_on_every_rank() {
    let (n, s, h, d) = (3i32, 30i64, 2i64, 8i64);
    const CU: &[i64] = &[0, 7, 19, 30];
    const OTHER: &[i64] = &[0, 8, 19, 30];
    let config = PlanConfig::new(n).tile(4);
    let plan = config.create(CU, 3, 1, s).unwrap();
    let other = config.create(OTHER, 3, 1, s).unwrap();
    let wider = PlanConfig::new(n + 1).tile(4).create(CU, 3, 1, s).unwrap();
    let l = plan.local_len();
    let mut group = LocalGroup::new(
        n as usize,
        &Config::new().num_threads(1).timeout(Duration::from_secs(20)),
    )
    .unwrap();

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Mistake {
        OtherPlanOnRankOne,
        OtherBoundaries,
        WrongLength,
        WrongWorld,
        None,
    }
    for mistake in [
        Mistake::OtherPlanOnRankOne,
        Mistake::OtherBoundaries,
        Mistake::WrongLength,
        Mistake::WrongWorld,
        Mistake::None,
    ] {
        let results = group.run(0..n, |ctx, rank| {
            let len = if mistake == Mistake::WrongLength { l + 1 } else { l };
            let q = Tensor::full(&[1, len, h, d], 0.5f32).unwrap();
            let mut out = Tensor::<f32>::zeros(q.shape()).unwrap();
            let mut lse = Tensor::<f32>::zeros(&[1, h, len]).unwrap();
            let params = AttentionParams {
                plan: Some(match mistake {
                    Mistake::OtherPlanOnRankOne if rank == 1 => &other,
                    Mistake::WrongWorld => &wider,
                    _ => &plan,
                }),
                documents: (mistake == Mistake::OtherBoundaries).then(|| Documents::shared(OTHER)),
                ..Default::default()
            };
            ctx.forward(&params, &q, &q, &q, &mut out, &mut lse)
        });
        for (r, res) in results.into_iter().enumerate() {
            if mistake == Mistake::None {
                res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
                continue;
            }
            let err = res.expect_err("a mismatched plan must fail");
            assert_eq!(err.status(), Status::InvalidArgument, "{mistake:?} rank {r}: {err}");
            assert!(!err.message().is_empty());
            if mistake == Mistake::OtherBoundaries {
                assert!(err.message().contains("not the boundaries"), "{err}");
            }
            if mistake == Mistake::WrongLength && r == 0 {
                assert!(err.message().contains("local_len"), "{err}");
            }
        }
    }
}

/// The balance analysis of a plan: its totals are its per-step table's, no ring beats the ideal,
/// and on skewed documents the balancing solver is nearer the ideal than every fixed layout.
#[test]
fn plan_balance() {
    let s = 4096i64;
    let mut rng = Rng::new(3);
    let mut cu = vec![0, 2000];
    while *cu.last().unwrap() < s {
        let len = 1 + (rng.next_u64() % 64) as i64;
        cu.push((cu.last().unwrap() + len).min(s));
    }
    let docs = cu.len() as i64 - 1;
    for world in [2, 4, 8] {
        let config = PlanConfig::new(world).tile(16);
        let plan = config.create(&cu, docs, 1, s).unwrap();
        let b = plan.analyze_balance(16).unwrap();
        let steps = plan.balance_steps(16).unwrap();
        assert_eq!(steps.len(), (world * world) as usize);
        let total: f64 = steps.iter().sum();
        let latency: f64 = steps
            .chunks(world as usize)
            .map(|row| row.iter().cloned().fold(0.0, f64::max))
            .sum();
        assert_eq!(b.total_work, total, "N={world}");
        assert_eq!(b.ring_latency, latency, "N={world}");
        assert!(
            b.ideal_latency > 0.0 && b.ideal_latency <= b.ring_latency,
            "N={world}: {b:?}"
        );
        assert!((b.speedup - total / latency).abs() < 1e-12);
        // The long document travels; the short ones kept whole do not.
        assert!(
            b.kv_rows_sent > 0.0 && b.kv_rows_sent < ((world as i64 - 1) * s) as f64,
            "N={world}: {b:?}"
        );
        let of_ideal = b.ideal_latency / b.ring_latency;
        for layout in Layout::ALL {
            let fixed = config
                .clone()
                .strategy(PlanStrategy::Layout(layout))
                .create(&cu, docs, 1, s)
                .unwrap()
                .analyze_balance(16)
                .unwrap();
            assert!(
                of_ideal > fixed.ideal_latency / fixed.ring_latency,
                "N={world}: the plan ({of_ideal:.3}) is not better than {layout} ({fixed:?})"
            );
        }
    }
}

/// A plan's ring messages carry only what later ranks see: documents of ten tokens, each kept
/// whole on one rank, send nothing at all, where the striped layout sends whole blocks.
#[test]
fn kept_documents_never_travel() {
    let (world, s, h, d) = (3, 240i64, 2i64, 16i64);
    let cu: Vec<i64> = (0..=s).step_by(10).collect();
    let plan = PlanConfig::new(world)
        .tile(64)
        .create(&cu, cu.len() as i64 - 1, 1, s)
        .unwrap();
    assert_eq!(plan.analyze_balance(64).unwrap().kv_rows_sent, 0.0);
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(60));
    let mut group = LocalGroup::new(world as usize, &config).unwrap();
    let results = group.run(
        0..world,
        |ctx, _rank| -> stria::Result<(stria::Traffic, stria::Traffic)> {
            let mut sent = Vec::new();
            for params in [
                AttentionParams::default(),
                AttentionParams {
                    plan: Some(&plan),
                    ..Default::default()
                },
            ] {
                let l = if params.plan.is_some() {
                    plan.local_len()
                } else {
                    s / world as i64
                };
                let x = Tensor::<f32>::full(&[1, l, h, d], 0.5)?;
                let mut out = Tensor::<f32>::zeros(&[1, l, h, d])?;
                let mut lse = Tensor::<f32>::zeros(&[1, h, l])?;
                ctx.forward(&params, &x, &x, &x, &mut out, &mut lse)?;
                let (mut dq, mut dk, mut dv) = (out.clone(), out.clone(), out.clone());
                ctx.backward(&params, &x, &x, &x, &out, &lse, &x, &mut dq, &mut dk, &mut dv)?;
                sent.push(ctx.traffic()?);
            }
            Ok((sent[0], sent[1]))
        },
    );
    for res in results {
        let (layout, planned) = res.unwrap();
        assert!(layout.kv_bytes > 0 && layout.dkv_bytes > 0, "{layout:?}");
        assert_eq!((planned.kv_bytes, planned.dkv_bytes), (0, 0), "{planned:?}");
    }
}

/// One plan serves several threads at once (it is Send and Sync), and is dropped after them.
#[test]
fn a_plan_is_shared_between_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Plan>();
    let plan = PlanConfig::new(4).tile(2).create(&[0, 3, 17, 40], 3, 1, 40).unwrap();
    let want: Vec<Vec<i64>> = (0..4).map(|r| plan.positions(r).unwrap()).collect();
    std::thread::scope(|scope| {
        for _ in 0..4 {
            scope.spawn(|| {
                for _ in 0..200 {
                    for (r, w) in want.iter().enumerate() {
                        assert_eq!(&plan.positions(r as i32).unwrap(), w);
                    }
                }
            });
        }
    });
    let moved = std::thread::spawn(move || plan.local_len()).join().unwrap();
    assert!(moved >= 10);
}
