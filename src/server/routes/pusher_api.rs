//! Pusher's HTTP API under `/apps/{id}/`, every request signed by the app
//! (`crate::pusher::sign`): `POST events` (one channel or up to 100), `POST
//! batch_events` (up to 10), `GET channels/{name}`. An event becomes a throng
//! message of channel `ID:NAME` with the event's name, so throng's own
//! subscribers get it too. Errors use Pusher's statuses (400, 401, 403, 404,
//! 413) with a JSON body that says why. It must not touch connections.

use serde_json::{Value, json};

use super::{
    AwaitedAnswer, Outcome, RouteContext, hand_over, ok_json, only_get, refused, request_body,
};
use crate::broker::Outgoing;
use crate::broker::asked::{self, Ask, Asked, Publish};
use crate::broker::idempotency::{self, Published};
use crate::hub::SocketId;
use crate::protocol::DataKind;
use crate::protocol::http::{self, Request};
use crate::pusher::{self, App, ChannelKind, sign};
use crate::rules::validate_event_name;
use crate::stats::TurnCounts;

/// Most channels one event may name (Pusher's limit).
const MAX_CHANNELS_PER_EVENT: usize = 100;
/// Most events one batch may carry (Pusher's limit).
const MAX_BATCH: usize = 10;

/// A refusal: status and reason.
type Refusal = (u16, String);

fn refuse(out: &mut Vec<u8>, (status, reason): Refusal) -> Outcome {
    refused(out, status, &reason, &[])
}

/// Routes `/apps/{rest}`.
pub(super) fn route(
    req: &Request<'_>,
    rest: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let (app_id, action) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(app) = pusher::app_by_id(&ctx.shared.config.pusher_apps, app_id) else {
        let shown: String = app_id.chars().take(40).collect();
        return refuse(out, (404, format!("unknown app '{shown}'")));
    };
    serve(req, app, action, ctx, out, counts)
}

/// `/users/USER/terminate_connections` without `/apps/ID` in front, as the
/// Python SDK (3.3) sends it: the app is the one whose key signed it.
pub(super) fn route_users(
    req: &Request<'_>,
    path: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let query = sign::decode_query(req.query().unwrap_or("")).unwrap_or_default();
    let signed = sign::Request {
        method: req.method,
        path,
        query: &query,
        body: &[],
    };
    let app = sign::request_key(&signed)
        .ok()
        .and_then(|key| pusher::app_by_key(&ctx.shared.config.pusher_apps, key));
    let Some((_, app)) = app else {
        return refuse(
            out,
            (401, "auth_key names no app of this server".to_string()),
        );
    };
    let action = path.trim_start_matches('/');
    serve(req, app, action, ctx, out, counts)
}

/// One API request of `app`: `action` is the path after `/apps/ID/`.
fn serve(
    req: &Request<'_>,
    app: &App,
    action: &str,
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    // Events carry up to 100 channels or 10 events of --max-message-size each.
    let max_body = ctx.shared.config.max_message_size.saturating_mul(MAX_BATCH) + 64 * 1024;
    let body = if req.method == "POST" {
        match request_body(req, ctx, out, max_body) {
            Ok(body) => body,
            Err(no) => return no.into(),
        }
    } else {
        &[][..]
    };
    if let Err(refusal) = check_signature(req, app, body) {
        return refuse(out, refusal);
    }
    let answer = match action {
        "events" | "batch_events" if req.method != "POST" => {
            return refused(
                out,
                405,
                "method not allowed: use POST",
                &[("Allow", "POST")],
            );
        }
        "events" => return publish_events(app, false, req, body, ctx, out, counts),
        "batch_events" => return publish_events(app, true, req, body, ctx, out, counts),
        "channels" => {
            if !only_get(req, out) {
                return Outcome::Responded;
            }
            channels(app, req, ctx)
        }
        _ if action.starts_with("users/") => {
            if req.method != "POST" {
                return refused(
                    out,
                    405,
                    "method not allowed: use POST",
                    &[("Allow", "POST")],
                );
            }
            terminate(app, action, ctx)
        }
        _ => match action.strip_prefix("channels/") {
            Some(name) => {
                if !only_get(req, out) {
                    return Outcome::Responded;
                }
                match name.strip_suffix("/users") {
                    Some(name) => users(app, name, ctx),
                    None => channel(app, name, req, ctx),
                }
            }
            None => {
                let shown: String = action.chars().take(60).collect();
                Err((404, format!("no Pusher API route '{shown}'")))
            }
        },
    };
    match answer {
        Ok(value) => ok_json(req, ctx, out, &value, body.len()),
        Err(refusal) => refuse(out, refusal),
    }
}

/// Checks the request's signature; 401 with the reason (what was expected to be
/// signed, never the signature).
fn check_signature(req: &Request<'_>, app: &App, body: &[u8]) -> Result<(), Refusal> {
    let query = sign::decode_query(req.query().unwrap_or(""))
        .ok_or((400, "the query string has a broken %-escape".to_string()))?;
    let signed = sign::Request {
        method: req.method,
        path: req.path(),
        query: &query,
        body,
    };
    sign::check_request(app, &signed, crate::auth::now_secs()).map_err(|e| (401, e.to_string()))
}

/// One event as the API takes it.
struct Event<'a> {
    name: &'a str,
    data: &'a str,
    channels: Vec<&'a str>,
    /// The connection left out (`socket_id`: the publisher's own).
    skip: Option<SocketId>,
    /// `idempotency_key` (as Sockudo takes it): a retry with the same key
    /// publishes nothing again, on each of the event's channels.
    idempotency_key: Option<&'a str>,
}

/// Reads and checks one event object.
fn read_event<'a>(value: &'a Value, max_data: usize) -> Result<Event<'a>, Refusal> {
    let bad = |reason: &str| (400, reason.to_string());
    let object = value
        .as_object()
        .ok_or_else(|| bad("an event is a JSON object"))?;
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("an event needs \"name\", a string"))?;
    validate_event_name(name).map_err(|e| bad(&e.to_string()))?;
    let data = object
        .get("data")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("an event needs \"data\", a string (JSON text, as the SDKs send)"))?;
    if data.len() > max_data {
        return Err((
            413,
            format!("event data is {} bytes; at most {max_data}", data.len()),
        ));
    }
    let channels: Vec<&str> = match (object.get("channel"), object.get("channels")) {
        (Some(Value::String(one)), None) => vec![one.as_str()],
        (None, Some(Value::Array(many))) => many
            .iter()
            .map(|c| c.as_str().ok_or_else(|| bad("\"channels\" holds strings")))
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(bad(
                "an event needs \"channel\" (a string) or \"channels\" (a list)",
            ));
        }
    };
    if channels.is_empty() || channels.len() > MAX_CHANNELS_PER_EVENT {
        return Err(bad(&format!(
            "an event goes to 1 to {MAX_CHANNELS_PER_EVENT} channels, not {}",
            channels.len()
        )));
    }
    for name in &channels {
        pusher::validate_channel_name(name).map_err(|e| bad(&e.to_string()))?;
    }
    let skip = match object.get("socket_id") {
        None | Some(Value::Null) => None,
        Some(id) => Some(
            id.as_str()
                .and_then(pusher::parse_socket_id)
                .ok_or_else(|| {
                    bad("socket_id must be a socket id this server gave, like 123.456")
                })?,
        ),
    };
    let idempotency_key = match object.get("idempotency_key") {
        None | Some(Value::Null) => None,
        Some(Value::String(key)) => Some(
            idempotency::validate_key(key.as_bytes())
                .map_err(|e| bad(&format!("idempotency_key: {e}")))?,
        ),
        Some(_) => return Err(bad("idempotency_key is a string")),
    };
    Ok(Event {
        name,
        data,
        channels,
        skip,
        idempotency_key,
    })
}

/// `POST /apps/ID/events` (`{}` once published to every channel) and `POST
/// /apps/ID/batch_events` (`{"batch":[…]}`, every event checked before any is
/// published): each event to each of its channels, in order; 503 when the
/// broker cannot take them. A broker that answers later (Redis) gets them all
/// in one request, and the answer waits for its.
fn publish_events(
    app: &App,
    batch: bool,
    req: &Request<'_>,
    body: &[u8],
    ctx: RouteContext<'_>,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> Outcome {
    let value = match parse(body) {
        Ok(value) => value,
        Err(refusal) => return refuse(out, refusal),
    };
    let events = match read_events(&value, batch, ctx.shared.config.max_message_size) {
        Ok(events) => events,
        Err(refusal) => return refuse(out, refusal),
    };
    let batch = batch.then_some(events.len());
    let messages = events.iter().flat_map(|event| {
        event.channels.iter().map(move |name| {
            let message = Outgoing {
                payload: event.data.as_bytes(),
                kind: DataKind::Text,
                from: None,
                event: Some(event.name),
                skip: event.skip,
            };
            (
                pusher::throng_channel(&app.id, name),
                message,
                event.idempotency_key,
            )
        })
    });
    let broker = &ctx.shared.broker;
    let consumed = ctx.head_len + body.len();
    let answer = AwaitedAnswer::PusherEvents { batch };
    if broker.answers_later() {
        let publishes = messages
            .map(|(channel, message, key)| Publish::new(&channel, message, key))
            .collect();
        let ask = broker.ask(Ask::new(publishes, ctx.ticket));
        return hand_over(ask, ctx, req, consumed, answer, out, counts);
    }
    let outcome = messages
        .map(|(channel, message, key)| match key {
            Some(key) => broker.publish_once(&channel, message, key),
            None => broker.publish(&channel, message).map(|seq| Published {
                seq,
                replayed: false,
            }),
        })
        .collect();
    hand_over(Asked::Now(outcome), ctx, req, consumed, answer, out, counts)
}

/// Writes the answer to published events: `{}`, or `{"batch":[{}, …]}` for a
/// batch of this many; 503 with why when the broker did not take them.
/// Whether it was a success.
pub(super) fn answer_events(
    outcome: asked::Outcome,
    batch: Option<usize>,
    keep_alive: bool,
    out: &mut Vec<u8>,
    counts: &mut TurnCounts,
) -> bool {
    let published = match outcome {
        Ok(published) => published,
        Err(e) => {
            http::write_error(out, 503, &e.to_string(), &[]);
            return false;
        }
    };
    counts.published += published.iter().filter(|p| !p.replayed).count() as u64;
    let value = match batch {
        Some(n) => json!({ "batch": vec![json!({}); n] }),
        None => json!({}),
    };
    let text = value.to_string();
    http::write_response_conn(
        out,
        200,
        "application/json",
        &[],
        text.as_bytes(),
        keep_alive,
    );
    true
}

/// The events of an `events` request (one) or a `batch_events` one (up to
/// [`MAX_BATCH`], each to one channel), all checked.
fn read_events(value: &Value, batch: bool, max_data: usize) -> Result<Vec<Event<'_>>, Refusal> {
    if !batch {
        return Ok(vec![read_event(value, max_data)?]);
    }
    let batch = value
        .get("batch")
        .and_then(Value::as_array)
        .ok_or((400, "a batch is {\"batch\":[events]}".to_string()))?;
    if batch.len() > MAX_BATCH {
        return Err((
            400,
            format!(
                "a batch holds at most {MAX_BATCH} events, not {}",
                batch.len()
            ),
        ));
    }
    let events = batch
        .iter()
        .map(|e| read_event(e, max_data))
        .collect::<Result<Vec<_>, _>>()?;
    if events.iter().any(|event| event.channels.len() != 1) {
        return Err((400, "a batch event names one \"channel\"".to_string()));
    }
    Ok(events)
}

fn parse(body: &[u8]) -> Result<Value, Refusal> {
    serde_json::from_slice(body).map_err(|e| (400, format!("the body is not JSON: {e}")))
}

/// `GET /apps/ID/channels/NAME[?info=subscription_count]`: whether anyone is
/// subscribed (cluster-wide), and how many.
fn channel(
    app: &App,
    name: &str,
    req: &Request<'_>,
    ctx: RouteContext<'_>,
) -> Result<Value, Refusal> {
    pusher::validate_channel_name(name).map_err(|e| (400, e.to_string()))?;
    let query = sign::decode_query(req.query().unwrap_or("")).unwrap_or_default();
    let info: Vec<&str> = query
        .iter()
        .filter(|(k, _)| k == "info")
        .flat_map(|(_, v)| v.split(','))
        .collect();
    let presence = ChannelKind::of(name) == ChannelKind::Presence;
    if info.contains(&"user_count") && !presence {
        return Err((400, "user_count is only for presence channels".to_string()));
    }
    if !ctx.shared.broker.healthy() {
        return Err((503, "broker unavailable, retry later".to_string()));
    }
    let channel = pusher::throng_channel(&app.id, name);
    let subscribers = ctx.shared.broker.channel_info(&channel).subscribers;
    let mut answer = json!({ "occupied": subscribers > 0 });
    if info.contains(&"subscription_count") {
        answer["subscription_count"] = Value::from(subscribers);
    }
    if info.contains(&"user_count") {
        answer["user_count"] = Value::from(members(ctx, &channel)?.len());
    }
    Ok(answer)
}

/// `POST /apps/ID/users/USER/terminate_connections`: every connection signed in
/// as USER, on every node, is closed (`pusher:error` 4009).
fn terminate(app: &App, action: &str, ctx: RouteContext<'_>) -> Result<Value, Refusal> {
    let user = action
        .strip_prefix("users/")
        .and_then(|rest| rest.strip_suffix("/terminate_connections"))
        .ok_or((
            404,
            "no Pusher API route; users/USER/terminate_connections".to_string(),
        ))?;
    pusher::validate_user_id(user).map_err(|e| (400, format!("user id: {e}")))?;
    let channel =
        pusher::throng_channel(&app.id, &format!("{}{user}", pusher::USER_CHANNEL_PREFIX));
    ctx.shared
        .broker
        .close_subscribers(&channel)
        .map_err(|e| (503, e.to_string()))?;
    Ok(json!({}))
}

/// A presence channel's members, across the cluster; 503 when the broker cannot say.
fn members(ctx: RouteContext<'_>, channel: &str) -> Result<crate::broker::Members, Refusal> {
    ctx.shared
        .broker
        .presence_members(channel)
        .map_err(|e| (503, e.to_string()))
}

/// The `info=` attributes a query asks for.
fn info_asked(query: &[(String, String)]) -> Vec<&str> {
    query
        .iter()
        .filter(|(k, _)| k == "info")
        .flat_map(|(_, v)| v.split(','))
        .collect()
}

/// `GET /apps/ID/channels[?filter_by_prefix=P&info=user_count,subscription_count]`:
/// the occupied channels, across the cluster.
fn channels(app: &App, req: &Request<'_>, ctx: RouteContext<'_>) -> Result<Value, Refusal> {
    let query = sign::decode_query(req.query().unwrap_or("")).unwrap_or_default();
    let prefix = query
        .iter()
        .find(|(k, _)| k == "filter_by_prefix")
        .map_or("", |(_, v)| v.as_str());
    if !prefix.is_empty() {
        pusher::validate_channel_name(prefix)
            .map_err(|e| (400, format!("filter_by_prefix: {e}")))?;
    }
    let info = info_asked(&query);
    if info.contains(&"user_count") && !prefix.starts_with("presence-") {
        return Err((
            400,
            "user_count needs filter_by_prefix=presence-".to_string(),
        ));
    }
    let occupied = ctx
        .shared
        .broker
        .occupied(&pusher::throng_channel(&app.id, prefix))
        .map_err(|e| (503, e.to_string()))?;
    let mut channels = serde_json::Map::new();
    for (channel, subscribers) in occupied {
        let name = pusher::pusher_name(&channel);
        let mut attributes = json!({});
        if info.contains(&"subscription_count") {
            attributes["subscription_count"] = Value::from(subscribers);
        }
        if info.contains(&"user_count") {
            attributes["user_count"] = Value::from(members(ctx, &channel)?.len());
        }
        channels.insert(name.to_string(), attributes);
    }
    Ok(json!({ "channels": channels }))
}

/// `GET /apps/ID/channels/NAME/users`: a presence channel's users, cluster-wide.
fn users(app: &App, name: &str, ctx: RouteContext<'_>) -> Result<Value, Refusal> {
    pusher::validate_channel_name(name).map_err(|e| (400, e.to_string()))?;
    if ChannelKind::of(name) != ChannelKind::Presence {
        return Err((
            400,
            "users are listed for presence channels only".to_string(),
        ));
    }
    let members = members(ctx, &pusher::throng_channel(&app.id, name))?;
    let users: Vec<Value> = members.iter().map(|(id, _)| json!({ "id": id })).collect();
    Ok(json!({ "users": users }))
}
