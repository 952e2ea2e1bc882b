//! API keys: the file holds only SHA-256 digests (or `env:VAR` names resolved at load).
//!
//! A presented key is hashed and looked up by digest. Looking up by digest leaks nothing
//! useful through timing (a caller cannot steer the digest bytes), and the final equality
//! check is constant-time all the same.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A SHA-256 digest of an API key.
pub type KeyDigest = [u8; 32];

/// The SHA-256 digest of `key`.
pub fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// Lower-case hex SHA-256 of `key`, as written in policy files after `sha256:`.
pub fn sha256_hex(key: &str) -> String {
    hex(&digest(key))
}

/// Lower-case hex of a digest (as [`sha256_hex`] writes it).
pub fn hex(digest: &KeyDigest) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Constant-time comparison of two digests.
pub fn digests_equal(a: &KeyDigest, b: &KeyDigest) -> bool {
    a.ct_eq(b).into()
}

/// Turns one `api_keys` entry into a digest: `sha256:<64 hex digits>` or `env:VARIABLE`
/// (the variable's value is the key, hashed here). The error says what to write instead.
pub(crate) fn parse_key_spec(
    spec: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<KeyDigest, String> {
    if let Some(hex) = spec.strip_prefix("sha256:") {
        return decode_hex32(hex).ok_or_else(|| {
            format!(
                "`sha256:` must be followed by exactly 64 hex digits, got {} characters; \
                 compute it with `printf %s \"$KEY\" | sha256sum`",
                hex.len()
            )
        });
    }
    if let Some(var) = spec.strip_prefix("env:") {
        if var.is_empty() {
            return Err("`env:` must name an environment variable, e.g. `env:ACME_API_KEY`".into());
        }
        return match env(var) {
            Some(value) if !value.is_empty() => Ok(digest(&value)),
            _ => Err(format!(
                "environment variable `{var}` is unset or empty; export it before loading the policy"
            )),
        };
    }
    Err(
        "API keys must be written as `sha256:<hex digest>` or `env:VARIABLE`, never in plain text; \
         compute a digest with `printf %s \"$KEY\" | sha256sum`"
            .into(),
    )
}

fn decode_hex32(hex: &str) -> Option<KeyDigest> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let &[hi, lo] = pair else { return None };
        let hi = (hi as char).to_digit(16)?;
        let lo = (lo as char).to_digit(16)?;
        *out.get_mut(i)? = (hi * 16 + lo) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn sha256_spec_round_trips() {
        let hex = sha256_hex("secret");
        assert_eq!(
            hex,
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
        );
        let d = parse_key_spec(&format!("sha256:{hex}"), &no_env).unwrap();
        assert!(digests_equal(&d, &digest("secret")));
        assert!(parse_key_spec(&format!("sha256:{}", &hex[..10]), &no_env).is_err());
    }

    #[test]
    fn env_spec_reads_the_environment_and_plaintext_is_refused() {
        let env = |v: &str| (v == "K").then(|| "secret".to_string());
        assert_eq!(parse_key_spec("env:K", &env).unwrap(), digest("secret"));
        assert!(parse_key_spec("env:MISSING", &env)
            .unwrap_err()
            .contains("MISSING"));
        assert!(parse_key_spec("secret", &env)
            .unwrap_err()
            .contains("plain text"));
    }
}
