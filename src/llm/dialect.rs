//! How a request reads in each server's dialect: prompts as ids, text or
//! chat messages, and a grammar in the field its engine family reads.

use super::wire::{GenerationFields, JsonSchemaFormat, ResponseFormat, Stop, StructuredOutputs};
use crate::engine::constraint::Grammar;
use crate::engine::sampling::SamplingConfig;
use crate::engine::GenerateOptions;

/// How prompts are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteApi {
    /// As the server takes them: [`RemoteApi::Text`] for llama-cpp-python's,
    /// which refuses token ids, [`RemoteApi::Ids`] elsewhere.
    #[default]
    Auto,
    /// Token ids to `/v1/completions`: prism's template and token prefix, exactly.
    Ids,
    /// The rendered prompt as text to `/v1/completions`, for servers that
    /// take no token ids (llama-cpp-python's); the server tokenizes it whole.
    Text,
    /// Messages to `/v1/chat/completions`: the server's template.
    Chat,
}

/// The dialect a grammar goes to the server in, and so the field that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RemoteConstraint {
    /// As the server reads it (see `ServerFacts::constraint`): GBNF in the
    /// field of the llama.cpp family, SGLang or a recent vLLM, else Lark.
    #[default]
    Auto,
    /// Lark as vLLM's `guided_grammar`, which prism serve reads too.
    Lark,
    /// GBNF as the `grammar` of llama.cpp's server and llama-cpp-python's,
    /// which ignore `guided_grammar`.
    Gbnf,
    /// GBNF as SGLang's `ebnf`, which its xgrammar backend reads.
    Ebnf,
    /// GBNF or a regex under `structured_outputs`, where vLLM 0.12 and
    /// later read them; those versions refuse the `guided_*` fields.
    StructuredOutputs,
    /// No constraint at all, for a server that refuses every field of them.
    None,
}

impl RemoteConstraint {
    pub(super) fn is_auto(&self) -> bool {
        *self == RemoteConstraint::Auto
    }

    /// The flag's word for it, for logs.
    pub(super) fn name(self) -> &'static str {
        match self {
            RemoteConstraint::Auto => "auto",
            RemoteConstraint::Lark => "lark",
            RemoteConstraint::Gbnf => "gbnf",
            RemoteConstraint::Ebnf => "ebnf",
            RemoteConstraint::StructuredOutputs => "structured-outputs",
            RemoteConstraint::None => "none",
        }
    }
}

impl RemoteApi {
    /// The flag's word for it, for logs.
    pub(super) fn name(self) -> &'static str {
        match self {
            RemoteApi::Auto => "auto",
            RemoteApi::Ids => "ids",
            RemoteApi::Text => "text",
            RemoteApi::Chat => "chat",
        }
    }
}

/// The request fields every engine shares: model, length, stop strings and
/// sampling (prism's repetition controls only when on).
pub(super) fn generation_fields(model: &str, options: &GenerateOptions) -> GenerationFields {
    let sampling = &options.sampling;
    let base = SamplingConfig::default();
    GenerationFields {
        model: Some(model.to_string()),
        max_tokens: Some(options.max_tokens),
        stop: (!options.stop.is_empty()).then(|| Stop::Many(options.stop.clone())),
        temperature: Some(sampling.temperature),
        top_k: sampling.top_k,
        top_p: sampling.top_p,
        seed: Some(sampling.seed),
        repeat_penalty: Some(sampling.repeat_penalty),
        repeat_last_n: Some(sampling.repeat_last_n),
        dry_multiplier: (sampling.dry_multiplier != 0.0).then_some(sampling.dry_multiplier),
        dry_base: (sampling.dry_base != base.dry_base).then_some(sampling.dry_base),
        dry_allowed_length: (sampling.dry_allowed_length != base.dry_allowed_length)
            .then_some(sampling.dry_allowed_length),
        dry_penalty_last_n: (sampling.dry_penalty_last_n != 0)
            .then_some(sampling.dry_penalty_last_n),
        dry_prompt: sampling.dry_prompt.then_some(true),
        no_repeat_ngram: (sampling.no_repeat_ngram != 0).then_some(sampling.no_repeat_ngram),
        loop_guard: sampling.loop_guard.then_some(true),
        ..GenerationFields::default()
    }
}

/// `grammar` in the field the chosen dialect goes in: `response_format` for
/// JSON schemas (which every engine family reads), vLLM's `guided_grammar`
/// and `guided_regex` (prism serve reads those too), llama.cpp's `grammar`,
/// SGLang's `ebnf`, or vLLM's `structured_outputs`. A grammar with no
/// rendering in the chosen dialect is an error rather than a run that goes
/// unconstrained without saying so.
pub(super) fn constrain(
    fields: &mut GenerationFields,
    grammar: &Grammar,
    constraint: RemoteConstraint,
) -> std::result::Result<(), String> {
    match (grammar, constraint) {
        (_, RemoteConstraint::None) => {}
        (Grammar::JsonSchema(schema), _) => {
            fields.response_format = Some(ResponseFormat::JsonSchema {
                json_schema: JsonSchemaFormat {
                    name: Some("output".to_string()),
                    schema: schema.clone(),
                },
            });
        }
        (
            Grammar::Lark(lark) | Grammar::Dialects { lark, .. },
            RemoteConstraint::Auto | RemoteConstraint::Lark,
        ) => fields.lark = Some(lark.clone()),
        (Grammar::Regex(regex), RemoteConstraint::Auto | RemoteConstraint::Lark) => {
            fields.regex = Some(regex.clone())
        }
        (Grammar::Dialects { gbnf, .. }, RemoteConstraint::Gbnf) => {
            fields.gbnf = Some(gbnf.clone())
        }
        (Grammar::Dialects { gbnf, .. }, RemoteConstraint::Ebnf) => {
            fields.ebnf = Some(gbnf.clone())
        }
        (Grammar::Dialects { gbnf, .. }, RemoteConstraint::StructuredOutputs) => {
            fields.structured_outputs = Some(StructuredOutputs {
                grammar: Some(gbnf.clone()),
                ..StructuredOutputs::default()
            })
        }
        (Grammar::Regex(regex), RemoteConstraint::StructuredOutputs) => {
            fields.structured_outputs = Some(StructuredOutputs {
                regex: Some(regex.clone()),
                ..StructuredOutputs::default()
            })
        }
        (
            Grammar::Lark(_) | Grammar::Regex(_),
            RemoteConstraint::Gbnf | RemoteConstraint::Ebnf | RemoteConstraint::StructuredOutputs,
        ) => {
            return Err(format!(
                "this grammar has no GBNF rendering for remote constraint `{}`; choose `lark` or `none`",
                constraint.name()
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request body's constraint fields for `grammar` sent as `constraint`.
    fn sent(grammar: &Grammar, constraint: RemoteConstraint) -> Result<Vec<String>, String> {
        let mut fields = GenerationFields::default();
        constrain(&mut fields, grammar, constraint)?;
        let body = serde_json::to_value(&fields).expect("fields serialize");
        let mut names: Vec<String> = body
            .as_object()
            .expect("an object")
            .keys()
            .cloned()
            .collect();
        names.retain(|name| name != "stream");
        Ok(names)
    }

    #[test]
    fn each_dialect_goes_in_its_engines_field() {
        let both = Grammar::Dialects {
            lark: "start: \"a\"".into(),
            gbnf: "root ::= \"a\"".into(),
        };
        assert_eq!(
            sent(&both, RemoteConstraint::Auto),
            Ok(vec!["guided_grammar".into()])
        );
        assert_eq!(
            sent(&both, RemoteConstraint::Lark),
            Ok(vec!["guided_grammar".into()])
        );
        assert_eq!(
            sent(&both, RemoteConstraint::Gbnf),
            Ok(vec!["grammar".into()])
        );
        assert_eq!(sent(&both, RemoteConstraint::Ebnf), Ok(vec!["ebnf".into()]));
        assert_eq!(
            sent(&both, RemoteConstraint::StructuredOutputs),
            Ok(vec!["structured_outputs".into()])
        );
        assert_eq!(sent(&both, RemoteConstraint::None), Ok(vec![]));
        let mut fields = GenerationFields::default();
        constrain(&mut fields, &both, RemoteConstraint::StructuredOutputs).unwrap();
        assert_eq!(
            serde_json::to_value(&fields).unwrap()["structured_outputs"],
            serde_json::json!({"grammar": "root ::= \"a\""})
        );
        let regex = Grammar::Regex("[a-z]+".into());
        let mut fields = GenerationFields::default();
        constrain(&mut fields, &regex, RemoteConstraint::StructuredOutputs).unwrap();
        assert_eq!(
            serde_json::to_value(&fields).unwrap()["structured_outputs"],
            serde_json::json!({"regex": "[a-z]+"})
        );
        let refused = sent(&regex, RemoteConstraint::Ebnf).unwrap_err();
        assert!(refused.contains("constraint `ebnf`"), "{refused}");
        let mut fields = GenerationFields::default();
        constrain(&mut fields, &both, RemoteConstraint::Gbnf).unwrap();
        assert_eq!(fields.gbnf.as_deref(), Some("root ::= \"a\""));

        let lark_only = Grammar::Lark("start: \"a\"".into());
        let refused = sent(&lark_only, RemoteConstraint::Gbnf).unwrap_err();
        assert!(refused.contains("no GBNF rendering"), "{refused}");
        let schema = Grammar::JsonSchema(serde_json::json!({"type": "object"}));
        assert_eq!(
            sent(&schema, RemoteConstraint::Gbnf),
            Ok(vec!["response_format".into()])
        );
    }
}
