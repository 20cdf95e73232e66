//! FP8 inputs of the forward: float8_e4m3fn q, k and v ([`F8E4M3`]) with a per-head descale for q
//! and one for k, through a ring of three ranks, against the float64 reference on the values the
//! codes stand for (float32 out: within 1e-5); the codes' conversions; and the refusals.

mod common;

use std::time::Duration;

use common::{dense_attention, rel_error, Dims, Rng};
use stria::{shard, unshard, AttentionParams, Config, Descales, Layout, LocalGroup, Status, Tensor, F8E4M3};

#[test]
fn codes_convert_both_ways() {
    assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
    assert_eq!(F8E4M3(0x7e).to_f32(), 448.0);
    assert_eq!(F8E4M3(0x01).to_f32(), 1.0 / 512.0);
    assert!(F8E4M3(0x7f).to_f32().is_nan());
    for code in 0..=255u8 {
        let x = F8E4M3(code).to_f32();
        if !x.is_nan() {
            assert_eq!(F8E4M3::from_f32(x), F8E4M3(code), "code {code:#x}");
        }
    }
    assert_eq!(F8E4M3::from_f32(1000.0), F8E4M3(0x7e)); // saturates
    assert_eq!(F8E4M3::from_f32(1.0625), F8E4M3(0x38)); // a tie: the even code (1.0)
}

#[test]
fn forward_matches_reference() {
    let dims = Dims {
        b: 1,
        s: 24,
        hq: 4,
        hkv: 2,
        d: 16,
    };
    let Dims { b, s, hq, hkv, d } = dims;
    let (n, l) = (3usize, 8usize);
    let mut rng = Rng::new(5);
    // q's codes under a per-head scale, k's under one scale, v's under none.
    let q_scale: Vec<f32> = (0..hq).map(|h| 0.01 * (h + 1) as f32).collect();
    let k_scale = [0.02f32];
    let codes = |x: Vec<f64>, scale: &dyn Fn(usize) -> f32| -> Vec<F8E4M3> {
        x.iter()
            .enumerate()
            .map(|(i, &v)| F8E4M3::from_f32(v as f32 / scale(i)))
            .collect()
    };
    let q8 = codes(rng.normals(b * s * hq * d), &|i| q_scale[(i / d) % hq]);
    let k8 = codes(rng.normals(b * s * hkv * d), &|_| k_scale[0]);
    let v8 = codes(rng.normals(b * s * hkv * d), &|_| 1.0);
    // The values the attention sees, rounded to float32 as the widening rounds them.
    let values = |c: &[F8E4M3], scale: &dyn Fn(usize) -> f32| -> Vec<f64> {
        c.iter()
            .enumerate()
            .map(|(i, x)| f64::from(x.to_f32() * scale(i)))
            .collect()
    };
    let q = values(&q8, &|i| q_scale[(i / d) % hq]);
    let k = values(&k8, &|_| k_scale[0]);
    let v = values(&v8, &|_| 1.0);
    let want = dense_attention(
        &q,
        &k,
        &v,
        &vec![0.0; b * s * hq * d],
        dims,
        true,
        1.0 / (d as f64).sqrt(),
    );

    let full = |x: Vec<F8E4M3>, h: usize| Tensor::new(x, &[b as i64, s as i64, h as i64, d as i64]).unwrap();
    let (qf, kf, vf) = (full(q8, hq), full(k8, hkv), full(v8, hkv));
    let qs = Tensor::new(q_scale.clone(), &[hq as i64]).unwrap();
    let ks = Tensor::new(k_scale.to_vec(), &[1]).unwrap();
    let params = AttentionParams {
        descales: Descales::none().q(&qs).k(&ks),
        ..Default::default()
    };
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(60));
    let mut group = LocalGroup::new(n, &config).unwrap();
    let results = group.run(0..n, |ctx, r| -> stria::Result<(Tensor<f32>, Tensor<f32>)> {
        let (w, rank) = (n as i32, r as i32);
        let local = |h: usize| Tensor::<F8E4M3>::zeros(&[b as i64, l as i64, h as i64, d as i64]).unwrap();
        let (mut ql, mut kl, mut vl) = (local(hq), local(hkv), local(hkv));
        shard(Layout::Striped, w, rank, 1, &qf, &mut ql)?;
        shard(Layout::Striped, w, rank, 1, &kf, &mut kl)?;
        shard(Layout::Striped, w, rank, 1, &vf, &mut vl)?;
        let mut out = Tensor::<f32>::full(&[b as i64, l as i64, hq as i64, d as i64], f32::NAN)?;
        let mut lse = Tensor::<f32>::full(&[b as i64, hq as i64, l as i64], f32::NAN)?;
        ctx.forward(&params, &ql, &kl, &vl, &mut out, &mut lse)?;
        // A descale of the wrong shape: refused, the group usable for the next call.
        let wrong = Tensor::new(vec![1.0f32; 3], &[3]).unwrap();
        let bad = AttentionParams {
            descales: Descales::none().q(&wrong),
            ..Default::default()
        };
        let err = ctx.forward(&bad, &ql, &kl, &vl, &mut out, &mut lse).unwrap_err();
        assert_eq!(err.status(), Status::InvalidArgument, "{err}");
        ctx.forward(&params, &ql, &kl, &vl, &mut out, &mut lse)?;
        Ok((out, lse))
    });
    let mut out = Tensor::<f32>::full(&[b as i64, s as i64, hq as i64, d as i64], f32::NAN).unwrap();
    let mut lse = Tensor::<f32>::full(&[b as i64, hq as i64, s as i64], f32::NAN).unwrap();
    for (r, res) in results.into_iter().enumerate() {
        let (o, z) = res.unwrap_or_else(|e| panic!("rank {r}: {e}"));
        unshard(Layout::Striped, n as i32, r as i32, 1, &o, &mut out).unwrap();
        unshard(Layout::Striped, n as i32, r as i32, 2, &z, &mut lse).unwrap();
    }
    let f64s = |t: &Tensor<f32>| t.as_slice().iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let (e_out, e_lse) = (rel_error(&f64s(&out), &want.out), rel_error(&f64s(&lse), &want.lse));
    assert!(e_out < 1e-5 && e_lse < 1e-5, "out {e_out:.3e}, lse {e_lse:.3e}");
}
