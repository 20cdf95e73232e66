//! Thousands of create/use/destroy cycles must not grow the process: the resident set after
//! them is compared with the one after a warm-up (which lets the allocator and thread stacks
//! settle). Alone in its test binary, so no other test allocates meanwhile.

mod common;

use common::*;
use stria::{AttentionParams, Config, Context, LocalGroup, Status, Tensor};

/// One cycle: a group of two created and dropped, every tenth time after a ring forward; a
/// single context with a rejected call; an error message read.
fn cycle(i: usize, config: &Config) {
    let mut group = LocalGroup::new(2, config).unwrap();
    if i % 10 == 0 {
        group.run(0..2, |ctx, _| {
            let q = Tensor::<f32>::full(&[1, 4, 2, 8], 0.5).unwrap();
            let mut out = q.clone();
            let mut lse = Tensor::<f32>::zeros(&[1, 2, 4]).unwrap();
            ctx.forward(&AttentionParams::default(), &q, &q, &q, &mut out, &mut lse)
                .unwrap();
        });
    }
    drop(group);
    let mut single = Context::new(config).unwrap();
    let q = Tensor::<f32>::zeros(&[1, 4, 2, 8]).unwrap();
    let mut lse = Tensor::<f32>::zeros(&[1, 2, 5]).unwrap(); // wrong L
    let e = single
        .forward(&AttentionParams::default(), &q, &q, &q, &mut q.clone(), &mut lse)
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument);
}

#[test]
fn create_destroy_cycles_do_not_leak() {
    const WARMUP: usize = 300;
    const CYCLES: usize = 5000;
    // Contexts own a few KiB each (engine, transport, buffers): leaking one per cycle would
    // add megabytes.
    const ALLOWED_GROWTH: u64 = 2 << 20;
    let config = Config::new().num_threads(1);
    for i in 0..WARMUP {
        cycle(i, &config);
    }
    let before = rss_bytes();
    for i in 0..CYCLES {
        cycle(i, &config);
    }
    let after = rss_bytes();
    let growth = after.saturating_sub(before);
    eprintln!(
        "RSS {before} -> {after} bytes over {CYCLES} cycles ({} contexts)",
        CYCLES * 3
    );
    assert!(
        growth < ALLOWED_GROWTH,
        "RSS grew by {growth} bytes over {CYCLES} create/destroy cycles"
    );
}
