//! Chat prompts: a model's own Jinja chat template rendered with minijinja.

use crate::error::{Error, Result};
use minijinja::{Environment, ErrorKind};

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        ChatMessage {
            role: "system".to_string(),
            content: content.into(),
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        ChatMessage {
            role: "user".to_string(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special-token strings templates refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

/// The most template instructions one render may run. Real chat templates
/// take a few thousand for a long conversation; a template that loops
/// (`range(100000)` nested) would otherwise run forever.
const TEMPLATE_FUEL: u64 = 5_000_000;

impl ChatTemplate {
    /// Compile `source`, as found in `tokenizer.chat_template` or `tokenizer_config.json`.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_fuel(Some(TEMPLATE_FUEL));
        // Hugging Face templates are written for Jinja2 under Python: they call
        // string methods such as `.strip()` and raise errors through a helper.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| Error::ChatTemplate {
                reason: format!("does not compile: {e:#}"),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.unwrap_or_default().to_string(),
            eos_token: eos_token.unwrap_or_default().to_string(),
        })
    }

    /// The prompt text for `messages`, ending with the assistant's turn opener
    /// when `add_generation_prompt` is set.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::ChatTemplate {
                reason: e.to_string(),
            })?;
        template
            .render(minijinja::context! {
                messages => minijinja::value::Serde(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
            })
            .map_err(|e| Error::ChatTemplate {
                reason: match e.kind() {
                    ErrorKind::OutOfFuel => format!(
                        "rendering ran past {TEMPLATE_FUEL} steps; the template seems to loop"
                    ),
                    _ => format!("rendering failed: {e:#}"),
                },
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_a_chatml_template_with_generation_prompt() {
        let template = ChatTemplate::new(CHATML, None, None).unwrap();
        let text = template.render(&[ChatMessage::user(" Hi ")], true).unwrap();
        assert_eq!(
            text,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_string_methods_and_raise_exception_work() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('first turn must be user') }}{% endif %}{{ bos_token }}{{ messages[0].content.strip().upper() }}";
        let template = ChatTemplate::new(source, Some("<s>"), None).unwrap();
        assert_eq!(
            template
                .render(&[ChatMessage::user("  hey ")], false)
                .unwrap(),
            "<s>HEY"
        );
        let err = template
            .render(&[ChatMessage::system("x")], false)
            .unwrap_err();
        assert!(err.to_string().contains("first turn must be user"), "{err}");
    }

    #[test]
    fn a_broken_template_is_a_clear_error() {
        let err = ChatTemplate::new("{% for %}", None, None).err().unwrap();
        assert!(
            err.to_string()
                .starts_with("chat template: does not compile"),
            "{err}"
        );
    }

    #[test]
    fn a_template_that_loops_is_stopped_with_an_error() {
        let looping =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let template = ChatTemplate::new(looping, None, None).unwrap();
        let err = template
            .render(&[ChatMessage::user("hi")], true)
            .unwrap_err();
        assert!(err.to_string().contains("seems to loop"), "{err}");
    }
}
