//! The AgentOS C ABI (`libagentos`): a client of the kernel's protocol for
//! any language that can call C. `include/agentos.h` declares it and is the
//! reference; this file implements it over `agentos-proto`'s client.
//!
//! Memory: every reply and string the library returns is allocated with
//! `malloc` and NUL-terminated, and the caller releases it with
//! `agentos_free`. Errors: functions return a negative `agentos_status` (or
//! NULL) and `agentos_last_error()` says why, for the calling thread.
//! Threads: a client is locked inside, so threads may share one; its calls
//! then take turns.

#![allow(non_camel_case_types)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::Mutex;

use agentos_proto::{Client, ClientError, Opcode};

/// A connection to the kernel (opaque to C).
#[derive(Debug)]
pub struct agentos_client {
    inner: Mutex<Client>,
}

/// Success.
pub const AGENTOS_OK: c_int = 0;
/// A NULL or otherwise unusable argument.
pub const AGENTOS_ERR_ARGUMENT: c_int = -1;
/// The socket could not be reached.
pub const AGENTOS_ERR_CONNECT: c_int = -2;
/// Reading or writing the socket failed, or it was closed.
pub const AGENTOS_ERR_IO: c_int = -3;
/// The kernel's reply was not valid protocol.
pub const AGENTOS_ERR_PROTOCOL: c_int = -4;
/// Memory could not be allocated.
pub const AGENTOS_ERR_MEMORY: c_int = -5;
/// The connection failed earlier and cannot be used; connect again.
pub const AGENTOS_ERR_BROKEN: c_int = -6;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: &str) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

fn status_of(err: &ClientError) -> c_int {
    set_error(&err.to_string());
    match err {
        ClientError::Connect { .. } => AGENTOS_ERR_CONNECT,
        ClientError::Io(_) | ClientError::Closed => AGENTOS_ERR_IO,
        ClientError::Broken => AGENTOS_ERR_BROKEN,
        _ => AGENTOS_ERR_PROTOCOL,
    }
}

/// The calling thread's last error, as a sentence ("" if none). Valid
/// until the thread's next call into the library.
#[no_mangle]
pub extern "C" fn agentos_last_error() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ptr())
}

/// Connects to the kernel at `socket_path`, or with NULL where every
/// AgentOS client looks ($AGENTOS_SOCKET, the system socket as root, else
/// the user's). NULL on failure.
///
/// # Safety
/// `socket_path` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn agentos_connect(socket_path: *const c_char) -> *mut agentos_client {
    let connected = if socket_path.is_null() {
        Client::connect_default()
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(socket_path) };
        Client::connect(std::path::Path::new(&*path.to_string_lossy()))
    };
    match connected {
        Ok(client) => Box::into_raw(Box::new(agentos_client {
            inner: Mutex::new(client),
        })),
        Err(err) => {
            status_of(&err);
            std::ptr::null_mut()
        }
    }
}

/// Closes a connection (NULL is ignored).
///
/// # Safety
/// `client` is NULL or came from `agentos_connect` and is not used after.
#[no_mangle]
pub unsafe extern "C" fn agentos_close(client: *mut agentos_client) {
    if !client.is_null() {
        // SAFETY: it came from Box::into_raw in agentos_connect.
        drop(unsafe { Box::from_raw(client) });
    }
}

/// Releases what the library returned (NULL is ignored).
///
/// # Safety
/// `memory` is NULL or a reply or string this library returned, released
/// once.
#[no_mangle]
pub unsafe extern "C" fn agentos_free(memory: *mut c_void) {
    // SAFETY: the library allocates everything it returns with malloc.
    unsafe { libc::free(memory) };
}

/// Sends one request and waits for its reply: `*reply` (NUL-terminated,
/// release it with `agentos_free`) and `*reply_len` (without the NUL).
/// Returns `AGENTOS_OK` or a negative `agentos_status`.
///
/// # Safety
/// `client` came from `agentos_connect`; `payload` points to
/// `payload_len` bytes (or is NULL with length 0); `reply` and `reply_len`
/// are writable.
#[no_mangle]
pub unsafe extern "C" fn agentos_call(
    client: *mut agentos_client,
    opcode: u8,
    payload: *const c_void,
    payload_len: usize,
    reply: *mut *mut u8,
    reply_len: *mut usize,
) -> c_int {
    if client.is_null() || reply.is_null() || reply_len.is_null() {
        set_error("agentos_call: client, reply and reply_len must not be NULL");
        return AGENTOS_ERR_ARGUMENT;
    }
    let payload: &[u8] = if payload_len == 0 {
        &[]
    } else if payload.is_null() {
        set_error("agentos_call: payload is NULL but payload_len is not 0");
        return AGENTOS_ERR_ARGUMENT;
    } else {
        // SAFETY: the caller passes `payload_len` readable bytes.
        unsafe { std::slice::from_raw_parts(payload.cast::<u8>(), payload_len) }
    };
    // SAFETY: a live client from agentos_connect.
    let client = unsafe { &*client };
    let answered = {
        let mut inner = client
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.call(Opcode(opcode), payload)
    };
    match answered {
        Ok(answer) => match copy_out(&answer.payload) {
            Some(memory) => {
                // SAFETY: the caller passes writable pointers.
                unsafe {
                    *reply = memory;
                    *reply_len = answer.payload.len();
                }
                AGENTOS_OK
            }
            None => {
                set_error("agentos_call: out of memory for the reply");
                AGENTOS_ERR_MEMORY
            }
        },
        Err(err) => status_of(&err),
    }
}

/// `bytes` in malloc'd memory, NUL-terminated.
fn copy_out(bytes: &[u8]) -> Option<*mut u8> {
    // SAFETY: malloc of len + 1 bytes; NULL is checked.
    let memory = unsafe { libc::malloc(bytes.len() + 1) }.cast::<u8>();
    if memory.is_null() {
        return None;
    }
    // SAFETY: `memory` has room for the bytes and the NUL.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), memory, bytes.len());
        *memory.add(bytes.len()) = 0;
    }
    Some(memory)
}

/// One request whose payload is `text` (may be NULL: empty), the reply as
/// a malloc'd string, or NULL with the error set.
///
/// # Safety
/// As `agentos_call`; `text` is NULL or NUL-terminated.
unsafe fn request(client: *mut agentos_client, opcode: Opcode, text: *const c_char) -> *mut c_char {
    let payload: &[u8] = if text.is_null() {
        &[]
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        unsafe { CStr::from_ptr(text) }.to_bytes()
    };
    let mut reply = std::ptr::null_mut();
    let mut reply_len = 0;
    // SAFETY: forwarded from the caller; the out-pointers are our locals.
    let status = unsafe {
        agentos_call(
            client,
            opcode.0,
            payload.as_ptr().cast(),
            payload.len(),
            &mut reply,
            &mut reply_len,
        )
    };
    if status == AGENTOS_OK {
        reply.cast()
    } else {
        std::ptr::null_mut()
    }
}

macro_rules! typed {
    ($(#[$doc:meta])* $name:ident, $opcode:expr) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// `client` came from `agentos_connect`; `request` is NULL or a
        /// NUL-terminated string.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            client: *mut agentos_client,
            request: *const c_char,
        ) -> *mut c_char {
            // SAFETY: forwarded from the caller.
            unsafe { self::request(client, $opcode, request) }
        }
    };
}

typed!(
    /// HELLO: `request` is "" or "{}"; the reply's JSON.
    agentos_hello, Opcode::HELLO
);
typed!(
    /// NOOP: the kernel echoes `request`.
    agentos_noop, Opcode::NOOP
);
typed!(
    /// THINK: `request` is a prompt, or THINK's JSON object.
    agentos_think, Opcode::THINK
);
typed!(
    /// EXEC: `request` is EXEC's JSON (`{"code": "print(1)"}`).
    agentos_exec, Opcode::EXEC
);
typed!(
    /// TOOL: `request` is TOOL's JSON (`{"op": "list"}`).
    agentos_tool, Opcode::TOOL
);
typed!(
    /// SPAWN: `request` is SPAWN's JSON.
    agentos_spawn, Opcode::SPAWN
);
typed!(
    /// KILL: `request` is KILL's JSON (`{"name": "worker"}`).
    agentos_kill, Opcode::KILL
);
typed!(
    /// LIST: `request` is "" or "{}"; the reply is a JSON array.
    agentos_list, Opcode::LIST
);
typed!(
    /// TASK: `request` is TASK's JSON (`{"op": "list"}`).
    agentos_task, Opcode::TASK
);
typed!(
    /// LOGS: `request` is LOGS' JSON (`{"name": "worker", "lines": 20}`).
    agentos_logs, Opcode::LOGS
);
