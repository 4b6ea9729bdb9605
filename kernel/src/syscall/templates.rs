//! EXEC's template operations: `templates` lists them, `build_template`
//! builds one — an EXEC run of the kernel's own code, as its caller,
//! whose network is the package index alone, on a disk made for it (see
//! `exec::disks::templates`) — and `remove_template` removes one.
//!
//! A template an operator builds is every principal's to use. An agent or
//! a run builds templates of its own, which it alone sees and which end
//! with it; its build is its own run, so its network (the index) must lie
//! within what the agent or run may reach, as every run's does.

use std::collections::BTreeMap;

use agentos_proto::payload::{
    requirement_lines, ExecCall, ExecRequest, Language, Limits, Network, NetworkPolicy,
    TemplateRemovedReply, TemplatesReply,
};
use agentos_proto::{ErrorCode, ErrorReply};
use base64::Engine;

use super::request::{actor, reply, Outcome, Request};
use crate::exec::zygote::TEMPLATE_ROOT;
use crate::exec::{template_key, Build};
use crate::identity::Principal;
use crate::kernel::{Kernel, Root};

/// An operator's build's memory: pip unpacking large wheels needs more
/// than a run's default.
const BUILD_MEMORY: u64 = 1 << 30;

/// The build's program, run by the run child's interpreter: the
/// template's environment made at its root, then pip (the system's, run
/// for that environment) installs into it, its temporary files on the
/// template's disk, not in memory. `{packages}` and `{requirements}` are
/// filled in as Python literals.
const BUILD_PROGRAM: &str = r#"import os, shutil, subprocess, sys
root = {root}
sys.modules["__main__"].make_venv(root, False)
scratch = os.path.join(root, ".build-tmp")
os.makedirs(scratch, exist_ok=True)
command = [sys.executable, "-m", "pip", "--python", os.path.join(root, "bin", "python"),
           "install", "--no-input", "--progress-bar", "off"] + {packages}
if {requirements}:
    command += ["-r", "requirements.txt"]
done = subprocess.run(command, env=dict(os.environ, TMPDIR=scratch))
shutil.rmtree(scratch, ignore_errors=True)
sys.exit(done.returncode)
"#;

/// Answers a template operation.
pub fn handle(kernel: &mut Kernel, request: &Request<'_>, call: ExecCall) -> Outcome {
    let principal = request.caller.principal();
    let changes = matches!(
        call,
        ExecCall::BuildTemplate { .. } | ExecCall::RemoveTemplate { .. }
    );
    // A delegate's, or a run of one's.
    let of_a_delegate =
        actor(kernel, request).is_ok_and(|actor| matches!(actor.root(), Root::Delegate(..)));
    if changes && of_a_delegate {
        return reply::<TemplatesReply>(Err(ErrorReply::new(
            ErrorCode::PermissionDenied,
            "a delegate principal runs from its operator's templates but builds and removes none",
        )));
    }
    match call {
        ExecCall::Templates => reply(Ok(TemplatesReply {
            success: true,
            templates: kernel.exec.disks().store.templates.list(principal),
        })),
        ExecCall::RemoveTemplate { template } => {
            // Agents ended for good no longer hold a template.
            let agents = &kernel.agents;
            let store = &mut kernel.exec.disks().store;
            store.retain_agents(|agent| !agents.is_over(agent));
            let removed = store.remove_template(principal, &template);
            reply(removed.map(|removed| TemplateRemovedReply {
                success: true,
                removed,
            }))
        }
        ExecCall::BuildTemplate {
            template,
            packages,
            requirements,
            timeout_ms,
        } => match build(
            kernel,
            request,
            template,
            packages,
            requirements,
            timeout_ms,
        ) {
            Ok(()) => Outcome::Later,
            Err(err) => reply::<TemplatesReply>(Err(err)),
        },
        _ => reply::<TemplatesReply>(Err(ErrorReply::new(
            ErrorCode::Internal,
            "not a template operation",
        ))),
    }
}

/// Starts template `name`'s build: a run of [`BUILD_PROGRAM`], answered
/// once the template is published (or the build failed).
fn build(
    kernel: &mut Kernel,
    request: &Request<'_>,
    name: String,
    packages: Vec<String>,
    requirements: Option<String>,
    timeout_ms: Option<u64>,
) -> Result<(), ErrorReply> {
    let principal = request.caller.principal();
    // An operator's uid, for its record; an agent's or a run's own has
    // no operator's.
    let uid = match principal {
        Principal::Operator { uid } => uid,
        _ => u32::MAX,
    };
    let exec = &kernel.config().exec;
    let mut listed = packages.clone();
    listed.extend(
        requirements
            .as_deref()
            .map(requirement_lines)
            .unwrap_or_default(),
    );
    let code = BUILD_PROGRAM
        .replace("{root}", &python_literal(&TEMPLATE_ROOT)?)
        .replace("{packages}", &python_literal(&packages)?)
        .replace(
            "{requirements}",
            if requirements.is_some() {
                "True"
            } else {
                "False"
            },
        );
    let files: BTreeMap<String, String> = requirements
        .iter()
        .map(|text| {
            let encoded = base64::engine::general_purpose::STANDARD.encode(text);
            ("requirements.txt".to_owned(), encoded)
        })
        .collect();
    let run = ExecRequest {
        code,
        language: Language::Python,
        timeout_ms: Some(timeout_ms.unwrap_or(exec.template_build_timeout_ms)),
        env: BTreeMap::from([
            ("PIP_INDEX_URL".to_owned(), exec.template_index_url.clone()),
            ("PIP_NO_CACHE_DIR".to_owned(), "1".to_owned()),
            ("PIP_DISABLE_PIP_VERSION_CHECK".to_owned(), "1".to_owned()),
        ]),
        files,
        // An agent's or a run's build has what its runs have.
        limits: matches!(principal, Principal::Operator { .. }).then(|| Limits {
            memory: Some(BUILD_MEMORY),
            ..Limits::default()
        }),
        network: Some(Network::Policy(Box::new(NetworkPolicy {
            allow: exec.template_index_hosts.clone(),
            deny: Vec::new(),
        }))),
        ..ExecRequest::default()
    };
    let build = Build {
        name: template_key(principal, &name),
        reply_to: request.reply_to,
        uid,
        packages: listed,
    };
    kernel.exec.disks().begin_build(build)?;
    kernel
        .start_run(run, principal, request.reply_to)
        .inspect_err(|_| kernel.exec.disks().build_refused(request.reply_to))
}

fn python_literal<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, ErrorReply> {
    // JSON's strings and lists are Python's literals too.
    serde_json::to_string(value)
        .map_err(|err| ErrorReply::new(ErrorCode::Internal, err.to_string()))
}
