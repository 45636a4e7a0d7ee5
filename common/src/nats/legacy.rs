//! The work-queue command stream of earlier releases ([`nats_layout::LEGACY_CMD_STREAM`],
//! each agent reading it through a durable consumer of its own), moved into
//! [`nats_layout::CMD_STREAM`] by the first coordinator of this release that sets up
//! the layout. Every step can be cut short and done again: the old stream's
//! consumers are deleted, its subjects parked (so the new stream can take
//! `capstan.v1.cmd.*`), the new stream made, every command the old one still holds
//! (in a work queue: exactly the ones no agent finished) published into the new one
//! in order, and the old stream deleted last. A command copied twice (a move cut
//! short and done again) is answered from its host's log the second time.

use super::{cmd_stream, NatsError};
use crate::nats_layout;
use async_nats::jetstream::{self, stream};

/// Where the old stream's subjects go while its commands are moved: nothing is
/// published there.
const PARKED: &str = "capstan.v1.legacy-cmd.*";

fn failed<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> NatsError {
    move |e| NatsError::Setup {
        what: format!("the move of {} ({what})", nats_layout::LEGACY_CMD_STREAM),
        source: e.into(),
    }
}

/// Moves what [`nats_layout::LEGACY_CMD_STREAM`] holds into the command stream, if
/// there is such a stream; the number of commands moved.
pub async fn migrate_commands(js: &jetstream::Context, replicas: usize) -> Result<u64, NatsError> {
    let old = match js.get_stream(nats_layout::LEGACY_CMD_STREAM).await {
        Ok(s) => s,
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(j)
            if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return Ok(0)
        }
        Err(e) => return Err(failed("find it")(e)),
    };
    let mut config = old.cached_info().config.clone();
    if config.subjects != [PARKED] {
        let names: Vec<String> = {
            use futures::TryStreamExt as _;
            old.consumer_names()
                .try_collect()
                .await
                .map_err(failed("list its consumers"))?
        };
        for name in &names {
            old.delete_consumer(name)
                .await
                .map_err(failed("delete its consumers"))?;
        }
        config.subjects = vec![PARKED.into()];
        js.update_stream(&config)
            .await
            .map_err(failed("park its subjects"))?;
    }
    let new = cmd_stream(js, replicas).await?;
    let state = old.cached_info().state.clone();
    let mut moved = 0;
    for seq in state.first_sequence.max(1)..=state.last_sequence {
        let message = match old.get_raw_message(seq).await {
            Ok(m) => m,
            Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => continue,
            Err(e) => return Err(failed("read a command")(e)),
        };
        js.publish_with_headers(message.subject, message.headers, message.payload)
            .await
            .map_err(failed("copy a command"))?
            .await
            .map_err(failed("copy a command"))?;
        moved += 1;
    }
    drop(new);
    js.delete_stream(nats_layout::LEGACY_CMD_STREAM)
        .await
        .map_err(failed("delete it"))?;
    tracing::info!(
        moved,
        from = nats_layout::LEGACY_CMD_STREAM,
        to = nats_layout::CMD_STREAM,
        "moved the commands of an earlier release's work queue"
    );
    Ok(moved)
}
