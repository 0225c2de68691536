"""llmtrio: LLM inference on llama.cpp, on Trio, served through an upload-response ring."""

__version__ = "0.1.0"
