"""The vLLM backend: where vLLM comes from, its server process, its client, its launch plan and its log."""
