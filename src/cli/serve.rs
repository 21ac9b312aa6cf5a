//! `prism serve`: the engine behind an OpenAI-compatible HTTP API.

use super::EngineArgs;
use anyhow::{Context, Result};
use clap::Args;
use prism::serve::{ServeOptions, Server};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The address to listen on; the default answers this machine only.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port to listen on (0 picks a free one and prints it).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every request but /health; read from this
    /// environment variable, so the key stays out of the process list.
    #[arg(long, value_name = "NAME")]
    api_key_env: Option<String>,
    /// The largest request body, in bytes or with a unit (`4M`).
    #[arg(long, value_name = "SIZE", default_value = "4M", value_parser = super::shared_args::parse_size)]
    max_body: usize,
    /// The most tokens one request may generate, and what it gets when it names no max_tokens.
    #[arg(long, default_value_t = 2048)]
    max_tokens: usize,
    /// Seconds a request may take, waiting in the queue included; then it gets 504.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    request_timeout: u64,
    /// Requests generating at once, each with caches of its own; their decode steps run as
    /// one batched forward pass. More admit more clients, while each engine's cache sees
    /// only the requests it happens to get.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    parallel: u16,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let api_key = match &args.api_key_env {
        Some(name) => Some(
            std::env::var(name)
                .with_context(|| format!("--api-key-env {name}: the variable is not set"))?,
        ),
        None => None,
    };
    let address = format!("{}:{}", args.host, args.port);
    let listener = std::net::TcpListener::bind(&address)
        .with_context(|| format!("cannot listen on {address}"))?;
    let engine = args.engine.open()?;
    let options = ServeOptions {
        api_key,
        max_body_bytes: args.max_body,
        max_tokens: args.max_tokens,
        request_timeout: Duration::from_secs(args.request_timeout),
        parallel: args.parallel.into(),
    };
    let server = Server::start(engine, listener, options)?;
    // Scripts that start the server on port 0 read the address from this line.
    outln!("listening on http://{}", server.address())?;
    server.run_until_interrupted()?;
    Ok(())
}
