//! Where a model's files come from: a manifest name, a local path, or a hub repo id.
