//! The HTTP server: OpenAI wire types, the tower layers, admin API, metrics.
