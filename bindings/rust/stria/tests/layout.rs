//! Layouts against DESIGN.md's normative table: positions, shard/unshard (any dtype, any
//! sequence dimension), and the balance analysis (and its ideal latency) against work counted
//! here pair by pair.

mod common;

use common::*;
use stria::half::bf16;
use stria::{analyze_balance, balance_steps, Layout, Tensor};

#[test]
fn positions_follow_the_normative_table() {
    for layout in Layout::ALL {
        for world in 1..=5usize {
            for s in [2 * world, 6 * world, 16 * world] {
                let mut seen = vec![false; s];
                for rank in 0..world {
                    let got = layout.positions(s as i64, world as i32, rank as i32).unwrap();
                    let want: Vec<i64> = (0..s / world)
                        .map(|i| position(layout, s, world, rank, i) as i64)
                        .collect();
                    assert_eq!(got, want, "{layout} S={s} N={world} rank {rank}");
                    for p in got {
                        assert!(!seen[p as usize], "{layout}: position {p} twice");
                        seen[p as usize] = true;
                    }
                }
                assert!(seen.iter().all(|&x| x), "{layout} S={s} N={world}: not a partition");
            }
        }
    }
}

#[test]
fn shard_and_unshard_move_the_right_rows() {
    // [2, S, 3] with the sequence in dimension 1 (also addressed as -2), values unique.
    let (world, s) = (3usize, 12usize);
    let values: Vec<f64> = (0..2 * s * 3).map(|x| x as f64).collect();
    for layout in Layout::ALL {
        let full = Tensor::new(values.iter().map(|&x| x as i64).collect(), &[2, s as i64, 3]).unwrap();
        let full_bf16 = Tensor::new(to_t::<bf16>(&values), &[2, s as i64, 3]).unwrap();
        let mut shards = Vec::new();
        for rank in 0..world {
            let want = Split { layout, world, b: 2, s }.gather(&values, 3, rank);
            let local = full.shard(layout, world as i32, rank as i32, 1).unwrap();
            assert_eq!(local.shape(), &[2, (s / world) as i64, 3]);
            let got: Vec<f64> = local.as_slice().iter().map(|&x| x as f64).collect();
            assert_eq!(got, want, "{layout} rank {rank}");
            let local16 = full_bf16.shard(layout, world as i32, rank as i32, -2).unwrap();
            assert_eq!(
                to_f64(local16.as_slice()),
                quantize::<bf16>(&want),
                "{layout} rank {rank} bf16"
            );
            shards.push(local);
        }
        assert_eq!(Tensor::unshard(&shards, layout, 1).unwrap(), full, "{layout}");
    }
}

/// The work of ring step `step` on rank `rank`: the (query, key) pairs of its block with the
/// key owner k = (rank − step) mod N, counted at `tile` granularity over the block's local
/// indices (a tile counts whole when any pair in it is visible).
fn block_work(layout: Layout, causal: bool, s: usize, world: usize, rank: usize, step: usize, tile: usize) -> f64 {
    let l = s / world;
    let k = (rank + world - step) % world;
    let mut work = 0.0;
    for ti in (0..l).step_by(tile) {
        for tj in (0..l).step_by(tile) {
            let (ie, je) = ((ti + tile).min(l), (tj + tile).min(l));
            let visible = !causal
                || (ti..ie)
                    .any(|i| (tj..je).any(|j| position(layout, s, world, k, j) <= position(layout, s, world, rank, i)));
            if visible {
                work += ((ie - ti) * (je - tj)) as f64;
            }
        }
    }
    work
}

/// One device's work on the whole sequence at `tile` granularity (the ideal a ring is measured
/// against, before dividing by N).
fn whole_work(causal: bool, s: usize, tile: usize) -> f64 {
    let mut work = 0.0;
    for ti in (0..s).step_by(tile) {
        for tj in (0..s).step_by(tile) {
            let (ie, je) = ((ti + tile).min(s), (tj + tile).min(s));
            if !causal || tj < ie {
                work += ((ie - ti) * (je - tj)) as f64;
            }
        }
    }
    work
}

#[test]
fn balance_matches_pairs_counted_here() {
    for layout in Layout::ALL {
        for causal in [true, false] {
            for (world, s, tile) in [(1, 8, 1), (2, 16, 1), (3, 24, 1), (4, 64, 1), (4, 64, 4), (3, 48, 5)] {
                let what = format!("{layout} causal={causal} N={world} S={s} tile={tile}");
                let steps = balance_steps(layout, causal, s as i64, world as i32, tile as i64).unwrap();
                let mut want = Vec::new();
                for step in 0..world {
                    for rank in 0..world {
                        want.push(block_work(layout, causal, s, world, rank, step, tile));
                    }
                }
                assert_eq!(steps, want, "{what}");
                let total: f64 = want.iter().sum();
                let latency: f64 = want
                    .chunks(world)
                    .map(|row| row.iter().cloned().fold(0.0, f64::max))
                    .sum();
                let b = analyze_balance(layout, causal, s as i64, world as i32, tile as i64).unwrap();
                assert_eq!(b.total_work, total, "{what}");
                assert_eq!(b.ring_latency, latency, "{what}");
                assert!((b.speedup - total / latency).abs() < 1e-12, "{what}");
                assert!((b.imbalance - latency / (total / world as f64)).abs() < 1e-12, "{what}");
                assert_eq!(b.ideal_latency, whole_work(causal, s, tile) / world as f64, "{what}");
                if causal && tile == 1 {
                    assert_eq!(total, (s * (s + 1) / 2) as f64, "{what}: every causal pair once");
                }
            }
        }
    }
}
