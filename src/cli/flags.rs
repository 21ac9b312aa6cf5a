//! The one table from the library's settings to the flags that set them: the
//! library's errors name a setting, and a user should read the flag they typed.

use prism::Setting;

/// The flag that sets `setting`.
pub fn flag(setting: Setting) -> &'static str {
    match setting {
        Setting::Context => "--context",
        Setting::Stride => "--stride",
        Setting::Temperature => "--temperature",
        Setting::TopK => "--top-k",
        Setting::TopP => "--top-p",
        Setting::RepeatPenalty => "--repeat-penalty",
        Setting::DryMultiplier => "--dry-multiplier",
        Setting::DryBase => "--dry-base",
        Setting::DryAllowedLength => "--dry-allowed-length",
        Setting::NoCopyNgram => "--no-copy",
        Setting::KvDtype => "--kv-dtype",
        Setting::Device => "--device",
        Setting::ChunkTokens | Setting::ChunkSizes => "--chunk-tokens",
        Setting::FirstTokens => "--first-tokens",
        Setting::MaxDocumentBytes => "--max-document-mib",
        Setting::Out => "--out",
        Setting::Resume => "--resume",
        Setting::MaxSummaryTokens => "--max-summary-tokens",
        Setting::Model => "--model",
        Setting::Chat => "--chat",
        Setting::AllowModelMismatch => "--allow-model-mismatch",
        Setting::RemoteConstraint => "--remote-constraint",
        Setting::AllowUnconstrained => "--allow-unconstrained",
        Setting::Methods => "--methods",
        Setting::Concurrency => "--concurrency",
        Setting::Judging => "--quality",
        Setting::Domain => "--domain",
        Setting::ExampleQuery => "--example-query",
        Setting::RequestTimeout => "--request-timeout",
        Setting::PromptCache => "--prompt-cache",
        Setting::DraftModel => "--draft-model",
        Setting::SegmentReuse => "--reuse-segments",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn long_flags(command: &clap::Command, found: &mut Vec<String>) {
        for arg in command.get_arguments() {
            found.extend(arg.get_long().map(|long| format!("--{long}")));
        }
        for sub in command.get_subcommands() {
            long_flags(sub, found);
        }
    }

    #[test]
    fn every_setting_is_a_flag_of_some_subcommand() {
        let mut flags = Vec::new();
        long_flags(&crate::cli::Cli::command(), &mut flags);
        let missing: Vec<_> = Setting::ALL
            .iter()
            .filter(|setting| !flags.iter().any(|known| known == flag(**setting)))
            .map(|setting| (setting, flag(*setting)))
            .collect();
        assert!(missing.is_empty(), "no such flag: {missing:?}");
    }
}
