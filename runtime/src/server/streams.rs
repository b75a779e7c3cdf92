//! Resumable streams, as llama-server's (`tools/server/server-stream.cpp`): a streamed
//! completion sent with an `X-Conversation-Id: ID` header keeps a copy of the bytes of its
//! server-sent events under `ID`, so that a client that lost the connection (a page reload)
//! can read them again and follow the rest live.
//!
//! - `GET /v1/stream?conv_id=ID&from=N`: the stream's bytes from byte offset `N` (default 0),
//!   then, while the generation runs, the rest as it comes (`text/event-stream`). 400
//!   without `conv_id`, for a `from` that is not a number (`Invalid 'from' offset`) or one
//!   below what was dropped (`Stream offset lost, please restart`); 404 for an unknown id.
//! - `DELETE /v1/stream?conv_id=ID`: the user's Stop: the generation is cancelled, its
//!   client's stream ends there (no `[DONE]`, no error event, as llama-server's), and the
//!   session is forgotten. Always 204 (also for an unknown id); 400 without `conv_id`.
//! - `POST /v1/streams/lookup` with `{"conversation_ids": [...]}`: the sessions of those ids
//!   (an id also matches `ID::anything`, llama-server's per-model variants), each as
//!   `{conversation_id, is_done, total_bytes, started_at, completed_at}`; never a list of all.
//!
//! What is kept, as llama-server: one session per id (a new request with the same id cancels
//! the old one's generation and replaces it); at most [`MAX_BYTES`] per session (past that
//! the oldest bytes are dropped and offsets below them are lost); a finished session stays
//! [`TTL`] after its end (swept whenever sessions are looked at, where llama-server sweeps
//! every minute). A client that disconnects does not stop a request with an id: its
//! generation runs to its end into the session. A request that fails before its stream
//! starts leaves no session behind, and a non-streamed request's session lives only while
//! it runs.

use axum::body::Bytes;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a finished session stays readable (llama-server's `STREAM_SESSION_TTL_SECONDS`).
pub const TTL: Duration = Duration::from_secs(300);

/// Most bytes a session keeps (llama-server's `STREAM_SESSION_MAX_BYTES`).
pub const MAX_BYTES: usize = 4 << 20;

/// The request header that names a request's stream session.
pub const HEADER: &str = "x-conversation-id";

/// Unix seconds now.
fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The bytes of one session and where they stand.
#[derive(Default)]
struct Buffer {
    /// The bytes kept: those from offset `dropped` on.
    data: Vec<u8>,
    /// Bytes dropped from the front (past [`MAX_BYTES`]).
    dropped: usize,
    /// No more bytes will come.
    done: bool,
    /// When it was finished (Unix seconds; 0 while it runs).
    completed_at: u64,
    /// When it was finished, for [`TTL`].
    completed: Option<Instant>,
}

/// What [`StreamSession::read`] found at an offset.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// The bytes from the offset to the end of what is there.
    Bytes(Bytes),
    /// Nothing more yet; the session runs.
    Pending,
    /// Nothing more, ever.
    End,
    /// The offset is below the bytes kept.
    Lost,
}

/// One conversation's stream: the bytes its request sent, kept for readers.
pub struct StreamSession {
    /// The id (`X-Conversation-Id`).
    pub id: String,
    /// When it started (Unix seconds).
    pub started_at: u64,
    buffer: Mutex<Buffer>,
    /// Bumped on every change (bytes appended, finished): readers wait on it.
    changed: watch::Sender<u64>,
    /// Set by a Stop (`DELETE`): the producer stops.
    cancelled: watch::Sender<bool>,
}

impl StreamSession {
    fn new(id: String) -> StreamSession {
        StreamSession {
            id,
            started_at: now_seconds(),
            buffer: Mutex::new(Buffer::default()),
            changed: watch::Sender::new(0),
            cancelled: watch::Sender::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// Appends `bytes` (dropping the oldest past [`MAX_BYTES`]); false once finished.
    pub fn append(&self, bytes: &[u8]) -> bool {
        if bytes.is_empty() {
            return true;
        }
        {
            let mut b = self.lock();
            if b.done {
                return false;
            }
            if bytes.len() >= MAX_BYTES {
                // One chunk larger than the cap: only its tail is kept.
                let skip = bytes.len() - MAX_BYTES;
                b.dropped += b.data.len() + skip;
                b.data.clear();
                b.data.extend_from_slice(&bytes[skip..]);
            } else {
                let excess = (b.data.len() + bytes.len()).saturating_sub(MAX_BYTES);
                if excess > 0 {
                    b.data.drain(..excess);
                    b.dropped += excess;
                }
                b.data.extend_from_slice(bytes);
            }
        }
        self.bump();
        true
    }

    /// Marks the session finished: readers get what is there, then the end.
    pub fn finish(&self) {
        {
            let mut b = self.lock();
            if b.done {
                return;
            }
            b.done = true;
            b.completed_at = now_seconds();
            b.completed = Some(Instant::now());
        }
        self.bump();
    }

    /// Stops the producer (a `DELETE`).
    pub fn cancel(&self) {
        self.cancelled.send_replace(true);
    }

    /// Whether a Stop came.
    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Returns once a Stop came.
    pub async fn cancelled(&self) {
        let mut rx = self.cancelled.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Whether it is finished.
    pub fn is_done(&self) -> bool {
        self.lock().done
    }

    /// Bytes that ever entered it.
    pub fn total_bytes(&self) -> usize {
        let b = self.lock();
        b.dropped + b.data.len()
    }

    /// Bytes dropped from the front.
    pub fn dropped(&self) -> usize {
        self.lock().dropped
    }

    /// When it finished (Unix seconds; 0 while it runs).
    pub fn completed_at(&self) -> u64 {
        self.lock().completed_at
    }

    fn expired(&self, now: Instant) -> bool {
        self.lock()
            .completed
            .is_some_and(|t| now.duration_since(t) >= TTL)
    }

    /// The bytes from `offset` on (see [`Read`]).
    pub fn read(&self, offset: usize) -> Read {
        let b = self.lock();
        if offset < b.dropped {
            return Read::Lost;
        }
        let end = b.dropped + b.data.len();
        if offset < end {
            return Read::Bytes(Bytes::copy_from_slice(&b.data[offset - b.dropped..]));
        }
        if b.done {
            Read::End
        } else {
            Read::Pending
        }
    }

    /// The stream's bytes from `offset`: what is there, then the rest as it comes, until
    /// the session finishes (or the offset falls below what is kept).
    pub fn follow(
        self: Arc<Self>,
        offset: usize,
    ) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
        let rx = self.changed.subscribe();
        futures_util::stream::unfold(
            (self, offset, rx),
            |(session, mut offset, mut rx)| async move {
                loop {
                    rx.borrow_and_update();
                    match session.read(offset) {
                        Read::Bytes(b) => {
                            offset += b.len();
                            return Some((Ok(b), (session, offset, rx)));
                        }
                        Read::End | Read::Lost => return None,
                        Read::Pending => {
                            if rx.changed().await.is_err() {
                                return None;
                            }
                        }
                    }
                }
            },
        )
    }
}

/// All sessions, by id.
#[derive(Default)]
pub struct Streams {
    sessions: Mutex<HashMap<String, Arc<StreamSession>>>,
}

impl Streams {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<StreamSession>>> {
        let mut map = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        map.retain(|_, s| !s.expired(now));
        map
    }

    /// A new session for `id`; one that had the id is cancelled and finished.
    pub fn create(&self, id: &str) -> Arc<StreamSession> {
        let fresh = Arc::new(StreamSession::new(id.to_string()));
        let previous = self.lock().insert(id.to_string(), fresh.clone());
        if let Some(p) = previous {
            p.cancel();
            p.finish();
        }
        fresh
    }

    /// The session of `id`.
    pub fn get(&self, id: &str) -> Option<Arc<StreamSession>> {
        self.lock().get(id).cloned()
    }

    /// Forgets `session` (if it is still the one under its id) and finishes it.
    pub fn evict(&self, session: &Arc<StreamSession>) {
        {
            let mut map = self.lock();
            if map
                .get(&session.id)
                .is_some_and(|s| Arc::ptr_eq(s, session))
            {
                map.remove(&session.id);
            }
        }
        session.finish();
    }

    /// The Stop: forgets the session of `id`, cancels its generation, finishes it.
    /// Whether there was one.
    pub fn stop(&self, id: &str) -> bool {
        let Some(s) = self.lock().remove(id) else {
            return false;
        };
        s.cancel();
        s.finish();
        true
    }

    /// The sessions of `ids`: each id's own and its `ID::...` variants, in the order asked.
    pub fn lookup(&self, ids: &[String]) -> Vec<Arc<StreamSession>> {
        let all: Vec<Arc<StreamSession>> = self.lock().values().cloned().collect();
        let mut out = Vec::new();
        for id in ids {
            let variant = format!("{id}::");
            out.extend(
                all.iter()
                    .filter(|s| s.id == *id || s.id.starts_with(&variant))
                    .cloned(),
            );
        }
        out
    }
}

/// The producer's hold on a session (llama-server's `stream_pipe_producer`): while the
/// stream has not started, dropping it forgets the session (the request failed); once
/// started, dropping it finishes the session.
pub struct Producer {
    streams: Arc<Streams>,
    /// The session written to.
    pub session: Arc<StreamSession>,
    started: bool,
}

impl Producer {
    /// A new session for `id` in `streams`.
    pub fn new(streams: &Arc<Streams>, id: &str) -> Producer {
        Producer {
            streams: streams.clone(),
            session: streams.create(id),
            started: false,
        }
    }

    /// The stream started: its bytes are kept from now on.
    pub fn start(&mut self) {
        self.started = true;
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if self.started {
            self.session.finish();
        } else {
            self.streams.evict(&self.session);
        }
    }
}

/// `from` as llama-server reads it (`std::stoull`): leading blanks, an optional sign (a
/// minus wraps around), decimal digits, anything after them ignored; `None` without
/// digits or past `u64`.
pub fn parse_offset(s: &str) -> Option<u64> {
    let s = s.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = rest[..digits].parse().ok()?;
    Some(if neg { n.wrapping_neg() } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_read_as_stoull() {
        assert_eq!(parse_offset("12"), Some(12));
        assert_eq!(parse_offset(" 12abc"), Some(12));
        assert_eq!(parse_offset("+3"), Some(3));
        assert_eq!(parse_offset("-1"), Some(u64::MAX));
        assert_eq!(parse_offset("abc"), None);
        assert_eq!(parse_offset(""), None);
        assert_eq!(parse_offset("99999999999999999999999"), None);
    }

    #[test]
    fn sessions_keep_the_tail_and_replace() {
        let streams = Arc::new(Streams::default());
        let mut p = Producer::new(&streams, "a/b::c");
        p.start();
        let s = p.session.clone();
        assert!(s.append(b"data: 1\n\n"));
        assert_eq!(s.read(0), Read::Bytes(Bytes::from_static(b"data: 1\n\n")));
        assert_eq!(s.read(6), Read::Bytes(Bytes::from_static(b"1\n\n")));
        assert_eq!(s.read(9), Read::Pending);
        let big = vec![b'x'; MAX_BYTES];
        s.append(&big);
        assert_eq!(s.dropped(), 9);
        assert_eq!(s.read(0), Read::Lost);
        assert_eq!(s.total_bytes(), 9 + MAX_BYTES);
        assert_eq!(streams.lookup(&["a/b".into()]).len(), 1);
        assert!(streams.lookup(&["a".into()]).is_empty());
        // A new request with the id cancels and finishes the old session.
        let q = Producer::new(&streams, "a/b::c");
        assert!(s.is_cancelled() && s.is_done());
        assert!(Arc::ptr_eq(&streams.get("a/b::c").unwrap(), &q.session));
        drop(p);
        assert!(streams.get("a/b::c").is_some());
        // A request that never started leaves nothing.
        drop(q);
        assert!(streams.get("a/b::c").is_none());
        assert!(!streams.stop("a/b::c"));
    }
}
