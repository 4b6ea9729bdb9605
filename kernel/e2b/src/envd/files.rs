//! envd's `/files`: a file of the sandbox downloaded (`GET`, read from
//! the kernel 4 MiB at a time and streamed on as read) or uploaded
//! (`POST`: multipart `file` parts, or the body itself as
//! `application/octet-stream`, gzip-compressed or not), written 512 KiB
//! at a time as the body comes, never held whole.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use agentos_http::kernel_link::Wait;
use agentos_http::Body;
use agentos_http::RequestBody;
use agentos_proto::payload::{
    FileCall, FileEntryReply, FilePath, FileRead, FileReadReply, FileType, FileWrite,
    MAX_READ_BYTES, MAX_WRITE_BYTES,
};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use bytes::Bytes;
use flate2::write::GzDecoder;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use http_body_util::{BodyDataStream, BodyExt};
use serde::Serialize;
use tokio::sync::mpsc;

use super::connect::{channel_body, ConnectError};
use super::process::resolve;
use super::session::Session;
use crate::answer::{json, ApiError};

/// Parts a multipart upload may carry.
const MAX_PARTS: usize = 1000;
/// Chunks read ahead of a slow downloader.
const DOWNLOAD_BACKLOG: usize = 2;
/// Compressed bytes inflated at a time (deflate's ratio is at most about
/// 1032 to 1, so each step makes at most about 1 MiB).
const GZIP_STEP: usize = 1024;
/// The prefix of a header carrying a file's metadata.
const METADATA_HEADER: &str = "x-metadata-";

/// What `/files` is asked: the path, and the user (which must be the
/// sandbox's).
#[derive(Debug, Default)]
pub struct FilesQuery {
    pub path: Option<String>,
}

/// An ApiError from a kernel op's Connect error, at its status.
fn api(err: ConnectError) -> ApiError {
    ApiError::new(err.status(), err.message)
}

/// `GET /files?path=`: the file's bytes, streamed as they are read.
pub async fn download(session: Session, asked: FilesQuery) -> Result<Response<Body>, ApiError> {
    let path = resolve(asked.path.as_deref().unwrap_or(""));
    let stat = FileCall::Stat(FilePath {
        session: session.id.clone(),
        path: path.clone(),
    });
    let entry = session
        .op::<FileEntryReply>(&stat, Wait::AsLongAsTheKernel)
        .await
        .map_err(api)?
        .entry;
    if entry.kind != FileType::File {
        return Err(ApiError::bad_request(format!(
            "path '{path}' is not a regular file"
        )));
    }
    let (sender, receiver) = mpsc::channel::<Bytes>(DOWNLOAD_BACKLOG);
    let name = entry.name.clone();
    let size = entry.size;
    tokio::spawn(async move {
        let mut offset = 0;
        // The body is the file's size when it was found: a read that fails
        // midway ends it short of its Content-Length, which the client
        // sees as a failed download, not a short file.
        while offset < size {
            let read = FileCall::Read(FileRead {
                session: session.id.clone(),
                path: path.clone(),
                offset,
                length: Some(MAX_READ_BYTES.min(size - offset)),
            });
            let Ok(read) = session
                .op::<FileReadReply>(&read, Wait::AsLongAsTheKernel)
                .await
            else {
                return;
            };
            let Ok(bytes) = STANDARD.decode(read.data.as_bytes()) else {
                return;
            };
            offset += bytes.len() as u64;
            let done = read.eof || bytes.is_empty();
            if sender.send(Bytes::from(bytes)).await.is_err() || done {
                return;
            }
        }
    });
    let mut response = Response::new(channel_body(receiver));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(disposition) = HeaderValue::from_str(&format!("inline; filename={name:?}")) {
        headers.insert(header::CONTENT_DISPOSITION, disposition);
    }
    Ok(response)
}

/// One file uploaded, as envd answers.
#[derive(Debug, Serialize)]
struct Written {
    path: String,
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    metadata: BTreeMap<String, String>,
}

/// A file being written as its bytes come: 512 KiB a write, the first
/// making its directories and setting its metadata, each ending the file
/// where its bytes end.
struct FileWriter<'s> {
    session: &'s Session,
    path: String,
    /// Set by the first write: an upload replaces the file's metadata
    /// (with none, clears it).
    metadata: BTreeMap<String, String>,
    pending: Vec<u8>,
    offset: u64,
    started: bool,
}

impl<'s> FileWriter<'s> {
    fn new(
        session: &'s Session,
        path: String,
        metadata: &BTreeMap<String, String>,
    ) -> FileWriter<'s> {
        FileWriter {
            session,
            path,
            metadata: metadata.clone(),
            pending: Vec::new(),
            offset: 0,
            started: false,
        }
    }

    async fn push(&mut self, mut bytes: &[u8]) -> Result<(), ApiError> {
        while !bytes.is_empty() {
            let room = MAX_WRITE_BYTES - self.pending.len();
            let (now, later) = bytes.split_at(room.min(bytes.len()));
            self.pending.extend_from_slice(now);
            bytes = later;
            if self.pending.len() == MAX_WRITE_BYTES {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ApiError> {
        let write = FileCall::Write(FileWrite {
            session: self.session.id.clone(),
            path: self.path.clone(),
            data: STANDARD.encode(&self.pending),
            offset: self.offset,
            truncate: true,
            parents: !self.started,
            metadata: (!self.started).then(|| self.metadata.clone()),
        });
        self.session
            .op::<FileEntryReply>(&write, Wait::AsLongAsTheKernel)
            .await
            .map_err(|err| match err.code {
                "resource_exhausted" => ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    format!("not enough disk space available: {}", err.message),
                ),
                _ => api(err),
            })?;
        self.offset += self.pending.len() as u64;
        self.pending.clear();
        self.started = true;
        Ok(())
    }

    /// Writes what is left (an empty file too); what was written.
    async fn finish(mut self) -> Result<Written, ApiError> {
        if !self.pending.is_empty() || !self.started {
            self.flush().await?;
        }
        let name = self.path.rsplit('/').next().unwrap_or_default().to_owned();
        Ok(Written {
            path: self.path,
            name,
            kind: "file",
            metadata: self.metadata,
        })
    }
}

/// The `X-Metadata-*` headers, keys lower-cased.
fn metadata_of(headers: &HeaderMap) -> Result<BTreeMap<String, String>, ApiError> {
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else {
            continue;
        };
        let value = value
            .to_str()
            .map_err(|_| ApiError::bad_request(format!("metadata {key}: not printable ASCII")))?;
        metadata.insert(key.to_owned(), value.to_owned());
    }
    Ok(metadata)
}

/// `POST /files`: multipart `file` parts, each to the query's path or
/// its own file name; or an `application/octet-stream` body to the
/// query's path. At most `max_bytes` in all.
pub async fn upload(
    session: Session,
    headers: &HeaderMap,
    asked: FilesQuery,
    body: RequestBody,
    max_bytes: u64,
) -> Result<Response<Body>, ApiError> {
    let metadata = metadata_of(headers)?;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let gzip = match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|value| value.to_str().ok())
    {
        None | Some("identity") => false,
        Some("gzip") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Content-Encoding {other}: give gzip or none"
            )))
        }
    };
    let mut budget = Budget { left: max_bytes };
    let written = if content_type.starts_with("multipart/form-data") {
        if gzip {
            return Err(ApiError::bad_request(
                "a gzip-compressed multipart body: compress an application/octet-stream body",
            ));
        }
        let boundary = multer::parse_boundary(content_type)
            .map_err(|err| ApiError::bad_request(format!("the multipart body: {err}")))?;
        let parts = multer::Multipart::new(BodyDataStream::new(body), boundary);
        upload_parts(
            &session,
            parts,
            asked.path.as_deref(),
            &metadata,
            &mut budget,
        )
        .await?
    } else if content_type.starts_with("application/octet-stream") {
        let path = asked
            .path
            .as_deref()
            .ok_or_else(|| ApiError::bad_request("an octet-stream upload needs ?path="))?;
        let mut writer = FileWriter::new(&session, resolve(path), &metadata);
        let mut body = body;
        let mut decoder = gzip.then(|| GzDecoder::new(Vec::new()));
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|err| ApiError::bad_request(format!("reading the body: {err}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let Some(decoder) = decoder.as_mut() else {
                budget.spend(data.len())?;
                writer.push(&data).await?;
                continue;
            };
            // A little compressed input at a time, its output charged and
            // written before more is taken: a small body that inflates to
            // gigabytes is stopped at the budget, never held whole.
            for part in data.chunks(GZIP_STEP) {
                decoder
                    .write_all(part)
                    .map_err(|err| ApiError::bad_request(format!("the gzip body: {err}")))?;
                let plain = std::mem::take(decoder.get_mut());
                budget.spend(plain.len())?;
                writer.push(&plain).await?;
            }
        }
        if let Some(decoder) = decoder {
            let rest = decoder
                .finish()
                .map_err(|err| ApiError::bad_request(format!("the gzip body: {err}")))?;
            budget.spend(rest.len())?;
            writer.push(&rest).await?;
        }
        vec![writer.finish().await?]
    } else {
        return Err(ApiError::bad_request(format!(
            "unsupported content type {content_type:?}: send multipart/form-data or \
             application/octet-stream"
        )));
    };
    Ok(json(StatusCode::OK, &written))
}

/// What an upload may still write.
struct Budget {
    left: u64,
}

impl Budget {
    fn spend(&mut self, bytes: usize) -> Result<(), ApiError> {
        self.left = self.left.checked_sub(bytes as u64).ok_or_else(|| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "the upload is larger than agentos e2b takes (--max-upload-mib)",
            )
        })?;
        Ok(())
    }
}

async fn upload_parts(
    session: &Session,
    mut parts: multer::Multipart<'_>,
    path: Option<&str>,
    metadata: &BTreeMap<String, String>,
    budget: &mut Budget,
) -> Result<Vec<Written>, ApiError> {
    let mut written = Vec::new();
    let mut targets = BTreeSet::new();
    let bad = |err: multer::Error| ApiError::bad_request(format!("the multipart body: {err}"));
    while let Some(mut part) = parts.next_field().await.map_err(bad)? {
        if part.name() != Some("file") {
            continue;
        }
        if written.len() == MAX_PARTS {
            return Err(ApiError::bad_request(format!(
                "at most {MAX_PARTS} files an upload"
            )));
        }
        let target = match path.or(part.file_name()) {
            Some(target) => resolve(target),
            None => return Err(ApiError::bad_request("a file part without a file name")),
        };
        if !targets.insert(target.clone()) {
            return Err(ApiError::bad_request(format!(
                "two parts are written to {target}"
            )));
        }
        let mut writer = FileWriter::new(session, target, metadata);
        while let Some(chunk) = part.chunk().await.map_err(bad)? {
            budget.spend(chunk.len())?;
            writer.push(&chunk).await?;
        }
        written.push(writer.finish().await?);
    }
    Ok(written)
}
