//! Blind mutation for the stable replay: no coverage feedback (that is libFuzzer's job
//! under `cargo fuzz`), just many cheap edits of known-good inputs, weighted towards
//! the bytes and numbers parsers trip on (lengths, quotes, brackets, huge numbers).

/// A small deterministic generator (xorshift64*): the same seed replays the same run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started from `seed` (0 is moved off the fixed point).
    pub fn new(seed: u64) -> Self {
        Rng(seed | 1)
    }

    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }
}

/// Tokens of the text formats (JSON, TOML, Jinja) and numbers at the edges of the
/// integer and float types, spliced in whole.
const DICTIONARY: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"=",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"null",
    b"true",
    b"-1",
    b"0",
    b"1e999",
    b"-1e999",
    b"NaN",
    b"18446744073709551616",
    b"9223372036854775807",
    b"4294967296",
    b"0.0000001",
    b"[[models]]",
    b"[[tenants]]",
    b"[[splits]]",
    b"[routing]",
    b"\"n\":",
    b"\"max_tokens\":",
    b"\"logit_bias\":",
    b"\"stop\":",
    b"\"prompt\":",
    b"\"messages\":",
    b"{{",
    b"}}",
    b"{%",
    b"%}",
    b"{% for m in messages %}",
    b"{% endfor %}",
    b"\0",
    b"\xff\xfe",
    b"\xf0\x9f\x92\xa9",
];

/// Little-endian lengths and counts that overflow, wrap or point past the end.
const NUMBERS: &[u64] = &[
    0,
    1,
    0x7f,
    0xff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    i64::MAX as u64,
    u64::MAX,
];

/// `input` with one to four random edits, at most `max_len` bytes long; `other` is an
/// input to splice from.
pub fn mutate(input: &[u8], other: &[u8], rng: &mut Rng, max_len: usize) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        edit(&mut out, other, rng);
    }
    out.truncate(max_len);
    out
}

fn edit(out: &mut Vec<u8>, other: &[u8], rng: &mut Rng) {
    let len = out.len();
    let at = if len == 0 { 0 } else { rng.below(len) };
    match rng.below(9) {
        0 if len > 0 => out[at] ^= 1 << rng.below(8),
        1 if len > 0 => out[at] = rng.bits() as u8,
        2 => {
            let word = DICTIONARY[rng.below(DICTIONARY.len())];
            out.splice(at..at, word.iter().copied());
        }
        3 if len > 0 => {
            let end = (at + 1 + rng.below(16)).min(len);
            out.drain(at..end);
        }
        4 if len > 0 => {
            // Repeat a piece: nesting and long runs.
            let end = (at + 1 + rng.below(32)).min(len);
            let piece = out[at..end].to_vec();
            for _ in 0..1 + rng.below(64) {
                out.splice(at..at, piece.iter().copied());
            }
        }
        5 => {
            let value = NUMBERS[rng.below(NUMBERS.len())].to_le_bytes();
            let width = [1, 2, 4, 8][rng.below(4)];
            for (i, byte) in value[..width].iter().enumerate() {
                if let Some(slot) = out.get_mut(at + i) {
                    *slot = *byte;
                }
            }
        }
        6 if !other.is_empty() => {
            let from = rng.below(other.len());
            let end = (from + 1 + rng.below(64)).min(other.len());
            out.splice(at..at, other[from..end].iter().copied());
        }
        7 if len > 0 => out.truncate(at),
        _ => {
            let digits = (rng.bits() % 1_000_000_000).to_string();
            out.splice(at..at, digits.bytes());
        }
    }
}
