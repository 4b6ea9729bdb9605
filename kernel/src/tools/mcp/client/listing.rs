//! A server's tools: the last complete `tools/list`, the listing under way
//! page by page (a repeated cursor or too many pages stop it), and, over
//! HTTP, the arguments each tool mirrors into headers ([`param_headers`]).

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

use crate::tools::mcp::param_headers::{self, ParamHeader};

/// `tools/list` pages read at most in one listing.
const MAX_PAGES: usize = 100;

/// A tool as its server describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON schema of its arguments.
    pub input_schema: Value,
    /// The JSON schema of its structured result, if it gives one.
    pub output_schema: Option<Value>,
}

/// What a page of `tools/list` leads to.
#[derive(Debug, PartialEq)]
pub enum Page {
    /// The next page is to be asked for, from this cursor.
    Next(String),
    /// The listing is complete, with this many tools; `relist`: the list
    /// changed while it was under way, so it is to be listed again.
    Complete {
        /// The tools listed.
        tools: usize,
        /// Whether to list again.
        relist: bool,
    },
    /// The listing stops here, and why: the server fails.
    Stopped(String),
    /// No listing was under way (it was given up): the page is ignored.
    Unasked,
}

/// A server's tools, as listed.
#[derive(Debug, Default)]
pub struct Listing {
    /// Tools of the last complete listing.
    tools: Vec<ToolInfo>,
    /// A listing under way: the pages' tools so far, the cursors seen.
    under_way: Option<(Vec<ToolInfo>, HashSet<String>)>,
    /// The list changed while a listing was under way.
    relist: bool,
    /// Over HTTP, the arguments each listed tool mirrors into headers.
    param_headers: HashMap<String, Vec<ParamHeader>>,
    /// Whether the server is reached over HTTP, where annotations count.
    over_http: bool,
}

impl Listing {
    /// No tools yet, of a server reached over HTTP (`over_http`) or not.
    pub fn new(over_http: bool) -> Listing {
        Listing {
            over_http,
            ..Listing::default()
        }
    }

    /// The tools of the last complete listing.
    pub fn tools(&self) -> &[ToolInfo] {
        &self.tools
    }

    /// A page is asked for, from `cursor` (the first page: none).
    pub fn asking(&mut self, cursor: Option<&str>) {
        let (_, cursors) = self
            .under_way
            .get_or_insert_with(|| (Vec::new(), HashSet::new()));
        if let Some(cursor) = cursor {
            cursors.insert(cursor.to_owned());
        }
    }

    /// The listing under way, if any, is given up.
    pub fn give_up(&mut self) {
        self.under_way = None;
    }

    /// The server says its list changed: whether to list it now. When a
    /// listing is under way it is listed again once that one completes,
    /// since its pages may have missed the change.
    pub fn changed(&mut self) -> bool {
        if self.under_way.is_some() {
            self.relist = true;
            return false;
        }
        true
    }

    /// A page of the listing under way, from the server `server`.
    pub fn page(&mut self, result: &Value, server: &str) -> Page {
        let Some((mut tools, cursors)) = self.under_way.take() else {
            return Page::Unasked;
        };
        let page = result.get("tools").and_then(Value::as_array);
        tools.extend(page.into_iter().flatten().filter_map(tool_info));
        if let Some(next) = result.get("nextCursor").and_then(Value::as_str) {
            if cursors.contains(next) {
                return Page::Stopped(format!(
                    "tools/list repeated the cursor {next:?}; listing stopped"
                ));
            }
            if cursors.len() + 1 >= MAX_PAGES {
                return Page::Stopped(format!(
                    "tools/list gave more than {MAX_PAGES} pages; listing stopped"
                ));
            }
            self.under_way = Some((tools, cursors));
            return Page::Next(next.to_owned());
        }
        self.tools = self.with_param_headers(tools, server);
        Page::Complete {
            tools: self.tools.len(),
            relist: std::mem::take(&mut self.relist),
        }
    }

    /// The headers a call of `tool` with `arguments` carries over HTTP.
    pub fn headers_for(&self, tool: &str, arguments: &Value) -> Vec<(String, String)> {
        match self.param_headers.get(tool) {
            Some(annotated) => param_headers::for_call(annotated, arguments),
            None => Vec::new(),
        }
    }

    /// Over HTTP, the tools listed, less those whose `x-mcp-header`
    /// annotations are invalid (which the specification says a client
    /// must leave out); their annotated arguments are noted.
    fn with_param_headers(&mut self, tools: Vec<ToolInfo>, server: &str) -> Vec<ToolInfo> {
        self.param_headers.clear();
        if !self.over_http {
            return tools;
        }
        let mut kept = Vec::with_capacity(tools.len());
        for tool in tools {
            match param_headers::of_schema(&tool.input_schema) {
                Ok(annotated) => {
                    if !annotated.is_empty() {
                        self.param_headers.insert(tool.name.clone(), annotated);
                    }
                    kept.push(tool);
                }
                Err(why) => log::warn!("MCP server {server}: tool {:?} left out: {why}", tool.name),
            }
        }
        kept
    }
}

/// A `tools/list` entry, if it has a name.
fn tool_info(tool: &Value) -> Option<ToolInfo> {
    Some(ToolInfo {
        name: tool.get("name")?.as_str()?.to_owned(),
        description: tool
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        input_schema: tool.get("inputSchema").cloned().unwrap_or_else(any_object),
        output_schema: tool.get("outputSchema").cloned(),
    })
}

/// The schema of a tool that gives none: any object.
fn any_object() -> Value {
    let mut schema = Map::new();
    schema.insert("type".to_owned(), Value::from("object"));
    Value::Object(schema)
}
