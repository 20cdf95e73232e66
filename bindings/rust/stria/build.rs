//! Lets this package's own tests and examples find libstria at run time without
//! LD_LIBRARY_PATH: an rpath to the directory stria-sys linked (DEP_STRIA_LIB_DIR, from its
//! `links = "stria"` metadata). Crates that depend on `stria` decide their own rpath.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_STRIA_LIB_DIR");
    if let Some(dir) = std::env::var_os("DEP_STRIA_LIB_DIR") {
        println!(
            "cargo:rustc-link-arg=-Wl,-rpath,{}",
            std::path::Path::new(&dir).display()
        );
    }
}
