//! Shared by the integration tests: random inputs, element conversions, the normative layout
//! table, a float64 dense reference of attention over the whole sequence, and the relative error.
//! Written from DESIGN.md, independently of the library (so a shared bug cannot hide).
#![allow(dead_code)] // each test binary uses part of it

use stria::half::{bf16, f16};
use stria::{Element, Layout};

/// A small deterministic generator (SplitMix64) with normal samples (Box-Muller).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    pub fn normals(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.normal()).collect()
    }
}

/// The attention element types, with conversions to and from f64 for the tests.
pub trait Float: Element + std::fmt::Debug {
    const NAME: &'static str;
    /// Relative error allowed against the float64 reference (DESIGN: fp32 1e-5, half 2e-2).
    const TOLERANCE: f64;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
    fn nan() -> Self {
        Self::from_f64(f64::NAN)
    }
}

impl Float for f32 {
    const NAME: &'static str = "f32";
    const TOLERANCE: f64 = 1e-5;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Float for f16 {
    const NAME: &'static str = "f16";
    const TOLERANCE: f64 = 2e-2;
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
}

impl Float for bf16 {
    const NAME: &'static str = "bf16";
    const TOLERANCE: f64 = 2e-2;
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
}

pub fn to_t<T: Float>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v)).collect()
}

pub fn to_f64<T: Float>(x: &[T]) -> Vec<f64> {
    x.iter().map(|&v| v.to_f64()).collect()
}

/// Rounds through T: what the library sees of values stored as T.
pub fn quantize<T: Float>(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| T::from_f64(v).to_f64()).collect()
}

/// The global position of local token i of rank r (DESIGN.md, "Layouts", normative).
pub fn position(layout: Layout, seq_len: usize, world: usize, rank: usize, i: usize) -> usize {
    let l = seq_len / world;
    match layout {
        Layout::Contiguous => rank * l + i,
        Layout::Striped => i * world + rank,
        Layout::Zigzag => {
            let c = l / 2;
            if i < c {
                rank * c + i
            } else {
                (2 * world - 1 - rank) * c + (i - c)
            }
        }
    }
}

/// How a [B, S, inner] row-major array (inner = H·D) is spread over the ranks of a ring.
#[derive(Debug, Clone, Copy)]
pub struct Split {
    pub layout: Layout,
    pub world: usize,
    pub b: usize,
    pub s: usize,
}

impl Split {
    /// Rank r's rows, gathered by global position.
    pub fn gather(&self, full: &[f64], inner: usize, rank: usize) -> Vec<f64> {
        let l = self.s / self.world;
        let mut out = Vec::with_capacity(self.b * l * inner);
        for bi in 0..self.b {
            for i in 0..l {
                let p = position(self.layout, self.s, self.world, rank, i);
                out.extend_from_slice(&full[(bi * self.s + p) * inner..][..inner]);
            }
        }
        out
    }

    /// Puts rank r's rows back where gather took them from.
    pub fn scatter(&self, local: &[f64], full: &mut [f64], inner: usize, rank: usize) {
        let l = self.s / self.world;
        for bi in 0..self.b {
            for i in 0..l {
                let p = position(self.layout, self.s, self.world, rank, i);
                full[(bi * self.s + p) * inner..][..inner].copy_from_slice(&local[(bi * l + i) * inner..][..inner]);
            }
        }
    }
}

/// The problem shape: q [B, S, Hq, D], k/v [B, S, Hkv, D].
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub b: usize,
    pub s: usize,
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
}

/// Attention over the whole sequence in float64, forward and backward.
pub struct Reference {
    pub out: Vec<f64>, // [B, S, Hq, D]
    pub lse: Vec<f64>, // [B, Hq, S]
    pub dq: Vec<f64>,
    pub dk: Vec<f64>, // [B, S, Hkv, D]
    pub dv: Vec<f64>,
    pub dsinks: Vec<f64>, // [Hq], with sinks
}

/// What changes the scores beyond the mask: logit softcapping (0: none) and attention sinks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mods<'a> {
    pub softcap: f64,
    pub sinks: Option<&'a [f64]>,
}

/// softmax(scale·QKᵀ + mask)·V, the log-sum-exp, and the gradients for `dout`; causal on global
/// positions (query p sees keys p' ≤ p).
pub fn dense_attention(q: &[f64], k: &[f64], v: &[f64], dout: &[f64], dm: Dims, causal: bool, scale: f64) -> Reference {
    dense_attention_documents(q, k, v, dout, dm, causal, scale, None, None)
}

/// dense_attention with packed documents: `docs` holds B rows of n + 1 boundaries, and a query
/// sees only keys of its own document; and with a sliding window `(left, right)` (−1: unbounded),
/// query i only keys i − left ..= i + right.
#[allow(clippy::too_many_arguments)]
pub fn dense_attention_documents(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    dm: Dims,
    causal: bool,
    scale: f64,
    docs: Option<&[i64]>,
    window: Option<(i64, i64)>,
) -> Reference {
    dense_attention_mods(q, k, v, dout, dm, causal, scale, docs, window, Mods::default())
}

/// dense_attention_documents with softcapping (a score s becomes cap·tanh(s / cap)) and sinks
/// (head h's logit z joins each row's denominator and carries no value).
#[allow(clippy::too_many_arguments)]
pub fn dense_attention_mods(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    dout: &[f64],
    dm: Dims,
    causal: bool,
    scale: f64,
    docs: Option<&[i64]>,
    window: Option<(i64, i64)>,
    mods: Mods,
) -> Reference {
    let Dims { b, s, hq, hkv, d } = dm;
    let group = hq / hkv;
    let qi = |bi: usize, i: usize, h: usize| ((bi * s + i) * hq + h) * d;
    let ki = |bi: usize, j: usize, h: usize| ((bi * s + j) * hkv + h) * d;
    let mut r = Reference {
        out: vec![0.0; b * s * hq * d],
        lse: vec![0.0; b * hq * s],
        dq: vec![0.0; b * s * hq * d],
        dk: vec![0.0; b * s * hkv * d],
        dv: vec![0.0; b * s * hkv * d],
        dsinks: vec![0.0; hq],
    };
    let dot = |x: &[f64], y: &[f64]| x.iter().zip(y).map(|(a, b)| a * b).sum::<f64>();
    let mut p = vec![0.0; s];
    let mut slope = vec![1.0; s];
    for bi in 0..b {
        for h in 0..hq {
            let hk = h / group;
            for i in 0..s {
                let mut n = if causal { i + 1 } else { s };
                let mut j0 = 0;
                if let Some(docs) = docs {
                    let row = &docs[bi * (docs.len() / b)..][..docs.len() / b];
                    let doc = row.iter().rposition(|&x| x as usize <= i).unwrap();
                    j0 = row[doc] as usize;
                    n = n.min(row[doc + 1] as usize);
                }
                if let Some((left, right)) = window {
                    if left >= 0 {
                        j0 = j0.max(i.saturating_sub(left as usize));
                    }
                    if right >= 0 {
                        n = n.min(i + right as usize + 1);
                    }
                }
                let p = &mut p[j0..n];
                let slope = &mut slope[j0..n];
                let qrow = &q[qi(bi, i, h)..][..d];
                for (jj, x) in p.iter_mut().enumerate() {
                    *x = scale * dot(qrow, &k[ki(bi, j0 + jj, hk)..][..d]);
                    if mods.softcap > 0.0 {
                        let t = (*x / mods.softcap).tanh();
                        *x = mods.softcap * t;
                        slope[jj] = 1.0 - t * t;
                    }
                }
                let sink = mods.sinks.map_or(f64::NEG_INFINITY, |z| z[h]);
                let mx = p.iter().cloned().fold(sink, f64::max);
                let sink_term = if sink == f64::NEG_INFINITY {
                    0.0
                } else {
                    (sink - mx).exp()
                };
                let lse = mx + (sink_term + p.iter().map(|x| (x - mx).exp()).sum::<f64>()).ln();
                r.lse[(bi * hq + h) * s + i] = lse;
                for x in p.iter_mut() {
                    *x = (*x - lse).exp();
                }
                let o = qi(bi, i, h);
                for (jj, &pj) in p.iter().enumerate() {
                    for e in 0..d {
                        r.out[o + e] += pj * v[ki(bi, j0 + jj, hk) + e];
                    }
                }
                // Backward: dP = dO·Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = scale·dS·K,
                // dK = scale·dSᵀ·Q, dV = Pᵀ·dO.
                let g = &dout[o..][..d];
                let delta = dot(g, &r.out[o..][..d]);
                if sink != f64::NEG_INFINITY {
                    r.dsinks[h] -= (sink - lse).exp() * delta; // the sink's probability times (0 − delta)
                }
                for (jj, &pj) in p.iter().enumerate() {
                    let kj = ki(bi, j0 + jj, hk);
                    let ds = pj * (dot(g, &v[kj..][..d]) - delta) * slope[jj];
                    for e in 0..d {
                        r.dq[o + e] += scale * ds * k[kj + e];
                        r.dk[kj + e] += scale * ds * qrow[e];
                        r.dv[kj + e] += pj * g[e];
                    }
                }
            }
        }
    }
    r
}

/// ‖got − want‖ / ‖want‖; anything non-finite in `got` gives +∞, so NaN never passes.
pub fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        num += (g - w) * (g - w);
        den += w * w;
    }
    if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    }
}

/// The resident set size of this process in bytes (from /proc/self/status).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .expect("VmRSS in kB");
    kb * 1024
}
