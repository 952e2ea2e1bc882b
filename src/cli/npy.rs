//! Writes `.npy` files (NumPy's array format, version 1.0) so Python checks
//! can read the engine's outputs without a parser of ours.

use std::io::Write;

/// Writes a C-order little-endian float32 array of `shape`.
pub fn write_f32(path: &std::path::Path, shape: &[usize], values: &[f32]) -> std::io::Result<()> {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");
    // Magic (6) + version (2) + length (2) + header + '\n' must be a multiple of 64.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    out.write_all(b"\x93NUMPY\x01\x00")?;
    let len =
        u16::try_from(header.len()).map_err(|_| std::io::Error::other("npy header too long"))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(header.as_bytes())?;
    for v in values {
        out.write_all(&v.to_le_bytes())?;
    }
    out.flush()
}
