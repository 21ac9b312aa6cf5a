//! `prism cache`: what a `--prompt-cache` directory holds, checked or cleared.

use anyhow::{bail, Result};
use clap::{Args, Subcommand};
use prism::bench::results::utc_timestamp;
use prism::engine::prompt_cache::survey;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    command: CacheCommand,
}

#[derive(Debug, Subcommand)]
enum CacheCommand {
    /// Each stored chain of blocks: its blocks, tokens, bytes and last use.
    List(DirArg),
    /// Blocks, tokens and bytes per model folder, and in all.
    Stats(DirArg),
    /// Check every block (header, shapes, checksum) and delete the bad ones; exits non-zero
    /// if there were any.
    Verify(DirArg),
    /// Delete every block and index.
    Clear(DirArg),
}

#[derive(Debug, Args)]
struct DirArg {
    /// The directory given to --prompt-cache.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
}

pub fn run(args: CacheArgs) -> Result<()> {
    match args.command {
        CacheCommand::List(DirArg { dir }) => list(survey::list(&dir)?),
        CacheCommand::Stats(DirArg { dir }) => stats(survey::list(&dir)?),
        CacheCommand::Verify(DirArg { dir }) => verify(survey::verify(&dir)?),
        CacheCommand::Clear(DirArg { dir }) => {
            let cleared = survey::clear(&dir)?;
            outln!(
                "removed {} files ({} bytes) from {} model folders",
                cleared.files,
                cleared.bytes,
                cleared.folders
            )?;
            Ok(())
        }
    }
}

fn list(folders: Vec<survey::Folder>) -> Result<()> {
    for folder in folders {
        if let Some(problem) = &folder.problem {
            outln!("{}: {problem}", folder.path.display())?;
            continue;
        }
        outln!(
            "{} (model {}, kv {})",
            folder.path.display(),
            folder.model_sha256,
            folder.kv_dtype
        )?;
        for chain in &folder.chains {
            outln!(
                "  {}  {:>3} blocks  {:>7} tokens  {:>12} bytes  last used {}",
                chain.leaf.get(..16).unwrap_or(&chain.leaf),
                chain.blocks,
                chain.tokens,
                chain.bytes,
                utc_timestamp(chain.last_used_unix)
            )?;
        }
    }
    Ok(())
}

fn stats(folders: Vec<survey::Folder>) -> Result<()> {
    let (mut blocks, mut tokens, mut bytes) = (0, 0, 0);
    let count = folders.len();
    for folder in folders {
        outln!(
            "{}  {} blocks  {} chains  {} tokens  {} bytes{}",
            folder.path.display(),
            folder.blocks,
            folder.chains.len(),
            folder.tokens,
            folder.bytes,
            folder
                .problem
                .map(|p| format!("  ({p})"))
                .unwrap_or_default()
        )?;
        blocks += folder.blocks;
        tokens += folder.tokens;
        bytes += folder.bytes;
    }
    outln!("total: {count} model folders  {blocks} blocks  {tokens} tokens  {bytes} bytes")?;
    Ok(())
}

fn verify(found: survey::Verification) -> Result<()> {
    for bad in &found.bad {
        outln!("bad: {}: {}; removed", bad.path.display(), bad.reason)?;
    }
    outln!(
        "{} blocks checked, {} bad, {} more files removed with them",
        found.blocks_checked,
        found.bad.len(),
        found.also_removed
    )?;
    if !found.is_sound() {
        bail!("{} bad files in the prompt cache, removed", found.bad.len());
    }
    Ok(())
}
