//! Checks a local model's file against its pins ([`super::models`]) before
//! llama.cpp is given it: its size, the architecture, name and
//! quantization its GGUF header states, and its sha256.
//!
//! Hashing a gigabyte takes seconds, so it runs on the model server's
//! supervisor thread (never the reactor), and is done once per file: a
//! verified file gets a stamp beside it (`<file>.verified`) holding its
//! size, modification time, inode and sha256, and a file whose stamp still
//! matches is not hashed again. Replacing or rewriting the file changes
//! what the stamp is keyed by, so it is hashed afresh; whoever could forge
//! a stamp could as well rewrite the environment's code. The header, a few
//! megabytes, is read at every start.

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::gguf::{self, GgufError, Metadata, Value};
use super::models::{quantization, LocalModel};
use crate::config::llm::LocalModelName;

/// What identifies a file's content without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileKey {
    size: u64,
    mtime_ns: i128,
    inode: u64,
}

impl FileKey {
    /// The key of the file at `path`.
    pub fn of_path(path: &Path) -> io::Result<FileKey> {
        fs::metadata(path).map(|metadata| FileKey::of(&metadata))
    }

    fn of(metadata: &fs::Metadata) -> FileKey {
        FileKey {
            size: metadata.len(),
            mtime_ns: i128::from(metadata.mtime()) * 1_000_000_000
                + i128::from(metadata.mtime_nsec()),
            inode: metadata.ino(),
        }
    }
}

/// Why a model file will not be served.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// The file is not there.
    #[error(
        "the local model {model} is not installed ({} does not exist): \
         run scripts/setup --model {model}",
        .path.display()
    )]
    Missing {
        /// The model.
        model: LocalModelName,
        /// Where its file should be.
        path: PathBuf,
    },
    /// It could not be read.
    #[error("cannot read the local model {}: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
    /// Its size is not the pinned one (an interrupted download or join).
    #[error(
        "{} is not the pinned {model}: it is {found} bytes, not {expected} \
         (run scripts/setup --model {model} again)",
        .path.display()
    )]
    Size {
        /// The model.
        model: LocalModelName,
        /// The file.
        path: PathBuf,
        /// The pinned size.
        expected: u64,
        /// The file's.
        found: u64,
    },
    /// Its GGUF header cannot be read.
    #[error("{} is not the pinned {model}: it {source}", .path.display())]
    Header {
        /// The model.
        model: LocalModelName,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        source: GgufError,
    },
    /// Its header says it is another model.
    #[error(
        "{} is not the pinned {model}: its GGUF header says {key} is {found}, not {expected}",
        .path.display()
    )]
    Metadata {
        /// The model.
        model: LocalModelName,
        /// The file.
        path: PathBuf,
        /// The metadata key that differs.
        key: &'static str,
        /// The pinned value.
        expected: String,
        /// The file's (`missing` when absent).
        found: String,
    },
    /// Its content is not the pinned one.
    #[error(
        "{} is not the pinned {model}: its sha256 is {found}, not {expected} \
         (run scripts/setup --model {model} again)",
        .path.display()
    )]
    Sha256 {
        /// The model.
        model: LocalModelName,
        /// The file.
        path: PathBuf,
        /// The pinned sha256.
        expected: &'static str,
        /// The file's.
        found: String,
    },
}

/// Checks `path` against `model`'s pins. `known` is a key this caller
/// already verified (a restart of the server): a file still matching it,
/// or its stamp, is not hashed again. Returns the file's key.
pub fn verify(
    model: &LocalModel,
    path: &Path,
    known: Option<FileKey>,
) -> Result<FileKey, VerifyError> {
    let io_error = |source| VerifyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let metadata = match fs::metadata(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            return Err(VerifyError::Missing {
                model: model.name,
                path: path.to_path_buf(),
            })
        }
        other => other.map_err(io_error)?,
    };
    let key = FileKey::of(&metadata);
    if key.size != model.size {
        return Err(VerifyError::Size {
            model: model.name,
            path: path.to_path_buf(),
            expected: model.size,
            found: key.size,
        });
    }
    let header =
        gguf::read(&mut BufReader::new(File::open(path).map_err(io_error)?)).map_err(|source| {
            VerifyError::Header {
                model: model.name,
                path: path.to_path_buf(),
                source,
            }
        })?;
    check_metadata(model, &header).map_err(|(key, expected, found)| VerifyError::Metadata {
        model: model.name,
        path: path.to_path_buf(),
        key,
        expected,
        found,
    })?;
    let stamp = stamp_path(path);
    if known == Some(key) || read_stamp(&stamp) == Some((key, model.sha256.to_owned())) {
        return Ok(key);
    }
    let found = sha256_of(path).map_err(io_error)?;
    if found != model.sha256 {
        return Err(VerifyError::Sha256 {
            model: model.name,
            path: path.to_path_buf(),
            expected: model.sha256,
            found,
        });
    }
    // Best effort: an environment the daemon cannot write to is hashed
    // at each daemon start instead.
    if let Err(err) = write_stamp(&stamp, key, &found) {
        log::debug!("cannot keep {}: {err}", stamp.display());
    }
    Ok(key)
}

/// The pinned metadata `header` differs in, as (key, pinned, found).
fn check_metadata(
    model: &LocalModel,
    header: &Metadata,
) -> Result<(), (&'static str, String, String)> {
    let string = |key: &str| match header.get(key) {
        Some(Value::String(s)) => format!("{s:?}"),
        Some(other) => other.to_string(),
        None => "missing".to_owned(),
    };
    for (key, pinned) in [
        ("general.architecture", model.architecture),
        ("general.name", model.general_name),
    ] {
        let found = string(key);
        if found != format!("{pinned:?}") {
            return Err((key, format!("{pinned:?}"), found));
        }
    }
    let file_type = match header.get("general.file_type") {
        Some(Value::U32(n)) => Some(*n),
        _ => None,
    };
    if file_type != Some(model.file_type) {
        let found = file_type
            .map(quantization)
            .unwrap_or_else(|| string("general.file_type"));
        return Err(("general.file_type", quantization(model.file_type), found));
    }
    Ok(())
}

/// The stamp beside `path`.
fn stamp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".verified");
    path.with_file_name(name)
}

/// A stamp's key and sha256, if it reads as one.
fn read_stamp(stamp: &Path) -> Option<(FileKey, String)> {
    let text = fs::read_to_string(stamp).ok()?;
    let mut fields = text.split_whitespace();
    let sha256 = fields.next()?.to_owned();
    let key = FileKey {
        size: fields.next()?.parse().ok()?,
        mtime_ns: fields.next()?.parse().ok()?,
        inode: fields.next()?.parse().ok()?,
    };
    Some((key, sha256))
}

/// Writes a stamp whole (a temporary file renamed over it), so a reader
/// never sees half of one.
fn write_stamp(stamp: &Path, key: FileKey, sha256: &str) -> io::Result<()> {
    let temporary = stamp.with_extension("verified.tmp");
    fs::write(
        &temporary,
        format!("{sha256} {} {} {}\n", key.size, key.mtime_ns, key.inode),
    )?;
    fs::rename(&temporary, stamp)
}

/// The file's sha256, hex.
fn sha256_of(path: &Path) -> io::Result<String> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::gguf::testing;
    use super::super::models::{Location, MODELS};
    use super::*;

    /// A model pinned to `file`'s bytes, as `name` of `architecture`.
    fn pinned_to(file: &[u8], architecture: &'static str) -> LocalModel {
        let digest: String = Sha256::digest(file)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        LocalModel {
            name: LocalModelName::QwenCoder0_5b,
            location: Location::Assembled("test.gguf"),
            size: file.len() as u64,
            sha256: Box::leak(digest.into_boxed_str()),
            architecture,
            general_name: "Qwen2.5 Coder 0.5B Instruct AWQ",
            file_type: 15,
            chat_template: None,
            sampling: MODELS[1].sampling,
        }
    }

    fn written(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        fs::write(&path, bytes).unwrap();
        (dir, path)
    }

    #[test]
    fn the_pinned_file_passes_and_is_stamped_so_it_is_hashed_once() {
        let file = testing::model("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 15);
        let model = pinned_to(&file, "qwen2");
        let (_dir, path) = written(&file);
        let key = verify(&model, &path, None).unwrap();
        let stamp = stamp_path(&path);
        assert_eq!(read_stamp(&stamp), Some((key, model.sha256.to_owned())));
        // A stamp for other content is not trusted: with a wrong pinned
        // hash and the stamp present, the stamp's hash must match too.
        let mut other = model;
        other.sha256 = "0000000000000000000000000000000000000000000000000000000000000000";
        assert!(matches!(
            verify(&other, &path, None),
            Err(VerifyError::Sha256 { .. })
        ));
        // The same file with its stamp: not hashed again (a stamp naming
        // the pinned hash is believed).
        fs::write(
            &stamp,
            format!(
                "{} {} {} {}\n",
                other.sha256, key.size, key.mtime_ns, key.inode
            ),
        )
        .unwrap();
        assert_eq!(verify(&other, &path, None).unwrap(), key);
    }

    #[test]
    fn a_rewritten_file_is_hashed_again_and_refused_naming_both_hashes() {
        let mut file = testing::model("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 15);
        file.extend_from_slice(&[7u8; 64]); // the "weights" after the header
        let model = pinned_to(&file, "qwen2");
        let (_dir, path) = written(&file);
        let key = verify(&model, &path, None).unwrap();
        // Same size and header, one byte of "weights" different.
        let mut tampered = file.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&path, &tampered).unwrap();
        let err = verify(&model, &path, Some(key)).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, VerifyError::Sha256 { .. }), "{message}");
        assert!(message.contains(model.sha256), "{message}");
        assert!(
            message.contains("is not the pinned qwen2.5-coder-0.5b"),
            "{message}"
        );
    }

    #[test]
    fn another_model_is_refused_naming_the_metadata_that_differs() {
        let cases = [
            (
                testing::model("gemma3", "Qwen2.5 Coder 0.5B Instruct AWQ", 15),
                "general.architecture is \"gemma3\", not \"qwen2\"",
            ),
            (
                testing::model("qwen2", "Qwen2.5 Coder 1.5B Instruct GGUF", 15),
                "general.name is \"Qwen2.5 Coder 1.5B Instruct GGUF\", not \"Qwen2.5 Coder 0.5B Instruct AWQ\"",
            ),
            (
                testing::model("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 3),
                "general.file_type is Q4_1, not Q4_K_M",
            ),
            (
                testing::header(&[
                    ("general.architecture", 8, testing::string("qwen2")),
                    ("general.name", 8, testing::string("Qwen2.5 Coder 0.5B Instruct AWQ")),
                ]),
                "general.file_type is missing, not Q4_K_M",
            ),
        ];
        for (file, says) in cases {
            // Pinned to these very bytes: only the metadata can differ.
            let model = pinned_to(&file, "qwen2");
            let (_dir, path) = written(&file);
            let err = verify(&model, &path, None).unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
            assert!(!stamp_path(&path).exists(), "a refused file is not stamped");
        }
    }

    #[test]
    fn a_missing_short_or_foreign_file_says_what_to_run() {
        let file = testing::model("qwen2", "Qwen2.5 Coder 0.5B Instruct AWQ", 15);
        let model = pinned_to(&file, "qwen2");
        let (dir, path) = written(&file[..file.len() - 1]);
        let err = verify(&model, &path, None).unwrap_err();
        assert!(matches!(err, VerifyError::Size { .. }), "{err}");
        assert!(err
            .to_string()
            .contains("scripts/setup --model qwen2.5-coder-0.5b"));
        let err = verify(&model, &dir.path().join("absent.gguf"), None).unwrap_err();
        assert!(matches!(err, VerifyError::Missing { .. }), "{err}");
        assert!(err
            .to_string()
            .contains("run scripts/setup --model qwen2.5-coder-0.5b"));
        let mut elf = b"\x7fELF".to_vec();
        elf.resize(file.len(), 0);
        fs::write(&path, &elf).unwrap();
        let err = verify(&model, &path, None).unwrap_err();
        assert!(err.to_string().contains("is not a GGUF file"), "{err}");
    }
}
