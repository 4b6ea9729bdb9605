//! `agentos template`: EXEC's templates — `build NAME --pip PKG... | -r
//! FILE`, `ls`, `rm NAME`. A template is a read-only Python environment
//! built once (by an operator) and mounted into every run and session
//! started from it (`agentos exec --template NAME`).

use std::path::PathBuf;
use std::time::Duration;

use agentos_proto::payload::{
    check_packages, check_requirements, ExecCall, ExecReply, TemplateRemovedReply, TemplatesReply,
};
use agentos_proto::{Client, ErrorReply, Opcode};

use crate::error::CliError;
use crate::format::human_size;
use crate::input::millis;
use crate::raw::Raw;

#[derive(Debug, clap::Subcommand)]
pub enum TemplateCommand {
    /// Build template NAME: pip installs the packages (and a requirements
    /// file's) into a new environment, reaching only the package index;
    /// prints pip's output
    Build {
        name: String,
        /// Packages to install (requirement specifiers: pandas,
        /// numpy>=2)
        #[arg(long, num_args = 1.., value_name = "PACKAGE")]
        pip: Vec<String>,
        /// A requirements file (pinned, with hashes, is best); lines that
        /// name another index, a URL, a path or an editable install are
        /// refused
        #[arg(short = 'r', long, value_name = "FILE")]
        requirements: Option<PathBuf>,
        /// The build's time limit, in seconds [default: the kernel's]
        #[arg(long, value_name = "SECS")]
        build_timeout: Option<f64>,
    },
    /// List the templates
    Ls,
    /// Remove template NAME (refused while a session uses it)
    Rm { name: String },
}

/// How long `template build` waits for its reply unless told otherwise:
/// a build downloads and installs packages.
pub const BUILD_WAIT: Duration = Duration::from_secs(3600);

pub fn template(client: &mut Client, command: TemplateCommand, json: bool) -> Result<(), CliError> {
    match command {
        TemplateCommand::Build {
            name,
            pip,
            requirements,
            build_timeout,
        } => {
            let requirements = match requirements {
                Some(path) => Some(
                    std::fs::read_to_string(&path)
                        .map_err(|error| CliError::ReadingFile { path, error })?,
                ),
                None => None,
            };
            // Checked here too, so a refused line is named before anything
            // is sent.
            check_packages(&pip).map_err(CliError::Refused)?;
            if let Some(text) = &requirements {
                check_requirements(text).map_err(CliError::Refused)?;
            }
            let call = ExecCall::BuildTemplate {
                template: name.clone(),
                packages: pip,
                requirements,
                timeout_ms: build_timeout.map(millis),
            };
            let reply = match ask::<BuildOutcome>(client, &call, json)? {
                BuildOutcome::Refused(refusal) => return Err(CliError::Refused(refusal)),
                BuildOutcome::Ran(reply) => reply,
                BuildOutcome::Answered(_) => {
                    return Err(CliError::Template("unexpected reply to a build".into()))
                }
            };
            print!("{}", reply.stdout);
            eprint!("{}", reply.stderr);
            match &reply.template {
                Some(template) => println!(
                    "template '{name}' built: {} on disk (agentos exec --template {name} ...)",
                    human_size(template.bytes)
                ),
                None => {
                    let why = reply.error.unwrap_or_else(|| "the build failed".into());
                    return Err(CliError::Template(why));
                }
            }
        }
        TemplateCommand::Ls => {
            let reply: TemplatesReply = ask_or_refused(client, &ExecCall::Templates, json)?;
            println!(
                "{:<24} {:>10}  {:<21} PACKAGES",
                "TEMPLATE", "SIZE", "BUILT"
            );
            for template in &reply.templates {
                println!(
                    "{:<24} {:>10}  {:<21} {}",
                    template.template,
                    human_size(template.bytes),
                    template.created_at,
                    template.packages.join(" ")
                );
            }
            if reply.templates.is_empty() {
                eprintln!("agentos: no templates (agentos template build NAME --pip PACKAGE...)");
            }
        }
        TemplateCommand::Rm { name } => {
            let call = ExecCall::RemoveTemplate {
                template: name.clone(),
            };
            let reply: TemplateRemovedReply = ask_or_refused(client, &call, json)?;
            if !reply.removed {
                return Err(CliError::Template(format!("there is no template '{name}'")));
            }
            println!("template '{name}' removed");
        }
    }
    Ok(())
}

/// Asks the kernel; with `--json` prints its reply as sent (and the caller
/// prints nothing more).
fn ask<T: serde::de::DeserializeOwned>(
    client: &mut Client,
    call: &ExecCall,
    json: bool,
) -> Result<T, CliError> {
    let reply = client.call(Opcode::EXEC, &serde_json::to_vec(call)?)?;
    let raw = Raw::parse(&reply.payload)?;
    if json {
        raw.print()?;
        std::process::exit(0);
    }
    raw.decode()
}

/// Asks the kernel (see [`ask`]); a reply that is not a success is the
/// kernel's refusal.
fn ask_or_refused<T: serde::de::DeserializeOwned>(
    client: &mut Client,
    call: &ExecCall,
    json: bool,
) -> Result<T, CliError> {
    match ask::<BuildOutcome>(client, call, json)? {
        BuildOutcome::Refused(refusal) => Err(CliError::Refused(refusal)),
        BuildOutcome::Ran(_) => Err(CliError::Template("unexpected reply".into())),
        BuildOutcome::Answered(raw) => raw.decode(),
    }
}

/// A build's reply: the kernel's refusal (it has a `code`), or the
/// build's run, which says `success: false` when pip failed.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum BuildOutcome {
    Refused(ErrorReply),
    Ran(Box<ExecReply>),
    /// Any other reply, as sent.
    Answered(Raw),
}
