"""GGUF models: loading, synthesis of test models, placement over devices."""
