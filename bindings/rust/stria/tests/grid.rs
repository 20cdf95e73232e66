//! A grid of all-to-all groups within a ring ([`Context::set_grid`]) against the float64 reference
//! of the whole sequence: forward and backward, with softcap and sinks, on a layout or on a
//! document plan; the grid's positions, its traffic, and a grid that does not divide the world.

mod common;

use std::time::Duration;

use common::{dense_attention_mods, rel_error, Dims, Mods, Rng};
use stria::{
    grid_shard, grid_unshard, AttentionParams, Config, Layout, LocalGroup, Plan, PlanConfig, Sinks, Status, Tensor,
};

/// With `documents` (one batch row's boundaries), on a plan made for the ring of groups from them.
fn run(ulysses: usize, ring: usize, layout: Layout, causal: bool, documents: Option<&[i64]>) -> Result<(), String> {
    let dims = Dims {
        b: 1,
        s: 24,
        hq: 4,
        hkv: 2,
        d: 16,
    };
    let Dims { b, s, hq, hkv, d } = dims;
    let n = ulysses * ring;
    let plan = match documents {
        Some(cu) => Some(plan_on_grid(cu, ring, ulysses, causal, s).map_err(|e| e.to_string())?),
        None => None,
    };
    let l = plan.as_ref().map_or(s / n, |p| p.local_len() as usize / ulysses);
    let mut rng = Rng::new(5 + n as u64);
    let mut draw = |count: usize| -> Vec<f64> { rng.normals(count).into_iter().map(|x| x as f32 as f64).collect() };
    let (q, k, v, dout) = (
        draw(b * s * hq * d),
        draw(b * s * hkv * d),
        draw(b * s * hkv * d),
        draw(b * s * hq * d),
    );
    let z: Vec<f64> = (0..hq).map(|h| 0.25 * h as f64).collect();
    let mods = Mods {
        softcap: 5.0,
        sinks: Some(&z),
    };
    let scale = 1.0 / (d as f64).sqrt();
    let want = dense_attention_mods(&q, &k, &v, &dout, dims, causal, scale, documents, None, mods);
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
        layout,
        causal,
        softcap: Some(5.0),
        sinks: Some(Sinks::new(&logits)),
        plan: plan.as_ref(),
        ..Default::default()
    };
    let local = |h: usize| Tensor::<f32>::zeros(&[b as i64, l as i64, h as i64, d as i64]).unwrap();
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(60));
    let mut group = LocalGroup::new(n, &config).map_err(|e| e.to_string())?;
    for ctx in group.contexts_mut() {
        ctx.set_grid(ulysses as i32).map_err(|e| e.to_string())?;
    }
    let (w, u) = (n as i32, ulysses as i32);
    let shard = |rank: i32, full: &Tensor<f32>, local: &mut Tensor<f32>| match &plan {
        Some(p) => p.grid_shard(u, rank, 1, full, local),
        None => grid_shard(layout, w, u, rank, 1, full, local),
    };
    let results = group.run(0..n, |ctx, r| -> stria::Result<Vec<Tensor<f32>>> {
        let rank = r as i32;
        assert_eq!(ctx.grid()?, u);
        let (mut ql, mut kl, mut vl, mut dl) = (local(hq), local(hkv), local(hkv), local(hq));
        shard(rank, &qf, &mut ql)?;
        shard(rank, &kf, &mut kl)?;
        shard(rank, &vf, &mut vl)?;
        shard(rank, &df, &mut dl)?;
        let (mut out, mut dq, mut dk, mut dv) = (local(hq), local(hq), local(hkv), local(hkv));
        let mut lse = Tensor::<f32>::zeros(&[b as i64, hq as i64, l as i64])?;
        let mut dz = Tensor::<f32>::full(&[hq as i64], f32::NAN)?;
        ctx.forward(&params, &ql, &kl, &vl, &mut out, &mut lse)?;
        if ulysses > 1 {
            assert!(ctx.traffic()?.all_to_all_bytes > 0);
        }
        ctx.backward_with_sinks_grad(
            &params, &ql, &kl, &vl, &out, &lse, &dl, &mut dq, &mut dk, &mut dv, &mut dz,
        )?;
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
            match &plan {
                Some(p) => p.grid_unshard(u, r as i32, seq_dim, part, &mut got[i]),
                None => grid_unshard(layout, w, u, r as i32, seq_dim, part, &mut got[i]),
            }
            .map_err(|e| e.to_string())?;
        }
        for (h, x) in parts[5].as_slice().iter().enumerate() {
            dsinks[h] += f64::from(*x);
        }
    }
    let f64s = |t: &Tensor<f32>| t.as_slice().iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let mut failures = Vec::new();
    for (name, g, want) in [
        ("out", f64s(&got[0]), &want.out),
        ("lse", f64s(&got[1]), &want.lse),
        ("dq", f64s(&got[2]), &want.dq),
        ("dk", f64s(&got[3]), &want.dk),
        ("dv", f64s(&got[4]), &want.dv),
        ("dsinks", dsinks, &want.dsinks),
    ] {
        let err = rel_error(&g, want);
        if !(err < 1e-5) {
            failures.push(format!("{name}: relative error {err:.3e}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

#[test]
fn grids_match_reference() {
    let mut failures = Vec::new();
    for (ulysses, ring) in [(2, 2), (4, 1), (2, 3), (1, 3)] {
        for layout in Layout::ALL {
            for causal in [true, false] {
                if let Err(e) = run(ulysses, ring, layout, causal, None) {
                    failures.push(format!("{ulysses}x{ring} {layout} causal {causal}: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A plan made for the ring of groups, its local_len a multiple of U (each group's slots are cut
/// into U pieces).
fn plan_on_grid(cu: &[i64], ring: usize, ulysses: usize, causal: bool, s: usize) -> stria::Result<Plan> {
    let num_seqs = cu.len() as i64 - 1;
    let config = PlanConfig::new(ring as i32).causal(causal).tile(4);
    let plan = config.create(cu, num_seqs, 1, s as i64)?;
    let u = ulysses as i64;
    if plan.local_len() % u == 0 {
        return Ok(plan);
    }
    config
        .local_len((plan.local_len() + u - 1) / u * u)
        .create(cu, num_seqs, 1, s as i64)
}

#[test]
fn plans_on_grids_match_reference() {
    let documents: [i64; 5] = [0, 3, 11, 12, 24];
    let mut failures = Vec::new();
    for (ulysses, ring) in [(2, 2), (2, 3), (4, 1)] {
        for causal in [true, false] {
            if let Err(e) = run(ulysses, ring, Layout::Striped, causal, Some(&documents)) {
                failures.push(format!("{ulysses}x{ring} plan causal {causal}: {e}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn grid_positions_are_pieces_of_the_rings_shares() {
    for layout in Layout::ALL {
        let ring = layout.positions(24, 2, 1).unwrap();
        let mut joined = layout.grid_positions(24, 6, 3, 3).unwrap();
        joined.extend(layout.grid_positions(24, 6, 3, 4).unwrap());
        joined.extend(layout.grid_positions(24, 6, 3, 5).unwrap());
        assert_eq!(joined, ring, "{layout}");
    }
    let err = Layout::Striped.grid_positions(16, 4, 3, 0).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("divide world_size"), "{}", err.message());
}

#[test]
fn a_grid_that_does_not_divide_the_world_is_refused() {
    let config = Config::new().num_threads(1);
    let mut group = LocalGroup::new(4, &config).unwrap();
    let ctx = &mut group.contexts_mut()[0];
    let err = ctx.set_grid(3).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(ctx.grid().unwrap(), 1);
    ctx.set_grid(4).unwrap();
    assert_eq!(ctx.grid().unwrap(), 4);
}
