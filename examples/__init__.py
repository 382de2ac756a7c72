"""Models of README's "Adapt it": each a `build(cfg, vocab_size)` that a config's `model` key
names (model = "examples.gru_model:build"), trained by the unchanged trainers."""
