//! A resource's contents: a file's MIME type from its extension, and its
//! bytes as text or as a base64 blob.

use base64::Engine;
use rmcp::model::ResourceContents;

/// The MIME type a file's extension suggests, if it is a common one.
pub fn mime_type_of(path: &str) -> Option<&'static str> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let (_, extension) = name.rsplit_once('.')?;
    let mime = match extension.to_ascii_lowercase().as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "xml" => "application/xml",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/jsonl",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "js" | "mjs" => "text/javascript",
        "py" => "text/x-python",
        "sh" => "application/x-sh",
        "rs" => "text/x-rust",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        "parquet" => "application/vnd.apache.parquet",
        _ => return None,
    };
    Some(mime)
}

/// Whether a MIME type is text a client shows as such.
fn is_textual(mime: &str) -> bool {
    mime.starts_with("text/")
        || matches!(
            mime,
            "application/json"
                | "application/jsonl"
                | "application/xml"
                | "application/yaml"
                | "application/toml"
                | "application/x-sh"
                | "image/svg+xml"
        )
}

/// A file's contents as MCP carries them: text when its type is textual
/// (or unknown) and it is UTF-8, else the bytes as base64.
pub fn file_contents(
    uri: String,
    path: &str,
    base64_content: String,
) -> Result<ResourceContents, base64::DecodeError> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(&base64_content)?;
    let mime = mime_type_of(path);
    let text_allowed = mime.is_none_or(is_textual);
    match String::from_utf8(bytes) {
        Ok(text) if text_allowed => {
            Ok(ResourceContents::text(text, uri).with_mime_type(mime.unwrap_or("text/plain")))
        }
        _ => Ok(ResourceContents::blob(base64_content, uri)
            .with_mime_type(mime.unwrap_or("application/octet-stream"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_comes_as_text_and_binary_as_base64() {
        let engine = base64::engine::general_purpose::STANDARD;
        let text = file_contents("u".into(), "notes.md", engine.encode("# hi")).unwrap();
        assert_eq!(
            text,
            ResourceContents::text("# hi", "u").with_mime_type("text/markdown")
        );
        let unknown = file_contents("u".into(), "README", engine.encode("hi")).unwrap();
        assert_eq!(
            unknown,
            ResourceContents::text("hi", "u").with_mime_type("text/plain")
        );
        let png = engine.encode([0x89, b'P', b'N', b'G']);
        let image = file_contents("u".into(), "plot.png", png.clone()).unwrap();
        assert_eq!(
            image,
            ResourceContents::blob(png, "u").with_mime_type("image/png")
        );
        let bytes = engine.encode([0xff, 0xfe, 0x00]);
        let binary = file_contents("u".into(), "data", bytes.clone()).unwrap();
        assert_eq!(
            binary,
            ResourceContents::blob(bytes, "u").with_mime_type("application/octet-stream")
        );
    }
}
