//! A LoRA adapter registered at run time (`POST /admin/adapters`), as the
//! operator asked for it; checked by [`AdapterRegistration::check`] before
//! the registry touches anything.

use std::path::PathBuf;

use super::error::RegistryError;

/// A new adapter (or a new version of one) over a served base model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdapterRegistration {
    /// The name requests give in `model`.
    pub name: String,
    /// Its version (`"1"` unless the operator says otherwise).
    pub version: String,
    /// The served base model it was trained for.
    pub base: String,
    /// A PEFT folder or a llama.cpp GGUF adapter file.
    pub path: PathBuf,
    /// Whether requests for `name` get this version from now on.
    pub activate: bool,
}

impl AdapterRegistration {
    /// Refuses names that `name@version` could not carry and paths that
    /// are not there, naming the field.
    pub fn check(&self) -> Result<(), RegistryError> {
        for (field, value) in [
            ("name", &self.name),
            ("version", &self.version),
            ("base", &self.base),
        ] {
            if !valid_name(value) {
                return Err(RegistryError::invalid(format!(
                    "`{field}` {value:?} must be non-empty letters, digits, '.', '_' or '-'"
                )));
            }
        }
        if !self.path.is_absolute() {
            return Err(RegistryError::invalid(format!(
                "`path` {} must be absolute (the server's working directory is not the caller's)",
                self.path.display()
            )));
        }
        if !self.path.exists() {
            return Err(RegistryError::invalid(format!(
                "`path` {} does not exist on the server",
                self.path.display()
            )));
        }
        Ok(())
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(name: &str, path: &str) -> AdapterRegistration {
        AdapterRegistration {
            name: name.into(),
            version: "1".into(),
            base: "smol".into(),
            path: PathBuf::from(path),
            activate: true,
        }
    }

    #[test]
    fn bad_names_and_paths_are_refused_naming_the_field() {
        let err = registration("a@b", "/").check().unwrap_err();
        assert!(err.message.contains("`name`"), "{}", err.message);
        let err = registration("ok", "relative/x").check().unwrap_err();
        assert!(err.message.contains("absolute"), "{}", err.message);
        let err = registration("ok", "/no/such/adapter/here")
            .check()
            .unwrap_err();
        assert!(err.message.contains("does not exist"), "{}", err.message);
        assert!(registration("ok", "/").check().is_ok());
    }
}
