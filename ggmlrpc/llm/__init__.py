"""The main host: GGUF models, tokenizers, graphs and generation over local and remote devices."""


def __getattr__(name):
    # numpy and gguf come in on first use
    if name == "Model":
        from .model import Model
        return Model
    if name == "Tokenizer":
        from .tokenizer import Tokenizer
        return Tokenizer
    raise AttributeError(name)


__all__ = ["Model", "Tokenizer"]
