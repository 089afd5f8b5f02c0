//! Writes the seed corpus (`pangea_fuzz::seeds`) to `corpus/<target>/seed-*`.
//! Run from anywhere: `cargo run --manifest-path fuzz/Cargo.toml --example gen_corpus`.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for (target, name, data) in pangea_fuzz::seeds::all() {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(&name), &data)?;
        println!("{target}/{name}: {} bytes", data.len());
    }
    Ok(())
}
