use super::api::{ApiError, PromptInput};
use super::worker::TextStream;
use crate::engine::constraint::Grammar;
use crate::llm::wire::{ChatRequest, CompletionRequest};

fn chat(body: serde_json::Value) -> ChatRequest {
    serde_json::from_value(body).unwrap()
}

#[test]
fn streamed_pieces_add_up_to_the_final_text_cut_before_a_stop_string() {
    let mut stream = TextStream::new(&["END".to_string()], false);
    let mut sent = String::new();
    // The engine stops at "Hello END" before showing it: the stop string is
    // only ever seen in part.
    for so_far in ["Hel", "Hello E", "Hello EN"] {
        sent.extend(stream.advance(so_far));
    }
    // "EN" could begin the stop string, so it was never sent.
    assert_eq!(sent, "Hello ");
    sent.extend(stream.finish("Hello "));
    assert_eq!(sent, "Hello ");
}

#[test]
fn an_unfinished_character_waits_for_its_last_byte() {
    let mut stream = TextStream::new(&[], false);
    assert_eq!(stream.advance("caf\u{FFFD}").as_deref(), Some("caf"));
    assert_eq!(stream.advance("café").as_deref(), Some("é"));
    assert_eq!(stream.finish("café"), None);
}

#[test]
fn under_the_loop_guard_the_sentence_being_written_is_held_back() {
    let mut stream = TextStream::new(&[], true);
    assert_eq!(
        stream.advance("One line.\nA sen"),
        Some("One line.\n".into())
    );
    assert_eq!(
        stream.advance("One line.\nA sentence. And"),
        Some("A sentence.".into())
    );
    // The guard cut the repeat that was being written: nothing of it was sent.
    assert_eq!(stream.finish("One line.\nA sentence. "), Some(" ".into()));
}

#[test]
fn openai_fields_become_engine_settings() {
    let request = chat(serde_json::json!({
        "model": "any",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 12,
        "temperature": 0,
        "stop": "\n",
        "stream": true,
        "stream_options": {"include_usage": true},
        "dry_multiplier": 0.8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    }));
    let messages = request.messages().unwrap();
    assert_eq!(messages[0].content, "Hi");
    let settings = request.fields.settings(100).unwrap();
    assert_eq!(settings.options.max_tokens, 12);
    assert_eq!(settings.options.sampling.temperature, 0.0);
    assert_eq!(settings.options.sampling.dry_multiplier, 0.8);
    assert_eq!(settings.options.stop, ["\n"]);
    assert!(settings.stream && settings.include_usage);
    assert_eq!(
        settings.options.grammar,
        Some(Grammar::JsonSchema(serde_json::json!({"type": "object"})))
    );
}

#[test]
fn requests_beyond_what_the_server_does_are_refused_by_name() {
    let refused = |extra: serde_json::Value| -> ApiError {
        let mut body = serde_json::json!({"messages": [{"role": "user", "content": "Hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        chat(body).fields.settings(100).unwrap_err()
    };
    assert!(refused(serde_json::json!({"max_tokens": 101}))
        .message
        .contains("limit of 100"));
    assert!(refused(serde_json::json!({"n": 2})).message.contains("`n`"));
    assert!(refused(serde_json::json!({"grammar": "root ::= \"a\""}))
        .message
        .contains("GBNF"));
    assert!(refused(serde_json::json!({"frequency_penalty": 0.5}))
        .message
        .contains("frequency_penalty"));
    assert!(refused(serde_json::json!({"temperature": -1}))
        .message
        .contains("temperature"));
    assert!(
        refused(serde_json::json!({"regex": "a+", "lark": "start: \"a\""}))
            .message
            .contains("at most one")
    );
    let bad_schema = serde_json::json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}});
    assert!(refused(bad_schema).message.contains("schema"));
}

#[test]
fn a_text_completion_takes_text_or_token_ids_one_prompt_at_a_time() {
    let prompt = |value: serde_json::Value| {
        serde_json::from_value::<CompletionRequest>(serde_json::json!({"prompt": value}))
            .unwrap()
            .prompt()
    };
    assert_eq!(
        prompt("abc".into()).unwrap(),
        PromptInput::Text("abc".into())
    );
    assert_eq!(
        prompt(serde_json::json!([1, 2])).unwrap(),
        PromptInput::Ids(vec![1, 2])
    );
    assert_eq!(
        prompt(serde_json::json!([[3]])).unwrap(),
        PromptInput::Ids(vec![3])
    );
    assert!(prompt(serde_json::json!(["a", "b"])).is_err());
}

#[test]
fn a_role_no_template_knows_is_refused() {
    let request = chat(serde_json::json!({
        "messages": [{"role": "user", "content": "Hi"}, {"role": "wizard", "content": "Zap"}],
    }));
    let error = request.messages().unwrap_err();
    assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST);
    assert_eq!(
        error.message,
        "messages[1].role `wizard` is not one of system, user, assistant"
    );
    assert_eq!(error.param.as_deref(), Some("messages[1].role"));
}

/// The refusal of a chat request's messages: the field it names and its message.
fn refused_messages(body: serde_json::Value) -> (Option<String>, String) {
    let error = chat(body).messages().unwrap_err();
    assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST);
    assert_eq!(error.body().error.param, error.param);
    (error.param, error.message)
}

#[test]
fn an_empty_chat_is_refused_naming_messages() {
    let (param, message) = refused_messages(serde_json::json!({"messages": []}));
    assert_eq!(param.as_deref(), Some("messages"));
    assert!(message.starts_with("messages is empty"), "{message}");
}

#[test]
fn content_that_is_not_text_is_refused_naming_the_message() {
    for (content, kind) in [
        (serde_json::json!(42), "a number"),
        (serde_json::json!({"text": "Hi"}), "an object"),
        (serde_json::Value::Null, "null"),
        (serde_json::json!([{"text": "no type"}]), "an array"),
    ] {
        let (param, message) = refused_messages(serde_json::json!({
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}],
        }));
        assert_eq!(param.as_deref(), Some("messages[1].content"));
        assert!(
            message.starts_with(&format!("messages[1].content is {kind}")),
            "{message}"
        );
    }
    // A message without content reads as null.
    let (param, _) = refused_messages(serde_json::json!({"messages": [{"role": "user"}]}));
    assert_eq!(param.as_deref(), Some("messages[0].content"));
}

#[test]
fn text_parts_are_joined_and_other_parts_refused_by_type() {
    let request = chat(
        serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]}),
    );
    assert_eq!(request.messages().unwrap()[0].content, "Hello");
    let (param, message) = refused_messages(
        serde_json::json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]}),
    );
    assert_eq!(param.as_deref(), Some("messages[0].content[1].type"));
    assert!(
        message.contains("`image_url` is not supported"),
        "{message}"
    );
}
