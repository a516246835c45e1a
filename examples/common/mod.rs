//! What the examples share (not an example itself: Cargo takes only
//! `examples/*.rs` and `examples/*/main.rs`).

/// A size argument in bytes, with `k` or `m` for KiB or MiB (`16k`).
pub fn size_arg(s: &str) -> usize {
    let s = s.trim().to_ascii_lowercase();
    let (n, m) = match s.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => match s.strip_suffix('m') {
            Some(n) => (n, 1 << 20),
            None => (&s[..], 1),
        },
    };
    n.parse::<usize>().expect("a size") * m
}
