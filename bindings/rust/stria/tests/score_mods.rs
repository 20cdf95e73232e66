//! Logit softcapping and attention sinks through the ring, against the float64 reference of the
//! whole sequence: out, lse, dq, dk, dv, and the sinks' gradient summed over the ranks; with packed
//! documents and a window in the same params.

mod common;

use std::time::Duration;

use common::{dense_attention_mods, rel_error, Dims, Mods, Rng};
use stria::{shard, unshard, AttentionParams, Config, Documents, Layout, LocalGroup, Sinks, Tensor};

struct Case {
    world: usize,
    layout: Layout,
    causal: bool,
    softcap: Option<f32>,
    sinks: bool,
    documents: Option<&'static [i64]>,
    window: Option<(i64, i64)>,
}

fn run(c: &Case) -> Result<(), String> {
    let dims = Dims {
        b: 1,
        s: 24,
        hq: 4,
        hkv: 2,
        d: 16,
    };
    let Dims { b, s, hq, hkv, d } = dims;
    let (n, l) = (c.world, s / c.world);
    let mut rng = Rng::new(17 + c.world as u64);
    let spread = |x: Vec<f64>| x.into_iter().map(|v| (2.0 * v) as f32 as f64).collect::<Vec<f64>>();
    let q = spread(rng.normals(b * s * hq * d));
    let k = spread(rng.normals(b * s * hkv * d));
    let v: Vec<f64> = rng
        .normals(b * s * hkv * d)
        .into_iter()
        .map(|x| x as f32 as f64)
        .collect();
    let dout: Vec<f64> = rng
        .normals(b * s * hq * d)
        .into_iter()
        .map(|x| x as f32 as f64)
        .collect();
    // One head without a sink (-inf), the others around the rows' LSE.
    let z: Vec<f64> = (0..hq)
        .map(|h| if h == 1 { f64::NEG_INFINITY } else { 0.5 + h as f64 })
        .collect();
    let mods = Mods {
        softcap: c.softcap.map_or(0.0, f64::from),
        sinks: if c.sinks { Some(&z) } else { None },
    };
    let docs = c.documents.map(|x| x.repeat(b));
    let scale = 1.0 / (d as f64).sqrt();
    let want = dense_attention_mods(
        &q,
        &k,
        &v,
        &dout,
        dims,
        c.causal,
        scale,
        docs.as_deref(),
        c.window,
        mods,
    );

    let full = |x: &[f64], h: usize| {
        Tensor::new(
            x.iter().map(|&e| e as f32).collect(),
            &[b as i64, s as i64, h as i64, d as i64],
        )
        .unwrap()
    };
    let (qf, kf, vf, df) = (full(&q, hq), full(&k, hkv), full(&v, hkv), full(&dout, hq));
    let logits = Tensor::new(z.iter().map(|&x| x as f32).collect(), &[hq as i64]).unwrap();
    let params = AttentionParams {
        layout: c.layout,
        causal: c.causal,
        documents: c.documents.map(Documents::shared),
        window: c.window,
        softcap: c.softcap,
        sinks: if c.sinks { Some(Sinks::new(&logits)) } else { None },
        ..Default::default()
    };
    let local = |h: usize| Tensor::<f32>::zeros(&[b as i64, l as i64, h as i64, d as i64]).unwrap();
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(60));
    let mut group = LocalGroup::new(n, &config).map_err(|e| e.to_string())?;
    let results = group.run(0..n, |ctx, r| -> stria::Result<Vec<Tensor<f32>>> {
        let (w, rank) = (n as i32, r as i32);
        let (mut ql, mut kl, mut vl, mut dl) = (local(hq), local(hkv), local(hkv), local(hq));
        shard(c.layout, w, rank, 1, &qf, &mut ql)?;
        shard(c.layout, w, rank, 1, &kf, &mut kl)?;
        shard(c.layout, w, rank, 1, &vf, &mut vl)?;
        shard(c.layout, w, rank, 1, &df, &mut dl)?;
        let (mut out, mut dq, mut dk, mut dv) = (local(hq), local(hq), local(hkv), local(hkv));
        let mut lse = Tensor::<f32>::zeros(&[b as i64, hq as i64, l as i64])?;
        let mut dz = Tensor::<f32>::full(&[hq as i64], f32::NAN)?;
        ctx.forward(&params, &ql, &kl, &vl, &mut out, &mut lse)?;
        if c.sinks {
            ctx.backward_with_sinks_grad(
                &params, &ql, &kl, &vl, &out, &lse, &dl, &mut dq, &mut dk, &mut dv, &mut dz,
            )?;
        } else {
            ctx.backward(&params, &ql, &kl, &vl, &out, &lse, &dl, &mut dq, &mut dk, &mut dv)?;
        }
        Ok(vec![out, lse, dq, dk, dv, dz])
    });
    let mut got: Vec<Tensor<f32>> = vec![full(&vec![f64::NAN; b * s * hq * d], hq)];
    got.push(Tensor::full(&[b as i64, hq as i64, s as i64], f32::NAN).unwrap());
    got.push(full(&vec![f64::NAN; b * s * hq * d], hq));
    got.push(full(&vec![f64::NAN; b * s * hkv * d], hkv));
    got.push(full(&vec![f64::NAN; b * s * hkv * d], hkv));
    let mut dsinks = vec![0.0; hq];
    for (r, res) in results.into_iter().enumerate() {
        let parts = res.map_err(|e| format!("rank {r}: {e}"))?;
        for (i, part) in parts.iter().take(5).enumerate() {
            let seq_dim = if i == 1 { 2 } else { 1 };
            unshard(c.layout, n as i32, r as i32, seq_dim, part, &mut got[i]).map_err(|e| e.to_string())?;
        }
        for (h, x) in parts[5].as_slice().iter().enumerate() {
            dsinks[h] += f64::from(*x);
        }
    }
    let f64s = |t: &Tensor<f32>| t.as_slice().iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let mut failures = Vec::new();
    for (name, g, w) in [
        ("out", &got[0], &want.out),
        ("lse", &got[1], &want.lse),
        ("dq", &got[2], &want.dq),
        ("dk", &got[3], &want.dk),
        ("dv", &got[4], &want.dv),
    ] {
        let err = rel_error(&f64s(g), w);
        if !(err < 1e-5) {
            failures.push(format!("{name}: relative error {err:.3e}"));
        }
    }
    if c.sinks {
        let err = rel_error(&dsinks, &want.dsinks);
        if !(err < 1e-5) {
            failures.push(format!(
                "dsinks: relative error {err:.3e} ({dsinks:?} vs {:?})",
                want.dsinks
            ));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

#[test]
fn softcap_and_sinks_match_reference() {
    const DOCS: &[i64] = &[0, 7, 15, 24];
    let mut cases = Vec::new();
    for world in [1, 2, 3] {
        for layout in [Layout::Contiguous, Layout::Striped, Layout::Zigzag] {
            for causal in [true, false] {
                cases.push(Case {
                    world,
                    layout,
                    causal,
                    softcap: Some(5.0),
                    sinks: true,
                    documents: None,
                    window: None,
                });
            }
        }
    }
    cases.push(Case {
        world: 2,
        layout: Layout::Striped,
        causal: true,
        softcap: Some(3.0),
        sinks: false,
        documents: None,
        window: None,
    });
    cases.push(Case {
        world: 3,
        layout: Layout::Contiguous,
        causal: true,
        softcap: None,
        sinks: true,
        documents: None,
        window: None,
    });
    cases.push(Case {
        world: 3,
        layout: Layout::Striped,
        causal: false,
        softcap: Some(4.0),
        sinks: true,
        documents: Some(DOCS),
        window: Some((5, 2)),
    });
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            run(c).err().map(|e| {
                format!(
                    "N{} {:?} causal {} softcap {:?} sinks {}: {e}",
                    c.world, c.layout, c.causal, c.softcap, c.sinks
                )
            })
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
