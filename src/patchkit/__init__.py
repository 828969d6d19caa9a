"""patchkit: anchor-asserted, fail-closed patches for vLLM, built into reproducible images."""

__version__ = "0.1.0"
