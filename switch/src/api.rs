//! HTTP endpoint on localhost: `/metrics`, `/healthz` and a small JSON control API.

use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::daemon::Switch;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct ApiState {
    pub metrics: Arc<Metrics>,
    pub switch: Arc<Mutex<Switch>>,
}

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/api/v1/ports", get(ports))
        .route("/api/v1/fdb", get(fdb))
        .route("/api/v1/plugins", get(plugins))
        .route("/api/v1/reload", post(reload))
        .with_state(state)
}

fn lock(s: &ApiState) -> std::sync::MutexGuard<'_, Switch> {
    s.switch.lock().unwrap_or_else(|e| e.into_inner())
}

async fn metrics(State(s): State<ApiState>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.metrics.render()).into_response()
}

async fn healthz(State(s): State<ApiState>) -> Response {
    if lock(&s).dataplane.healthy() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "a worker thread has stopped\n").into_response()
    }
}

async fn ports(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(lock(&s).ports_json())
}

async fn fdb(State(s): State<ApiState>) -> Json<serde_json::Value> {
    let sw = lock(&s);
    let dp = &sw.dataplane;
    let now = dp.start.elapsed().as_secs() as u32;
    let entries: Vec<_> = dp
        .fdb
        .entries(now)
        .into_iter()
        .map(|(mac, port, age)| json!({"mac": mac.to_string(), "port": dp.ports.get(port as usize).map(|p| p.name.as_str()), "age_seconds": age}))
        .collect();
    Json(json!({"capacity": dp.fdb.capacity(), "entries": entries}))
}

async fn plugins(State(s): State<ApiState>) -> Json<serde_json::Value> {
    Json(lock(&s).plugins_json())
}

async fn reload(State(s): State<ApiState>) -> Response {
    match lock(&s).reload() {
        Ok(summary) => (StatusCode::OK, Json(json!({"status": "ok", "summary": summary}))).into_response(),
        Err(e) => (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"status": "error", "error": format!("{e:#}")})))
            .into_response(),
    }
}
