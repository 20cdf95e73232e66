//! Decode over a KV cache sharded across the ranks of a local group, against a float64 reference
//! over the whole cache: contiguous and paged caches, new tokens appended, a window, softcap and
//! sinks; every rank the same bits; and the lengths checked against q's batch.

mod common;

use common::{rel_error, Rng};
use stria::{AttentionParams, Config, KvCache, Layout, LocalGroup, NewTokens, PrefillMode, Sinks, Tensor};

const B: usize = 2;
const T: usize = 2;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 8;

/// float64 out [B, T, Hq, D]: query t of sequence b at position lens[b] + t against keys
/// 0 .. lens[b] + T of k, v [B, S, Hkv, D] (causal; within `window` behind the query if set).
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    s: usize,
    lens: &[i64],
    window: i64,
    softcap: f64,
    sinks: Option<&[f64]>,
) -> Vec<f64> {
    let mut out = vec![0.0; B * T * HQ * D];
    let scale = 1.0 / (D as f64).sqrt();
    for b in 0..B {
        for t in 0..T {
            let p = lens[b] as usize + t;
            for h in 0..HQ {
                let hk = h / (HQ / HKV);
                let keys: Vec<usize> = (0..=p).filter(|&j| window < 0 || (p - j) as i64 <= window).collect();
                let scores: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        let x: f64 = (0..D)
                            .map(|d| q[((b * T + t) * HQ + h) * D + d] * k[((b * s + j) * HKV + hk) * D + d])
                            .sum::<f64>()
                            * scale;
                        if softcap > 0.0 {
                            softcap * (x / softcap).tanh()
                        } else {
                            x
                        }
                    })
                    .collect();
                let z = sinks.map_or(f64::NEG_INFINITY, |z| z[h]);
                let m = scores.iter().cloned().fold(z, f64::max);
                let total: f64 = scores.iter().map(|x| (x - m).exp()).sum::<f64>() + (z - m).exp();
                for (i, &j) in keys.iter().enumerate() {
                    let w = (scores[i] - m).exp() / total;
                    for d in 0..D {
                        out[((b * T + t) * HQ + h) * D + d] += w * v[((b * s + j) * HKV + hk) * D + d];
                    }
                }
            }
        }
    }
    out
}

fn run(n: usize, paged: bool, window: i64, softcap: Option<f32>, with_sinks: bool) {
    let capacity = 12usize;
    let s = n * capacity;
    let lens: Vec<i64> = vec![5, (s - T) as i64];
    let mut rng = Rng::new(3 + n as u64);
    let round = |x: Vec<f64>| x.into_iter().map(|v| v as f32 as f64).collect::<Vec<f64>>();
    let k = round(rng.normals(B * s * HKV * D));
    let v = round(rng.normals(B * s * HKV * D));
    let q = round(rng.normals(B * T * HQ * D));
    let z: Vec<f64> = (0..HQ).map(|h| 0.3 * h as f64).collect();
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    let qt = Tensor::new(f32s(&q), &[B as i64, T as i64, HQ as i64, D as i64]).unwrap();
    let zt = Tensor::new(f32s(&z), &[HQ as i64]).unwrap();
    let mut k_new = vec![0f32; B * T * HKV * D];
    let mut v_new = vec![0f32; B * T * HKV * D];
    for b in 0..B {
        for t in 0..T {
            for i in 0..HKV * D {
                let src = (b * s + lens[b] as usize + t) * HKV * D + i;
                k_new[(b * T + t) * HKV * D + i] = k[src] as f32;
                v_new[(b * T + t) * HKV * D + i] = v[src] as f32;
            }
        }
    }
    let kn = Tensor::new(k_new, &[B as i64, T as i64, HKV as i64, D as i64]).unwrap();
    let vn = Tensor::new(v_new, &[B as i64, T as i64, HKV as i64, D as i64]).unwrap();
    let want = reference(
        &q,
        &k,
        &v,
        s,
        &lens,
        window,
        softcap.map_or(0.0, f64::from),
        if with_sinks { Some(&z) } else { None },
    );

    let mut group = LocalGroup::new(n, &Config::new()).unwrap();
    let outs = group.run(0..n, |ctx, rank| -> stria::Result<Vec<f32>> {
        // This rank's striped share of the prefix: position t on rank t % n, slot t / n.
        let mut kc = vec![f32::NAN; B * capacity * HKV * D];
        let mut vc = vec![f32::NAN; B * capacity * HKV * D];
        for b in 0..B {
            for t in (rank..lens[b] as usize).step_by(n) {
                for i in 0..HKV * D {
                    kc[(b * capacity + t / n) * HKV * D + i] = k[(b * s + t) * HKV * D + i] as f32;
                    vc[(b * capacity + t / n) * HKV * D + i] = v[(b * s + t) * HKV * D + i] as f32;
                }
            }
        }
        let blocks = capacity / 4;
        let (shape, table) = if paged {
            // Pools of blocks of 4 slots, sequence b's blocks in reverse order.
            let mut pk = vec![f32::NAN; kc.len()];
            let mut pv = vec![f32::NAN; vc.len()];
            let table: Vec<i32> = (0..B * blocks).map(|i| (B * blocks - 1 - i) as i32).collect();
            let block = 4 * HKV * D;
            for b in 0..B {
                for i in 0..blocks {
                    let dst = table[b * blocks + i] as usize * block;
                    let src = (b * capacity + i * 4) * HKV * D;
                    pk[dst..dst + block].copy_from_slice(&kc[src..src + block]);
                    pv[dst..dst + block].copy_from_slice(&vc[src..src + block]);
                }
            }
            kc = pk;
            vc = pv;
            (
                [(B * blocks) as i64, 4, HKV as i64, D as i64],
                Some(Tensor::new(table, &[B as i64, blocks as i64])?),
            )
        } else {
            ([B as i64, capacity as i64, HKV as i64, D as i64], None)
        };
        let mut kt = Tensor::new(kc, &shape)?;
        let mut vt = Tensor::new(vc, &shape)?;
        let mut cache = match &table {
            Some(table) => KvCache::paged(&mut kt, &mut vt, table, &lens),
            None => KvCache::contiguous(&mut kt, &mut vt, &lens),
        };
        let params = AttentionParams {
            layout: Layout::Striped,
            window: if window >= 0 { Some((window, -1)) } else { None },
            softcap,
            sinks: if with_sinks { Some(Sinks::new(&zt)) } else { None },
            ..Default::default()
        };
        let mut out = Tensor::<f32>::zeros(qt.shape())?;
        let mut lse = Tensor::<f32>::zeros(&[B as i64, HQ as i64, T as i64])?;
        ctx.decode(
            &params,
            &mut cache,
            &qt,
            Some(NewTokens { k: &kn, v: &vn }),
            &mut out,
            Some(&mut lse),
        )?;
        Ok(out.into_vec())
    });
    let outs: Vec<Vec<f32>> = outs.into_iter().collect::<stria::Result<_>>().unwrap();
    for out in &outs {
        let got: Vec<f64> = out.iter().map(|&x| f64::from(x)).collect();
        let err = rel_error(&got, &want);
        assert!(err < 1e-5, "N {n} paged {paged}: relative error {err}");
        assert_eq!(out, &outs[0], "every rank gives the same bits");
    }
}

#[test]
fn decode_matches_one_device() {
    for n in [1, 2, 3] {
        run(n, false, -1, None, false);
        run(n, true, -1, None, false);
    }
    run(3, true, 7, Some(3.0), true);
}

#[test]
fn decode_checks_lengths_against_the_batch() {
    let mut ctx = stria::Context::new(&Config::new()).unwrap();
    let q = Tensor::<f32>::zeros(&[2, 1, HQ as i64, D as i64]).unwrap();
    let mut k = Tensor::<f32>::zeros(&[2, 4, HKV as i64, D as i64]).unwrap();
    let mut v = Tensor::<f32>::zeros(&[2, 4, HKV as i64, D as i64]).unwrap();
    let lens = [1i64];
    let mut cache = KvCache::contiguous(&mut k, &mut v, &lens);
    let mut out = Tensor::<f32>::zeros(q.shape()).unwrap();
    let err = ctx
        .decode(&AttentionParams::default(), &mut cache, &q, None, &mut out, None)
        .unwrap_err();
    assert!(err.to_string().contains("one length each"), "{err}");
}

#[test]
fn prefill_matches_one_device_in_every_mode() {
    // A prompt of P = 6 tokens per sequence sharded striped over 3 ranks after a cached prefix, in
    // each mode.
    let n = 3usize;
    let capacity = 12usize;
    let s = n * capacity;
    let p = 6usize;
    let lens: Vec<i64> = vec![4, 20];
    let mut rng = Rng::new(99);
    let round = |x: Vec<f64>| x.into_iter().map(|v| v as f32 as f64).collect::<Vec<f64>>();
    let k = round(rng.normals(B * s * HKV * D));
    let v = round(rng.normals(B * s * HKV * D));
    let qf = round(rng.normals(B * p * HQ * D));
    let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<f32>>();
    // The reference of query c (chunk position) of sequence b at position lens[b] + c.
    let mut want = vec![0.0; B * p * HQ * D];
    for b in 0..B {
        let mut qb = vec![0.0; p * HQ * D];
        qb.copy_from_slice(&qf[b * p * HQ * D..(b + 1) * p * HQ * D]);
        for c in 0..p {
            let one: Vec<f64> = [
                qb[c * HQ * D..(c + 1) * HQ * D].to_vec(),
                qb[c * HQ * D..(c + 1) * HQ * D].to_vec(),
            ]
            .concat();
            // reference() takes B = 2 sequences of T = 2 queries: use sequence b twice, query c twice.
            let mut kk = vec![0.0; B * s * HKV * D];
            let mut vv = vec![0.0; B * s * HKV * D];
            for bb in 0..B {
                kk[bb * s * HKV * D..(bb + 1) * s * HKV * D]
                    .copy_from_slice(&k[b * s * HKV * D..(b + 1) * s * HKV * D]);
                vv[bb * s * HKV * D..(bb + 1) * s * HKV * D]
                    .copy_from_slice(&v[b * s * HKV * D..(b + 1) * s * HKV * D]);
            }
            let qq = [one.clone(), one].concat();
            let pos = lens[b] + c as i64;
            let r = reference(&qq, &kk, &vv, s, &[pos, pos], -1, 0.0, None);
            want[(b * p + c) * HQ * D..(b * p + c + 1) * HQ * D].copy_from_slice(&r[..HQ * D]);
        }
    }
    for mode in [PrefillMode::PassKv, PrefillMode::PassQ, PrefillMode::Auto] {
        let mut group = LocalGroup::new(n, &Config::new()).unwrap();
        let outs = group.run(0..n, |ctx, rank| -> stria::Result<(Vec<i64>, Vec<f32>)> {
            let l = p / n;
            let mine = Layout::Striped.positions(p as i64, n as i32, rank as i32)?;
            let mut kc = vec![f32::NAN; B * capacity * HKV * D];
            let mut vc = vec![f32::NAN; B * capacity * HKV * D];
            for b in 0..B {
                for t in (rank..lens[b] as usize).step_by(n) {
                    for i in 0..HKV * D {
                        kc[(b * capacity + t / n) * HKV * D + i] = k[(b * s + t) * HKV * D + i] as f32;
                        vc[(b * capacity + t / n) * HKV * D + i] = v[(b * s + t) * HKV * D + i] as f32;
                    }
                }
            }
            let (mut ql, mut kl, mut vl) = (vec![], vec![], vec![]);
            for b in 0..B {
                for &c in &mine {
                    let c = c as usize;
                    ql.extend(f32s(&qf[(b * p + c) * HQ * D..(b * p + c + 1) * HQ * D]));
                    let at = b * s + lens[b] as usize + c;
                    kl.extend(f32s(&k[at * HKV * D..(at + 1) * HKV * D]));
                    vl.extend(f32s(&v[at * HKV * D..(at + 1) * HKV * D]));
                }
            }
            let shape_q = [B as i64, l as i64, HQ as i64, D as i64];
            let shape_kv = [B as i64, l as i64, HKV as i64, D as i64];
            let (q, kt, vt) = (
                Tensor::new(ql, &shape_q)?,
                Tensor::new(kl, &shape_kv)?,
                Tensor::new(vl, &shape_kv)?,
            );
            let cshape = [B as i64, capacity as i64, HKV as i64, D as i64];
            let mut kct = Tensor::new(kc, &cshape)?;
            let mut vct = Tensor::new(vc, &cshape)?;
            let mut cache = KvCache::contiguous(&mut kct, &mut vct, &lens);
            let mut out = Tensor::<f32>::zeros(&shape_q)?;
            ctx.prefill(
                &AttentionParams::default(),
                &mut cache,
                mode,
                &q,
                &kt,
                &vt,
                &mut out,
                None,
            )?;
            Ok((mine, out.into_vec()))
        });
        for result in outs {
            let (mine, out) = result.unwrap();
            let l = p / n;
            for b in 0..B {
                for (i, &c) in mine.iter().enumerate() {
                    let got: Vec<f64> = out[(b * l + i) * HQ * D..(b * l + i + 1) * HQ * D]
                        .iter()
                        .map(|&x| f64::from(x))
                        .collect();
                    let c = c as usize;
                    let err = rel_error(&got, &want[(b * p + c) * HQ * D..(b * p + c + 1) * HQ * D]);
                    assert!(
                        err < 1e-5,
                        "{mode:?}: sequence {b} chunk position {c}: relative error {err}"
                    );
                }
            }
        }
    }
}
