//! Compiles `proto/pangea/v1/*.proto` with protox (a pure-Rust protobuf compiler), so
//! no machine needs `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        "ad_profile.proto",
        "client.proto",
        "data.proto",
        "replication.proto",
    ]
    .map(|f| root.join("pangea/v1").join(f));
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    prost_build::Config::new()
        // Values and keys are shared between frames, rows and caches without copying.
        .bytes(["."])
        .compile_fds(descriptors)?;
    Ok(())
}
