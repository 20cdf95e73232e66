//! Contexts over their life: moved into threads of their own, aborted from another thread while
//! stuck in a collective, dropped while a peer waits, a rank that panics inside
//! `LocalGroup::run`, and a timeout. Nothing may hang: every wait here is bounded well below
//! the contexts' timeout.

mod common;

use std::time::{Duration, Instant};

use common::*;
use stria::{AttentionParams, Config, Context, LocalGroup, Status, Tensor};

const L: i64 = 8;
const H: i64 = 2;
const D: i64 = 8;

/// A forward on zero-free random tensors of one rank; the result only.
fn forward(ctx: &mut Context, seed: u64) -> stria::Result<Tensor<f32>> {
    let mut rng = Rng::new(seed);
    let q = Tensor::new(to_t::<f32>(&rng.normals((L * H * D) as usize)), &[1, L, H, D]).unwrap();
    let mut out = Tensor::full(&[1, L, H, D], f32::NAN).unwrap();
    let mut lse = Tensor::<f32>::zeros(&[1, H, L]).unwrap();
    ctx.forward(&AttentionParams::default(), &q, &q, &q, &mut out, &mut lse)?;
    Ok(out)
}

/// Contexts far slower to time out than any test here may take: a hang fails the test's own
/// bound instead of passing after the timeout.
fn patient() -> Config {
    Config::new().num_threads(1).timeout(Duration::from_secs(120))
}

const PROMPT: Duration = Duration::from_secs(20);

#[test]
fn contexts_move_into_threads_of_their_own() {
    let contexts = LocalGroup::new(3, &patient()).unwrap().into_contexts();
    let threads: Vec<_> = contexts
        .into_iter()
        .map(|mut ctx| {
            std::thread::spawn(move || {
                let seed = 1 + ctx.rank() as u64;
                forward(&mut ctx, seed)
            })
        })
        .collect();
    let outs: Vec<Tensor<f32>> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
    // The same ring through LocalGroup::run gives the same bits.
    let mut group = LocalGroup::new(3, &patient()).unwrap();
    let again = group.run(1..4u64, |ctx, seed| forward(ctx, seed).unwrap());
    assert_eq!(outs, again);
    assert!(outs.iter().all(|t| t.as_slice().iter().all(|x| x.is_finite())));
}

#[test]
fn abort_unblocks_a_stuck_call_and_then_every_call_fails() {
    let mut group = LocalGroup::new(2, &patient()).unwrap();
    let handle = group.contexts()[0].abort_handle();
    let started = Instant::now();
    let ctx = &mut group.contexts_mut()[0];
    // Rank 1 never joins: rank 0 waits in the collective until the abort.
    let result = std::thread::scope(|scope| {
        scope.spawn(|| {
            std::thread::sleep(Duration::from_millis(200));
            handle.abort().unwrap();
        });
        forward(ctx, 1)
    });
    assert!(started.elapsed() < PROMPT, "the abort took {:?}", started.elapsed());
    let e = result.unwrap_err();
    assert_eq!(e.status(), Status::Aborted, "{e}");
    let e = forward(ctx, 1).unwrap_err();
    assert_eq!(e.status(), Status::Aborted, "{e}");
    assert!(e.message().contains("destroyed"), "{e}");
    // Rank 1, whose peer left, fails at once rather than waiting for it.
    let e = forward(&mut group.contexts_mut()[1], 2).unwrap_err();
    assert!(matches!(e.status(), Status::Transport | Status::Aborted), "{e}");
}

#[test]
fn dropping_a_context_releases_its_waiting_peer() {
    let mut contexts = LocalGroup::new(2, &patient()).unwrap().into_contexts();
    let leaving = contexts.pop().unwrap();
    let mut staying = contexts.pop().unwrap();
    let started = Instant::now();
    let waiter = std::thread::spawn(move || forward(&mut staying, 1));
    std::thread::sleep(Duration::from_millis(200));
    drop(leaving);
    let e = waiter.join().unwrap().unwrap_err();
    assert!(started.elapsed() < PROMPT);
    assert_eq!(e.status(), Status::Transport, "{e}");
    assert!(e.message().contains("left"), "{e}");
}

#[test]
fn a_panicking_rank_does_not_hang_its_peers() {
    let mut group = LocalGroup::new(3, &patient()).unwrap();
    let started = Instant::now();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        group.run(0..3, |ctx, rank| {
            if rank == 1 {
                panic!("rank 1 gives up before the collective");
            }
            forward(ctx, 1)
        })
    }));
    assert!(started.elapsed() < PROMPT, "took {:?}", started.elapsed());
    let payload = outcome.unwrap_err();
    assert_eq!(
        payload.downcast_ref::<&str>(),
        Some(&"rank 1 gives up before the collective")
    );
    // The panicking rank was aborted; the others failed instead of waiting for it.
    let e = forward(&mut group.contexts_mut()[1], 1).unwrap_err();
    assert_eq!(e.status(), Status::Aborted, "{e}");
}

#[test]
fn a_missing_peer_times_out() {
    let config = Config::new().num_threads(1).timeout(Duration::from_millis(300));
    let mut group = LocalGroup::new(2, &config).unwrap();
    let started = Instant::now();
    let e = forward(&mut group.contexts_mut()[0], 1).unwrap_err();
    assert_eq!(e.status(), Status::Timeout, "{e}");
    assert!(started.elapsed() >= Duration::from_millis(250) && started.elapsed() < PROMPT);
}

#[test]
fn abort_handles_outlive_their_context() {
    let ctx = Context::new(&patient()).unwrap();
    let handle = ctx.abort_handle();
    let clone = handle.clone();
    drop(ctx);
    handle.abort().unwrap(); // nothing left to abort: a no-op, not an error or a crash
    std::thread::spawn(move || clone.abort().unwrap()).join().unwrap();
}

#[test]
fn step_times_cover_every_ring_step() {
    let mut group = LocalGroup::new(4, &patient()).unwrap();
    let steps = group.run(0..4u64, |ctx, seed| {
        forward(ctx, seed).unwrap();
        ctx.step_times().unwrap()
    });
    for rank_steps in steps {
        assert_eq!(rank_steps.len(), 4);
        assert!(rank_steps.iter().all(|s| s.compute_s >= 0.0 && s.wait_s >= 0.0));
    }
    let single = Context::new(&patient()).unwrap().step_times().unwrap();
    assert!(single.is_empty(), "no call yet: {single:?}");
}
