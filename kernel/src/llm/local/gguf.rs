//! The metadata at the head of a GGUF model file, read without loading the
//! model: enough to say what a file is (its architecture, name and
//! quantization) before llama.cpp is asked to serve it.
//!
//! A GGUF file starts with the magic `GGUF`, a version (2 or 3), the
//! number of tensors and of metadata entries, then each entry as a
//! length-prefixed key, a type tag and a value, all little-endian. Only
//! scalar values are kept; arrays (the tokenizer's vocabulary: hundreds of
//! thousands of strings) are stepped over, so reading the header of a
//! 1 GB model touches a few megabytes.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read};

/// The file's first four bytes.
const MAGIC: &[u8; 4] = b"GGUF";
/// More entries than any real model has: a corrupt count is refused
/// rather than looped over.
const MAX_ENTRIES: u64 = 1 << 16;
/// The longest key or kept string value (a chat template is a few KiB).
const MAX_STRING: u64 = 1 << 20;

/// A metadata value the reader keeps.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Any unsigned integer type, widened.
    U32(u32),
    /// A 64-bit unsigned integer.
    U64(u64),
    /// Any signed integer type, widened.
    I64(i64),
    /// Either float type, widened.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string (lossily decoded).
    String(String),
    /// An array, stepped over: its element type tag and length.
    Array {
        /// The elements' type tag.
        element: u32,
        /// How many elements.
        len: u64,
    },
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U32(v) => write!(f, "{v}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(v) => write!(f, "{v:?}"),
            Value::Array { len, .. } => write!(f, "an array of {len}"),
        }
    }
}

/// The metadata entries, by key.
pub type Metadata = BTreeMap<String, Value>;

/// Why a file's metadata could not be read.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// It does not start with `GGUF`.
    #[error("is not a GGUF file (it starts with {0:02x?})")]
    Magic([u8; 4]),
    /// A version this reader does not know.
    #[error("is GGUF version {0}, not 2 or 3")]
    Version(u32),
    /// An implausible entry count or string length: the file is corrupt.
    #[error("has a corrupt header ({0})")]
    Corrupt(String),
    /// A value type tag this reader does not know.
    #[error("has metadata {key:?} of unknown type {tag}")]
    Type {
        /// The entry's key.
        key: String,
        /// Its type tag.
        tag: u32,
    },
    /// The file ended inside the header, or could not be read.
    #[error("cannot be read: {0}")]
    Io(#[from] io::Error),
}

/// Reads the metadata entries of the GGUF file `file` is positioned at the
/// start of. Buffer it: entries are read a few bytes at a time, and arrays are
/// read past rather than kept.
pub fn read(file: &mut impl Read) -> Result<Metadata, GgufError> {
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(GgufError::Magic(magic));
    }
    let version = u32_of(file)?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::Version(version));
    }
    let _tensors = u64_of(file)?;
    let entries = u64_of(file)?;
    if entries > MAX_ENTRIES {
        return Err(GgufError::Corrupt(format!("{entries} metadata entries")));
    }
    let mut metadata = Metadata::new();
    for _ in 0..entries {
        let key = string_of(file)?;
        let tag = u32_of(file)?;
        let value = value_of(file, &key, tag)?;
        metadata.insert(key, value);
    }
    Ok(metadata)
}

/// One value of type `tag`.
fn value_of(file: &mut impl Read, key: &str, tag: u32) -> Result<Value, GgufError> {
    Ok(match tag {
        0 => Value::U32(u32::from(bytes::<1>(file)?[0])),
        1 => Value::I64(i64::from(i8::from_le_bytes(bytes(file)?))),
        2 => Value::U32(u32::from(u16::from_le_bytes(bytes(file)?))),
        3 => Value::I64(i64::from(i16::from_le_bytes(bytes(file)?))),
        4 => Value::U32(u32_of(file)?),
        5 => Value::I64(i64::from(i32::from_le_bytes(bytes(file)?))),
        6 => Value::F64(f64::from(f32::from_le_bytes(bytes(file)?))),
        7 => Value::Bool(bytes::<1>(file)?[0] != 0),
        8 => Value::String(string_of(file)?),
        9 => {
            let element = u32_of(file)?;
            let len = u64_of(file)?;
            skip_array(file, key, element, len)?;
            Value::Array { element, len }
        }
        10 => Value::U64(u64_of(file)?),
        11 => Value::I64(i64::from_le_bytes(bytes(file)?)),
        12 => Value::F64(f64::from_le_bytes(bytes(file)?)),
        tag => {
            return Err(GgufError::Type {
                key: key.to_owned(),
                tag,
            })
        }
    })
}

/// Steps over `len` elements of type `element`: at once when they have a
/// fixed size, string by string otherwise.
fn skip_array(file: &mut impl Read, key: &str, element: u32, len: u64) -> Result<(), GgufError> {
    let size: u64 = match element {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => {
            for _ in 0..len {
                let n = u64_of(file)?;
                seek_over(file, n)?;
            }
            return Ok(());
        }
        9 => {
            for _ in 0..len {
                let inner = u32_of(file)?;
                let inner_len = u64_of(file)?;
                skip_array(file, key, inner, inner_len)?;
            }
            return Ok(());
        }
        tag => {
            return Err(GgufError::Type {
                key: key.to_owned(),
                tag,
            })
        }
    };
    let total = len
        .checked_mul(size)
        .ok_or_else(|| GgufError::Corrupt(format!("{key:?} has {len} elements")))?;
    seek_over(file, total)
}

/// Reads past `n` bytes, failing as a read would past the end. (Reading
/// through the caller's buffer beats seeking: a buffered reader's seek
/// drops its buffer, and the vocabulary is hundreds of thousands of short
/// strings.)
fn seek_over(file: &mut impl Read, n: u64) -> Result<(), GgufError> {
    let skipped = io::copy(&mut file.take(n), &mut io::sink())?;
    if skipped != n {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(())
}

fn bytes<const N: usize>(file: &mut impl Read) -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    file.read_exact(&mut buf)?;
    Ok(buf)
}

fn u32_of(file: &mut impl Read) -> io::Result<u32> {
    bytes(file).map(u32::from_le_bytes)
}

fn u64_of(file: &mut impl Read) -> io::Result<u64> {
    bytes(file).map(u64::from_le_bytes)
}

fn string_of(file: &mut impl Read) -> Result<String, GgufError> {
    let len = u64_of(file)?;
    if len > MAX_STRING {
        return Err(GgufError::Corrupt(format!("a string of {len} bytes")));
    }
    let mut buf = Vec::new();
    file.take(len).read_to_end(&mut buf)?;
    if buf.len() as u64 != len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// Builds GGUF headers for tests.
#[cfg(test)]
pub(crate) mod testing {
    /// A GGUF v3 header with `entries` (key, type tag, encoded value).
    pub fn header(entries: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
        let mut file = Vec::new();
        file.extend_from_slice(b"GGUF");
        file.extend_from_slice(&3u32.to_le_bytes());
        file.extend_from_slice(&0u64.to_le_bytes());
        file.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (key, tag, value) in entries {
            file.extend_from_slice(&string(key));
            file.extend_from_slice(&tag.to_le_bytes());
            file.extend_from_slice(value);
        }
        file
    }

    /// A GGUF string: its length, then its bytes.
    pub fn string(s: &str) -> Vec<u8> {
        let mut out = (s.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(s.as_bytes());
        out
    }

    /// A model's identifying entries.
    pub fn model(architecture: &str, name: &str, file_type: u32) -> Vec<u8> {
        header(&[
            ("general.architecture", 8, string(architecture)),
            ("general.name", 8, string(name)),
            ("general.file_type", 4, file_type.to_le_bytes().to_vec()),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{header, string};
    use super::*;
    use std::io::Cursor;

    #[test]
    fn a_one_entry_header_reads_byte_by_byte() {
        let mut file = Vec::new();
        file.extend_from_slice(b"GGUF");
        file.extend_from_slice(&3u32.to_le_bytes()); // version
        file.extend_from_slice(&0u64.to_le_bytes()); // tensors
        file.extend_from_slice(&1u64.to_le_bytes()); // entries
        let key = b"general.file_type";
        file.extend_from_slice(&(key.len() as u64).to_le_bytes());
        file.extend_from_slice(key);
        file.extend_from_slice(&4u32.to_le_bytes()); // u32
        file.extend_from_slice(&15u32.to_le_bytes());
        let metadata = read(&mut Cursor::new(file)).unwrap();
        assert_eq!(metadata.get("general.file_type"), Some(&Value::U32(15)));
    }

    fn read_bytes(file: Vec<u8>) -> Result<Metadata, GgufError> {
        read(&mut Cursor::new(file))
    }

    #[test]
    fn scalars_are_kept_and_the_vocabulary_is_stepped_over() {
        let mut tokens = 3u32.to_le_bytes().to_vec(); // string elements
        tokens.extend_from_slice(&2u64.to_le_bytes());
        tokens.extend_from_slice(&string("<s>"));
        tokens.extend_from_slice(&string("hello"));
        let mut scores = 6u32.to_le_bytes().to_vec(); // f32 elements
        scores.extend_from_slice(&2u64.to_le_bytes());
        scores.extend_from_slice(&[0u8; 8]);
        // Strings inside the array: the element type is 8.
        tokens[..4].copy_from_slice(&8u32.to_le_bytes());
        let file = header(&[
            ("general.architecture", 8, string("qwen2")),
            ("tokenizer.ggml.tokens", 9, tokens),
            ("tokenizer.ggml.scores", 9, scores),
            ("general.file_type", 4, 15u32.to_le_bytes().to_vec()),
            ("qwen2.context_length", 10, 32768u64.to_le_bytes().to_vec()),
            ("tokenizer.ggml.add_bos_token", 7, vec![0]),
            ("qwen2.rope.freq_base", 6, 1e6f32.to_le_bytes().to_vec()),
        ]);
        let metadata = read_bytes(file).unwrap();
        assert_eq!(
            metadata["general.architecture"],
            Value::String("qwen2".into())
        );
        assert_eq!(
            metadata["tokenizer.ggml.tokens"],
            Value::Array { element: 8, len: 2 }
        );
        assert_eq!(metadata["general.file_type"], Value::U32(15));
        assert_eq!(metadata["qwen2.context_length"], Value::U64(32768));
        assert_eq!(metadata["tokenizer.ggml.add_bos_token"], Value::Bool(false));
        assert_eq!(metadata["qwen2.rope.freq_base"], Value::F64(1e6));
    }

    #[test]
    fn a_file_that_is_not_gguf_is_named_so() {
        let err = read_bytes(b"\x7fELF and more bytes".to_vec()).unwrap_err();
        assert!(matches!(err, GgufError::Magic(_)), "{err}");
        let mut old = header(&[]);
        old[4..8].copy_from_slice(&1u32.to_le_bytes());
        assert!(matches!(read_bytes(old), Err(GgufError::Version(1))));
    }

    #[test]
    fn a_truncated_or_corrupt_header_is_an_error_not_a_huge_allocation() {
        let file = header(&[("general.name", 8, string("Qwen2.5 Coder"))]);
        for cut in [3, 10, 30, file.len() - 1] {
            assert!(read_bytes(file[..cut].to_vec()).is_err(), "cut at {cut}");
        }
        let mut huge = header(&[]);
        huge[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(read_bytes(huge), Err(GgufError::Corrupt(_))));
        // An array claiming more elements than the file holds.
        let mut array = 4u32.to_le_bytes().to_vec();
        array.extend_from_slice(&(1u64 << 40).to_le_bytes());
        let file = header(&[("tokenizer.ggml.token_type", 9, array)]);
        assert!(read_bytes(file).is_err());
        let file = header(&[("x", 99, vec![])]);
        assert!(matches!(
            read_bytes(file),
            Err(GgufError::Type { tag: 99, .. })
        ));
    }
}
