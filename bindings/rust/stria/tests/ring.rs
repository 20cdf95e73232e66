//! Rings of 1 to 4 ranks in threads (a local group) against a float64 dense reference of the
//! whole sequence: every layout, causal and not, GQA/MQA, f32/f16/bf16, forward and backward.
//! Rank inputs are cut from the full sequence with the normative layout table (not the
//! library's shard), outputs are poisoned with NaN first, and one pass runs every tensor as a
//! strided view (q, k, v inside one packed QKV buffer; outputs with padded rows that must stay
//! untouched).

mod common;

use std::time::Duration;

use common::*;
use stria::half::{bf16, f16};
use stria::{AttentionParams, Config, Documents, Layout, LocalGroup, TensorView, TensorViewMut};

/// One ring to check.
#[derive(Debug, Clone, Copy)]
struct Case {
    world: usize,
    layout: Layout,
    causal: bool,
    dims: Dims,
    scale: Option<f32>,
    strided: bool,
    seed: u64,
    /// Packed documents: boundaries, and whether they are a row per batch row (else shared).
    docs: Option<(&'static [i64], bool)>,
    /// A sliding window (left, right).
    window: Option<(i64, i64)>,
}

/// A rank's tensor of logical `shape` stored with `pad` extra elements after every last-dim
/// row (pad 0: compact), the padding filled with a sentinel.
struct Padded<T> {
    data: Vec<T>,
    shape: Vec<usize>,
    pad: usize,
}

const SENTINEL: f64 = 7.25;

impl<T: Float> Padded<T> {
    fn new(values: &[f64], shape: &[usize], pad: usize) -> Padded<T> {
        let row = *shape.last().unwrap();
        let mut data = Vec::with_capacity(values.len() / row * (row + pad));
        for chunk in values.chunks(row) {
            data.extend(chunk.iter().map(|&x| T::from_f64(x)));
            data.extend((0..pad).map(|_| T::from_f64(SENTINEL)));
        }
        Padded {
            data,
            shape: shape.to_vec(),
            pad,
        }
    }

    fn poisoned(shape: &[usize], pad: usize) -> Padded<T> {
        Self::new(&vec![f64::NAN; shape.iter().product()], shape, pad)
    }

    fn shape_i64(&self) -> Vec<i64> {
        self.shape.iter().map(|&x| x as i64).collect()
    }

    fn strides(&self) -> Vec<i64> {
        let mut strides = vec![1i64; self.shape.len()];
        let mut step = (self.shape[self.shape.len() - 1] + self.pad) as i64;
        for i in (0..self.shape.len() - 1).rev() {
            strides[i] = step;
            step *= self.shape[i] as i64;
        }
        strides
    }

    fn view(&self) -> TensorView<'_> {
        if self.pad == 0 {
            TensorView::new(&self.data, &self.shape_i64()).unwrap()
        } else {
            TensorView::with_strides(&self.data, &self.shape_i64(), &self.strides()).unwrap()
        }
    }

    fn view_mut(&mut self) -> TensorViewMut<'_> {
        let (shape, strides) = (self.shape_i64(), self.strides());
        if self.pad == 0 {
            TensorViewMut::new(&mut self.data, &shape).unwrap()
        } else {
            TensorViewMut::with_strides(&mut self.data, &shape, &strides).unwrap()
        }
    }

    /// The logical values, and whether every padding element still holds the sentinel.
    fn values(&self) -> (Vec<f64>, bool) {
        let row = *self.shape.last().unwrap();
        let mut values = Vec::new();
        let mut intact = true;
        for chunk in self.data.chunks(row + self.pad) {
            values.extend(chunk[..row].iter().map(|x| x.to_f64()));
            intact &= chunk[row..].iter().all(|x| x.to_f64() == SENTINEL);
        }
        (values, intact)
    }
}

/// q, k and v of one rank side by side in one [B, L, Hq + 2·Hkv, D] buffer (as a fused QKV
/// projection leaves them), or in three compact buffers.
struct Qkv<T> {
    packed: Option<Vec<T>>,
    separate: [Vec<T>; 3],
    dims: Dims, // s = this rank's L
}

impl<T: Float> Qkv<T> {
    fn new(q: &[f64], k: &[f64], v: &[f64], dims: Dims, packed: bool) -> Qkv<T> {
        let Dims { b, s: l, hq, hkv, d } = dims;
        if !packed {
            return Qkv {
                packed: None,
                separate: [to_t(q), to_t(k), to_t(v)],
                dims,
            };
        }
        let mut buf = Vec::with_capacity(b * l * (hq + 2 * hkv) * d);
        for t in 0..b * l {
            buf.extend(q[t * hq * d..][..hq * d].iter().map(|&x| T::from_f64(x)));
            buf.extend(k[t * hkv * d..][..hkv * d].iter().map(|&x| T::from_f64(x)));
            buf.extend(v[t * hkv * d..][..hkv * d].iter().map(|&x| T::from_f64(x)));
        }
        Qkv {
            packed: Some(buf),
            separate: [Vec::new(), Vec::new(), Vec::new()],
            dims,
        }
    }

    fn views(&self) -> [TensorView<'_>; 3] {
        let Dims { b, s: l, hq, hkv, d } = self.dims;
        let (b, l, hq, hkv, d) = (b as i64, l as i64, hq as i64, hkv as i64, d as i64);
        match &self.packed {
            None => [
                TensorView::new(&self.separate[0], &[b, l, hq, d]).unwrap(),
                TensorView::new(&self.separate[1], &[b, l, hkv, d]).unwrap(),
                TensorView::new(&self.separate[2], &[b, l, hkv, d]).unwrap(),
            ],
            Some(buf) => {
                let heads = hq + 2 * hkv;
                let strides = [l * heads * d, heads * d, d, 1];
                let at = |heads_before: i64| &buf[(heads_before * d) as usize..];
                [
                    TensorView::with_strides(at(0), &[b, l, hq, d], &strides).unwrap(),
                    TensorView::with_strides(at(hq), &[b, l, hkv, d], &strides).unwrap(),
                    TensorView::with_strides(at(hq + hkv), &[b, l, hkv, d], &strides).unwrap(),
                ]
            }
        }
    }
}

/// One rank's inputs and outputs.
struct RankIo<T> {
    qkv: Qkv<T>,
    dout: Padded<T>,
    out: Padded<T>,
    lse: Padded<f32>,
    dq: Padded<T>,
    dk: Padded<T>,
    dv: Padded<T>,
}

/// Reads one output of a rank: its values, and whether its padding is intact.
type Pick<'a, T> = dyn Fn(&RankIo<T>) -> (Vec<f64>, bool) + 'a;

/// Runs one case; Err describes every mismatch.
fn run_case<T: Float>(c: Case) -> Result<(), String> {
    let Dims { b, s, hq, hkv, d } = c.dims;
    let (n, layout) = (c.world, c.layout);
    let l = s / n;
    let mut rng = Rng::new(c.seed);
    // The inputs as the library will see them (rounded to T), so only its arithmetic is judged.
    let q = quantize::<T>(&rng.normals(b * s * hq * d));
    let k = quantize::<T>(&rng.normals(b * s * hkv * d));
    let v = quantize::<T>(&rng.normals(b * s * hkv * d));
    let dout = quantize::<T>(&rng.normals(b * s * hq * d));
    let scale = c.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let doc_rows: Option<Vec<i64>> = c
        .docs
        .map(|(x, per_row)| if per_row { x.to_vec() } else { x.repeat(b) });
    let want = dense_attention_documents(
        &q,
        &k,
        &v,
        &dout,
        c.dims,
        c.causal,
        scale,
        doc_rows.as_deref(),
        c.window,
    );

    let split = Split { layout, world: n, b, s };
    let pad = if c.strided { 3 } else { 0 };
    let local = Dims { s: l, ..c.dims };
    let mut ranks: Vec<RankIo<T>> = (0..n)
        .map(|r| {
            let cut = |x: &[f64], h: usize| split.gather(x, h * d, r);
            RankIo {
                qkv: Qkv::new(&cut(&q, hq), &cut(&k, hkv), &cut(&v, hkv), local, c.strided),
                dout: Padded::new(&cut(&dout, hq), &[b, l, hq, d], pad),
                out: Padded::poisoned(&[b, l, hq, d], pad),
                lse: Padded::poisoned(&[b, hq, l], pad),
                dq: Padded::poisoned(&[b, l, hq, d], pad),
                dk: Padded::poisoned(&[b, l, hkv, d], pad),
                dv: Padded::poisoned(&[b, l, hkv, d], pad),
            }
        })
        .collect();

    let params = AttentionParams {
        layout,
        causal: c.causal,
        softmax_scale: c.scale,
        documents: c.docs.map(|(x, per_row)| {
            if per_row {
                Documents::per_row(x)
            } else {
                Documents::shared(x)
            }
        }),
        window: c.window,
        ..Default::default()
    };
    let config = Config::new().num_threads(1).timeout(Duration::from_secs(60));
    let mut group = LocalGroup::new(n, &config).map_err(|e| e.to_string())?;
    let results = group.run(ranks.iter_mut(), |ctx, io| -> stria::Result<()> {
        let [qv, kv, vv] = io.qkv.views();
        let mut out = io.out.view_mut();
        let mut lse = io.lse.view_mut();
        ctx.forward(&params, &qv, &kv, &vv, &mut out, &mut lse)?;
        let (mut dq, mut dk, mut dv) = (io.dq.view_mut(), io.dk.view_mut(), io.dv.view_mut());
        ctx.backward(
            &params,
            &qv,
            &kv,
            &vv,
            &out,
            &lse,
            &io.dout.view(),
            &mut dq,
            &mut dk,
            &mut dv,
        )
    });
    for (r, res) in results.into_iter().enumerate() {
        res.map_err(|e| format!("rank {r}: {e}"))?;
    }

    // Put every rank's rows back in global order and compare.
    let mut failures = Vec::new();
    let mut check = |name: &str, want: &[f64], pick: &Pick<'_, T>, inner: usize, tol: f64| {
        let mut got = vec![f64::NAN; want.len()];
        for (r, io) in ranks.iter().enumerate() {
            let (values, intact) = pick(io);
            if !intact {
                failures.push(format!("{name}: rank {r} wrote into the padding between rows"));
            }
            split.scatter(&values, &mut got, inner, r);
        }
        let err = rel_error(&got, want);
        if err.is_nan() || err >= tol {
            failures.push(format!("{name}: relative error {err:.3e} (tolerance {tol:.0e})"));
        }
    };
    let tol = T::TOLERANCE;
    check("out", &want.out, &|io| io.out.values(), hq * d, tol);
    check("dq", &want.dq, &|io| io.dq.values(), hq * d, tol);
    check("dk", &want.dk, &|io| io.dk.values(), hkv * d, tol);
    check("dv", &want.dv, &|io| io.dv.values(), hkv * d, tol);
    // lse is float32 whatever the inputs; it is [B, Hq, L]: transpose to token-major to scatter.
    let lse_want: Vec<f64> = transpose_lse(&want.lse, b, hq, s);
    check(
        "lse",
        &lse_want,
        &|io| {
            let (values, intact) = io.lse.values();
            (transpose_lse(&values, b, hq, l), intact)
        },
        hq,
        1e-5,
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; "))
    }
}

/// [B, H, S] → [B, S, H].
fn transpose_lse(x: &[f64], b: usize, h: usize, s: usize) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..s {
                out[(bi * s + i) * h + hi] = x[(bi * h + hi) * s + i];
            }
        }
    }
    out
}

/// Every world size 1..=4, layout and causality, with head counts cycling through GQA (4/2),
/// MQA (4/1) and plain (2/2), and head dims 16, 8, 24. S = 24 fits every layout at every N.
fn matrix(strided: bool, seed: u64) -> Vec<Case> {
    let heads = [(4, 2), (4, 1), (2, 2)];
    let dims = [16, 8, 24];
    let mut cases = Vec::new();
    for world in 1..=4 {
        for layout in Layout::ALL {
            for causal in [true, false] {
                let i = cases.len();
                let (hq, hkv) = heads[i % 3];
                cases.push(Case {
                    world,
                    layout,
                    causal,
                    dims: Dims {
                        b: 1 + i % 2,
                        s: 24,
                        hq,
                        hkv,
                        d: dims[i / 3 % 3],
                    },
                    scale: None,
                    strided,
                    seed: seed + i as u64,
                    docs: None,
                    window: None,
                });
            }
        }
    }
    cases
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

#[test]
fn ring_f32_matches_float64_reference() {
    run_all::<f32>(&matrix(false, 100));
}

#[test]
fn ring_f16_matches_float64_reference() {
    run_all::<f16>(&matrix(false, 200));
}

#[test]
fn ring_bf16_matches_float64_reference() {
    run_all::<bf16>(&matrix(false, 300));
}

#[test]
fn ring_of_strided_views_matches_reference() {
    let cases = matrix(true, 400);
    run_all::<f32>(&cases);
    run_all::<bf16>(&cases[..12]);
}

#[test]
fn longer_sequence_custom_scale_and_batch() {
    let mut cases = Vec::new();
    for (i, layout) in Layout::ALL.into_iter().enumerate() {
        cases.push(Case {
            world: 3,
            layout,
            causal: true,
            dims: Dims {
                b: 2,
                s: 96,
                hq: 6,
                hkv: 2,
                d: 32,
            },
            scale: Some(0.3),
            strided: false,
            seed: 500 + i as u64,
            docs: None,
            window: None,
        });
    }
    run_all::<f32>(&cases);
    run_all::<f16>(&cases);
}

/// Packed documents: the whole matrix with the same documents in every batch row (one empty),
/// then rows of their own.
#[test]
fn documents_match_reference() {
    const SHARED: &[i64] = &[0, 5, 5, 13, 24];
    let mut cases = matrix(false, 600);
    for c in cases.iter_mut() {
        c.docs = Some((SHARED, false));
    }
    run_all::<f32>(&cases);
    run_all::<bf16>(&cases[..12]);
    const PER_ROW: &[i64] = &[0, 7, 24, 24, 0, 3, 11, 24];
    let per_row: Vec<Case> = matrix(true, 700)
        .into_iter()
        .filter(|c| c.dims.b == 2)
        .map(|c| Case {
            docs: Some((PER_ROW, true)),
            ..c
        })
        .collect();
    run_all::<f32>(&per_row);
}

/// Sliding windows: the whole matrix (causal ones to the left, the others both sides), then with
/// documents.
#[test]
fn sliding_windows_match_reference() {
    let mut cases = matrix(false, 800);
    for c in cases.iter_mut() {
        c.window = Some(if c.causal { (5, -1) } else { (4, 3) });
    }
    run_all::<f32>(&cases);
    run_all::<bf16>(&cases[..12]);
    const SHARED: &[i64] = &[0, 9, 24];
    let with_docs: Vec<Case> = cases
        .iter()
        .step_by(3)
        .map(|&c| Case {
            docs: Some((SHARED, false)),
            window: Some((6, 2)),
            ..c
        })
        .collect();
    run_all::<f32>(&with_docs);
}
