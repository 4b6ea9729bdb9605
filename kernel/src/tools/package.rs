//! The `tools` package EXEC runs import, kept in a directory every exec
//! host sees as `/tools`: the runtime module (`tools.py`, fixed), the
//! catalog it builds its functions from (`catalog.json`: every server's
//! tools with their Python names and schemas), and a `SKILL.md` per server
//! for the LLM to read. Files are replaced whole (written aside, then
//! renamed), so a reader never sees half of one.
//!
//! The catalog lists every tool on offer; what a caller may use is checked
//! when it calls (TOOL, with its `permissions.tools`). Nothing here comes
//! from a server's configuration: no command, no environment.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::builtin::describe_server;
use super::offer::{call, Offered};
use super::schema::{ObjectSchema, Property};
use super::signature::{text_field, CatalogParameter, Signature};

/// The runtime module, as runs import it.
const RUNTIME: &str = include_str!("runtime.py");

/// One server of the catalog, with its tools on offer.
#[derive(Debug)]
struct CatalogServer<'a, 'b> {
    /// Its name (a Python identifier: the config checks it).
    name: &'a str,
    /// What it is, for its SKILL.md and docstring.
    description: String,
    /// Its tools now.
    tools: Vec<&'b Offered<'a>>,
}

/// The tools on offer, grouped by server in order of first appearance.
fn by_server<'a, 'b>(offered: &'b [Offered<'a>]) -> Vec<CatalogServer<'a, 'b>> {
    let mut servers: Vec<CatalogServer<'a, 'b>> = Vec::new();
    for tool in offered {
        match servers.iter_mut().find(|s| s.name == tool.server) {
            Some(server) => server.tools.push(tool),
            None => servers.push(CatalogServer {
                name: tool.server,
                description: describe_server(tool.server),
                tools: vec![tool],
            }),
        }
    }
    servers
}

/// The package's directory and what was last written there.
#[derive(Debug)]
pub struct Package {
    dir: PathBuf,
    catalog: Vec<u8>,
}

impl Package {
    /// Writes the runtime module into `dir`, with an empty catalog.
    pub fn create(dir: &Path) -> io::Result<Package> {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
        write_whole(&dir.join("tools.py"), RUNTIME.as_bytes())?;
        let mut package = Package {
            dir: dir.to_path_buf(),
            catalog: Vec::new(),
        };
        package.update(&[])?;
        Ok(package)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes the catalog and each server's SKILL.md for the tools on
    /// offer; returns whether the catalog changed.
    pub fn update(&mut self, offered: &[Offered<'_>]) -> io::Result<bool> {
        let servers = by_server(offered);
        let catalog = catalog(&servers);
        if catalog == self.catalog {
            return Ok(false);
        }
        for server in &servers {
            let dir = self.dir.join(server.name);
            match fs::create_dir(&dir) {
                Ok(()) => fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))?,
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
                Err(err) => return Err(err),
            }
            write_whole(&dir.join("SKILL.md"), skill(server).as_bytes())?;
        }
        write_whole(&self.dir.join("catalog.json"), &catalog)?;
        self.catalog = catalog;
        Ok(true)
    }
}

/// The catalog: each server's tools with their Python names.
fn catalog(servers: &[CatalogServer<'_, '_>]) -> Vec<u8> {
    let signatures: Vec<Vec<Signature>> = servers
        .iter()
        .map(|server| {
            server
                .tools
                .iter()
                .map(|offered| Signature::of(&offered.tool.input_schema))
                .collect()
        })
        .collect();
    let servers = servers
        .iter()
        .zip(&signatures)
        .map(|(server, signatures)| CatalogEntry {
            name: server.name,
            description: &server.description,
            tools: server
                .tools
                .iter()
                .zip(signatures)
                .map(|(offered, signature)| CatalogTool {
                    name: &offered.tool.name,
                    parameters: signature.to_catalog(),
                    signature: format!(
                        "tools.{}.{}{}",
                        server.name,
                        offered.python,
                        signature.render()
                    ),
                    python: &offered.python,
                    description: &offered.tool.description,
                    input_schema: &offered.tool.input_schema,
                    output_schema: offered.tool.output_schema.as_ref(),
                    returns: returns(offered.tool.output_schema.as_ref()),
                    text_field: offered.tool.output_schema.as_ref().and_then(text_field),
                })
                .collect(),
        })
        .collect();
    serde_json::to_vec(&Catalog { servers }).unwrap_or_default()
}

/// The catalog the `tools` runtime reads (`catalog.json`).
#[derive(Serialize)]
struct Catalog<'a> {
    servers: Vec<CatalogEntry<'a>>,
}

#[derive(Serialize)]
struct CatalogEntry<'a> {
    name: &'a str,
    description: &'a str,
    tools: Vec<CatalogTool<'a>>,
}

#[derive(Serialize)]
struct CatalogTool<'a> {
    name: &'a str,
    parameters: Vec<CatalogParameter<'a>>,
    signature: String,
    python: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    output_schema: Option<&'a Value>,
    returns: String,
    /// The one field of a result that is only text: a call returns it as a
    /// `str`.
    text_field: Option<String>,
}

/// A server's SKILL.md: how to call each of its tools from a run.
fn skill(server: &CatalogServer<'_, '_>) -> String {
    let mut text = format!(
        "---\nname: {name}\ndescription: {description}\n---\n\n# {name}\n\n{description}\n\n\
         Call its tools from Python in an EXEC run, with arguments by position (in the \
         order each signature shows) or by name; each returns the tool's result as a \
         Python value and raises `tools.ToolError` when the tool fails:\n\n\
         ```python\nimport tools\n```\n",
        name = server.name,
        description = server.description.replace('\n', " "),
    );
    if server.tools.is_empty() {
        text.push_str("\nIt offers no tools right now (see `agentos tools`).\n");
    }
    for offered in &server.tools {
        let tool = offered.tool;
        let args = arguments(&tool.input_schema);
        let _ = write!(
            text,
            "\n## {name}\n\n```python\n{call}\n```\n\n{description}\n",
            name = tool.name,
            call = call(offered),
            description = tool.description.trim(),
        );
        for arg in &args {
            let _ = writeln!(
                text,
                "- `{}` ({}, {}){}",
                arg.name,
                arg.kind,
                if arg.required { "required" } else { "optional" },
                if arg.description.is_empty() {
                    String::new()
                } else {
                    format!(": {}", arg.description.replace('\n', " "))
                }
            );
        }
        let _ = writeln!(text, "\nReturns {}", returns(tool.output_schema.as_ref()));
    }
    text
}

/// What a tool's function returns, as its docstring and SKILL.md say it:
/// what `tools.call` gives back for a tool with this output schema.
fn returns(output_schema: Option<&Value>) -> String {
    let Some(schema) = output_schema else {
        return "the tool's text content as a str (text that is JSON comes back parsed: a \
                dict, list or number)."
            .to_owned();
    };
    if let Some(field) = text_field(schema) {
        return format!(
            "the text of the tool's structured content's one field, `{field}`, as a str \
             (result[{field:?}] gives the same text)."
        );
    }
    let fields = arguments(schema);
    if fields.is_empty() {
        return "a dict: the tool's structured content, as its output schema describes it."
            .to_owned();
    }
    let mut text = "a dict (the tool's structured content) with these keys:".to_owned();
    for field in fields {
        let _ = write!(
            text,
            "\n- `{}` ({}{}){}",
            field.name,
            field.kind,
            if field.required {
                ""
            } else {
                ", may be absent"
            },
            if field.description.is_empty() {
                String::new()
            } else {
                format!(": {}", field.description.replace('\n', " "))
            }
        );
    }
    text
}

struct Argument {
    name: String,
    kind: String,
    required: bool,
    description: String,
}

/// The arguments an input schema names, in its order.
fn arguments(schema: &Value) -> Vec<Argument> {
    let schema = ObjectSchema::read(schema);
    let required = schema.required();
    schema
        .properties()
        .map(|(name, property)| Argument {
            name: name.to_owned(),
            kind: kind_of(&property),
            required: required.contains(&name),
            description: property.description.unwrap_or_default(),
        })
        .collect()
}

/// A property's type as its schema names it: its `type`, else the
/// definition a `$ref` names (`#/$defs/TimeResult` is a `TimeResult`),
/// else `any`.
fn kind_of(property: &Property) -> String {
    let named = property
        .reference
        .as_deref()
        .and_then(|reference| reference.rsplit('/').next());
    property
        .kind
        .as_deref()
        .or(named)
        .filter(|kind| !kind.is_empty())
        .unwrap_or("any")
        .to_owned()
}

/// Replaces `path` with `bytes` (mode 0644): written aside, then renamed.
fn write_whole(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let aside = path.with_extension("new");
    fs::write(&aside, bytes)?;
    fs::set_permissions(&aside, fs::Permissions::from_mode(0o644))?;
    fs::rename(&aside, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::mcp::client::ToolInfo;
    use crate::tools::offer::name_for_python;
    use serde_json::json;

    fn tool(name: &str) -> ToolInfo {
        ToolInfo {
            name: name.into(),
            description: format!("Does {name}."),
            input_schema: json!({
                "type": "object",
                "properties": {"a": {"type": "number", "description": "First."}, "b": {}},
                "required": ["a"],
            }),
            output_schema: None,
        }
    }

    #[test]
    fn the_catalog_names_tools_for_python_and_changes_only_when_they_do() {
        let dir = tempfile::tempdir().unwrap();
        let mut package = Package::create(dir.path()).unwrap();
        let (sum, same, import) = (tool("get-sum"), tool("get_sum"), tool("import"));
        let offered = name_for_python([
            ("everything", &sum),
            ("everything", &same),
            ("everything", &import),
        ]);
        assert!(package.update(&offered).unwrap());
        assert!(!package.update(&offered).unwrap());
        let catalog: Value =
            serde_json::from_slice(&fs::read(dir.path().join("catalog.json")).unwrap()).unwrap();
        let names: Vec<&str> = catalog["servers"][0]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["python"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["get_sum", "get_sum_2", "import_"]);
        let skill = fs::read_to_string(dir.path().join("everything/SKILL.md")).unwrap();
        assert!(
            skill.contains("tools.everything.get_sum(a, b=None)"),
            "{skill}"
        );
        assert!(
            skill.contains("- `a` (number, required): First."),
            "{skill}"
        );
        assert!(dir.path().join("tools.py").exists());
        assert!(
            skill.contains("Returns the tool's text content as a str"),
            "{skill}"
        );
    }

    #[test]
    fn what_a_tool_returns_comes_from_its_output_schema() {
        assert!(returns(None).starts_with("the tool's text content as a str"));
        let schema = json!({
            "type": "object",
            "properties": {
                "timezone": {"type": "string", "description": "IANA name."},
                "is_dst": {"type": "boolean"},
                "source": {"$ref": "#/$defs/TimeResult"},
            },
            "required": ["timezone"],
        });
        assert_eq!(
            returns(Some(&schema)),
            "a dict (the tool's structured content) with these keys:\n\
             - `timezone` (string): IANA name.\n\
             - `is_dst` (boolean, may be absent)\n\
             - `source` (TimeResult, may be absent)"
        );
        assert!(returns(Some(&json!({"type": "object"}))).starts_with("a dict: the tool's"));
        let file = json!({"type": "object", "properties": {"content": {"type": "string"}}});
        let text = "the text of the tool's structured content's one field, `content`, as a str";
        assert!(returns(Some(&file)).starts_with(text));
    }
}
