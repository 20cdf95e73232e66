//! Finds libstria and its header, then runs bindgen over `stria/stria.h`.
//!
//! Where libstria comes from, first match wins:
//! 1. `STRIA_LIB_DIR` (the directory holding libstria.so), with the header from
//!    `STRIA_INCLUDE_DIR` (the directory holding `stria/stria.h`) or else the repository's
//!    `capi/include`;
//! 2. pkg-config (`stria.pc`, installed with the library; `PKG_CONFIG_PATH` finds a prefix);
//! 3. the repository's build tree: `$STRIA_BUILD_DIR/src` (default `build/src` at the
//!    repository root) and `capi/include`.
//!
//! Dependents get the chosen directories as `DEP_STRIA_INCLUDE` and `DEP_STRIA_LIB_DIR`
//! (Cargo's `links` metadata), e.g. to set an rpath.

use std::env;
use std::path::{Path, PathBuf};

struct Found {
    include_dirs: Vec<PathBuf>,
    lib_dir: Option<PathBuf>,
}

fn main() {
    for var in [
        "STRIA_LIB_DIR",
        "STRIA_INCLUDE_DIR",
        "STRIA_BUILD_DIR",
        "DLPACK_INCLUDE_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("set by Cargo"));
    let repo = manifest.join("../../..");
    let repo = repo.canonicalize().unwrap_or(repo);

    let found = from_env(&repo)
        .or_else(from_pkg_config)
        .or_else(|| from_build_tree(&repo))
        .unwrap_or_else(|| {
            panic!(
                "libstria not found: set STRIA_LIB_DIR (and STRIA_INCLUDE_DIR), install stria so that \
                 `pkg-config stria` works (PKG_CONFIG_PATH), or build it in {} (STRIA_BUILD_DIR)",
                build_dir(&repo).display()
            )
        });

    let header = found
        .include_dirs
        .iter()
        .map(|d| d.join("stria/stria.h"))
        .find(|h| h.is_file())
        .unwrap_or_else(|| panic!("stria/stria.h is not under {:?}", found.include_dirs));
    // Printing rerun-if-env-changed above ends Cargo's default of rerunning on any change in
    // this package, so the header has to be named: a new function in it must reach bindgen.
    println!("cargo:rerun-if-changed={}", header.display());
    println!("cargo:include={}", header.parent().unwrap().parent().unwrap().display());
    if let Some(lib_dir) = &found.lib_dir {
        println!("cargo:lib_dir={}", lib_dir.display());
        // This package's own tests (the layout tests, the doctest) run without LD_LIBRARY_PATH.
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib_dir.display());
    }

    let mut builder = bindgen::Builder::default()
        .header(header.to_str().expect("a UTF-8 path"))
        .allowlist_function("stria_.*")
        .allowlist_type("stria_.*")
        .allowlist_type("DL.*")
        .allowlist_var("STRIA_.*")
        .allowlist_var("DLPACK_.*")
        // Plain integer constants, not Rust enums: a C enum may carry any value (a newer
        // library's status), and a Rust enum holding an undeclared value is undefined behaviour.
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .size_t_is_usize(true)
        .rustfmt_bindings(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks));
    for dir in &found.include_dirs {
        builder = builder.clang_arg(format!("-I{}", dir.display()));
    }
    if let Some(dir) = env::var_os("DLPACK_INCLUDE_DIR") {
        builder = builder.clang_arg(format!("-I{}", Path::new(&dir).display()));
    }
    let bindings = builder
        .generate()
        .expect("bindgen could not parse stria.h (is libclang-dev and libdlpack-dev installed?)");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("set by Cargo")).join("bindings.rs");
    bindings.write_to_file(&out).expect("write bindings.rs");
}

/// `STRIA_LIB_DIR` given: link there; the header from `STRIA_INCLUDE_DIR` or the repository.
fn from_env(repo: &Path) -> Option<Found> {
    let lib_dir = PathBuf::from(env::var_os("STRIA_LIB_DIR")?);
    let include = env::var_os("STRIA_INCLUDE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("capi/include"));
    link(&lib_dir);
    Some(Found {
        include_dirs: vec![include],
        lib_dir: Some(lib_dir),
    })
}

/// An installed stria: pkg-config prints the link flags to Cargo itself.
fn from_pkg_config() -> Option<Found> {
    let lib = pkg_config::Config::new().atleast_version("0.1").probe("stria").ok()?;
    Some(Found {
        include_dirs: lib.include_paths,
        lib_dir: lib.link_paths.into_iter().next(),
    })
}

/// The repository's own build tree (CMake puts libstria.so in `<build>/src`).
fn from_build_tree(repo: &Path) -> Option<Found> {
    let lib_dir = build_dir(repo).join("src");
    if !lib_dir.join("libstria.so").exists() {
        return None;
    }
    link(&lib_dir);
    Some(Found {
        include_dirs: vec![repo.join("capi/include")],
        lib_dir: Some(lib_dir),
    })
}

fn build_dir(repo: &Path) -> PathBuf {
    env::var_os("STRIA_BUILD_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo.join("build"))
}

fn link(lib_dir: &Path) {
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=stria");
}
