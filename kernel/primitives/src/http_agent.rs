//! The outbound HTTP agent (ureq), built in one place so that it never
//! follows a redirect.
//!
//! The daemons' outbound calls carry secrets in their headers: an LLM
//! provider's API key, an MCP server's credentials, a collector's token.
//! A redirect would carry those headers to wherever it points, another
//! host included; none of the services called redirects an API call, so
//! a 3xx comes back as the answer, never as a hop. Nothing here lets a
//! caller turn redirects on.
//!
//! What differs between callers is a parameter: how long a connection
//! and a whole call may take, whether an error status is an error or an
//! answer to read, how many idle connections to keep, the user agent.
//! TLS is ureq's own (rustls, the Mozilla roots of `webpki-roots`).
//!
//! ```
//! use std::time::Duration;
//! use agentos_primitives::http_agent::{HttpAgent, Timeouts};
//!
//! let agent = HttpAgent::new(Timeouts {
//!     connect: Some(Duration::from_secs(5)),
//!     call: None,
//! })
//! .statuses_as_answers()
//! .user_agent("agentosd/0.1.0")
//! .build();
//! assert_eq!(agent.config().max_redirects(), 0);
//! ```

use std::time::Duration;

/// How long the parts of a call may take (`None`: no limit of its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// A connection: name lookup, TCP and TLS together. A host that drops
    /// packets is then as unreachable as one that refuses them.
    pub connect: Option<Duration>,
    /// A whole call, from the first byte sent to the last read. A caller
    /// whose calls each have a deadline of their own sets it per request
    /// instead (ureq's `timeout_global` on the request's config).
    pub call: Option<Duration>,
}

/// How an outbound agent is built: its timeouts, and what else may vary.
#[derive(Clone, Debug)]
pub struct HttpAgent {
    timeouts: Timeouts,
    statuses_as_errors: bool,
    idle_connections_per_host: Option<usize>,
    user_agent: Option<String>,
}

impl HttpAgent {
    /// An agent with `timeouts`; a 4xx or 5xx status is an error, idle
    /// connections and the user agent are ureq's defaults.
    pub fn new(timeouts: Timeouts) -> HttpAgent {
        HttpAgent {
            timeouts,
            statuses_as_errors: true,
            idle_connections_per_host: None,
            user_agent: None,
        }
    }

    /// Makes a 4xx or 5xx status an answer to read (a provider's error
    /// body says why it refused), not an error.
    pub fn statuses_as_answers(mut self) -> HttpAgent {
        self.statuses_as_errors = false;
        self
    }

    /// Keeps up to `count` idle connections to one host (one per caller
    /// thread, so none of them waits for a new TLS handshake).
    pub fn idle_connections_per_host(mut self, count: usize) -> HttpAgent {
        self.idle_connections_per_host = Some(count);
        self
    }

    /// Sends `user_agent` as the `User-Agent` header.
    pub fn user_agent(mut self, user_agent: &str) -> HttpAgent {
        self.user_agent = Some(user_agent.to_owned());
        self
    }

    /// The agent.
    pub fn build(self) -> ureq::Agent {
        let mut config = ureq::Agent::config_builder()
            // Fixed: a redirect would carry the request's headers, secrets
            // among them, to wherever it points.
            .max_redirects(0)
            .http_status_as_error(self.statuses_as_errors)
            .timeout_connect(self.timeouts.connect)
            .timeout_global(self.timeouts.call);
        if let Some(count) = self.idle_connections_per_host {
            config = config.max_idle_connections_per_host(count);
        }
        if let Some(user_agent) = self.user_agent {
            config = config.user_agent(user_agent);
        }
        config.build().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;

    /// A server at the returned URL that answers one request with `reply`.
    fn answering_once(reply: String) -> (String, std::thread::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1/chat", listener.local_addr().unwrap());
        let served = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
                line.clear();
            }
            reader.get_mut().write_all(reply.as_bytes()).unwrap();
        });
        (url, served)
    }

    #[test]
    fn a_redirect_is_the_answer_and_the_other_host_never_hears_the_key() {
        let elsewhere = TcpListener::bind("127.0.0.1:0").unwrap();
        elsewhere.set_nonblocking(true).unwrap();
        let location = format!("http://{}/steal", elsewhere.local_addr().unwrap());
        for agent in [
            HttpAgent::new(Timeouts::default()).build(),
            HttpAgent::new(Timeouts::default())
                .statuses_as_answers()
                .build(),
        ] {
            let (url, served) = answering_once(format!(
                "HTTP/1.1 307 Temporary Redirect\r\nlocation: {location}\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n"
            ));
            let response = agent
                .post(&url)
                .header("authorization", "Bearer secret")
                .send(&b"{}"[..])
                .unwrap();
            served.join().unwrap();
            assert_eq!(response.status().as_u16(), 307);
            let accepted = elsewhere.accept();
            assert!(
                matches!(&accepted, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
                "the redirect was followed: {accepted:?}"
            );
        }
    }

    #[test]
    fn what_varies_is_set_as_asked() {
        let timeouts = Timeouts {
            connect: Some(Duration::from_secs(5)),
            call: Some(Duration::from_secs(7)),
        };
        let agent = HttpAgent::new(timeouts)
            .statuses_as_answers()
            .idle_connections_per_host(4)
            .build();
        let config = agent.config();
        assert_eq!(config.max_redirects(), 0);
        assert!(!config.http_status_as_error());
        assert_eq!(config.max_idle_connections_per_host(), 4);
        assert_eq!(config.timeouts().connect, Some(Duration::from_secs(5)));
        assert_eq!(config.timeouts().global, Some(Duration::from_secs(7)));

        let plain = HttpAgent::new(Timeouts::default()).build();
        assert!(plain.config().http_status_as_error());
        assert_eq!(plain.config().timeouts().global, None);
    }

    #[test]
    fn an_error_status_is_an_error_unless_asked_to_be_an_answer() {
        for (agent, is_error) in [
            (HttpAgent::new(Timeouts::default()).build(), true),
            (
                HttpAgent::new(Timeouts::default())
                    .statuses_as_answers()
                    .build(),
                false,
            ),
        ] {
            let (url, served) = answering_once(
                "HTTP/1.1 429 Too Many Requests\r\ncontent-length: 0\r\n\
                 connection: close\r\n\r\n"
                    .to_owned(),
            );
            let result = agent.get(&url).call();
            served.join().unwrap();
            match result {
                Err(ureq::Error::StatusCode(429)) => assert!(is_error),
                Ok(response) => {
                    assert!(!is_error);
                    assert_eq!(response.status().as_u16(), 429);
                }
                Err(other) => panic!("unexpected: {other}"),
            }
        }
    }
}
