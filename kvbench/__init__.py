"""kvbench: query-agnostic KV-cache eviction benchmark for hybrid LLMs."""

__version__ = "0.1.0"
