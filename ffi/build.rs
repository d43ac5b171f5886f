//! Links the cdylib as NCCL's `libnccl.so.2`: its SONAME, and a version
//! script that exports only `nccl*` and `pnccl*` (as NCCL's `libnccl.map`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let map = format!("{dir}/libnccl.map");
    println!("cargo:rerun-if-changed={map}");
    println!("cargo:rerun-if-changed=build.rs");
    // Cargo passes these link arguments on to every cdylib that depends on
    // this crate: one that embeds the C ABI (the Python extension) turns the
    // `soname` feature off, or the loader would take it for `libnccl.so.2`.
    let soname = std::env::var_os("CARGO_FEATURE_SONAME").is_some();
    if soname && std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={map}");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    }
}
