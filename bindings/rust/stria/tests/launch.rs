//! The launcher path: rank and world size from torchrun's or mpirun's variables, and a context
//! from them that meets its peers at STRIA_ROOT.

use std::collections::HashMap;

use stria::{AttentionParams, Config, Context, Launch, Status, Tensor};

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |name| map.get(name).cloned()
}

#[test]
fn torchrun_and_mpirun_variables() {
    let torchrun = Launch::from_vars(vars(&[("RANK", "3"), ("WORLD_SIZE", "8"), ("LOCAL_RANK", "1")])).unwrap();
    assert_eq!((torchrun.rank, torchrun.world_size, torchrun.local_rank), (3, 8, 1));
    let mpirun = Launch::from_vars(vars(&[
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "6"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
    ]))
    .unwrap();
    assert_eq!((mpirun.rank, mpirun.world_size, mpirun.local_rank), (5, 6, 2));
    // No local rank: GPU 0. torchrun's variables win where both launchers' are set.
    let both = Launch::from_vars(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
    ]))
    .unwrap();
    assert_eq!((both.rank, both.world_size, both.local_rank), (1, 2, 0));
}

#[test]
fn missing_or_malformed_variables_are_named() {
    let none = Launch::from_vars(vars(&[("RANK", "0")])).unwrap_err();
    assert_eq!(none.status(), Status::InvalidArgument);
    assert!(none.message().contains("RANK and WORLD_SIZE"), "{}", none);
    let bad = Launch::from_vars(vars(&[("RANK", "zero"), ("WORLD_SIZE", "2")])).unwrap_err();
    assert!(bad.message().contains("RANK=\"zero\""), "{}", bad);
    let bad_local = Launch::from_vars(vars(&[("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "-")])).unwrap_err();
    assert!(bad_local.message().contains("LOCAL_RANK"), "{}", bad_local);
}

/// A forward through `ctx` on fixed inputs.
fn forward(ctx: &mut Context) -> Tensor<f32> {
    let (l, h, d) = (16i64, 2i64, 8i64);
    let x: Vec<f32> = (0..l * h * d).map(|i| (i as f32 * 0.37).sin()).collect();
    let q = Tensor::new(x, &[1, l, h, d]).unwrap();
    let mut out = Tensor::full(&[1, l, h, d], f32::NAN).unwrap();
    let mut lse = Tensor::<f32>::zeros(&[1, h, l]).unwrap();
    ctx.forward(&AttentionParams::default(), &q, &q, &q, &mut out, &mut lse)
        .unwrap();
    out
}

// The only test here that touches the process environment (tests run on threads).
#[test]
fn a_world_of_one_from_the_environment() {
    std::env::remove_var("STRIA_ROOT");
    std::env::set_var("RANK", "0");
    std::env::set_var("WORLD_SIZE", "1");
    let unset = Config::from_env().unwrap_err();
    assert_eq!(unset.status(), Status::InvalidArgument);
    assert!(unset.message().contains("STRIA_ROOT"), "{}", unset);

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::env::set_var("STRIA_ROOT", format!("127.0.0.1:{}", port));
    let config = Config::from_env().unwrap().num_threads(1);
    let mut ctx = match Context::new(&config) {
        Ok(ctx) => ctx,
        // A build without the UCX module: nothing more to check here.
        Err(e) if e.status() == Status::Unsupported => return,
        Err(e) => panic!("{}", e),
    };
    assert_eq!((ctx.rank(), ctx.world_size()), (0, 1));
    let mut local = Context::new(&Config::new().num_threads(1)).unwrap();
    assert_eq!(
        forward(&mut ctx),
        forward(&mut local),
        "a world of one computes the same over UCX"
    );
}
