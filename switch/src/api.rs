//! HTTP endpoint on localhost: `/metrics`, `/healthz` and a small JSON control API.
//!
//! The API knows the daemon only through [`Control`], so it never waits on a lock a reload
//! holds: reloads run on the daemon's control thread and the handler awaits their answer. The
//! server is our own accept loop over hyper's HTTP/1 connection (not `axum::serve`) so that a
//! client cannot hold it: request heads must arrive within [`Limits::header_read`] (this also
//! closes idle keep-alive connections), a connection lives at most [`Limits::connection`],
//! at most [`Limits::max_connections`] are open at once, and shutdown waits at most
//! [`Limits::shutdown_grace`] for requests in flight.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;

/// The result of a reload: `Ok(summary)` or `Err(refusal)`.
pub type ReloadResult = Result<String, String>;

/// Why a reload request was not started.
#[derive(Debug)]
pub enum ReloadBusy {
    /// Another reload is running; one at a time.
    InProgress,
    /// The daemon is shutting down.
    ShuttingDown,
}

/// What the HTTP API needs from the daemon. Every method returns quickly: none of them may
/// wait for a reload.
pub trait Control: Send + Sync + 'static {
    /// Prometheus text exposition.
    fn metrics(&self) -> String;
    /// Ok, or which worker is unhealthy and why.
    fn health(&self) -> Result<(), String>;
    fn ports_json(&self) -> serde_json::Value;
    fn fdb_json(&self) -> serde_json::Value;
    fn plugins_json(&self) -> serde_json::Value;
    /// The config the switch runs (after the last reload that applied).
    fn config_json(&self) -> serde_json::Value;
    /// Starts a reload on the control thread; the receiver gets its result.
    fn start_reload(&self) -> Result<oneshot::Receiver<ReloadResult>, ReloadBusy>;
}

#[derive(Clone)]
pub struct ApiState {
    pub control: Arc<dyn Control>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/ports", get(ports))
        .route("/api/v1/fdb", get(fdb))
        .route("/api/v1/plugins", get(plugins))
        .route("/api/v1/config", get(config))
        .route("/api/v1/reload", post(reload))
        .with_state(state)
}

async fn metrics(State(s): State<ApiState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.control.metrics()).into_response()
}

async fn healthz(State(s): State<ApiState>) -> Response {
    match s.control.health() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn ports(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(s.control.ports_json())
}

async fn fdb(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(s.control.fdb_json())
}

async fn plugins(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(s.control.plugins_json())
}

async fn config(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(s.control.config_json())
}

async fn reload(State(s): State<ApiState>) -> Response {
    let error = |code: StatusCode, e: &str| (code, Json(json!({"status": "error", "error": e}))).into_response();
    let rx = match s.control.start_reload() {
        Ok(rx) => rx,
        Err(ReloadBusy::InProgress) => {
            return error(StatusCode::CONFLICT, "reload in progress: try again when it has finished")
        }
        Err(ReloadBusy::ShuttingDown) => return error(StatusCode::SERVICE_UNAVAILABLE, "the daemon is shutting down"),
    };
    match rx.await {
        Ok(Ok(summary)) => (StatusCode::OK, Json(json!({"status": "ok", "summary": summary}))).into_response(),
        Ok(Err(e)) => error(StatusCode::UNPROCESSABLE_ENTITY, &e),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the control thread ended before the reload finished"),
    }
}

/// Bounds that keep clients from holding the server.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to send a complete request head, counted from when the server starts waiting for
    /// one (so it is also the keep-alive idle timeout).
    pub header_read: Duration,
    /// Longest a connection may stay open, whatever it does.
    pub connection: Duration,
    /// Connections open at once. When full, every open connection is asked to close after its
    /// current request (idle ones close at once) and a newcomer that finds no room within
    /// 200 ms is closed.
    pub max_connections: usize,
    /// How long shutdown lets requests in flight finish before dropping them.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read: Duration::from_secs(5),
            connection: Duration::from_secs(60),
            max_connections: 256,
            shutdown_grace: Duration::from_millis(500),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` becomes true; then stops accepting, asks open
/// connections to finish (keep-alive ones close after their current request) and waits at most
/// `limits.shutdown_grace` before dropping the rest.
pub async fn serve(listener: TcpListener, router: Router, limits: Limits, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut conns = JoinSet::new();
    let mut refused: u64 = 0;
    let evict = Arc::new(Notify::new());
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.wait_for(|s| *s) => break,
            // Reap finished connection tasks so the set does not grow.
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let (stream, _) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and the like: back off instead of spinning.
                log::warn!("control API: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                // Full: ask every connection to close once its current request (if any) is
                // answered, so idle ones make room for this one at once.
                evict.notify_waiters();
                match tokio::time::timeout(Duration::from_millis(200), slots.clone().acquire_owned()).await {
                    Ok(Ok(p)) => p,
                    _ => {
                        refused += 1;
                        if refused.is_power_of_two() {
                            log::warn!(
                                "control API: {} connections busy, refused {refused} so far",
                                limits.max_connections
                            );
                        }
                        continue;
                    }
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = shutdown.clone();
        let evict = evict.clone();
        conns.spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .max_buf_size(64 << 10)
                .serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let run = async {
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = stop.wait_for(|s| *s) => {}
                    _ = evict.notified() => {}
                }
                // Closes an idle connection (one that has sent nothing, or half a request head)
                // now, and a busy one after its response.
                conn.as_mut().graceful_shutdown();
                let _ = conn.as_mut().await;
            };
            let _ = tokio::time::timeout(limits.connection, run).await;
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(limits.shutdown_grace, drain(&mut conns)).await;
    conns.abort_all();
}

async fn drain(conns: &mut JoinSet<()>) {
    while conns.join_next().await.is_some() {}
}
